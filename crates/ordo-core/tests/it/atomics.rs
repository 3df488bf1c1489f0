//! Atomic field operations, preconditions and item versions, at their edges.
//! (Random sequences of them run in `model.rs` against the reference.)

use ordo_core::{
    AtomicOp, Batch, BatchError, CollectionId, Engine, FieldType, NullSink, OwnedValue, Precondition, Schema, Value,
};

use crate::alloc::{allocations_on_this_thread, room_list_def, room_schema};
use crate::reference::Rng;

fn engine() -> (Engine, CollectionId) {
    let mut engine = Engine::new();
    let schema = Schema::new()
        .with_field("signed", FieldType::I64)
        .with_field("unsigned", FieldType::U64)
        .with_field("float", FieldType::F64)
        .with_field("name", FieldType::String)
        .with_field("flag", FieldType::Bool);
    let collection = engine.create_collection("items", schema).unwrap();
    (engine, collection)
}

fn field(engine: &Engine, collection: CollectionId, id: &str, name: &str) -> OwnedValue {
    engine.collection(collection).unwrap().get(id).unwrap().field_by_name(name).unwrap().to_owned_value()
}

/// `start` in `name`, then `op operand`: the value written, or the error.
fn run(name: &str, start: Value<'_>, op: AtomicOp, operand: Value<'_>) -> Result<OwnedValue, BatchError> {
    let (mut engine, collection) = engine();
    let mut batch = Batch::new();
    let upsert = batch.upsert("x");
    if !start.is_null() {
        upsert.set(name, start);
    }
    engine.apply_batch(collection, &batch, &mut NullSink).unwrap();
    batch.clear();
    batch.upsert("x").atomic(op, name, operand);
    engine.apply_batch(collection, &batch, &mut NullSink)?;
    Ok(field(&engine, collection, "x", name))
}

#[test]
fn increments_refuse_results_outside_the_field_type_exactly_at_the_edge() {
    use AtomicOp::{Decrement, Increment};
    use OwnedValue as O;
    let overflow = |result: Result<OwnedValue, BatchError>| match result {
        Err(BatchError::Overflow { op_index: 0, operation, .. }) => operation,
        other => panic!("expected an overflow, got {other:?}"),
    };
    // i64: up to i64::MAX and down to i64::MIN, not one past.
    assert_eq!(run("signed", Value::I64(i64::MAX - 1), Increment, Value::I64(1)), Ok(O::I64(i64::MAX)));
    assert_eq!(overflow(run("signed", Value::I64(i64::MAX), Increment, Value::I64(1))), "increment");
    assert_eq!(run("signed", Value::I64(i64::MIN + 1), Decrement, Value::I64(1)), Ok(O::I64(i64::MIN)));
    assert_eq!(overflow(run("signed", Value::I64(i64::MIN), Decrement, Value::I64(1))), "decrement");
    assert_eq!(overflow(run("signed", Value::I64(i64::MIN), Increment, Value::I64(-1))), "increment");
    // A u64 operand past i64::MAX is fine while the result fits.
    assert_eq!(run("signed", Value::I64(i64::MIN), Increment, Value::U64(u64::MAX)), Ok(O::I64(i64::MAX)));
    // u64: 0 and u64::MAX are the edges; a negative increment is a decrement.
    assert_eq!(run("unsigned", Value::U64(1), Increment, Value::I64(-1)), Ok(O::U64(0)));
    assert_eq!(overflow(run("unsigned", Value::U64(0), Increment, Value::I64(-1))), "increment");
    assert_eq!(overflow(run("unsigned", Value::U64(0), Decrement, Value::U64(1))), "decrement");
    assert_eq!(run("unsigned", Value::U64(u64::MAX - 1), Increment, Value::U64(1)), Ok(O::U64(u64::MAX)));
    assert_eq!(overflow(run("unsigned", Value::U64(u64::MAX), Increment, Value::U64(1))), "increment");
    assert_eq!(overflow(run("unsigned", Value::U64(u64::MAX), Decrement, Value::I64(-1))), "decrement");
    // f64: the result must be finite.
    assert_eq!(run("float", Value::F64(f64::MAX), Increment, Value::F64(1.0)), Ok(O::F64(f64::MAX)));
    assert_eq!(overflow(run("float", Value::F64(f64::MAX), Increment, Value::F64(f64::MAX))), "increment");
    assert_eq!(overflow(run("float", Value::F64(-f64::MAX), Decrement, Value::F64(f64::MAX))), "decrement");
    assert_eq!(overflow(run("float", Value::F64(f64::INFINITY), Increment, Value::F64(1.0))), "increment");
    // Null counts as 0.
    assert_eq!(run("unsigned", Value::Null, Increment, Value::U64(5)), Ok(O::U64(5)));
    assert_eq!(run("signed", Value::Null, Decrement, Value::U64(5)), Ok(O::I64(-5)));
    assert_eq!(overflow(run("unsigned", Value::Null, Decrement, Value::U64(5))), "decrement");
    assert_eq!(run("float", Value::Null, Increment, Value::F64(-0.5)), Ok(O::F64(-0.5)));
}

