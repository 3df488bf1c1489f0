//! Reference fields: views of memberships sorted and filtered through a `ref` to
//! shared rooms; the diffs a room update causes; bad input.

use ordo_core::{
    Batch, CollectingSink, CollectionId, CreateCollectionError, Engine, FieldType, Filter, OwnedDiff, OwnedValue,
    Schema, SchemaChangeError, SchemaError, SortKey, Value, ViewDef, ViewError, WindowId,
};

pub fn rooms_schema() -> Schema {
    Schema::new()
        .with_field("name", FieldType::String)
        .with_field("recency", FieldType::U64)
        .with_field("muted", FieldType::Bool)
}

pub fn members_schema(rooms: CollectionId) -> Schema {
    Schema::new()
        .with_field("owner", FieldType::String)
        .with_field("room", FieldType::Ref(rooms))
        .with_field("unread", FieldType::U64)
}

fn setup() -> (Engine, CollectionId, CollectionId) {
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", rooms_schema()).unwrap();
    let members = engine.create_collection("members", members_schema(rooms)).unwrap();
    let mut sink = CollectingSink::new();
    let mut batch = Batch::new();
    for (id, name, recency) in [("r1", "one", 10u64), ("r2", "two", 20), ("r3", "three", 30)] {
        batch.upsert(id).set("name", Value::Str(name)).set("recency", Value::U64(recency));
    }
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    batch.clear();
    for (id, owner, room) in [("a/r1", "a", "r1"), ("a/r2", "a", "r2"), ("a/r3", "a", "r3"), ("b/r1", "b", "r1")] {
        batch.upsert(id).set("owner", Value::Str(owner)).set("room", Value::Str(room)).set("unread", Value::U64(0));
    }
    engine.apply_batch(members, &batch, &mut sink).unwrap();
    (engine, rooms, members)
}

fn room_list(owner: &str) -> ViewDef {
    ViewDef::new(Filter::eq("owner", OwnedValue::Str(owner.to_owned())), vec![SortKey::desc("room.recency")])
}

fn ids(engine: &mut Engine, window: WindowId) -> Vec<String> {
    engine.window_items(window).unwrap().into_iter().map(|item| item.id).collect()
}

#[test]
fn a_room_update_moves_its_memberships_in_every_list() {
    let (mut engine, rooms, members) = setup();
    let mut sink = CollectingSink::new();
    let a = engine.open_window(members, &room_list("a"), 0, 10, &mut sink).unwrap();
    let b = engine.open_window(members, &room_list("b"), 0, 10, &mut sink).unwrap();
    assert_eq!(ids(&mut engine, a), ["a/r3", "a/r2", "a/r1"]);
    sink.take_for(a);
    sink.take_for(b);

    let mut batch = Batch::new();
    batch.upsert("r1").set("recency", Value::U64(40));
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    assert_eq!(ids(&mut engine, a), ["a/r1", "a/r3", "a/r2"]);
    assert!(matches!(sink.take_for(a)[..], [OwnedDiff::Remove { index: 2 }, OwnedDiff::Insert { index: 0, .. }]));
    // b's only room moved too, in place: the shown data changed.
    assert!(matches!(sink.take_for(b)[..], [OwnedDiff::Set { index: 0, .. }]));
}

