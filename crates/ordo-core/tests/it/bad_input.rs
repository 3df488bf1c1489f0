//! Rejected input changes nothing: not the items, not any window, and emits no diff.
//! Each limit is tested at its edge.

use ordo_core::{
    limits, Batch, BatchError, CollectingSink, Engine, Filter, OwnedItem, OwnedValue, SortKey, Value, ViewDef,
    ViewError,
};

use crate::alloc::{room_list_def, room_schema};

fn items_of(engine: &Engine, collection: ordo_core::CollectionId) -> Vec<OwnedItem> {
    let mut items: Vec<OwnedItem> =
        engine.collection(collection).unwrap().items().map(|item| item.to_owned_item()).collect();
    items.sort_by(|a, b| a.id.cmp(&b.id));
    items
}

#[test]
fn every_rejected_batch_leaves_items_and_windows_untouched() {
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", room_schema()).unwrap();
    let mut sink = CollectingSink::new();
    let mut batch = Batch::new();
    for n in 0..30 {
        batch
            .upsert(&format!("room{n:02}"))
            .set("name", Value::Str("name"))
            .set("recency", Value::U64(n))
            .set("left", Value::Bool(false))
            .payload(b"p");
    }
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    let window = engine.open_window(rooms, &room_list_def(), 0, 10, &mut sink).unwrap();
    sink.diffs.clear();
    let items_before = items_of(&engine, rooms);
    let window_before = engine.window_items(window).unwrap();

    let long_id = "x".repeat(limits::MAX_ID_BYTES + 1);
    let long_string = "s".repeat(limits::MAX_STRING_FIELD_BYTES + 1);
    let big_payload = vec![0u8; limits::MAX_PAYLOAD_BYTES + 1];
    type BadOp = Box<dyn Fn(&mut Batch)>;
    type Case = (BadOp, fn(&BatchError) -> bool);
    let cases: Vec<Case> = vec![
        (
            Box::new(|b: &mut Batch| {
                b.upsert("");
            }),
            |e| matches!(e, BatchError::IdEmpty { .. }),
        ),
        (
            Box::new(move |b: &mut Batch| {
                b.upsert(&long_id);
            }),
            |e| matches!(e, BatchError::IdTooLong { id_bytes: 256, .. }),
        ),
        (
            Box::new(|b: &mut Batch| {
                b.upsert("room01").set("colour", Value::U64(1));
            }),
            |e| matches!(e, BatchError::UnknownField { field, .. } if field == "colour"),
        ),
        (
            // One op setting a field twice: a check reading one value and a write
            // keeping the other would disagree, so neither is chosen.
            Box::new(|b: &mut Batch| {
                b.upsert("room01").set("name", Value::Str("a")).set("name", Value::Str("b"));
            }),
            |e| matches!(e, BatchError::FieldRepeated { field, .. } if field == "name"),
        ),
        (
            Box::new(|b: &mut Batch| {
                b.upsert("room01").set("recency", Value::Str("now"));
            }),
            |e| matches!(e, BatchError::WrongType { expected: "u64", found: "string", .. }),
        ),
        (
            Box::new(|b: &mut Batch| {
                b.upsert("room01").set("recency", Value::I64(-1));
            }),
            |e| matches!(e, BatchError::WrongType { .. }),
        ),
        (
            Box::new(|b: &mut Batch| {
                b.upsert("room01").set("left", Value::U64(0));
            }),
            |e| matches!(e, BatchError::WrongType { expected: "bool", .. }),
        ),
        (
            Box::new(move |b: &mut Batch| {
                b.upsert("room01").set("name", Value::Str(&long_string));
            }),
            |e| matches!(e, BatchError::StringTooLong { .. }),
        ),
        (
            Box::new(move |b: &mut Batch| {
                b.upsert("room01").payload(&big_payload);
            }),
            |e| matches!(e, BatchError::PayloadTooLarge { .. }),
        ),
    ];
    for (index, (add_bad_op, is_expected)) in cases.iter().enumerate() {
        // Good operations before and after the bad one must not be applied either.
        batch.clear();
        batch.upsert("room03").set("recency", Value::U64(1_000)).payload(b"changed");
        batch.remove("room04");
        batch.upsert("new-room").set("left", Value::Bool(false)).set("recency", Value::U64(2_000));
        add_bad_op(&mut batch);
        batch.upsert("room05").set("recency", Value::U64(3_000));
        let error = engine.apply_batch(rooms, &batch, &mut sink).expect_err("bad batch accepted");
        assert!(is_expected(&error), "case {index}: unexpected error {error:?}");
        assert!(!error.to_string().is_empty());
        assert!(sink.diffs.is_empty(), "case {index}: diffs emitted for a rejected batch");
        assert_eq!(items_of(&engine, rooms), items_before, "case {index}: items changed");
        assert_eq!(engine.window_items(window).unwrap(), window_before, "case {index}: window changed");
    }
    // Just inside the limits is accepted.
    batch.clear();
    batch
        .upsert(&"x".repeat(limits::MAX_ID_BYTES))
        .set("name", Value::Str(&"s".repeat(limits::MAX_STRING_FIELD_BYTES)))
        .set("recency", Value::I64(5))
        .payload(&vec![0u8; limits::MAX_PAYLOAD_BYTES]);
    engine.apply_batch(rooms, &batch, &mut sink).expect("limits are inclusive");
}

