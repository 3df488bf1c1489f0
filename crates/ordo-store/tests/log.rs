//! The write-ahead log and its checkpoints, against a reference model:
//! - random batches over two collections, with checkpoints, clean closes and
//!   crash-like closes (no final checkpoint) at random; after every reopen the
//!   engine equals the model and the sequence number is the number of batches;
//!   checkpointed log segments are deleted;
//! - a record cut short at the end of the log (a crash mid-append) is dropped,
//!   and everything before it kept; damage anywhere else is refused at open.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{assert_engine_matches, fill_batch, random_ops, test_schema, Model, Rng};
use ordo_core::{Batch, CollectingSink, CollectionId};
use ordo_store::{Database, StoreError, StoreOptions};

/// Small segments, so that rotation and deletion happen within a few batches;
/// no checkpoint by timer, so that the test decides when LMDB catches up.
fn options() -> StoreOptions {
    StoreOptions { log_segment_bytes: 4096, checkpoint_interval: Duration::from_secs(3600), ..StoreOptions::default() }
}

fn open(dir: &Path) -> (Database, ordo_store::OpenReport) {
    Database::open(dir, options(), &mut |_| {}).unwrap_or_else(|error| panic!("open: {error}"))
}

fn segment_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("wal-") && name.ends_with(".log"))
        .collect();
    names.sort();
    names
}

fn collections(database: &mut Database) -> [CollectionId; 2] {
    ["rooms", "people"].map(|name| match database.engine().collection_id(name) {
        Some(id) => id,
        None => database.create_collection(name, test_schema()).unwrap(),
    })
}

fn write(database: &mut Database, collection: CollectionId, ops: &[common::GenOp]) -> u64 {
    let mut batch = Batch::new();
    fill_batch(&mut batch, ops);
    let (_, result) = database.write(collection, batch, &mut CollectingSink::new());
    result.unwrap_or_else(|error| panic!("write: {error}")).seq
}

#[test]
fn reopen_after_checkpoints_clean_closes_and_crashes_equals_the_model() {
    let schema = test_schema();
    for seed in 1..=4u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(seed);
        let mut models = [Model::default(), Model::default()];
        let mut n_batches = 0u64;
        let (mut n_replayed, mut n_crashes) = (0u64, 0u64);
        let (mut database, _) = open(dir.path());
        let mut ids = collections(&mut database);
        for step in 0..400 {
            let context = format!("seed {seed}, step {step}");
            match rng.below(100) {
                0..=79 => {
                    let which = rng.below(2);
                    let ops = random_ops(&mut rng, "!r", 40, 12);
                    let seq = write(&mut database, ids[which], &ops);
                    n_batches += 1;
                    assert_eq!(seq, n_batches, "{context}: sequence");
                    models[which].apply(&schema, &ops);
                }
                80..=89 => {
                    assert_eq!(database.checkpoint().unwrap(), n_batches, "{context}: checkpoint");
                    // Every closed segment is in LMDB now: only the current one is left.
                    assert_eq!(segment_files(dir.path()).len(), 1, "{context}: {:?}", segment_files(dir.path()));
                }
                _ => {
                    if rng.chance(50) {
                        database.close_without_checkpoint();
                        n_crashes += 1;
                    } else {
                        drop(database);
                    }
                    let (reopened, report) = open(dir.path());
                    database = reopened;
                    n_replayed += report.n_log_records_replayed;
                    assert_eq!(report.last_seq, n_batches, "{context}: sequence after reopen");
                    assert_eq!(database.last_seq(), n_batches, "{context}: sequence after reopen");
                    ids = collections(&mut database);
                }
            }
            assert_engine_matches(database.engine(), "rooms", &models[0], &context);
            assert_engine_matches(database.engine(), "people", &models[1], &context);
        }
        assert!(n_crashes > 0 && n_replayed > 0, "seed {seed}: no crash-like close replayed the log");
        // LMDB alone, once caught up, holds exactly the model.
        let number = database.collection_number(ids[0]).unwrap();
        assert_eq!(database.checkpoint().unwrap(), n_batches);
        let on_disk = database.with_store(move |store| store.raw_items(number)).unwrap();
        let on_disk_ids: Vec<&str> = on_disk.iter().map(|(id, _)| id.as_str()).collect();
        let model_ids: Vec<&str> = models[0].items.keys().map(String::as_str).collect();
        assert_eq!(on_disk_ids, model_ids, "seed {seed}: LMDB after the last checkpoint");
    }
}

