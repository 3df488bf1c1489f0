//! Many small lists: one collection per user, one view and window each (the
//! `many-lists` benchmark's layout). Two properties of the code, not timings:
//! the first update that reaches a collection allocates nothing, and an empty
//! collection with its view and window costs at most `FIXED_HEAP_BYTES_MAX` of heap.

use ordo_core::{Batch, CollectionId, Engine, Value};

use crate::alloc::{allocations_on_this_thread, heap_bytes_on_this_thread, room_list_def, room_schema, ReadingSink};
use crate::reference::Rng;

/// 1 KiB, so that a million users' lists fit on one node.
/// History: 4 352 B before the fixed heap was measured, 2 431 B after the first cuts, 2 675 B
/// with reference fields' per-collection state, 1 668 B with schemas and view plans
/// shared engine-wide, 1 560 B with thin vectors for what most collections leave
/// empty, 1 284 B with a lone view left unkeyed, 1 219 B with the name index holding
/// no copy of the names, 995 B with 48-byte column headers, about 960 B with a
/// boxed node tree and the engine's tables grown by an eighth (see
/// `docs/BENCHMARKS.md`, `many-lists`).
const FIXED_HEAP_BYTES_MAX: f64 = 1_024.0;
/// Rooms per list, lists per room (as in `many-lists`).
const ROOMS_PER_LIST: usize = 100;
const LISTS_PER_ROOM: usize = 50;

fn room_id(room: usize) -> String {
    format!("!room{room:08}:example.org")
}

fn add_room(batch: &mut Batch, room: usize, rng: &mut Rng) {
    let name: String = (0..12 + rng.below(9)).map(|_| (b'a' + rng.below(26) as u8) as char).collect();
    let payload = vec![b'p'; 180 + rng.below(41)];
    batch
        .upsert(&room_id(room))
        .set("name", Value::Str(&name))
        .set("recency", Value::U64(rng.below(1_000_000_000) as u64))
        .set("is_local", Value::Bool(false))
        .set("left", Value::Bool(rng.chance(5)))
        .set("unread", Value::U64(0))
        .set("is_dm", Value::Bool(rng.chance(30)))
        .set("favourite", Value::Bool(rng.chance(5)))
        .payload(&payload);
}

/// `n_lists` users' lists of `ROOMS_PER_LIST` rooms, each room in `LISTS_PER_ROOM`
/// lists; returns the engine, the collections and, per room, its lists.
fn many_lists(n_lists: usize) -> (Engine, Vec<CollectionId>, Vec<Vec<usize>>) {
    let n_rooms = n_lists * ROOMS_PER_LIST / LISTS_PER_ROOM;
    let mut rng = Rng(17);
    let mut engine = Engine::new();
    let mut batch = Batch::new();
    let mut sink = ReadingSink::default();
    let mut lists_of_room = vec![Vec::new(); n_rooms];
    let mut collections = Vec::with_capacity(n_lists);
    for list in 0..n_lists {
        let collection = engine.create_collection(&format!("user{list}"), room_schema()).unwrap();
        batch.clear();
        // Round `list / (n_lists / LISTS_PER_ROOM)` deals out every room once.
        let first_room = (list % (n_lists / LISTS_PER_ROOM)) * ROOMS_PER_LIST;
        for (room, lists) in lists_of_room.iter_mut().enumerate().skip(first_room).take(ROOMS_PER_LIST) {
            add_room(&mut batch, room, &mut rng);
            lists.push(list);
        }
        engine.apply_batch(collection, &batch, &mut sink).unwrap();
        let window = engine.open_window(collection, &room_list_def(), 0, 20, &mut sink).unwrap();
        engine.prepare_window(window).unwrap();
        collections.push(collection);
    }
    (engine, collections, lists_of_room)
}

/// The benchmark's pattern: each new message updates its room in all of its
/// lists, and almost every update reaches a list for the first time. Nothing may
/// allocate there: not a first diff buffer, not a first tree split, not a first
/// longer preview. A few hundred messages on a few lists warm the engine's
/// shared scratch first; the rooms then updated are in lists never touched.
#[test]
fn many_lists_first_updates_allocate_nothing() {
    let n_lists = 2_000;
    let (mut engine, collections, lists_of_room) = many_lists(n_lists);
    let mut batch = Batch::new();
    let mut sink = ReadingSink::default();
    let mut rng = Rng(99);
    let mut recency = 2_000_000_000u64;
    let mut preview = vec![b'm'; 220];
    let mut send = |engine: &mut Engine, batch: &mut Batch, sink: &mut ReadingSink, room: usize| {
        recency += 1;
        preview.truncate(180 + (recency % 41) as usize);
        preview.resize(220.min(180 + (recency % 41) as usize), b'm');
        for &list in &lists_of_room[room] {
            batch.clear();
            batch.upsert(&room_id(room)).set("recency", Value::U64(recency)).payload(&preview);
            engine.apply_batch(collections[list], batch, sink).unwrap();
        }
    };
    // Warm-up on room 0's lists only (its id string is built outside the count).
    for _ in 0..200 {
        send(&mut engine, &mut batch, &mut sink, 0);
    }
    // Rooms of the second round's first lists never share a list with room 0.
    let rooms: Vec<usize> =
        (0..400).map(|_| ROOMS_PER_LIST + rng.below(lists_of_room.len() - ROOMS_PER_LIST)).collect();
    let ids: Vec<String> = rooms.iter().map(|&room| room_id(room)).collect();
    let n_diffs_before = sink.n_diffs;
    let before = allocations_on_this_thread();
    for (&room, id) in rooms.iter().zip(&ids) {
        recency += 1;
        for &list in &lists_of_room[room] {
            batch.clear();
            batch.upsert(id).set("recency", Value::U64(recency)).payload(&preview);
            engine.apply_batch(collections[list], &batch, &mut sink).unwrap();
        }
    }
    let allocations = allocations_on_this_thread() - before;
    assert!(sink.n_diffs > n_diffs_before, "the updates produced no diffs: the test measured nothing");
    assert_eq!(allocations, 0, "heap allocations during {} list updates", rooms.len() * LISTS_PER_ROOM);
}

/// The fixed heap of a user's list: an empty collection with the room-list view
/// and one window, averaged over many (so the engine's own tables, which grow
/// with the number of collections, count too).
#[test]
fn an_empty_list_has_a_bounded_fixed_heap() {
    // Just past a power of two: tables that doubled would hold almost twice the
    // structs they need here (`push_with_slack_of_an_eighth` in the engine).
    let n_lists = 2_100;
    let mut engine = Engine::new();
    let mut sink = ReadingSink::default();
    let names: Vec<String> = (0..n_lists).map(|list| format!("user{list}")).collect();
    let def = room_list_def();
    let before = heap_bytes_on_this_thread();
    for name in &names {
        let collection = engine.create_collection(name, room_schema()).unwrap();
        let window = engine.open_window(collection, &def, 0, 20, &mut sink).unwrap();
        engine.prepare_window(window).unwrap();
    }
    let bytes_per_list = (heap_bytes_on_this_thread() - before) as f64 / n_lists as f64;
    assert!(
        bytes_per_list <= FIXED_HEAP_BYTES_MAX,
        "an empty collection with one view and window holds {bytes_per_list:.0} B of heap (budget {FIXED_HEAP_BYTES_MAX})"
    );
}
