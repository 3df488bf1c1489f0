//! Group commit on the stream: the entries that requests hand this node at
//! about the same time are published together, so that they share one Raft
//! round and one fsync per replica, as the single node's log shares one fsync
//! among the writes that arrive together. On a stream that takes packs
//! (`pack::SeqScheme`) a group is one message, a pack of its entries, so the
//! stream's work per message is paid once per group; on an older stream it is
//! one JetStream atomic batch (`batch`) of one message per entry. Every entry
//! keeps its own message id (inside the pack) and seq, and each request still
//! gets its own entries' outcomes (`log::Cluster::submit_all_as`).
//!
//! The coalescing task takes submissions (one request's entries, in order,
//! never split) from a bounded queue. It starts a group with the first one,
//! adds what is already queued (and, with a `wait`, what arrives within it)
//! up to `max_entries` and `max_bytes`, and publishes the group on a task of
//! its own while it gathers the next: at most `in_flight` groups are being
//! published at once. While they are, new submissions queue up and make the
//! next group larger: no wait is added when the node is idle, and the busier
//! it is the more entries share a round. A group of one entry is an ordinary
//! publish. An older stream that does not take atomic batches (`allow_atomic`
//! off, or a nats-server before 2.12) gets its entries one message each.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::batch::{self, BatchAnswer, MAX_BATCH_ENTRIES};
use super::pack::{self, SeqScheme};
use super::retry::{Next, Refusal, Retry};
use super::{unavailable, Cluster, PUBLISH_TIMEOUT};
use crate::error::ApiError;

/// How entries are grouped (`--coalesce-*`; docs/SCALING.md, "Group commit").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoalesceOptions {
    /// Most entries in one group (1: every entry its own publish).
    pub max_entries: usize,
    /// Most payload bytes in one group.
    pub max_bytes: usize,
    /// How long a group waits for more entries once it has its first (zero:
    /// it takes only what is already queued).
    pub wait: Duration,
    /// Groups being published at once.
    pub in_flight: usize,
}

impl Default for CoalesceOptions {
    fn default() -> CoalesceOptions {
        CoalesceOptions { max_entries: 256, max_bytes: 1 << 20, wait: Duration::ZERO, in_flight: 4 }
    }
}

/// Submissions queued for the coalescing task at most.
const QUEUE_CAPACITY: usize = 4_096;

/// One request's entries: message id and payload, in the order they must
/// take in the stream; told when all of them are stored (or not).
pub struct Submission {
    pub entries: Vec<(String, Bytes)>,
    /// The lengths of the units the entries make, in order (empty: one unit,
    /// all of them): a pack is cut between units, and inside one only when it
    /// alone is larger than a pack (`pack_len`).
    pub units: Vec<usize>,
    pub stored: oneshot::Sender<Result<(), ApiError>>,
}

impl Submission {
    fn bytes(&self) -> usize {
        self.entries.iter().map(|(_, payload)| payload.len()).sum()
    }
}

/// The queue into the coalescing task, and whether the stream takes atomic batches.
pub struct Coalescer {
    queue: mpsc::Sender<Submission>,
    receiver: std::sync::Mutex<Option<mpsc::Receiver<Submission>>>,
    pub options: CoalesceOptions,
    /// Cleared for good when the stream refuses an atomic batch as disabled.
    atomic: AtomicBool,
    /// How the stream numbers a message's entries: whether groups are packs.
    scheme: SeqScheme,
    /// Batch ids are this process's random prefix and a number: unique among
    /// every node's batches in flight, and within JetStream's 64 characters.
    batch_prefix: String,
    next_batch: AtomicU64,
    /// Groups published, and the entries in them (`render_metrics`).
    groups: AtomicU64,
    group_entries: AtomicU64,
}

impl Coalescer {
    pub fn new(options: CoalesceOptions, atomic: bool, scheme: SeqScheme) -> Coalescer {
        let (queue, receiver) = mpsc::channel(QUEUE_CAPACITY);
        Coalescer {
            queue,
            receiver: std::sync::Mutex::new(Some(receiver)),
            options,
            atomic: AtomicBool::new(atomic),
            scheme,
            batch_prefix: random_hex(),
            next_batch: AtomicU64::new(0),
            groups: AtomicU64::new(0),
            group_entries: AtomicU64::new(0),
        }
    }

