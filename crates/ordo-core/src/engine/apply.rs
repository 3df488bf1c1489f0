//! The apply phase of a batch, and its deliver phase: each operation takes its
//! item out of the views it visits (`plan_visits`, `remove_from_views`), writes
//! its fields, and puts it back (`insert_into_views`), each window recording the
//! diffs of the move by slot; `deliver_pending` then hands every touched window's
//! diffs to the sink. The one-item path (`single_upsert`) and the refresh of
//! referencing items (`references`) reuse the same steps.

use crate::batch::{Batch, OpKind, StoredOp};
use crate::collection::Collection;
use crate::diff::{DiffRef, DiffSink, ItemList};
use crate::error::BatchError;
use crate::ids::{CollectionId, Slot, WindowId};
use crate::key_index::KeyMove;
use crate::order_tree::Entry;
use crate::prefetch::prefetch;
use crate::schema::FieldId;
use crate::view::{compare_entries, View};
use crate::window::ViewChange;

use super::collection_table::OtherCollections;
use super::validate::validate_batch;
use super::windows::{finish_window, Contents};
use super::{references, refresh, single_upsert, BatchSummary, CollectionState, Engine, Scratch, WindowSlot};

impl Engine {
    /// Applies a batch with no atomic operations or preconditions: validate, apply op
    /// by op, deliver.
    pub(super) fn apply_plain_batch(
        &mut self,
        collection_id: CollectionId,
        batch: &Batch,
        version: u64,
        sink: &mut dyn DiffSink,
    ) -> Result<BatchSummary, BatchError> {
        let Engine {
            collections,
            views,
            windows,
            scratch,
            n_view_visits,
            n_single_upserts,
            is_single_upsert_path_disabled,
            ..
        } = self;
        let (state, others) = collections.split_mut(collection_id).ok_or(BatchError::UnknownCollection)?;
        debug_assert!(!batch.needs_state(), "resolved before it is applied");
        let mut summary = BatchSummary::default();
        if !*is_single_upsert_path_disabled && single_upsert::try_apply(state, views, windows, scratch, batch, version)
        {
            summary.n_upserted = 1;
            *n_single_upserts += 1;
            *n_view_visits += scratch.visited_views.len() as u64;
        } else {
            validate_batch(&state.collection, batch, 0, &mut scratch.resolved_fields)?;
            for op in &batch.ops {
                match op.kind {
                    OpKind::Upsert => {
                        apply_upsert(state, &others, views, windows, scratch, batch, op, version);
                        summary.n_upserted += 1;
                    }
                    OpKind::Remove => {
                        if apply_remove(state, views, windows, scratch, batch.id(op)) {
                            summary.n_removed += 1;
                        }
                    }
                }
                *n_view_visits += scratch.visited_views.len() as u64;
            }
        }
        summary.n_windows_changed = deliver_pending(&state.collection, views, windows, scratch, sink);
        reserve_for_refreshes(state, scratch);
        let has_referrers = !state.refs.referrers.is_empty();
        if has_referrers {
            // Items referencing what the batch changed move now, reading the batch's end state.
            summary.n_windows_changed += self.refresh_referrers(collection_id, batch, sink);
        }
        let state = self.collections.get_mut(collection_id).expect("live");
        // Recycled only now: the refresh above may still deliver diffs of this batch.
        state.collection.recycle_freed_slots();
        self.last_version = self.last_version.max(version);
        Ok(summary)
    }
}

/// After a batch on a referencing collection, or a view building its links:
/// room in the buffer a target change copies a reverse-index list into, for the
/// longest list yet, so that a message to the largest room allocates nothing
/// (memberships and link builds grow lists; messages only read them).
pub(super) fn reserve_for_refreshes(state: &CollectionState, scratch: &mut Scratch) {
    let longest_list_len = state.refs.links.iter().map(|link| link.index.longest_list_len()).max().unwrap_or(0);
    let referencing = &mut scratch.referencing_slots;
    referencing.reserve(longest_list_len.saturating_sub(referencing.len()));
    if longest_list_len > 0 {
        // The refresh's chunk buffers (`engine/refresh`), fixed in size.
        let gathered = &mut scratch.gathered_items;
        gathered.reserve_exact(refresh::REFRESH_CHUNK_ITEMS.saturating_sub(gathered.len()));
        let views = &mut scratch.gathered_views;
        let n_views = refresh::REFRESH_CHUNK_ITEMS * refresh::GATHERED_VIEWS_PER_ITEM;
        views.reserve_exact(n_views.saturating_sub(views.len()));
    }
}

