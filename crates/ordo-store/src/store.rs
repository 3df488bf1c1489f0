//! The LMDB side: one environment per data directory, four named databases, and
//! batches written by checkpoints, many per write transaction (see
//! `checkpointer.rs`). Readers never see a partial transaction, and after a crash
//! LMDB needs no recovery: the last committed meta page is the checkpoint, and
//! the write-ahead log holds what came after it.

use std::collections::HashMap;
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use heed::types::Bytes;
use heed::{Database, Env, EnvFlags, EnvOpenOptions, MdbError, RwTxn};
use ordo_core::{Batch, CollectionId, Engine, Schema, Value};

use crate::codec::{self, FieldSource, PayloadSource, Span, FORMAT_VERSION};
use crate::error::StoreError;

mod schema_change;

pub(crate) use schema_change::{FieldChange, SchemaChange};

/// How far a commit goes before it is acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// The write-ahead log is synced before a batch is acknowledged. A crash loses
    /// nothing acknowledged.
    #[default]
    Full,
    /// The log is written but not synced, and LMDB's checkpoints skip syncing the
    /// meta page (`MDB_NOMETASYNC`). A crash of the process loses nothing; a crash
    /// of the machine may lose the last batches, never corrupts.
    Relaxed,
}

#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub durability: Durability,
    /// Size of the memory map at start (the file grows only as pages are used).
    pub initial_map_size: usize,
    /// The map doubles when full, up to this size; past it, writes fail with `MapFull`.
    pub max_map_size: usize,
    /// How long a batch may wait in the write-ahead log before LMDB gets it.
    /// Longer: fewer, larger checkpoints that write a page touched by many
    /// batches once; more log to replay at the next open.
    pub checkpoint_interval: Duration,
    /// A checkpoint starts early once this many bytes of log records have been
    /// written since the last one (bounds the log to replay at the next open).
    pub checkpoint_bytes: usize,
    /// A log segment is closed and a new one started past this size; closed
    /// segments are deleted once checkpointed. With preallocation, also the size
    /// of each spare: a busy log holds up to two segments of preallocated space
    /// (default [`DEFAULT_LOG_SEGMENT_BYTES`]).
    pub log_segment_bytes: u64,
    /// The checkpointer thread's nice value (0 leaves it as it is). Checkpoints
    /// are background work: at the writer's priority they take CPU slices from
    /// the threads a write waits on whenever the machine is busy.
    pub checkpoint_nice: i32,
    /// In full durability, start each log segment as a file of zeros written in
    /// the background (see `wal.rs`): syncs then leave the file size alone.
    /// Costs one segment of disk space for the spare.
    pub preallocate_log: bool,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            durability: Durability::Full,
            initial_map_size: 1 << 30,
            max_map_size: 1 << 40,
            checkpoint_interval: Duration::from_secs(60),
            checkpoint_bytes: 256 << 20,
            log_segment_bytes: DEFAULT_LOG_SEGMENT_BYTES,
            checkpoint_nice: 10,
            preallocate_log: true,
        }
    }
}

/// The default log segment size: 16 MiB. Small enough that a new server holds
/// little preallocated space (none until its first write, then one or two
/// segments), large enough that rotations (a directory sync each) stay rare: at
/// the chat load's 4 MB/s of records, one every 4 s.
pub const DEFAULT_LOG_SEGMENT_BYTES: u64 = 16 << 20;

/// Map sizes are kept multiples of this, which is a multiple of every page size in use.
const MAP_SIZE_GRANULE: usize = 64 * 1024;

/// Counts for monitoring and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Log appends (each one sync in full durability) that acknowledged batches;
    /// counted by the database. The store alone counts its LMDB commits here.
    pub n_commits: u64,
    pub n_batches_committed: u64,
    /// LMDB write transactions that brought the store up to date with the log.
    pub n_checkpoints: u64,
    /// Sequence number of the last batch LMDB holds.
    pub checkpointed_seq: u64,
    /// Log segment files on disk.
    pub n_log_segments: usize,
    pub n_map_growths: u64,
    pub map_size: usize,
    /// Reader slots of dead processes cleared when the directory was opened.
    pub n_stale_readers_cleared: usize,
}

