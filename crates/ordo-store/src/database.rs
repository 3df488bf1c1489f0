//! A durable engine: the store and the in-memory engine kept equal. A batch is
//! validated, committed to LMDB, and only then applied to the engine, so windows
//! never show a change that a crash could take back.

use std::path::Path;
use std::time::{Duration, Instant};

use ordo_core::{Batch, BatchSummary, CollectionId, DiffSink, Engine, OwnedItem, Schema, ViewDef, ViewError, WindowId};

use crate::error::StoreError;
use crate::store::{CommitWrite, LoadProgress, Store, StoreOptions, StoreStats};

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
    pub result: Option<Result<Ack, StoreError>>,
}

impl PendingWrite {
    pub fn new(collection: CollectionId, batch: Batch) -> PendingWrite {
        PendingWrite { collection, batch, result: None }
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
    /// Reading every item into the engine.
    pub load_time: Duration,
}

pub struct Database {
    store: Store,
    engine: Engine,
    /// Disk number of each engine collection, by `CollectionId::index()`.
    collection_numbers: Vec<u32>,
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
        let (store, stored) = Store::open(dir, options)?;
        let mut engine = Engine::new();
        let mut collection_numbers = Vec::with_capacity(stored.len());
        let mut engine_ids = Vec::with_capacity(stored.len());
        for collection in stored {
            let collection_id = engine
                .create_collection(&collection.name, collection.schema)
                .map_err(|_| StoreError::Corrupt { dir: dir.to_owned(), expected: "valid, unique collection names" })?;
            collection_numbers.push(collection.number);
            engine_ids.push(collection_id);
        }
        let open_time = started.elapsed();
        let n_items = store.load_into(&mut engine, &collection_numbers, &engine_ids, progress)?;
        let report = OpenReport {
            n_collections: collection_numbers.len(),
            n_items,
            last_seq: store.last_seq(),
            open_time,
            load_time: started.elapsed() - open_time,
        };
        Ok((Database { store, engine, collection_numbers }, report))
    }

    /// The engine, read-only: every change goes through [`Database::write`] so that
    /// memory never runs ahead of the disk.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn store_stats(&self) -> StoreStats {
        self.store.stats()
    }

    pub fn last_seq(&self) -> u64 {
        self.store.last_seq()
    }

    /// The collection's number on disk (see `docs/STORAGE.md`).
    pub fn collection_number(&self, collection_id: CollectionId) -> Option<u32> {
        self.collection_numbers.get(collection_id.index()).copied()
    }

    /// Creates a collection durably.
    pub fn create_collection(&mut self, name: &str, schema: Schema) -> Result<CollectionId, StoreError> {
        // Checked first: a refused collection never reaches the disk.
        self.engine.check_new_collection(name).map_err(StoreError::CreateCollection)?;
        let number = self.collection_numbers.iter().max().map_or(0, |&max| max + 1);
        self.store.create_collection(number, name, &schema)?;
        let collection_id = self.engine.create_collection(name, schema).map_err(StoreError::CreateCollection)?;
        debug_assert_eq!(collection_id.index(), self.collection_numbers.len());
        self.collection_numbers.push(number);
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

    /// Writes a group of batches in one transaction where possible (group commit).
    /// Each gets its own result: a refused batch does not hold back the others, and
    /// when the shared commit fails, each batch is retried alone so that only those
    /// that cannot be written fail.
    pub fn write_group(&mut self, group: &mut [PendingWrite], sink: &mut dyn DiffSink) {
        let mut accepted: Vec<usize> = Vec::with_capacity(group.len());
        // Items that accepted batches may add, per collection: validation must count them.
        let mut pending_items: Vec<(CollectionId, usize)> = Vec::new();
        for (index, write) in group.iter_mut().enumerate() {
            let pending = pending_items.iter().find(|(id, _)| *id == write.collection).map_or(0, |(_, n)| *n);
            match self.engine.validate_batch(write.collection, &write.batch, pending) {
                Ok(()) => {
                    accepted.push(index);
                    let n_new = write.batch.ops().filter(|op| !op.is_remove()).count();
                    match pending_items.iter_mut().find(|(id, _)| *id == write.collection) {
                        Some((_, n)) => *n += n_new,
                        None => pending_items.push((write.collection, n_new)),
                    }
                }
                Err(error) => write.result = Some(Err(StoreError::Batch(error))),
            }
        }
        if accepted.is_empty() {
            return;
        }
        match self.commit(group, &accepted) {
            Ok(first_seq) => self.apply_committed(group, &accepted, first_seq, sink),
            Err(error) if accepted.len() == 1 => group[accepted[0]].result = Some(Err(error)),
            Err(_) => {
                for index in accepted {
                    match self.commit(group, &[index]) {
                        Ok(seq) => self.apply_committed(group, &[index], seq, sink),
                        Err(error) => group[index].result = Some(Err(error)),
                    }
                }
            }
        }
    }

    fn commit(&mut self, group: &[PendingWrite], indices: &[usize]) -> Result<u64, StoreError> {
        let writes: Vec<CommitWrite<'_>> = indices
            .iter()
            .map(|&index| {
                let write = &group[index];
                CommitWrite {
                    collection_number: self.collection_numbers[write.collection.index()],
                    schema: self.engine.collection(write.collection).expect("validated").schema(),
                    batch: &write.batch,
                }
            })
            .collect();
        self.store.commit(&writes)
    }

    fn apply_committed(
        &mut self,
        group: &mut [PendingWrite],
        indices: &[usize],
        first_seq: u64,
        sink: &mut dyn DiffSink,
    ) {
        for (offset, &index) in indices.iter().enumerate() {
            let write = &mut group[index];
            // Validated against the same state before the commit: the engine cannot refuse it now.
            let summary = self
                .engine
                .apply_batch(write.collection, &write.batch, sink)
                .expect("a committed batch was validated against this state");
            write.result = Some(Ok(Ack { seq: first_seq + offset as u64, summary }));
        }
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

/// A progress callback for [`Database::open`] that prints one line to stderr per
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
    eprintln!(
        "ordo-store: loaded {} of {} items ({percent:.0} %) in {:.2} s",
        progress.n_items_loaded,
        progress.n_items_total,
        progress.elapsed.as_secs_f64()
    );
}