#[test]
fn a_change_of_shown_target_data_is_a_set_and_other_views_are_not_visited() {
    let (mut engine, rooms, members) = setup();
    let mut sink = CollectingSink::new();
    // `a` shows the room's name (a projection) without sorting or filtering on it.
    let a = engine.open_window(members, &room_list("a").showing(vec!["room.name".into()]), 0, 10, &mut sink).unwrap();
    // `hidden` reads through `room` too, but not the name.
    let hidden = engine.open_window(members, &room_list("a"), 0, 10, &mut sink).unwrap();
    let own = ViewDef::new(Filter::eq("owner", OwnedValue::Str("a".into())), vec![SortKey::desc("unread")]);
    let plain = engine.open_window(members, &own, 0, 10, &mut sink).unwrap();
    assert_eq!(engine.window_items(a).unwrap()[1].id, "a/r2");
    sink.take_for(a);
    sink.take_for(hidden);
    sink.take_for(plain);
    let visits_before = engine.stats().n_view_visits;
    let mut batch = Batch::new();
    batch.upsert("r2").set("name", Value::Str("renamed"));
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    assert!(matches!(sink.take_for(a)[..], [OwnedDiff::Set { index: 1, .. }]));
    assert!(sink.take_for(hidden).is_empty(), "the name is not shown there");
    assert!(sink.take_for(plain).is_empty());
    // The rooms collection has no views; of the members' views only `a` reads the name.
    assert_eq!(engine.stats().n_view_visits - visits_before, 1);

    // A target field no view reads: nothing at all.
    batch.clear();
    batch.upsert("r2").set("muted", Value::Bool(true));
    let visits_before = engine.stats().n_view_visits;
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    assert!(sink.take_for(a).is_empty() && sink.take_for(hidden).is_empty());
    assert_eq!(engine.stats().n_view_visits - visits_before, 0);
}

#[test]
fn a_missing_target_reads_null_and_starts_resolving_when_it_appears() {
    let (mut engine, rooms, members) = setup();
    let mut sink = CollectingSink::new();
    let mut batch = Batch::new();
    batch.upsert("a/r9").set("owner", Value::Str("a")).set("room", Value::Str("r9"));
    engine.apply_batch(members, &batch, &mut sink).unwrap();
    let a = engine.open_window(members, &room_list("a"), 0, 10, &mut sink).unwrap();
    // Null sorts last.
    assert_eq!(ids(&mut engine, a), ["a/r3", "a/r2", "a/r1", "a/r9"]);
    let with_recency = ViewDef::new(
        Filter::All(vec![
            Filter::eq("owner", OwnedValue::Str("a".into())),
            Filter::Not(Box::new(Filter::is_null("room.recency"))),
        ]),
        vec![SortKey::desc("room.recency")],
    );
    let present = engine.open_window(members, &with_recency, 0, 10, &mut sink).unwrap();
    assert_eq!(ids(&mut engine, present), ["a/r3", "a/r2", "a/r1"]);

    batch.clear();
    batch.upsert("r9").set("recency", Value::U64(99));
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    assert_eq!(ids(&mut engine, a), ["a/r9", "a/r3", "a/r2", "a/r1"]);
    assert_eq!(ids(&mut engine, present), ["a/r9", "a/r3", "a/r2", "a/r1"]);

    batch.clear();
    batch.remove("r3");
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    assert_eq!(ids(&mut engine, a), ["a/r9", "a/r2", "a/r1", "a/r3"]);
    assert_eq!(ids(&mut engine, present), ["a/r9", "a/r2", "a/r1"]);

    // A reference changing target.
    batch.clear();
    batch.upsert("a/r1").set("room", Value::Str("r2"));
    engine.apply_batch(members, &batch, &mut sink).unwrap();
    assert_eq!(ids(&mut engine, a), ["a/r9", "a/r1", "a/r2", "a/r3"]);
}