/// Lists in `scratch.visited_views` the views an operation on an item visits:
/// every unkeyed view and, per keyed field, the views keyed by the item's old value
/// and by its new one; fills `scratch.key_moves` with those values' hashes. `slot`
/// is the item's (`None`: a new item); `written` the upsert writing it (`None`: a
/// remove, after which the item has no value). A view keyed by a value the item
/// neither had nor gets holds it neither before nor after, so skipping it changes
/// nothing. The lists are disjoint (a view has at most one key), so no view is
/// listed twice.
pub(super) fn plan_visits(
    state: &CollectionState,
    scratch: &mut Scratch,
    slot: Option<Slot>,
    written: Option<(&Batch, &StoredOp)>,
) {
    let Scratch { visited_views, key_moves, resolved_fields, .. } = scratch;
    visited_views.clear();
    visited_views.extend_from_slice(&state.unkeyed_views);
    key_moves.clear();
    for field in state.keys.fields() {
        let old = slot.and_then(|slot| state.keys.hash_value(state.collection.value(slot, field.field_id)));
        let new = match written {
            None => None,
            Some((batch, op)) => {
                let resolved = &resolved_fields[op.fields_start as usize..(op.fields_start + op.fields_len) as usize];
                // The last write of the field wins, as when the fields are written.
                match resolved.iter().rposition(|&field_id| field_id == field.field_id) {
                    Some(position) => {
                        let field_type = state.collection.schema().field(field.field_id).field_type;
                        let value = batch.field_value(&batch.op_fields(op)[position]);
                        state.keys.hash_value(value.coerce_to(field_type).expect("validated"))
                    }
                    None => old,
                }
            }
        };
        if let Some(slot) = slot {
            visited_views.extend_from_slice(state.keys.views_of_slot(field, &state.collection, slot));
        }
        if let (Some(hash), true) = (new, new != old) {
            visited_views.extend_from_slice(field.views_of_hash(hash));
        }
        let old_handle = slot.and_then(|slot| state.collection.handle_of(slot, field.field_id));
        key_moves.push(KeyMove { old, new, old_handle });
    }
}

/// Takes a slot's entry out of every view in `scratch.visited_views`, recording
/// old ranks. `slot` is `None` for a new item (in no view yet). `changed_fields`
/// lists the fields the operation writes (`None`: all of them, as for a remove);
/// a view that reads none of them keeps the entry where it is.
pub(super) fn remove_from_views(
    state: &CollectionState,
    views: &mut [Option<View>],
    scratch: &mut Scratch,
    slot: Option<Slot>,
    changed_fields: Option<&[FieldId]>,
) {
    let Scratch { visited_views, old_ranks, filter: filter_scratch, .. } = scratch;
    old_ranks.clear();
    for &view_index in visited_views.iter() {
        let view = views[view_index as usize].as_mut().expect("live view");
        // A view sorts lazily; it needs its tree by its first update, which may come
        // batches after it was built (an update visits only the views of its keys).
        // Its entries are still exact then: the data of the items in it has not
        // changed, since any such change would have visited it.
        view.ensure_ready(&state.collection);
        let Some(slot) = slot else {
            old_ranks.push(OldRank::NotMember);
            continue;
        };
        // `None` (a remove) changes everything; otherwise only the fields written.
        let (touches_sort, touches_filter) = match changed_fields {
            None => (true, true),
            Some(fields) => (
                fields.iter().any(|&field_id| view.moves.sort.reads_field(field_id)),
                fields.iter().any(|&field_id| view.moves.filter_fields.contains(&field_id)),
            ),
        };
        let still_member = !touches_filter;
        if touches_sort || touches_filter {
            // The item leaves its place: where the index finds it by slot, that one
            // lookup also says whether it is a member (a user's list of rooms).
            if let Some(removed) = view.remove_if_member(slot) {
                old_ranks.push(match removed {
                    None => OldRank::NotMember,
                    Some((rank, _prefix)) => {
                        debug_assert_eq!(
                            _prefix,
                            view.moves.sort.encode_prefix(&state.collection, slot),
                            "index out of sync with item data"
                        );
                        OldRank::Removed { rank, still_member }
                    }
                });
                continue;
            }
        }
        if !view.is_member(&state.collection, slot, filter_scratch) {
            old_ranks.push(OldRank::NotMember);
            continue;
        }
        let (sort, collection) = (&view.moves.sort, &state.collection);
        let compare = |left, right| compare_entries(sort, collection, left, right);
        let tree = view.index.tree_mut();
        old_ranks.push(if !touches_sort && !touches_filter {
            let entry = Entry { prefix: sort.encode_prefix(collection, slot), slot };
            OldRank::Unchanged(tree.rank_of(entry, compare))
        } else if let Some((rank, _prefix)) = tree.remove_slot(slot) {
            // Found through the slot → leaf map: no search, no old prefix to encode.
            debug_assert_eq!(_prefix, sort.encode_prefix(collection, slot), "index out of sync with item data");
            OldRank::Removed { rank, still_member }
        } else {
            let entry = Entry { prefix: sort.encode_prefix(collection, slot), slot };
            OldRank::Removed { rank: tree.remove(entry, compare), still_member }
        });
    }
}

