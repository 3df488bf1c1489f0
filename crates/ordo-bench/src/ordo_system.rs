//! The Ordo side of every scenario.
//!
//! Each function receives exactly the data the peers receive (the same rooms,
//! the same pre-generated update stream, the same [`OpPlan`]) and returns
//! `Some(measurement)`, or `None` where Ordo has no equivalent.
//!
//! # How to measure
//! Build everything that is not timed first, then call
//! [`time_ops`](crate::harness::time_ops) with the given `plan` and a
//! closure `|i| -> (diffs, keep)` that performs **operation `i`** and returns
//! the number of diffs it produced and anything whose drop must not be timed.
//! The harness times each call individually, counts heap allocations around
//! it, and stops per the plan. Then:
//! - one figure: `Some(samples.measurement(true))`;
//! - one figure per kind (`load-more` steps, `filter-switch` targets):
//!   `Some(samples.grouped(kinds, true))` — operation `i` is of kind
//!   `i % kinds`, so index the steps/filters with `i % len` exactly as the
//!   peers do.
//!
//! Operation `i` of a stream scenario must use `updates[i]`: `updates` holds
//! `plan.inputs()` entries and is the same slice the peers get.
//!
//! "The room-list view" is: filter `left == false`; sort `is_local` desc,
//! `recency` desc, `name` asc, `id` asc; window offset 0, limit 20
//! ([`WINDOW_LIMIT`](crate::data::WINDOW_LIMIT)). `Room` indices are stable:
//! `Update::room` is an index into the `rooms` slice (use `rooms[i].id` as the
//! key if the engine is keyed by id). Diffs count as the engine emits them
//! for the window(s) (e.g. `Remove` + `Insert` = 2).

use std::cell::RefCell;
use std::rc::Rc;

use ordo_core::{
    Batch, CollectionId, DiffRef, DiffSink, Engine, FieldType, Filter, OwnedValue, Schema, SortKey, Value, ViewDef,
    WindowId,
};

use crate::data::{CreateView, LimitStep, ManyLists, Room, RoomFilter, Update, WINDOW_LIMIT};
use crate::harness::{time_ops, Measurement, MemProbe, OpPlan};

/// Counts diffs; a server would encode them here, borrowing the item data.
#[derive(Default)]
pub(crate) struct CountingSink {
    n_diffs: usize,
}

impl DiffSink for CountingSink {
    fn diff(&mut self, _window: WindowId, diff: DiffRef<'_>) {
        // Touch the borrowed data as an encoder would, so nothing is optimised away.
        if let DiffRef::Insert { value, .. } | DiffRef::PushFront { value } | DiffRef::Set { value, .. } = diff {
            std::hint::black_box(value.payload().len());
        }
        self.n_diffs += 1;
    }
}

impl CountingSink {
    pub(crate) fn take(&mut self) -> usize {
        std::mem::take(&mut self.n_diffs)
    }
}

pub use ordo_test_kit::room_schema;

fn filter_of(filter: RoomFilter) -> Filter {
    match filter {
        RoomFilter::NotLeft => Filter::eq("left", OwnedValue::Bool(false)),
        RoomFilter::Unread => Filter::compare("unread", ordo_core::CompareOp::Gt, OwnedValue::U64(0)),
        RoomFilter::Dm => Filter::eq("is_dm", OwnedValue::Bool(true)),
        RoomFilter::NameContainsAb => Filter::contains("name", "ab"),
    }
}

/// The room-list view's sort: `is_local` desc, `recency` desc, `name` asc (then id).
fn room_list_sort() -> Vec<SortKey> {
    vec![SortKey::desc("is_local"), SortKey::desc("recency"), SortKey::asc("name")]
}

pub fn room_list_def(filter: RoomFilter) -> ViewDef {
    ViewDef::new(filter_of(filter), room_list_sort())
}