#[test]
fn set_max_and_set_min_set_a_null_field_and_keep_a_better_value() {
    use AtomicOp::{SetMax, SetMin};
    use OwnedValue as O;
    assert_eq!(run("unsigned", Value::Null, SetMax, Value::U64(3)), Ok(O::U64(3)));
    assert_eq!(run("unsigned", Value::U64(5), SetMax, Value::U64(3)), Ok(O::U64(5)));
    assert_eq!(run("unsigned", Value::U64(5), SetMin, Value::U64(3)), Ok(O::U64(3)));
    assert_eq!(run("signed", Value::I64(-5), SetMax, Value::I64(-7)), Ok(O::I64(-5)));
    assert_eq!(run("float", Value::F64(1.5), SetMin, Value::F64(f64::NEG_INFINITY)), Ok(O::F64(f64::NEG_INFINITY)));
    // Strings compare by bytes, as a case-sensitive sort orders them.
    assert_eq!(run("name", Value::Str("b"), SetMax, Value::Str("B")), Ok(O::Str("b".into())));
    assert_eq!(run("name", Value::Str("b"), SetMin, Value::Str("B")), Ok(O::Str("B".into())));
    assert_eq!(run("name", Value::Null, SetMin, Value::Str("zz")), Ok(O::Str("zz".into())));
    // Refused: a bool, a NaN, a null operand, an operand of another type.
    for (name, op, operand) in [
        ("flag", SetMax, Value::Bool(true)),
        ("flag", AtomicOp::Increment, Value::U64(1)),
        ("name", AtomicOp::Increment, Value::U64(1)),
        ("float", SetMax, Value::F64(f64::NAN)),
        ("float", AtomicOp::Increment, Value::F64(f64::NAN)),
        ("unsigned", SetMax, Value::Null),
        ("unsigned", SetMax, Value::I64(-1)),
        ("unsigned", AtomicOp::Increment, Value::F64(0.5)),
        ("no_such_field", SetMax, Value::U64(1)),
    ] {
        let result = run(name, Value::Null, op, operand);
        assert!(result.is_err(), "{name} {op:?} {operand:?}: {result:?}");
    }
}

#[test]
fn preconditions_and_versions() {
    let (mut engine, collection) = engine();
    let mut batch = Batch::new();
    // The engine numbers batches itself: 1, 2, ... (refused ones take no number).
    batch.upsert("a").precondition(Precondition::NotExists).increment("unsigned", Value::U64(1));
    engine.apply_batch(collection, &batch, &mut NullSink).unwrap();
    let version = |engine: &Engine, id: &str| engine.collection(collection).unwrap().get(id).map(|item| item.version());
    assert_eq!(version(&engine, "a"), Some(1));
    batch.clear();
    batch.upsert("a").precondition(Precondition::NotExists);
    let error = engine.apply_batch(collection, &batch, &mut NullSink).unwrap_err();
    assert_eq!(
        error,
        BatchError::Conflict { op_index: 0, id: "a".into(), expected: Precondition::NotExists, found: Some(1) }
    );
    assert_eq!(error.to_string(), "op 0 (`a`): expected no item, found one at version 1");
    // A store's numbering: its sequence numbers.
    batch.clear();
    batch.upsert("a").precondition(Precondition::Version(1)).set("name", Value::Str("n"));
    batch.upsert("b").set("name", Value::Str("m"));
    batch.remove_if("b", Precondition::Version(40));
    engine.apply_batch_at(collection, &batch, 40, &mut NullSink).unwrap();
    assert_eq!((version(&engine, "a"), version(&engine, "b")), (Some(40), None));
    batch.clear();
    batch.upsert("c");
    engine.apply_batch(collection, &batch, &mut NullSink).unwrap();
    assert_eq!(version(&engine, "c"), Some(41), "one more than the highest so far");
    batch.clear();
    batch.upsert("c").precondition(Precondition::Exists);
    batch.remove_if("zz", Precondition::Exists);
    let error = engine.apply_batch(collection, &batch, &mut NullSink).unwrap_err();
    assert_eq!(error.to_string(), "op 1 (`zz`): expected the item to exist, found no item");
    assert_eq!(version(&engine, "c"), Some(41), "a refused batch changes no version");
}

