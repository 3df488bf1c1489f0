//! Schema changes and drops through `Database`: durable across clean and
//! crash-like closes, items rewritten under the new schema on disk, dropped
//! collections' items gone from LMDB, names free again, and a format-1
//! directory (made by the code before format 2) upgraded at open.

mod common;

use std::path::Path;

use common::{fill_batch, random_ops, test_schema, GenOp, Model, Rng};
use ordo_core::{Batch, CollectingSink, FieldType, Filter, NullSink, OwnedValue, Schema, SortKey, Value, ViewDef};
use ordo_store::{Database, StoreError, StoreOptions, FORMAT_VERSION};

fn options() -> StoreOptions {
    StoreOptions { preallocate_log: false, log_segment_bytes: 4096, ..StoreOptions::default() }
}

fn open(dir: &Path) -> Database {
    Database::open(dir, options(), &mut |_| {}).expect("open").0
}

fn items(database: &Database, name: &str) -> std::collections::BTreeMap<String, ordo_core::OwnedItem> {
    common::engine_items(database.engine(), name)
}

/// Random batches, field additions and removals, drops and re-creations, closes
/// with and without a checkpoint; after every step the engine equals the model,
/// and after every reopen so do the schema, the items and the sequence number.
#[test]
fn schema_changes_and_drops_survive_reopens_and_match_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    let mut rng = Rng::new(15);
    let mut schema = test_schema();
    let mut model = Model::default();
    let mut collection = database.create_collection("rooms", schema.clone()).unwrap();
    let mut sink = CollectingSink::new();
    let mut n_extra = 0;
    let mut expected_seq = 0;
    for step in 0..300 {
        let context = format!("step {step}");
        match rng.below(20) {
            0..=11 => {
                // Only fields of the current schema (the generator names the base ones).
                let ops: Vec<GenOp> = random_ops(&mut rng, "r", 60, 8)
                    .into_iter()
                    .map(|op| match op {
                        GenOp::Upsert { id, fields, payload } => GenOp::Upsert {
                            id,
                            fields: fields.into_iter().filter(|(name, _)| schema.field_id(name).is_some()).collect(),
                            payload,
                        },
                        remove => remove,
                    })
                    .collect();
                let mut batch = Batch::new();
                fill_batch(&mut batch, &ops);
                database.write(collection, batch, &mut NullSink).1.expect("valid batch");
                model.apply(&schema, &ops);
                expected_seq += 1;
            }
            12..=14 => {
                n_extra += 1;
                let name = format!("extra{n_extra}");
                let default = if rng.chance(50) { OwnedValue::I64(n_extra) } else { OwnedValue::Null };
                let seq = database.add_field(collection, &name, FieldType::I64, &default, &mut sink).unwrap();
                expected_seq += 1;
                assert_eq!(seq, expected_seq, "{context}");
                schema = schema.with_field(&name, FieldType::I64);
                for item in model.items.values_mut() {
                    item.fields.push(default.clone());
                }
            }
            15..=17 => {
                let field = schema.fields()[rng.below(schema.len())].name.clone();
                let (seq, _) = database.remove_field(collection, &field, &mut sink).unwrap();
                expected_seq += 1;
                assert_eq!(seq, expected_seq, "{context}");
                let index = schema.field_id(&field).unwrap().index();
                schema = schema
                    .fields()
                    .iter()
                    .filter(|def| def.name != field)
                    .fold(Schema::new(), |schema, def| schema.with_field(&def.name, def.field_type));
                for item in model.items.values_mut() {
                    item.fields.remove(index);
                }
            }
            18 => {
                let (seq, _) = database.drop_collection(collection).unwrap();
                expected_seq += 1;
                assert_eq!(seq, expected_seq, "{context}");
                let mut batch = Batch::new();
                batch.upsert("x");
                let refused = database.write(collection, batch, &mut NullSink).1;
                assert!(refused.is_err(), "{context}: a write to a dropped collection was accepted");
                schema = test_schema();
                model = Model::default();
                collection = database.create_collection("rooms", schema.clone()).unwrap();
            }
            _ => {
                if rng.chance(50) {
                    database.close_without_checkpoint();
                } else {
                    drop(database);
                }
                database = open(dir.path());
                collection = database.engine().collection_id("rooms").expect("rooms after reopen");
                assert_eq!(database.last_seq(), expected_seq, "{context}: sequence after reopen");
            }
        }
        let engine_schema = database.engine().collection(collection).unwrap().schema();
        assert_eq!(engine_schema, &schema, "{context}: schema");
        assert_eq!(items(&database, "rooms"), model.items, "{context}: items");
    }
    // LMDB alone (after a checkpoint) holds the same items, under the same schema.
    database.checkpoint().unwrap();
    drop(database);
    let database = open(dir.path());
    assert_eq!(items(&database, "rooms"), model.items);
}