/// Writes `n` batches, closes like a crash (nothing checkpointed), and returns
/// the model after each batch (`models[k]` = after `k` batches).
fn crashed_directory(dir: &Path, n: usize) -> Vec<Model> {
    let schema = test_schema();
    // Segments end where their records end (no spare of zeros): the tests cut and
    // damage them at known places. `preallocated_segments_...` covers the zeros.
    let options = StoreOptions { preallocate_log: false, ..options() };
    let (mut database, _) = Database::open(dir, options, &mut |_| {}).unwrap();
    let [rooms, _] = collections(&mut database);
    database.checkpoint().unwrap();
    let mut rng = Rng::new(99);
    let mut models = vec![Model::default()];
    for _ in 0..n {
        let ops = random_ops(&mut rng, "!r", 30, 8);
        write(&mut database, rooms, &ops);
        let mut model = models.last().unwrap().clone();
        model.apply(&schema, &ops);
        models.push(model);
    }
    database.close_without_checkpoint();
    models
}

fn last_segment(dir: &Path) -> std::path::PathBuf {
    dir.join(segment_files(dir).last().unwrap())
}

#[test]
fn a_record_cut_short_at_the_end_is_dropped_and_the_rest_kept() {
    let n = 5;
    // Segments hold a few records each; cut the last one at many places.
    let probe = tempfile::tempdir().unwrap();
    crashed_directory(probe.path(), n);
    let last_len = std::fs::metadata(last_segment(probe.path())).unwrap().len();
    assert!(last_len > 0, "the last segment is empty");
    for cut in [1, 2, 7, 8, 9, 20, last_len / 2, last_len - 1] {
        let dir = tempfile::tempdir().unwrap();
        let models = crashed_directory(dir.path(), n);
        let path = last_segment(dir.path());
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(last_len - cut).unwrap();
        drop(file);

        let (mut database, report) = open(dir.path());
        let kept = report.last_seq as usize;
        assert!(kept < n, "cut {cut}: a cut-off record was replayed");
        assert!(report.n_log_bytes_cut_off > 0, "cut {cut}: the cut-off bytes are not reported");
        // The schemas' collection creations are not batches: batch k has seq k.
        assert_engine_matches(database.engine(), "rooms", &models[kept], &format!("cut {cut}"));
        // The log goes on from there, and a later reopen sees no damage.
        let [rooms, _] = collections(&mut database);
        let seq = write(&mut database, rooms, &[]);
        assert_eq!(seq, kept as u64 + 1, "cut {cut}: the next sequence");
        database.close_without_checkpoint();
        let (_, report) = open(dir.path());
        assert_eq!(report.last_seq, kept as u64 + 1, "cut {cut}: after a second reopen");
    }
}

#[test]
fn garbage_after_the_last_record_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let models = crashed_directory(dir.path(), 4);
    let path = last_segment(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0xAB; 37]);
    std::fs::write(&path, &bytes).unwrap();
    let (database, report) = open(dir.path());
    assert_eq!(report.last_seq, 4);
    assert_eq!(report.n_log_bytes_cut_off, 37);
    assert_engine_matches(database.engine(), "rooms", &models[4], "garbage tail");
}

