//! The store at its limits and on bad input: a map that reaches its maximum, a map
//! that grows under writes, a directory locked by another opener, a directory
//! written by a newer format or holding a damaged record, batches and collection
//! names that break a rule, group commit through the `Writer`, and the relaxed
//! durability mode. Every refusal must leave no trace, in memory or on disk.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{mpsc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use common::{assert_engine_matches, fill_batch, random_ops, test_schema, GenOp, Model, Rng};
use heed::types::Bytes;
use ordo_core::{
    limits, Batch, BatchError, CollectingSink, CollectionId, CreateCollectionError, Filter, NullSink, OwnedItem,
    OwnedValue, SortKey, Value, ViewDef,
};
use ordo_store::{Ack, Database, Durability, StoreError, StoreOptions, Writer, FORMAT_VERSION};

/// Spawning a process forks this one, and until the child has exec'd it holds a copy
/// of every open file, LOCK files included (the lock belongs to the open file, not to
/// the descriptor). A test that dropped a `Database` and reopens its directory at that
/// moment would find it locked. Every test holds this for reading while it runs, and
/// spawning holds it for writing.
static SPAWNING: RwLock<()> = RwLock::new(());

fn no_spawning_meanwhile() -> RwLockReadGuard<'static, ()> {
    SPAWNING.read().unwrap_or_else(PoisonError::into_inner)
}

fn spawning() -> RwLockWriteGuard<'static, ()> {
    SPAWNING.write().unwrap_or_else(PoisonError::into_inner)
}

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

fn open(dir: &Path, options: StoreOptions) -> Database {
    match Database::open(dir, options, &mut |_| {}) {
        Ok((database, _)) => database,
        Err(error) => panic!("opening {}: {error}", dir.display()),
    }
}

/// A database in `dir` with a `rooms` collection holding `n_items` new items
/// (see `new_items`), and the model of its contents.
fn rooms_with_items(dir: &Path, n_items: usize) -> (Database, CollectionId, Model) {
    let mut database = open(dir, StoreOptions::default());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    let ops = new_items("!room", 0, n_items, 30);
    write_ops(&mut database, rooms, &ops).unwrap();
    let mut model = Model::default();
    model.apply(&test_schema(), &ops);
    (database, rooms, model)
}

fn small_map(initial_map_size: usize, max_map_size: usize) -> StoreOptions {
    StoreOptions { initial_map_size, max_map_size, ..StoreOptions::default() }
}

fn write_ops(database: &mut Database, collection: CollectionId, ops: &[GenOp]) -> Result<Ack, StoreError> {
    let mut batch = Batch::new();
    fill_batch(&mut batch, ops);
    database.write(collection, batch, &mut NullSink).1
}

/// `n_items` new items `{prefix}{first + i}`, each with a `payload_len`-byte payload
/// and `recency = first + i` (unique, so that a view sorted by it has a known order).
fn new_items(prefix: &str, first: usize, n_items: usize, payload_len: usize) -> Vec<GenOp> {
    (first..first + n_items)
        .map(|k| GenOp::Upsert {
            id: format!("{prefix}{k:06}"),
            fields: vec![
                ("recency", OwnedValue::U64(k as u64)),
                ("name", OwnedValue::Str(format!("item {k}"))),
                ("score", OwnedValue::F64(k as f64 / 4.0)),
            ],
            payload: Some((0..payload_len).map(|index| (index ^ k) as u8).collect()),
        })
        .collect()
}

/// Opens a window over the whole collection, sorted by `recency`, and checks it
/// holds exactly the model's items in that order. Every item must have a recency.
fn assert_window_matches(database: &mut Database, collection_name: &str, model: &Model, context: &str) {
    let collection = database.engine().collection_id(collection_name).expect("collection exists");
    let def = ViewDef::new(Filter::True, vec![SortKey::asc("recency")]);
    let mut sink = CollectingSink::new();
    let window = database.open_window(collection, &def, 0, limits::MAX_WINDOW_LIMIT, &mut sink).unwrap();
    let actual = database.window_items(window).unwrap();
    database.close_window(window).unwrap();
    let recency = test_schema().field_id("recency").unwrap().index();
    let mut expected: Vec<OwnedItem> = model.items.values().cloned().collect();
    expected.sort_by_key(|item| match item.fields[recency] {
        OwnedValue::U64(recency) => recency,
        ref other => panic!("{context}: an item without a recency: {other:?}"),
    });
    assert_eq!(actual.len(), expected.len(), "{context}: window length");
    assert!(actual == expected, "{context}: the window differs from the model");
}