/// What a load reports as it goes, every `LOAD_PROGRESS_EVERY` items and at the end.
#[derive(Clone, Copy, Debug)]
pub struct LoadProgress {
    pub n_items_loaded: u64,
    pub n_items_total: u64,
    pub elapsed: Duration,
}

const LOAD_PROGRESS_EVERY: u64 = 1 << 18;
/// Size of the chunks of raw records the load's reader thread hands over.
const LOAD_CHUNK_BYTES: usize = 256 * 1024;
/// Chunks queued between the reader and the engine: enough to smooth out
/// uneven work, few enough to bound the memory (`LOAD_CHUNK_BYTES` each).
const LOAD_CHUNKS_IN_FLIGHT: usize = 8;

/// Buffers reused from one checkpoint to the next.
#[derive(Default)]
pub(crate) struct WriteScratch {
    key: Vec<u8>,
    old_record: Vec<u8>,
    new_record: Vec<u8>,
    spans: Vec<Option<Span>>,
    /// Change of each collection's item count in the open checkpoint. A map: a
    /// checkpoint of the chat load touches a thousand collections.
    count_deltas: HashMap<u32, i64>,
}

pub struct Store {
    dir: PathBuf,
    env: Env,
    /// `format` → u32, `last_seq` → u64.
    meta: Database<Bytes, Bytes>,
    /// collection number (u32 BE) → name and schema.
    collections: Database<Bytes, Bytes>,
    /// collection number (u32 BE) ++ item id → item record.
    items: Database<Bytes, Bytes>,
    /// collection number (u32 BE) → number of items (u64), to presize tables at load.
    item_counts: Database<Bytes, Bytes>,
    options: StoreOptions,
    map_size: usize,
    last_seq: u64,
    stats: StoreStats,
    /// Held for the store's lifetime: an exclusive lock on `dir/LOCK`.
    _lock: File,
}

/// A collection as found on disk.
pub(crate) struct StoredCollection {
    pub(crate) number: u32,
    pub(crate) name: String,
    pub(crate) schema: Schema,
}

fn io_error<'a>(dir: &'a Path, doing: &'static str) -> impl FnOnce(heed::Error) -> StoreError + 'a {
    move |source| classify(dir, doing, source)
}

/// Below this much free space, an `EIO` from LMDB is taken for a full disk (see `classify`).
const NEARLY_FULL_BYTES: u64 = 16 << 20;

fn classify(dir: &Path, doing: &'static str, source: heed::Error) -> StoreError {
    let errno = match &source {
        heed::Error::Io(error) => error.raw_os_error(),
        heed::Error::Mdb(MdbError::Other(code)) => Some(*code),
        _ => None,
    };
    match errno {
        Some(libc::ENOSPC | libc::EDQUOT) => StoreError::DiskFull { dir: dir.to_owned() },
        // LMDB reports a short write as `EIO` (mdb_page_flush: "Use which error
        // code?"), and a full disk makes short writes: seen on a full tmpfs,
        // where a checkpoint failed with EIO. With the disk (nearly) full, a
        // full disk is what it is, and it is retried like one.
        Some(libc::EIO) if crate::wal::free_bytes(dir).is_ok_and(|free| free < NEARLY_FULL_BYTES) => {
            StoreError::DiskFull { dir: dir.to_owned() }
        }
        _ => StoreError::Io { dir: dir.to_owned(), doing, source },
    }
}

fn round_map_size(size: usize) -> usize {
    size.max(MAP_SIZE_GRANULE).div_ceil(MAP_SIZE_GRANULE) * MAP_SIZE_GRANULE
}

