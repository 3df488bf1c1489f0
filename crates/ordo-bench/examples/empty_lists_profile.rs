//! A driver for profiling the fixed heap of many empty lists (one collection,
//! view and window each, as in `many-lists`): `cargo build --release -p
//! ordo-bench --example empty_lists_profile`, then `valgrind --tool=dhat
//! target/release/examples/empty_lists_profile N`; the heap at its peak over N
//! is the bytes per list, and the profile names who holds them. `N unkeyed`
//! measures the same lists with views that are never keyed by their equality.

use ordo_bench::data::RoomFilter;
use ordo_bench::ordo_system::{room_list_def, room_schema};
use ordo_core::{DiffRef, DiffSink, Engine, WindowId};

struct NoSink;

impl DiffSink for NoSink {
    fn diff(&mut self, _: WindowId, _: DiffRef<'_>) {}
}

fn main() {
    let n: usize = std::env::args().nth(1).map_or(2_000, |a| a.parse().expect("a number"));
    let is_unkeyed = std::env::args().nth(2).is_some_and(|a| a == "unkeyed");
    let (schema, def) = (room_schema(), room_list_def(RoomFilter::NotLeft));
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