#[test]
fn a_drop_deletes_the_items_from_disk_and_frees_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    let other = database.create_collection("other", test_schema()).unwrap();
    let mut batch = Batch::new();
    for k in 0..500 {
        batch.upsert(&format!("r{k:04}")).set("recency", Value::U64(k)).payload(&[7; 200]);
    }
    let (mut batch, result) = database.write(rooms, batch, &mut NullSink);
    result.unwrap();
    batch.clear();
    batch.upsert("o1").set("name", Value::Str("kept"));
    database.write(other, batch, &mut NullSink).1.unwrap();
    let mut sink = CollectingSink::new();
    let def = ViewDef::new(Filter::True, vec![SortKey::desc("recency")]);
    let window = database.open_window(rooms, &def, 0, 10, &mut sink).unwrap();
    let kept = database.open_window(other, &def, 0, 10, &mut sink).unwrap();
    let rooms_number = database.collection_number(rooms).unwrap();

    let (seq, ended) = database.drop_collection(rooms).unwrap();
    assert_eq!((seq, ended), (3, vec![window]));
    assert!(database.collection_number(rooms).is_none());
    assert_eq!(database.window_items(kept).unwrap().len(), 1, "another collection's window is untouched");
    let (raw, count) =
        database.with_store(move |store| (store.raw_items(rooms_number), store.item_count(rooms_number)));
    assert!(raw.unwrap().is_empty(), "the dropped items are still in LMDB");
    assert_eq!(count.unwrap(), 0);
    assert!(matches!(database.drop_collection(rooms), Err(StoreError::SchemaChange(_))));

    // The name is free, the new collection is empty and writable, and it all survives a crash-like close.
    let again = database.create_collection("rooms", Schema::new().with_field("n", FieldType::U64)).unwrap();
    assert_ne!(again, rooms);
    let mut batch = Batch::new();
    batch.upsert("fresh").set("n", Value::U64(1));
    database.write(again, batch, &mut NullSink).1.unwrap();
    database.close_without_checkpoint();
    let database = open(dir.path());
    assert_eq!(items(&database, "rooms").keys().collect::<Vec<_>>(), ["fresh"]);
    assert_eq!(items(&database, "other").len(), 1);
    assert_eq!(database.last_seq(), 4);
}

#[test]
fn refused_schema_changes_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    let mut sink = CollectingSink::new();
    let refusals = [
        database.add_field(rooms, "name", FieldType::U64, &OwnedValue::Null, &mut sink).err(),
        database.add_field(rooms, "f", FieldType::U64, &OwnedValue::Str("x".into()), &mut sink).err(),
        database.remove_field(rooms, "nope", &mut sink).err(),
    ];
    for refusal in refusals {
        assert!(matches!(refusal, Some(StoreError::SchemaChange(_))), "{refusal:?}");
    }
    assert_eq!(database.last_seq(), 0);
    drop(database);
    let database = open(dir.path());
    assert_eq!(database.engine().collection(rooms).unwrap().schema(), &test_schema());
    assert_eq!(database.last_seq(), 0);
}

/// Records the `seq` each diff was delivered under (`DiffSink::begin_batch`).
#[derive(Default)]
struct SeqSink {
    seq: u64,
    diff_seqs: Vec<u64>,
}

impl ordo_core::DiffSink for SeqSink {
    fn diff(&mut self, _window: ordo_core::WindowId, _diff: ordo_core::DiffRef<'_>) {
        self.diff_seqs.push(self.seq);
    }

    fn begin_batch(&mut self, seq: u64) {
        self.seq = seq;
    }
}