    /// Queues one request's entries, in `units` (their lengths; empty: one
    /// unit); the answer says whether they are stored.
    pub async fn submit(
        &self,
        entries: Vec<(String, Bytes)>,
        units: Vec<usize>,
    ) -> oneshot::Receiver<Result<(), ApiError>> {
        debug_assert!(units.is_empty() || units.iter().sum::<usize>() == entries.len(), "units cover the entries");
        let (stored, receiver) = oneshot::channel();
        if let Err(refused) = self.queue.send(Submission { entries, units, stored }).await {
            let _ = refused.0.stored.send(Err(ApiError::shutting_down()));
        }
        receiver
    }

    /// Starts the coalescing task (once).
    pub fn spawn(cluster: &Arc<Cluster>) {
        let receiver = cluster.coalescer.receiver.lock().expect("coalescer lock").take();
        if let Some(receiver) = receiver {
            tokio::spawn(run(cluster.clone(), receiver));
        }
    }

    fn batch_id(&self, attempt: u32) -> String {
        format!("{}-{}-{attempt}", self.batch_prefix, self.next_batch.fetch_add(1, Ordering::Relaxed))
    }

    /// A pack's message id: kept by every attempt to publish it, so the stream stores it once.
    fn pack_id(&self) -> String {
        format!("{}-p{}", self.batch_prefix, self.next_batch.fetch_add(1, Ordering::Relaxed))
    }

    pub fn takes_atomic_batches(&self) -> bool {
        self.atomic.load(Ordering::Relaxed)
    }

    /// `ordo_cluster_publish_groups_total` and `..._group_entries_total`.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        for (name, help, value) in [
            ("groups", "Groups of entries this node published: one atomic batch, or one entry.", &self.groups),
            (
                "group_entries",
                "Entries in those groups (over the groups: entries per Raft round).",
                &self.group_entries,
            ),
        ] {
            let name = format!("ordo_cluster_publish_{name}_total");
            let _ =
                writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", value.load(Ordering::Relaxed));
        }
    }
}

fn random_hex() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS's random numbers");
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

async fn run(cluster: Arc<Cluster>, mut receiver: mpsc::Receiver<Submission>) {
    let options = cluster.coalescer.options;
    let in_flight = Arc::new(Semaphore::new(options.in_flight.max(1)));
    let mut carried = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match receiver.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let permit = in_flight.clone().acquire_owned().await.expect("the semaphore is never closed");
        let (group, next) = gather(&mut receiver, first, &options).await;
        carried = next;
        let cluster = cluster.clone();
        tokio::spawn(async move {
            publish_group(&cluster, group).await;
            drop(permit);
        });
    }
}

/// The group that starts with `first`: what is queued (or arrives within
/// `options.wait`) while it fits; the submission that did not fit starts the next.
async fn gather(
    receiver: &mut mpsc::Receiver<Submission>,
    first: Submission,
    options: &CoalesceOptions,
) -> (Vec<Submission>, Option<Submission>) {
    let max_entries = options.max_entries.clamp(1, MAX_BATCH_ENTRIES);
    let (mut entries, mut bytes) = (first.entries.len(), first.bytes());
    let mut group = vec![first];
    let deadline = tokio::time::Instant::now() + options.wait;
    while entries < max_entries && bytes < options.max_bytes {
        let next = match receiver.try_recv() {
            Ok(next) => next,
            Err(_) if options.wait.is_zero() => break,
            Err(_) => match tokio::time::timeout_at(deadline, receiver.recv()).await {
                Ok(Some(next)) => next,
                _ => break,
            },
        };
        if entries + next.entries.len() > max_entries || bytes + next.bytes() > options.max_bytes {
            return (group, Some(next));
        }
        entries += next.entries.len();
        bytes += next.bytes();
        group.push(next);
    }
    (group, None)
}

/// Publishes a group's entries, in order, and tells each submission the outcome.
async fn publish_group(cluster: &Cluster, group: Vec<Submission>) {
    let mut entries = Vec::with_capacity(group.iter().map(|submission| submission.entries.len()).sum());
    let mut unit_ends = Vec::with_capacity(group.len());
    let mut told = Vec::with_capacity(group.len());
    for submission in group {
        add_unit_ends(&mut unit_ends, entries.len(), &submission);
        entries.extend(submission.entries);
        told.push(submission.stored);
    }
    let result = publish_in_order(cluster, &entries, &unit_ends).await;
    cluster.coalescer.groups.fetch_add(1, Ordering::Relaxed);
    cluster.coalescer.group_entries.fetch_add(entries.len() as u64, Ordering::Relaxed);
    for stored in told {
        let _ = stored.send(result.clone());
    }
}

