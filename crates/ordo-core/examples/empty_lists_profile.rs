//! A driver for profiling the fixed heap of many empty lists (one collection,
//! view and window each, as in `many-lists`): `cargo build --release -p
//! ordo-core --examples`, then `valgrind --tool=dhat
//! target/release/examples/empty_lists_profile N`; the heap at its peak over N
//! is the bytes per list, and the profile names who holds them. `N unkeyed`
//! measures the same lists with views that are not keyed by their equality.

use ordo_core::{Engine, FieldType, Filter, OwnedValue, Schema, SortKey, ViewDef};

struct NoSink;
impl ordo_core::DiffSink for NoSink {
    fn diff(&mut self, _: ordo_core::WindowId, _: ordo_core::DiffRef<'_>) {}
}

fn main() {
    let n: usize = std::env::args().nth(1).map_or(2_000, |a| a.parse().expect("a number"));
    // `unkeyed`: the views filter the collection instead of being keyed by
    // `left == false` (what the equality index costs a one-view collection).
    let is_unkeyed = std::env::args().nth(2).is_some_and(|a| a == "unkeyed");
    let schema = Schema::new()
        .with_field("name", FieldType::String)
        .with_field("recency", FieldType::U64)
        .with_field("is_local", FieldType::Bool)
        .with_field("left", FieldType::Bool)
        .with_field("unread", FieldType::U64)
        .with_field("is_dm", FieldType::Bool)
        .with_field("favourite", FieldType::Bool);
    let def = ViewDef::new(
        Filter::eq("left", OwnedValue::Bool(false)),
        vec![SortKey::desc("is_local"), SortKey::desc("recency"), SortKey::asc("name")],
    );
    let mut engine = Engine::new();
    engine.set_view_keying(!is_unkeyed);
    let mut sink = NoSink;
    for list in 0..n {
        let collection = engine.create_collection(&format!("user{list}"), schema.clone()).unwrap();
        let window = engine.open_window(collection, &def, 0, 20, &mut sink).unwrap();
        engine.prepare_window(window).unwrap();
    }
    println!("{n} lists");
}