pub fn add_rooms<'a>(batch: &mut Batch, rooms: impl IntoIterator<Item = &'a Room>) {
    for room in rooms {
        batch
            .upsert(&room.id)
            .set("name", Value::Str(&room.name))
            .set("recency", Value::U64(room.recency))
            .set("is_local", Value::Bool(room.is_local))
            .set("left", Value::Bool(room.left))
            .set("unread", Value::U64(room.unread as u64))
            .set("is_dm", Value::Bool(room.is_dm))
            .set("favourite", Value::Bool(room.favourite))
            .payload(&room.payload);
    }
}

/// An engine holding one collection with all `rooms`.
pub fn engine_with_rooms(rooms: &[Room]) -> (Engine, CollectionId) {
    let mut engine = Engine::new();
    let collection = engine.create_collection("rooms", room_schema()).expect("fresh engine");
    let mut batch = Batch::new();
    // In batches of 100 000 rooms: a batch is limited to `MAX_BATCH_BYTES`.
    for chunk in rooms.chunks(100_000) {
        batch.clear();
        add_rooms(&mut batch, chunk);
        engine.apply_batch(collection, &batch, &mut CountingSink::default()).expect("valid rooms");
    }
    (engine, collection)
}

/// Applies one new-message update as a one-operation batch, reusing `batch`.
fn apply_update(
    engine: &mut Engine,
    collection: CollectionId,
    batch: &mut Batch,
    room_id: &str,
    update: &Update,
    sink: &mut CountingSink,
) {
    batch.clear();
    batch.upsert(room_id).set("recency", Value::U64(update.recency)).payload(&update.payload);
    engine.apply_batch(collection, batch, sink).expect("valid update");
}

/// Times the new-message stream: operation `i` applies `updates[i]` and drains
/// every window's diffs (shared by `new_message` and `fan_out`).
fn time_new_messages(
    engine: &mut Engine,
    collection: CollectionId,
    batch: &mut Batch,
    rooms: &[Room],
    updates: &[Update],
    plan: &OpPlan,
    sink: &mut CountingSink,
) -> crate::harness::Samples {
    time_ops(plan, |i| {
        let update = &updates[i];
        apply_update(engine, collection, batch, &rooms[update.room as usize].id, update, sink);
        (sink.take(), ())
    })
}

/// Closes a window when dropped: lets `time_ops` drop a created view untimed.
struct OpenWindow {
    engine: Rc<RefCell<Engine>>,
    window: WindowId,
}

impl Drop for OpenWindow {
    fn drop(&mut self) {
        self.engine.borrow_mut().close_window(self.window).expect("open window");
    }
}

/// **create** — the N `rooms` are already in an Ordo collection (insert them
/// *before* timing). One operation = from asking for the room-list view to
/// holding its first window: for `CreateView::Window`, define the view and
/// open a window (offset 0, limit 20) and drain the initial Reset of 20 rooms
/// (diffs = 1); for `CreateView::Full`, obtain the whole sorted view without
/// a window (return `None` if the engine has no such thing). Return the
/// created view/window as `keep` so that dropping it is not timed; each
/// operation creates a fresh view on the same collection.
pub fn create(rooms: &[Room], view: CreateView, plan: &OpPlan) -> Option<Measurement> {
    let (engine, collection) = engine_with_rooms(rooms);
    let engine = Rc::new(RefCell::new(engine));
    let def = room_list_def(RoomFilter::NotLeft);
    let mut sink = CountingSink::default();
    let samples = time_ops(plan, |_| {
        let mut engine_ref = engine.borrow_mut();
        let window = engine_ref.open_window(collection, &def, 0, WINDOW_LIMIT, &mut sink).expect("valid view");
        if view == CreateView::Full {
            // Ordo has no window-less view: "full" is the view sorted completely
            // into its index, as the first update would otherwise do.
            engine_ref.prepare_window(window).expect("open window");
        }
        drop(engine_ref);
        (sink.take(), OpenWindow { engine: engine.clone(), window })
    });
    Some(samples.measurement(true))
}