/// Reads `meta/format` with heed directly (no `Database` may be open on `dir`).
fn read_format(dir: &Path) -> Option<Vec<u8>> {
    // SAFETY: no other environment maps this directory in this process, and no other process uses it.
    let env = unsafe { heed::EnvOpenOptions::new().max_dbs(8).open(dir) }.unwrap();
    let txn = env.read_txn().unwrap();
    let meta: heed::Database<Bytes, Bytes> = env.open_database(&txn, Some("meta")).unwrap().expect("meta exists");
    let format = meta.get(&txn, b"format").unwrap().map(<[u8]>::to_vec);
    drop(txn);
    env.prepare_for_closing().wait();
    format
}

/// Puts `key → value` in the named LMDB database of `dir` with heed directly,
/// bypassing every check of the store (no `Database` may be open on `dir`).
fn put_raw(dir: &Path, database_name: &str, key: &[u8], value: &[u8]) {
    // SAFETY: no other environment maps this directory in this process, and no other process uses it.
    let env = unsafe { heed::EnvOpenOptions::new().max_dbs(8).open(dir) }.unwrap();
    let mut txn = env.write_txn().unwrap();
    let database: heed::Database<Bytes, Bytes> =
        env.open_database(&txn, Some(database_name)).unwrap().expect("database exists");
    database.put(&mut txn, key, value).unwrap();
    txn.commit().unwrap();
    env.prepare_for_closing().wait();
}

fn data_file(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("data.mdb")).expect("reading data.mdb")
}