#[test]
fn damage_before_the_end_of_the_log_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    crashed_directory(dir.path(), 60);
    let segments = segment_files(dir.path());
    assert!(segments.len() >= 3, "expected several segments: {segments:?}");
    // Flip a byte in the middle of the first segment's records.
    let path = dir.path().join(&segments[0]);
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5A;
    std::fs::write(&path, &bytes).unwrap();
    match Database::open(dir.path(), options(), &mut |_| {}) {
        Err(error @ StoreError::Corrupt { .. }) => {
            let message = error.to_string();
            assert!(message.contains("damaged"), "unclear message: {message}");
            assert!(message.contains("write-ahead log"), "unclear message: {message}");
        }
        Err(error) => panic!("expected Corrupt, got {error:?}"),
        Ok(_) => panic!("a damaged log segment was accepted"),
    }
    // A missing segment is a gap: refused too.
    let dir = tempfile::tempdir().unwrap();
    crashed_directory(dir.path(), 60);
    std::fs::remove_file(dir.path().join(&segment_files(dir.path())[1])).unwrap();
    assert!(matches!(Database::open(dir.path(), options(), &mut |_| {}), Err(StoreError::Corrupt { .. })));
}

/// Waits for the background thread to publish the spare segment.
fn wait_for_spare(dir: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !dir.join("wal-spare").exists() {
        assert!(std::time::Instant::now() < deadline, "no spare segment after 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn preallocated_segments_are_used_and_their_zeros_are_not_damage() {
    let schema = test_schema();
    let dir = tempfile::tempdir().unwrap();
    let (mut database, _) = open(dir.path());
    let [rooms, _] = collections(&mut database);
    database.checkpoint().unwrap();
    let mut rng = Rng::new(5);
    let mut models = vec![Model::default()];
    let mut n_preallocated = 0;
    for round in 0..6 {
        // The spare is written lazily: once a segment that is not a spare has
        // a record, or a spare is half full. Each round writes until it is
        // ready (well before the segment fills), then fills the current segment
        // past its size, so the next write starts a new one: from the spare.
        let mut n_written = 0;
        while !dir.path().join("wal-spare").exists() {
            let ops = random_ops(&mut rng, "!r", 30, 8);
            write(&mut database, rooms, &ops);
            let mut model = models.last().unwrap().clone();
            model.apply(&schema, &ops);
            models.push(model);
            n_written += 1;
            let deadline = std::time::Instant::now() + Duration::from_millis(200);
            while !dir.path().join("wal-spare").exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        assert!(n_written > 0 || round > 0, "no spare before the first write");
        wait_for_spare(dir.path());
        let before = segment_files(dir.path());
        while segment_files(dir.path()) == before {
            let ops = random_ops(&mut rng, "!r", 30, 8);
            write(&mut database, rooms, &ops);
            let mut model = models.last().unwrap().clone();
            model.apply(&schema, &ops);
            models.push(model);
        }
        let newest = last_segment(dir.path());
        let bytes = std::fs::read(&newest).unwrap();
        assert_eq!(bytes.len() as u64, options().log_segment_bytes, "the new segment is the spare");
        assert_eq!(bytes.last(), Some(&0), "records first, zeros after");
        n_preallocated += 1;
    }
    assert_eq!(n_preallocated, 6);
    let n = models.len() - 1;
    database.close_without_checkpoint();

    // Zeros after the last record are not a cut-off write; every record is replayed.
    let (database, report) = open(dir.path());
    assert_eq!(report.last_seq, n as u64);
    assert_eq!(report.n_log_bytes_cut_off, 0);
    assert_engine_matches(database.engine(), "rooms", &models[n], "preallocated segments");
    drop(database);

    // Garbage inside the zeros of the last segment is a write cut short: dropped,
    // and only its own bytes are counted, not the zeros around it.
    let path = dir.path().join(
        segment_files(dir.path())
            .iter()
            .rev()
            .find(|name| {
                let bytes = std::fs::read(dir.path().join(name)).unwrap();
                // Preallocated: full length. A segment the log wrote itself (no spare was
                // ready, on a busy machine) can also end in a zero byte, an integer 0.
                bytes.len() as u64 == options().log_segment_bytes
                    && bytes.iter().any(|&byte| byte != 0)
                    && bytes.last() == Some(&0)
            })
            .expect("a preallocated segment with records"),
    );
    let mut bytes = std::fs::read(&path).unwrap();
    let records_end = bytes.iter().rposition(|&byte| byte != 0).unwrap() + 1;
    // 100 bytes into the zeros, or as far as the segment allows when its records
    // nearly fill it (random op sizes decide; this once ran off the end).
    let garbage_at = (records_end + 100).min(bytes.len() - 3);
    assert!(garbage_at >= records_end, "the segment has room for the garbage after its records");
    bytes[garbage_at..garbage_at + 3].copy_from_slice(&[7, 7, 7]);
    let garbage_end = garbage_at + 3 - records_end;
    std::fs::write(&path, &bytes).unwrap();
    // Make it the last segment: remove those after it (they hold no records, or
    // the reopen's new, empty segment).
    for name in segment_files(dir.path()) {
        if dir.path().join(&name) > path {
            let later = std::fs::read(dir.path().join(&name)).unwrap();
            assert!(later.iter().all(|&byte| byte == 0), "{name} holds records");
            std::fs::remove_file(dir.path().join(&name)).unwrap();
        }
    }
    let (database, report) = open(dir.path());
    // The last record may end in zero bytes (up to 8: an integer 0), so its true
    // end is a little after `records_end`.
    let cut = report.n_log_bytes_cut_off;
    assert!(
        (garbage_end.saturating_sub(8) as u64..=garbage_end as u64).contains(&{ cut }),
        "cut off {cut} bytes, not just the garbage (which ends {garbage_end} bytes after the records)"
    );
    assert_eq!(report.last_seq, n as u64);
    assert_engine_matches(database.engine(), "rooms", &models[n], "garbage in the zeros");
    drop(database);

    // The same garbage in a segment that is not the last one is damage.
    let (mut database, _) = open(dir.path());
    let [rooms, _] = collections(&mut database);
    while segment_files(dir.path()).len() < 2 {
        let ops = random_ops(&mut rng, "!r", 30, 8);
        write(&mut database, rooms, &ops);
    }
    database.close_without_checkpoint();
    // The first segment with records that is not the last (a segment may also
    // be a spare that never got a record, all zeros: there is no damage to make there).
    let names = segment_files(dir.path());
    let first = names[..names.len() - 1]
        .iter()
        .map(|name| dir.path().join(name))
        .find(|path| std::fs::read(path).unwrap().iter().any(|&byte| byte != 0))
        .expect("a segment with records before the last");
    let mut bytes = std::fs::read(&first).unwrap();
    // The last record may end in up to 8 zero bytes: garbage goes past those,
    // into the preallocated zeros when there are enough, else after the end.
    let records_end = bytes.iter().rposition(|&byte| byte != 0).unwrap() + 1;
    if bytes.len() >= records_end + 16 {
        bytes[records_end + 12] = 9;
    } else {
        bytes.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0]);
    }
    std::fs::write(&first, &bytes).unwrap();
    assert!(matches!(Database::open(dir.path(), options(), &mut |_| {}), Err(StoreError::Corrupt { .. })));
}

/// The nice value in `/proc/self/task/{tid}/stat` of each thread with this name.
fn nice_of_threads_named(name: &str) -> Vec<i64> {
    let mut nices = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let path = task.unwrap().path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else { continue };
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).unwrap();
        // Fields after the `(comm)`: state is field 3, nice is field 19.
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        nices.push(after_comm.split(' ').nth(16).unwrap().parse().unwrap());
    }
    nices
}