#[test]
fn bad_view_definitions_and_window_requests_are_refused() {
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", room_schema()).unwrap();
    let mut sink = CollectingSink::new();
    let def = |filter: Filter, sort: Vec<SortKey>| ViewDef::new(filter, sort);
    let cases = [
        (def(Filter::eq("colour", OwnedValue::U64(1)), vec![]), "no field `colour`"),
        (def(Filter::True, vec![SortKey::asc("colour")]), "no field `colour`"),
        (def(Filter::True, vec![SortKey::asc("name"), SortKey::desc("name")]), "twice"),
        (def(Filter::True, vec![SortKey::asc("recency").case_insensitive()]), "does not apply"),
        (def(Filter::eq("recency", OwnedValue::Str("x".into())), vec![]), "u64"),
        (def(Filter::contains("recency", "1"), vec![]), "does not apply"),
        (def(Filter::True, vec![SortKey::asc("recency").collated("fr")]), "does not apply"),
        (def(Filter::True, vec![SortKey::asc("name").collated("fr_FR")]), "not a BCP 47 locale"),
    ];
    for (def, message) in cases {
        let error = engine.open_window(rooms, &def, 0, 10, &mut sink).expect_err("bad view accepted");
        assert!(error.to_string().contains(message), "{error} should mention {message}");
    }
    assert!(sink.diffs.is_empty());
    let too_large = engine.open_window(rooms, &room_list_def(), 0, limits::MAX_WINDOW_LIMIT + 1, &mut sink);
    assert!(matches!(too_large, Err(ViewError::WindowTooLarge { .. })));
    let window = engine.open_window(rooms, &room_list_def(), 0, limits::MAX_WINDOW_LIMIT, &mut sink).unwrap();
    assert!(engine.set_window_range(window, 0, limits::MAX_WINDOW_LIMIT + 1, &mut sink).is_err());
    assert_eq!(engine.window_range(window).unwrap(), (0, limits::MAX_WINDOW_LIMIT), "a refused change kept the range");
    engine.close_window(window).unwrap();
    assert_eq!(engine.close_window(window), Err(ViewError::UnknownWindow));
    assert_eq!(engine.set_window_range(window, 0, 1, &mut sink), Err(ViewError::UnknownWindow));
    // A recycled window slot does not answer to the old id.
    let reopened = engine.open_window(rooms, &room_list_def(), 0, 5, &mut sink).unwrap();
    assert_ne!(reopened, window);
    assert_eq!(engine.window_items(window), Err(ViewError::UnknownWindow));
    assert_eq!(engine.stats().n_views, 1);
    engine.close_window(reopened).unwrap();
    assert_eq!(engine.stats().n_views, 0, "a view without windows is dropped");
}