/// Appends to `unit_ends` where each unit of `submission` ends in the group,
/// its entries starting at `start`.
fn add_unit_ends(unit_ends: &mut Vec<usize>, start: usize, submission: &Submission) {
    if submission.units.is_empty() {
        unit_ends.push(start + submission.entries.len());
        return;
    }
    let mut end = start;
    for &len in &submission.units {
        end += len;
        unit_ends.push(end);
    }
}

/// Publishes `entries` in order: as packs on a stream that takes them, else
/// as atomic batches of at most `max_entries` (one request's entries beyond
/// that, a copy's say, take several batches), or one message each when
/// batches are off or the stream takes none. `unit_ends`: where each unit of
/// the entries ends (`Submission::units`).
async fn publish_in_order(cluster: &Cluster, entries: &[(String, Bytes)], unit_ends: &[usize]) -> Result<(), ApiError> {
    if cluster.coalescer.scheme.packs() {
        return publish_packs(cluster, entries, unit_ends).await;
    }
    let batch_entries = cluster.coalescer.options.max_entries.clamp(1, MAX_BATCH_ENTRIES);
    for chunk in entries.chunks(batch_entries) {
        let atomic = match chunk.len() > 1 && cluster.coalescer.takes_atomic_batches() {
            true => publish_atomic(cluster, chunk).await,
            false => None,
        };
        match atomic {
            Some(result) => result?,
            None => publish_one_by_one(cluster, chunk).await?,
        }
    }
    Ok(())
}

/// Sends `entries` as one atomic batch until the stream stores them or the
/// retry policy gives up; `None` when the stream does not take atomic batches.
async fn publish_atomic(cluster: &Cluster, entries: &[(String, Bytes)]) -> Option<Result<(), ApiError>> {
    let mut retry = Retry::new(tokio::time::Instant::now());
    for attempt in 1u32.. {
        // A new batch id per attempt; the message ids stay, so the stream stores the entries once.
        let batch_id = cluster.coalescer.batch_id(attempt);
        let client = cluster.conn().client.clone();
        let (refusal, said) = match batch::send(&client, &batch_id, entries, PUBLISH_TIMEOUT).await {
            BatchAnswer::Stored => return Some(Ok(())),
            BatchAnswer::Unsupported(said) => {
                tracing::warn!("the stream takes no atomic batches ({said}): publishing one entry per message");
                cluster.coalescer.atomic.store(false, Ordering::Relaxed);
                return None;
            }
            BatchAnswer::Refused(refusal, said) => (refusal, said),
        };
        if refusal == Refusal::TimedOut {
            cluster.reconnect_after_timeout("an atomic batch");
        }
        match retry.next(refusal, tokio::time::Instant::now()) {
            Next::SendAfter(delay) => {
                tracing::debug!(batch_id, said, ?delay, "publishing the batch again with the same message ids");
                tokio::time::sleep(delay).await;
            }
            Next::GiveUp => {
                return Some(Err(unavailable(format!(
                    "the stream did not acknowledge the write ({said}); it may still be applied"
                ))))
            }
        }
    }
    unreachable!("the retry policy gives up within PUBLISH_ATTEMPTS")
}

/// Publishes `entries` in order as packs, each within the stream's entries per
/// message and the NATS server's largest message (an entry that fills one
/// alone is published as it is), one after another: a pack is sent only once
/// the one before it is stored, so they land in this order. A pack ends
/// where a unit does (`unit_ends`) unless a unit alone is larger than a pack.
async fn publish_packs(cluster: &Cluster, entries: &[(String, Bytes)], unit_ends: &[usize]) -> Result<(), ApiError> {
    let max_entries = cluster.coalescer.options.max_entries.clamp(1, cluster.coalescer.scheme.max_entries());
    // The NATS limit counts the message's headers (its id) too.
    let max_bytes =
        cluster.max_payload().saturating_sub(PACK_HEADERS_ROOM).min(cluster.coalescer.options.max_bytes.max(1));
    let mut start = 0;
    while start < entries.len() {
        let n = pack_len(&entries[start..], ends_after(unit_ends, start), max_entries, max_bytes);
        let chunk = &entries[start..start + n];
        start += n;
        let (id, payload) = match chunk {
            [(id, payload)] => (id.clone(), payload.clone()),
            _ => {
                let mut out = BytesMut::new();
                pack::encode(chunk, &mut out);
                (cluster.coalescer.pack_id(), out.freeze())
            }
        };
        let ack = cluster.send(&id, payload.clone()).await;
        cluster.acknowledged(&id, payload, ack).await?;
    }
    Ok(())
}

