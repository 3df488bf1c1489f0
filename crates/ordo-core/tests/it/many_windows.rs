//! Thousands of windows on one view stay exact under a stream of updates: each
//! window rebuilt from its own diffs equals the reference slice.

use std::collections::HashMap;

use ordo_core::{Batch, CollectingSink, Engine, OwnedDiff, OwnedItem, Value, WindowId};

use crate::alloc::{room_list_def, room_schema};
use crate::reference::{ReferenceCollection, Rng};

#[test]
fn two_thousand_windows_follow_a_stream_of_new_messages() {
    let n_rooms = 3_000;
    let mut engine = Engine::new();
    let schema = room_schema();
    let rooms = engine.create_collection("rooms", schema.clone()).unwrap();
    let mut reference = ReferenceCollection::default();
    let mut rng = Rng(11);
    let mut batch = Batch::new();
    let mut sink = CollectingSink::new();
    let ids: Vec<String> = (0..n_rooms).map(|n| format!("!room{n:08}:example.org")).collect();
    for id in &ids {
        let name: String = (0..12 + rng.below(9)).map(|_| (b'a' + rng.below(26) as u8) as char).collect();
        let recency = rng.below(1_000_000) as u64;
        let left = rng.chance(5);
        batch
            .upsert(id)
            .set("name", Value::Str(&name))
            .set("recency", Value::U64(recency))
            .set("left", Value::Bool(left));
    }
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    for item in engine.collection(rooms).unwrap().items() {
        reference.items.insert(item.id().to_owned(), item.to_owned_item());
    }
    // Windows every 3 ranks, of various sizes, some past the end.
    let mut windows: Vec<(WindowId, usize, usize, Vec<OwnedItem>)> = Vec::new();
    for k in 0..2_000 {
        let (offset, limit) = (k * 3 % 3_100, 1 + k % 25);
        let id = engine.open_window(rooms, &room_list_def(), offset, limit, &mut sink).unwrap();
        windows.push((id, offset, limit, Vec::new()));
    }
    let mut recency = 2_000_000u64;
    for step in 0..300 {
        if step > 0 {
            batch.clear();
            // Mostly new messages; sometimes a room is left or removed.
            for _ in 0..1 + rng.below(3) {
                let id = &ids[rng.below(n_rooms)];
                recency += 1;
                match rng.below(10) {
                    0 => batch.remove(id),
                    1 => {
                        batch.upsert(id).set("left", Value::Bool(rng.chance(50)));
                    }
                    _ => {
                        batch.upsert(id).set("recency", Value::U64(recency)).payload(b"new message");
                    }
                }
            }
            engine.apply_batch(rooms, &batch, &mut sink).unwrap();
            reference.items.clear();
            for item in engine.collection(rooms).unwrap().items() {
                reference.items.insert(item.id().to_owned(), item.to_owned_item());
            }
        }
        let mut by_window: HashMap<WindowId, Vec<OwnedDiff>> = HashMap::new();
        for (id, diff) in sink.diffs.drain(..) {
            by_window.entry(id).or_default().push(diff);
        }
        for (id, _, _, items) in &mut windows {
            for diff in by_window.remove(id).unwrap_or_default() {
                diff.apply(items);
            }
        }
        if step % 30 == 0 || step == 299 {
            let view = reference.view(&schema, &room_list_def());
            for (id, offset, limit, items) in &windows {
                let expected: Vec<OwnedItem> = view.iter().skip(*offset).take(*limit).cloned().collect();
                assert_eq!(items, &expected, "step {step}: window {id:?} at offset {offset}, limit {limit}");
            }
        }
    }
}