#[test]
fn checkpointer_runs_at_its_nice_value_and_leaves_other_threads_alone() {
    let own_nice = || {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // Fields after the `(comm)`: state is field 3, nice is field 19.
        stat[stat.rfind(')').unwrap() + 2..].split(' ').nth(16).unwrap().parse::<i64>().unwrap()
    };
    let before = own_nice();
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions { checkpoint_nice: 7, ..options() };
    let (database, _) = Database::open(dir.path(), options, &mut |_| {}).unwrap();
    // Other tests of this binary may run checkpointers too, at the default nice
    // value. The new thread takes its name and nice value when it first runs,
    // which may be after `open` returns: wait for it (this raced, and flaked).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !nice_of_threads_named("ordo-checkpoint").contains(&7) {
        assert!(std::time::Instant::now() < deadline, "no checkpointer thread at nice 7");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Only the checkpointer's thread changed: not the thread that opened the database.
    assert_eq!(own_nice(), before);
    assert_ne!(before, 7);
    drop(database);
}

#[test]
fn checkpointed_segments_are_removed_in_the_background_as_writes_go_on() {
    let schema = test_schema();
    let dir = tempfile::tempdir().unwrap();
    // Timed checkpoints every 20 ms; no explicit `checkpoint()`, which removes
    // segments itself: only the writes' background removal can delete them here.
    let options = StoreOptions { checkpoint_interval: Duration::from_millis(20), ..options() };
    let (mut database, _) = Database::open(dir.path(), options.clone(), &mut |_| {}).unwrap();
    let [rooms, _] = collections(&mut database);
    let mut rng = Rng::new(11);
    let mut model = Model::default();
    // Every segment seen, by name (the sequence number of its first record): a
    // count of how often the log rotated that does not depend on how fast the
    // background removal is (a count of segments present at once did, and flaked).
    let mut seen = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut n_writes = 0;
    loop {
        let ops = random_ops(&mut rng, "!r", 30, 8);
        write(&mut database, rooms, &ops);
        model.apply(&schema, &ops);
        n_writes += 1;
        let segments = segment_files(dir.path());
        let n_segments = segments.len();
        seen.extend(segments);
        // Enough writes for many rotations, and the old segments are gone.
        if n_writes >= 200 && n_segments <= 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{n_segments} segments still there after {n_writes} writes");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(seen.len() >= 10, "the log rotated often ({} segments seen)", seen.len());
    database.close_without_checkpoint();
    let (database, report) = Database::open(dir.path(), options, &mut |_| {}).unwrap();
    assert_eq!(report.last_seq, n_writes);
    assert_engine_matches(database.engine(), "rooms", &model, "after background removals");
}

/// Disk space of the log files in `dir` (segments and spares), in bytes.
fn log_disk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("wal-"))
        .map(|entry| entry.metadata().unwrap().len())
        .sum()
}