/// Bytes of a pack's message left for its headers under the server's largest message.
const PACK_HEADERS_ROOM: usize = 1024;

/// The units' ends past `start`, as offsets from it.
fn ends_after(unit_ends: &[usize], start: usize) -> impl Iterator<Item = usize> + '_ {
    unit_ends.iter().filter(move |&&end| end > start).map(move |&end| end - start)
}

/// How many of `entries` (at least one) the next pack takes: the whole units
/// that fit (`unit_ends`: where they end, rising), or as many entries as fit
/// when the first unit alone does not.
fn pack_len(
    entries: &[(String, Bytes)],
    unit_ends: impl Iterator<Item = usize>,
    max_entries: usize,
    max_bytes: usize,
) -> usize {
    let mut bytes = pack::PACK_HEADER_BYTES;
    let mut n = 0;
    for (id, payload) in entries.iter().take(max_entries) {
        bytes += pack::PACK_ENTRY_OVERHEAD_BYTES + id.len() + payload.len();
        if bytes > max_bytes {
            break;
        }
        n += 1;
    }
    let fit = n.max(1);
    unit_ends.take_while(|&end| end <= fit).last().unwrap_or(fit)
}

/// Sends each entry as its own message, back to back (so the stream takes
/// them in this order), then waits for each one's acknowledgement.
async fn publish_one_by_one(cluster: &Cluster, entries: &[(String, Bytes)]) -> Result<(), ApiError> {
    let mut sent = Vec::with_capacity(entries.len());
    for (id, payload) in entries {
        sent.push(cluster.send(id, payload.clone()).await);
    }
    for ((id, payload), ack) in entries.iter().zip(sent) {
        cluster.acknowledged(id, payload.clone(), ack).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: usize, payload_bytes: usize) -> Vec<(String, Bytes)> {
        (0..n).map(|i| (format!("e{i}"), Bytes::from(vec![b'x'; payload_bytes]))).collect()
    }

    /// The lengths of the packs `publish_packs` cuts `entries` into.
    fn packs(entries: &[(String, Bytes)], unit_ends: &[usize], max_entries: usize, max_bytes: usize) -> Vec<usize> {
        let mut lens = Vec::new();
        let mut start = 0;
        while start < entries.len() {
            let n = pack_len(&entries[start..], ends_after(unit_ends, start), max_entries, max_bytes);
            lens.push(n);
            start += n;
        }
        lens
    }

    #[test]
    fn a_pack_ends_between_units_unless_one_alone_is_larger_than_a_pack() {
        let ten = entries(10, 10);
        // Units of 3 (and a last of 1): a pack of 4 entries takes whole units, never a part of one.
        assert_eq!(packs(&ten, &[3, 6, 9, 10], 4, usize::MAX), [3, 3, 4]);
        // One unit per entry (what a submission of single entries makes): packs are full.
        assert_eq!(packs(&ten, &(1..=10).collect::<Vec<_>>(), 4, usize::MAX), [4, 4, 2]);
        // A unit of 6 is larger than a pack: cut where the pack is full, and
        // its rest shares the next pack with the unit after it, which fits.
        assert_eq!(packs(&ten, &[2, 8, 10], 4, usize::MAX), [2, 4, 4]);
        // By bytes: each entry takes 6 + 2 + 10 bytes; a pack of 3 + 3 × 18 fits three.
        let max_bytes = pack::PACK_HEADER_BYTES + 3 * (pack::PACK_ENTRY_OVERHEAD_BYTES + 2 + 10);
        assert_eq!(packs(&ten, &[2, 4, 7, 10], 256, max_bytes), [2, 2, 3, 3]);
        // A single entry larger than a pack still goes, alone.
        assert_eq!(packs(&entries(2, 100), &[2], 256, 50), [1, 1]);
    }
}
