//! A durable engine: the log, LMDB and the in-memory engine kept equal. A batch
//! is validated, appended to the write-ahead log and synced, and only then
//! applied to the engine, so windows never show a change that a crash could take
//! back. LMDB catches up in the background (`checkpointer.rs`); at open, the log
//! records after LMDB's last checkpoint are replayed into the engine.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ordo_core::{
    Batch, BatchSummary, CollectionId, DiffSink, Engine, NullSink, OwnedItem, Schema, ViewDef, ViewError, WindowAnchor,
    WindowId, WindowRange,
};

use crate::backup::Backup;
use crate::checkpointer::Checkpointer;
use crate::error::StoreError;
use crate::store::{Durability, LoadProgress, Store, StoreOptions, StoreStats};
use crate::wal::{self, Wal};

mod schema_change;

/// Log records replayed at open are handed to the checkpointer in buffers of this size.
const REPLAY_HANDOFF_BYTES: usize = 4 << 20;

/// A committed batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    /// The batch's sequence number: consecutive, starting at 1, over the directory's life.
    pub seq: u64,
    pub summary: BatchSummary,
}

/// One batch of a group commit, with its outcome once written.
pub struct PendingWrite {
    pub collection: CollectionId,
    pub batch: Batch,
    /// In a run ([`Database::write_run`]), the seq this write must use; `None`:
    /// the one after the write before it. Ignored by [`Database::write_group`].
    pub seq: Option<u64>,
    pub result: Option<Result<Ack, StoreError>>,
}

impl PendingWrite {
    pub fn new(collection: CollectionId, batch: Batch) -> PendingWrite {
        PendingWrite { collection, batch, seq: None, result: None }
    }

    /// A write of a run that must use `seq` (the seqs between the write before
    /// it and this one are used by a seq marker).
    pub fn at(collection: CollectionId, batch: Batch, seq: u64) -> PendingWrite {
        PendingWrite { collection, batch, seq: Some(seq), result: None }
    }
}

/// What opening a data directory found and how long the rebuild took.
#[derive(Clone, Copy, Debug)]
pub struct OpenReport {
    pub n_collections: usize,
    pub n_items: u64,
    pub last_seq: u64,
    /// Opening LMDB, checking the format and reading schemas.
    pub open_time: Duration,
    /// Reading every item into the engine and replaying the log.
    pub load_time: Duration,
    /// Batches found in the write-ahead log after LMDB's last checkpoint, replayed.
    pub n_log_records_replayed: u64,
    /// Bytes of a log record a crash cut short (never acknowledged), removed.
    pub n_log_bytes_cut_off: u64,
}

pub struct Database {
    dir: PathBuf,
    engine: Engine,
    /// Disk number of each engine collection, by `CollectionId::index()` (`None`:
    /// the slot's collection was dropped and none reuses it yet).
    collection_numbers: Vec<Option<u32>>,
    wal: Wal,
    /// Owns the LMDB store on its own thread.
    checkpointer: Checkpointer,
    /// The log records of the group being written, reused.
    records: Vec<u8>,
    /// Scratch of `write_group`, reused: a group allocates nothing once it has grown.
    group_scratch: GroupScratch,
    n_group_commits: u64,
    n_batches_committed: u64,
    /// Bytes of log records appended since the database was opened (what a
    /// write costs in log and, in cluster mode, in stream bytes).
    n_log_bytes_appended: u64,
    /// How long the last group's log write and sync took (for the server's metrics).
    last_log_append: Duration,
    /// The LMDB environment (the checkpointer owns the store): a backup copies
    /// it on its own thread, in a read transaction of its own.
    env: heed::Env,
}

