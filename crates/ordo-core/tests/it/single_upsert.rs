//! The one-item path (`engine/single_upsert.rs`) against the general path.
//!
//! Two engines get the same random steps: one applies single upserts by the
//! one-item path, the other has it switched off (`set_single_upsert_path(false)`),
//! so every batch takes validation, `plan_visits` and `apply_upsert`. After every
//! step both must have answered the same (`Ok` summary or the same error), sent
//! the same diffs in the same order, visited the same number of views, and hold
//! the same items, versions and windows. The batches are mostly one upsert of an
//! item that exists, writing a random subset of fields (sort, filter and key
//! fields: the row predicate's `owner` keys views) with or without a payload,
//! and also the cases the path must hand to the general one: new ids, removes,
//! atomics and preconditions, several operations, and invalid input of each kind
//! the general path refuses. The windows use the model test's views (keyed and
//! unkeyed, collated sorts, accent-insensitive filters).

use ordo_core::{Batch, CollectingSink, CollectionId, Engine, OwnedValue, Precondition, Value, ViewDef, WindowId};

use crate::model::{random_atomic, random_def, random_filter, random_id, random_row_filter, random_sort, random_value};
use crate::model::{schema, FIELDS};
use crate::reference::Rng;

struct Side {
    engine: Engine,
    collection: CollectionId,
    sink: CollectingSink,
}

impl Side {
    fn new(is_single_path_enabled: bool) -> Side {
        let mut engine = Engine::new();
        engine.set_single_upsert_path(is_single_path_enabled);
        let collection = engine.create_collection("rooms", schema()).unwrap();
        Side { engine, collection, sink: CollectingSink::new() }
    }
}

/// One random batch: mostly a single upsert; see the module.
fn random_batch(rng: &mut Rng, batch: &mut Batch, n_ids: usize) {
    batch.clear();
    let n_ops = if rng.chance(85) { 1 } else { 2 + rng.below(3) };
    for _ in 0..n_ops {
        let id = random_id(rng, n_ids);
        if rng.chance(10) {
            batch.remove(&id);
            continue;
        }
        let mut builder = batch.upsert(&id);
        // Half the upserts write one field or two (the chat case), so that many
        // write no field keying a view, which is what the one-item path takes.
        let field_chance = if rng.chance(50) { 8 } else { 30 };
        for (field, _) in FIELDS {
            if rng.chance(field_chance) {
                builder = builder.set(field, random_value(rng, field).as_value());
            }
        }
        if rng.chance(60) {
            builder = builder.payload(format!("preview {}", rng.below(1000)).as_bytes());
        }
        if rng.chance(8) {
            let (op, field, operand) = random_atomic(rng);
            builder = builder.atomic(op, field, operand.as_value());
        }
        if rng.chance(5) {
            builder.precondition(*rng.pick(&[Precondition::Exists, Precondition::NotExists, Precondition::Version(3)]));
        }
    }
    if rng.chance(12) {
        // Input the general path refuses, alone in its batch or after a valid upsert.
        if rng.chance(60) {
            batch.clear();
        }
        let id = random_id(rng, n_ids);
        let long_text = "x".repeat(ordo_core::limits::MAX_STRING_FIELD_BYTES + 1);
        let big_payload = vec![b'p'; ordo_core::limits::MAX_PAYLOAD_BYTES + 1];
        match rng.below(8) {
            0 => drop(batch.upsert(&id).set("no_such_field", Value::U64(1))),
            1 => drop(batch.upsert(&id).set("recency", Value::Str("soon"))),
            2 => drop(batch.upsert(&id).set("ratio", Value::F64(f64::NAN))),
            3 => drop(batch.upsert(&id).set("name", Value::Str(&long_text))),
            4 => drop(batch.upsert(&id).set("recency", Value::I64(-1))),
            5 => drop(batch.upsert(&id).payload(&big_payload)),
            6 => drop(batch.upsert("").set("unread", Value::U64(1))),
            _ => drop(batch.upsert(&"i".repeat(256)).set("unread", Value::U64(1))),
        }
    }
}

fn compare(fast: &mut Side, general: &mut Side, windows: &[(WindowId, WindowId)], n_ids: usize, context: &str) {
    assert_eq!(fast.sink.diffs, general.sink.diffs, "{context}: diffs");
    fast.sink.diffs.clear();
    general.sink.diffs.clear();
    let (fast_stats, general_stats) = (fast.engine.stats(), general.engine.stats());
    assert_eq!(fast_stats.n_view_visits, general_stats.n_view_visits, "{context}: views visited");
    assert_eq!(fast_stats.n_items, general_stats.n_items, "{context}: items");
    let (fast_items, general_items) =
        (fast.engine.collection(fast.collection).unwrap(), general.engine.collection(general.collection).unwrap());
    for n in 0..n_ids {
        // `random_id` draws from `n_ids` names; every one of them is compared.
        for id in [format!("rööm-{n}"), format!("!room{n:03}:example.org")] {
            let fast_item = fast_items.get(&id).map(|item| (item.to_owned_item(), item.version()));
            let general_item = general_items.get(&id).map(|item| (item.to_owned_item(), item.version()));
            assert_eq!(fast_item, general_item, "{context}: item {id}");
        }
    }
    for &(fast_window, general_window) in windows {
        assert_eq!(
            fast.engine.window_items(fast_window).unwrap(),
            general.engine.window_items(general_window).unwrap(),
            "{context}: window {fast_window:?}"
        );
    }
    fast.engine.check_key_indexes();
}