/// A schema change is a write with its own `seq`: the Resets it causes are
/// delivered under it, so a server's frames say they reflect the change.
#[test]
fn the_resets_of_a_schema_change_come_under_its_seq() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    let rooms = database.create_collection("rooms", test_schema()).unwrap();
    let mut batch = Batch::new();
    batch.upsert("r1");
    database.write(rooms, batch, &mut NullSink).1.unwrap();
    let mut sink = SeqSink::default();
    database.open_window(rooms, &ViewDef::new(Filter::True, Vec::new()), 0, 10, &mut sink).unwrap();
    let added = database.add_field(rooms, "extra", FieldType::U64, &OwnedValue::Null, &mut sink).unwrap();
    assert_eq!(sink.diff_seqs.last(), Some(&added), "{:?}", sink.diff_seqs);
    let (removed, _) = database.remove_field(rooms, "extra", &mut sink).unwrap();
    assert_eq!(sink.diff_seqs.last(), Some(&removed), "{:?}", sink.diff_seqs);
    assert!(removed > added);
}

/// Copies the format-1 fixture (see `fixtures/format1/README.md`) and opens it.
#[test]
fn a_format_1_directory_is_upgraded_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format1");
    for file in ["data.mdb", "wal-00000000000000000001.log"] {
        std::fs::copy(fixture.join(file), dir.path().join(file)).unwrap();
    }
    let (mut database, report) = Database::open(dir.path(), options(), &mut |_| {}).unwrap();
    assert_eq!((report.last_seq, report.n_log_records_replayed), (27, 6));
    let rooms = database.engine().collection_id("rooms").unwrap();
    let items = items(&database, "rooms");
    assert_eq!(items.len(), 24);
    assert!(!items.contains_key("room03"));
    assert_eq!(items["room24"].payload, b"late");
    assert_eq!(items["room04"].fields, [OwnedValue::Str("Room 4".into()), OwnedValue::U64(40), OwnedValue::Bool(true)]);
    // Format-2 operations work on the upgraded directory, and survive a reopen.
    let mut sink = CollectingSink::new();
    assert_eq!(database.add_field(rooms, "unread", FieldType::U64, &OwnedValue::U64(0), &mut sink).unwrap(), 28);
    database.remove_field(rooms, "flag", &mut sink).unwrap();
    drop(database);
    let database = open(dir.path());
    let items = common::engine_items(database.engine(), "rooms");
    assert_eq!(items["room04"].fields, [OwnedValue::Str("Room 4".into()), OwnedValue::U64(40), OwnedValue::U64(0)]);
    assert_eq!(common::engine_items(database.engine(), "other")["x"].fields, [OwnedValue::I64(-7)]);
    drop(database);
    // SAFETY: no other environment maps this directory in this process, and no other process uses it.
    let env = unsafe { heed::EnvOpenOptions::new().max_dbs(8).open(dir.path()) }.unwrap();
    let txn = env.read_txn().unwrap();
    let meta: heed::Database<heed::types::Bytes, heed::types::Bytes> =
        env.open_database(&txn, Some("meta")).unwrap().unwrap();
    assert_eq!(meta.get(&txn, b"format").unwrap(), Some(&FORMAT_VERSION.to_le_bytes()[..]));
    assert_eq!(FORMAT_VERSION, 3);
}

/// "Reclaimed" as STORAGE.md says: a drop's pages go back to LMDB's freelist
/// and later writes reuse them, so writing as much again after a drop barely
/// grows the file (which LMDB never shrinks).
#[test]
fn a_dropped_collections_pages_are_reused_by_later_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    let file_bytes = |dir: &Path| std::fs::metadata(dir.join("data.mdb")).unwrap().len();
    let fill = |database: &mut Database, name: &str| {
        let collection = database.create_collection(name, test_schema()).unwrap();
        for chunk in 0..8 {
            let mut batch = Batch::new();
            for k in 0..500 {
                batch
                    .upsert(&format!("item{chunk}-{k:04}"))
                    .set("recency", Value::U64(k))
                    .payload(&[chunk as u8; 1000]);
            }
            database.write(collection, batch, &mut NullSink).1.unwrap();
        }
        database.checkpoint().unwrap();
        collection
    };
    let before = file_bytes(dir.path());
    let first = fill(&mut database, "first");
    let after_first = file_bytes(dir.path());
    assert!(after_first - before > 4 << 20, "the first collection took {} bytes", after_first - before);
    database.drop_collection(first).unwrap();
    // Two commits: LMDB reuses a transaction's freed pages once no reader can still see them.
    database.checkpoint().unwrap();
    fill(&mut database, "second");
    let after_second = file_bytes(dir.path());
    let growth = after_second - after_first;
    assert!(
        growth * 5 < after_first - before,
        "the file grew by {growth} bytes for as much data again after the drop (the first took {})",
        after_first - before
    );
}
