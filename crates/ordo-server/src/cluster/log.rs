//! The NATS side (async-nats): the connection, the stream (created by the first
//! node if absent), publishing entries with `Nats-Msg-Id`, and the consumer that
//! hands the stream, in order, to the writer thread.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer, context::Publish, stream};
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::{oneshot, watch};

use super::apply::{Delivered, MAX_RUN_BYTES, MAX_RUN_ENTRIES};
use super::{unavailable, ClusterOptions, Outcome, Shared};
use super::{APPLY_TIMEOUT, DUPLICATE_WINDOW, NO_LEADER_WAIT, PUBLISH_ATTEMPTS, PUBLISH_TIMEOUT, SUBJECT};
use crate::core::{Command, CoreSender};
use crate::error::ApiError;

/// A running cluster connection.
pub struct Cluster {
    pub options: ClusterOptions,
    /// Replaced whole by `reconnect_after_timeout`.
    conn: Arc<std::sync::RwLock<Arc<Conn>>>,
    pub shared: Arc<Shared>,
    /// When this node last started replacing its NATS connection (`reconnect_after_timeout`).
    last_reconnect: std::sync::Mutex<Option<std::time::Instant>>,
}

/// One NATS connection and the stream as seen through it.
struct Conn {
    js: jetstream::Context,
    stream: stream::Stream,
}

/// How long one connection to NATS may take, the handshake included (async-nats
/// 0.42 bounds only its TCP connect by `connection_timeout`: nats-io/nats.rs#1526).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

async fn new_client(options: &ClusterOptions) -> Result<async_nats::Client, String> {
    let connect = async_nats::ConnectOptions::new()
        .name(format!("ordo {}", options.node_name))
        .connection_timeout(CONNECT_TIMEOUT)
        // A frozen server (SIGSTOP, a partition) keeps its TCP connection
        // open: pings find it within a few seconds instead of two minutes
        // (unless commands keep postponing them: `reconnect_after_timeout`).
        .ping_interval(Duration::from_secs(1))
        .connect(options.urls.clone());
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(error)) => Err(format!("cannot connect to NATS at {}: {error}", options.urls.join(","))),
        Err(_) => {
            Err(format!("cannot connect to NATS at {}: no answer within {CONNECT_TIMEOUT:?}", options.urls.join(",")))
        }
    }
}

fn jetstream_of(client: async_nats::Client) -> jetstream::Context {
    let mut js = jetstream::new(client);
    js.set_timeout(PUBLISH_TIMEOUT);
    js
}

/// At most one forced reconnection this often (a stream leader election also
/// times requests out, and a reconnection restarts the consumer).
const RECONNECT_SPACING: Duration = Duration::from_secs(10);

/// Where the stream stands at start.
pub struct StreamState {
    pub first_seq: u64,
    pub last_seq: u64,
    pub messages: u64,
}

