//! Windows positioned by key: at an item's place in a view rather than at a row
//! number, and tail windows that follow the view's end.
//!
//! An item's place is found in O(log n) from its current sort prefix and slot
//! (`OrderTree::position_of`). An item that exists but is not in the view (its
//! filter leaves it out) still has a place: the rank it would take if it were in
//! it, which is where a client that scrolled to it expects to be. An id the
//! collection does not hold is an error.
//!
//! Only the tail anchor lasts: a window opened `around`, `after` or `before` an
//! item is an ordinary window at the offset found, and stays at that offset as
//! rows move (as every offset window does). A tail window stays the last `limit`
//! rows: see `Window::record_tail_slide`.

use crate::collection::Collection;
use crate::error::ViewError;
use crate::filter::FilterScratch;
use crate::order_tree::Entry;
use crate::view::{compare_entries, View};

/// Where a window starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowAnchor<'a> {
    /// At this row.
    Offset(usize),
    /// Item `id` at row `row` of the window (`row < limit`): offset `rank - row`,
    /// moved down to 0 and up to `len - limit` so that the window stays full
    /// where the view allows.
    Around { id: &'a str, row: usize },
    /// The rows right after item `id` (offset `rank + 1`; for an item outside the
    /// view, the rows that would follow it). Not moved back from the end: after
    /// the last item, the window is empty.
    After(&'a str),
    /// The rows right before item `id`: at most `limit`, fewer near the top (the
    /// window's limit is then reduced: it ends just before the item).
    Before(&'a str),
    /// The last `limit` rows, following the end of the view as rows come and go.
    Tail,
}

/// A window's range, as an anchor resolved it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowRange {
    pub offset: usize,
    pub limit: usize,
    pub is_tail: bool,
}

/// Where an item is in a view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemPosition {
    /// Its rank if it is in the view; otherwise the rank it would take there
    /// (the number of the view's items that sort before it).
    pub rank: usize,
    pub is_member: bool,
}

impl View {
    /// Where item `id` is (or would sort) in the view. Builds the full index of a
    /// partially sorted view: a rank needs every entry in order.
    pub(crate) fn item_position(
        &mut self,
        collection: &Collection,
        id: &str,
        filter_scratch: &mut FilterScratch,
    ) -> Result<ItemPosition, ViewError> {
        let slot = collection.find_slot(id).ok_or_else(|| ViewError::UnknownItem { id: id.to_owned() })?;
        self.ensure_ready(collection);
        let is_member = self.is_member(collection, slot, filter_scratch);
        // The entry as the index holds it (for a member) or would (for the others):
        // both read the item's current data, which the index agrees with.
        let entry = Entry { prefix: self.moves.sort.encode_prefix(collection, slot), slot };
        let sort = &self.moves.sort;
        let tree = self.index.tree_mut();
        let rank = tree.position_of(entry, |left, right| compare_entries(sort, collection, left, right));
        Ok(ItemPosition { rank, is_member })
    }
}

/// The range `anchor` gives a window of `limit` rows on `view`.
pub(crate) fn resolve_anchor(
    view: &mut View,
    collection: &Collection,
    anchor: WindowAnchor<'_>,
    limit: usize,
    filter_scratch: &mut FilterScratch,
) -> Result<WindowRange, ViewError> {
    let at = |offset: usize, limit: usize| WindowRange { offset, limit, is_tail: false };
    Ok(match anchor {
        WindowAnchor::Offset(offset) => at(offset, limit),
        WindowAnchor::Tail => WindowRange { offset: view.len().saturating_sub(limit), limit, is_tail: true },
        WindowAnchor::Around { id, row } => {
            if row >= limit.max(1) {
                return Err(ViewError::AnchorRowOutsideWindow { row, limit });
            }
            let position = view.item_position(collection, id, filter_scratch)?;
            let offset = position.rank.saturating_sub(row).min(view.len().saturating_sub(limit));
            at(offset, limit)
        }
        WindowAnchor::After(id) => {
            let position = view.item_position(collection, id, filter_scratch)?;
            at(position.rank + usize::from(position.is_member), limit)
        }
        WindowAnchor::Before(id) => {
            let end = view.item_position(collection, id, filter_scratch)?.rank;
            let offset = end.saturating_sub(limit);
            at(offset, end - offset)
        }
    })
}
