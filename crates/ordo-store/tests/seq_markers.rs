//! Seq markers (`Database::advance_seq`): a sequence number used without any
//! item changed. Cluster mode writes one per stream entry that wrote no batch,
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
#[should_panic(expected = "consecutive")]
fn a_marker_must_take_the_next_number() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    database.advance_seq(2).unwrap();
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