/// Where an item was in a view before the operation being applied.
#[derive(Clone, Copy, Debug)]
pub(super) enum OldRank {
    NotMember,
    /// Taken out of the index at this rank; it re-enters if it still passes the
    /// filter, which is known without evaluating it when no filter field changed.
    Removed {
        rank: usize,
        still_member: bool,
    },
    /// The operation changes nothing the view reads: same membership, same rank.
    Unchanged(usize),
}

/// Puts a slot's new entry into every visited view whose filter it passes, and
/// records each affected window's diffs.
pub(super) fn insert_into_views(
    state: &CollectionState,
    views: &mut [Option<View>],
    windows: &mut [WindowSlot],
    scratch: &mut Scratch,
    slot: Slot,
    is_alive: bool,
) {
    let Scratch { visited_views, old_ranks, filter: filter_scratch, touched_windows, .. } = scratch;
    debug_assert_eq!(visited_views.len(), old_ranks.len());
    for (&view_index, &old) in visited_views.iter().zip(old_ranks.iter()) {
        let view = views[view_index as usize].as_mut().expect("live view");
        let (old_rank, new_rank) = match old {
            OldRank::Unchanged(rank) => (Some(rank), Some(rank)),
            OldRank::NotMember => {
                let is_member = is_alive && view.plan.filter.matches(&state.collection, slot, filter_scratch);
                (None, insert_entry(view, &state.collection, slot, is_member))
            }
            OldRank::Removed { rank, still_member } => {
                let is_member =
                    is_alive && (still_member || view.plan.filter.matches(&state.collection, slot, filter_scratch));
                (Some(rank), insert_entry(view, &state.collection, slot, is_member))
            }
        };
        if old_rank.is_none() && new_rank.is_none() {
            continue;
        }
        let crate::view::ViewIndex::Ready(tree) = &view.index else { unreachable!("views are ready during a batch") };
        let change = ViewChange { slot, old_rank, new_rank, len_after: tree.len() };
        for &window_index in &view.windows {
            let window = windows[window_index as usize].window.as_mut().expect("live window");
            if window.record(change, |rank| tree.select(rank).slot) {
                touched_windows.push(window_index);
            }
        }
    }
}

