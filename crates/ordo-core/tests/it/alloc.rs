//! Zero heap allocations per update in steady state, counted by a global allocator.
//! This is a property of the code, not a timing: it holds on any machine.

use ordo_core::{
    Batch, CompareOp, DiffRef, DiffSink, Engine, Filter, ItemList, OwnedValue, SortKey, Value, ViewDef, WindowId,
};

use crate::reference::Rng;

/// The allocator `main.rs` installs counts per thread, so tests running in
/// parallel threads do not disturb each other's counts.
pub use ordo_test_kit::alloc::{allocations_on_this_thread, heap_bytes_on_this_thread, CountingAllocator};
pub use ordo_test_kit::room_schema;

/// Reads every diff's borrowed data, as a server encoding frames would.
#[derive(Default)]
pub struct ReadingSink {
    pub n_diffs: u64,
    n_bytes_seen: u64,
}

impl DiffSink for ReadingSink {
    fn diff(&mut self, _window: WindowId, diff: DiffRef<'_>) {
        self.n_diffs += 1;
        match diff {
            DiffRef::Insert { value, .. }
            | DiffRef::Set { value, .. }
            | DiffRef::PushFront { value }
            | DiffRef::PushBack { value } => {
                self.n_bytes_seen += (value.id().len() + value.payload().len()) as u64;
            }
            DiffRef::Append { values } | DiffRef::Reset { values } => {
                self.n_bytes_seen += values.iter().map(|item| item.payload().len() as u64).sum::<u64>();
            }
            _ => {}
        }
    }

    // Asks for every window's contents, as a server computing window digests does:
    // reading them must allocate nothing either.
    fn wants_contents(&mut self, _window: WindowId, _limit: usize) -> bool {
        true
    }

    fn window_contents(&mut self, _window: WindowId, items: ItemList<'_>) {
        self.n_bytes_seen += items.iter().map(|item| item.id().len() as u64 + item.version()).sum::<u64>();
    }
}

pub fn room_list_def() -> ViewDef {
    ViewDef::new(
        Filter::eq("left", OwnedValue::Bool(false)),
        vec![SortKey::desc("is_local"), SortKey::desc("recency"), SortKey::asc("name")],
    )
}

#[test]
fn room_list_updates_allocate_nothing_in_steady_state() {
    let n_rooms = 5_000;
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", room_schema()).unwrap();
    let mut rng = Rng(42);
    let mut batch = Batch::new();
    let ids: Vec<String> = (0..n_rooms).map(|n| format!("!room{n:08}:example.org")).collect();
    for (n, id) in ids.iter().enumerate() {
        let name: String = (0..12 + rng.below(9)).map(|_| (b'a' + rng.below(26) as u8) as char).collect();
        batch
            .upsert(id)
            .set("name", Value::Str(&name))
            .set("recency", Value::U64(rng.below(1_000_000_000) as u64))
            .set("is_local", Value::Bool(n < 4))
            .set("left", Value::Bool(rng.chance(5)))
            .set("unread", Value::U64(0))
            .set("is_dm", Value::Bool(rng.chance(30)))
            .set("favourite", Value::Bool(rng.chance(5)))
            .payload(&[b'p'; 200]);
    }
    let mut sink = ReadingSink::default();
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    // Several windows on the one view, including one past the end and an empty one.
    let windows = [(0, 20), (20, 20), (4_990, 20), (0, 0), (100_000, 5)];
    for (offset, limit) in windows {
        engine.open_window(rooms, &room_list_def(), offset, limit, &mut sink).unwrap();
    }

    let mut recency = 2_000_000_000u64;
    let mut preview = [b'm'; 210];
    let mut run_updates = |engine: &mut Engine, batch: &mut Batch, sink: &mut ReadingSink, n: usize| {
        for _ in 0..n {
            recency += 1;
            preview[0] = b'a' + (recency % 26) as u8;
            batch.clear();
            batch.upsert(&ids[rng.below(n_rooms)]).set("recency", Value::U64(recency)).payload(&preview);
            engine.apply_batch(rooms, batch, sink).unwrap();
        }
    };
    // Warm-up: buffers, node arenas and per-slot strings reach their working size.
    run_updates(&mut engine, &mut batch, &mut sink, 20_000);
    let n_diffs_before = sink.n_diffs;
    let before = allocations_on_this_thread();
    run_updates(&mut engine, &mut batch, &mut sink, 20_000);
    let allocations = allocations_on_this_thread() - before;
    assert!(sink.n_diffs > n_diffs_before, "the updates produced no diffs: the test measured nothing");
    assert_eq!(allocations, 0, "heap allocations during 20 000 steady-state updates");
}

