//! Round-trip model test: random batches (some refused) written through a
//! `Database`, which is closed and reopened every few steps. After each reopen the
//! engine must equal the reference model, the disk's item counts must be exact,
//! and windows opened on the rebuilt views must equal the windows that were
//! maintained live, diff by diff, before the restart.
//!
//! `ORDO_STORE_SEEDS` and `ORDO_STORE_STEPS` run it longer.

mod common;

use common::{assert_engine_matches, fill_batch, random_ops, test_schema, GenOp, Model, Rng};
use ordo_core::{Batch, CollectingSink, CompareOp, Filter, OwnedItem, OwnedValue, SortKey, ViewDef, WindowId};
use ordo_store::{Database, StoreError, StoreOptions};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

fn view_defs() -> Vec<(ViewDef, usize, usize)> {
    vec![
        (ViewDef::new(Filter::True, vec![SortKey::desc("recency"), SortKey::asc("name")]), 0, 10),
        (
            ViewDef::new(
                Filter::compare("unread", CompareOp::Gt, OwnedValue::U64(0)),
                vec![SortKey::asc("name").case_insensitive()],
            ),
            3,
            15,
        ),
        (
            ViewDef::new(
                Filter::eq("is_dm", OwnedValue::Bool(true)),
                vec![SortKey::asc("score"), SortKey::desc("delta")],
            ),
            0,
            50,
        ),
    ]
}

struct LiveWindow {
    window: WindowId,
    local: Vec<OwnedItem>,
}

fn open_windows(database: &mut Database, sink: &mut CollectingSink) -> Vec<LiveWindow> {
    let rooms = database.engine().collection_id("rooms").unwrap();
    view_defs()
        .iter()
        .map(|(def, offset, limit)| {
            let window = database.open_window(rooms, def, *offset, *limit, sink).unwrap();
            let mut local = Vec::new();
            for diff in sink.take_for(window) {
                diff.apply(&mut local);
            }
            LiveWindow { window, local }
        })
        .collect()
}