/// A map capped at 2 MiB: writes succeed (growing the map) until one does not fit;
/// that one fails with `MapFull` and leaves no trace, reads go on, and a reopen
/// finds exactly the acknowledged batches.
/// LMDB fills up in a checkpoint, after the batch was acknowledged from the
/// write-ahead log: that batch is kept (in memory and in the log), new batches are
/// refused with `MapFull`, a reopen with the same limit keeps everything and
/// still refuses, and a reopen with a larger limit catches up and writes again.
#[test]
fn map_full_stops_writes_and_keeps_every_acknowledged_batch() {
    let _no_spawning = no_spawning_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let options = small_map(256 * KIB, 2 * MIB);
    let schema = test_schema();
    let mut database = open(dir.path(), options.clone());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    let number = database.collection_number(rooms).unwrap();
    let mut model = Model::default();
    let mut n_acknowledged = 0u64;
    let mut n_items = 0;
    let mut growths_before_full = None;

    for round in 1..=40 {
        let context = format!("round {round}");
        // Growing batches of ~2 KiB payloads; they also update a few items written before.
        let mut ops = new_items("!item", n_items, 40 * round, 2000);
        if n_items > 0 {
            ops.push(GenOp::Upsert {
                id: format!("!item{:06}", n_items - 1),
                fields: vec![("unread", OwnedValue::U64(round as u64))],
                payload: Some(vec![round as u8; 10]),
            });
            ops.push(GenOp::Remove { id: format!("!item{:06}", 0) });
        }
        let ack = write_ops(&mut database, rooms, &ops)
            .unwrap_or_else(|error| panic!("{context}: refused before a checkpoint found the map full: {error}"));
        n_acknowledged += 1;
        n_items += 40 * round;
        assert_eq!(ack.seq, n_acknowledged, "{context}: sequence");
        model.apply(&schema, &ops);
        assert_engine_matches(database.engine(), "rooms", &model, &context);
        match database.checkpoint() {
            Ok(seq) => assert_eq!(seq, n_acknowledged, "{context}: the checkpoint's sequence"),
            Err(error) => {
                let StoreError::MapFull { map_size, max_map_size } = error else {
                    panic!("{context}: expected MapFull, got {error:?}: {error}");
                };
                assert_eq!(max_map_size, 2 * MIB, "{context}: the error reports the configured maximum");
                assert!(map_size <= max_map_size, "{context}: map {map_size} over its maximum");
                let message = error.to_string();
                assert!(message.contains("maximum map size"), "{context}: unclear message: {message}");
                growths_before_full = Some(database.store_stats().n_map_growths);
                break;
            }
        }
    }
    let growths = growths_before_full.expect("a 2 MiB map fills up within 40 growing batches");
    assert!(n_acknowledged >= 2, "only {n_acknowledged} batches fitted: the test does not exercise much");
    assert!(growths > 0, "the map never grew before it was full");
    let stats = database.store_stats();
    assert!(stats.map_size <= 2 * MIB, "{stats:?}");
    assert_eq!(stats.checkpointed_seq, n_acknowledged - 1, "LMDB holds every batch but the last: {stats:?}");

    // New batches are refused, whole, with a message that says what to do.
    let small = new_items("!small", 900_000, 1, 10);
    match write_ops(&mut database, rooms, &small) {
        Err(error @ StoreError::MapFull { .. }) => {
            let message = error.to_string();
            assert!(message.contains("Nothing was written"), "unclear message: {message}");
            assert!(message.contains("raise the maximum map size"), "unclear message: {message}");
        }
        other => panic!("a batch while LMDB is full: expected MapFull, got {:?}", other.map(|ack| ack.seq)),
    }
    assert_engine_matches(database.engine(), "rooms", &model, "after MapFull");
    assert_eq!(database.last_seq(), n_acknowledged, "after MapFull: the sequence moved");
    // Reads go on.
    assert_window_matches(&mut database, "rooms", &model, "after MapFull");

    // Reopened with the same limit: everything acknowledged is back (the last batch
    // from the log), and writes are still refused once a checkpoint has failed.
    drop(database);
    let mut database = open(dir.path(), options.clone());
    assert_engine_matches(database.engine(), "rooms", &model, "after reopen");
    assert_eq!(database.last_seq(), n_acknowledged, "after reopen: sequence");
    assert_window_matches(&mut database, "rooms", &model, "after reopen");
    assert!(matches!(database.checkpoint(), Err(StoreError::MapFull { .. })), "the same limit, the same MapFull");
    assert!(matches!(write_ops(&mut database, rooms, &small), Err(StoreError::MapFull { .. })));

    // Reopened with room: the checkpoint catches up and writes go on.
    drop(database);
    let mut database = open(dir.path(), small_map(256 * KIB, 64 * MIB));
    assert_eq!(database.checkpoint().unwrap(), n_acknowledged, "the checkpoint catches up");
    let ack = write_ops(&mut database, rooms, &small).unwrap();
    assert_eq!(ack.seq, n_acknowledged + 1);
    model.apply(&schema, &small);
    assert_engine_matches(database.engine(), "rooms", &model, "after growing the limit");
    assert_eq!(database.with_store(move |store| store.raw_items(number)).unwrap().len(), model.items.len(), "on disk");
    assert_eq!(database.with_store(move |store| store.item_count(number)).unwrap(), model.items.len() as u64, "count");
}

/// The SAFETY comment of `Store::grow_map` points here: many growths, each between
/// transactions, and every item is still there after a reopen.
#[test]
fn map_grows_under_writes_and_keeps_every_item() {
    let _no_spawning = no_spawning_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    // Small log segments: each batch starts one, so the checkpoint that finds the
    // map full writes itself again from records read back across many segments.
    let options = StoreOptions { log_segment_bytes: 64 * KIB as u64, ..small_map(256 * KIB, 1 << 30) };
    let schema = test_schema();
    let mut database = open(dir.path(), options.clone());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    let mut model = Model::default();
    let n_batches = 10;
    let per_batch = 500;
    for k in 0..n_batches {
        // Payloads of 200..=1000 bytes: 5 000 items need several MiB, far past 256 KiB.
        let ops = new_items("!room", k * per_batch, per_batch, 200 + 80 * k);
        let ack = write_ops(&mut database, rooms, &ops).unwrap();
        assert_eq!(ack.seq, k as u64 + 1);
        model.apply(&schema, &ops);
    }
    assert_eq!(model.items.len(), n_batches * per_batch);
    let stats = database.store_stats();
    assert!(stats.n_map_growths > 0, "the map never grew: {stats:?}");
    assert!(stats.map_size > 256 * KIB, "{stats:?}");
    assert_engine_matches(database.engine(), "rooms", &model, "before reopen");

    drop(database);
    let mut database = open(dir.path(), options);
    assert_engine_matches(database.engine(), "rooms", &model, "after reopen");
    assert_eq!(database.last_seq(), n_batches as u64);
    let number = database.collection_number(rooms).unwrap();
    assert_eq!(database.with_store(move |store| store.item_count(number)).unwrap(), (n_batches * per_batch) as u64);
    assert_window_matches(&mut database, "rooms", &model, "after reopen");
}

