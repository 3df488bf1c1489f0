//! The Ordo side of every scenario — to be written by the engine engineer.
//!
//! Each function receives exactly the data the peers receive (the same rooms,
//! the same pre-generated update stream, the same [`OpPlan`]) and returns
//! `None` while it is not measured ("not measured" in the report); the rest of
//! the harness (peers, table, JSON, ratios) works unchanged once it returns
//! `Some`.
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

#![allow(unused_variables)]

use crate::data::{CreateView, LimitStep, ManyLists, Room, RoomFilter, Update};
use crate::harness::{Measurement, OpPlan};

/// **create** — the N `rooms` are already in an Ordo collection (insert them
/// *before* timing). One operation = from asking for the room-list view to
/// holding its first window: for `CreateView::Window`, define the view and
/// open a window (offset 0, limit 20) and drain the initial Reset of 20 rooms
/// (diffs = 1); for `CreateView::Full`, obtain the whole sorted view without
/// a window (return `None` if the engine has no such thing). Return the
/// created view/window as `keep` so that dropping it is not timed; each
/// operation creates a fresh view on the same collection.
pub fn create(rooms: &[Room], view: CreateView, plan: &OpPlan) -> Option<Measurement> {
    None
}

/// **new-message** — untimed: collection with the N `rooms`, the room-list
/// view, a window (0, 20), its initial Reset drained. Operation `i` = apply
/// `updates[i]` (set room `updates[i].room`'s `recency` to
/// `updates[i].recency` and its payload to a copy of `updates[i].payload`,
/// as one batch) **and** drain every diff emitted for the window; return the
/// number of diffs. Called once per distribution (uniform, zipf) with that
/// distribution's stream.
pub fn new_message(rooms: &[Room], updates: &[Update], plan: &OpPlan) -> Option<Measurement> {
    None
}

/// **load-more** — untimed: collection, room-list view, window at limit
/// `steps[0].from` (20), initial Reset drained. Operation `i` = change the
/// window's limit to `steps[i % steps.len()].to` and drain the diffs (the
/// steps go 20→40→…→200→180→…→20, so the cycle repeats). Return
/// `samples.grouped(steps.len(), true)`: one measurement per step, in the
/// order of `steps`.
pub fn load_more(rooms: &[Room], steps: &[LimitStep], plan: &OpPlan) -> Option<Vec<Measurement>> {
    None
}

/// **filter-switch** — untimed: collection, view with filter `filters[0]`
/// (`left == false`), window (0, 20), initial Reset drained. Operation `i` =
/// switch the live window's filter to `filters[(i + 1) % filters.len()]`
/// (`unread > 0`, `is_dm`, `name contains "ab"` case-insensitive, back to
/// `left == false`; see [`RoomFilter::matches`] for the exact predicates) and
/// drain the window's diffs. Return `samples.grouped(filters.len(), true)`:
/// element `k` is the switch *to* `filters[(k + 1) % len]`.
pub fn filter_switch(
    rooms: &[Room],
    filters: &[RoomFilter],
    plan: &OpPlan,
) -> Option<Vec<Measurement>> {
    None
}

/// **fan-out** — untimed: collection, room-list view, one window of limit
/// 20 per entry of `offsets` (10 000 windows at offsets 0, 20, 40, …
/// wrapping), each window's initial Reset drained. Operation `i` = apply
/// `updates[i]` (as in `new_message`) and drain the diffs of **all** windows;
/// return the total number of diffs.
pub fn fan_out(
    rooms: &[Room],
    updates: &[Update],
    offsets: &[usize],
    plan: &OpPlan,
) -> Option<Measurement> {
    None
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
/// `Some(mem.attach(samples.measurement(true)))`.
pub fn many_lists(data: &ManyLists, updates: &[Update], plan: &OpPlan) -> Option<Measurement> {
    None
}