impl Store {
    /// Opens (creating if needed) the data directory `dir`. Fails with `Locked` when
    /// another process holds it and with `NewerFormat` when a newer Ordo wrote it.
    pub(crate) fn open(dir: &Path, options: StoreOptions) -> Result<(Store, Vec<StoredCollection>), StoreError> {
        let io = |doing: &'static str| {
            move |error: std::io::Error| StoreError::Io { dir: dir.to_owned(), doing, source: heed::Error::Io(error) }
        };
        std::fs::create_dir_all(dir).map_err(io("creating the data directory"))?;
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))
            .map_err(io("opening the LOCK file"))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(StoreError::Locked { dir: dir.to_owned() }),
            Err(TryLockError::Error(error)) => return Err(io("locking the LOCK file")(error)),
        }

        // heed resizes only to multiples of the page size: keep the maximum a whole number
        // of granules (rounded down, at least one) and the initial size within it.
        let max_map_size = (options.max_map_size / MAP_SIZE_GRANULE).max(1) * MAP_SIZE_GRANULE;
        let options = StoreOptions { max_map_size, ..options };
        let map_size = round_map_size(options.initial_map_size).min(options.max_map_size);
        let mut env_options = EnvOpenOptions::new();
        env_options.map_size(map_size).max_dbs(8);
        if options.durability == Durability::Relaxed {
            // SAFETY: `NO_META_SYNC` only defers syncing the meta page; LMDB documents that
            // a system crash may then undo the last transactions but keeps the database intact.
            unsafe { env_options.flags(EnvFlags::NO_META_SYNC) };
        }
        // SAFETY: the memory map is undefined behaviour if the file is changed behind LMDB's
        // back. Every Ordo process takes the exclusive LOCK above before opening, so no other
        // Ordo writer maps this file; LMDB's own lock file coordinates with its readers.
        let env = unsafe { env_options.open(dir) }.map_err(io_error(dir, "opening the LMDB environment"))?;
        // Reader slots left by processes that died (a crash, a kill) would pin old pages forever.
        let n_stale_readers_cleared = env.clear_stale_readers().map_err(io_error(dir, "clearing stale readers"))?;

        let mut txn = env.write_txn().map_err(io_error(dir, "starting the opening transaction"))?;
        let create = |txn: &mut heed::RwTxn<'_>, name: &'static str| {
            env.create_database::<Bytes, Bytes>(txn, Some(name)).map_err(io_error(dir, "creating a database"))
        };
        let meta = create(&mut txn, "meta")?;
        let collections = create(&mut txn, "collections")?;
        let items = create(&mut txn, "items")?;
        let item_counts = create(&mut txn, "item_counts")?;

        let format = meta.get(&txn, codec::META_FORMAT).map_err(io_error(dir, "reading the format version"))?;
        match format {
            Some(bytes) => {
                let found =
                    codec::decode_u32(bytes, "a 4-byte format version").map_err(|c| StoreError::corrupt(dir, c))?;
                if found > FORMAT_VERSION {
                    return Err(StoreError::NewerFormat { dir: dir.to_owned(), found, supported: FORMAT_VERSION });
                }
                if found < codec::OLDEST_UPGRADABLE_FORMAT {
                    return Err(StoreError::Corrupt {
                        dir: dir.to_owned(),
                        expected: "a format version of at least 1",
                    });
                }
                if found < FORMAT_VERSION {
                    // Format 1 → 2, in this transaction (an interrupted upgrade leaves
                    // format 1 intact). Format 2 reads every format-1 record as it is:
                    // item records of record version 1 (no item version) are read as
                    // version 0 and rewritten as version 2 when their items next
                    // change. What a format-1 build would misread is a version 2 item
                    // record, and a `last_seq` that is a schema change's or a drop's
                    // sequence number, found in no log record. So only the version changes.
                    meta.put(&mut txn, codec::META_FORMAT, &FORMAT_VERSION.to_le_bytes())
                        .map_err(io_error(dir, "upgrading the format version"))?;
                }
            }
            None => {
                let is_empty = collections.is_empty(&txn).map_err(io_error(dir, "reading collections"))?
                    && items.is_empty(&txn).map_err(io_error(dir, "reading items"))?;
                if !is_empty {
                    return Err(StoreError::Corrupt { dir: dir.to_owned(), expected: "a format version in `meta`" });
                }
                meta.put(&mut txn, codec::META_FORMAT, &FORMAT_VERSION.to_le_bytes())
                    .map_err(io_error(dir, "writing the format version"))?;
            }
        }
        let last_seq = match meta.get(&txn, codec::META_LAST_SEQ).map_err(io_error(dir, "reading the sequence"))? {
            Some(bytes) => {
                codec::decode_u64(bytes, "an 8-byte sequence number").map_err(|c| StoreError::corrupt(dir, c))?
            }
            None => 0,
        };
        let mut stored = Vec::new();
        for entry in collections.iter(&txn).map_err(io_error(dir, "reading collections"))? {
            let (key, value) = entry.map_err(io_error(dir, "reading collections"))?;
            let number = codec::decode_collection_key(key).map_err(|c| StoreError::corrupt(dir, c))?;
            let (name, schema) = codec::decode_collection(value).map_err(|c| StoreError::corrupt(dir, c))?;
            stored.push(StoredCollection { number, name, schema });
        }
        txn.commit().map_err(io_error(dir, "committing the opening transaction"))?;

        let map_size = env.info().map_size.max(map_size);
        let store = Store {
            dir: dir.to_owned(),
            env,
            meta,
            collections,
            items,
            item_counts,
            options,
            map_size,
            last_seq,
            stats: StoreStats { map_size, n_stale_readers_cleared, ..StoreStats::default() },
            _lock: lock,
        };
        Ok((store, stored))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The LMDB environment, for a backup's copy (a read transaction of its own).
    pub(crate) fn env(&self) -> &Env {
        &self.env
    }

    /// Sequence number of the last committed batch (0 before the first).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    pub fn stats(&self) -> StoreStats {
        self.stats
    }

    pub(crate) fn create_collection(&mut self, number: u32, name: &str, schema: &Schema) -> Result<(), StoreError> {
        let mut record = Vec::new();
        codec::encode_collection(&mut record, name, schema);
        self.with_map_growth("creating a collection", |store| {
            let mut txn = store.env.write_txn()?;
            store.collections.put(&mut txn, &codec::collection_key(number), &record)?;
            store.item_counts.put(&mut txn, &codec::collection_key(number), &0u64.to_le_bytes())?;
            txn.commit()
        })
    }

    /// Starts a checkpoint: one LMDB write transaction that batches join one at a
    /// time (as they arrive from the log, so its work is spread out instead of
    /// coming in a burst) and that [`OpenCheckpoint::commit`] makes durable at once.
    ///
    /// The transaction borrows a [`CheckpointTarget`] (a handle on this store's
    /// environment), not the store, so the store stays usable between records.
    pub(crate) fn checkpoint_target(&self) -> CheckpointTarget {
        CheckpointTarget { env: self.env.clone(), meta: self.meta, items: self.items, item_counts: self.item_counts }
    }

    /// Records a committed checkpoint of `n_batches` batches.
    pub(crate) fn checkpoint_committed(&mut self, n_batches: u64) {
        self.last_seq += n_batches;
        self.stats.n_commits += 1;
        self.stats.n_batches_committed += n_batches;
    }

    /// What to do about an error of an open checkpoint (which the caller has
    /// dropped, aborting it): `Ok` when the map was full and has grown, so the
    /// checkpoint can be written again; the error otherwise.
    pub(crate) fn recover_from(&mut self, error: heed::Error) -> Result<(), StoreError> {
        match error {
            heed::Error::Mdb(MdbError::MapFull) if self.map_size < self.options.max_map_size => self.grow_map(),
            heed::Error::Mdb(MdbError::MapFull) => {
                Err(StoreError::MapFull { map_size: self.map_size, max_map_size: self.options.max_map_size })
            }
            error => Err(classify(&self.dir, "writing a checkpoint", error)),
        }
    }

    /// Runs a write transaction, growing the map and retrying when it is full.
    fn with_map_growth(
        &mut self,
        doing: &'static str,
        mut write: impl FnMut(&mut Store) -> heed::Result<()>,
    ) -> Result<(), StoreError> {
        loop {
            match write(self) {
                Ok(()) => return Ok(()),
                Err(heed::Error::Mdb(MdbError::MapFull)) if self.map_size < self.options.max_map_size => {
                    self.grow_map()?;
                }
                Err(heed::Error::Mdb(MdbError::MapFull)) => {
                    return Err(StoreError::MapFull {
                        map_size: self.map_size,
                        max_map_size: self.options.max_map_size,
                    })
                }
                Err(error) => return Err(classify(&self.dir, doing, error)),
            }
        }
    }

    fn grow_map(&mut self) -> Result<(), StoreError> {
        let new_size =
            round_map_size(self.map_size.saturating_mul(2)).min(self.options.max_map_size.max(self.map_size));
        // SAFETY: LMDB allows resizing only while this process has no transaction open.
        // Every transaction of a `Store` lives inside one of its `&mut self` methods and
        // ends before it returns (the write closure above has returned, committing or
        // aborting); none is ever handed out. `&mut self` rules out a concurrent one.
        // `map_grows_under_writes_and_keeps_every_item` exercises this path.
        unsafe { self.env.resize(new_size) }.map_err(io_error(&self.dir, "growing the memory map"))?;
        self.map_size = new_size;
        self.stats.map_size = new_size;
        self.stats.n_map_growths += 1;
        Ok(())
    }

    /// Reads every item of the listed collections into the engine through its
    /// bulk path. `engine_ids[i]` is the engine collection of disk collection
    /// number `numbers[i]`.
    ///
    /// Two threads: a reader walks the `items` database in one read transaction
    /// (LMDB cursor steps and first touches of the mapped file, about a sixth of
    /// the load's samples) and hands the raw records over in chunks; this thread
    /// decodes them and fills the engine.
    pub(crate) fn load_into(
        &self,
        engine: &mut Engine,
        numbers: &[u32],
        engine_ids: &[CollectionId],
        progress: &mut dyn FnMut(&LoadProgress),
    ) -> Result<u64, StoreError> {
        let dir = &self.dir;
        let started = Instant::now();
        let mut counts = Vec::with_capacity(numbers.len());
        {
            let txn = self.env.read_txn().map_err(io_error(dir, "starting the load"))?;
            for &number in numbers {
                let key = codec::collection_key(number);
                let count = match self.item_counts.get(&txn, &key).map_err(io_error(dir, "reading item counts"))? {
                    Some(bytes) => {
                        codec::decode_u64(bytes, "an 8-byte item count").map_err(|c| StoreError::corrupt(dir, c))?
                    }
                    None => 0,
                };
                counts.push(count);
            }
        }
        let n_items_total: u64 = counts.iter().sum();
        std::thread::scope(|scope| {
            let (chunks, full_chunks) = mpsc::sync_channel::<Result<Vec<u8>, StoreError>>(LOAD_CHUNKS_IN_FLIGHT);
            let (recycle, empty_chunks) = mpsc::channel::<Vec<u8>>();
            let reader = std::thread::Builder::new()
                .name("ordo-load-reader".to_owned())
                .spawn_scoped(scope, move || self.read_item_chunks(&chunks, &empty_chunks))
                .map_err(|error| StoreError::Io {
                    dir: dir.clone(),
                    doing: "starting the load's reader thread",
                    source: heed::Error::Io(error),
                })?;
            let result =
                fill_engine(engine, numbers, engine_ids, &counts, &full_chunks, &recycle, dir, &mut |n_items_loaded| {
                    progress(&LoadProgress { n_items_loaded, n_items_total, elapsed: started.elapsed() })
                });
            // On an error here, dropping the receiver stops the reader at its next send.
            drop(full_chunks);
            let n_items_read = reader.join().expect("the load's reader thread panicked");
            let n_items_loaded = result?;
            if n_items_read != n_items_loaded {
                return Err(StoreError::Corrupt { dir: dir.clone(), expected: "items of known collections only" });
            }
            progress(&LoadProgress { n_items_loaded, n_items_total: n_items_loaded, elapsed: started.elapsed() });
            Ok(n_items_loaded)
        })
    }

    /// The reader side of [`Store::load_into`]: every `items` record, in key order,
    /// copied into chunks of `LOAD_CHUNK_BYTES` as `u32 key length, key, u32 record
    /// length, record`. Returns the number of records read; an error goes down the
    /// channel, where the loading thread finds it in place of the next chunk.
    fn read_item_chunks(
        &self,
        chunks: &mpsc::SyncSender<Result<Vec<u8>, StoreError>>,
        empty_chunks: &mpsc::Receiver<Vec<u8>>,
    ) -> u64 {
        let dir = &self.dir;
        let fail = |doing: &'static str, error: heed::Error| {
            let _ = chunks.send(Err(classify(dir, doing, error)));
            0
        };
        let txn = match self.env.read_txn() {
            Ok(txn) => txn,
            Err(error) => return fail("starting the load", error),
        };
        let iter = match self.items.iter(&txn) {
            Ok(iter) => iter,
            Err(error) => return fail("reading items", error),
        };
        let mut chunk = Vec::with_capacity(LOAD_CHUNK_BYTES + 4096);
        let mut n_read = 0u64;
        for entry in iter {
            let (key, record) = match entry {
                Ok(entry) => entry,
                Err(error) => return fail("reading items", error),
            };
            chunk.extend_from_slice(&(key.len() as u32).to_le_bytes());
            chunk.extend_from_slice(key);
            chunk.extend_from_slice(&(record.len() as u32).to_le_bytes());
            chunk.extend_from_slice(record);
            n_read += 1;
            if chunk.len() >= LOAD_CHUNK_BYTES {
                let mut next = empty_chunks.try_recv().unwrap_or_else(|_| Vec::with_capacity(LOAD_CHUNK_BYTES + 4096));
                next.clear();
                if chunks.send(Ok(std::mem::replace(&mut chunk, next))).is_err() {
                    return n_read;
                }
            }
        }
        if !chunk.is_empty() {
            let _ = chunks.send(Ok(chunk));
        }
        n_read
    }

    /// Every stored item of one collection as `(id, record)`, in id byte order: for
    /// checks that what is on disk matches what is in memory.
    pub fn raw_items(&self, collection_number: u32) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let dir = &self.dir;
        let txn = self.env.read_txn().map_err(io_error(dir, "starting a read"))?;
        let prefix = codec::collection_key(collection_number);
        let mut items = Vec::new();
        for entry in self.items.prefix_iter(&txn, &prefix).map_err(io_error(dir, "reading items"))? {
            let (key, record) = entry.map_err(io_error(dir, "reading items"))?;
            let (_, id) = codec::split_item_key(key).map_err(|c| StoreError::corrupt(dir, c))?;
            items.push((id.to_owned(), record.to_vec()));
        }
        Ok(items)
    }

    /// The stored item count of a collection (kept in `item_counts`).
    pub fn item_count(&self, collection_number: u32) -> Result<u64, StoreError> {
        let dir = &self.dir;
        let txn = self.env.read_txn().map_err(io_error(dir, "starting a read"))?;
        match self
            .item_counts
            .get(&txn, &codec::collection_key(collection_number))
            .map_err(io_error(dir, "reading item counts"))?
        {
            Some(bytes) => codec::decode_u64(bytes, "an 8-byte item count").map_err(|c| StoreError::corrupt(dir, c)),
            None => Ok(0),
        }
    }
}

