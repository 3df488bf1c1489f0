//! Moving every item that references one changed target (every member's list,
//! for a room's new message), at memory speed.
//!
//! Each referencing item's state is cold: its reference and key values, its
//! derived value, its keyed view (found by hashing its key), the view's plan and
//! entries, and its windows. Handled one item to completion after another, those
//! loads form a chain of dependent misses per item, and the processor waits on
//! each in turn. So items go through in chunks of [`REFRESH_CHUNK_ITEMS`], each
//! chunk in steps that each run over the whole chunk:
//! 1. ask the cache for every item's reference, key and derived values;
//! 2. ask for every item's key views: its key handle's cell in the lone-view
//!    table (see `key_index`), or its key string when the key is not interned;
//! 3. gather: keep the items whose derived values change; then list the views
//!    each moves in, asking for each view and what it reads; then keep the
//!    views reading a derived field that changed;
//! 4. ask for each view's move plan, run of slots and windows' list; then for
//!    the plan's keys and for each window; then for each window's pending
//!    diffs; then, the slots being in cache, for the prefixes each move shifts;
//! 5. apply: move each item as `refresh_item` did, on state now in cache.
//!
//! Once the chain of dependent misses is broken this way, what bounds the cost
//! is the number of distinct lines per item: the memory system has only so many
//! misses in flight, and a prefetch waits for room like a load. So what a move
//! reads is kept in few lines: the move plan is shared by every user's list
//! (see `view::MovePlan`), a key's views and a view's windows are inline, and a
//! run's prefixes are asked for exactly up to the moving entry's place.
//!
//! Within a step the items are independent, so their misses are in flight
//! together; the chunk is small enough that what the steps bring in (some 30
//! lines an item) is still in cache when the item is applied. The hints change
//! no result: the apply step is the one-item refresh, in the same item order, so
//! diffs, their order and the views visited are as before.

use crate::ids::Slot;
use crate::prefetch::{prefetch, prefetch_lines};
use crate::schema::FieldId;
use crate::value::Value;
use crate::view::View;

use super::apply::{insert_into_views, remove_from_views};
use super::references::{same_value, ViewReads};
use super::{CollectionState, Scratch, WindowSlot};

/// Referencing items gathered and prefetched together: enough that their misses
/// overlap, few enough that what the prefetches bring in stays in the first cache
/// levels until the items are applied.
pub(super) const REFRESH_CHUNK_ITEMS: usize = 32;

/// Room for views per gathered item: a chunk ends early rather than grow its
/// buffer past `REFRESH_CHUNK_ITEMS` times this (an item in a user's list is in
/// one view per window of that list).
pub(super) const GATHERED_VIEWS_PER_ITEM: usize = 4;

/// A referencing item whose derived values change, and where its views end in
/// `Scratch::gathered_views` (they start where the previous item's end).
#[derive(Clone, Copy)]
pub(super) struct GatheredItem {
    slot: Slot,
    /// One bit per derived field of the link whose value changes.
    changed_mask: u64,
    views_end: u32,
    /// Where the item is in its chunk.
    chunk_index: u32,
}

/// Each gathered item with its views in `gathered_views`.
fn items_with_views<'a>(
    gathered: &'a [GatheredItem],
    gathered_views: &'a [u32],
) -> impl Iterator<Item = (&'a GatheredItem, &'a [u32])> {
    let starts = std::iter::once(0).chain(gathered.iter().map(|item| item.views_end as usize));
    gathered.iter().zip(starts).map(|(item, start)| (item, &gathered_views[start..item.views_end as usize]))
}

/// A changed target, as every referencing item of one link reads it.
pub(super) struct TargetChange<'a> {
    pub(super) target: &'a CollectionState,
    /// The target's slot (`None`: absent, so every derived value is null).
    pub(super) target_slot: Option<Slot>,
    pub(super) link_index: usize,
    /// The target id's handle in the referencing collection's reference column.
    pub(super) handle: u32,
}

impl TargetChange<'_> {
    fn value(&self, target_field: FieldId) -> Value<'_> {
        self.target_slot.map_or(Value::Null, |slot| self.target.collection.value(slot, target_field))
    }
}

