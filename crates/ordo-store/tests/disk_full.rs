//! A full disk must not need a restart: on a small tmpfs (mounted here when the
//! test runs as root; skipped with a message otherwise), writes fill the disk
//! and are refused with `DiskFull`; once space is freed, writes go on with the
//! same database, and after a reopen every acknowledged batch is there and
//! nothing else (no leftovers of the failed appends either).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ordo_core::{Batch, CollectionId, FieldType, NullSink, Schema, Value};
use ordo_store::{Database, OpenReport, StoreError, StoreOptions};

#[path = "support/tmpfs.rs"]
mod tmpfs;
use tmpfs::Tmpfs;

fn schema() -> Schema {
    Schema::new().with_field("n", FieldType::U64)
}

/// One batch: a new marker item with a payload of `size` bytes.
fn write(database: &mut Database, rooms: CollectionId, id: &str, size: usize) -> Result<u64, StoreError> {
    let mut batch = Batch::new();
    batch.upsert(id).set("n", Value::U64(size as u64)).payload(&vec![b'x'; size]);
    let (_, result) = database.write(rooms, batch, &mut NullSink);
    result.map(|ack| ack.seq)
}

/// Writes until the disk is full; returns the acknowledged ids, in order.
fn fill(database: &mut Database, rooms: CollectionId, acked: &mut Vec<String>, size: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the disk never filled");
        let id = format!("m{}", acked.len() + 1);
        match write(database, rooms, &id, size) {
            Ok(seq) => {
                assert_eq!(seq, acked.len() as u64 + 1, "consecutive sequence numbers");
                acked.push(id);
            }
            Err(StoreError::DiskFull { .. }) => return,
            Err(other) => panic!("a full disk must answer DiskFull, not: {other}"),
        }
    }
}

fn options(preallocate_log: bool) -> StoreOptions {
    StoreOptions {
        log_segment_bytes: 1 << 20,
        preallocate_log,
        // LMDB stays small, and its checkpoint (which needs room too) comes when the test asks.
        checkpoint_interval: Duration::from_secs(3600),
        initial_map_size: 1 << 20,
        ..StoreOptions::default()
    }
}

/// Fills the disk, checks writes are refused and leave nothing, frees space,
/// checks writes go on, and reopens.
fn fill_free_and_go_on(preallocate_log: bool) {
    let Some(tmpfs) = Tmpfs::mount("8m") else { return };
    let data: PathBuf = tmpfs.path().join("data");
    // Space to give back once the disk is full.
    let ballast = tmpfs.path().join("ballast");
    std::fs::write(&ballast, vec![1u8; 2 << 20]).unwrap();
    let mut acked = Vec::new();
    {
        let (mut database, _) = Database::open(&data, options(preallocate_log), &mut |_| {}).unwrap();
        let rooms = database.create_collection("rooms", schema()).unwrap();
        // Large batches, so a failed append leaves more behind than the small
        // ones after it write over it.
        fill(&mut database, rooms, &mut acked, 48 << 10);
        let n_before = acked.len();
        for attempt in 0..5 {
            match write(&mut database, rooms, &format!("refused{attempt}"), 48 << 10) {
                Err(StoreError::DiskFull { .. }) => {}
                other => panic!("still full: expected DiskFull, got {other:?}"),
            }
        }
        assert!(
            !std::fs::read_dir(&data)
                .unwrap()
                .any(|entry| { entry.unwrap().file_name().to_string_lossy().starts_with("wal-spare") })
                || preallocate_log
        );

        // Room again: the same database goes on, without a reopen.
        std::fs::remove_file(&ballast).unwrap();
        for n in 0..8 {
            let id = format!("m{}", acked.len() + 1);
            let seq = write(&mut database, rooms, &id, 512)
                .unwrap_or_else(|error| panic!("write {n} after space was freed: {error}"));
            assert_eq!(seq, acked.len() as u64 + 1, "the refused batches used no sequence number");
            acked.push(id);
        }
        assert!(acked.len() > n_before);
        // As a crash would leave it: the log alone holds the batches.
        database.close_without_checkpoint();
    }
    let (database, report) = reopen(&data, options(preallocate_log));
    assert_eq!(report.last_seq, acked.len() as u64);
    assert_eq!(report.n_log_bytes_cut_off, 0, "the failed appends' leftovers were cut off before the next append");
    let engine = database.engine();
    let rooms = engine.collection(engine.collection_id("rooms").unwrap()).unwrap();
    assert_eq!(rooms.len(), acked.len(), "exactly the acknowledged batches");
    for id in &acked {
        assert!(rooms.get(id).is_some(), "acknowledged {id} is missing");
    }
    drop(database);
}

