//! Windows: a range `[offset, offset + limit)` of a view, and the translation of
//! one item's move in the view into that window's diffs.

use crate::diff::PendingDiff;
use crate::ids::Slot;
use crate::prefetch::prefetch_lines;

/// Diffs a window holds in its own struct: a batch's diffs of one window are
/// nearly always fewer (a move within the window or into it is two). Held
/// there, a member's move records them in the window's own cache line and the
/// delivery reads them from it: no heap line per window (see `WindowSlot`).
const INLINE_PENDING_DIFFS: usize = 5;

/// Where one item went in a view, with the view's final state to read from.
/// `old_rank` is in the view before the change, `new_rank` in the view after it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ViewChange {
    pub(crate) slot: Slot,
    pub(crate) old_rank: Option<usize>,
    pub(crate) new_rank: Option<usize>,
    /// View length after the change.
    pub(crate) len_after: usize,
}

// Field order is the cache layout (see `WindowSlot`): the range, the flags, the
// count and the first diffs, what every move and delivery reads, come first.
#[repr(C)]
pub(crate) struct Window {
    pub(crate) view: u32,
    /// A tail window: the last `limit` rows of the view. Its `offset` follows the
    /// view's end (`len - limit`, at least 0) as rows enter and leave; see `record`.
    pub(crate) is_tail: bool,
    /// More diffs than a reset would cost: stop recording, send a reset.
    pub(crate) needs_reset: bool,
    pub(crate) offset: usize,
    pub(crate) limit: usize,
    /// Diffs of the batch being applied, resolved when it ends.
    pub(crate) pending: PendingDiffs,
}

impl Window {
    /// Window length for a view of `view_len` items.
    pub(crate) fn len_for(&self, view_len: usize) -> usize {
        view_len.saturating_sub(self.offset).min(self.limit)
    }

    /// The most diffs worth recording for one batch: past that, a reset is cheaper.
    fn pending_max(&self) -> usize {
        self.limit + 1
    }

    /// Records the diffs that `change` causes in this window. `select(rank)` reads the
    /// view after the change. Returns true if the window was touched for the first
    /// time in this batch (so the caller lists it for delivery).
    pub(crate) fn record(&mut self, change: ViewChange, select: impl Fn(usize) -> Slot) -> bool {
        let was_untouched = self.pending.is_empty() && !self.needs_reset;
        // Before the empty-window exit: an empty tail window still follows the end.
        if self.is_tail && self.record_tail_slide(change, &select) {
            return was_untouched && (!self.pending.is_empty() || self.needs_reset);
        }
        let (offset, limit) = (self.offset, self.limit);
        if limit == 0 {
            return false;
        }
        let end = offset + limit;
        let before = |rank: usize| rank < offset;
        let inside = |rank: usize| rank >= offset && rank < end;
        let mut out = DiffRecorder { window: self };
        match (change.old_rank, change.new_rank) {
            (None, None) => {}
            (Some(old_rank), Some(new_rank)) => {
                // A move within a view of constant length.
                let len = change.len_after.saturating_sub(offset).min(limit);
                if len == 0 {
                    // The window lies past the end of the view; nothing in it moves.
                } else if inside(old_rank) && inside(new_rank) {
                    if old_rank == new_rank {
                        out.push(PendingDiff::Set((old_rank - offset) as u32, change.slot));
                    } else {
                        out.push(PendingDiff::Remove((old_rank - offset) as u32));
                        out.push(PendingDiff::Insert((new_rank - offset) as u32, change.slot));
                    }
                } else if inside(old_rank) {
                    out.push(PendingDiff::Remove((old_rank - offset) as u32));
                    if before(new_rank) {
                        out.push(PendingDiff::PushFront(select(offset)));
                    } else {
                        out.push(PendingDiff::PushBack(select(offset + len - 1)));
                    }
                } else if inside(new_rank) {
                    if before(old_rank) {
                        out.push(PendingDiff::PopFront);
                        out.push(PendingDiff::Insert((new_rank - offset) as u32, change.slot));
                    } else {
                        out.push(PendingDiff::Insert((new_rank - offset) as u32, change.slot));
                        out.push(PendingDiff::PopBack);
                    }
                } else if before(old_rank) && !before(new_rank) {
                    // Jumped over the window from before to after: it shifts by one.
                    out.push(PendingDiff::PopFront);
                    out.push(PendingDiff::PushBack(select(offset + len - 1)));
                } else if !before(old_rank) && before(new_rank) {
                    out.push(PendingDiff::PushFront(select(offset)));
                    out.push(PendingDiff::PopBack);
                }
            }
            (None, Some(new_rank)) => {
                let len_before = (change.len_after - 1).saturating_sub(offset).min(limit);
                if before(new_rank) {
                    if offset < change.len_after {
                        out.push(PendingDiff::PushFront(select(offset)));
                        if len_before == limit {
                            out.push(PendingDiff::PopBack);
                        }
                    }
                } else if inside(new_rank) {
                    out.push(PendingDiff::Insert((new_rank - offset) as u32, change.slot));
                    if len_before == limit {
                        out.push(PendingDiff::PopBack);
                    }
                }
            }
            (Some(old_rank), None) => {
                let len_before = (change.len_after + 1).saturating_sub(offset).min(limit);
                let len_after = change.len_after.saturating_sub(offset).min(limit);
                if len_before > 0 && (before(old_rank) || inside(old_rank)) {
                    if before(old_rank) {
                        out.push(PendingDiff::PopFront);
                    } else {
                        out.push(PendingDiff::Remove((old_rank - offset) as u32));
                    }
                    if len_after == len_before {
                        out.push(PendingDiff::PushBack(select(offset + len_after - 1)));
                    }
                }
            }
        }
        was_untouched && (!self.pending.is_empty() || self.needs_reset)
    }
}

