//! `ref` fields on disk: the field type survives reopens (with and without a
//! checkpoint, created with the collection or added later), targets are created
//! before the collections referencing them at open whatever their numbers, views
//! read through the reference after a reopen, and a format-2 directory written
//! by the code before references opens as it is.

use std::path::Path;

use ordo_core::{Batch, CollectingSink, FieldType, Filter, NullSink, OwnedValue, Schema, SortKey, Value, ViewDef};
use ordo_store::{Database, StoreOptions, FORMAT_VERSION};

fn options() -> StoreOptions {
    StoreOptions { preallocate_log: false, log_segment_bytes: 4096, ..StoreOptions::default() }
}

fn open(dir: &Path) -> Database {
    Database::open(dir, options(), &mut |_| {}).expect("open").0
}

fn room_list_ids(database: &mut Database) -> Vec<String> {
    let members = database.engine().collection_id("members").unwrap();
    let def = ViewDef::new(Filter::eq("owner", OwnedValue::Str("a".into())), vec![SortKey::desc("room.recency")]);
    let mut sink = CollectingSink::new();
    let window = database.open_window(members, &def, 0, 10, &mut sink).unwrap();
    let ids = database.window_items(window).unwrap().into_iter().map(|item| item.id).collect();
    database.close_window(window).unwrap();
    ids
}

#[test]
fn ref_fields_survive_reopens_and_targets_load_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = open(dir.path());
    // The referencing collection gets the lower number; a later target too (added field).
    let placeholder = database.create_collection("placeholder", Schema::new()).unwrap();
    let rooms = database
        .create_collection(
            "rooms",
            Schema::new().with_field("name", FieldType::String).with_field("recency", FieldType::U64),
        )
        .unwrap();
    database.drop_collection(placeholder).unwrap();
    let members = database
        .create_collection(
            "members",
            Schema::new().with_field("owner", FieldType::String).with_field("room", FieldType::Ref(rooms)),
        )
        .unwrap();
    let topics = database.create_collection("topics", Schema::new().with_field("title", FieldType::String)).unwrap();
    database.add_field(members, "topic", FieldType::Ref(topics), &OwnedValue::Null, &mut NullSink).unwrap();
    let mut batch = Batch::new();
    batch.upsert("r1").set("recency", Value::U64(1));
    batch.upsert("r2").set("recency", Value::U64(2));
    database.write(rooms, std::mem::take(&mut batch), &mut NullSink).1.unwrap();
    batch.upsert("a/r1").set("owner", Value::Str("a")).set("room", Value::Str("r1"));
    batch.upsert("a/r2").set("owner", Value::Str("a")).set("room", Value::Str("r2"));
    database.write(members, std::mem::take(&mut batch), &mut NullSink).1.unwrap();
    database.checkpoint().unwrap();
    // Only in the log.
    batch.upsert("r1").set("recency", Value::U64(3));
    database.write(rooms, std::mem::take(&mut batch), &mut NullSink).1.unwrap();
    assert_eq!(room_list_ids(&mut database), ["a/r1", "a/r2"]);
    // A referenced collection is not dropped, on disk either.
    assert!(database.drop_collection(rooms).is_err());
    database.close_without_checkpoint();

    for _ in 0..2 {
        let mut database = open(dir.path());
        let engine = database.engine();
        let (rooms, topics) = (engine.collection_id("rooms").unwrap(), engine.collection_id("topics").unwrap());
        let schema = engine.collection(engine.collection_id("members").unwrap()).unwrap().schema().clone();
        assert_eq!(
            schema,
            Schema::new()
                .with_field("owner", FieldType::String)
                .with_field("room", FieldType::Ref(rooms))
                .with_field("topic", FieldType::Ref(topics))
        );
        assert_eq!(room_list_ids(&mut database), ["a/r1", "a/r2"]);
        database.checkpoint().unwrap();
    }
}

/// A format-2 directory (see `fixtures/format2/README.md`) opens as it is; the
/// first open writes format 3, and reference fields then work in it.
#[test]
fn a_format_2_directory_opens_and_takes_references() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format2");
    for file in ["data.mdb", "wal-00000000000000000014.log"] {
        std::fs::copy(fixture.join(file), dir.path().join(file)).unwrap();
    }
    let (mut database, report) = Database::open(dir.path(), options(), &mut |_| {}).unwrap();
    assert_eq!((report.last_seq, report.n_log_records_replayed), (15, 2));
    let items = ordo_store_items(&database, "rooms");
    assert_eq!(items.len(), 9);
    assert_eq!(
        items["room03"].fields,
        [OwnedValue::Str("Room 3".into()), OwnedValue::U64(1000), OwnedValue::Bool(false), OwnedValue::U64(2)]
    );
    assert!(database.engine().collection_id("dropped").is_none());
    let rooms = database.engine().collection_id("rooms").unwrap();
    let members = database.engine().collection_id("members").unwrap();
    database.add_field(members, "room_ref", FieldType::Ref(rooms), &OwnedValue::Null, &mut NullSink).unwrap();
    let mut batch = Batch::new();
    batch.upsert("u1/room01").set("room_ref", Value::Str("room03"));
    database.write(members, batch, &mut NullSink).1.unwrap();
    drop(database);
    let mut database = open(dir.path());
    let members = database.engine().collection_id("members").unwrap();
    let def = ViewDef::new(Filter::True, vec![SortKey::desc("room_ref.recency")]);
    let window = database.open_window(members, &def, 0, 10, &mut NullSink).unwrap();
    let ids: Vec<String> = database.window_items(window).unwrap().into_iter().map(|item| item.id).collect();
    assert_eq!(ids, ["u1/room01", "u1/room02"]);
    drop(database);
    // SAFETY: no other environment maps this directory in this process, and no other process uses it.
    let env = unsafe { heed::EnvOpenOptions::new().max_dbs(8).open(dir.path()) }.unwrap();
    let txn = env.read_txn().unwrap();
    let meta: heed::Database<heed::types::Bytes, heed::types::Bytes> =
        env.open_database(&txn, Some("meta")).unwrap().unwrap();
    assert_eq!(meta.get(&txn, b"format").unwrap(), Some(&FORMAT_VERSION.to_le_bytes()[..]));
    assert_eq!(FORMAT_VERSION, 3);
}

fn ordo_store_items(database: &Database, name: &str) -> std::collections::BTreeMap<String, ordo_core::OwnedItem> {
    let engine = database.engine();
    let collection = engine.collection(engine.collection_id(name).unwrap()).unwrap();
    collection.items().map(|item| (item.id().to_owned(), item.to_owned_item())).collect()
}