/// What the refresh of one target's referencing items reads and writes besides
/// the referencing collection.
pub(super) struct RefreshContext<'a> {
    pub(super) views: &'a mut [Option<View>],
    pub(super) windows: &'a mut [WindowSlot],
    pub(super) scratch: &'a mut Scratch,
    pub(super) view_links: &'a [ViewReads],
    pub(super) n_view_visits: &'a mut u64,
}

/// Refreshes the items of `referencing` (the slots listed under the target id's
/// hash, other ids' too on a collision) in every view reading a derived field
/// whose value changed, chunk by chunk.
pub(super) fn refresh_referencing(
    state: &mut CollectionState,
    change: &TargetChange<'_>,
    context: &mut RefreshContext<'_>,
    referencing: &[Slot],
) {
    let mut gathered = std::mem::take(&mut context.scratch.gathered_items);
    let mut gathered_views = std::mem::take(&mut context.scratch.gathered_views);
    let mut start = 0;
    while start < referencing.len() {
        let chunk = &referencing[start..(start + REFRESH_CHUNK_ITEMS).min(referencing.len())];
        prefetch_item_values(state, change, chunk);
        gathered.clear();
        gathered_views.clear();
        select_changed(state, change, chunk, &mut gathered);
        start += list_views(state, context, chunk.len(), &mut gathered, &mut gathered_views);
        keep_views_reading_changes(context.view_links, &mut gathered, &mut gathered_views);
        prefetch_views_and_windows(context.views, context.windows, &gathered_views);
        prefetch_shifts(context.views, &gathered, &gathered_views);
        apply_gathered(state, change, context, &gathered, &gathered_views);
    }
    context.scratch.gathered_items = gathered;
    context.scratch.gathered_views = gathered_views;
}

/// Steps 1 and 2: each item's reference, key and derived values, then its key strings.
fn prefetch_item_values(state: &CollectionState, change: &TargetChange<'_>, chunk: &[Slot]) {
    let collection = &state.collection;
    let link = &state.refs.links[change.link_index];
    for &slot in chunk {
        collection.prefetch_value(slot, link.ref_field);
        for &(derived, _) in &link.derived {
            collection.prefetch_value(slot, derived);
        }
        for field in state.keys.fields() {
            collection.prefetch_value(slot, field.field_id);
        }
    }
    for &slot in chunk {
        for field in state.keys.fields() {
            state.keys.prefetch_views_of_slot(field, collection, slot);
        }
    }
}

/// Step 3a: the items of `chunk` whose derived values change.
fn select_changed(
    state: &CollectionState,
    change: &TargetChange<'_>,
    chunk: &[Slot],
    gathered: &mut Vec<GatheredItem>,
) {
    let collection = &state.collection;
    let link = &state.refs.links[change.link_index];
    for (chunk_index, &slot) in chunk.iter().enumerate() {
        // A colliding hash lists other ids too.
        if collection.handle_at(slot, link.ref_field) != change.handle {
            continue;
        }
        let mut changed_mask = 0u64;
        for &(derived, target_field) in &link.derived {
            if !same_value(collection.value(slot, derived), change.value(target_field)) {
                changed_mask |= 1 << derived.derived_index();
            }
        }
        if changed_mask == 0 {
            // Nothing a view reads or shows changed: no view is visited.
            continue;
        }
        gathered.push(GatheredItem { slot, changed_mask, views_end: 0, chunk_index: chunk_index as u32 });
    }
}

/// Step 3b: the views that hold or may hold each selected item, unkeyed ones
/// and those of its key values (which a refresh does not change), asking for
/// each view and its reads. Returns how many items of the
/// chunk the step went through: all, unless the views buffer filled first (it
/// never grows for a chunk), in which case the selected items not listed are
/// dropped and go first in the next chunk.
fn list_views(
    state: &CollectionState,
    context: &RefreshContext<'_>,
    chunk_len: usize,
    gathered: &mut Vec<GatheredItem>,
    gathered_views: &mut Vec<u32>,
) -> usize {
    let keyed_fields = state.keys.fields();
    for index in 0..gathered.len() {
        let item = gathered[index];
        let keyed_views = |field| state.keys.views_of_slot(field, &state.collection, item.slot);
        let n_views =
            state.unkeyed_views.len() + keyed_fields.iter().map(|field| keyed_views(field).len()).sum::<usize>();
        if gathered_views.len() + n_views > gathered_views.capacity() && index > 0 {
            gathered.truncate(index);
            return item.chunk_index as usize;
        }
        let n_views_before = gathered_views.len();
        gathered_views.extend_from_slice(&state.unkeyed_views);
        for field in keyed_fields {
            gathered_views.extend_from_slice(keyed_views(field));
        }
        for &view_index in &gathered_views[n_views_before..] {
            if let Some(reads) = context.view_links.get(view_index as usize) {
                prefetch(reads);
            }
            prefetch_lines(std::slice::from_ref(&context.views[view_index as usize]), 2);
        }
        gathered[index].views_end = gathered_views.len() as u32;
    }
    chunk_len
}

