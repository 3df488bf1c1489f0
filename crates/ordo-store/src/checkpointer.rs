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
//! - no record is kept here: each is added to the open transaction as it arrives
//!   and its buffer goes back to the writer. A failed checkpoint is dropped and
//!   written again from the log segments, which hold every record LMDB lacks;
//!   meanwhile the failure is published ([`Checkpointer::stall`]) and the
//!   database refuses new batches, so the log stops growing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ordo_core::{Batch, Schema};

use crate::error::StoreError;
use crate::store::{CheckpointTarget, OpenCheckpoint, SchemaChange, Store, WriteScratch};
use crate::wal;

/// After a failed checkpoint, the first retry comes this soon; each further one
/// waits twice as long, up to the checkpoint interval.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(500);

/// Jobs queued for the checkpointer; a full queue makes the writer wait.
const JOB_QUEUE_CAPACITY: usize = 1024;
/// Record buffers made when the checkpointer starts, and the room each has. The
/// checkpointer runs at a lower priority and pauses for its commits while the
/// writer goes on, one buffer per group commit: with these stocked, such a lag
/// of up to this many groups costs the writer no allocation (256 KiB up front).
const RECORD_BUFFERS_STOCKED: usize = 64;
const RECORD_BUFFER_BYTES: usize = 4 * 1024;

type StoreJob = Box<dyn FnOnce(&Store, Result<u64, StoreError>) + Send>;