#[test]
fn a_locked_directory_is_refused_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(dir.path(), StoreOptions::default());
    match Database::open(dir.path(), StoreOptions::default(), &mut |_| {}) {
        Err(error @ StoreError::Locked { .. }) => {
            let StoreError::Locked { dir: locked } = &error else { unreachable!() };
            assert_eq!(locked, dir.path());
            let message = error.to_string();
            assert!(message.contains("in use"), "unclear message: {message}");
        }
        Err(error) => panic!("expected Locked, got {error:?}"),
        Ok(_) => panic!("a second Database opened a directory that is in use"),
    }
    drop(first);
    let database = open(dir.path(), StoreOptions::default());
    drop(database);

    // Another process holding the LOCK file (flock(1) takes the same kind of lock).
    let flock_works = {
        let _spawning = spawning();
        Command::new("flock")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    if !flock_works {
        eprintln!("the `flock` binary is missing: skipping the other-process part");
        return;
    }
    // It holds the lock until its stdin closes.
    let spawning = spawning();
    let mut holder = Command::new("flock")
        .arg("-x")
        .arg(dir.path().join("LOCK"))
        .args(["sh", "-c", "echo locked; read line"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning flock");
    // `spawn` returns once the child has exec'd: it no longer holds other tests' files.
    drop(spawning);
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "locked", "flock did not take the lock");
    let result = Database::open(dir.path(), StoreOptions::default(), &mut |_| {});
    drop(holder.stdin.take());
    holder.wait().unwrap();
    match result {
        Err(StoreError::Locked { .. }) => {}
        Err(error) => panic!("locked by another process: expected Locked, got {error:?}"),
        Ok(_) => panic!("a Database opened a directory another process holds"),
    }
    open(dir.path(), StoreOptions::default());
}

#[test]
fn a_newer_format_is_refused_and_the_directory_left_untouched() {
    let _no_spawning = no_spawning_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let (database, _, model) = rooms_with_items(dir.path(), 20);
    drop(database);
    assert_eq!(read_format(dir.path()), Some(FORMAT_VERSION.to_le_bytes().to_vec()));

    put_raw(dir.path(), "meta", b"format", &99u32.to_le_bytes());
    let before = data_file(dir.path());
    match Database::open(dir.path(), StoreOptions::default(), &mut |_| {}) {
        Err(error @ StoreError::NewerFormat { found: 99, .. }) => {
            let StoreError::NewerFormat { supported, .. } = error else { unreachable!() };
            assert_eq!(supported, FORMAT_VERSION);
            let message = error.to_string();
            assert!(message.contains("newer") && message.contains("not modified"), "unclear message: {message}");
        }
        Err(error) => panic!("expected NewerFormat {{ found: 99 }}, got {error:?}"),
        Ok(_) => panic!("a directory of format 99 was opened"),
    }
    assert!(data_file(dir.path()) == before, "the refused open modified data.mdb");
    assert_eq!(read_format(dir.path()), Some(99u32.to_le_bytes().to_vec()));

    // Nothing else was touched: with the format put back, everything is there.
    put_raw(dir.path(), "meta", b"format", &FORMAT_VERSION.to_le_bytes());
    let database = open(dir.path(), StoreOptions::default());
    assert_engine_matches(database.engine(), "rooms", &model, "after restoring the format");
    assert_eq!(database.last_seq(), 1);
}

#[test]
fn a_corrupt_item_record_is_refused_at_open_with_a_clear_error() {
    let _no_spawning = no_spawning_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let (database, rooms, _) = rooms_with_items(dir.path(), 5);
    let number = database.collection_number(rooms).unwrap();
    assert_eq!(number, 0);
    drop(database);

    let mut key = number.to_be_bytes().to_vec();
    key.extend_from_slice(b"!room000002");
    put_raw(dir.path(), "items", &key, &[1, 2, 3]);
    match Database::open(dir.path(), StoreOptions::default(), &mut |_| {}) {
        Err(error @ StoreError::Corrupt { .. }) => {
            let message = error.to_string();
            assert!(message.contains("damaged") && message.contains("expected"), "unclear message: {message}");
            assert!(message.contains(&dir.path().display().to_string()), "the message names no directory: {message}");
        }
        Err(error) => panic!("expected Corrupt, got {error:?}"),
        Ok(_) => panic!("a directory with a garbage record was opened"),
    }
}

/// Builds a batch of a few valid upserts followed by one bad op (added by `bad`).
fn valid_then(bad: impl FnOnce(&mut Batch)) -> Batch {
    let mut batch = Batch::new();
    fill_batch(&mut batch, &new_items("!fresh", 0, 3, 10));
    // Also an update of an existing item and a remove, which must not land either.
    batch.upsert("!room000001").set("unread", Value::U64(77)).payload(b"changed");
    batch.remove("!room000002");
    bad(&mut batch);
    batch
}

#[test]
fn refused_batches_and_collection_names_leave_no_trace_on_disk() {
    let _no_spawning = no_spawning_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let schema = test_schema();
    let (mut database, rooms, mut model) = rooms_with_items(dir.path(), 10);
    let number = database.collection_number(rooms).unwrap();
    let snapshot = database.with_store(move |store| store.raw_items(number)).unwrap();
    assert_eq!(snapshot.len(), 10);

    // A collection id that only exists in another database.
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = open(other_dir.path(), StoreOptions::default());
    for name in ["a", "b", "c"] {
        other.create_collection(name, test_schema()).unwrap();
    }
    let foreign = other.engine().collection_id("c").unwrap();
    drop(other);

    let long_id = "i".repeat(limits::MAX_ID_BYTES + 1);
    let huge_payload = vec![7u8; limits::MAX_PAYLOAD_BYTES + 1];
    type Check = fn(&BatchError) -> bool;
    let cases: Vec<(&str, CollectionId, Batch, Check)> = vec![
        (
            "unknown field",
            rooms,
            valid_then(|batch| {
                batch.upsert("!x").set("no_such_field", Value::U64(1));
            }),
            |error| matches!(error, BatchError::UnknownField { op_index: 5, field } if field == "no_such_field"),
        ),
        (
            "string into u64",
            rooms,
            valid_then(|batch| {
                batch.upsert("!x").set("recency", Value::Str("soon"));
            }),
            |error| matches!(error, BatchError::WrongType { op_index: 5, field, .. } if field == "recency"),
        ),
        (
            "NaN",
            rooms,
            valid_then(|batch| {
                batch.upsert("!x").set("score", Value::F64(f64::NAN));
            }),
            |error| matches!(error, BatchError::NotANumber { op_index: 5, field } if field == "score"),
        ),
        (
            "empty id",
            rooms,
            valid_then(|batch| {
                batch.upsert("").set("recency", Value::U64(1));
            }),
            |error| matches!(error, BatchError::IdEmpty { op_index: 5 }),
        ),
        (
            "256-byte id",
            rooms,
            valid_then(|batch| {
                batch.upsert(&long_id).set("recency", Value::U64(1));
            }),
            |error| matches!(error, BatchError::IdTooLong { op_index: 5, id_bytes: 256 }),
        ),
        (
            "payload over the limit",
            rooms,
            valid_then(|batch| {
                batch.upsert("!x").payload(&huge_payload);
            }),
            |error| {
                matches!(error, BatchError::PayloadTooLarge { op_index: 5, payload_bytes }
                    if *payload_bytes == limits::MAX_PAYLOAD_BYTES + 1)
            },
        ),
        ("unknown collection", foreign, valid_then(|_| {}), |error| matches!(error, BatchError::UnknownCollection)),
    ];
    for (what, collection, batch, check) in cases {
        let (_, result) = database.write(collection, batch, &mut NullSink);
        match result {
            Err(StoreError::Batch(error)) => assert!(check(&error), "{what}: refused for the wrong reason: {error:?}"),
            Err(error) => panic!("{what}: expected StoreError::Batch, got {error:?}"),
            Ok(ack) => panic!("{what}: accepted as seq {}", ack.seq),
        }
        assert_eq!(database.last_seq(), 1, "{what}: the sequence moved");
        assert_engine_matches(database.engine(), "rooms", &model, what);
        assert!(
            database.with_store(move |store| store.raw_items(number)).unwrap() == snapshot,
            "{what}: the items on disk changed"
        );
    }
    // Right at the limits, the same ops are accepted.
    let max_id = "i".repeat(limits::MAX_ID_BYTES);
    let max_payload = vec![9u8; limits::MAX_PAYLOAD_BYTES];
    let edge = vec![GenOp::Upsert {
        id: max_id.clone(),
        fields: vec![("recency", OwnedValue::U64(100))],
        payload: Some(max_payload),
    }];
    assert_eq!(write_ops(&mut database, rooms, &edge).unwrap().seq, 2);
    model.apply(&schema, &edge);
    let snapshot = database.with_store(move |store| store.raw_items(number)).unwrap();
    assert_eq!(snapshot.len(), 11);

    // Collection names.
    let name_128 = "n".repeat(limits::MAX_COLLECTION_NAME_BYTES);
    let name_129 = "n".repeat(limits::MAX_COLLECTION_NAME_BYTES + 1);
    let name_cases = [
        ("", CreateCollectionError::NameInvalid { name_bytes: 0 }),
        (name_129.as_str(), CreateCollectionError::NameInvalid { name_bytes: 129 }),
        ("rooms", CreateCollectionError::NameTaken { name: "rooms".to_owned() }),
    ];
    for (name, expected) in &name_cases {
        match database.create_collection(name, test_schema()) {
            Err(StoreError::CreateCollection(error)) => assert_eq!(&error, expected, "name of {} bytes", name.len()),
            Err(error) => panic!("name of {} bytes: expected CreateCollection, got {error:?}", name.len()),
            Ok(_) => panic!("a collection named {name:?} was created"),
        }
    }
    assert_eq!(database.engine().stats().n_collections, 1);
    // Reopened before any other collection is created: one would overwrite a stray record.
    drop(database);
    let mut database = open(dir.path(), StoreOptions::default());
    assert_eq!(database.engine().stats().n_collections, 1, "after reopen: a refused collection reached the disk");
    assert_eq!(database.last_seq(), 2, "after reopen: sequence");
    assert_engine_matches(database.engine(), "rooms", &model, "after reopen");
    assert!(
        database.with_store(move |store| store.raw_items(number)).unwrap() == snapshot,
        "after reopen: the items on disk changed"
    );

    let wide = database.create_collection(&name_128, test_schema()).unwrap();
    assert_eq!(database.collection_number(wide), Some(1));
    drop(database);
    let database = open(dir.path(), StoreOptions::default());
    assert_eq!(database.last_seq(), 2, "after reopen: sequence");
    assert_engine_matches(database.engine(), "rooms", &model, "after reopen");
    assert!(
        database.with_store(move |store| store.raw_items(number)).unwrap() == snapshot,
        "after reopen: the items on disk changed"
    );
    assert_eq!(database.with_store(move |store| store.item_count(number)).unwrap(), 11);
    assert_eq!(database.engine().stats().n_collections, 2, "after reopen: collections");
    assert!(database.engine().collection_id("").is_none());
    assert!(database.engine().collection_id(&name_129).is_none());
    let wide = database.engine().collection_id(&name_128).expect("the 128-byte name survives a reopen");
    assert_eq!(database.engine().collection(wide).unwrap().len(), 0);
    assert_eq!(database.with_store(move |store| store.raw_items(1)).unwrap().len(), 0);
}

#[test]
fn writer_group_commits_queued_batches_and_acknowledges_each() {
    let _no_spawning = no_spawning_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let schema = test_schema();
    let mut database = open(dir.path(), StoreOptions::default());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    let writer = Writer::spawn(database, Box::new(NullSink), 64);

    let mut rng = Rng::new(7);
    let n_good = 500;
    let bad_at = 10;
    let all_ops: Vec<Vec<GenOp>> = (0..n_good).map(|_| random_ops(&mut rng, "!w", 300, 4)).collect();
    let mut ops_iter = all_ops.iter();
    let mut tickets = Vec::new();
    let mut submit_next = |tickets: &mut Vec<_>| {
        if tickets.len() == bad_at {
            // Refused inside the group: its neighbours must commit.
            let mut batch = Batch::new();
            fill_batch(&mut batch, &new_items("!bad", 0, 2, 5));
            batch.upsert("!bad").set("score", common::bad_value());
            tickets.push((true, writer.submit(rooms, batch).unwrap()));
        } else {
            let mut batch = Batch::new();
            fill_batch(&mut batch, ops_iter.next().unwrap());
            tickets.push((false, writer.submit(rooms, batch).unwrap()));
        }
    };

    // Hold the writer thread in a job while the queue fills to capacity: the 64
    // batches queued behind the job are then written as one group, deterministically.
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        // Moved in, so that a panic here drops it and frees the writer rather than hanging.
        let gate_tx = gate_tx;
        let writer = &writer;
        let blocker = scope.spawn(move || {
            writer.run(move |_, _| {
                started_tx.send(()).unwrap();
                let _ = gate_rx.recv();
            })
        });
        started_rx.recv().unwrap();
        while tickets.len() < 64 {
            submit_next(&mut tickets);
        }
        gate_tx.send(()).unwrap();
        blocker.join().unwrap().unwrap();
    });
    while tickets.len() < n_good + 1 {
        submit_next(&mut tickets);
    }

    let mut expected_seq = 0;
    for (index, (is_bad, ticket)) in tickets.into_iter().enumerate() {
        let (_, result) = ticket.wait().unwrap();
        if is_bad {
            match result {
                Err(StoreError::Batch(BatchError::NotANumber { field, .. })) => assert_eq!(field, "score"),
                other => panic!("batch {index}: expected NotANumber, got {:?}", other.map(|ack| ack.seq)),
            }
            continue;
        }
        expected_seq += 1;
        let ack = result.unwrap_or_else(|error| panic!("batch {index}: {error:?}"));
        assert_eq!(ack.seq, expected_seq, "batch {index}: sequence numbers follow submission order");
    }
    assert_eq!(expected_seq, n_good as u64);

    let stats = writer.run(|database, _| database.store_stats()).unwrap();
    assert_eq!(stats.n_batches_committed, n_good as u64, "{stats:?}");
    // The first 64 (63 good) went in one commit; the other 437 took at most one each.
    assert!(stats.n_commits <= (n_good - 62) as u64, "no group commit happened: {stats:?}");

    let mut model = Model::default();
    for ops in &all_ops {
        model.apply(&schema, ops);
    }
    let database = writer.shutdown().unwrap();
    assert_engine_matches(database.engine(), "rooms", &model, "after shutdown");
    assert_eq!(database.last_seq(), n_good as u64);
    drop(database);
    let database = open(dir.path(), StoreOptions::default());
    assert_engine_matches(database.engine(), "rooms", &model, "after reopen");
    assert_eq!(database.last_seq(), n_good as u64);
}