#[test]
fn bad_references_are_refused() {
    let (mut engine, rooms, members) = setup();
    let mut sink = CollectingSink::new();
    let open = |engine: &mut Engine, def: ViewDef| engine.open_window(members, &def, 0, 10, &mut CollectingSink::new());

    // More than one hop.
    let def = ViewDef::new(Filter::True, vec![SortKey::asc("room.owner.name")]);
    assert_eq!(open(&mut engine, def), Err(ViewError::TooManyHops { field: "room.owner.name".into() }));
    // A dot on a field that is not a reference.
    let def = ViewDef::new(Filter::is_null("owner.name"), vec![]);
    assert_eq!(
        open(&mut engine, def),
        Err(ViewError::NotAReference { field: "owner.name".into(), ref_field: "owner".into() })
    );
    // An unknown target field, and an unknown ref field.
    let def = ViewDef::new(Filter::True, vec![SortKey::asc("room.nope")]);
    assert_eq!(open(&mut engine, def), Err(ViewError::UnknownField { field: "room.nope".into() }));
    let def = ViewDef::new(Filter::True, vec![SortKey::asc("nope.name")]);
    assert_eq!(open(&mut engine, def), Err(ViewError::UnknownField { field: "nope.name".into() }));
    // A type mismatch through a reference.
    let def = ViewDef::new(Filter::eq("room.recency", OwnedValue::Str("x".into())), vec![]);
    assert_eq!(
        open(&mut engine, def),
        Err(ViewError::WrongType { field: "room.recency".into(), expected: "u64", found: "string" })
    );
    let def = ViewDef::new(Filter::contains("room.recency", "x"), vec![]);
    assert!(matches!(open(&mut engine, def), Err(ViewError::NotApplicable { .. })));

    // A ref to an unknown collection: a dropped one's id stays dead.
    let gone = engine.create_collection("gone", Schema::new()).unwrap();
    engine.drop_collection(gone).unwrap();
    let schema = Schema::new().with_field("x", FieldType::Ref(gone));
    assert_eq!(
        engine.create_collection("refs_gone", schema),
        Err(CreateCollectionError::Schema(SchemaError::UnknownRefTarget { field: "x".into() }))
    );
    assert_eq!(
        engine.add_field(members, "x", FieldType::Ref(gone), &OwnedValue::Null, &mut sink),
        Err(SchemaChangeError::Schema(SchemaError::UnknownRefTarget { field: "x".into() }))
    );
    // A collection may not reference itself.
    assert_eq!(
        engine.add_field(members, "self", FieldType::Ref(members), &OwnedValue::Null, &mut sink),
        Err(SchemaChangeError::Schema(SchemaError::UnknownRefTarget { field: "self".into() }))
    );
    // References form no cycle (a store creates targets first when it loads).
    assert_eq!(
        engine.add_field(rooms, "back", FieldType::Ref(members), &OwnedValue::Null, &mut sink),
        Err(SchemaChangeError::Schema(SchemaError::RefCycle { field: "back".into() }))
    );
    // References form no cycle (a store creates targets first when it loads).
    assert_eq!(
        engine.add_field(rooms, "back", FieldType::Ref(members), &OwnedValue::Null, &mut sink),
        Err(SchemaChangeError::Schema(SchemaError::RefCycle { field: "back".into() }))
    );
    // Dropping a referenced collection is refused until the ref field is removed.
    assert_eq!(
        engine.drop_collection(rooms),
        Err(SchemaChangeError::CollectionReferenced { by: "members".into(), field: "room".into() })
    );
    engine.remove_field(members, "room", &mut sink).unwrap();
    engine.drop_collection(rooms).unwrap();
    // Batches cannot write a field read through a reference.
    let mut batch = Batch::new();
    batch.upsert("a/r1").set("room.recency", Value::U64(1));
    assert!(engine.apply_batch(members, &batch, &mut sink).is_err());
}

#[test]
fn schema_changes_end_the_windows_reading_through_references() {
    let (mut engine, rooms, members) = setup();
    let mut sink = CollectingSink::new();
    let a = engine.open_window(members, &room_list("a"), 0, 10, &mut sink).unwrap();
    let own = ViewDef::new(Filter::True, vec![SortKey::desc("unread")]);
    let plain = engine.open_window(members, &own, 0, 10, &mut sink).unwrap();
    let ended = engine.remove_field(rooms, "muted", &mut sink).unwrap();
    assert_eq!(ended, [a]);
    assert!(engine.window_range(plain).is_ok());
    // Reading through the reference again works, on the new schema.
    let a = engine.open_window(members, &room_list("a"), 0, 10, &mut sink).unwrap();
    assert_eq!(ids(&mut engine, a), ["a/r3", "a/r2", "a/r1"]);
    let mut batch = Batch::new();
    batch.upsert("r1").set("recency", Value::U64(50));
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    assert_eq!(ids(&mut engine, a), ["a/r1", "a/r3", "a/r2"]);
    let ended = engine.remove_field(members, "unread", &mut sink).unwrap();
    assert_eq!(ended.len(), 2);
}