impl Database {
    /// Opens or creates a data directory and rebuilds the engine from it. `progress`
    /// hears about long loads (see [`print_load_progress`]).
    pub fn open(
        dir: &Path,
        options: StoreOptions,
        progress: &mut dyn FnMut(&LoadProgress),
    ) -> Result<(Database, OpenReport), StoreError> {
        let started = Instant::now();
        let (store, stored) = Store::open(dir, options.clone())?;
        let mut engine = Engine::new();
        let mut collection_numbers = Vec::with_capacity(stored.len());
        let mut engine_ids = Vec::with_capacity(stored.len());
        let mut schemas = Vec::with_capacity(stored.len());
        // Targets of `ref` fields first: the engine binds a reference to a live collection.
        let stored = schema_change::targets_first(stored).map_err(|_| StoreError::Corrupt {
            dir: dir.to_owned(),
            expected: "ref fields targeting stored collections",
        })?;
        for collection in stored {
            schemas.push((collection.number, collection.schema.clone()));
            let schema = schema_change::map_ref_targets(&collection.schema, |target| {
                let index = collection_numbers.iter().position(|&number| number == target.index() as u32);
                engine_ids[index.expect("ordered targets first")]
            });
            let collection_id = engine
                .create_collection(&collection.name, schema)
                .map_err(|_| StoreError::Corrupt { dir: dir.to_owned(), expected: "valid, unique collection names" })?;
            collection_numbers.push(collection.number);
            engine_ids.push(collection_id);
        }
        let open_time = started.elapsed();
        store.load_into(&mut engine, &collection_numbers, &engine_ids, progress)?;
        let checkpointed_seq = store.last_seq();
        let env = store.env().clone();
        let checkpointer = Checkpointer::spawn(
            store,
            schemas,
            options.checkpoint_interval,
            options.checkpoint_bytes,
            options.checkpoint_nice,
        );

        // The batches acknowledged after the last checkpoint, from the log.
        let mut batch = Batch::new();
        let mut handoff = Vec::new();
        let mut handoff_first_seq = checkpointed_seq + 1;
        let (wal, recovery) = Wal::open(
            dir,
            checkpointed_seq,
            options.log_segment_bytes,
            options.durability == Durability::Full,
            options.durability == Durability::Full && options.preallocate_log,
            &mut |record| {
                let corrupt = |expected| StoreError::Corrupt { dir: dir.to_owned(), expected };
                if record.collection_number == wal::MARKER_COLLECTION {
                    // A seq marker changes no item; the checkpointer still counts its seq.
                    handoff.extend_from_slice(record.framed);
                    return Ok(());
                }
                let index = collection_numbers
                    .iter()
                    .position(|&number| number == record.collection_number)
                    .ok_or_else(|| corrupt("log records of known collections"))?;
                let collection = engine_ids[index];
                let schema = engine.collection(collection).expect("created above").schema();
                wal::decode_batch(record, schema, &mut batch).map_err(|damaged| corrupt(damaged.0))?;
                // The record's sequence number is the version of the items it upserts.
                engine
                    .apply_batch_at(collection, &batch, record.seq, &mut NullSink)
                    .map_err(|_| corrupt("log records that apply to the stored items"))?;
                handoff.extend_from_slice(record.framed);
                if handoff.len() >= REPLAY_HANDOFF_BYTES {
                    checkpointer.send_records(std::mem::take(&mut handoff), handoff_first_seq, record.seq);
                    handoff_first_seq = record.seq + 1;
                }
                Ok(())
            },
        )?;
        if !handoff.is_empty() {
            checkpointer.send_records(handoff, handoff_first_seq, wal.last_seq());
        }
        let report = OpenReport {
            n_collections: collection_numbers.len(),
            n_items: engine_ids
                .iter()
                .map(|&id| engine.collection(id).map_or(0, |collection| collection.len() as u64))
                .sum(),
            last_seq: wal.last_seq(),
            open_time,
            load_time: started.elapsed() - open_time,
            n_log_records_replayed: recovery.n_records_replayed,
            n_log_bytes_cut_off: recovery.n_torn_bytes_removed,
        };
        let database = Database {
            dir: dir.to_owned(),
            engine,
            collection_numbers: collection_numbers.into_iter().map(Some).collect(),
            wal,
            checkpointer,
            records: Vec::new(),
            group_scratch: GroupScratch::default(),
            n_group_commits: 0,
            n_log_bytes_appended: 0,
            last_log_append: Duration::ZERO,
            n_batches_committed: 0,
            env,
        };
        Ok((database, report))
    }