enum Job {
    /// Framed log records, already durable in the log, in sequence order.
    Records {
        records: Vec<u8>,
        /// Sequence numbers of the first and the last record (the writer knows them).
        first_seq: u64,
        last_seq: u64,
    },
    CreateCollection {
        number: u32,
        name: String,
        schema: Schema,
        reply: Sender<Result<(), StoreError>>,
    },
    /// A schema change or drop with its own sequence number: after a checkpoint
    /// of every record before it, one LMDB transaction (see `store/schema_change.rs`).
    ChangeSchema {
        change: SchemaChange,
        seq: u64,
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
    /// not yet checkpointed arrived, or as soon as `max_pending_bytes` of records
    /// have arrived since the last checkpoint.
    pub(crate) fn spawn(
        store: Store,
        schemas: Vec<(u32, Schema)>,
        interval: Duration,
        max_pending_bytes: usize,
        nice: i32,
    ) -> Checkpointer {
        let (jobs, receiver) = mpsc::sync_channel(JOB_QUEUE_CAPACITY);
        let (recycle, recycled) = mpsc::channel();
        for _ in 0..RECORD_BUFFERS_STOCKED {
            let _ = recycle.send(Vec::with_capacity(RECORD_BUFFER_BYTES));
        }
        let shared = Arc::new(Shared {
            checkpointed_seq: AtomicU64::new(store.last_seq()),
            stall: Mutex::new(None),
            skip_final_checkpoint: AtomicBool::new(false),
        });
        let store_last_seq = store.last_seq();
        let state = State {
            target: store.checkpoint_target(),
            scratch: WriteScratch::default(),
            store,
            schemas: schemas.into_iter().collect(),
            received_seq: store_last_seq,
            received_bytes: 0,
            batch: Batch::new(),
            recycle,
            shared: Arc::clone(&shared),
        };
        let thread = std::thread::Builder::new()
            .name("ordo-checkpoint".to_owned())
            .spawn(move || {
                crate::background::lower_priority(nice);
                run(state, receiver, interval, max_pending_bytes)
            })
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
    /// `records` holds the records `first_seq..=last_seq`, framed as in the log.
    pub(crate) fn send_records(&self, records: Vec<u8>, first_seq: u64, last_seq: u64) {
        self.send(Job::Records { records, first_seq, last_seq });
    }

    /// Creates a collection in LMDB, after a checkpoint of every record before it.
    pub(crate) fn create_collection(&self, number: u32, name: &str, schema: Schema) -> Result<(), StoreError> {
        let (reply, receiver) = mpsc::channel();
        self.send(Job::CreateCollection { number, name: name.to_owned(), schema, reply });
        receiver.recv().unwrap_or_else(|_| self.propagate_panic())
    }

    /// Checkpoints every record handed over, then applies `change` as batch `seq`
    /// (the next sequence number) in one transaction. On `Err` nothing changed.
    pub(crate) fn change_schema(&self, change: SchemaChange, seq: u64) -> Result<(), StoreError> {
        let (reply, receiver) = mpsc::channel();
        self.send(Job::ChangeSchema { change, seq, reply });
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
    target: CheckpointTarget,
    scratch: WriteScratch,
    /// Schema of each collection, by number.
    schemas: std::collections::HashMap<u32, Schema>,
    /// The sequence number of the last record handed over (every one of them is
    /// in the log). Records are added to the open checkpoint as they arrive, and
    /// their buffers go straight back to the writer: nothing is copied or kept.
    /// A checkpoint written again after a failure reads its records from the log.
    received_seq: u64,
    /// Bytes of records handed over since the last checkpoint (the early trigger).
    received_bytes: usize,
    /// The batch each record is decoded into, reused for every record.
    batch: Batch,
    recycle: Sender<Vec<u8>>,
    shared: Arc<Shared>,
}

/// Why the checkpointer stopped collecting records into the open checkpoint.
enum Collected {
    /// The checkpoint is due (its interval passed, or enough bytes wait).
    Due,
    /// A job that needs the store to itself (after a checkpoint of everything before it).
    Job(Job),
    /// Every sender is gone.
    Stop,
}

/// The open checkpoint, as far as it got.
enum Applying<'t> {
    /// No record since the last commit.
    Idle,
    Open(OpenCheckpoint<'t>),
    /// Adding a record failed; the rest wait for the commit, which reports this
    /// (and writes them all again if the map has grown).
    Failed(heed::Error),
}

/// Lookups and buffers for adding records, borrowed from [`State`].
struct Adder<'a> {
    dir: &'a std::path::Path,
    schemas: &'a std::collections::HashMap<u32, Schema>,
    batch: &'a mut Batch,
    scratch: &'a mut WriteScratch,
}

impl Adder<'_> {
    fn add(&mut self, open: &mut OpenCheckpoint<'_>, record: &wal::RawRecord<'_>) -> heed::Result<()> {
        let corrupt = |expected: &'static str| heed::Error::Decoding(expected.into());
        if record.first_seq != open.next_seq() {
            return Err(corrupt("log records in sequence"));
        }
        if record.collection_number == wal::MARKER_COLLECTION {
            // Uses its sequence numbers and changes no item (`wal::encode_marker`).
            open.add_marker(record.seq - record.first_seq + 1);
            return Ok(());
        }
        let schema =
            self.schemas.get(&record.collection_number).ok_or_else(|| corrupt("log records of known collections"))?;
        wal::decode_batch(record, schema, self.batch).map_err(|damaged| corrupt(damaged.0))?;
        open.add(record.collection_number, schema, self.batch, self.scratch)
    }

    /// Adds the records of the log from the open checkpoint's next one through
    /// `through_seq`, read back from the segment files.
    fn catch_up(&mut self, open: &mut OpenCheckpoint<'_>, through_seq: u64) -> heed::Result<()> {
        let mut failure = None;
        let outcome = wal::read_records(self.dir, open.next_seq(), through_seq, &mut |record| {
            self.add(open, record).map_err(|error| {
                let message = error.to_string();
                failure = Some(error);
                StoreError::CheckpointFailed { dir: self.dir.to_owned(), reason: message }
            })
        });
        match (outcome, failure) {
            (Ok(()), _) => Ok(()),
            (Err(_), Some(error)) => Err(error),
            (Err(error), None) => Err(heed::Error::Io(std::io::Error::other(error.to_string()))),
        }
    }
}

/// Starts the checkpoint (as the batch after `last_seq`) if none is open, brings
/// it up to the record before `records` from the log if it is behind (after a
/// failure), then adds `records` (framed log records, in sequence order).
fn apply<'t>(
    target: &'t CheckpointTarget,
    last_seq: u64,
    applying: &mut Applying<'t>,
    records: &[u8],
    first_seq_in_records: u64,
    adder: &mut Adder<'_>,
) {
    if matches!(applying, Applying::Idle) {
        *applying = match target.begin(last_seq + 1, adder.scratch) {
            Ok(open) => Applying::Open(open),
            Err(error) => Applying::Failed(error),
        };
    }
    let Applying::Open(open) = applying else { return };
    let mut outcome = Ok(());
    if open.next_seq() < first_seq_in_records {
        outcome = adder.catch_up(open, first_seq_in_records - 1);
    }
    let mut offset = 0;
    while outcome.is_ok() && offset < records.len() {
        let Some((record, len)) = wal::next_record(&records[offset..]) else {
            outcome = Err(heed::Error::Decoding("intact log records".into()));
            break;
        };
        // Records the checkpoint holds already (read back from the log) are skipped.
        if record.seq >= open.next_seq() {
            outcome = adder.add(open, &record);
        }
        offset += len;
    }
    if let Err(error) = outcome {
        *applying = Applying::Failed(error);
    }
}