#[test]
fn the_counter_sees_allocations() {
    // Guards the test above against a counter that never counts.
    let before = allocations_on_this_thread();
    let boxed = std::hint::black_box(Box::new([0u8; 64]));
    drop(boxed);
    assert_eq!(allocations_on_this_thread() - before, 1);
}

/// Updates on a collection shared by 1 000 users, each with a view under a row
/// predicate (`owner == user`), plus an unkeyed view: recency changes, items
/// moving between owners, removes and re-creations. The equality index, the
/// visited-view list and the keyed views' trees all reach their working size in
/// the warm-up; then nothing allocates.
#[test]
fn keyed_view_updates_allocate_nothing_in_steady_state() {
    use crate::keyed_views::{item_id, shared_collection, user_def, user_name, N_USERS};

    let mut engine = Engine::new();
    let collection = shared_collection(&mut engine);
    let mut sink = ReadingSink::default();
    for user in 0..N_USERS {
        engine.open_window(collection, &user_def(user), 0, 20, &mut sink).unwrap();
    }
    let everything = ViewDef::new(Filter::True, vec![SortKey::desc("recency")]);
    engine.open_window(collection, &everything, 0, 20, &mut sink).unwrap();
    // A tail window slides as removes and re-creations change the view's length.
    engine.open_window_at(collection, &everything, ordo_core::WindowAnchor::Tail, 20, &mut sink).unwrap();
    assert_eq!(engine.stats().n_keyed_views, N_USERS);
    let n_items = engine.collection(collection).unwrap().len();
    let ids: Vec<String> = (0..n_items).map(item_id).collect();
    let names: Vec<String> = (0..N_USERS).map(user_name).collect();

    let mut rng = Rng(7);
    let mut batch = Batch::new();
    let mut recency = 1_000_000u64;
    let mut run_updates = |engine: &mut Engine, batch: &mut Batch, sink: &mut ReadingSink, n: usize| {
        for _ in 0..n {
            recency += 1;
            batch.clear();
            let id = &ids[rng.below(n_items)];
            match rng.below(10) {
                0..=5 => {
                    batch.upsert(id).set("recency", Value::U64(recency)).payload(b"new message");
                }
                6..=8 => {
                    let owner = &names[rng.below(N_USERS)];
                    batch.upsert(id).set("owner", Value::Str(owner)).set("recency", Value::U64(recency));
                }
                _ => {
                    // Removed and created again in one batch: the slot is recycled at the next batch.
                    batch.remove(id);
                    batch.upsert(id).set("owner", Value::Str(&names[rng.below(N_USERS)]));
                }
            }
            engine.apply_batch(collection, batch, sink).unwrap();
        }
    };
    run_updates(&mut engine, &mut batch, &mut sink, 30_000);
    let n_diffs_before = sink.n_diffs;
    let n_visits_before = engine.stats().n_view_visits;
    let before = allocations_on_this_thread();
    run_updates(&mut engine, &mut batch, &mut sink, 20_000);
    let allocations = allocations_on_this_thread() - before;
    assert!(sink.n_diffs > n_diffs_before, "the updates produced no diffs: the test measured nothing");
    // At most the unkeyed view and two keyed ones per operation (a remove and an upsert in some batches).
    let n_visits = engine.stats().n_view_visits - n_visits_before;
    assert!(n_visits <= 20_000 * 2 * 3, "{n_visits} view visits for 20 000 batches");
    assert_eq!(allocations, 0, "heap allocations during 20 000 steady-state updates");
}

