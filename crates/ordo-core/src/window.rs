//! Windows: a range `[offset, offset + limit)` of a view, and the translation of
//! one item's move in the view into that window's diffs.

use crate::diff::PendingDiff;
use crate::ids::Slot;

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

pub(crate) struct Window {
    pub(crate) view: u32,
    pub(crate) offset: usize,
    pub(crate) limit: usize,
    /// A tail window: the last `limit` rows of the view. Its `offset` follows the
    /// view's end (`len - limit`, at least 0) as rows enter and leave; see `record`.
    pub(crate) is_tail: bool,
    /// Diffs of the batch being applied, resolved when it ends.
    pub(crate) pending: Vec<PendingDiff>,
    /// More diffs than a reset would cost: stop recording, send a reset.
    pub(crate) needs_reset: bool,
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
