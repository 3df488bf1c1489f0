//! The consumer that hands the stream, in order, to the writer thread, and the
//! poll of the stream's state that says how far behind this node is (and
//! restarts a consumer that stalls).
//!
//! The consumer is a plain JetStream pull consumer (ephemeral, no acks, in
//! memory), not async-nats' ordered consumer: this node checks the order itself
//! (`Order`), as the ordered consumer did, and without its costs per message
//! (a second parse of the ack subject with a date conversion, and an idle
//! heartbeat timer armed again for every message), and pulls `PULL_BATCH`
//! messages at a time instead of its fixed 500 (docs/bench-history/2026-11-24-cluster-mode.md,
//! "Catch-up, third pass").

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use futures_util::{FutureExt, StreamExt};
use tokio::sync::watch;

use super::apply::{Delivered, MAX_RUN_BYTES, MAX_RUN_ENTRIES};
use super::{Cluster, SUBJECT};
use crate::writer::{Command, WriterSender};

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
pub async fn consume(cluster: Arc<Cluster>, writer: WriterSender, mut shutdown: watch::Receiver<bool>) {
    let mut generation = 0u64;
    loop {
        generation += 1;
        let start_seq = cluster.shared.status.resume_stream_seq();
        if generation > 1 {
            // Where this generation really starts: the entry after the last one applied.
            tracing::info!(start_seq, generation, "consuming the stream again");
        }
        let stopped = tokio::select! {
            result = consume_from(&cluster, &writer, start_seq, generation) => {
                if let Err(error) = result {
                    // This generation's start, not where the next one starts (logged then).
                    tracing::warn!(started_at_seq = start_seq, %error, "the stream's consumer stopped; starting it again");
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

async fn consume_from(
    cluster: &Arc<Cluster>,
    writer: &WriterSender,
    start_seq: u64,
    generation: u64,
) -> Result<(), String> {
    let setup_started = std::time::Instant::now();
    let state = cluster.stream_state().await?;
    // Entries this node needs removed from the stream (retention): applying what
    // is left would skip them silently. The node stops for good (`gap`).
    super::gap::check_start(cluster, start_seq, &state)?;
    cluster.shared.status.stream_said_last_seq(state.last_seq);
    let conn = cluster.conn();
    let consumer = conn.stream.create_consumer(consumer_config(start_seq)).await.map_err(|error| error.to_string())?;
    // Dropped after `messages` (declared first), however this generation ends.
    let _delete = DeleteOnDrop { cluster: cluster.clone(), name: consumer.cached_info().name.clone() };
    let max_payload = conn.client.server_info().max_payload;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(PULL_BATCH)
        .max_bytes_per_batch(pull_max_bytes(max_payload))
        .messages()
        .await
        .map_err(|error| error.to_string())?;
    drop(conn);
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
    let mut order = Order::default();
    let mut after_gap: Option<Delivered> = None;
    loop {
        let first = match after_gap.take() {
            Some(entry) => entry,
            None => {
                let next = match tokio::time::timeout(STALL_AFTER, messages.next()).await {
                    Ok(next) => next,
                    Err(_) if cluster.shared.status.lag_entries() > 0 => {
                        let Some(stream_last_seq) = lags_by_the_stream_state(cluster).await else { continue };
                        // The stream has entries this consumer does not deliver: its
                        // server is frozen or cut off, and the consumer has not
                        // noticed. A new one reaches the stream's current leader.
                        return Err(format!(
                            "no entry for {STALL_AFTER:?} while the stream holds more (up to seq \
                             {stream_last_seq}); consuming again"
                        ));
                    }
                    Err(_) => continue,
                };
                let Some(message) = next else { break };
                delivered(cluster, &mut order, message, generation)?
            }
        };
        if first.stream_seq > expected {
            super::gap::check(cluster, expected, first.stream_seq).await?;
        }
        expected = first.stream_seq + 1;
        // A run: this entry and those the consumer already holds (never waiting
        // for more), applied by the writer in one command and one group commit
        // (`apply::apply_run`). A node that keeps up gets runs of one.
        let mut n_bytes = first.payload.len();
        let mut run = vec![first];
        while run.len() < MAX_RUN_ENTRIES && n_bytes < MAX_RUN_BYTES {
            match messages.next().now_or_never() {
                Some(Some(message)) => {
                    let entry = delivered(cluster, &mut order, message, generation)?;
                    if entry.stream_seq != expected {
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
        if writer.send(Command::ApplyEntries(run)).await.is_err() {
            return Ok(());
        }
    }
    Err("the stream's messages ended".to_owned())
}

/// Asks the stream itself before a quiet consumer is given up on: `None` when
/// this node has applied all the stream holds (the last seq as seen was more
/// than the stream holds), else the stream's last seq (the stream's state as
/// last known when it cannot be read).
async fn lags_by_the_stream_state(cluster: &Cluster) -> Option<u64> {
    if let Ok(state) = cluster.stream_state().await {
        cluster.shared.status.stream_said_last_seq(state.last_seq);
    }
    let status = &cluster.shared.status;
    (status.lag_entries() > 0).then(|| status.stream_last_seq())
}

/// How long deleting an earlier generation's consumer may take; past it the
/// server removes the consumer after its `inactive_threshold` anyway.
const CONSUMER_DELETE_TIMEOUT: Duration = Duration::from_secs(5);

/// Deletes a generation's consumer once the generation ends (an error, a
/// restart, shutdown) instead of leaving it to the server's inactivity timeout:
/// each restart would otherwise leave one on the stream's server for
/// `inactive_threshold` (a restart after a reconnection, or one a second while
/// the stream cannot be consumed). Through the connection in use when it
/// ends: the old one may be the reason it ended.
struct DeleteOnDrop {
    cluster: Arc<Cluster>,
    name: String,
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let stream = self.cluster.conn().stream.clone();
        let name = std::mem::take(&mut self.name);
        runtime.spawn(async move {
            match tokio::time::timeout(CONSUMER_DELETE_TIMEOUT, stream.delete_consumer(&name)).await {
                Ok(Ok(_)) => tracing::debug!(consumer = name, "deleted the consumer of an earlier generation"),
                Ok(Err(error)) => {
                    tracing::debug!(consumer = name, %error, "an earlier generation's consumer was not deleted")
                }
                Err(_) => tracing::debug!(consumer = name, "deleting an earlier generation's consumer timed out"),
            }
        });
    }
}

/// Messages asked for per pull request (async-nats asks for more when half
/// of them have arrived). The ordered consumer asks for 500.
const PULL_BATCH: usize = 1024;

/// The bytes asked for per pull request: what this node holds in its client's
/// buffers at most (about one and a half times this). Never less than a few
/// of the largest messages the server takes, or a message larger than a whole
/// request would never be delivered.
fn pull_max_bytes(max_payload: usize) -> usize {
    (32 << 20).max(4 * max_payload)
}

/// The consumer of one generation: starts at `start_seq`, ephemeral (the server
/// removes it once this node stops pulling), unacknowledged, in memory, on one
/// server; as async-nats' ordered consumer makes it.
fn consumer_config(start_seq: u64) -> consumer::pull::Config {
    consumer::pull::Config {
        filter_subject: SUBJECT.to_owned(),
        deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: start_seq },
        ack_policy: consumer::AckPolicy::None,
        max_deliver: 1,
        inactive_threshold: Duration::from_secs(30),
        num_replicas: 1,
        memory_storage: true,
        ..Default::default()
    }
}

/// The order check the ordered consumer made: a consumer numbers the messages
/// it delivers 1, 2, 3, ...; a number skipped is a message lost on its way (a
/// reconnection, a client buffer overflowing), not an entry missing from the
/// stream, so the consumer starts again from the last entry applied. Only
/// then may a jump in the *stream* seqs be taken for entries missing from the
/// stream (`gap`): it must never record a marker for an entry that exists.
#[derive(Default)]
struct Order {
    last_consumer_seq: u64,
}

impl Order {
    fn check(&mut self, consumer_seq: u64, stream_seq: u64) -> Result<(), String> {
        if consumer_seq != self.last_consumer_seq + 1 {
            return Err(format!(
                "the consumer delivered its message {consumer_seq} (stream seq {stream_seq}) after its message {}: \
                 messages were lost on the way; consuming again",
                self.last_consumer_seq
            ));
        }
        self.last_consumer_seq = consumer_seq;
        Ok(())
    }
}

/// One delivered message as the writer applies it.
fn delivered(
    cluster: &Cluster,
    order: &mut Order,
    message: Result<jetstream::Message, consumer::pull::MessagesError>,
    generation: u64,
) -> Result<Delivered, String> {
    let message = message.map_err(|error| error.to_string())?;
    let reply = message.message.reply.as_deref().and_then(ack_reply_info);
    let AckInfo { seq, consumer_seq, published_ns } = match reply {
        Some(parsed) => parsed,
        None => {
            let info = message.info().map_err(|error| error.to_string())?;
            let published_ns = u64::try_from(info.published.unix_timestamp_nanos()).unwrap_or(0);
            AckInfo { seq: info.stream_sequence, consumer_seq: info.consumer_sequence, published_ns }
        }
    };
    order.check(consumer_seq, seq)?;
    // Only the seq: the pending count beside it is the consumer's server's
    // estimate, which can count entries the stream does not hold (a replica
    // after a leader change), and a value seen is never lowered but by a poll.
    cluster.shared.status.saw_stream_seq(seq);
    let msg_id = message
        .message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|value| value.as_str().to_owned());
    Ok(Delivered { stream_seq: seq, generation, msg_id, published_ns, payload: message.message.payload.clone() })
}

/// What a delivered message's ack subject says.
#[derive(Debug, PartialEq, Eq)]
struct AckInfo {
    /// The stream seq.
    seq: u64,
    /// The consumer's number for this delivery (1, 2, 3, ...).
    consumer_seq: u64,
    /// Publication time, Unix ns.
    published_ns: u64,
}

/// The stream seq, the consumer seq, and the
/// publication time (Unix ns) of a delivered message, read from its ack subject as
/// `jetstream::Message::info` reads it (`$JS.ACK.[<domain>.<account hash>.]<stream>.
/// <consumer>.<delivered>.<stream seq>.<consumer seq>.<ns>.<pending>[...]`), without
/// its date conversion: `info` is the costliest step of a message's delivery
/// here after async-nats' own (docs/bench-history/2026-11-24-cluster-mode.md, "Catch-up profile").
/// `None` for any other shape (the caller falls back to `info`).
fn ack_reply_info(reply: &str) -> Option<AckInfo> {
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
    // The pending count (token 6) is only checked for shape.
    number(6)?;
    Some(AckInfo { seq: number(3)?, consumer_seq: number(4)?, published_ns: number(5)? })
}

/// How long a node may lag without applying anything before its consumer is
/// started again (see `poll_stream`).
const STALL_RESTART: Duration = Duration::from_secs(2);
const STALL_RESTART_MAX: Duration = Duration::from_secs(32);

/// Every second, the stream's last sequence: the lag shows even when no entry
/// arrives (this node cannot reach NATS, or its writer is stuck).
///
/// It also restarts a consumer that stopped delivering without an error: when
/// the NATS server this node is connected to dies, a consumer notices late or
/// never (async-nats' ordered consumer, used before the pull consumer, after missing
/// two 15 s idle heartbeats: the fault tests saw nodes stand still 20 to 30 s,
/// with writes taken there waiting for their apply; the pull consumer now used
/// asks for no heartbeats at all). A node that lags and has applied nothing for `STALL_RESTART`
/// consumes again from its last applied entry; while restarts bring nothing
/// (NATS unreachable, a machine too loaded to set a consumer up in time), the
/// wait doubles, up to `STALL_RESTART_MAX`, so that they never livelock.
pub async fn poll_stream(cluster: Arc<Cluster>, mut shutdown: watch::Receiver<bool>) {
    let mut last_applied = cluster.shared.status.applied_seq();
    let mut stalled_since: Option<std::time::Instant> = None;
    let mut stall_restart = STALL_RESTART;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
        if let Ok(state) = cluster.stream_state().await {
            cluster.shared.status.stream_said_last_seq(state.last_seq);
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

#[cfg(test)]
mod tests {
    use super::{ack_reply_info, AckInfo, Order};

    fn info(seq: u64, consumer_seq: u64, published_ns: u64) -> Option<AckInfo> {
        Some(AckInfo { seq, consumer_seq, published_ns })
    }

    #[test]
    fn the_ack_subject_gives_the_stream_seq_the_consumer_seq_and_the_time() {
        // The v1 form: stream, consumer, delivered, stream seq, consumer seq, ns, pending.
        assert_eq!(ack_reply_info("$JS.ACK.ORDO.c1.1.42.7.1700000000123456789.958"), info(42, 7, 1700000000123456789));
        // The v2 form: domain and account hash first, a random token after.
        assert_eq!(
            ack_reply_info("$JS.ACK._.HASH.ORDO.c1.1.42.7.1700000000123456789.958.xyz"),
            info(42, 7, 1700000000123456789)
        );
        assert_eq!(ack_reply_info("$JS.ACK.hub.HASH.ORDO.c1.2.5.3.17.0"), info(5, 3, 17));
        // Anything else falls back to async-nats' own parser.
        for bad in
            ["", "_INBOX.x", "$JS.ACK.ORDO.c1.1.42.7.17", "$JS.ACK.ORDO.c1.1.x.7.17.0", "$JS.ACK.a.b.c.d.e.f.g.h"]
        {
            assert_eq!(ack_reply_info(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_consumer_seq_skipped_or_repeated_stops_the_consumer() {
        let mut order = Order::default();
        for (consumer_seq, stream_seq) in [(1, 10), (2, 11), (3, 15)] {
            // A jump in stream seqs alone is the gap check's business, not this one's.
            assert_eq!(order.check(consumer_seq, stream_seq), Ok(()));
        }
        let error = order.check(5, 17).unwrap_err();
        assert!(error.contains("message 5 (stream seq 17) after its message 3"), "{error}");
        let mut order = Order::default();
        assert!(order.check(2, 10).is_err(), "the first message is the consumer's message 1");
        let mut order = Order::default();
        assert_eq!(order.check(1, 10), Ok(()));
        assert!(order.check(1, 10).is_err(), "a message delivered twice");
    }
}