impl Cluster {
    /// Connects to the NATS servers and creates the stream if absent (or binds
    /// to it: an existing stream keeps its own configuration).
    pub async fn connect(options: ClusterOptions, shared: Arc<Shared>) -> Result<Cluster, String> {
        // A frozen server among the URLs can take a connection attempt: try again.
        let mut attempt = 0;
        let client = loop {
            match new_client(&options).await {
                Ok(client) => break client,
                Err(error) if attempt < 3 => {
                    attempt += 1;
                    tracing::warn!("{error}; trying again");
                }
                Err(error) => return Err(error),
            }
        };
        let js = jetstream_of(client);
        let config = stream::Config {
            name: options.stream.clone(),
            subjects: vec![SUBJECT.to_owned()],
            num_replicas: options.replicas,
            storage: stream::StorageType::File,
            duplicate_window: DUPLICATE_WINDOW,
            // Retention (oldest entries dropped first); nodes that need what
            // was dropped start from a snapshot (cluster::snapshot).
            max_messages: if options.stream_max_msgs == 0 { -1 } else { options.stream_max_msgs as i64 },
            max_age: options.stream_max_age,
            ..Default::default()
        };
        // A cluster just started may still be electing its meta leader: retry a while.
        let mut attempt = 0;
        let stream = loop {
            match js.get_or_create_stream(config.clone()).await {
                Ok(stream) => break stream,
                Err(error) if attempt < 20 => {
                    attempt += 1;
                    tracing::debug!(%error, "stream not ready yet");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(error) => return Err(format!("cannot create or open the stream `{}`: {error}", options.stream)),
            }
        };
        // An existing stream keeps its configuration: bind only to one that keeps Ordo's promises.
        for warning in super::stream_check::check(&stream.cached_info().config, &options)? {
            tracing::warn!("{warning}");
        }
        let conn = Arc::new(std::sync::RwLock::new(Arc::new(Conn { js, stream })));
        Ok(Cluster { options, conn, shared, last_reconnect: std::sync::Mutex::new(None) })
    }

    fn conn(&self) -> Arc<Conn> {
        self.conn.read().expect("connection lock").clone()
    }

    /// A request to the stream timed out. When the NATS server this node is
    /// connected to is frozen (SIGSTOP, a stuck disk, a half-open partition),
    /// its TCP connection stays open, and async-nats 0.42 finds it dead only
    /// when pings go unanswered, but it postpones its ping on every command
    /// sent, and this node sends one at least every second (the stream poll,
    /// pull requests): the connection would hang on (nats-io/nats.rs#1593).
    /// So a timeout replaces the connection by a new one, to whichever server
    /// of `--cluster` completes its handshake within `CONNECT_TIMEOUT` (a
    /// frozen one never does: another attempt then), and starts the consumer
    /// again on it; at most once per `RECONNECT_SPACING`. (async-nats' own
    /// `force_reconnect` would wait forever for a frozen server's handshake if
    /// it picked that server again.) Requests in flight on the old connection
    /// time out and are sent again on the new one, with the same message id.
    fn reconnect_after_timeout(&self, what: &str) {
        {
            let mut last = self.last_reconnect.lock().expect("reconnect lock");
            if last.is_some_and(|at| at.elapsed() < RECONNECT_SPACING) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        tracing::warn!("{what} timed out: connecting to NATS again (the server this node uses may be frozen)");
        let (options, conn, shared) = (self.options.clone(), self.conn.clone(), self.shared.clone());
        tokio::spawn(async move {
            for _ in 0..6 {
                let client = match new_client(&options).await {
                    Ok(client) => client,
                    Err(error) => {
                        tracing::warn!("{error}; trying again");
                        continue;
                    }
                };
                let js = jetstream_of(client);
                match tokio::time::timeout(PUBLISH_TIMEOUT, js.get_stream(&options.stream)).await {
                    Ok(Ok(stream)) => {
                        // The old connection is dropped once its last request ends.
                        *conn.write().expect("connection lock") = Arc::new(Conn { js, stream });
                        tracing::info!("connected to NATS again; consuming again on the new connection");
                        shared.restart.notify_one();
                        return;
                    }
                    Ok(Err(error)) => tracing::warn!(%error, "the new NATS connection cannot open the stream"),
                    Err(_) => tracing::warn!("the new NATS connection did not open the stream in time"),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }

    pub async fn stream_state(&self) -> Result<StreamState, String> {
        let info = self.conn().stream.get_info().await.map_err(|error| {
            if error.kind() == jetstream::context::RequestErrorKind::TimedOut {
                self.reconnect_after_timeout("reading the stream's state");
            }
            format!("cannot read the stream's state: {error}")
        })?;
        Ok(StreamState {
            first_seq: info.state.first_sequence,
            last_seq: info.state.last_sequence,
            messages: info.state.messages,
        })
    }

    /// Publishes `entries` (encoded, in order) and waits for each one's outcome
    /// on this node: acknowledged by the stream's quorum, then applied here.
    pub async fn submit_all(&self, entries: Vec<Vec<u8>>) -> Vec<Result<Outcome, ApiError>> {
        if let Some(fatal) = self.shared.status.fatal() {
            return entries.iter().map(|_| Err(unavailable(format!("this node stopped applying: {fatal}")))).collect();
        }
        let mut waiting = Vec::with_capacity(entries.len());
        // Sent back to back, so the stream takes them in this order.
        for payload in entries {
            let (id, outcome) = self.shared.register();
            let payload = Bytes::from(payload);
            let ack = self.send(&id, payload.clone()).await;
            waiting.push((id, payload, ack, outcome));
        }
        let mut results = Vec::with_capacity(waiting.len());
        for (id, payload, ack, outcome) in waiting {
            results.push(self.finish(&id, payload, ack, outcome).await);
        }
        results
    }

    pub async fn submit(&self, entry: Vec<u8>) -> Result<Outcome, ApiError> {
        self.submit_all(vec![entry]).await.pop().expect("one result per entry")
    }

    /// Hands one publish to the connection, bounded: behind a frozen server
    /// the client's command queue can fill, and the send would wait for it.
    async fn send(
        &self,
        id: &str,
        payload: Bytes,
    ) -> Result<jetstream::context::PublishAckFuture, jetstream::context::PublishError> {
        let conn = self.conn();
        let publish = conn.js.send_publish(SUBJECT, Publish::build().message_id(id).payload(payload));
        match tokio::time::timeout(PUBLISH_TIMEOUT, publish).await {
            Ok(sent) => sent,
            Err(_) => Err(jetstream::context::PublishErrorKind::TimedOut.into()),
        }
    }

    async fn finish(
        &self,
        id: &str,
        payload: Bytes,
        mut ack: Result<jetstream::context::PublishAckFuture, jetstream::context::PublishError>,
        outcome: oneshot::Receiver<Outcome>,
    ) -> Result<Outcome, ApiError> {
        let mut attempt = 1;
        let started = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(50);
        let seq = loop {
            let error = match ack {
                Ok(future) => match future.await {
                    Ok(ack) => break ack.sequence,
                    Err(error) => error,
                },
                Err(error) => error,
            };
            if error.kind() == jetstream::context::PublishErrorKind::TimedOut {
                self.reconnect_after_timeout("a publish");
            } else if started.elapsed() + backoff < NO_LEADER_WAIT {
                // Refused at once ("no stream found": no leader yet, or one being
                // elected again): wait for one instead of answering 503.
                tracing::debug!(msg_id = id, %error, ?backoff, "the stream refused a publish at once; sending it again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                ack = self.send(id, payload.clone()).await;
                continue;
            }
            if attempt >= PUBLISH_ATTEMPTS {
                // Maybe in the stream after all: the entry is then applied, but
                // nobody waits for it any more.
                self.shared.forget(id);
                return Err(unavailable(format!(
                    "the stream did not acknowledge the write ({error}); it may still be applied"
                )));
            }
            attempt += 1;
            tracing::debug!(msg_id = id, %error, "publishing again with the same message id");
            // The same id: if the first attempt landed, JetStream drops this one
            // and acknowledges the first one's sequence.
            ack = self.send(id, payload.clone()).await;
        };
        match tokio::time::timeout(APPLY_TIMEOUT, outcome).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(_)) => Err(ApiError::shutting_down()),
            Err(_) => {
                self.shared.forget(id);
                Err(unavailable(format!(
                    "the write is in the stream at seq {seq} but this node did not apply it within {} s",
                    APPLY_TIMEOUT.as_secs()
                )))
            }
        }
    }

    /// Runs the consumer and the stream poller until shutdown.
    pub fn spawn(self: &Arc<Cluster>, core: CoreSender, shutdown: watch::Receiver<bool>) {
        tokio::spawn(consume(self.clone(), core, shutdown.clone()));
        tokio::spawn(poll_stream(self.clone(), shutdown));
    }
}

/// A consumer that delivers nothing this long while the stream (polled every
/// second) holds entries this node has not applied is replaced.
const STALL_AFTER: Duration = Duration::from_secs(2);

/// Setting a consumer up (reading the stream's state, creating the consumer)
/// longer than this is logged.
const CONSUMER_SETUP_SLOW: Duration = Duration::from_secs(1);

/// Delivers the stream to the writer thread, in order, from the entry after
/// the last one applied; starts again from there whenever the writer asks
/// (it failed to apply one) or the consumer fails.
///
/// Each start is a new *generation*: the writer ignores entries of a generation
/// it gave up on, and skips those at or below its last applied seq (a new
/// generation re-delivers what an older one had queued).
pub async fn consume(cluster: Arc<Cluster>, core: CoreSender, mut shutdown: watch::Receiver<bool>) {
    let mut generation = 0u64;
    loop {
        generation += 1;
        let start_seq = cluster.shared.status.applied_seq() + 1;
        let stopped = tokio::select! {
            result = consume_from(&cluster, &core, start_seq, generation) => {
                if let Err(error) = result {
                    tracing::warn!(start_seq, %error, "the stream's consumer stopped; starting again");
                }
                false
            }
            _ = cluster.shared.restart.notified() => {
                tracing::warn!("an entry failed to apply here, or the consumer stalled; consuming again from the last entry applied");
                false
            }
            _ = shutdown.wait_for(|stopping| *stopping) => true,
        };
        if stopped || cluster.shared.status.fatal().is_some() {
            // Stopped for good (a gap): nothing more goes to the writer.
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
    }
}

async fn consume_from(cluster: &Cluster, core: &CoreSender, start_seq: u64, generation: u64) -> Result<(), String> {
    let setup_started = std::time::Instant::now();
    let state = cluster.stream_state().await?;
    cluster.shared.status.saw_stream_seq(state.last_seq);
    // Entries this node needs removed from the stream (retention): applying what
    // is left would skip them silently. The node stops for good (`gap`).
    let bounds = super::snapshot::StreamBounds { first_seq: state.first_seq, last_seq: state.last_seq };
    super::gap::check_start(cluster, start_seq, bounds)?;
    let config = consumer::pull::OrderedConfig {
        filter_subject: SUBJECT.to_owned(),
        deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: start_seq },
        ..Default::default()
    };
    let consumer = cluster.conn().stream.create_consumer(config).await.map_err(|error| error.to_string())?;
    let mut messages = consumer.messages().await.map_err(|error| error.to_string())?;
    // A fresh R3 stream still electing its leader, or a loaded NATS server, makes
    // this slow; until it is done nothing is applied here (`poll_stream` starts
    // it again if it stalls). Said, so that a slow first write can be explained.
    let setup = setup_started.elapsed();
    if setup >= CONSUMER_SETUP_SLOW {
        tracing::warn!(start_seq, millis = setup.as_millis() as u64, "the stream's consumer took long to set up");
    }
    // The seq the next delivered entry must have; one past it is a gap, checked
    // (`gap::check`) before anything after the gap reaches the writer.
    let mut expected = start_seq;
    let mut after_gap: Option<Delivered> = None;
    loop {
        let first = match after_gap.take() {
            Some(entry) => entry,
            None => {
                let next = match tokio::time::timeout(STALL_AFTER, messages.next()).await {
                    Ok(next) => next,
                    Err(_) if cluster.shared.status.lag_entries() > 0 => {
                        // The stream has entries this consumer does not deliver: its
                        // server is frozen or cut off, and the ordered consumer has not
                        // noticed. A new one reaches the stream's current leader.
                        return Err(format!(
                            "no entry for {STALL_AFTER:?} while the stream holds more; consuming again"
                        ));
                    }
                    Err(_) => continue,
                };
                let Some(message) = next else { break };
                delivered(cluster, message, generation)?
            }
        };
        if first.seq > expected {
            super::gap::check(cluster, expected, first.seq).await?;
        }
        expected = first.seq + 1;
        // A run: this entry and those the consumer already holds (never waiting
        // for more), applied by the writer in one command and one group commit
        // (`apply::apply_run`). A node that keeps up gets runs of one.
        let mut n_bytes = first.payload.len();
        let mut run = vec![first];
        while run.len() < MAX_RUN_ENTRIES && n_bytes < MAX_RUN_BYTES {
            match messages.next().now_or_never() {
                Some(Some(message)) => {
                    let entry = delivered(cluster, message, generation)?;
                    if entry.seq != expected {
                        // A gap: the run so far goes to the writer, then the check.
                        after_gap = Some(entry);
                        break;
                    }
                    expected += 1;
                    n_bytes += entry.payload.len();
                    run.push(entry);
                }
                Some(None) => break,
                None => break,
            }
        }
        if core.send(Command::ApplyEntries(run)).await.is_err() {
            return Ok(());
        }
    }
    Err("the stream's messages ended".to_owned())
}

/// One delivered message as the writer applies it.
fn delivered(
    cluster: &Cluster,
    message: Result<jetstream::Message, consumer::pull::OrderedError>,
    generation: u64,
) -> Result<Delivered, String> {
    let message = message.map_err(|error| error.to_string())?;
    let reply = message.message.reply.as_deref().and_then(ack_reply_info);
    let (seq, pending, published_ns) = match reply {
        Some(parsed) => parsed,
        None => {
            let info = message.info().map_err(|error| error.to_string())?;
            let published_ns = u64::try_from(info.published.unix_timestamp_nanos()).unwrap_or(0);
            (info.stream_sequence, info.pending, published_ns)
        }
    };
    cluster.shared.status.saw_stream_seq(seq + pending);
    let msg_id = message
        .message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|value| value.as_str().to_owned());
    Ok(Delivered { seq, generation, msg_id, published_ns, payload: message.message.payload.clone() })
}

/// The stream seq, the entries pending after it and the publication time (Unix
/// ns) of a delivered message, read from its ack subject as
/// `jetstream::Message::info` reads it (`$JS.ACK.[<domain>.<account hash>.]<stream>.
/// <consumer>.<delivered>.<stream seq>.<consumer seq>.<ns>.<pending>[...]`), without
/// its date conversion: `info` is the costliest step of a message's delivery
/// here after async-nats' own (docs/BENCHMARKS.md, "Catch-up profile").
/// `None` for any other shape (the caller falls back to `info`).
fn ack_reply_info(reply: &str) -> Option<(u64, u64, u64)> {
    let rest = reply.strip_prefix("$JS.ACK.")?;
    let mut tokens = [""; 9];
    let mut n_tokens = 0;
    for token in rest.split('.') {
        if n_tokens == tokens.len() {
            break;
        }
        tokens[n_tokens] = token;
        n_tokens += 1;
    }
    // The v2 form (9 tokens or more) adds the domain and the account hash in front.
    let offset = match n_tokens {
        9 => 2,
        7 => 0,
        _ => return None,
    };
    let number = |index: usize| tokens[offset + index].parse::<u64>().ok();
    Some((number(3)?, number(6)?, number(5)?))
}

/// How long a node may lag without applying anything before its consumer is
/// started again (see `poll_stream`).
const STALL_RESTART: Duration = Duration::from_secs(2);
const STALL_RESTART_MAX: Duration = Duration::from_secs(32);

/// Every second, the stream's last sequence: the lag shows even when no entry
/// arrives (this node cannot reach NATS, or its writer is stuck).
///
/// It also restarts a consumer that stopped delivering without an error: when
/// the NATS server this node is connected to dies, async-nats' ordered consumer
/// notices only after missing two 15 s idle heartbeats (the fault tests saw
/// nodes stand still 20 to 30 s, with writes taken there waiting for their
/// apply). A node that lags and has applied nothing for `STALL_RESTART`
/// consumes again from its last applied entry; while restarts bring nothing
/// (NATS unreachable, a machine too loaded to set a consumer up in time), the
/// wait doubles, up to `STALL_RESTART_MAX`, so that they never livelock.
async fn poll_stream(cluster: Arc<Cluster>, mut shutdown: watch::Receiver<bool>) {
    let mut last_applied = cluster.shared.status.applied_seq();
    let mut stalled_since: Option<std::time::Instant> = None;
    let mut stall_restart = STALL_RESTART;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
        if let Ok(state) = cluster.stream_state().await {
            cluster.shared.status.saw_stream_seq(state.last_seq);
        }
        let applied = cluster.shared.status.applied_seq();
        if applied != last_applied || cluster.shared.status.lag_entries() == 0 {
            last_applied = applied;
            stalled_since = None;
            stall_restart = STALL_RESTART;
            continue;
        }
        let since = *stalled_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() >= stall_restart {
            tracing::warn!(
                applied_seq = applied,
                "the stream's consumer delivers nothing while this node lags; starting it again"
            );
            cluster.shared.restart.notify_one();
            stalled_since = None;
            stall_restart = (stall_restart * 2).min(STALL_RESTART_MAX);
        }
    }
}

/// Unix nanoseconds now (for entries whose publication time is unknown).
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::ack_reply_info;

    #[test]
    fn the_ack_subject_gives_the_stream_seq_the_pending_count_and_the_time() {
        // The v1 form: stream, consumer, delivered, stream seq, consumer seq, ns, pending.
        assert_eq!(
            ack_reply_info("$JS.ACK.ORDO.c1.1.42.7.1700000000123456789.958"),
            Some((42, 958, 1700000000123456789))
        );
        // The v2 form: domain and account hash first, a random token after.
        assert_eq!(
            ack_reply_info("$JS.ACK._.HASH.ORDO.c1.1.42.7.1700000000123456789.958.xyz"),
            Some((42, 958, 1700000000123456789))
        );
        assert_eq!(ack_reply_info("$JS.ACK.hub.HASH.ORDO.c1.2.5.3.17.0"), Some((5, 0, 17)));
        // Anything else falls back to async-nats' own parser.
        for bad in
            ["", "_INBOX.x", "$JS.ACK.ORDO.c1.1.42.7.17", "$JS.ACK.ORDO.c1.1.x.7.17.0", "$JS.ACK.a.b.c.d.e.f.g.h"]
        {
            assert_eq!(ack_reply_info(bad), None, "{bad}");
        }
    }
}