/// Step 3, second half, once the views' reads are in cache: keeps of each
/// gathered item's views those reading or showing a derived field that changed.
fn keep_views_reading_changes(view_links: &[ViewReads], gathered: &mut [GatheredItem], gathered_views: &mut Vec<u32>) {
    let (mut n_kept, mut views_start) = (0, 0);
    for item in gathered.iter_mut() {
        for index in views_start..item.views_end as usize {
            let view_index = gathered_views[index];
            let reads = view_links.get(view_index as usize);
            if reads.is_some_and(|reads| reads.reads_any_derived(item.changed_mask)) {
                gathered_views[n_kept] = view_index;
                n_kept += 1;
            }
        }
        views_start = item.views_end as usize;
        item.views_end = n_kept as u32;
    }
    gathered_views.truncate(n_kept);
}

/// Step 4: each gathered view's plan, entries and windows, level by level.
fn prefetch_views_and_windows(views: &[Option<View>], windows: &[WindowSlot], gathered_views: &[u32]) {
    let view_of = |view_index: u32| views[view_index as usize].as_ref().expect("live view");
    for &view_index in gathered_views {
        view_of(view_index).prefetch_for_move();
    }
    for &view_index in gathered_views {
        let view = view_of(view_index);
        view.prefetch_plan_parts();
        for &window_index in &view.windows {
            prefetch(&windows[window_index as usize]);
        }
    }
    for &view_index in gathered_views {
        for &window_index in &view_of(view_index).windows {
            if let Some(window) = &windows[window_index as usize].window {
                window.pending.prefetch_spill();
            }
        }
    }
}

/// Step 4, last level: for each gathered item, what its move shifts in each of
/// its views (a run's prefixes between the front and its place).
fn prefetch_shifts(views: &[Option<View>], gathered: &[GatheredItem], gathered_views: &[u32]) {
    for (item, item_views) in items_with_views(gathered, gathered_views) {
        for &view_index in item_views {
            if let Some(view) = &views[view_index as usize] {
                view.prefetch_shift_of(item.slot);
            }
        }
    }
}

/// Step 5: moves each gathered item in its views (or sends a `Set` where its
/// place does not change: views that only show the derived fields).
fn apply_gathered(
    state: &mut CollectionState,
    change: &TargetChange<'_>,
    context: &mut RefreshContext<'_>,
    gathered: &[GatheredItem],
    gathered_views: &[u32],
) {
    let mut changed = std::mem::take(&mut context.scratch.changed_fields);
    for (item, item_views) in items_with_views(gathered, gathered_views) {
        let scratch = &mut *context.scratch;
        scratch.visited_views.clear();
        scratch.visited_views.extend_from_slice(item_views);
        changed.clear();
        let link = &state.refs.links[change.link_index];
        changed.extend(
            link.derived
                .iter()
                .map(|&(derived, _)| derived)
                .filter(|derived| item.changed_mask & (1 << derived.derived_index()) != 0),
        );
        remove_from_views(state, context.views, scratch, Some(item.slot), Some(&changed));
        let CollectionState { collection, refs, .. } = &mut *state;
        for &(derived, target_field) in &refs.links[change.link_index].derived {
            if item.changed_mask & (1 << derived.derived_index()) != 0 {
                collection.set_value(item.slot, derived, change.value(target_field));
            }
        }
        insert_into_views(state, context.views, context.windows, scratch, item.slot, true);
        *context.n_view_visits += scratch.visited_views.len() as u64;
    }
    context.scratch.changed_fields = changed;
}