/// Records a slot's membership in a view and, if a member, enters it into the
/// index; returns its rank.
pub(super) fn insert_entry(view: &mut View, collection: &Collection, slot: Slot, is_member: bool) -> Option<usize> {
    view.set_member(slot, is_member);
    if is_member {
        let entry = Entry { prefix: view.moves.sort.encode_prefix(collection, slot), slot };
        let sort = &view.moves.sort;
        let tree = view.index.tree_mut();
        Some(tree.insert(entry, |left, right| compare_entries(sort, collection, left, right)))
    } else {
        None
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn apply_upsert(
    state: &mut CollectionState,
    others: &OtherCollections<'_>,
    views: &mut [Option<View>],
    windows: &mut [WindowSlot],
    scratch: &mut Scratch,
    batch: &Batch,
    op: &StoredOp,
    version: u64,
) {
    let id = batch.id(op);
    let existing = state.collection.find_slot(id);
    plan_visits(state, scratch, existing, Some((batch, op)));
    let has_links = !state.refs.links.is_empty();
    if has_links {
        references::hashes_before(state, existing, &mut scratch.ref_hashes);
    }
    let slot = match existing {
        Some(slot) => {
            // Taken out for the call and put back: no copy, no allocation.
            let resolved_fields = std::mem::take(&mut scratch.resolved_fields);
            let changed_fields = &resolved_fields[op.fields_start as usize..(op.fields_start + op.fields_len) as usize];
            if has_links {
                // A reference written changes the fields read through it too.
                let mut changed = std::mem::take(&mut scratch.changed_fields);
                changed.clear();
                changed.extend_from_slice(changed_fields);
                references::derived_changed_by(state, changed_fields, &mut changed);
                remove_from_views(state, views, scratch, Some(slot), Some(&changed));
                scratch.changed_fields = changed;
            } else {
                remove_from_views(state, views, scratch, Some(slot), Some(changed_fields));
            }
            scratch.resolved_fields = resolved_fields;
            slot
        }
        None => {
            remove_from_views(state, views, scratch, None, None);
            state.collection.insert_slot(id)
        }
    };
    let fields = batch.op_fields(op);
    let resolved = &scratch.resolved_fields[op.fields_start as usize..(op.fields_start + op.fields_len) as usize];
    for (field, &field_id) in fields.iter().zip(resolved) {
        let field_type = state.collection.schema().field(field_id).field_type;
        let value = batch.field_value(field).coerce_to(field_type).expect("validated");
        state.collection.set_value(slot, field_id, value);
    }
    if let Some(payload) = batch.payload(op) {
        state.collection.set_payload(slot, payload);
    }
    state.collection.set_version(slot, version);
    if has_links {
        let written = &scratch.resolved_fields[op.fields_start as usize..(op.fields_start + op.fields_len) as usize];
        references::after_upsert(state, others, slot, existing.is_none(), written, &scratch.ref_hashes);
    }
    state.keys.apply_moves(&state.collection, slot, &scratch.key_moves);
    insert_into_views(state, views, windows, scratch, slot, true);
}

/// Returns whether the id existed.
pub(super) fn apply_remove(
    state: &mut CollectionState,
    views: &mut [Option<View>],
    windows: &mut [WindowSlot],
    scratch: &mut Scratch,
    id: &str,
) -> bool {
    let Some(slot) = state.collection.find_slot(id) else {
        // Visits nothing (and must not count the previous operation's visits again).
        scratch.visited_views.clear();
        return false;
    };
    plan_visits(state, scratch, Some(slot), None);
    remove_from_views(state, views, scratch, Some(slot), None);
    insert_into_views(state, views, windows, scratch, slot, false);
    state.keys.apply_moves(&state.collection, slot, &scratch.key_moves);
    if !state.refs.links.is_empty() {
        references::hashes_before(state, Some(slot), &mut scratch.ref_hashes);
        references::before_remove(state, &scratch.ref_hashes, slot);
    }
    state.collection.remove_slot(slot);
    true
}

/// How many windows ahead of the one being delivered the delivery asks for the
/// next level of their state. A message to a room touches every member's window,
/// each cold again by the time the batch's diffs go out: the window, then its
/// pending diffs and view, then the items those diffs carry, each level asked
/// for this many windows before it is read, so that the misses of several
/// windows are in flight while one is delivered.
const DELIVERY_LOOKAHEAD: usize = 4;

/// Asks the cache for the state of the windows `DELIVERY_LOOKAHEAD`, twice and
/// three times that, ahead of `touched[position]`, one level each.
fn prefetch_delivery_ahead(
    collection: &Collection,
    views: &[Option<View>],
    windows: &[WindowSlot],
    touched: &[u32],
    position: usize,
) {
    let window_at =
        |distance: usize| touched.get(position + distance).and_then(|&index| windows[index as usize].window.as_ref());
    if let Some(&far) = touched.get(position + 3 * DELIVERY_LOOKAHEAD) {
        prefetch(&windows[far as usize]);
    }
    if let Some(window) = window_at(2 * DELIVERY_LOOKAHEAD) {
        window.pending.prefetch_spill();
        // By address: reading the `Option`'s tag first would wait for the very
        // line this asks for.
        prefetch(&views[window.view as usize]);
    }
    if let Some(window) = window_at(DELIVERY_LOOKAHEAD) {
        for slot in window.pending.iter().filter_map(|pending| pending.slot()) {
            collection.prefetch_item(slot);
        }
    }
}

/// Hands every touched window's diffs to the sink; returns how many windows changed.
pub(super) fn deliver_pending(
    collection: &Collection,
    views: &mut [Option<View>],
    windows: &mut [WindowSlot],
    scratch: &mut Scratch,
    sink: &mut dyn DiffSink,
) -> usize {
    let n_windows = scratch.touched_windows.len();
    for (position, &window_index) in scratch.touched_windows.iter().enumerate() {
        prefetch_delivery_ahead(collection, views, windows, &scratch.touched_windows, position);
        let slot = &mut windows[window_index as usize];
        let window_id = WindowId { index: window_index, generation: slot.generation };
        let window = slot.window.as_mut().expect("live window");
        let view = views[window.view as usize].as_mut().expect("live view");
        let final_len = window.len_for(view.len());
        let (view_len, offset, limit) = (view.len(), window.offset, window.limit);
        let slots = &mut scratch.new_slots;
        // A reset costs one diff carrying `final_len` values; recorded diffs carry at most one each.
        let contents = if window.needs_reset || window.pending.len() > final_len.max(1) {
            if final_len == 0 {
                sink.diff(window_id, DiffRef::Clear);
                Contents::Collected(&[])
            } else {
                slots.clear();
                view.collect_range(collection, offset, limit, slots);
                sink.diff(window_id, DiffRef::Reset { values: ItemList::new(collection, slots) });
                Contents::Collected(slots)
            }
        } else {
            for pending in window.pending.iter() {
                sink.diff(window_id, pending.resolve(collection));
            }
            Contents::Range { view, offset, limit, slots }
        };
        finish_window(sink, window_id, view_len, limit, collection, contents);
        window.pending.clear();
        window.needs_reset = false;
    }
    scratch.touched_windows.clear();
    n_windows
}
