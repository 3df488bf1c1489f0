//! Memory per membership in the `shared-rooms` layout: one shared membership
//! collection keyed by owner, a `ref` to the room, each user's list sorted by
//! `room.recency`. Prints the breakdown (`cargo test -p ordo-core --test it
//! ref_memory -- --nocapture`) and bounds what references add per membership.

use ordo_core::{Batch, Engine, Filter, NullSink, OwnedValue, SortKey, Value, ViewDef};

#[test]
fn memory_per_membership() {
    const N_ROOMS: usize = 2_000;
    const N_USERS: usize = 1_000;
    const ROOMS_PER_USER: usize = 100;
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", crate::ref_fields::rooms_schema()).unwrap();
    let members = engine.create_collection("members", crate::ref_fields::members_schema(rooms)).unwrap();
    let mut batch = Batch::new();
    let room_id = |room: usize| format!("!r{room}:example.org");
    for room in 0..N_ROOMS {
        batch.upsert(&room_id(room)).set("name", Value::Str("a room")).set("recency", Value::U64(room as u64));
    }
    engine.apply_batch(rooms, &batch, &mut NullSink).unwrap();
    batch.clear();
    for user in 0..N_USERS {
        let owner = format!("@u{user}");
        for index in 0..ROOMS_PER_USER {
            let room = room_id((user * 7 + index * 13) % N_ROOMS);
            batch.upsert(&format!("{owner}/{index}")).set("owner", Value::Str(&owner)).set("room", Value::Str(&room));
        }
    }
    engine.apply_batch(members, &batch, &mut NullSink).unwrap();
    let n_memberships = N_USERS * ROOMS_PER_USER;
    let collection_before = engine.collection(members).unwrap().heap_bytes();
    let mut view_bytes = 0;
    for user in 0..N_USERS {
        let def = ViewDef::new(
            Filter::eq("owner", OwnedValue::Str(format!("@u{user}"))),
            vec![SortKey::desc("room.recency")],
        );
        let window = engine.open_window(members, &def, 0, 20, &mut NullSink).unwrap();
        engine.prepare_window(window).unwrap();
        view_bytes += engine.view_heap_bytes(window).unwrap();
    }
    let collection_after = engine.collection(members).unwrap().heap_bytes();
    let reverse_index = engine.reference_heap_bytes(members);
    // The owner key's equality index: two links per membership and a table entry per owner.
    let equality_index = engine.equality_index_heap_bytes(members);
    let per = |bytes: usize| bytes as f64 / n_memberships as f64;
    for (part, bytes) in engine.collection(members).unwrap().heap_parts() {
        println!("  {part}: {:.1} B per membership", per(bytes));
    }
    println!(
        "per membership: item {:.1} B (before views), derived column {:.1} B, reverse index {:.1} B, \
         equality index (owner) {:.1} B, view entry {:.1} B; total {:.1} B",
        per(collection_before),
        per(collection_after - collection_before),
        per(reverse_index),
        per(equality_index),
        per(view_bytes),
        per(collection_after + reverse_index + equality_index + view_bytes),
    );
    // The owner's two links (8 B) are counted, and little else: one table entry per owner.
    let links = per(equality_index);
    assert!((8.0..=12.0).contains(&links), "the equality index holds {links:.1} B per membership");
    // What references add per membership: the derived u64 column (8 B and a null
    // bit) and the reverse index's two slot links (8 B), plus table slack.
    let added = per(collection_after - collection_before + reverse_index);
    assert!(added <= 24.0, "references add {added:.1} B per membership");
}