#[test]
fn relaxed_durability_opens_writes_and_reopens() {
    let _no_spawning = no_spawning_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let schema = test_schema();
    let relaxed = StoreOptions { durability: Durability::Relaxed, ..StoreOptions::default() };
    let mut database = open(dir.path(), relaxed.clone());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    let mut rng = Rng::new(3);
    let mut model = Model::default();
    for k in 0..30 {
        let ops = random_ops(&mut rng, "!r", 80, 10);
        assert_eq!(write_ops(&mut database, rooms, &ops).unwrap().seq, k + 1);
        model.apply(&schema, &ops);
    }
    assert_engine_matches(database.engine(), "rooms", &model, "relaxed, before reopen");
    drop(database);

    let mut database = open(dir.path(), relaxed);
    assert_engine_matches(database.engine(), "rooms", &model, "relaxed, after reopen");
    assert_eq!(database.last_seq(), 30);
    let ops = random_ops(&mut rng, "!r", 80, 10);
    assert_eq!(write_ops(&mut database, rooms, &ops).unwrap().seq, 31);
    model.apply(&schema, &ops);
    drop(database);

    // The same directory opens in full durability too.
    let database = open(dir.path(), StoreOptions::default());
    assert_engine_matches(database.engine(), "rooms", &model, "full, after relaxed");
    assert_eq!(database.last_seq(), 31);
}

