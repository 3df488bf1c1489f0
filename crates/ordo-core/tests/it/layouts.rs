//! A string column's layout depends on the order its values came in: it starts
//! interned and converts to heads, for good, once its distinct values pass
//! `CONVERT_DISTINCT_MIN` and half its slots *so far*. So a server that loaded
//! the same rows in another order (a restart reads them in LMDB's order) may
//! hold the other layout. This test shows that the layout cannot change a diff:
//! the same contents, loaded in two orders that give the two layouts, then the
//! same windows and the same random updates, must produce identical diffs, for
//! views that sort by the column (bytes, case-insensitive, collated), key on it,
//! and test it with `prefix` and `contains`.

use ordo_core::{Batch, CollectingSink, CollectionId, Engine, FieldType, Filter, OwnedValue, Schema, SortKey, Value};
use ordo_core::{OwnedDiff, ViewDef, WindowId};

use crate::reference::Rng;

/// Distinct owners in the initial contents: one more than the conversion's
/// threshold (64), so that loading them first converts the column.
const N_OWNERS: usize = 65;
const N_ITEMS: usize = 260;

/// Owner names: short, past the 28-byte head, non-ASCII, case variants.
fn owner(index: usize) -> String {
    match index % 4 {
        0 => format!("user{index:03}"),
        1 => format!("User{index:03}"),
        2 => format!("a long owner name that does not fit in the head {index:03}"),
        _ => format!("ünïcödé {index:03}"),
    }
}

fn item_id(index: usize) -> String {
    format!("item{index:04}")
}

fn schema() -> Schema {
    Schema::new().with_field("owner", FieldType::String).with_field("recency", FieldType::U64)
}

fn defs() -> Vec<ViewDef> {
    let eq = |index: usize| Filter::eq("owner", OwnedValue::Str(owner(index)));
    vec![
        ViewDef::new(Filter::True, vec![SortKey::asc("owner"), SortKey::desc("recency")]),
        ViewDef::new(Filter::True, vec![SortKey::desc("owner").case_insensitive()]),
        ViewDef::new(Filter::True, vec![SortKey::asc("owner").collated("sv")]),
        ViewDef::new(eq(7), vec![SortKey::desc("recency")]),
        ViewDef::new(eq(10), vec![SortKey::desc("recency")]),
        ViewDef::new(Filter::prefix("owner", "USER0"), vec![SortKey::asc("recency")]),
        ViewDef::new(Filter::contains("owner", "ÜNÏ"), vec![SortKey::asc("owner")]),
    ]
}

/// Loads the initial contents with the items in `order`, opens the windows, and
/// says whether the owner column stayed interned.
fn load(order: &[usize], sink: &mut CollectingSink) -> (Engine, CollectionId, Vec<WindowId>, bool) {
    let mut engine = Engine::new();
    let collection = engine.create_collection("items", schema()).unwrap();
    let mut batch = Batch::new();
    for &index in order {
        batch
            .upsert(&item_id(index))
            .set("owner", Value::Str(&owner(index % N_OWNERS)))
            .set("recency", Value::U64((index * 7919 % 1000) as u64));
    }
    engine.apply_batch(collection, &batch, sink).unwrap();
    let windows = defs()
        .iter()
        .flat_map(|def| [(0, 20), (30, 25)].map(|(offset, limit)| (def.clone(), offset, limit)))
        .map(|(def, offset, limit)| engine.open_window(collection, &def, offset, limit, sink).unwrap())
        .collect();
    let is_interned = engine.collection(collection).unwrap().string_column_is_interned("owner").unwrap();
    (engine, collection, windows, is_interned)
}

/// One random batch: owners changed (to a present or a new value), recencies
/// bumped, items removed and added.
fn random_batch(rng: &mut Rng, batch: &mut Batch) {
    batch.clear();
    for _ in 0..1 + rng.below(4) {
        let id = item_id(rng.below(N_ITEMS + 40));
        match rng.below(10) {
            0 => {
                batch.remove(&id);
            }
            1..=4 => {
                batch.upsert(&id).set("owner", Value::Str(&owner(rng.below(N_OWNERS + 20))));
            }
            _ => {
                batch
                    .upsert(&id)
                    .set("owner", Value::Str(&owner(rng.below(N_OWNERS))))
                    .set("recency", Value::U64(rng.below(2_000) as u64));
            }
        }
    }
}

fn diffs_of(sink: &mut CollectingSink) -> Vec<(WindowId, OwnedDiff)> {
    std::mem::take(&mut sink.diffs)
}

#[test]
fn the_string_layout_a_load_order_gives_changes_no_diff() {
    // Each owner's first item first: 65 distinct values in 65 slots convert the column.
    let converting: Vec<usize> = (0..N_ITEMS).collect();
    // Each owner's items together: distinct values never pass half the slots.
    let mut staying: Vec<usize> = (0..N_ITEMS).collect();
    staying.sort_by_key(|&index| (index % N_OWNERS, index));
    let (mut sink_heads, mut sink_interned) = (CollectingSink::new(), CollectingSink::new());
    let (mut heads, heads_collection, heads_windows, heads_interned) = load(&converting, &mut sink_heads);
    let (mut interned, interned_collection, interned_windows, interned_interned) = load(&staying, &mut sink_interned);
    assert!(!heads_interned, "loading distinct owners first converts the column");
    assert!(interned_interned, "loading each owner's items together keeps it interned");
    assert_eq!(heads_windows, interned_windows);
    // The windows' first contents (no window saw the load itself).
    assert_eq!(diffs_of(&mut sink_heads), diffs_of(&mut sink_interned));

    let mut rng = Rng::new(26);
    let mut batch = Batch::new();
    let mut n_diffs = 0;
    for step in 0..400 {
        random_batch(&mut rng, &mut batch);
        heads.apply_batch(heads_collection, &batch, &mut sink_heads).unwrap();
        interned.apply_batch(interned_collection, &batch, &mut sink_interned).unwrap();
        let diffs = diffs_of(&mut sink_heads);
        assert_eq!(diffs, diffs_of(&mut sink_interned), "step {step}");
        n_diffs += diffs.len();
    }
    assert!(n_diffs > 1_000, "the updates reached the windows ({n_diffs} diffs)");
    let still_interned = interned.collection(interned_collection).unwrap().string_column_is_interned("owner");
    assert_eq!(still_interned, Some(true), "the run compared the two layouts to the end");
}