impl Window {
    /// A tail window's offset is `len - limit` (at least 0). When a row enters or
    /// leaves a view longer than the window, that offset moves by one and the
    /// window slides with it: this records the slide's diffs and returns true.
    /// Otherwise (a move, which keeps the length, or a view no longer than the
    /// window, whose offset stays 0) the offset holds and the caller records the
    /// change as for any window.
    ///
    /// Sliding, the rows of the window are the old ones shifted by one, so the diffs
    /// are at most two: a row entering above the window (or leaving above it) leaves
    /// the window's rows as they were.
    fn record_tail_slide(&mut self, change: ViewChange, select: &impl Fn(usize) -> Slot) -> bool {
        let offset_before = self.offset;
        let offset_after = change.len_after.saturating_sub(self.limit);
        match (change.old_rank, change.new_rank) {
            (None, Some(new_rank)) if offset_after > offset_before => {
                debug_assert_eq!(offset_after, offset_before + 1);
                self.offset = offset_after;
                if new_rank >= offset_after {
                    let mut out = DiffRecorder { window: self };
                    out.push(PendingDiff::PopFront);
                    out.push(PendingDiff::Insert((new_rank - offset_after) as u32, change.slot));
                }
                true
            }
            (Some(old_rank), None) if offset_after < offset_before => {
                debug_assert_eq!(offset_after + 1, offset_before);
                self.offset = offset_after;
                if old_rank >= offset_before {
                    let mut out = DiffRecorder { window: self };
                    out.push(PendingDiff::Remove((old_rank - offset_before) as u32));
                    out.push(PendingDiff::PushFront(select(offset_after)));
                }
                true
            }
            _ => false,
        }
    }
}

/// A window's diffs of the batch being applied: the first
/// `INLINE_PENDING_DIFFS` in the window itself, the rest (a batch that moves
/// many of its rows) in `spill`, which keeps its capacity between batches, so
/// a window allocates only when a batch gives it more diffs than any before.
/// Not a `SmallVec`: once spilled, it keeps every element on the heap until
/// dropped, so one large batch would move all of a window's later diffs out of
/// its line.
#[repr(C)]
pub(crate) struct PendingDiffs {
    len: u32,
    inline: [PendingDiff; INLINE_PENDING_DIFFS],
    spill: Vec<PendingDiff>,
}

impl PendingDiffs {
    pub(crate) fn new() -> PendingDiffs {
        PendingDiffs { len: 0, inline: [PendingDiff::PopFront; INLINE_PENDING_DIFFS], spill: Vec::new() }
    }

    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bounded by the window's `pending_max` (its limit + 1), so the count fits.
    fn push(&mut self, diff: PendingDiff) {
        let index = self.len as usize;
        if index < INLINE_PENDING_DIFFS {
            self.inline[index] = diff;
        } else {
            self.spill.push(diff);
        }
        self.len += 1;
    }

    pub(crate) fn clear(&mut self) {
        self.len = 0;
        self.spill.clear();
    }

    /// The diffs in the order recorded.
    pub(crate) fn iter(&self) -> impl Iterator<Item = PendingDiff> + '_ {
        self.inline[..self.len().min(INLINE_PENDING_DIFFS)].iter().chain(&self.spill).copied()
    }

    /// Asks the cache for the diffs held outside the window, if any.
    #[inline]
    pub(crate) fn prefetch_spill(&self) {
        prefetch_lines(&self.spill, 1);
    }
}

/// Bytes from a `Window`'s start to the end of its first two pending diffs
/// (what a move within the window records): `WindowSlot` keeps them in its first line.
#[cfg(test)]
pub(crate) const FIRST_DIFFS_END: usize = std::mem::offset_of!(Window, pending)
    + std::mem::offset_of!(PendingDiffs, inline)
    + 2 * std::mem::size_of::<PendingDiff>();

struct DiffRecorder<'a> {
    window: &'a mut Window,
}

impl DiffRecorder<'_> {
    fn push(&mut self, diff: PendingDiff) {
        if self.window.needs_reset {
            return;
        }
        if self.window.pending.len() >= self.window.pending_max() {
            self.window.needs_reset = true;
            self.window.pending.clear();
            return;
        }
        self.window.pending.push(diff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_test_kit::rng::Rng;

    /// Against a `Vec`: pushes across the inline places into the spill and back
    /// after a clear, in the order recorded.
    #[test]
    fn pending_diffs_hold_what_a_vec_holds() {
        let mut rng = Rng(7);
        let mut pending = PendingDiffs::new();
        let mut model: Vec<PendingDiff> = Vec::new();
        for step in 0..5_000u32 {
            if rng.below(12) == 0 {
                pending.clear();
                model.clear();
            } else {
                let diff = PendingDiff::Insert(step, rng.below(1_000) as Slot);
                pending.push(diff);
                model.push(diff);
            }
            assert_eq!(pending.len(), model.len());
            assert_eq!(pending.is_empty(), model.is_empty());
            let held: Vec<String> = pending.iter().map(|diff| format!("{diff:?}")).collect();
            let expected: Vec<String> = model.iter().map(|diff| format!("{diff:?}")).collect();
            assert_eq!(held, expected, "step {step}");
        }
    }
}