/// Where checkpoints are written: the environment and databases of a [`Store`].
pub(crate) struct CheckpointTarget {
    env: Env,
    meta: Database<Bytes, Bytes>,
    items: Database<Bytes, Bytes>,
    item_counts: Database<Bytes, Bytes>,
}

impl CheckpointTarget {
    /// Starts a checkpoint whose first batch is `first_seq` (the store's last
    /// sequence number plus one). `scratch` must not serve another open checkpoint.
    pub(crate) fn begin(&self, first_seq: u64, scratch: &mut WriteScratch) -> heed::Result<OpenCheckpoint<'_>> {
        scratch.count_deltas.clear();
        Ok(OpenCheckpoint { txn: self.env.write_txn()?, target: self, first_seq, n_batches: 0 })
    }
}

/// A checkpoint being written (see [`Store::checkpoint_target`]). Dropping it
/// without [`OpenCheckpoint::commit`] aborts it: LMDB keeps its last checkpoint.
pub(crate) struct OpenCheckpoint<'t> {
    txn: RwTxn<'t>,
    target: &'t CheckpointTarget,
    first_seq: u64,
    n_batches: u64,
}

impl OpenCheckpoint<'_> {
    /// Sequence number the next batch must carry.
    pub(crate) fn next_seq(&self) -> u64 {
        self.first_seq + self.n_batches
    }

    /// Adds a seq marker: the next `n_seqs` sequence numbers, with no item changed.
    pub(crate) fn add_marker(&mut self, n_seqs: u64) {
        self.n_batches += n_seqs;
    }

    /// Adds the next batch (already validated and logged) of the collection
    /// numbered `collection_number` on disk.
    pub(crate) fn add(
        &mut self,
        collection_number: u32,
        schema: &Schema,
        batch: &Batch,
        scratch: &mut WriteScratch,
    ) -> heed::Result<()> {
        // The version of every item the batch upserts is its sequence number (see `docs/STORAGE.md`).
        let item_version = self.next_seq();
        let OpenCheckpoint { txn, target: CheckpointTarget { items, .. }, .. } = self;
        let mut delta = 0i64;
        for op in batch.ops() {
            codec::item_key(&mut scratch.key, collection_number, op.id());
            if op.is_remove() {
                if items.delete(txn, &scratch.key)? {
                    delta -= 1;
                }
                continue;
            }
            // Copy the current record out: LMDB's pointer is invalid after the next put.
            let old = items.get(txn, &scratch.key)?;
            scratch.old_record.clear();
            if let Some(old) = old {
                scratch.old_record.extend_from_slice(old);
            } else {
                delta += 1;
            }
            let mut sources = [FieldSource::Null; ordo_core::limits::MAX_FIELDS_PER_SCHEMA];
            let sources = &mut sources[..schema.len()];
            let mut payload = PayloadSource::New(&[]);
            if !scratch.old_record.is_empty() {
                let payload_span = codec::scan_item(&scratch.old_record, schema, &mut scratch.spans)
                    .map_err(|corrupt| heed::Error::Decoding(corrupt.0.into()))?;
                for (source, span) in sources.iter_mut().zip(&scratch.spans) {
                    *source = span.map_or(FieldSource::Null, FieldSource::Old);
                }
                payload = PayloadSource::Old(payload_span);
            }
            for (name, value) in op.fields() {
                let field_id = schema.field_id(name).expect("validated: the field exists");
                let field_type = schema.field(field_id).field_type;
                let value = value.coerce_to(field_type).expect("validated: the value fits the field");
                sources[field_id.index()] = FieldSource::New(value);
            }
            if let Some(new_payload) = op.payload() {
                payload = PayloadSource::New(new_payload);
            }
            codec::encode_item(&mut scratch.new_record, &scratch.old_record, item_version, sources, payload);
            items.put(txn, &scratch.key, &scratch.new_record)?;
        }
        *scratch.count_deltas.entry(collection_number).or_insert(0) += delta;
        self.n_batches += 1;
        Ok(())
    }

    /// Writes the item counts and the sequence number, then commits: either every
    /// batch added is durable in LMDB when this returns `Ok`, or none is. Returns
    /// the number of batches; pass it to [`Store::checkpoint_committed`].
    pub(crate) fn commit(self, scratch: &WriteScratch) -> heed::Result<u64> {
        let OpenCheckpoint { mut txn, target: CheckpointTarget { meta, item_counts, .. }, first_seq, n_batches } = self;
        for (&number, &delta) in &scratch.count_deltas {
            let key = codec::collection_key(number);
            let count = match item_counts.get(&txn, &key)? {
                Some(bytes) => codec::decode_u64(bytes, "an item count").unwrap_or(0),
                None => 0,
            };
            item_counts.put(&mut txn, &key, &(count as i64 + delta).max(0).to_le_bytes())?;
        }
        if n_batches > 0 {
            meta.put(&mut txn, codec::META_LAST_SEQ, &(first_seq + n_batches - 1).to_le_bytes())?;
        }
        txn.commit()?;
        Ok(n_batches)
    }
}