#[test]
fn an_idle_database_holds_no_preallocated_log_and_a_used_one_at_most_two_segments() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions { checkpoint_interval: Duration::from_secs(3600), ..StoreOptions::default() };
    assert_eq!(options.log_segment_bytes, ordo_store::DEFAULT_LOG_SEGMENT_BYTES);
    let (mut database, _) = Database::open(dir.path(), options.clone(), &mut |_| {}).unwrap();
    let [rooms, _] = collections(&mut database);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(log_disk_bytes(dir.path()), 0, "an empty database preallocates nothing");
    drop(database);
    let (mut database, _) = Database::open(dir.path(), options.clone(), &mut |_| {}).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(log_disk_bytes(dir.path()), 0, "nor does reopening it");

    // The first write asks for a spare; the log then holds one segment of zeros
    // (and the first, small segment until it is checkpointed), never more than two.
    write(&mut database, rooms, &random_ops(&mut Rng::new(9), "!r", 10, 4));
    wait_for_spare(dir.path());
    let bytes = log_disk_bytes(dir.path());
    assert!(bytes >= options.log_segment_bytes, "{bytes} bytes: no spare");
    assert!(bytes <= 2 * options.log_segment_bytes, "{bytes} bytes of log for one batch");
}

/// Records which batch each window change came from, as `DiffSink::begin_batch` says.
#[derive(Default)]
struct BatchSeqSink {
    current_seq: Option<u64>,
    /// (seq of the batch, window) per `window_done`.
    changes: Vec<(Option<u64>, ordo_core::WindowId)>,
    begun: Vec<u64>,
}

impl ordo_core::DiffSink for BatchSeqSink {
    fn begin_batch(&mut self, seq: u64) {
        self.current_seq = Some(seq);
        self.begun.push(seq);
    }