/// The collation limits at their edges: collated keys per view, locale length.
#[test]
fn collation_limits_are_inclusive() {
    let schema = ordo_core::Schema::new()
        .with_field("first", ordo_core::FieldType::String)
        .with_field("second", ordo_core::FieldType::String)
        .with_field("third", ordo_core::FieldType::String);
    let mut engine = Engine::new();
    let people = engine.create_collection("people", schema).unwrap();
    let mut sink = CollectingSink::new();
    let fields = ["first", "second", "third"];
    assert_eq!(limits::MAX_COLLATED_SORT_KEYS + 1, fields.len(), "the test names one field past the limit");
    let collated = |n_keys: usize| {
        let sort = fields[..n_keys].iter().map(|field| SortKey::asc(field).collated("sv")).collect();
        ViewDef::new(Filter::True, sort)
    };
    engine.open_window(people, &collated(limits::MAX_COLLATED_SORT_KEYS), 0, 10, &mut sink).expect("at the limit");
    assert_eq!(
        engine.open_window(people, &collated(limits::MAX_COLLATED_SORT_KEYS + 1), 0, 10, &mut sink),
        Err(ViewError::TooManyCollatedSortKeys { n_keys_max: limits::MAX_COLLATED_SORT_KEYS })
    );
    // Plain keys beside the collated ones do not count.
    let mut mixed = collated(limits::MAX_COLLATED_SORT_KEYS);
    mixed.sort.push(SortKey::asc("third"));
    engine.open_window(people, &mixed, 0, 10, &mut sink).expect("plain keys are not collated");

    // "de-x-" and then private-use subtags: a valid tag of any length.
    let mut locale = String::from("de-x");
    while locale.len() < limits::MAX_COLLATION_LOCALE_BYTES {
        locale.push_str(if limits::MAX_COLLATION_LOCALE_BYTES - locale.len() >= 2 { "-a" } else { "b" });
    }
    assert_eq!(locale.len(), limits::MAX_COLLATION_LOCALE_BYTES);
    let with_locale = |locale: &str| ViewDef::new(Filter::True, vec![SortKey::asc("first").collated(locale)]);
    engine.open_window(people, &with_locale(&locale), 0, 10, &mut sink).expect("a locale at the limit");
    locale.push('c');
    assert!(matches!(
        engine.open_window(people, &with_locale(&locale), 0, 10, &mut sink),
        Err(ViewError::CollationLocaleTooLong { n_bytes, n_bytes_max, .. })
            if n_bytes == n_bytes_max + 1 && n_bytes_max == limits::MAX_COLLATION_LOCALE_BYTES
    ));
}

#[test]
fn windows_on_an_empty_collection_and_past_the_end() {
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", room_schema()).unwrap();
    let mut sink = CollectingSink::new();
    let window = engine.open_window(rooms, &room_list_def(), 0, 20, &mut sink).unwrap();
    let past_end = engine.open_window(rooms, &room_list_def(), 50, 20, &mut sink).unwrap();
    let diffs = sink.take_for(window);
    assert!(matches!(&diffs[..], [ordo_core::OwnedDiff::Reset { values }] if values.is_empty()));
    let mut batch = Batch::new();
    batch.upsert("a").set("left", Value::Bool(false)).set("recency", Value::U64(1));
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    let diffs = sink.take_for(window);
    assert_eq!(diffs.len(), 1);
    assert!(matches!(&diffs[0], ordo_core::OwnedDiff::Insert { index: 0, value } if value.id == "a"));
    assert!(sink.take_for(past_end).len() == 1, "only the open Reset for the window past the end");
}

#[test]
fn a_batch_past_its_byte_limit_is_refused_whole_and_clear_resets_it() {
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", room_schema()).unwrap();
    let mut sink = CollectingSink::new();
    let mut batch = Batch::new();
    let payload = vec![7u8; limits::MAX_PAYLOAD_BYTES];
    let n_ops = limits::MAX_BATCH_BYTES / limits::MAX_PAYLOAD_BYTES + 1;
    for n in 0..n_ops {
        batch.upsert(&format!("room{n}")).payload(&payload);
    }
    assert!(batch.n_bytes() <= limits::MAX_BATCH_BYTES, "the batch stopped growing at its limit");
    assert_eq!(engine.apply_batch(rooms, &batch, &mut sink), Err(BatchError::BatchTooLarge));
    assert_eq!(engine.collection(rooms).unwrap().len(), 0, "nothing of a refused batch applies");
    batch.clear();
    batch.upsert("room0").payload(&payload);
    engine.apply_batch(rooms, &batch, &mut sink).expect("a cleared batch is usable again");
    assert_eq!(engine.collection(rooms).unwrap().len(), 1);
}