/// Collated sorts and accent-insensitive filters, as a people directory would use
/// them: renames (precomposed, decomposed, non-ASCII, longer than the column's
/// head) and recency bumps. Collators are built with the view, the sort key head is
/// written into an array, and the filter folds non-ASCII names into the engine's
/// scratch, so once that scratch has grown nothing allocates.
///
/// Long names in two normalization forms tie on their sort key heads and are
/// compared in full: the collation's NFC buffers keep ICU from buffering both
/// whole. Not covered, because it does allocate: two long NFC names equal at the
/// primary level for more than 7 collation elements past their first difference
/// (a long name and its upper-case spelling). ICU buffers those elements in an
/// 8-element `SmallVec`, which spills to the heap, once per such comparison.
#[test]
fn collated_view_updates_allocate_nothing_in_steady_state() {
    const NAMES: [&str; 10] = [
        "Émile Zola, a name longer than the column's head",
        "E\u{301}mile Zola, a name longer than the column's head",
        "emile",
        "Öberg",
        "O\u{308}berg",
        "Zorn",
        "Müller",
        "Mueller",
        "Łódź",
        "plain ascii name",
    ];
    let n_people = 2_000;
    let mut engine = Engine::new();
    let people = engine.create_collection("people", room_schema()).unwrap();
    let mut rng = Rng(5);
    let mut batch = Batch::new();
    let ids: Vec<String> = (0..n_people).map(|n| format!("person-{n:05}")).collect();
    // Every name starts as the longest one, so that each slot's string buffer is
    // already as large as any rename makes it.
    let longest = NAMES.iter().max_by_key(|name| name.len()).unwrap();
    for (n, id) in ids.iter().enumerate() {
        batch
            .upsert(id)
            .set("name", Value::Str(longest))
            .set("recency", Value::U64(n as u64))
            .set("left", Value::Bool(false));
    }
    let mut sink = ReadingSink::default();
    engine.apply_batch(people, &batch, &mut sink).unwrap();
    let defs = [
        ViewDef::new(Filter::True, vec![SortKey::asc("name").collated("fr")]),
        ViewDef::new(
            Filter::True,
            vec![SortKey::desc("name").collated("sv").case_insensitive(), SortKey::desc("recency")],
        ),
        ViewDef::new(Filter::contains("name", "emile").accent_insensitive(), vec![SortKey::asc("name").collated("de")]),
        ViewDef::new(Filter::prefix("name", "ob").accent_insensitive(), vec![SortKey::desc("recency")]),
    ];
    for def in &defs {
        engine.open_window(people, def, 0, 20, &mut sink).unwrap();
    }

    let mut recency = 1_000_000u64;
    let mut run_updates = |engine: &mut Engine, batch: &mut Batch, sink: &mut ReadingSink, n: usize| {
        for _ in 0..n {
            recency += 1;
            batch.clear();
            let id = &ids[rng.below(n_people)];
            if rng.chance(50) {
                batch.upsert(id).set("name", Value::Str(NAMES[rng.below(NAMES.len())]));
            } else {
                batch.upsert(id).set("recency", Value::U64(recency));
            }
            engine.apply_batch(people, batch, sink).unwrap();
        }
    };
    run_updates(&mut engine, &mut batch, &mut sink, 20_000);
    let n_diffs_before = sink.n_diffs;
    let before = allocations_on_this_thread();
    run_updates(&mut engine, &mut batch, &mut sink, 20_000);
    let allocations = allocations_on_this_thread() - before;
    assert!(sink.n_diffs > n_diffs_before, "the updates produced no diffs: the test measured nothing");
    assert_eq!(allocations, 0, "heap allocations during 20 000 steady-state updates of collated views");
}

