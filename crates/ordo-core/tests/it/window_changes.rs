//! Moving, resizing and re-pointing a window sends the small diff, not a blind Reset.

use ordo_core::{Batch, CollectingSink, Engine, Filter, OwnedDiff, OwnedValue, SortKey, Value, ViewDef};

use crate::alloc::room_schema;

fn engine_with_rooms(n_rooms: u64) -> (Engine, ordo_core::CollectionId) {
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", room_schema()).unwrap();
    let mut batch = Batch::new();
    for n in 0..n_rooms {
        batch
            .upsert(&format!("room{n:03}"))
            .set("name", Value::Str(&format!("name{:03}", (n * 7) % n_rooms)))
            .set("recency", Value::U64(n))
            .set("left", Value::Bool(n == 3))
            .set("unread", Value::U64(n % 5));
    }
    engine.apply_batch(rooms, &batch, &mut CollectingSink::new()).unwrap();
    (engine, rooms)
}

fn by_recency(filter: Filter) -> ViewDef {
    ViewDef::new(filter, vec![SortKey::desc("recency")])
}

fn ids(items: &[ordo_core::OwnedItem]) -> Vec<&str> {
    items.iter().map(|item| item.id.as_str()).collect()
}

#[test]
fn load_more_appends_only_the_new_rows_and_shrinking_truncates() {
    let (mut engine, rooms) = engine_with_rooms(100);
    let mut sink = CollectingSink::new();
    let window = engine.open_window(rooms, &by_recency(Filter::True), 0, 20, &mut sink).unwrap();
    sink.diffs.clear();
    engine.set_window_range(window, 0, 40, &mut sink).unwrap();
    let diffs = sink.take_for(window);
    assert!(matches!(&diffs[..], [OwnedDiff::Append { values }] if values.len() == 20), "{diffs:?}");
    if let OwnedDiff::Append { values } = &diffs[0] {
        assert_eq!(ids(values)[0], "room079");
    }
    engine.set_window_range(window, 0, 25, &mut sink).unwrap();
    assert_eq!(sink.take_for(window), [OwnedDiff::Truncate { length: 25 }]);
    // Scrolling by one: one row leaves at the front, one enters at the back.
    engine.set_window_range(window, 1, 25, &mut sink).unwrap();
    let diffs = sink.take_for(window);
    assert!(
        matches!(&diffs[..], [OwnedDiff::PopFront, OwnedDiff::Append { values }] if values.len() == 1),
        "{diffs:?}"
    );
    // A jump far away shares nothing: a Reset is the smallest diff.
    engine.set_window_range(window, 60, 25, &mut sink).unwrap();
    assert!(matches!(&sink.take_for(window)[..], [OwnedDiff::Reset { values }] if values.len() == 25));
    // Unchanged range: nothing at all.
    engine.set_window_range(window, 60, 25, &mut sink).unwrap();
    assert!(sink.take_for(window).is_empty());
}

#[test]
fn repointing_to_a_close_filter_or_sort_sends_a_few_diffs() {
    let (mut engine, rooms) = engine_with_rooms(100);
    let mut sink = CollectingSink::new();
    let window = engine.open_window(rooms, &by_recency(Filter::True), 0, 20, &mut sink).unwrap();
    sink.diffs.clear();
    // Excluding one room of the window: it leaves, the next one enters at the end.
    let without_room_90 = Filter::Not(Box::new(Filter::eq("recency", OwnedValue::U64(90))));
    engine.set_window_view(window, &by_recency(without_room_90), &mut sink).unwrap();
    let diffs = sink.take_for(window);
    assert!(
        matches!(&diffs[..], [OwnedDiff::Remove { index: 9 }, OwnedDiff::Append { values }] if values.len() == 1),
        "{diffs:?}"
    );
    // Back to all rooms, under another sort that orders them the same way (is_local
    // is null everywhere): room 90 comes back at index 9, room 79 leaves the end.
    let same_order_other_sort = ViewDef::new(Filter::True, vec![SortKey::desc("is_local"), SortKey::desc("recency")]);
    engine.set_window_view(window, &same_order_other_sort, &mut sink).unwrap();
    let diffs = sink.take_for(window);
    assert!(
        matches!(&diffs[..], [OwnedDiff::Truncate { length: 19 }, OwnedDiff::Insert { index: 9, value }] if value.id == "room090"),
        "{diffs:?}"
    );
    let items = engine.window_items(window).unwrap();
    assert_eq!(ids(&items)[..3], ["room099", "room098", "room097"]);
}

#[test]
fn emit_window_reset_sends_the_current_contents_after_updates() {
    let (mut engine, rooms) = engine_with_rooms(50);
    let mut sink = CollectingSink::new();
    let window = engine.open_window(rooms, &by_recency(Filter::True), 5, 10, &mut sink).unwrap();
    let mut batch = Batch::new();
    batch.upsert("room001").set("recency", Value::U64(1_000));
    batch.remove("room040");
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    sink.diffs.clear();
    engine.emit_window_reset(window, &mut sink).unwrap();
    let diffs = sink.take_for(window);
    let expected = engine.window_items(window).unwrap();
    assert!(matches!(&diffs[..], [OwnedDiff::Reset { values }] if *values == expected), "{diffs:?}");
    // room001 went to the top, so rank 5 is room045 (room001, 049, 048, 047, 046, 045).
    assert_eq!(ids(&expected)[0], "room045");
    assert!(!ids(&expected).contains(&"room040"));
    engine.close_window(window).unwrap();
    assert!(engine.emit_window_reset(window, &mut sink).is_err());
}