    /// The engine, read-only: every change goes through [`Database::write`] so that
    /// memory never runs ahead of the disk.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `job` on the LMDB store once every batch acknowledged so far is in it
    /// (a checkpoint first): for checks that what is on disk matches memory.
    pub fn with_store<R: Send + 'static>(&self, job: impl FnOnce(&Store) -> R + Send + 'static) -> R {
        self.checkpointer.run(move |store, _| job(store))
    }

    /// Brings LMDB up to date with the log now; returns the sequence number it holds.
    pub fn checkpoint(&mut self) -> Result<u64, StoreError> {
        let outcome = self.checkpointer.run(|_, outcome| outcome);
        self.remove_checkpointed_log();
        outcome
    }

    /// The sequence number LMDB holds: batches after it are only in the log
    /// (replayed at the next open). Cheap: one atomic load.
    pub fn checkpointed_seq(&self) -> u64 {
        self.checkpointer.checkpointed_seq()
    }

    /// How long the last group commit's log write and `fdatasync` took.
    pub fn last_log_append(&self) -> Duration {
        self.last_log_append
    }

    /// Bytes of log records appended since the database was opened.
    pub fn log_bytes_appended(&self) -> u64 {
        self.n_log_bytes_appended
    }

    pub fn store_stats(&self) -> StoreStats {
        let lmdb = self.checkpointer.run(|store, _| store.stats());
        StoreStats {
            n_commits: self.n_group_commits,
            n_batches_committed: self.n_batches_committed,
            n_checkpoints: lmdb.n_commits,
            checkpointed_seq: self.checkpointer.checkpointed_seq(),
            n_log_segments: self.wal.n_segments(),
            ..lmdb
        }
    }

    /// Closes the database without its final checkpoint, leaving LMDB behind the
    /// log as a crash would: for tests of recovery. Nothing acknowledged is lost;
    /// the next open replays the log.
    pub fn close_without_checkpoint(self) {
        let Database { checkpointer, .. } = self;
        checkpointer.stop_without_checkpoint();
    }

    /// Starts a hot backup (see `backup.rs`): cheap enough for the writer's
    /// thread (an atomic exchange; no I/O); run [`Backup::write_to`] elsewhere
    /// while writes go on. One at a time: `BackupRunning` while another runs.
    pub fn start_backup(&self) -> Result<Backup, StoreError> {
        Backup::start(self.env.clone(), &self.dir, self.wal.share(), self.checkpointer.checkpointed_seq() + 1)
    }

    /// Sequence number of the last acknowledged batch (0 before the first).
    pub fn last_seq(&self) -> u64 {
        self.wal.last_seq()
    }

    /// Deletes the log segments LMDB holds in full, now. A segment that cannot be
    /// deleted is left for the next open; it is never replayed twice (the
    /// checkpoint's sequence number is the boundary), only kept longer.
    fn remove_checkpointed_log(&mut self) {
        let _ = self.wal.remove_checkpointed(self.checkpointer.checkpointed_seq());
    }

    /// The collection's number on disk (see `docs/STORAGE.md`).
    pub fn collection_number(&self, collection_id: CollectionId) -> Option<u32> {
        self.engine.collection(collection_id)?;
        self.collection_numbers.get(collection_id.index()).copied().flatten()
    }

    /// Creates a collection durably.
    pub fn create_collection(&mut self, name: &str, schema: Schema) -> Result<CollectionId, StoreError> {
        // Checked first: a refused collection never reaches the disk.
        self.engine.check_create_collection(name, &schema).map_err(StoreError::CreateCollection)?;
        // A dropped collection's number may come back: its drop deleted its items
        // and checkpointed every log record before it (`docs/STORAGE.md`).
        let number = self.collection_numbers.iter().flatten().max().map_or(0, |&max| max + 1);
        self.checkpointer.create_collection(number, name, self.stored_schema(&schema))?;
        let collection_id = self.engine.create_collection(name, schema).map_err(StoreError::CreateCollection)?;
        if collection_id.index() == self.collection_numbers.len() {
            self.collection_numbers.push(Some(number));
        } else {
            // A slot freed by a drop, reused by the engine.
            self.collection_numbers[collection_id.index()] = Some(number);
        }
        Ok(collection_id)
    }

    /// Writes one batch: validated, committed, then applied to the engine, whose
    /// windows' diffs go to `sink`. Acknowledged (`Ok`) only once durable.
    pub fn write(
        &mut self,
        collection: CollectionId,
        batch: Batch,
        sink: &mut dyn DiffSink,
    ) -> (Batch, Result<Ack, StoreError>) {
        let mut group = [PendingWrite::new(collection, batch)];
        self.write_group(&mut group, sink);
        let [PendingWrite { batch, result, .. }] = group;
        (batch, result.expect("every write of a group gets a result"))
    }

    /// Writes a group of batches with one log append and one sync (group commit).
    /// Each gets its own result: a refused batch does not hold back the others.
    pub fn write_group(&mut self, group: &mut [PendingWrite], sink: &mut dyn DiffSink) {
        self.write_group_with(group, false, sink);
    }

    /// Cluster mode's group commit (a run of stream entries): like
    /// [`Database::write_group`], but every write of `run` uses exactly one
    /// sequence number, whether accepted or not: its own `seq` if it has one,
    /// else the one after the write before it (`last_seq() + 1` for the first).
    /// A refused write (by validation, a precondition) gets a seq marker at its
    /// seq, and the seqs skipped before a write one marker (see
    /// [`Database::advance_seq`]), in the same log append. If the append fails
    /// (`result` an error on every accepted write), nothing is written:
    /// `last_seq()` is unchanged.
    ///
    /// Panics if a write's `seq` is not above the seq before it.
    pub fn write_run(&mut self, run: &mut [PendingWrite], sink: &mut dyn DiffSink) {
        self.write_group_with(run, true, sink);
    }

    fn write_group_with(&mut self, group: &mut [PendingWrite], keep_seqs: bool, sink: &mut dyn DiffSink) {
        let mut scratch = std::mem::take(&mut self.group_scratch);
        scratch.run_seqs.clear();
        if keep_seqs {
            let mut next = self.wal.last_seq() + 1;
            for write in group.iter() {
                let seq = write.seq.unwrap_or(next);
                assert!(seq >= next, "a run's seqs rise: {seq} after {}", next - 1);
                scratch.run_seqs.push(seq);
                next = seq + 1;
            }
        }
        let run_seqs = std::mem::take(&mut scratch.run_seqs);
        let run_seqs_or_none = keep_seqs.then_some(&run_seqs[..]);
        self.validate_group(group, run_seqs_or_none, &mut scratch);
        self.write_accepted(group, &scratch.accepted, run_seqs_or_none, sink);
        scratch.run_seqs = run_seqs;
        // The callers get their own batches back, not the resolved copies.
        for (index, mut original) in scratch.resolved_writes.drain(..) {
            std::mem::swap(&mut group[index].batch, &mut original);
            scratch.spare_batches.push(original);
        }
        self.group_scratch = scratch;
    }

    /// Validates each write of `group` against the engine and the writes before
    /// it; the accepted ones' positions go to `scratch.accepted`.
    ///
    /// A batch with atomic operations or preconditions is resolved into a plain
    /// batch (what is logged and applied) against the items as the accepted
    /// batches before it in the group will leave them: from the first such batch
    /// on, the engine stages every accepted batch (see `Engine::resolve_batch`).
    /// A group of plain batches stages nothing, so their path is as before.
    ///
    /// With `run_seqs` (`write_run`), write `i` gets seq `run_seqs[i]`.
    fn validate_group(&mut self, group: &mut [PendingWrite], run_seqs: Option<&[u64]>, scratch: &mut GroupScratch) {
        let GroupScratch { accepted, pending_items, resolved_writes, spare_batches, .. } = scratch;
        accepted.clear();
        debug_assert!(resolved_writes.is_empty());
        // Accepted writes get consecutive sequence numbers from here (see `write_accepted`).
        let first_seq = self.wal.last_seq() + 1;
        let seq_of = |position: usize, index: usize| match run_seqs {
            Some(seqs) => seqs[index],
            None => first_seq + position as u64,
        };
        let mut is_staging = false;
        for index in 0..group.len() {
            if group[index].batch.needs_state() && !is_staging {
                self.engine.begin_group();
                for (position, &earlier) in accepted.iter().enumerate() {
                    let write = &group[earlier];
                    self.engine.stage_batch(write.collection, &write.batch, seq_of(position, earlier));
                }
                is_staging = true;
            }
            let write = &mut group[index];
            // Items that accepted batches before this one may add to its collection:
            // validation must count them. Indexed by collection, so a group of
            // many collections costs no more per write than one of a single one.
            let slot = write.collection.index();
            if pending_items.len() <= slot {
                pending_items.resize(slot + 1, 0);
            }
            if let Err(error) = self.engine.validate_batch(write.collection, &write.batch, pending_items[slot]) {
                write.result = Some(Err(StoreError::Batch(error)));
                continue;
            }
            let seq = seq_of(accepted.len(), index);
            if write.batch.needs_state() {
                let mut resolved = spare_batches.pop().unwrap_or_default();
                if let Err(error) = self.engine.resolve_batch(write.collection, &write.batch, seq, &mut resolved) {
                    write.result = Some(Err(StoreError::Batch(error)));
                    spare_batches.push(resolved);
                    continue;
                }
                std::mem::swap(&mut write.batch, &mut resolved);
                resolved_writes.push((index, resolved));
            } else if is_staging {
                self.engine.stage_batch(write.collection, &write.batch, seq);
            }
            accepted.push(index);
            pending_items[slot] += write.batch.ops().filter(|op| !op.is_remove()).count();
        }
        // Only accepted writes' collections were counted: zero them for the next group.
        for &index in accepted.iter() {
            pending_items[group[index].collection.index()] = 0;
        }
    }

    /// Appends the accepted writes of `group` to the log, then applies them.
    ///
    /// With `run_seqs`, every write of the group uses its seq (`run_seqs[index]`):
    /// those not accepted get a seq marker there, as do the seqs skipped before
    /// a write.
    fn write_accepted(
        &mut self,
        group: &mut [PendingWrite],
        accepted: &[usize],
        run_seqs: Option<&[u64]>,
        sink: &mut dyn DiffSink,
    ) {
        // A run of refused writes still writes their markers.
        if accepted.is_empty() && run_seqs.is_none_or(|seqs| seqs.is_empty()) {
            return;
        }
        if let Some(stall) = self.checkpointer.stall() {
            // LMDB cannot take more: stop the log (and memory) from growing.
            let error = stall.to_error(&self.dir);
            for &index in accepted {
                group[index].result = Some(Err(error.again()));
            }
            return;
        }
        let first_seq = self.wal.last_seq() + 1;
        let seq_of = |offset: usize, index: usize| match run_seqs {
            Some(seqs) => seqs[index],
            None => first_seq + offset as u64,
        };
        self.records.clear();
        let mut next_accepted = accepted.iter().copied().peekable();
        // The first seq no record of this append uses yet.
        let mut unused_from = first_seq;
        for (index, write) in group.iter().enumerate() {
            let is_accepted = next_accepted.peek() == Some(&index);
            let offset = accepted.len() - next_accepted.len();
            let seq = seq_of(offset, index);
            if !is_accepted {
                if run_seqs.is_some() {
                    // The seqs skipped before it and its own, in one marker.
                    wal::encode_marker(&mut self.records, unused_from, seq);
                    unused_from = seq + 1;
                }
                continue;
            }
            next_accepted.next();
            if seq > unused_from {
                wal::encode_marker(&mut self.records, unused_from, seq - 1);
            }
            let number = self.collection_numbers[write.collection.index()].expect("validated: a live collection");
            let schema = self.engine.collection(write.collection).expect("validated").schema();
            wal::encode_record(&mut self.records, seq, number, schema, &write.batch);
            unused_from = seq + 1;
        }
        let last_seq = unused_from - 1;
        let append_started = Instant::now();
        let appended = self.wal.append(&self.records, last_seq);
        self.last_log_append = append_started.elapsed();
        if let Err(error) = appended {
            for &index in accepted {
                group[index].result = Some(Err(error.again()));
            }
            return;
        }
        self.n_group_commits += 1;
        self.n_batches_committed += accepted.len() as u64;
        self.n_log_bytes_appended += self.records.len() as u64;
        let records = std::mem::replace(&mut self.records, self.checkpointer.take_buffer());
        self.checkpointer.send_records(records, first_seq, last_seq);
        // Off this thread: every write waits for this one.
        self.wal.remove_checkpointed_in_background(self.checkpointer.checkpointed_seq());
        for (offset, &index) in accepted.iter().enumerate() {
            let write = &mut group[index];
            let seq = seq_of(offset, index);
            sink.begin_batch(seq);
            // Validated against the same state before the append: the engine cannot refuse it now.
            let summary = self
                .engine
                .apply_batch_at(write.collection, &write.batch, seq, sink)
                .expect("a logged batch was validated against this state");
            write.result = Some(Ok(Ack { seq, summary }));
        }
    }

    /// Uses the sequence numbers after `last_seq()` up to `seq` (which must be
    /// above it) without changing any item: appends one seq marker to the log
    /// (`docs/STORAGE.md`, "Seq markers"). Cluster mode calls it for each stream
    /// entry that wrote no batch, so that `last_seq()` is the last entry
    /// applied, also after a restart.
    pub fn advance_seq(&mut self, seq: u64) -> Result<(), StoreError> {
        let first_seq = self.wal.last_seq() + 1;
        assert!(seq >= first_seq, "sequence numbers rise: {seq} after {}", first_seq - 1);
        if let Some(stall) = self.checkpointer.stall() {
            return Err(stall.to_error(&self.dir));
        }
        self.records.clear();
        wal::encode_marker(&mut self.records, first_seq, seq);
        self.wal.append(&self.records, seq)?;
        self.n_log_bytes_appended += self.records.len() as u64;
        let records = std::mem::replace(&mut self.records, self.checkpointer.take_buffer());
        self.checkpointer.send_records(records, first_seq, seq);
        self.wal.remove_checkpointed_in_background(self.checkpointer.checkpointed_seq());
        Ok(())
    }

    /// Opens a window on a view (see [`Engine::open_window`]). Windows are not
    /// stored: they belong to the connections that hold them.
    pub fn open_window(
        &mut self,
        collection: CollectionId,
        def: &ViewDef,
        offset: usize,
        limit: usize,
        sink: &mut dyn DiffSink,
    ) -> Result<WindowId, ViewError> {
        self.engine.open_window(collection, def, offset, limit, sink)
    }

    /// See [`Engine::open_window_at`].
    pub fn open_window_at(
        &mut self,
        collection: CollectionId,
        def: &ViewDef,
        anchor: WindowAnchor<'_>,
        limit: usize,
        sink: &mut dyn DiffSink,
    ) -> Result<(WindowId, WindowRange), ViewError> {
        self.engine.open_window_at(collection, def, anchor, limit, sink)
    }

    /// See [`Engine::move_window`].
    pub fn move_window(
        &mut self,
        window: WindowId,
        anchor: WindowAnchor<'_>,
        limit: usize,
        sink: &mut dyn DiffSink,
    ) -> Result<WindowRange, ViewError> {
        self.engine.move_window(window, anchor, limit, sink)
    }

    /// See [`Engine::resolve_window_anchor`].
    pub fn resolve_window_anchor(
        &mut self,
        window: WindowId,
        anchor: WindowAnchor<'_>,
        limit: usize,
    ) -> Result<WindowRange, ViewError> {
        self.engine.resolve_window_anchor(window, anchor, limit)
    }

    pub fn set_window_range(
        &mut self,
        window: WindowId,
        offset: usize,
        limit: usize,
        sink: &mut dyn DiffSink,
    ) -> Result<(), ViewError> {
        self.engine.set_window_range(window, offset, limit, sink)
    }

    pub fn set_window_view(
        &mut self,
        window: WindowId,
        def: &ViewDef,
        sink: &mut dyn DiffSink,
    ) -> Result<(), ViewError> {
        self.engine.set_window_view(window, def, sink)
    }

    pub fn close_window(&mut self, window: WindowId) -> Result<(), ViewError> {
        self.engine.close_window(window)
    }

    pub fn window_items(&mut self, window: WindowId) -> Result<Vec<OwnedItem>, ViewError> {
        self.engine.window_items(window)
    }

    /// Delivers a `Reset` with the window's contents (see [`Engine::emit_window_reset`]).
    pub fn emit_window_reset(&mut self, window: WindowId, sink: &mut dyn DiffSink) -> Result<(), ViewError> {
        self.engine.emit_window_reset(window, sink)
    }

    /// Items in the whole view behind a window.
    pub fn view_len(&self, window: WindowId) -> Result<usize, ViewError> {
        self.engine.view_len(window)
    }

    /// Builds a window's whole view index now instead of on its first update.
    pub fn prepare_window(&mut self, window: WindowId) -> Result<(), ViewError> {
        self.engine.prepare_window(window)
    }
}

