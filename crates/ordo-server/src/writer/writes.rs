//! The writer thread's writes: group commits of the unguarded writes queued
//! together, writes under filtered write rules (checked against the committed
//! items first), cluster mode's runs of entries, and the access rules' own write.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use ordo_core::{Batch, CollectionId, Schema};
use ordo_store::{PendingWrite, MAX_BATCHES_PER_COMMIT, MAX_BYTES_PER_COMMIT};

use super::fanout::FanoutTarget;
use super::{Command, WriteReply, WriteResults, Writer, RULES_COLLECTION, RULES_ITEM};
use crate::error::{ApiError, ErrorCode};
use crate::metrics::{self, Stage, METRICS};
use crate::write_guard::WriteGuard;

/// The group being committed, kept between groups so that its lists are reused.
#[derive(Default)]
pub(super) struct GroupBuffers {
    group: Vec<PendingWrite>,
    /// Each request's reply, and its parts' list (emptied into `group`, refilled after).
    replies: Vec<(oneshot::Sender<WriteReply>, WriteParts)>,
}

/// A request's list of parts while its batches are in the group being written.
struct WriteParts {
    list: Vec<(CollectionId, Batch)>,
    /// How many of the group's writes are this request's.
    n_parts: usize,
    /// The list its results go into (the request's own, see `Command::Write`).
    results: WriteResults,
}

/// An unguarded write as `Command::Write` brings it: its parts, where its answer
/// goes, when it was queued, and the list for its results.
pub(super) type WriteRequest = (Vec<(CollectionId, Batch)>, oneshot::Sender<WriteReply>, Instant, WriteResults);

/// Moves a request's batches into the group; returns their bytes.
fn add_to_group(
    group: &mut Vec<PendingWrite>,
    replies: &mut Vec<(oneshot::Sender<WriteReply>, WriteParts)>,
    (mut batches, reply, queued_at, results): WriteRequest,
) -> usize {
    metrics::record_stage(Stage::WriteQueue, queued_at.elapsed());
    let n_bytes = batches.iter().map(|(_, batch)| batch.n_bytes()).sum();
    let n_parts = batches.len();
    group.extend(batches.drain(..).map(|(collection, batch)| PendingWrite::new(collection, batch)));
    replies.push((reply, WriteParts { list: batches, n_parts, results }));
    n_bytes
}

