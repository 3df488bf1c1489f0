//! Views past the order tree's slot → leaf map size (512 entries), where an
//! update learns whether the item is in a keyed view from the map instead of
//! running the view's filter (`View::is_member`). Checked against a naive
//! filter + sort after every batch: a map that answered "member" for an item
//! outside the view, or "not a member" for one inside, would leave the window
//! or the view's length wrong (or trip the tree's own checks).

use ordo_core::{Batch, Engine, FieldType, Filter, NullSink, OwnedValue, Schema, SortKey, Value, ViewDef};

use ordo_test_kit::rng::Rng;

/// Recencies are distinct across items (the low bits are the item), so the
/// order is total without the engine's tie-break on ids.
fn unique(base: u64, item: usize) -> u64 {
    base * 2048 + item as u64
}

#[test]
fn large_keyed_views_know_their_members_from_the_slot_map() {
    const N_ITEMS: usize = 1_500;
    const WINDOW: usize = 40;
    let mut engine = Engine::new();
    engine.set_view_keying(true);
    let schema = Schema::new().with_field("left", FieldType::Bool).with_field("recency", FieldType::U64);
    let collection = engine.create_collection("rooms", schema).unwrap();
    let mut rng = Rng(17);
    // Per item: left, recency (distinct: the order is total without the id).
    let mut items: Vec<(bool, u64)> = Vec::new();
    let mut batch = Batch::new();
    for item in 0..N_ITEMS {
        let state = (rng.below_u64(4) == 0, unique(item as u64 * 2, item));
        batch.upsert(&format!("r{item}")).set("left", Value::Bool(state.0)).set("recency", Value::U64(state.1));
        items.push(state);
    }
    engine.apply_batch(collection, &batch, &mut NullSink).unwrap();
    // A second view: a collection's lone view is not keyed.
    let left_def = ViewDef::new(Filter::eq("left", OwnedValue::Bool(true)), vec![SortKey::desc("recency")]);
    engine.open_window(collection, &left_def, 0, 1, &mut NullSink).unwrap();
    let def = ViewDef::new(Filter::eq("left", OwnedValue::Bool(false)), vec![SortKey::desc("recency")]);
    let window = engine.open_window(collection, &def, 0, WINDOW, &mut NullSink).unwrap();
    engine.prepare_window(window).unwrap();
    assert_eq!(engine.stats().n_keyed_views, 2, "the view is keyed, so its membership is not kept in bits");
    let mut next_recency = N_ITEMS as u64 * 2;
    for step in 0..3_000 {
        batch.clear();
        for _ in 0..1 + rng.below_u64(3) {
            let item = rng.below_u64(N_ITEMS as u64) as usize;
            next_recency += 1;
            // Mostly the chat case (a new maximum, `left` untouched), on members and
            // non-members alike; sometimes an older recency or a membership change.
            let base = if rng.below_u64(4) == 0 { rng.below_u64(next_recency) } else { next_recency };
            let recency = unique(base, item);
            items[item].1 = recency;
            let flips = rng.below_u64(10) == 0;
            items[item].0 ^= flips;
            let upsert = batch.upsert(&format!("r{item}")).set("recency", Value::U64(recency));
            if flips {
                let _ = upsert.set("left", Value::Bool(items[item].0));
            }
        }
        engine.apply_batch(collection, &batch, &mut NullSink).unwrap();
        let mut expected: Vec<(u64, usize)> =
            (0..N_ITEMS).filter(|&item| !items[item].0).map(|item| (items[item].1, item)).collect();
        expected.sort_by(|left, right| right.cmp(left));
        assert_eq!(engine.view_len(window).unwrap(), expected.len(), "step {step}: view length");
        let shown: Vec<String> = engine.window_items(window).unwrap().into_iter().map(|item| item.id).collect();
        let expected: Vec<String> = expected.iter().take(WINDOW).map(|&(_, item)| format!("r{item}")).collect();
        assert_eq!(shown, expected, "step {step}: window");
    }
}
