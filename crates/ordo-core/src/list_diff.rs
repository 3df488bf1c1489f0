//! The smallest diff we know how to compute between two windows' contents, used
//! when a window is moved, resized or re-pointed to another filter or sort.
//!
//! Items are unique within a window, so the longest common subsequence of the old
//! and new lists is the longest increasing subsequence of the old items' positions
//! in the new list (O(n log n)). Items outside it are removed, then the missing ones
//! inserted at their final positions; removals at the end become a `Truncate`,
//! insertions at the end an `Append`. If that costs more than a `Reset`, a `Reset`
//! (or `Clear`) is sent instead.

use crate::collection::Collection;
use crate::diff::{DiffRef, DiffSink, ItemList};
use crate::ids::{Slot, WindowId};

const NOT_IN_NEW: u32 = u32::MAX;

/// Reusable buffers for [`emit_list_diff`].
#[derive(Default)]
pub(crate) struct ListDiffScratch {
    /// Position in the new list, indexed by slot; `NOT_IN_NEW` elsewhere. Kept
    /// all-`NOT_IN_NEW` between calls.
    new_position_by_slot: Vec<u32>,
    /// For each old item, its position in the new list.
    old_to_new: Vec<u32>,
    /// Whether each old item is kept (part of the increasing subsequence).
    kept_old: Vec<bool>,
    /// Whether each new item is already present (kept).
    present_new: Vec<bool>,
    lis_tails: Vec<u32>,
    lis_parents: Vec<u32>,
}

/// What the diff would cost, in "diffs plus values carried", against a reset.
fn reset_cost(new_len: usize) -> usize {
    1 + new_len
}

/// Emits diffs turning `old` into `new` (both lists of slots of `collection`).
/// Returns the number of diffs emitted.
pub(crate) fn emit_list_diff(
    old: &[Slot],
    new: &[Slot],
    collection: &Collection,
    scratch: &mut ListDiffScratch,
    window: WindowId,
    sink: &mut dyn DiffSink,
) -> usize {
    if old == new {
        return 0;
    }
    if new.is_empty() {
        sink.diff(window, DiffRef::Clear);
        return 1;
    }
    if old.is_empty() {
        sink.diff(window, DiffRef::Append { values: ItemList::new(collection, new) });
        return 1;
    }
    let n_slots = collection.slot_capacity();
    if scratch.new_position_by_slot.len() < n_slots {
        scratch.new_position_by_slot.resize(n_slots, NOT_IN_NEW);
    }
    for (position, &slot) in new.iter().enumerate() {
        scratch.new_position_by_slot[slot as usize] = position as u32;
    }
    scratch.old_to_new.clear();
    scratch.old_to_new.extend(old.iter().map(|&slot| scratch.new_position_by_slot[slot as usize]));
    for &slot in new {
        scratch.new_position_by_slot[slot as usize] = NOT_IN_NEW;
    }
    mark_longest_increasing(scratch);

    scratch.present_new.clear();
    scratch.present_new.resize(new.len(), false);
    let mut n_kept = 0;
    for (old_index, &kept) in scratch.kept_old.iter().enumerate() {
        if kept {
            scratch.present_new[scratch.old_to_new[old_index] as usize] = true;
            n_kept += 1;
        }
    }

    // Cost of the edit script: each removal and insertion is a diff carrying at most
    // one value; a removed suffix is one Truncate; an appended suffix one Append.
    let n_removed = old.len() - n_kept;
    let removed_suffix = scratch.kept_old.iter().rev().take_while(|&&kept| !kept).count();
    let appended_suffix = scratch.present_new.iter().rev().take_while(|&&present| !present).count();
    let removal_cost = n_removed - removed_suffix + usize::from(removed_suffix > 0);
    let n_inserted = new.len() - n_kept;
    let insertion_cost = 2 * (n_inserted - appended_suffix) + usize::from(appended_suffix > 0) + appended_suffix;
    if removal_cost + insertion_cost > reset_cost(new.len()) {
        sink.diff(window, DiffRef::Reset { values: ItemList::new(collection, new) });
        return 1;
    }

    let mut n_diffs = 0;
    let mut current_len = old.len();
    if removed_suffix > 0 {
        current_len -= removed_suffix;
        sink.diff(window, DiffRef::Truncate { length: current_len });
        n_diffs += 1;
    }
    // Remove back to front so that earlier indices stay valid.
    for old_index in (0..old.len() - removed_suffix).rev() {
        if !scratch.kept_old[old_index] {
            let diff = if old_index == 0 { DiffRef::PopFront } else { DiffRef::Remove { index: old_index } };
            sink.diff(window, diff);
            current_len -= 1;
            n_diffs += 1;
        }
    }
    let append_from = new.len() - appended_suffix;
    for (new_index, &slot) in new[..append_from].iter().enumerate() {
        if !scratch.present_new[new_index] {
            let value = collection.item(slot);
            let diff = if new_index == 0 {
                DiffRef::PushFront { value }
            } else if new_index == current_len {
                DiffRef::PushBack { value }
            } else {
                DiffRef::Insert { index: new_index, value }
            };
            sink.diff(window, diff);
            current_len += 1;
            n_diffs += 1;
        }
    }
    if appended_suffix > 0 {
        sink.diff(window, DiffRef::Append { values: ItemList::new(collection, &new[append_from..]) });
        n_diffs += 1;
    }
    n_diffs
}

/// Marks in `kept_old` a longest strictly increasing subsequence of `old_to_new`
/// (ignoring `NOT_IN_NEW`), by patience sorting with parent links.
fn mark_longest_increasing(scratch: &mut ListDiffScratch) {
    let values = &scratch.old_to_new;
    scratch.kept_old.clear();
    scratch.kept_old.resize(values.len(), false);
    scratch.lis_tails.clear();
    scratch.lis_parents.clear();
    scratch.lis_parents.resize(values.len(), u32::MAX);
    for (index, &value) in values.iter().enumerate() {
        if value == NOT_IN_NEW {
            continue;
        }
        let length = scratch.lis_tails.partition_point(|&tail| values[tail as usize] < value);
        if length > 0 {
            scratch.lis_parents[index] = scratch.lis_tails[length - 1];
        }
        if length == scratch.lis_tails.len() {
            scratch.lis_tails.push(index as u32);
        } else {
            scratch.lis_tails[length] = index as u32;
        }
    }
    let mut cursor = scratch.lis_tails.last().copied().unwrap_or(u32::MAX);
    while cursor != u32::MAX {
        scratch.kept_old[cursor as usize] = true;
        cursor = scratch.lis_parents[cursor as usize];
    }
}
