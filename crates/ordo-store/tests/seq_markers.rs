//! Seq markers (`Database::advance_seq`): sequence numbers used without any
//! item changed. Cluster mode writes one per stream entry that wrote no batch
//! and one for the seqs a stream message leaves unused,
//! so `last_seq()` is the last entry applied, across a clean close, a crash-like
//! close (LMDB behind the log) and a checkpoint; items keep the versions of the
//! batches that wrote them, and the next write takes the next number.

mod common;

use std::path::Path;
use std::time::Duration;

use common::test_schema;
use ordo_core::{Batch, CollectingSink, Value};
use ordo_store::{Database, StoreOptions};

fn options() -> StoreOptions {
    StoreOptions { checkpoint_interval: Duration::from_secs(3600), ..StoreOptions::default() }
}

fn open(dir: &Path) -> Database {
    Database::open(dir, options(), &mut |_| {}).unwrap_or_else(|error| panic!("open: {error}")).0
}

fn write_unread(database: &mut Database, id: &str, unread: u64) -> u64 {
    let rooms = database.engine().collection_id("rooms").unwrap();
    let mut batch = Batch::new();
    batch.upsert(id).set("unread", Value::U64(unread));
    let (_, result) = database.write(rooms, batch, &mut CollectingSink::default());
    result.unwrap().seq
}

fn version(database: &Database, id: &str) -> u64 {
    let engine = database.engine();
    engine.collection(engine.collection_id("rooms").unwrap()).unwrap().get(id).unwrap().version()
}

/// seq 1 and 3 write, 2, 4 and 5 are markers.
fn write_with_markers(database: &mut Database) {
    database.create_collection("rooms", test_schema()).unwrap();
    assert_eq!(write_unread(database, "a", 1), 1);
    database.advance_seq(2).unwrap();
    assert_eq!(write_unread(database, "b", 2), 3);
    database.advance_seq(4).unwrap();
    database.advance_seq(5).unwrap();
    assert_eq!(database.last_seq(), 5);
}

fn check_reopened(dir: &Path) {
    let mut database = open(dir);
    assert_eq!(database.last_seq(), 5, "the last marker's seq survives");
    assert_eq!((version(&database, "a"), version(&database, "b")), (1, 3));
    assert_eq!(write_unread(&mut database, "c", 3), 6, "the next write takes the next number");
    database.advance_seq(7).unwrap();
    drop(database);
    let database = open(dir);
    assert_eq!(database.last_seq(), 7);
    assert_eq!(version(&database, "c"), 6);
}

#[test]
fn markers_survive_a_crash_like_close_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    write_with_markers(&mut database);
    database.close_without_checkpoint();
    check_reopened(dir.path());
}

#[test]
fn markers_survive_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    write_with_markers(&mut database);
    assert_eq!(database.checkpoint().unwrap(), 5, "LMDB's last_seq counts the markers");
    database.close_without_checkpoint();
    check_reopened(dir.path());
}

#[test]
fn markers_mixed_with_a_checkpoint_and_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    database.create_collection("rooms", test_schema()).unwrap();
    assert_eq!(write_unread(&mut database, "a", 1), 1);
    database.advance_seq(2).unwrap();
    database.checkpoint().unwrap();
    assert_eq!(write_unread(&mut database, "b", 2), 3);
    database.advance_seq(4).unwrap();
    database.advance_seq(5).unwrap();
    database.close_without_checkpoint();
    check_reopened(dir.path());
}

#[test]
#[should_panic(expected = "sequence numbers rise")]
fn a_marker_must_use_a_number_after_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    database.create_collection("rooms", test_schema()).unwrap();
    assert_eq!(write_unread(&mut database, "a", 1), 1);
    database.advance_seq(1).unwrap();
}

/// One marker may use many seqs (cluster mode: the seqs a stream message
/// leaves unused): seq 1 writes, one marker uses 2..=300, seq 301 writes, one
/// marker uses 302..=1000.
fn write_with_wide_markers(database: &mut Database, checkpoint_between: bool) {
    database.create_collection("rooms", test_schema()).unwrap();
    assert_eq!(write_unread(database, "a", 1), 1);
    let bytes_before = database.log_bytes_appended();
    database.advance_seq(300).unwrap();
    let marker_bytes = database.log_bytes_appended() - bytes_before;
    assert!(marker_bytes <= 32, "299 seqs in one record: {marker_bytes} bytes");
    if checkpoint_between {
        assert_eq!(database.checkpoint().unwrap(), 300, "LMDB's last_seq counts every seq of the marker");
    }
    assert_eq!(write_unread(database, "b", 2), 301);
    database.advance_seq(1000).unwrap();
    assert_eq!(database.last_seq(), 1000);
}