impl Writer {
    /// Commits `first` with the unguarded writes queued behind it, as one group
    /// (up to the commit's limits), and answers each. Returns the command that
    /// ended the group, if one did: it is handled next.
    pub(super) fn write_group(
        &mut self,
        buffers: &mut GroupBuffers,
        commands: &mut mpsc::Receiver<Command>,
        first: WriteRequest,
    ) -> Option<Command> {
        let GroupBuffers { group, replies } = buffers;
        let mut waiting = None;
        let mut n_bytes = add_to_group(group, replies, first);
        while group.len() < MAX_BATCHES_PER_COMMIT && n_bytes < MAX_BYTES_PER_COMMIT {
            match commands.try_recv() {
                // A guarded write checks the items as committed, so it starts a group of its own.
                Ok(Command::Write { batches, reply, queued_at, guards, results }) if guards.is_empty() => {
                    n_bytes += add_to_group(group, replies, (batches, reply, queued_at, results));
                }
                Ok(other) => {
                    waiting = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        self.fanout.target = FanoutTarget::Subscribers;
        let group_started = Instant::now();
        self.database.write_group(group, &mut self.fanout);
        let log_append = self.database.last_log_append();
        metrics::record_stage(Stage::LogAppend, log_append);
        metrics::record_stage(Stage::Apply, group_started.elapsed().saturating_sub(log_append));
        self.publish_seq();
        let mut done = group.drain(..);
        for (reply, mut parts) in replies.drain(..) {
            let mut results = std::mem::take(&mut parts.results);
            results.clear();
            // A no-op: the network thread sized the list (`write_buffers::take_results`).
            results.reserve(parts.n_parts);
            for write in done.by_ref().take(parts.n_parts) {
                let result = write.result.expect("every write gets a result");
                // A refusal is counted where it is answered (`api::refused`), with
                // those that never reach this thread.
                if result.is_ok() {
                    metrics::add(&METRICS.batches, 1);
                }
                results.push(result.map_err(ApiError::from));
                // The batch goes back to the network thread that built it, for reuse.
                parts.list.push((write.collection, write.batch));
            }
            let _ = reply.send(WriteReply { results, batches: parts.list });
        }
        waiting
    }

    /// A write with parts under restricted write grants: each such part is
    /// checked against the committed items (no group is pending, so they are
    /// the items the write will change), refused whole with `forbidden` if an
    /// op is not admitted, and the rest are committed together.
    pub(super) fn guarded_write(
        &mut self,
        batches: Vec<(CollectionId, Batch)>,
        guards: Vec<(usize, Arc<WriteGuard>)>,
        (reply, queued_at, mut results): (oneshot::Sender<WriteReply>, Instant, WriteResults),
    ) {
        metrics::record_stage(Stage::WriteQueue, queued_at.elapsed());
        let mut refusals: Vec<Option<ApiError>> = (0..batches.len()).map(|_| None).collect();
        for (index, guard) in &guards {
            let (collection, batch) = &batches[*index];
            refusals[*index] = self.guard_refusal(*collection, batch, guard);
        }
        let mut group = Vec::with_capacity(batches.len());
        let mut returned = Vec::with_capacity(batches.len());
        for ((collection, batch), refusal) in batches.into_iter().zip(&refusals) {
            match refusal {
                None => group.push(PendingWrite::new(collection, batch)),
                Some(_) => returned.push((collection, batch)),
            }
        }
        self.fanout.target = FanoutTarget::Subscribers;
        self.database.write_group(&mut group, &mut self.fanout);
        self.publish_seq();
        let mut written = group.into_iter();
        results.clear();
        results.reserve(refusals.len());
        for refusal in refusals {
            let result = match refusal {
                Some(error) => Err(error),
                None => {
                    let write = written.next().expect("one write per accepted part");
                    returned.push((write.collection, write.batch));
                    write.result.expect("every write gets a result").map_err(ApiError::from)
                }
            };
            if result.is_ok() {
                metrics::add(&METRICS.batches, 1);
            }
            results.push(result);
        }
        let _ = reply.send(WriteReply { results, batches: returned });
    }

    /// Why a guarded part is refused, if it is: checked against the committed items.
    pub(crate) fn guard_refusal(
        &self,
        collection: CollectionId,
        batch: &Batch,
        guard: &WriteGuard,
    ) -> Option<ApiError> {
        let collection = self.database.engine().collection(collection)?;
        if collection.schema() != guard.schema() {
            // Its field ids would name other fields: refused, never checked with them.
            return Some(ApiError::new(
                ErrorCode::InvalidBatch,
                format!("the schema of `{}` changed while this write was on its way; send it again", collection.name()),
            ));
        }
        guard.check(collection, batch).err().map(|refusal| refusal.to_error(batch))
    }

    /// Cluster mode: a run of write entries, each at its own seq (refused ones
    /// with a seq marker), in one group commit (see `cluster::apply`).
    pub(crate) fn write_run(&mut self, run: &mut [PendingWrite]) {
        self.fanout.target = FanoutTarget::Subscribers;
        self.database.write_run(run, &mut self.fanout);
        let n_written = run.iter().filter(|write| matches!(write.result, Some(Ok(_)))).count();
        metrics::add(&METRICS.batches, n_written as u64);
    }

    /// Writes the access rules into their reserved collection, creating it the first time.
    pub(crate) fn set_rules(&mut self, doc: &str) -> Result<u64, ApiError> {
        let collection = match self.database.engine().collection_id(RULES_COLLECTION) {
            Some(id) => id,
            None => self.database.create_collection(RULES_COLLECTION, Schema::new())?,
        };
        let mut batch = Batch::new();
        batch.upsert(RULES_ITEM).payload(doc.as_bytes());
        self.fanout.target = FanoutTarget::Subscribers;
        let mut group = [PendingWrite::new(collection, batch)];
        self.database.write_group(&mut group, &mut self.fanout);
        self.publish_seq();
        let [write] = group;
        let ack = write.result.expect("every write gets a result")?;
        Ok(ack.seq)
    }
}