/// Shared rooms and one membership collection keyed by owner (the `shared-rooms`
/// layout): a new message is one update of a room, which moves that room in the
/// list of every member (here up to 200 lists) and flips it into each member's
/// "unread" list (`room.recency > unread`, the membership's `unread` standing for
/// the position read up to); marking a room read flips it out again, and a
/// reference changing room relinks it. None of these allocates once the
/// engine's buffers have grown.
#[test]
fn reference_target_updates_allocate_nothing_in_steady_state() {
    const N_ROOMS: usize = 200;
    const N_USERS: usize = 300;
    const ROOMS_PER_USER: usize = 20;
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", crate::ref_fields::rooms_schema()).unwrap();
    let members = engine.create_collection("members", crate::ref_fields::members_schema(rooms)).unwrap();
    let mut sink = ReadingSink::default();
    let mut batch = Batch::new();
    let room_ids: Vec<String> = (0..N_ROOMS).map(|room| format!("!room{room}:example.org")).collect();
    for (index, id) in room_ids.iter().enumerate() {
        // With a first preview: a room's first payload allocates its buffer, once.
        let name = format!("room {index}");
        batch.upsert(id).set("name", Value::Str(&name)).set("recency", Value::U64(index as u64)).payload(b"created");
    }
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    let mut rng = Rng(11);
    let owners: Vec<String> = (0..N_USERS).map(|user| format!("@user{user}:example.org")).collect();
    let mut member_ids = Vec::new();
    batch.clear();
    for owner in &owners {
        let mut rooms_of_user = vec![0];
        while rooms_of_user.len() < ROOMS_PER_USER {
            // Room sizes skewed: low-numbered rooms have many members (room 0: all of them).
            let room = rng.below(N_ROOMS).min(rng.below(N_ROOMS));
            if !rooms_of_user.contains(&room) {
                rooms_of_user.push(room);
            }
        }
        for (slot, &room) in rooms_of_user.iter().enumerate() {
            let id = format!("{owner}/{slot}");
            // Read up to 0: every room but room 0 (recency 0) starts unread.
            batch
                .upsert(&id)
                .set("owner", Value::Str(owner))
                .set("room", Value::Str(&room_ids[room]))
                .set("unread", Value::U64(0));
            member_ids.push(id);
        }
    }
    engine.apply_batch(members, &batch, &mut sink).unwrap();
    for owner in &owners {
        let def =
            ViewDef::new(Filter::eq("owner", OwnedValue::Str(owner.clone())), vec![SortKey::desc("room.recency")]);
        engine.open_window(members, &def, 0, 10, &mut sink).unwrap();
        let unread = ViewDef::new(
            Filter::All(vec![
                Filter::eq("owner", OwnedValue::Str(owner.clone())),
                Filter::compare_fields("room.recency", CompareOp::Gt, "unread"),
            ]),
            vec![SortKey::desc("room.recency")],
        );
        engine.open_window(members, &unread, 0, 10, &mut sink).unwrap();
    }

    let mut recency = 1_000u64;
    let mut run_updates = |engine: &mut Engine, batch: &mut Batch, sink: &mut ReadingSink, n: usize| {
        for _ in 0..n {
            recency += 1;
            batch.clear();
            if rng.below(20) == 0 {
                // Two memberships of one user swap rooms, so that room sizes (and with
                // them the windows a batch touches) do not drift to new highs, and a
                // user is in a room once (as in chat), so a window's diffs per batch stay bounded.
                let user = rng.below(N_USERS);
                let first = user * ROOMS_PER_USER + rng.below(ROOMS_PER_USER);
                let second = user * ROOMS_PER_USER + rng.below(ROOMS_PER_USER);
                let room_of = |engine: &Engine, index: usize| {
                    let item = engine.collection(members).unwrap().get(&member_ids[index]).unwrap();
                    let Some(Value::Str(room)) = item.field_by_name("room") else { unreachable!() };
                    room_ids.iter().position(|id| id == room).unwrap()
                };
                let (first_room, second_room) = (room_of(engine, first), room_of(engine, second));
                batch.upsert(&member_ids[first]).set("room", Value::Str(&room_ids[second_room]));
                batch.upsert(&member_ids[second]).set("room", Value::Str(&room_ids[first_room]));
                engine.apply_batch(members, batch, sink).unwrap();
            } else if rng.below(4) == 0 {
                // Mark as read: the membership reads up to the latest message.
                let member = &member_ids[rng.below(member_ids.len())];
                batch.upsert(member).set("unread", Value::U64(recency));
                engine.apply_batch(members, batch, sink).unwrap();
            } else {
                let room = rng.below(N_ROOMS).min(rng.below(N_ROOMS));
                batch.upsert(&room_ids[room]).set("recency", Value::U64(recency)).payload(b"new message");
                engine.apply_batch(rooms, batch, sink).unwrap();
            }
        }
    };
    run_updates(&mut engine, &mut batch, &mut sink, 5_000);
    let n_diffs_before = sink.n_diffs;
    let before = allocations_on_this_thread();
    run_updates(&mut engine, &mut batch, &mut sink, 5_000);
    let allocations = allocations_on_this_thread() - before;
    assert!(sink.n_diffs > n_diffs_before + 5_000, "the updates produced few diffs: the test measured nothing");
    assert_eq!(allocations, 0, "heap allocations during 5 000 steady-state room and reference updates");
}