fn run(mut state: State, jobs: Receiver<Job>, interval: Duration, max_pending_bytes: usize) {
    // When the oldest record LMDB lacks is due to be checkpointed (after a failed
    // checkpoint, the retry backs off from `FIRST_RETRY_DELAY` to the interval).
    let mut due: Option<Instant> = (state.received_seq > state.store.last_seq()).then(|| Instant::now() + interval);
    let mut retry_delay = FIRST_RETRY_DELAY;
    loop {
        let (collected, outcome) = {
            let State { store, target, scratch, schemas, received_seq, received_bytes, batch, recycle, shared } =
                &mut state;
            let dir = store.dir().to_owned();
            let mut adder = Adder { dir: &dir, schemas, batch, scratch };
            // Records are added to LMDB as they arrive and committed when due.
            let mut applying = Applying::Idle;
            let collected = loop {
                let job = match due {
                    None => jobs.recv().ok(),
                    Some(due_at) => match jobs.recv_timeout(due_at.saturating_duration_since(Instant::now())) {
                        Ok(job) => Some(job),
                        Err(RecvTimeoutError::Timeout) => break Collected::Due,
                        Err(RecvTimeoutError::Disconnected) => None,
                    },
                };
                match job {
                    None => break Collected::Stop,
                    Some(Job::Records { mut records, first_seq, last_seq }) => {
                        *received_seq = last_seq;
                        *received_bytes += records.len();
                        due.get_or_insert_with(|| Instant::now() + interval);
                        if shared.stall.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).is_none() {
                            apply(target, store.last_seq(), &mut applying, &records, first_seq, &mut adder);
                        }
                        records.clear();
                        let _ = recycle.send(records);
                        if *received_bytes >= max_pending_bytes {
                            break Collected::Due;
                        }
                    }
                    Some(job) => break Collected::Job(job),
                }
            };
            if matches!(collected, Collected::Stop) && shared.skip_final_checkpoint.load(Ordering::Acquire) {
                // As a crash would: the next open replays the log.
                return;
            }
            let outcome = if *received_seq > store.last_seq() || !matches!(applying, Applying::Idle) {
                finish(store, target, applying, *received_seq, &mut adder)
            } else {
                // Nothing to write: LMDB is as up to date as it can be, or still failing.
                match shared.stall.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).as_ref() {
                    Some(stall) => Err(stall.to_error(store.dir())),
                    None => Ok(store.last_seq()),
                }
            };
            if outcome.is_ok() {
                *received_bytes = 0;
            }
            (collected, outcome)
        };
        state.publish(&outcome);
        due = match &outcome {
            Ok(_) => {
                retry_delay = FIRST_RETRY_DELAY;
                None
            }
            Err(_) => {
                // Writes are refused until a checkpoint succeeds: retry soon (a
                // disk that was full may have room again), backing off to the
                // interval so that a lasting failure costs little.
                let delay = retry_delay.min(interval);
                retry_delay = retry_delay.saturating_mul(2);
                Some(Instant::now() + delay)
            }
        };
        match collected {
            Collected::Due => {}
            Collected::Stop => return,
            Collected::Job(Job::Records { .. }) => unreachable!("records are collected above"),
            Collected::Job(Job::CreateCollection { number, name, schema, reply }) => {
                let created = outcome.and_then(|_| state.store.create_collection(number, &name, &schema));
                if created.is_ok() {
                    state.schemas.insert(number, schema);
                }
                let _ = reply.send(created);
            }
            Collected::Job(Job::ChangeSchema { change, seq, reply }) => {
                // Only on top of a complete checkpoint: LMDB then holds every batch
                // before the change, and the change takes the next sequence number.
                let changed = outcome.and_then(|_| state.store.change_schema(&change, seq));
                if changed.is_ok() {
                    match change {
                        SchemaChange::Fields { number, new_schema, .. } => {
                            state.schemas.insert(number, new_schema);
                        }
                        SchemaChange::Drop { number } => {
                            state.schemas.remove(&number);
                        }
                    }
                    state.received_seq = seq;
                    state.shared.checkpointed_seq.store(seq, Ordering::Release);
                }
                let _ = reply.send(changed);
            }
            Collected::Job(Job::Run(job)) => job(&state.store, outcome),
        }
    }
}

