//! Bulk loading against the batch path: the same items loaded either way must
//! give the same collection, the same views and the same later diffs; refused
//! and abandoned loads must leave the collection as it was.

use std::collections::BTreeMap;

use ordo_core::{
    Batch, BatchError, CollectingSink, Engine, LoadError, NullSink, OwnedItem, OwnedValue, Value, ViewDef,
};

use crate::alloc::{room_list_def, room_schema};
use crate::reference::Rng;

fn random_room(rng: &mut Rng, index: usize) -> (String, Vec<OwnedValue>, Vec<u8>) {
    // Ids both shorter and longer than the 30 bytes held inline in their slot.
    let id = if index.is_multiple_of(3) {
        format!("!a-rather-long-room-identifier-{index}:example.org")
    } else {
        format!("!r{index}")
    };
    let name = OwnedValue::Str(format!("{}room{}", ["", "Ä", "z"][rng.below(3)], rng.below(50)));
    let values = vec![
        if rng.chance(10) { OwnedValue::Null } else { name },
        OwnedValue::U64(rng.below(1_000) as u64),
        OwnedValue::Bool(rng.chance(5)),
        OwnedValue::Bool(rng.chance(10)),
        OwnedValue::U64(rng.below(3) as u64),
        OwnedValue::Bool(rng.chance(30)),
        OwnedValue::Bool(rng.chance(5)),
    ];
    let payload = (0..rng.below(40)).map(|byte| byte as u8).collect();
    (id, values, payload)
}

fn items(engine: &Engine, name: &str) -> BTreeMap<String, OwnedItem> {
    let collection = engine.collection(engine.collection_id(name).unwrap()).unwrap();
    collection.items().map(|item| (item.id().to_owned(), item.to_owned_item())).collect()
}

fn window_contents(engine: &mut Engine, name: &str, def: &ViewDef) -> Vec<OwnedItem> {
    let collection = engine.collection_id(name).unwrap();
    let mut sink = CollectingSink::new();
    let window = engine.open_window(collection, def, 0, 50, &mut sink).unwrap();
    let mut local = Vec::new();
    for diff in sink.take_for(window) {
        diff.apply(&mut local);
    }
    engine.close_window(window).unwrap();
    local
}

#[test]
fn bulk_load_equals_the_batch_path() {
    for seed in 0..4 {
        let mut rng = Rng(seed);
        let rooms: Vec<_> = (0..3_000).map(|index| random_room(&mut rng, index)).collect();
        let names: Vec<String> = room_schema().fields().iter().map(|field| field.name.clone()).collect();

        let mut by_batch = Engine::new();
        let collection = by_batch.create_collection("rooms", room_schema()).unwrap();
        let mut batch = Batch::new();
        for (id, values, payload) in &rooms {
            let mut upsert = batch.upsert(id);
            for (name, value) in names.iter().zip(values) {
                upsert = upsert.set(name, value.as_value());
            }
            upsert.payload(payload);
        }
        by_batch.apply_batch(collection, &batch, &mut NullSink).unwrap();

        let mut by_load = Engine::new();
        let collection = by_load.create_collection("rooms", room_schema()).unwrap();
        // A first load, then a second one into the non-empty collection.
        for part in rooms.chunks(2_000) {
            let mut load = by_load.bulk_load(collection, part.len()).unwrap();
            for (id, values, payload) in part {
                let values: Vec<Value<'_>> = values.iter().map(OwnedValue::as_value).collect();
                load.push(id, &values, payload).unwrap();
            }
            assert_eq!(load.finish().unwrap(), part.len());
        }

        assert_eq!(items(&by_load, "rooms"), items(&by_batch, "rooms"), "seed {seed}");
        for (id, _, _) in &rooms {
            assert!(by_load.collection(collection).unwrap().get(id).is_some(), "seed {seed}: {id} is findable");
        }
        assert_eq!(
            window_contents(&mut by_load, "rooms", &room_list_def()),
            window_contents(&mut by_batch, "rooms", &room_list_def())
        );

        // Later batches behave the same on both: same diffs, same contents.
        let (mut sink_load, mut sink_batch) = (CollectingSink::new(), CollectingSink::new());
        let window_load = by_load.open_window(collection, &room_list_def(), 0, 20, &mut sink_load).unwrap();
        let window_batch = by_batch.open_window(collection, &room_list_def(), 0, 20, &mut sink_batch).unwrap();
        sink_load.take_for(window_load);
        sink_batch.take_for(window_batch);
        for step in 0..200 {
            batch.clear();
            let (id, _, _) = &rooms[rng.below(rooms.len())];
            if rng.chance(10) {
                batch.remove(id);
            } else {
                batch.upsert(id).set("recency", Value::U64(1_000 + step)).payload(b"new");
            }
            by_load.apply_batch(collection, &batch, &mut sink_load).unwrap();
            by_batch.apply_batch(collection, &batch, &mut sink_batch).unwrap();
            assert_eq!(sink_load.take_for(window_load), sink_batch.take_for(window_batch), "seed {seed}, step {step}");
        }
        assert_eq!(items(&by_load, "rooms"), items(&by_batch, "rooms"), "seed {seed}, after updates");
    }
}

