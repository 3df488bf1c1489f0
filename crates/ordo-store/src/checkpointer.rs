//! The checkpointer thread: it owns the LMDB [`Store`] and brings it up to date
//! with the write-ahead log in bulk, one write transaction per checkpoint, so a
//! page touched by many batches is written once. LMDB requires every write
//! transaction of an environment to stay on one thread; this is that thread.
//!
//! Invariants:
//! - records arrive in sequence order and are committed in it; LMDB's `last_seq`
//!   is always a prefix of the log;
//! - [`Shared::checkpointed_seq`] is raised only after LMDB's commit returned, so
//!   the writer deletes a log segment only once LMDB holds all of it durably;
//! - a failed checkpoint keeps its records and is retried; meanwhile the failure
//!   is published ([`Checkpointer::stall`]) and the database refuses new batches,
//!   so the log and the memory it takes stop growing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ordo_core::{Batch, Schema};

use crate::error::StoreError;
use crate::store::{CommitWrite, Store};
use crate::wal;

/// Jobs queued for the checkpointer; a full queue makes the writer wait.
const JOB_QUEUE_CAPACITY: usize = 1024;

type StoreJob = Box<dyn FnOnce(&Store, Result<u64, StoreError>) + Send>;

enum Job {
    /// Framed log records, already durable in the log, in sequence order.
    Records(Vec<u8>),
    CreateCollection {
        number: u32,
        name: String,
        schema: Schema,
        reply: Sender<Result<(), StoreError>>,
    },
    /// Checkpoints everything received, then runs on the store with the outcome.
    Run(StoreJob),
}

/// Why checkpoints fail, kept for the writer (a `StoreError` is not `Clone`).
#[derive(Clone, Debug)]
pub(crate) enum Stall {
    MapFull { map_size: usize, max_map_size: usize },
    DiskFull,
    Failed(String),
}

impl Stall {
    fn of(error: &StoreError) -> Stall {
        match error {
            StoreError::MapFull { map_size, max_map_size } => {
                Stall::MapFull { map_size: *map_size, max_map_size: *max_map_size }
            }
            StoreError::DiskFull { .. } => Stall::DiskFull,
            other => Stall::Failed(other.to_string()),
        }
    }

    pub(crate) fn to_error(&self, dir: &std::path::Path) -> StoreError {
        match self {
            Stall::MapFull { map_size, max_map_size } => {
                StoreError::MapFull { map_size: *map_size, max_map_size: *max_map_size }
            }
            Stall::DiskFull => StoreError::DiskFull { dir: dir.to_owned() },
            Stall::Failed(reason) => StoreError::CheckpointFailed { dir: dir.to_owned(), reason: reason.clone() },
        }
    }
}

#[derive(Default)]
struct Shared {
    /// Sequence number of the last batch LMDB holds durably.
    checkpointed_seq: AtomicU64,
    stall: Mutex<Option<Stall>>,
    /// Set to stop without the final checkpoint, as a crash would.
    skip_final_checkpoint: AtomicBool,
}

pub(crate) struct Checkpointer {
    jobs: Option<SyncSender<Job>>,
    /// Record buffers the checkpointer is done with, for the writer to reuse.
    recycled: Receiver<Vec<u8>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Moves `store` to a new thread. `schemas` holds every stored collection's
    /// number and schema. A checkpoint runs `interval` after the oldest record
    /// not yet checkpointed arrived, or as soon as `max_pending_bytes` of records wait.
    pub(crate) fn spawn(
        store: Store,
        schemas: Vec<(u32, Schema)>,
        interval: Duration,
        max_pending_bytes: usize,
    ) -> Checkpointer {
        let (jobs, receiver) = mpsc::sync_channel(JOB_QUEUE_CAPACITY);
        let (recycle, recycled) = mpsc::channel();
        let shared = Arc::new(Shared {
            checkpointed_seq: AtomicU64::new(store.last_seq()),
            stall: Mutex::new(None),
            skip_final_checkpoint: AtomicBool::new(false),
        });
        let state = State {
            store,
            schemas: schemas.into_iter().collect(),
            pending: Vec::new(),
            batches: Vec::new(),
            recycle,
            shared: Arc::clone(&shared),
        };
        let thread = std::thread::Builder::new()
            .name("ordo-checkpoint".to_owned())
            .spawn(move || run(state, receiver, interval, max_pending_bytes))
            .expect("spawning the checkpointer thread");
        Checkpointer { jobs: Some(jobs), recycled, shared, thread: Some(thread) }
    }

    fn send(&self, job: Job) {
        let sent = self.jobs.as_ref().expect("open until dropped").send(job);
        if sent.is_err() {
            self.propagate_panic();
        }
    }

    /// The checkpointer stops only when dropped; gone early, it panicked.
    fn propagate_panic(&self) -> ! {
        panic!("the checkpointer thread panicked")
    }

    /// An empty buffer for the next records.
    pub(crate) fn take_buffer(&self) -> Vec<u8> {
        self.recycled.try_recv().unwrap_or_default()
    }

    /// Hands over records that are durable in the log.
    pub(crate) fn send_records(&self, records: Vec<u8>) {
        self.send(Job::Records(records));
    }

    /// Creates a collection in LMDB, after a checkpoint of every record before it.
    pub(crate) fn create_collection(&self, number: u32, name: &str, schema: Schema) -> Result<(), StoreError> {
        let (reply, receiver) = mpsc::channel();
        self.send(Job::CreateCollection { number, name: name.to_owned(), schema, reply });
        receiver.recv().unwrap_or_else(|_| self.propagate_panic())
    }