/// **new-message** — untimed: collection with the N `rooms`, the room-list
/// view, a window (0, 20), its initial Reset drained. Operation `i` = apply
/// `updates[i]` (set room `updates[i].room`'s `recency` to
/// `updates[i].recency` and its payload to a copy of `updates[i].payload`,
/// as one batch) **and** drain every diff emitted for the window; return the
/// number of diffs. Called once per distribution (uniform, zipf) with that
/// distribution's stream.
pub fn new_message(rooms: &[Room], updates: &[Update], plan: &OpPlan) -> Option<Measurement> {
    let (mut engine, collection) = engine_with_rooms(rooms);
    let mut sink = CountingSink::default();
    let window =
        engine.open_window(collection, &room_list_def(RoomFilter::NotLeft), 0, WINDOW_LIMIT, &mut sink).ok()?;
    engine.prepare_window(window).ok()?;
    sink.take();
    let mut batch = Batch::new();
    let samples = time_new_messages(&mut engine, collection, &mut batch, rooms, updates, plan, &mut sink);
    // Memory of the view (index nodes and membership bits), after the timed updates
    // and again after N more (untimed): churn lowers the index's fill, and the
    // figure that matters is the settled one.
    let view_bytes_per_room = engine.view_heap_bytes(window).ok()? as f64 / rooms.len() as f64;
    let last_recency = updates.iter().map(|update| update.recency).max().unwrap_or(0);
    let mut rng = crate::data::Rng::derived(rooms.len() as u64, "ordo-churn");
    for churn_index in 1..=rooms.len() as u64 {
        let recency = last_recency + churn_index;
        let room = rng.below(rooms.len() as u64) as u32;
        let churn = Update { room, recency, payload: rooms[room as usize].payload.clone() };
        apply_update(&mut engine, collection, &mut batch, &rooms[room as usize].id, &churn, &mut sink);
    }
    let settled_bytes_per_room = engine.view_heap_bytes(window).ok()? as f64 / rooms.len() as f64;
    Some(
        samples
            .measurement(true)
            .with_extra("view_bytes_per_room", view_bytes_per_room)
            .with_extra("view_bytes_per_room_after_n_more_updates", settled_bytes_per_room),
    )
}

/// **load-more** — untimed: collection, room-list view, window at limit
/// `steps[0].from` (20), initial Reset drained. Operation `i` = change the
/// window's limit to `steps[i % steps.len()].to` and drain the diffs (the
/// steps go 20→40→…→200→180→…→20, so the cycle repeats). Return
/// `samples.grouped(steps.len(), true)`: one measurement per step, in the
/// order of `steps`.
pub fn load_more(rooms: &[Room], steps: &[LimitStep], plan: &OpPlan) -> Option<Vec<Measurement>> {
    let (mut engine, collection) = engine_with_rooms(rooms);
    let mut sink = CountingSink::default();
    let def = room_list_def(RoomFilter::NotLeft);
    let window = engine.open_window(collection, &def, 0, steps.first()?.from, &mut sink).ok()?;
    sink.take();
    let samples = time_ops(plan, |i| {
        engine.set_window_range(window, 0, steps[i % steps.len()].to, &mut sink).expect("valid range");
        (sink.take(), ())
    });
    Some(samples.grouped(steps.len(), true))
}

/// **filter-switch** — untimed: collection, view with filter `filters[0]`
/// (`left == false`), window (0, 20), initial Reset drained. Operation `i` =
/// switch the live window's filter to `filters[(i + 1) % filters.len()]`
/// (`unread > 0`, `is_dm`, `name contains "ab"` case-insensitive, back to
/// `left == false`; see [`RoomFilter::matches`] for the exact predicates) and
/// drain the window's diffs. Return `samples.grouped(filters.len(), true)`:
/// element `k` is the switch *to* `filters[(k + 1) % len]`.
pub fn filter_switch(rooms: &[Room], filters: &[RoomFilter], plan: &OpPlan) -> Option<Vec<Measurement>> {
    let (mut engine, collection) = engine_with_rooms(rooms);
    let mut sink = CountingSink::default();
    let defs: Vec<ViewDef> = filters.iter().map(|&filter| room_list_def(filter)).collect();
    let window = engine.open_window(collection, &defs[0], 0, WINDOW_LIMIT, &mut sink).ok()?;
    sink.take();
    // Each switch is cold: the window is the view's only one, so the old view is
    // dropped and the new one built (lazily: only its first window sorted).
    let samples = time_ops(plan, |i| {
        engine.set_window_view(window, &defs[(i + 1) % defs.len()], &mut sink).expect("valid view");
        (sink.take(), ())
    });
    Some(samples.grouped(filters.len(), true))
}

