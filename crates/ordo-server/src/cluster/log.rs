//! The NATS side (async-nats): the connection, the stream (created by the first
//! node if absent, `allow_atomic` turned on), submitting entries (grouped into
//! atomic batches by `coalesce`) and publishing one entry with `Nats-Msg-Id`.
//! The consumer that hands the stream, in order, to the writer thread is in
//! `consume`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, context::Publish, stream};
use bytes::Bytes;
use tokio::sync::{oneshot, watch};

use super::coalesce::Coalescer;
use super::pack::{SeqScheme, SEQ_SHIFT_METADATA};
use super::retry::{Next, Refusal, Retry};
use super::{unavailable, ClusterOptions, Outcome, Shared};
use super::{APPLY_TIMEOUT, DUPLICATE_WINDOW, PUBLISH_TIMEOUT, SUBJECT};
use crate::error::ApiError;
use crate::writer::WriterSender;

/// A running cluster connection.
pub struct Cluster {
    pub options: ClusterOptions,
    /// Replaced whole by `reconnect_after_timeout`.
    conn: Arc<std::sync::RwLock<Arc<Conn>>>,
    pub shared: Arc<Shared>,
    /// When this node last started replacing its NATS connection (`reconnect_after_timeout`).
    last_reconnect: std::sync::Mutex<Option<std::time::Instant>>,
    /// Groups the entries requests hand this node into atomic batches (`coalesce`).
    pub(crate) coalescer: Coalescer,
    /// When the stream this node bound to was created (Unix ns): a stream
    /// deleted and created again under the same name has another.
    stream_created_ns: i128,
}

/// One NATS connection and the stream as seen through it.
pub(super) struct Conn {
    /// The connection (what its server takes: `server_info`).
    pub(super) client: async_nats::Client,
    pub(super) js: jetstream::Context,
    pub(super) stream: stream::Stream,
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

/// Where the stream stands, as the server that answered sees it.
pub struct StreamState {
    pub first_seq: u64,
    pub last_seq: u64,
    pub messages: u64,
    /// When the stream was created (Unix ns).
    pub created_ns: i128,
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
        let js = jetstream_of(client.clone());
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
            // A stream this node creates takes many entries per message (`pack`).
            metadata: [(SEQ_SHIFT_METADATA.to_owned(), SeqScheme::PACKED.metadata_value())].into(),
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
        let scheme =
            SeqScheme::from_metadata(stream.cached_info().config.metadata.get(SEQ_SHIFT_METADATA).map(String::as_str))
                .map_err(|error| format!("stream `{}`: {error}", options.stream))?;
        shared.status.set_scheme(scheme);
        // Packs replace atomic batches; a stream of one entry per message still groups that way.
        let atomic = !scheme.packs()
            && options.coalesce.max_entries > 1
            && super::batch::allow_atomic(&client, &options.stream).await;
        let coalescer = Coalescer::new(options.coalesce, atomic, scheme);
        let stream_created_ns = stream.cached_info().created.unix_timestamp_nanos();
        let conn = Arc::new(std::sync::RwLock::new(Arc::new(Conn { client, js, stream })));
        Ok(Cluster { options, conn, shared, last_reconnect: std::sync::Mutex::new(None), coalescer, stream_created_ns })
    }