/// Opens `data` again right after the test closed it. The other tests of this
/// file spawn `mount` and `umount` meanwhile, and a child holds a copy of every
/// descriptor between its fork and its exec (close-on-exec acts only at the
/// exec), the `LOCK` file's too, whose lock then outlives our close for that
/// instant: CI saw `Locked` here once. A server never reopens its own directory
/// while spawning, so only the test waits.
fn reopen(data: &std::path::Path, options: StoreOptions) -> (Database, OpenReport) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Database::open(data, options.clone(), &mut |_| {}) {
            Err(StoreError::Locked { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            opened => return opened.unwrap(),
        }
    }
}

#[test]
fn a_full_log_recovers_once_space_is_freed_without_preallocation() {
    fill_free_and_go_on(false);
}

#[test]
fn a_full_log_recovers_once_space_is_freed_with_preallocation() {
    fill_free_and_go_on(true);
}

/// The spare segment never takes the last free space: with less room than a
/// spare plus the active segment's reserve, none is written, and appends go on
/// until the disk itself is full.
#[test]
fn the_spare_segment_does_not_fill_the_disk() {
    let Some(tmpfs) = Tmpfs::mount("8m") else { return };
    let data = tmpfs.path().join("data");
    // Leave about 2.5 MiB: less than a 1 MiB spare plus 1 MiB of reserve plus
    // what the log and LMDB already hold.
    std::fs::write(tmpfs.path().join("ballast"), vec![1u8; 5632 << 10]).unwrap();
    let (mut database, _) = Database::open(&data, options(true), &mut |_| {}).unwrap();
    let rooms = database.create_collection("rooms", schema()).unwrap();
    let mut acked = Vec::new();
    for _ in 0..8 {
        let id = format!("m{}", acked.len() + 1);
        write(&mut database, rooms, &id, 16 << 10).unwrap();
        acked.push(id);
        std::thread::sleep(Duration::from_millis(50));
    }
    fill(&mut database, rooms, &mut acked, 16 << 10);
    // The log got (nearly) all the space: at most one spare chunk short of it.
    let log_bytes: u64 = std::fs::read_dir(&data)
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("wal-0"))
        .map(|entry| entry.metadata().unwrap().len())
        .sum();
    assert!(log_bytes >= acked.len() as u64 * (16 << 10), "{log_bytes} bytes of log for {} batches", acked.len());
    assert!(!data.join("wal-spare").exists(), "a spare was written into the last free space");
    assert!(!data.join("wal-spare.tmp").exists(), "a half-written spare was left behind");
}

/// A backup whose destination fills up fails with `DiskFull` and leaves
/// nothing there; the next backup (to a roomier place) works.
#[test]
fn a_backup_to_a_full_disk_fails_cleanly() {
    let Some(tmpfs) = Tmpfs::mount("1m") else { return };
    let data = tempfile::tempdir().unwrap();
    let (mut database, _) = Database::open(data.path(), options(false), &mut |_| {}).unwrap();
    let rooms = database.create_collection("rooms", schema()).unwrap();
    for n in 0..100 {
        write(&mut database, rooms, &format!("m{n}"), 32 << 10).unwrap();
    }
    let to = tmpfs.path().join("backup");
    let error = database.start_backup().and_then(|backup| backup.write_to(&to)).unwrap_err();
    assert!(matches!(error, StoreError::DiskFull { .. }), "{error}");
    assert_eq!(std::fs::read_dir(tmpfs.path()).unwrap().count(), 0, "a failed backup left files behind");
    let elsewhere = tempfile::tempdir().unwrap();
    let report = database.start_backup().unwrap().write_to(&elsewhere.path().join("backup")).unwrap();
    assert_eq!(report.seq, 100);
}