/// The chunks of raw records from the load's reader, entry by entry.
struct ChunkStream<'a> {
    full_chunks: &'a mpsc::Receiver<Result<Vec<u8>, StoreError>>,
    recycle: &'a mpsc::Sender<Vec<u8>>,
    chunk: Vec<u8>,
    offset: usize,
}

impl ChunkStream<'_> {
    /// The collection number of the next entry, fetching the next chunk when needed;
    /// `None` at the end.
    fn peek_number(&mut self, dir: &Path) -> Result<Option<u32>, StoreError> {
        while self.offset == self.chunk.len() {
            match self.full_chunks.recv() {
                Ok(chunk) => {
                    let used = std::mem::replace(&mut self.chunk, chunk?);
                    let _ = self.recycle.send(used);
                    self.offset = 0;
                }
                Err(_) => return Ok(None),
            }
        }
        let entry = codec::split_chunk_entry(&self.chunk[self.offset..]).map_err(|c| StoreError::corrupt(dir, c))?;
        let (number, _) = codec::split_item_key(entry.key).map_err(|c| StoreError::corrupt(dir, c))?;
        Ok(Some(number))
    }

    /// The next entry's key and record (call after `peek_number` returned `Some`).
    fn next_entry(&mut self, dir: &Path) -> Result<(&[u8], &[u8]), StoreError> {
        let rest = &self.chunk[self.offset..];
        let entry = codec::split_chunk_entry(rest).map_err(|c| StoreError::corrupt(dir, c))?;
        self.offset = self.chunk.len() - entry.rest.len();
        Ok((entry.key, entry.record))
    }
}