/// **fan-out** — untimed: collection, room-list view, one window of limit
/// 20 per entry of `offsets` (10 000 windows at offsets 0, 20, 40, …
/// wrapping), each window's initial Reset drained. Operation `i` = apply
/// `updates[i]` (as in `new_message`) and drain the diffs of **all** windows;
/// return the total number of diffs.
pub fn fan_out(rooms: &[Room], updates: &[Update], offsets: &[usize], plan: &OpPlan) -> Option<Measurement> {
    let (mut engine, collection) = engine_with_rooms(rooms);
    let mut sink = CountingSink::default();
    let def = room_list_def(RoomFilter::NotLeft);
    for &offset in offsets {
        engine.open_window(collection, &def, offset, WINDOW_LIMIT, &mut sink).ok()?;
    }
    sink.take();
    let mut batch = Batch::new();
    let samples = time_new_messages(&mut engine, collection, &mut batch, rooms, updates, plan, &mut sink);
    Some(samples.measurement(true))
}

/// **many-lists** — untimed: take a [`MemProbe::start`](crate::harness::MemProbe)
/// reading, then build `data.collections` separate collections (one per
/// user), collection `c` holding its own copies of the rooms
/// `data.collection(c)` (`data.rooms[r]`), each with the room-list view and a
/// window (0, 20) drained; then `let mem = probe.per_unit(data.collections)`.
/// Operation `i` = apply `updates[i]` (indices into `data.rooms`) to every
/// collection that holds the room — `data.memberships_of(room)` gives the 50
/// `(collection, position)` pairs — and drain all those windows' diffs;
/// return the total. Attach the memory figures as the peers do:
/// `Some(mem.attach(samples.measurement(true)))`, plus the views' heap per
/// entry (the windows are opened after every collection is filled, to measure it).
pub fn many_lists(data: &ManyLists, updates: &[Update], plan: &OpPlan) -> Option<Measurement> {
    let probe = MemProbe::start();
    let mut engine = Engine::new();
    let mut sink = CountingSink::default();
    let mut batch = Batch::new();
    let def = room_list_def(RoomFilter::NotLeft);
    let mut collections = Vec::with_capacity(data.collections);
    for c in 0..data.collections {
        let collection = engine.create_collection(&format!("user{c}"), room_schema()).ok()?;
        batch.clear();
        add_rooms(&mut batch, data.collection(c).iter().map(|&room| &data.rooms[room as usize]));
        engine.apply_batch(collection, &batch, &mut sink).ok()?;
        collections.push(collection);
    }
    // The views apart, for their bytes per entry (the view's fixed part included).
    let views_probe = MemProbe::start();
    for &collection in &collections {
        let window = engine.open_window(collection, &def, 0, WINDOW_LIMIT, &mut sink).ok()?;
        engine.prepare_window(window).ok()?;
    }
    let view_entries = data.collections * data.per_collection;
    let view_bytes_per_entry = views_probe.per_unit(view_entries).heap;
    sink.take();
    let memory = probe.per_unit(data.collections);
    let samples = time_ops(plan, |i| {
        let update = &updates[i];
        let room_id = &data.rooms[update.room as usize].id;
        for &(collection, _position) in data.memberships_of(update.room as usize) {
            apply_update(&mut engine, collections[collection as usize], &mut batch, room_id, update, &mut sink);
        }
        (sink.take(), ())
    });
    Some(memory.attach(samples.measurement(true)).with_extra("heap_bytes_per_view_entry", view_bytes_per_entry))
}

/// Items per user in `shared-predicate`.
pub const SHARED_ITEMS_PER_USER: usize = 100;