fn reopen(dir: &std::path::Path) -> Database {
    let (database, report) = Database::open(dir, StoreOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(report.n_collections, 2);
    database
}

fn run_seed(seed: u64, n_steps: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(seed);
    let schema = test_schema();
    let mut database = reopen_or_create(dir.path());
    let mut models = [Model::default(), Model::default()];
    let names = ["rooms", "other"];
    let mut sink = CollectingSink::new();
    let mut windows = open_windows(&mut database, &mut sink);
    let mut batch = Batch::new();
    let mut n_committed = 0u64;

    for step in 0..n_steps {
        let context = format!("seed {seed}, step {step}");
        let which = usize::from(rng.chance(25));
        let collection = database.engine().collection_id(names[which]).unwrap();
        let ops = random_ops(&mut rng, if which == 0 { "!room" } else { "x" }, 60, 12);
        fill_batch(&mut batch, &ops);
        let refuse = rng.chance(10);
        if refuse {
            // A NaN in the last op: the whole batch must leave no trace, in memory or on disk.
            batch.upsert("!room0").set("score", common::bad_value());
        }
        let (returned, result) = database.write(collection, std::mem::take(&mut batch), &mut sink);
        batch = returned;
        match (refuse, result) {
            (true, Err(StoreError::Batch(_))) => {}
            (false, Ok(ack)) => {
                n_committed += 1;
                assert_eq!(ack.seq, n_committed, "{context}: sequence numbers are consecutive");
                models[which].apply(&schema, &ops);
            }
            (refuse, result) => panic!("{context}: refuse={refuse}, got {:?}", result.map(|ack| ack.seq)),
        }
        for live in &mut windows {
            for diff in sink.take_for(live.window) {
                diff.apply(&mut live.local);
            }
        }
        assert_engine_matches(database.engine(), names[which], &models[which], &context);

        if step % 40 == 39 || step == n_steps - 1 {
            let live_contents: Vec<Vec<OwnedItem>> = windows.iter().map(|live| live.local.clone()).collect();
            for live in &windows {
                assert_eq!(live.local, database.window_items(live.window).unwrap(), "{context}: live window vs engine");
            }
            drop(database);
            database = reopen(dir.path());
            assert_eq!(database.last_seq(), n_committed, "{context}: sequence after reopen");
            for (name, model) in names.iter().zip(&models) {
                assert_engine_matches(database.engine(), name, model, &format!("{context}, after reopen"));
                let collection = database.engine().collection_id(name).unwrap();
                let number = database.collection_number(collection).unwrap();
                assert_eq!(
                    database.with_store(move |store| store.item_count(number)).unwrap(),
                    model.items.len() as u64,
                    "{context}: item count"
                );
                assert_eq!(
                    database.with_store(move |store| store.raw_items(number)).unwrap().len(),
                    model.items.len(),
                    "{context}: items on disk"
                );
            }
            sink = CollectingSink::new();
            windows = open_windows(&mut database, &mut sink);
            for (live, expected) in windows.iter().zip(&live_contents) {
                assert_eq!(&live.local, expected, "{context}: a view rebuilt at start differs from the live one");
            }
        }
    }
}

fn reopen_or_create(dir: &std::path::Path) -> Database {
    let (mut database, report) = Database::open(dir, StoreOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(report.n_collections, 0);
    database.create_collection("rooms", test_schema()).unwrap();
    database.create_collection("other", test_schema()).unwrap();
    database
}

#[test]
fn reopened_store_equals_the_model_and_live_views() {
    let n_seeds = env_usize("ORDO_STORE_SEEDS", 6) as u64;
    let n_steps = env_usize("ORDO_STORE_STEPS", 200);
    for seed in 0..n_seeds {
        run_seed(seed, n_steps);
    }
}

#[test]
fn partial_updates_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut database = reopen_or_create(dir.path());
    let rooms = database.engine().collection_id("rooms").unwrap();
    let mut sink = CollectingSink::new();
    let ops = vec![
        GenOp::Upsert {
            id: "!a".into(),
            fields: vec![("name", OwnedValue::Str("Alice".into())), ("recency", OwnedValue::U64(5))],
            payload: Some(b"first".to_vec()),
        },
        GenOp::Upsert { id: "!a".into(), fields: vec![("unread", OwnedValue::U64(2))], payload: None },
        GenOp::Upsert { id: "!a".into(), fields: vec![("name", OwnedValue::Null)], payload: Some(Vec::new()) },
        GenOp::Upsert {
            id: "!a".into(),
            fields: vec![("delta", OwnedValue::I64(-3))],
            payload: Some(b"last".to_vec()),
        },
    ];
    // One op per batch, so that each merge reads the record the previous commit wrote.
    let mut model = Model::default();
    for op in &ops {
        let mut batch = Batch::new();
        fill_batch(&mut batch, std::slice::from_ref(op));
        database.write(rooms, batch, &mut sink).1.unwrap();
        model.apply(&test_schema(), std::slice::from_ref(op));
    }
    drop(database);
    let database = reopen(dir.path());
    assert_engine_matches(database.engine(), "rooms", &model, "after reopen");
    let item = &model.items["!a"];
    assert_eq!(item.fields[0], OwnedValue::Null);
    assert_eq!(item.fields[2], OwnedValue::U64(2));
    assert_eq!(item.payload, b"last");
}

/// A load that spans many of the reader's chunks (256 KiB each) and several
/// collections, whose boundaries fall inside chunks: every item comes back once.
#[test]
fn a_load_across_many_chunks_and_collections_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let (mut database, _) = Database::open(dir.path(), StoreOptions::default(), &mut |_| {}).unwrap();
    let names = ["first", "second", "third"];
    let mut models = [Model::default(), Model::default(), Model::default()];
    let mut batch = Batch::new();
    for (name, model) in names.iter().zip(&mut models) {
        let collection = database.create_collection(name, test_schema()).unwrap();
        let ops: Vec<GenOp> = (0..2_500)
            .map(|index| GenOp::Upsert {
                id: format!("{name}-{index:05}"),
                fields: vec![("recency", OwnedValue::U64(index)), ("name", OwnedValue::Str(format!("n{index}")))],
                payload: Some(vec![index as u8; 700 + (index as usize % 300)]),
            })
            .collect();
        fill_batch(&mut batch, &ops);
        batch = database.write(collection, batch, &mut ordo_core::NullSink).0;
        model.apply(&test_schema(), &ops);
    }
    drop(database);
    let mut progress_calls = 0;
    let (database, report) = Database::open(dir.path(), StoreOptions::default(), &mut |_| progress_calls += 1).unwrap();
    assert_eq!(report.n_items, 7_500);
    assert!(progress_calls >= 1, "the end of a load is always reported");
    for (name, model) in names.iter().zip(&models) {
        assert_engine_matches(database.engine(), name, model, "after a multi-chunk load");
    }
}