    fn diff(&mut self, _window: ordo_core::WindowId, _diff: ordo_core::DiffRef<'_>) {}

    fn window_done(&mut self, window: ordo_core::WindowId) {
        self.changes.push((self.current_seq, window));
    }
}

/// A group commit applies its batches one by one; before each, the sink hears
/// the batch's `seq`, so the diffs of every batch are told apart (the server's
/// `write_seq`). Refused batches get no `seq` and no call.
#[test]
fn the_sink_hears_each_batch_seq_before_its_diffs() {
    use ordo_core::{SortKey, ViewDef};
    use ordo_store::PendingWrite;
    let dir = tempfile::tempdir().unwrap();
    let (mut database, _) = open(dir.path());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    let def = ViewDef::new(ordo_core::Filter::True, vec![SortKey::desc("recency")]);
    let window = database.open_window(rooms, &def, 0, 10, &mut CollectingSink::default()).unwrap();
    let batch = recency_batch;
    let refused = refused_batch();
    let mut group = vec![
        PendingWrite::new(rooms, batch("a", 1)),
        PendingWrite::new(rooms, refused),
        PendingWrite::new(rooms, batch("b", 2)),
        PendingWrite::new(rooms, batch("c", 3)),
    ];
    let mut sink = BatchSeqSink::default();
    database.write_group(&mut group, &mut sink);
    let seqs = acked_seqs(&group);
    assert_eq!(seqs, [Some(1), None, Some(2), Some(3)]);
    assert_eq!(sink.begun, [1, 2, 3]);
    assert_eq!(sink.changes, [(Some(1), window), (Some(2), window), (Some(3), window)]);
}

/// `write_run` (cluster mode: one stream entry per write): every write uses its
/// own seq, a refused one a seq marker, so the seqs after it are not shifted;
/// a reopened database has the same `last_seq` and versions.
#[test]
fn a_run_gives_every_write_its_own_seq_and_refused_ones_a_marker() {
    use ordo_store::PendingWrite;
    let dir = tempfile::tempdir().unwrap();
    let (mut database, _) = open(dir.path());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    let batch = recency_batch;
    let refused = refused_batch();
    let mut run = vec![
        PendingWrite::new(rooms, batch("a", 1)),
        PendingWrite::new(rooms, refused),
        PendingWrite::new(rooms, batch("b", 2)),
        PendingWrite::new(rooms, batch("a", 3)),
    ];
    let mut sink = BatchSeqSink::default();
    database.write_run(&mut run, &mut sink);
    let seqs = acked_seqs(&run);
    assert_eq!(seqs, [Some(1), None, Some(3), Some(4)]);
    assert_eq!(sink.begun, [1, 3, 4]);
    assert_eq!(database.last_seq(), 4);
    let versions = |database: &Database| {
        let collection = database.engine().collection(rooms).unwrap();
        (collection.get("a").map(|item| item.version()), collection.get("b").map(|item| item.version()))
    };
    assert_eq!(versions(&database), (Some(4), Some(3)));
    // An empty run writes nothing.
    database.write_run(&mut [], &mut sink);
    assert_eq!(database.last_seq(), 4);
    drop(database);
    let (database, _) = open(dir.path());
    assert_eq!(database.last_seq(), 4);
    assert_eq!(versions(&database), (Some(4), Some(3)));
}

/// A batch that sets one item's `recency`.
fn recency_batch(id: &str, recency: u64) -> Batch {
    let mut batch = Batch::new();
    batch.upsert(id).set("recency", ordo_core::Value::U64(recency));
    batch
}

/// A batch validation refuses (a string in a `u64` field).
fn refused_batch() -> Batch {
    let mut batch = Batch::new();
    batch.upsert("bad").set("recency", ordo_core::Value::Str("not a number"));
    batch
}

/// Each write's acknowledged seq, `None` for a refused one.
fn acked_seqs(writes: &[ordo_store::PendingWrite]) -> Vec<Option<u64>> {
    writes.iter().map(|write| write.result.as_ref().unwrap().as_ref().ok().map(|ack| ack.seq)).collect()
}