/// A progress callback for [`Database::open`] that logs (or prints to stderr) one line per
/// step of a load that has run longer than half a second.
pub fn print_load_progress(progress: &LoadProgress) {
    if progress.elapsed < Duration::from_millis(500) {
        return;
    }
    let percent = if progress.n_items_total == 0 {
        100.0
    } else {
        100.0 * progress.n_items_loaded as f64 / progress.n_items_total as f64
    };
    let line = format!(
        "ordo-store: loaded {} of {} items ({percent:.0} %) in {:.2} s",
        progress.n_items_loaded,
        progress.n_items_total,
        progress.elapsed.as_secs_f64()
    );
    // Into the log where one is set up (`ordo serve`); on stderr for tools without one.
    if tracing::dispatcher::has_been_set() {
        tracing::info!(loaded = progress.n_items_loaded, total = progress.n_items_total, "{line}");
    } else {
        eprintln!("{line}");
    }
}

/// What [`Database::write_group`] reuses from one group to the next.
#[derive(Default)]
struct GroupScratch {
    /// Positions in the group of the writes that passed validation.
    accepted: Vec<usize>,
    /// Items the accepted writes may add, by `CollectionId::index()`; all zero
    /// between groups.
    pending_items: Vec<usize>,
    /// Writes whose batch was swapped for its resolved copy: position in the
    /// group, and the caller's batch, given back once the group is written.
    resolved_writes: Vec<(usize, Batch)>,
    /// Batches to resolve into, reused.
    spare_batches: Vec<Batch>,
    /// A run's seqs, write by write (`write_run`).
    run_seqs: Vec<u64>,
}