/// Empties a vector of borrowed values so that it can hold values of another
/// lifetime, keeping its buffer (an in-place `collect` of a vector of the same type).
fn reuse_values<'b>(mut values: Vec<Value<'_>>) -> Vec<Value<'b>> {
    values.clear();
    values.into_iter().map(|_| unreachable!("the vector is empty")).collect()
}

/// The engine side of [`Store::load_into`]: decodes the reader's chunks and bulk
/// loads each collection, whose items arrive contiguously. Returns the number of
/// items loaded.
#[allow(clippy::too_many_arguments)]
fn fill_engine(
    engine: &mut Engine,
    numbers: &[u32],
    engine_ids: &[CollectionId],
    counts: &[u64],
    full_chunks: &mpsc::Receiver<Result<Vec<u8>, StoreError>>,
    recycle: &mpsc::Sender<Vec<u8>>,
    dir: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<u64, StoreError> {
    let corrupt = |corrupt: codec::Corrupt| StoreError::corrupt(dir, corrupt);
    let mut stream = ChunkStream { full_chunks, recycle, chunk: Vec::new(), offset: 0 };
    let mut is_loaded = vec![false; numbers.len()];
    let mut n_items_loaded = 0u64;
    let mut values_buffer: Vec<Value<'static>> = Vec::new();
    while let Some(number) = stream.peek_number(dir)? {
        let index = numbers
            .iter()
            .position(|&known| known == number)
            .ok_or_else(|| StoreError::Corrupt { dir: dir.to_owned(), expected: "items of known collections only" })?;
        if std::mem::replace(&mut is_loaded[index], true) {
            return Err(StoreError::Corrupt {
                dir: dir.to_owned(),
                expected: "each collection's items in one key range",
            });
        }
        let schema = engine.collection(engine_ids[index]).expect("created before loading").schema().clone();
        let mut load = engine.bulk_load(engine_ids[index], counts[index] as usize).map_err(StoreError::Load)?;
        while stream.peek_number(dir)? == Some(number) {
            let (key, record) = stream.next_entry(dir)?;
            let (_, id) = codec::split_item_key(key).map_err(corrupt)?;
            let mut values = reuse_values(std::mem::take(&mut values_buffer));
            let (item_version, payload) = codec::decode_item(record, &schema, &mut values).map_err(corrupt)?;
            load.push_with_version(id, item_version, &values, payload).map_err(StoreError::Load)?;
            values_buffer = reuse_values(values);
            n_items_loaded += 1;
            if n_items_loaded.is_multiple_of(LOAD_PROGRESS_EVERY) {
                progress(n_items_loaded);
            }
        }
        load.finish().map_err(StoreError::Load)?;
    }
    Ok(n_items_loaded)
}