/// A maximum that is not a multiple of the page size is still a maximum: the map
/// never goes past it, and writes that do not fit fail with `MapFull`, like with
/// any other maximum. Both with an initial size below the maximum (the map grows
/// to it) and above it (the map starts at it).
#[test]
fn map_full_is_reported_when_the_maximum_is_not_page_aligned() {
    let _no_spawning = no_spawning_meanwhile();
    let max_map_size = 1_000_000;
    for initial_map_size in [256 * KIB, 1 << 30] {
        let context = format!("initial map {initial_map_size}, maximum {max_map_size}");
        let dir = tempfile::tempdir().unwrap();
        let mut database = open(dir.path(), small_map(initial_map_size, max_map_size));
        let rooms = database.create_collection("rooms", test_schema()).unwrap();
        let mut n_acknowledged = 0;
        // The log takes each batch; the checkpoint after it finds whether LMDB can.
        let refused = (0..100).find_map(|round| {
            write_ops(&mut database, rooms, &new_items("!item", round * 50, 50, 2000))
                .unwrap_or_else(|error| panic!("{context}: refused before a checkpoint failed: {error}"));
            n_acknowledged += 1;
            database.checkpoint().err()
        });
        match refused {
            Some(StoreError::MapFull { map_size, max_map_size: reported }) => {
                assert!(reported <= max_map_size, "{context}: reported maximum {reported}");
                assert!(map_size <= max_map_size, "{context}: the map is {map_size} bytes");
            }
            Some(error) => panic!("{context}: expected MapFull, got {error:?}: {error}"),
            None => panic!("{context}: 100 batches of 50 × 2 KiB fitted"),
        }
        let stats = database.store_stats();
        assert!(stats.map_size <= max_map_size, "{context}: {stats:?}");
        assert_eq!(database.last_seq(), n_acknowledged);
        // Most of the allowed space was used before the refusal (not stopped at a smaller growth step).
        let number = database.collection_number(rooms).unwrap();
        let n_items = database.with_store(move |store| store.raw_items(number)).unwrap().len();
        assert!(n_items >= 150, "{context}: only {n_items} items of ~2 KiB fitted in ~1 MB");
    }
}