/// A store's group: batches staged, not applied, are seen by the next resolution.
#[test]
fn resolution_sees_the_staged_batches_of_the_group() {
    let (mut engine, collection) = engine();
    let mut batch = Batch::new();
    batch.upsert("a").set("unsigned", Value::U64(10));
    engine.apply_batch_at(collection, &batch, 1, &mut NullSink).unwrap();
    engine.begin_group();
    batch.clear();
    batch.upsert("a").set("unsigned", Value::U64(20));
    batch.remove("gone");
    engine.stage_batch(collection, &batch, 2);
    let mut atomic = Batch::new();
    atomic.upsert("a").precondition(Precondition::Version(2)).increment("unsigned", Value::U64(1));
    atomic.upsert("a").increment("unsigned", Value::U64(1)).set_max("signed", Value::I64(-3));
    let mut resolved = Batch::new();
    engine.resolve_batch(collection, &atomic, 3, &mut resolved).unwrap();
    assert!(!resolved.needs_state(), "the resolved batch is plain");
    let ops: Vec<Vec<(String, Value<'_>)>> =
        resolved.ops().map(|op| op.fields().map(|(name, value)| (name.to_owned(), value)).collect()).collect();
    assert_eq!(
        ops,
        [
            vec![("unsigned".to_owned(), Value::U64(21))],
            vec![("unsigned".to_owned(), Value::U64(22)), ("signed".to_owned(), Value::I64(-3))]
        ]
    );
    // The resolved batch was staged at 3; op 0 of this one makes it 4 before op 1
    // checks: a conflict, and nothing of the batch is staged.
    atomic.clear();
    atomic.upsert("a").increment("unsigned", Value::U64(100));
    atomic.upsert("a").precondition(Precondition::Version(3));
    assert!(matches!(
        engine.resolve_batch(collection, &atomic, 4, &mut resolved),
        Err(BatchError::Conflict { op_index: 1, found: Some(4), .. })
    ));
    atomic.clear();
    atomic.upsert("a").precondition(Precondition::Version(3)).increment("unsigned", Value::U64(1));
    engine.resolve_batch(collection, &atomic, 4, &mut resolved).unwrap();
    assert_eq!(resolved.ops().next().unwrap().fields().next(), Some(("unsigned", Value::U64(23))));
    // Nothing was applied: the engine still holds the state before the group.
    assert_eq!(field(&engine, collection, "a", "unsigned"), OwnedValue::U64(10));
}

#[test]
fn atomic_updates_allocate_nothing_in_steady_state() {
    let n_rooms = 2_000;
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", room_schema()).unwrap();
    let mut rng = Rng(7);
    let mut batch = Batch::new();
    let ids: Vec<String> = (0..n_rooms).map(|n| format!("!room{n:08}:example.org")).collect();
    for (n, id) in ids.iter().enumerate() {
        batch
            .upsert(id)
            .set("name", Value::Str("a room"))
            .set("recency", Value::U64(n as u64))
            .set("left", Value::Bool(false))
            .set("unread", Value::U64(0));
    }
    engine.apply_batch(rooms, &batch, &mut NullSink).unwrap();
    engine.open_window(rooms, &room_list_def(), 0, 20, &mut NullSink).unwrap();
    let mut recency = 1_000_000u64;
    let mut run_updates = |engine: &mut Engine, batch: &mut Batch, n: usize| {
        for _ in 0..n {
            recency += 1;
            batch.clear();
            let id = &ids[rng.below(n_rooms)];
            // A new message: the room moves up, its unread count grows (two ops that compose).
            batch
                .upsert(id)
                .precondition(Precondition::Exists)
                .set_max("recency", Value::U64(recency))
                .increment("unread", Value::U64(1));
            batch.upsert(id).set_min("unread", Value::U64(1_000_000));
            engine.apply_batch(rooms, batch, &mut NullSink).unwrap();
        }
    };
    run_updates(&mut engine, &mut batch, 10_000);
    let before = allocations_on_this_thread();
    run_updates(&mut engine, &mut batch, 10_000);
    assert_eq!(allocations_on_this_thread() - before, 0, "heap allocations during 10 000 atomic updates");
    let total: u64 = ids
        .iter()
        .map(|id| match engine.collection(rooms).unwrap().get(id).unwrap().field_by_name("unread") {
            Some(Value::U64(unread)) => unread,
            other => panic!("unread is {other:?}"),
        })
        .sum();
    assert_eq!(total, 20_000, "every increment counted once");
}