/// A message reaching more lists than any message before it (a larger room than
/// any yet messaged, as a benchmark's first message to its largest room) still
/// allocates nothing: the buffers a refresh fills (the referencing slots, the
/// windows touched) are sized when memberships and windows are made, not grown
/// by the message.
#[test]
fn a_message_to_the_largest_room_yet_allocates_nothing() {
    const N_ROOMS: usize = 40;
    const N_USERS: usize = 400;
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", crate::ref_fields::rooms_schema()).unwrap();
    let members = engine.create_collection("members", crate::ref_fields::members_schema(rooms)).unwrap();
    let mut sink = ReadingSink::default();
    let mut batch = Batch::new();
    let room_ids: Vec<String> = (0..N_ROOMS).map(|room| format!("!room{room}:example.org")).collect();
    let preview = [b'p'; 200];
    for (index, id) in room_ids.iter().enumerate() {
        batch.upsert(id).set("name", Value::Str(id)).set("recency", Value::U64(index as u64)).payload(&preview);
    }
    engine.apply_batch(rooms, &batch, &mut sink).unwrap();
    // Room r has 10·(r + 1) members: users 0 to 10·r + 9.
    batch.clear();
    for (room, room_id) in room_ids.iter().enumerate() {
        for user in 0..10 * (room + 1) {
            let owner = format!("@user{user}");
            batch.upsert(&format!("{owner}/{room}")).set("owner", Value::Str(&owner)).set("room", Value::Str(room_id));
        }
    }
    engine.apply_batch(members, &batch, &mut sink).unwrap();
    for user in 0..N_USERS {
        let def = ViewDef::new(
            Filter::eq("owner", OwnedValue::Str(format!("@user{user}"))),
            vec![SortKey::desc("room.recency")],
        );
        let window = engine.open_window(members, &def, 0, 5, &mut sink).unwrap();
        // Each view's full index now, as a server's first update would build it.
        engine.prepare_window(window).unwrap();
    }
    let mut recency = 1_000u64;
    let mut message = |engine: &mut Engine, sink: &mut ReadingSink, room: usize| {
        recency += 1;
        batch.clear();
        batch.upsert(&room_ids[room]).set("recency", Value::U64(recency)).payload(&preview);
        engine.apply_batch(rooms, &batch, sink).unwrap();
    };
    // Warm-up: the two smallest rooms, twice.
    for room in [0, 1, 0, 1] {
        message(&mut engine, &mut sink, room);
    }
    let n_diffs_before = sink.n_diffs;
    let before = allocations_on_this_thread();
    for room in 2..N_ROOMS {
        message(&mut engine, &mut sink, room);
    }
    let allocations = allocations_on_this_thread() - before;
    assert!(sink.n_diffs > n_diffs_before + 8_000, "the messages reached few lists: the test measured nothing");
    assert_eq!(allocations, 0, "heap allocations by messages to ever larger rooms");
}