/// Child side of `stale_reader_slots_of_a_killed_process_are_cleared_at_open`:
/// when `ORDO_STALE_READER_DIR` is set, opens that directory's LMDB environment
/// (and, with `ORDO_STALE_READER_MODE=read`, starts a read transaction), says so,
/// and waits to be killed. Otherwise a no-op.
#[test]
fn stale_reader_child() {
    let Ok(dir) = std::env::var("ORDO_STALE_READER_DIR") else { return };
    // SAFETY: the parent does not write to the directory while this child lives.
    let env = unsafe { heed::EnvOpenOptions::new().max_dbs(8).open(&dir) }.unwrap();
    let _txn = (std::env::var("ORDO_STALE_READER_MODE").as_deref() == Ok("read")).then(|| env.read_txn().unwrap());
    println!("ready");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

fn spawn_stale_reader_child(dir: &Path, mode: &str) -> std::process::Child {
    let mut child = {
        let _spawning = spawning();
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "stale_reader_child", "--nocapture", "--test-threads=1"])
            .env("ORDO_STALE_READER_DIR", dir)
            .env("ORDO_STALE_READER_MODE", mode)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.any(|line| line.is_ok_and(|line| line.contains("ready"))), "the {mode} child never got ready");
    child
}

/// A process killed while it held a read transaction leaves its reader slot in
/// LMDB's lock file; left there, it would pin old pages and make the file grow.
/// When no other process has the environment open, LMDB resets the reader table
/// itself; when one does (here a `hold` child, as a backup or `mdb_stat` would),
/// opening the directory clears the dead reader's slot.
#[test]
fn stale_reader_slots_of_a_killed_process_are_cleared_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let _no_spawning = no_spawning_meanwhile();
        let mut database = open(dir.path(), StoreOptions::default());
        database.create_collection("rooms", test_schema()).unwrap();
        assert_eq!(database.store_stats().n_stale_readers_cleared, 0, "a fresh directory has no stale readers");
    }
    let mut holder = spawn_stale_reader_child(dir.path(), "hold");
    let mut reader = spawn_stale_reader_child(dir.path(), "read");
    reader.kill().unwrap();
    reader.wait().unwrap();
    {
        let _no_spawning = no_spawning_meanwhile();
        let database = open(dir.path(), StoreOptions::default());
        assert_eq!(database.store_stats().n_stale_readers_cleared, 1, "the killed reader's slot is cleared");
        drop(database);
        let database = open(dir.path(), StoreOptions::default());
        assert_eq!(database.store_stats().n_stale_readers_cleared, 0, "and stays cleared");
        assert!(database.engine().collection_id("rooms").is_some());
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
}