/// Schema changes keep the field limits at their edges, and a refused change
/// leaves the items, the schema and the windows as they were.
#[test]
fn refused_schema_changes_leave_everything_untouched() {
    use ordo_core::{FieldType, SchemaChangeError, SchemaError};
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", room_schema()).unwrap();
    let mut sink = CollectingSink::new();
    let mut batch = Batch::new();
    batch.upsert("room").set("name", Value::Str("n")).set("recency", Value::U64(1)).set("left", Value::Bool(false));
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    let window = engine.open_window(rooms, &room_list_def(), 0, 10, &mut sink).unwrap();
    sink.diffs.clear();
    let (items_before, schema_before) = (items_of(&engine, rooms), engine.collection(rooms).unwrap().schema().clone());

    let at_limit = "s".repeat(limits::MAX_STRING_FIELD_BYTES);
    let past_limit = "s".repeat(limits::MAX_STRING_FIELD_BYTES + 1);
    let refusals = [
        ("name", FieldType::String, OwnedValue::Null),
        ("", FieldType::String, OwnedValue::Null),
        (&*"f".repeat(limits::MAX_FIELD_NAME_BYTES + 1), FieldType::U64, OwnedValue::Null),
        ("f", FieldType::String, OwnedValue::Str(past_limit)),
        ("f", FieldType::F64, OwnedValue::F64(f64::NAN)),
        ("f", FieldType::U64, OwnedValue::I64(-1)),
        ("f", FieldType::Bool, OwnedValue::Str("yes".into())),
    ];
    for (name, field_type, default) in refusals {
        assert!(engine.add_field(rooms, name, field_type, &default, &mut sink).is_err(), "{name:?} {default:?}");
    }
    assert_eq!(
        engine.remove_field(rooms, "no_such_field", &mut sink),
        Err(SchemaChangeError::UnknownField { field: "no_such_field".into() })
    );
    assert!(sink.diffs.is_empty(), "a refused change emitted diffs");
    assert_eq!(items_of(&engine, rooms), items_before);
    assert_eq!(engine.collection(rooms).unwrap().schema(), &schema_before);
    assert_eq!(engine.window_items(window).unwrap().len(), 1);

    // At the edges: the longest default and field name, then fields up to the limit.
    engine
        .add_field(
            rooms,
            &"f".repeat(limits::MAX_FIELD_NAME_BYTES),
            FieldType::String,
            &OwnedValue::Str(at_limit),
            &mut sink,
        )
        .unwrap();
    for index in engine.collection(rooms).unwrap().schema().len()..limits::MAX_FIELDS_PER_SCHEMA {
        engine.add_field(rooms, &format!("extra{index}"), FieldType::U64, &OwnedValue::U64(7), &mut sink).unwrap();
    }
    assert_eq!(
        engine.add_field(rooms, "one_too_many", FieldType::U64, &OwnedValue::Null, &mut sink),
        Err(SchemaChangeError::Schema(SchemaError::TooManyFields { n_fields_max: limits::MAX_FIELDS_PER_SCHEMA }))
    );
    let item = engine.collection(rooms).unwrap().get("room").unwrap().to_owned_item();
    assert_eq!(item.fields.len(), limits::MAX_FIELDS_PER_SCHEMA);
    assert_eq!(item.fields.last(), Some(&OwnedValue::U64(7)), "existing items take the default");
}

/// The one-item path (one plain upsert of an existing item) refuses a field set
/// twice as the general path does, and changes nothing.
#[test]
fn an_upsert_setting_a_field_twice_is_refused_on_the_one_item_path() {
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", room_schema()).unwrap();
    let mut sink = CollectingSink::new();
    let mut batch = Batch::new();
    batch.upsert("room").set("name", Value::Str("before")).set("recency", Value::U64(1));
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    let window = engine.open_window(rooms, &room_list_def(), 0, 10, &mut sink).unwrap();
    sink.diffs.clear();
    let items_before = items_of(&engine, rooms);
    let window_before = engine.window_items(window).unwrap();
    batch.clear();
    batch.upsert("room").set("name", Value::Str("checked")).set("name", Value::Str("kept"));
    let error = engine.apply_batch(rooms, &batch, &mut sink).expect_err("a field set twice was accepted");
    assert!(matches!(&error, BatchError::FieldRepeated { op_index: 0, field } if field == "name"), "{error:?}");
    assert!(sink.diffs.is_empty());
    assert_eq!(items_of(&engine, rooms), items_before);
    assert_eq!(engine.window_items(window).unwrap(), window_before);
    assert_eq!(engine.stats().n_single_upserts, 0);
}