    pub(super) fn conn(&self) -> Arc<Conn> {
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
    pub(super) fn reconnect_after_timeout(&self, what: &str) {
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
                let js = jetstream_of(client.clone());
                match tokio::time::timeout(PUBLISH_TIMEOUT, js.get_stream(&options.stream)).await {
                    Ok(Ok(stream)) => {
                        // The old connection is dropped once its last request ends.
                        *conn.write().expect("connection lock") = Arc::new(Conn { client, js, stream });
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
            created_ns: info.created.unix_timestamp_nanos(),
        })
    }

    /// Whether `state` is of the stream this node bound to, not of one created
    /// again under its name since.
    pub fn is_bound_stream(&self, state: &StreamState) -> bool {
        state.created_ns == self.stream_created_ns
    }

    /// Publishes `entries` (encoded, in order) and waits for each one's outcome
    /// on this node: acknowledged by the stream's quorum, then applied here.
    pub async fn submit_all(&self, entries: Vec<Vec<u8>>) -> Vec<Result<Outcome, ApiError>> {
        self.submit_all_as(entries.into_iter().map(|entry| (None, entry)).collect()).await
    }

    /// [`Cluster::submit_all`], each entry with the message id suffix it names
    /// (`None`: a number of this process's): the PostgreSQL follower derives its
    /// own from the slot, its term and the transaction's end LSN. The entries
    /// go to the stream together, in this order (`coalesce`), perhaps with
    /// other requests' entries in the same pack or atomic batch.
    pub async fn submit_all_as(&self, entries: Vec<(Option<String>, Vec<u8>)>) -> Vec<Result<Outcome, ApiError>> {
        self.submit_units_as(entries, Vec::new()).await
    }

    /// [`Cluster::submit_all_as`] for entries in units (`units`: their
    /// lengths, in order): a unit is never cut between two stream messages
    /// unless it alone is larger than one (`coalesce::Submission::units`).
    /// The PostgreSQL follower's units are its transactions.
    pub async fn submit_units_as(
        &self,
        entries: Vec<(Option<String>, Vec<u8>)>,
        units: Vec<usize>,
    ) -> Vec<Result<Outcome, ApiError>> {
        if let Some(fatal) = self.shared.status.fatal() {
            return entries.iter().map(|_| Err(unavailable(format!("this node stopped applying: {fatal}")))).collect();
        }
        let mut outcomes = Vec::with_capacity(entries.len());
        let mut publish = Vec::with_capacity(entries.len());
        for (suffix, payload) in entries {
            let (id, outcome) = self.shared.register(suffix.as_deref());
            publish.push((id.clone(), Bytes::from(payload)));
            outcomes.push((id, outcome));
        }
        let mut stored = self.coalescer.submit(publish, units).await;
        let mut published = None;
        let mut results = Vec::with_capacity(outcomes.len());
        for (id, outcome) in outcomes {
            results.push(self.outcome_of(&id, outcome, &mut stored, &mut published).await);
        }
        results
    }

    /// One entry's outcome: its apply here, once the stream stored it. An entry
    /// applied before the stream's answer came (lost with a dead connection, or
    /// a retry still waiting) answers at once; one the stream did not store
    /// answers with the publish's error (it may still be applied).
    async fn outcome_of(
        &self,
        id: &str,
        mut outcome: oneshot::Receiver<Outcome>,
        stored: &mut oneshot::Receiver<Result<(), ApiError>>,
        published: &mut Option<Result<(), ApiError>>,
    ) -> Result<Outcome, ApiError> {
        loop {
            match published {
                Some(Ok(())) => return self.applied(id, outcome).await,
                Some(Err(error)) => {
                    return outcome.try_recv().map_err(|_| {
                        self.shared.forget(id);
                        error.clone()
                    })
                }
                None => {}
            }
            tokio::select! {
                applied = &mut outcome => return applied.map_err(|_| ApiError::shutting_down()),
                result = &mut *stored => *published = Some(result.unwrap_or_else(|_| Err(ApiError::shutting_down()))),
            }
        }
    }

    /// Waits for this node's apply of an entry the stream holds.
    async fn applied(&self, id: &str, outcome: oneshot::Receiver<Outcome>) -> Result<Outcome, ApiError> {
        match tokio::time::timeout(APPLY_TIMEOUT, outcome).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(_)) => Err(ApiError::shutting_down()),
            Err(_) => {
                self.shared.forget(id);
                Err(unavailable(format!(
                    "the write is in the stream but this node did not apply it within {} s",
                    APPLY_TIMEOUT.as_secs()
                )))
            }
        }
    }

    /// The JetStream context of the current connection (the follower's lease bucket).
    pub fn jetstream(&self) -> jetstream::Context {
        self.conn().js.clone()
    }

    /// The largest message the NATS server this node is connected to takes.
    pub fn max_payload(&self) -> usize {
        self.conn().client.server_info().max_payload
    }

    pub async fn submit(&self, entry: Vec<u8>) -> Result<Outcome, ApiError> {
        self.submit_all(vec![entry]).await.pop().expect("one result per entry")
    }

    /// Hands one publish to the connection, bounded: behind a frozen server
    /// the client's command queue can fill, and the send would wait for it.
    pub(super) async fn send(
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

    /// Waits for the stream's acknowledgement of one publish, sending it again
    /// as `Retry` says (always with the same message id, so at most one lands).
    pub(super) async fn acknowledged(
        &self,
        id: &str,
        payload: Bytes,
        mut ack: Result<jetstream::context::PublishAckFuture, jetstream::context::PublishError>,
    ) -> Result<u64, ApiError> {
        let mut retry = Retry::new(tokio::time::Instant::now());
        loop {
            let error = match ack {
                Ok(future) => match future.await {
                    Ok(ack) => return Ok(ack.sequence),
                    Err(error) => error,
                },
                Err(error) => error,
            };
            let refusal = Refusal::of(&error);
            if refusal == Refusal::TimedOut {
                self.reconnect_after_timeout("a publish");
            }
            let delay = match retry.next(refusal, tokio::time::Instant::now()) {
                Next::SendAfter(delay) => delay,
                Next::GiveUp => {
                    return Err(unavailable(format!(
                        "the stream did not acknowledge the write ({error}); it may still be applied"
                    )))
                }
            };
            tracing::debug!(msg_id = id, %error, ?delay, "publishing again with the same message id");
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            // The same id: if an earlier attempt landed, JetStream drops this one
            // and acknowledges the first one's sequence.
            ack = self.send(id, payload.clone()).await;
        }
    }

    /// Runs the consumer and the stream poller until shutdown (`consume`).
    pub fn spawn(self: &Arc<Cluster>, writer: WriterSender, shutdown: watch::Receiver<bool>) {
        super::coalesce::Coalescer::spawn(self);
        tokio::spawn(super::consume::consume(self.clone(), writer, shutdown.clone()));
        tokio::spawn(super::consume::poll_stream(self.clone(), shutdown));
    }
}

/// Unix nanoseconds now (for entries whose publication time is unknown).
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as u64)
}