fn run_seed(seed: u64, n_steps: usize) -> u64 {
    let mut rng = Rng(seed);
    let n_ids = if seed % 3 == 2 { 600 } else { 40 };
    let (mut fast, mut general) = (Side::new(true), Side::new(false));
    let mut shared: Vec<ViewDef> =
        (0..2).map(|_| ViewDef::new(random_filter(&mut rng, 2), random_sort(&mut rng))).collect();
    shared.extend((0..3).map(|_| ViewDef::new(random_row_filter(&mut rng), random_sort(&mut rng))));
    let mut windows: Vec<(WindowId, WindowId)> = Vec::new();
    let mut batch = Batch::new();
    for step in 0..n_steps {
        let context = format!("seed {seed} step {step}");
        let action = rng.below(100);
        if rng.chance(3) {
            let is_keyed = rng.chance(70);
            fast.engine.set_view_keying(is_keyed);
            general.engine.set_view_keying(is_keyed);
        }
        if windows.is_empty() || (action < 8 && windows.len() < 10) {
            let def = random_def(&mut rng, &shared);
            let (offset, limit) = (rng.below(n_ids / 2 + 5), 1 + rng.below(25));
            let pair = [&mut fast, &mut general]
                .map(|side| side.engine.open_window(side.collection, &def, offset, limit, &mut side.sink).unwrap());
            windows.push((pair[0], pair[1]));
        } else if action < 12 {
            let (fast_window, general_window) = *rng.pick(&windows);
            let (offset, limit) = (rng.below(n_ids / 2 + 5), rng.below(30));
            fast.engine.set_window_range(fast_window, offset, limit, &mut fast.sink).unwrap();
            general.engine.set_window_range(general_window, offset, limit, &mut general.sink).unwrap();
        } else if action < 14 {
            let (fast_window, general_window) = *rng.pick(&windows);
            let def = random_def(&mut rng, &shared);
            fast.engine.set_window_view(fast_window, &def, &mut fast.sink).unwrap();
            general.engine.set_window_view(general_window, &def, &mut general.sink).unwrap();
        } else {
            random_batch(&mut rng, &mut batch, n_ids);
            let fast_result = fast.engine.apply_batch(fast.collection, &batch, &mut fast.sink);
            let general_result = general.engine.apply_batch(general.collection, &batch, &mut general.sink);
            assert_eq!(format!("{fast_result:?}"), format!("{general_result:?}"), "{context}: result");
        }
        compare(&mut fast, &mut general, &windows, n_ids, &context);
    }
    assert_eq!(general.engine.stats().n_single_upserts, 0, "the general side took the one-item path");
    fast.engine.stats().n_single_upserts
}

#[test]
fn the_one_item_path_gives_what_the_general_path_gives() {
    let (n_seeds, n_steps) = (12, 300);
    let mut n_single = 0;
    for seed in 0..n_seeds {
        match std::panic::catch_unwind(|| run_seed(seed, n_steps)) {
            Ok(n) => n_single += n,
            Err(panic) => {
                eprintln!("single_upsert test failed with seed {seed}");
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("{n_single} batches took the one-item path");
    // About a third of the steps: a test that stopped reaching the path would prove nothing.
    assert!(n_single >= n_seeds * n_steps as u64 / 6, "only {n_single} batches took the one-item path");
}

/// The cases the path hands over are applied by the general path with their own
/// outcome (errors named as usual) and leave no trace of the attempt.
#[test]
fn refused_single_upserts_leave_nothing_behind() {
    let mut side = Side::new(true);
    let mut batch = Batch::new();
    batch.upsert("a").set("name", Value::Str("alpha")).set("recency", Value::U64(1));
    side.engine.apply_batch(side.collection, &batch, &mut side.sink).unwrap();
    let window =
        side.engine.open_window(side.collection, &ViewDef::new(ordo_core::Filter::True, vec![]), 0, 10, &mut side.sink);
    window.unwrap();
    side.sink.diffs.clear();
    let before = side.engine.collection(side.collection).unwrap().get("a").unwrap().to_owned_item();
    for bad in 0..3 {
        batch.clear();
        let builder = batch.upsert("a").set("recency", Value::U64(5));
        match bad {
            0 => drop(builder.set("no_such_field", Value::U64(1))),
            1 => drop(builder.set("ratio", Value::F64(f64::NAN))),
            _ => drop(builder.set("unread", Value::Str("many"))),
        }
        assert!(side.engine.apply_batch(side.collection, &batch, &mut side.sink).is_err());
        assert!(side.sink.diffs.is_empty(), "a refused batch sent diffs");
        let item = side.engine.collection(side.collection).unwrap().get("a").unwrap();
        assert_eq!(item.to_owned_item(), before);
        assert_eq!(item.version(), 1);
    }
    assert_eq!(side.engine.stats().n_single_upserts, 0);
    batch.clear();
    batch.upsert("a").set("recency", Value::U64(5));
    side.engine.apply_batch(side.collection, &batch, &mut side.sink).unwrap();
    assert_eq!(side.engine.stats().n_single_upserts, 1);
    let item = side.engine.collection(side.collection).unwrap().get("a").unwrap();
    assert_eq!((item.field_by_name("recency"), item.version()), (Some(OwnedValue::U64(5).as_value()), 2));
}