/// Brings the open checkpoint up to `through_seq` and commits it. When the map
/// was full it grows, and the checkpoint is written again from the log. Returns
/// the sequence number LMDB holds.
fn finish<'t>(
    store: &mut Store,
    target: &'t CheckpointTarget,
    mut applying: Applying<'t>,
    through_seq: u64,
    adder: &mut Adder<'_>,
) -> Result<u64, StoreError> {
    let started = Instant::now();
    loop {
        if matches!(applying, Applying::Idle) {
            applying = match target.begin(store.last_seq() + 1, adder.scratch) {
                Ok(open) => Applying::Open(open),
                Err(error) => Applying::Failed(error),
            };
        }
        let result = match applying {
            Applying::Idle => unreachable!("begun above"),
            Applying::Open(mut open) => match adder.catch_up(&mut open, through_seq) {
                Ok(()) => open.commit(adder.scratch),
                Err(error) => Err(error),
            },
            Applying::Failed(error) => Err(error),
        };
        match result {
            Ok(n_batches) => {
                store.checkpoint_committed(n_batches);
                // One line per checkpoint (every `checkpoint_interval` at most, or
                // per `checkpoint_bytes` of log): the store's pulse in the log.
                tracing::info!(
                    seq = store.last_seq(),
                    batches = n_batches,
                    millis = started.elapsed().as_millis() as u64,
                    "checkpoint committed"
                );
                return Ok(store.last_seq());
            }
            Err(error) => store.recover_from(error)?,
        }
        applying = Applying::Idle;
    }
}

impl State {
    /// Publishes a checkpoint's outcome: the sequence number LMDB holds, or why it failed.
    fn publish(&self, outcome: &Result<u64, StoreError>) {
        let mut stall = self.shared.stall.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match outcome {
            Ok(seq) => {
                *stall = None;
                self.shared.checkpointed_seq.store(*seq, Ordering::Release);
            }
            Err(error) => {
                // Once per retry (each interval): the log says why LMDB stays behind.
                tracing::warn!(%error, "checkpoint failed; the write-ahead log keeps every batch, retrying");
                *stall = Some(Stall::of(error));
            }
        }
    }
}