fn room_values() -> Vec<Value<'static>> {
    vec![
        Value::Str("name"),
        Value::U64(1),
        Value::Bool(false),
        Value::Bool(false),
        Value::U64(0),
        Value::Bool(false),
        Value::Bool(false),
    ]
}

#[test]
fn a_duplicate_id_rolls_the_whole_load_back() {
    let mut engine = Engine::new();
    let collection = engine.create_collection("rooms", room_schema()).unwrap();
    let mut load = engine.bulk_load(collection, 10).unwrap();
    load.push("!kept", &room_values(), b"").unwrap();
    load.finish().unwrap();
    let before = items(&engine, "rooms");

    // A duplicate inside the load.
    let mut load = engine.bulk_load(collection, 10).unwrap();
    for index in 0..100 {
        load.push(&format!("!new{index}"), &room_values(), b"x").unwrap();
    }
    load.push("!new7", &room_values(), b"").unwrap();
    assert_eq!(load.finish(), Err(LoadError::DuplicateId { id: "!new7".to_owned() }));
    assert_eq!(items(&engine, "rooms"), before);
    assert!(engine.collection(collection).unwrap().get("!new3").is_none(), "rolled-back ids are not in the index");

    // A duplicate of an item already there.
    let mut load = engine.bulk_load(collection, 10).unwrap();
    load.push("!other", &room_values(), b"").unwrap();
    load.push("!kept", &room_values(), b"").unwrap();
    assert_eq!(load.finish(), Err(LoadError::DuplicateId { id: "!kept".to_owned() }));
    assert_eq!(items(&engine, "rooms"), before);

    // An abandoned load.
    let mut load = engine.bulk_load(collection, 10).unwrap();
    load.push("!abandoned", &room_values(), b"").unwrap();
    drop(load);
    assert_eq!(items(&engine, "rooms"), before);

    // The collection still works: the rolled-back ids can be added by batch.
    let mut batch = Batch::new();
    batch.upsert("!new7").set("name", Value::Str("back"));
    engine.apply_batch(collection, &batch, &mut NullSink).unwrap();
    assert_eq!(engine.collection(collection).unwrap().len(), 2);
}

#[test]
fn refused_items_add_nothing() {
    let mut engine = Engine::new();
    let collection = engine.create_collection("rooms", room_schema()).unwrap();
    let mut load = engine.bulk_load(collection, 10).unwrap();
    let mut wrong_type = room_values();
    wrong_type[1] = Value::Str("not a number");
    assert!(matches!(
        load.push("!a", &wrong_type, b""),
        Err(LoadError::Invalid { error: BatchError::WrongType { .. }, .. })
    ));
    assert_eq!(load.push("!a", &room_values()[..3], b""), Err(LoadError::FieldCount { n_values: 3, n_fields: 7 }));
    assert!(matches!(
        load.push("", &room_values(), b""),
        Err(LoadError::Invalid { error: BatchError::IdEmpty { .. }, .. })
    ));
    let long_id = "x".repeat(ordo_core::limits::MAX_ID_BYTES + 1);
    assert!(matches!(
        load.push(&long_id, &room_values(), b""),
        Err(LoadError::Invalid { error: BatchError::IdTooLong { .. }, .. })
    ));
    load.push("!b", &room_values(), b"ok").unwrap();
    assert_eq!(load.finish(), Ok(1));
    assert_eq!(engine.collection(collection).unwrap().len(), 1);

    // No bulk load once the collection has a view.
    let window = engine.open_window(collection, &room_list_def(), 0, 10, &mut NullSink).unwrap();
    assert_eq!(engine.bulk_load(collection, 1).err(), Some(LoadError::CollectionHasViews));
    engine.close_window(window).unwrap();
    assert!(engine.bulk_load(collection, 1).is_ok());
}