/// The view a server opens for `user` on the shared collection under the row
/// predicate `owner == user`: most recent first (then id).
pub fn shared_predicate_def(user: &str) -> ViewDef {
    ViewDef::new(Filter::eq("owner", OwnedValue::Str(user.to_owned())), vec![SortKey::desc("recency")])
}

/// **shared-predicate** — one collection of `n_items` items with `owner` (a
/// string, `n_items / 100` users, owners drawn at random) and `recency` (u64);
/// for each user, a window "owner == user, recency desc, top 20", as a server
/// that conjoins a row predicate into every view opens it. Returns two
/// measurements: creating one user's view and window (every user's, each timed
/// on its own, the initial Reset drained), with the engine's heap growth as
/// extras; and one update (operation `i`: item `updates[i].0` gets recency
/// `updates[i].1`, as one batch, its diffs drained). `is_keyed: false` is the
/// peer: the same engine with view keying switched off
/// ([`Engine::set_view_keying`]), so that every update visits every user's view
/// and every view is built by filtering the whole collection.
pub fn shared_predicate(
    n_items: usize,
    updates: &[(u32, u64)],
    plan: &OpPlan,
    seed: u64,
    is_keyed: bool,
) -> Option<[Measurement; 2]> {
    let n_users = (n_items / SHARED_ITEMS_PER_USER).max(1);
    let probe = MemProbe::start();
    let mut engine = Engine::new();
    engine.set_view_keying(is_keyed);
    let schema = Schema::new().with_field("owner", FieldType::String).with_field("recency", FieldType::U64);
    let collection = engine.create_collection("shared", schema).ok()?;
    let users: Vec<String> = (0..n_users).map(|user| format!("user-{user:05}")).collect();
    let ids: Vec<String> = (0..n_items).map(|item| format!("item-{item:07}")).collect();
    let mut rng = crate::data::Rng::derived(seed, "shared-predicate");
    let mut batch = Batch::new();
    let mut sink = CountingSink::default();
    for chunk in ids.chunks(100_000) {
        batch.clear();
        for id in chunk {
            let owner = &users[rng.below(n_users as u64) as usize];
            batch
                .upsert(id)
                .set("owner", Value::Str(owner))
                .set("recency", Value::U64(rng.below(1_000_000_000_000)))
                .payload(&[b'p'; 32]);
        }
        engine.apply_batch(collection, &batch, &mut sink).ok()?;
    }
    let items_memory = probe.per_unit(1);

    // Every user's view and window, each creation timed on its own.
    let mut creations = crate::harness::Samples::default();
    let mut windows = Vec::with_capacity(n_users);
    for user in &users {
        let def = shared_predicate_def(user);
        let allocations_before = ordo_test_kit::alloc::allocations();
        let start = std::time::Instant::now();
        windows.push(engine.open_window(collection, &def, 0, WINDOW_LIMIT, &mut sink).ok()?);
        let n_diffs = sink.take();
        creations.ns.push(start.elapsed().as_nanos() as u64);
        creations.allocs.push(ordo_test_kit::alloc::allocations() - allocations_before);
        creations.diffs.push(n_diffs as u64);
    }
    // Untimed: every view's full index, as its first update would build it, so that
    // the memory and the updates below are those of the steady state.
    for &window in &windows {
        engine.prepare_window(window).ok()?;
    }
    let total_memory = probe.per_unit(1);
    let views_memory = total_memory.heap - items_memory.heap;
    let create = creations
        .measurement(true)
        .with_extra("heap_bytes_total", total_memory.heap)
        .with_extra("heap_bytes_items", items_memory.heap)
        .with_extra("heap_bytes_per_user_view", views_memory / n_users as f64);

    let samples = time_ops(plan, |i| {
        let (item, recency) = updates[i];
        batch.clear();
        batch.upsert(&ids[item as usize]).set("recency", Value::U64(recency));
        engine.apply_batch(collection, &batch, &mut sink).expect("valid update");
        (sink.take(), ())
    });
    let stats = engine.stats();
    let update = samples.measurement(true).with_extra(
        "views_visited_per_update",
        stats.n_view_visits as f64 / (samples.len() + samples.first_index).max(1) as f64,
    );
    Some([create, update])
}