fn check_wide_reopened(dir: &Path) {
    let mut database = open(dir);
    assert_eq!(database.last_seq(), 1000);
    assert_eq!((version(&database, "a"), version(&database, "b")), (1, 301));
    assert_eq!(write_unread(&mut database, "c", 3), 1001, "the next write takes the next number");
    assert_eq!(database.checkpoint().unwrap(), 1001);
    drop(database);
    let database = open(dir);
    assert_eq!(database.last_seq(), 1001);
    assert_eq!(version(&database, "c"), 1001);
}

#[test]
fn a_marker_of_many_seqs_survives_a_crash_like_close() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    write_with_wide_markers(&mut database, false);
    database.close_without_checkpoint();
    check_wide_reopened(dir.path());
}

#[test]
fn a_marker_of_many_seqs_survives_a_checkpoint_and_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    write_with_wide_markers(&mut database, true);
    database.close_without_checkpoint();
    check_wide_reopened(dir.path());
}

/// A run whose writes name their seqs (`PendingWrite::at`): the seqs skipped
/// before a write and a refused write's own are markers, in the same append;
/// a reopened database (from the log, then from LMDB) has the same seqs.
#[test]
fn a_run_of_writes_at_their_own_seqs_skips_the_seqs_between() {
    use ordo_store::PendingWrite;
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    assert_eq!(write_unread(&mut database, "a", 1), 1);
    let unread = |id: &str, value: u64| {
        let mut batch = Batch::new();
        batch.upsert(id).set("unread", Value::U64(value));
        batch
    };
    let mut refused = Batch::new();
    refused.upsert("bad").set("unread", Value::Str("not a number"));
    let mut run = vec![
        PendingWrite::at(rooms, unread("b", 2), 255),
        PendingWrite::at(rooms, refused, 300),
        PendingWrite::new(rooms, unread("c", 3)),
        PendingWrite::at(rooms, unread("a", 4), 511),
    ];
    database.write_run(&mut run, &mut CollectingSink::default());
    let seqs: Vec<_> =
        run.iter().map(|write| write.result.as_ref().unwrap().as_ref().ok().map(|ack| ack.seq)).collect();
    assert_eq!(seqs, [Some(255), None, Some(301), Some(511)]);
    assert_eq!(database.last_seq(), 511);
    let versions = |database: &Database| ["a", "b", "c"].map(|id| version(database, id));
    assert_eq!(versions(&database), [511, 255, 301]);
    database.close_without_checkpoint();
    let mut database = open(dir.path());
    assert_eq!(database.last_seq(), 511);
    assert_eq!(versions(&database), [511, 255, 301]);
    assert_eq!(database.checkpoint().unwrap(), 511);
    drop(database);
    let mut database = open(dir.path());
    assert_eq!(versions(&database), [511, 255, 301]);
    assert_eq!(write_unread(&mut database, "d", 5), 512);
}

#[test]
#[should_panic(expected = "a run's seqs rise")]
fn a_run_refuses_a_seq_below_the_last() {
    use ordo_store::PendingWrite;
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    assert_eq!(write_unread(&mut database, "a", 1), 1);
    let mut run = vec![PendingWrite::at(rooms, Batch::new(), 1)];
    database.write_run(&mut run, &mut CollectingSink::default());
}

/// The log bytes counter (the server's `ordo_log_bytes_total`): every append
/// counts what it wrote, a write more than a marker, and nothing else does.
#[test]
fn log_bytes_count_every_append_and_only_appends() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    assert_eq!(database.log_bytes_appended(), 0);
    database.create_collection("rooms", test_schema()).unwrap();
    let after_create = database.log_bytes_appended();
    write_unread(&mut database, "a-room-with-a-long-id", 1);
    let write = database.log_bytes_appended() - after_create;
    assert!(write > "a-room-with-a-long-id".len() as u64, "{write} bytes for a write");
    database.advance_seq(2).unwrap();
    let marker = database.log_bytes_appended() - after_create - write;
    assert!(marker > 0 && marker < write, "a marker: {marker} bytes, a write {write}");
    let before_reads = database.log_bytes_appended();
    let _ = version(&database, "a-room-with-a-long-id");
    assert_eq!(database.log_bytes_appended(), before_reads, "a read appends nothing");
    drop(database);
    assert_eq!(open(dir.path()).log_bytes_appended(), 0, "counted since the database was opened");
}