    /// Checkpoints every record handed over, then runs `job` on the store.
    pub(crate) fn run<R: Send + 'static>(
        &self,
        job: impl FnOnce(&Store, Result<u64, StoreError>) -> R + Send + 'static,
    ) -> R {
        let (reply, receiver) = mpsc::channel();
        self.send(Job::Run(Box::new(move |store, outcome| {
            let _ = reply.send(job(store, outcome));
        })));
        receiver.recv().unwrap_or_else(|_| self.propagate_panic())
    }

    pub(crate) fn checkpointed_seq(&self) -> u64 {
        self.shared.checkpointed_seq.load(Ordering::Acquire)
    }

    /// Why the last checkpoint failed, while it keeps failing.
    pub(crate) fn stall(&self) -> Option<Stall> {
        self.shared.stall.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

impl Checkpointer {
    /// Stops the thread without checkpointing what it holds: LMDB is left as a
    /// crash would leave it, and the next open replays the log.
    pub(crate) fn stop_without_checkpoint(mut self) {
        self.shared.skip_final_checkpoint.store(true, Ordering::Release);
        drop(self.jobs.take());
    }
}

impl Drop for Checkpointer {
    /// Closes the queue: the thread checkpoints what it holds and stops; the
    /// store (and the directory's lock) is released when this returns.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct State {
    store: Store,
    /// Schema of each collection, by number.
    schemas: std::collections::HashMap<u32, Schema>,
    /// Records received since the last checkpoint, oldest first. Copied out of
    /// the writer's buffers, which go straight back for reuse: the writer then
    /// allocates nothing per group, and this buffer keeps its capacity (at most
    /// `max_pending_bytes` and one group).
    pending: Vec<u8>,
    /// Decoded batches, reused from one checkpoint to the next.
    batches: Vec<Batch>,
    recycle: Sender<Vec<u8>>,
    shared: Arc<Shared>,
}

fn run(mut state: State, jobs: Receiver<Job>, interval: Duration, max_pending_bytes: usize) {
    // When the oldest pending record is due to be checkpointed.
    let mut due: Option<Instant> = None;
    loop {
        let job = match due {
            None => jobs.recv().ok(),
            Some(due_at) => match jobs.recv_timeout(due_at.saturating_duration_since(Instant::now())) {
                Ok(job) => Some(job),
                Err(RecvTimeoutError::Timeout) => {
                    due = state.checkpoint().err().map(|_| Instant::now() + interval);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => None,
            },
        };
        match job {
            None => {
                // Shutting down: what fails here is replayed from the log at the next open.
                if !state.shared.skip_final_checkpoint.load(Ordering::Acquire) {
                    let _ = state.checkpoint();
                }
                return;
            }
            Some(Job::Records(mut records)) => {
                state.pending.extend_from_slice(&records);
                records.clear();
                let _ = state.recycle.send(records);
                due.get_or_insert_with(|| Instant::now() + interval);
                if state.pending.len() >= max_pending_bytes {
                    due = state.checkpoint().err().map(|_| Instant::now() + interval);
                }
            }
            Some(Job::CreateCollection { number, name, schema, reply }) => {
                let outcome = state.checkpoint().and_then(|_| state.store.create_collection(number, &name, &schema));
                if outcome.is_ok() {
                    state.schemas.insert(number, schema);
                }
                due = (!state.pending.is_empty()).then(|| Instant::now() + interval);
                let _ = reply.send(outcome);
            }
            Some(Job::Run(job)) => {
                let outcome = state.checkpoint();
                due = (!state.pending.is_empty()).then(|| Instant::now() + interval);
                job(&state.store, outcome);
            }
        }
    }
}

impl State {
    /// Writes every pending record to LMDB in one transaction. Returns the
    /// sequence number LMDB now holds; on failure the records stay pending.
    fn checkpoint(&mut self) -> Result<u64, StoreError> {
        let outcome = self.try_checkpoint();
        let mut stall = self.shared.stall.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match &outcome {
            Ok(seq) => {
                *stall = None;
                self.shared.checkpointed_seq.store(*seq, Ordering::Release);
            }
            Err(error) => *stall = Some(Stall::of(error)),
        }
        outcome
    }

    fn try_checkpoint(&mut self) -> Result<u64, StoreError> {
        if self.pending.is_empty() {
            return match self.shared.stall.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).as_ref() {
                Some(stall) => Err(stall.to_error(self.store.dir())),
                None => Ok(self.store.last_seq()),
            };
        }
        let dir = self.store.dir().to_owned();
        let corrupt = |expected| StoreError::Corrupt { dir: dir.clone(), expected };
        let mut numbers = Vec::new();
        let mut expected_seq = self.store.last_seq() + 1;
        let mut offset = 0;
        while offset < self.pending.len() {
            let (record, len) = wal::next_record(&self.pending[offset..]).ok_or(corrupt("intact log records"))?;
            if record.seq != expected_seq {
                return Err(corrupt("log records in sequence"));
            }
            let schema =
                self.schemas.get(&record.collection_number).ok_or(corrupt("log records of known collections"))?;
            if numbers.len() == self.batches.len() {
                self.batches.push(Batch::new());
            }
            wal::decode_batch(&record, schema, &mut self.batches[numbers.len()])
                .map_err(|damaged| corrupt(damaged.0))?;
            numbers.push(record.collection_number);
            expected_seq += 1;
            offset += len;
        }
        let writes: Vec<CommitWrite<'_>> = numbers
            .iter()
            .zip(&self.batches)
            .map(|(&number, batch)| CommitWrite { collection_number: number, schema: &self.schemas[&number], batch })
            .collect();
        self.store.commit(&writes)?;
        self.pending.clear();
        Ok(self.store.last_seq())
    }
}
