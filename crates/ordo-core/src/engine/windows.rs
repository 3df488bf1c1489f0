//! The window API: opening a window on a view (which finds or creates the view
//! and builds its index), moving, resizing and re-pointing it with the smallest
//! diff, reading its contents, and closing it (which drops a view no window
//! looks at).

use crate::anchor::{resolve_anchor, ItemPosition, WindowAnchor, WindowRange};
use crate::collection::Collection;
use crate::diff::{DiffRef, DiffSink, ItemList};
use crate::error::ViewError;
use crate::ids::{CollectionId, Slot, WindowId};
use crate::key_index::ViewKey;
use crate::limits;
use crate::list_diff::emit_list_diff;
use crate::view::{View, ViewPlan};
use crate::view_def::ViewDef;
use crate::window::{PendingDiffs, Window};
use crate::OwnedItem;

use super::{push_with_slack_of_an_eighth, CollectionState, Engine, Scratch, WindowSlot};

impl Engine {
    /// Opens a window on a view of a collection. Its first diff, delivered to
    /// `sink` now, is a `Reset` with the window's contents.
    pub fn open_window(
        &mut self,
        collection_id: CollectionId,
        def: &ViewDef,
        offset: usize,
        limit: usize,
        sink: &mut dyn DiffSink,
    ) -> Result<WindowId, ViewError> {
        Ok(self.open_window_at(collection_id, def, WindowAnchor::Offset(offset), limit, sink)?.0)
    }

    /// Opens a window placed by `anchor` (a row, an item's place, or the tail) and
    /// returns the range it got. Its first diff, delivered to `sink` now, is a
    /// `Reset` with the window's contents. Nothing is left behind on an error.
    pub fn open_window_at(
        &mut self,
        collection_id: CollectionId,
        def: &ViewDef,
        anchor: WindowAnchor<'_>,
        limit: usize,
        sink: &mut dyn DiffSink,
    ) -> Result<(WindowId, WindowRange), ViewError> {
        check_window_limit(limit)?;
        let n_first = match anchor {
            WindowAnchor::Offset(offset) => offset.saturating_add(limit),
            // Ranks need the whole index anyway.
            _ => limit,
        };
        let view_index = self.find_or_create_view(collection_id, def, n_first)?;
        let range = {
            let view = self.views[view_index as usize].as_mut().expect("live view");
            let collection = &self.collections[view.collection].collection;
            resolve_anchor(view, collection, anchor, limit, &mut self.scratch.filter)
        };
        let range = match range {
            Ok(range) => range,
            Err(error) => {
                // A view created for this window and nothing else goes with the error.
                self.drop_view_if_unused(view_index);
                return Err(error);
            }
        };
        let window_index = match self.free_windows.pop() {
            Some(index) => index,
            None => {
                push_with_slack_of_an_eighth(&mut self.windows, WindowSlot { generation: 0, window: None });
                (self.windows.len() - 1) as u32
            }
        };
        let slot = &mut self.windows[window_index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.window = Some(Window {
            view: view_index,
            offset: range.offset,
            limit: range.limit,
            is_tail: range.is_tail,
            pending: PendingDiffs::new(),
            needs_reset: false,
        });
        let window_id = WindowId { index: window_index, generation: slot.generation };
        self.views[view_index as usize].as_mut().expect("live view").windows.push(window_index);
        // A delivery lists each window it touches once: room for every window now,
        // so that a batch reaching more windows than any before allocates nothing.
        let touched = &mut self.scratch.touched_windows;
        touched.reserve(self.windows.len().saturating_sub(touched.len()));
        self.emit_window_reset(window_id, sink).expect("the window was just opened");
        Ok((window_id, range))
    }

    /// Moves or resizes a window ("load more"), emitting the smallest diff we can.
    pub fn set_window_range(
        &mut self,
        window_id: WindowId,
        offset: usize,
        limit: usize,
        sink: &mut dyn DiffSink,
    ) -> Result<(), ViewError> {
        self.move_window(window_id, WindowAnchor::Offset(offset), limit, sink).map(|_| ())
    }

    /// Moves or resizes a window to where `anchor` places it, emitting the smallest
    /// diff we can (as `set_window_range`), and returns the range it got. A tail
    /// anchor makes the window follow the view's end; any other ends that.
    pub fn move_window(
        &mut self,
        window_id: WindowId,
        anchor: WindowAnchor<'_>,
        limit: usize,
        sink: &mut dyn DiffSink,
    ) -> Result<WindowRange, ViewError> {
        check_window_limit(limit)?;
        let window_index = self.live_window_index(window_id)?;
        let window = self.windows[window_index].window.as_mut().expect("live window");
        let view = self.views[window.view as usize].as_mut().expect("live view");
        let collection = &self.collections[view.collection].collection;
        let range = resolve_anchor(view, collection, anchor, limit, &mut self.scratch.filter)?;
        let (old_offset, old_limit) = (window.offset, window.limit);
        (window.offset, window.limit, window.is_tail) = (range.offset, range.limit, range.is_tail);
        let n_diffs = emit_range_change(
            view,
            collection,
            (old_offset, old_limit),
            (range.offset, range.limit),
            &mut self.scratch.new_slots,
            window_id,
            sink,
        );
        if n_diffs > 0 {
            let view_len = view.len();
            let slots = &mut self.scratch.new_slots;
            let contents = Contents::Range { view, offset: range.offset, limit: range.limit, slots };
            finish_window(sink, window_id, view_len, range.limit, collection, contents);
        }
        Ok(range)
    }

    /// The range `anchor` would give a window of `limit` rows, without moving it
    /// (a server tells the client where its window lands before the diffs go out).
    pub fn resolve_window_anchor(
        &mut self,
        window_id: WindowId,
        anchor: WindowAnchor<'_>,
        limit: usize,
    ) -> Result<WindowRange, ViewError> {
        check_window_limit(limit)?;
        let window_index = self.live_window_index(window_id)?;
        let window = self.windows[window_index].window.as_ref().expect("live window");
        let view = self.views[window.view as usize].as_mut().expect("live view");
        let collection = &self.collections[view.collection].collection;
        resolve_anchor(view, collection, anchor, limit, &mut self.scratch.filter)
    }

    /// Where item `id` is, or would sort, in the view behind a window (see
    /// [`ItemPosition`]). O(log n) once the view's index is complete; this
    /// completes it if it is not.
    pub fn item_position(&mut self, window_id: WindowId, id: &str) -> Result<ItemPosition, ViewError> {
        let window_index = self.live_window_index(window_id)?;
        let window = self.windows[window_index].window.as_ref().expect("live window");
        let view = self.views[window.view as usize].as_mut().expect("live view");
        let collection = &self.collections[view.collection].collection;
        view.item_position(collection, id, &mut self.scratch.filter)
    }

    /// Points a window at another filter and sort of the same collection, keeping
    /// its range, and emits the smallest diff we can from the old contents to the new.
    pub fn set_window_view(
        &mut self,
        window_id: WindowId,
        def: &ViewDef,
        sink: &mut dyn DiffSink,
    ) -> Result<(), ViewError> {
        let window_index = self.live_window_index(window_id)?;
        let (old_view_index, offset, limit, is_tail) = {
            let window = self.windows[window_index].window.as_ref().expect("live window");
            (window.view, window.offset, window.limit, window.is_tail)
        };
        let collection_index = self.views[old_view_index as usize].as_ref().expect("live view").collection;
        let new_view_index =
            self.find_or_create_view(self.collections.id_at(collection_index), def, offset.saturating_add(limit))?;
        if new_view_index == old_view_index {
            return Ok(());
        }
        let (new_offset, new_len) = {
            let collection = &self.collections[collection_index].collection;
            let Scratch { old_slots, new_slots, .. } = &mut self.scratch;
            old_slots.clear();
            new_slots.clear();
            let old_view = self.views[old_view_index as usize].as_mut().expect("live view");
            old_view.collect_range(collection, offset, limit, old_slots);
            let new_view = self.views[new_view_index as usize].as_mut().expect("live view");
            // A tail window stays at the end, of the new view now.
            let new_offset = if is_tail { new_view.len().saturating_sub(limit) } else { offset };
            new_view.collect_range(collection, new_offset, limit, new_slots);
            new_view.windows.push(window_index as u32);
            (new_offset, new_view.len())
        };
        let window = self.windows[window_index].window.as_mut().expect("live window");
        (window.view, window.offset) = (new_view_index, new_offset);
        self.detach_window(old_view_index, window_index as u32);
        let collection = &self.collections[collection_index].collection;
        let Scratch { old_slots, new_slots, list_diff, .. } = &mut self.scratch;
        if emit_list_diff(old_slots, new_slots, collection, list_diff, window_id, sink) > 0 {
            finish_window(sink, window_id, new_len, limit, collection, Contents::Collected(new_slots));
        }
        Ok(())
    }

    pub fn close_window(&mut self, window_id: WindowId) -> Result<(), ViewError> {
        let window_index = self.live_window_index(window_id)?;
        let window = self.windows[window_index].window.take().expect("live window");
        self.free_windows.push(window_index as u32);
        self.detach_window(window.view, window_index as u32);
        Ok(())
    }

    /// Copies a window's current contents out (a convenience; allocates).
    pub fn window_items(&mut self, window_id: WindowId) -> Result<Vec<OwnedItem>, ViewError> {
        let window_index = self.live_window_index(window_id)?;
        let window = self.windows[window_index].window.as_ref().expect("live window");
        let (offset, limit) = (window.offset, window.limit);
        let view = self.views[window.view as usize].as_mut().expect("live view");
        let collection = &self.collections[view.collection].collection;
        let mut slots = Vec::new();
        view.collect_range(collection, offset, limit, &mut slots);
        Ok(ItemList::new(collection, &slots).to_owned_items())
    }

    /// Delivers a `Reset` with the window's current contents to `sink`, as its
    /// first diff did: for a server that shares one window among several clients
    /// and must bring one of them up to date (a late joiner, or one that fell behind).
    pub fn emit_window_reset(&mut self, window_id: WindowId, sink: &mut dyn DiffSink) -> Result<(), ViewError> {
        let window_index = self.live_window_index(window_id)?;
        let window = self.windows[window_index].window.as_ref().expect("live window");
        let (offset, limit) = (window.offset, window.limit);
        let view = self.views[window.view as usize].as_mut().expect("live view");
        let collection = &self.collections[view.collection].collection;
        let slots = &mut self.scratch.new_slots;
        slots.clear();
        view.collect_range(collection, offset, limit, slots);
        sink.diff(window_id, DiffRef::Reset { values: ItemList::new(collection, slots) });
        finish_window(sink, window_id, view.len(), limit, collection, Contents::Collected(slots));
        Ok(())
    }

    /// `(offset, limit)` of a window.
    pub fn window_range(&self, window_id: WindowId) -> Result<(usize, usize), ViewError> {
        let window_index = self.live_window_index(window_id)?;
        let window = self.windows[window_index].window.as_ref().expect("live window");
        Ok((window.offset, window.limit))
    }

    /// Number of items in the view a window looks at.
    pub fn view_len(&self, window_id: WindowId) -> Result<usize, ViewError> {
        let window_index = self.live_window_index(window_id)?;
        let window = self.windows[window_index].window.as_ref().expect("live window");
        Ok(self.views[window.view as usize].as_ref().expect("live view").len())
    }

    /// Heap bytes of the view (index and membership) behind a window.
    pub fn view_heap_bytes(&self, window_id: WindowId) -> Result<usize, ViewError> {
        let window_index = self.live_window_index(window_id)?;
        let window = self.windows[window_index].window.as_ref().expect("live window");
        Ok(self.views[window.view as usize].as_ref().expect("live view").heap_bytes())
    }

    /// Sorts a window's view completely now instead of at the first update
    /// (views sort lazily: see `ViewIndex`).
    pub fn prepare_window(&mut self, window_id: WindowId) -> Result<(), ViewError> {
        let window_index = self.live_window_index(window_id)?;
        let window = self.windows[window_index].window.as_ref().expect("live window");
        let view = self.views[window.view as usize].as_mut().expect("live view");
        view.ensure_ready(&self.collections[view.collection].collection);
        Ok(())
    }

    fn live_window_index(&self, window_id: WindowId) -> Result<usize, ViewError> {
        match self.windows.get(window_id.index as usize) {
            Some(WindowSlot { generation, window: Some(_) }) if *generation == window_id.generation => {
                Ok(window_id.index as usize)
            }
            _ => Err(ViewError::UnknownWindow),
        }
    }

    /// Identical definitions on one collection share a view and its index.
    fn find_or_create_view(
        &mut self,
        collection_id: CollectionId,
        def: &ViewDef,
        n_first: usize,
    ) -> Result<u32, ViewError> {
        let link_mask = self.prepare_view_refs(collection_id, def)?;
        let state = self.collections.get_mut(collection_id).ok_or(ViewError::UnknownCollection)?;
        let plan = self
            .shared
            .plan(state.collection.shared_schema(), def, || ViewPlan::compile(def, state.collection.shared_schema()))?;
        let key = match plan.filter.equality_key() {
            Some((field_id, value)) if !self.is_view_keying_disabled => {
                Some(ViewKey { field_id, hash: state.keys.hash_value(value).expect("keys are never null or floats") })
            }
            _ => None,
        };
        // An equal definition has the same key, so only the views of that key are
        // compared, and the unkeyed ones: a collection's lone view is not keyed.
        let same_key_views = key.map_or(&[][..], |key| state.keys.views_of(key));
        for &view_index in same_key_views.iter().chain(state.unkeyed_views.iter()) {
            if self.views[view_index as usize].as_ref().is_some_and(|view| view.plan.def == *def) {
                self.shared.release_plan(plan);
                return Ok(view_index);
            }
        }
        // The first view of a collection is not keyed: with no other view to skip,
        // keying saves an update no work, and the equality index costs a small
        // collection more than the view (about 290 B plus 8 B per item, where the
        // view's membership bits cost one bit per item; a user's room list is such
        // a collection). A second view keys the first if it can.
        let key = if state.has_views() {
            if key.is_some() {
                key_lone_view(state, &mut self.views);
            }
            key
        } else {
            None
        };
        let candidates = &mut self.scratch.old_slots;
        candidates.clear();
        if let Some(key) = key {
            state.keys.ensure_field(&state.collection, key.field_id);
            state.keys.collect_slots(key, candidates);
        }
        let view = View::build(
            collection_id.index,
            plan,
            key.map(|key| (key, &candidates[..])),
            &state.collection,
            &mut self.scratch.filter,
            n_first,
        );
        let view_index = match self.free_views.pop() {
            Some(index) => {
                self.views[index as usize] = Some(view);
                index
            }
            None => {
                push_with_slack_of_an_eighth(&mut self.views, Some(view));
                (self.views.len() - 1) as u32
            }
        };
        match key {
            Some(key) => state.keys.add_view(&state.collection, key, view_index),
            None => state.unkeyed_views.push(view_index),
        }
        self.register_view_links(collection_id, view_index, link_mask);
        Ok(view_index)
    }

    /// Removes a window from its view, dropping the view when no window is left.
    fn detach_window(&mut self, view_index: u32, window_index: u32) {
        let view = self.views[view_index as usize].as_mut().expect("live view");
        view.windows.retain(|index| *index != window_index);
        self.drop_view_if_unused(view_index);
    }

    /// Drops a view that no window looks at.
    fn drop_view_if_unused(&mut self, view_index: u32) {
        let view = self.views[view_index as usize].as_mut().expect("live view");
        if view.windows.is_empty() {
            let (collection, key) = (view.collection, view.key);
            let View { plan, moves, .. } = self.views[view_index as usize].take().expect("live view");
            // The view's own hold first, so that the plan's release finds the last.
            drop(moves);
            self.shared.release_plan(plan);
            self.free_views.push(view_index);
            let state = &mut self.collections[collection];
            match key {
                Some(key) => state.keys.remove_view(&state.collection, key, view_index),
                None => state.unkeyed_views.retain(|&index| index != view_index),
            }
            self.unregister_view_links(collection, view_index);
        }
    }
}

/// Keys a collection's lone view by its equality conjunct, if it has one and is
/// not keyed yet (see `find_or_create_view`): it joins the equality index and
/// drops its membership bits (its index holds exactly the items whose current
/// data matches, which is what a keyed view's membership test reads).
fn key_lone_view(state: &mut CollectionState, views: &mut [Option<View>]) {
    let &[view_index] = &state.unkeyed_views[..] else { return };
    if !state.keys.is_empty() {
        return;
    }
    let view = views[view_index as usize].as_mut().expect("live view");
    let Some((field_id, value)) = view.plan.filter.equality_key() else { return };
    let key = ViewKey { field_id, hash: state.keys.hash_value(value).expect("keys are never null or floats") };
    state.keys.ensure_field(&state.collection, field_id);
    state.keys.add_view(&state.collection, key, view_index);
    state.unkeyed_views.clear();
    view.become_keyed(key);
}

/// Emits the diffs of moving a window from `old` to `new` `(offset, limit)` on the
/// same view. Both are slices of one sorted list, so the diff is found directly:
/// items leave or enter at the front (`PopFront` / `PushFront`) and at the back
/// (`Truncate` / `Append`); only the entering items are read from the index. A
/// `Reset` is sent instead when it is smaller. Returns the number of diffs.
fn emit_range_change(
    view: &mut View,
    collection: &Collection,
    old: (usize, usize),
    new: (usize, usize),
    slots: &mut Vec<Slot>,
    window_id: WindowId,
    sink: &mut dyn DiffSink,
) -> usize {
    let view_len = view.len();
    let clip = |(offset, limit): (usize, usize)| {
        let start = offset.min(view_len);
        (start, offset.saturating_add(limit).min(view_len))
    };
    let ((old_start, old_end), (new_start, new_end)) = (clip(old), clip(new));
    if (old_start, old_end) == (new_start, new_end) {
        return 0;
    }
    let new_len = new_end - new_start;
    let overlaps = old_start < old_end && new_start < new_end && old_start < new_end && new_start < old_end;
    // Costs in "diffs plus values carried", as for batches.
    let front_cost = if new_start >= old_start { new_start - old_start } else { 2 * (old_start - new_start) };
    let back_cost = if new_end >= old_end { usize::from(new_end > old_end) * (1 + new_end - old_end) } else { 1 };
    if !overlaps || front_cost + back_cost > 1 + new_len {
        slots.clear();
        if new_len == 0 {
            sink.diff(window_id, DiffRef::Clear);
        } else {
            view.collect_range(collection, new_start, new_len, slots);
            sink.diff(window_id, DiffRef::Reset { values: ItemList::new(collection, slots) });
        }
        return 1;
    }
    let mut n_diffs = 0;
    // Back first, while the old indices still hold.
    if new_end < old_end {
        sink.diff(window_id, DiffRef::Truncate { length: new_end - old_start });
        n_diffs += 1;
    }
    for _ in old_start..new_start {
        sink.diff(window_id, DiffRef::PopFront);
        n_diffs += 1;
    }
    if new_start < old_start {
        slots.clear();
        view.collect_range(collection, new_start, old_start - new_start, slots);
        for &slot in slots.iter().rev() {
            sink.diff(window_id, DiffRef::PushFront { value: collection.item(slot) });
            n_diffs += 1;
        }
    }
    if new_end > old_end {
        slots.clear();
        view.collect_range(collection, old_end, new_end - old_end, slots);
        sink.diff(window_id, DiffRef::Append { values: ItemList::new(collection, slots) });
        n_diffs += 1;
    }
    n_diffs
}

/// Where a window's contents come from when its sink asks for them
/// (`DiffSink::wants_contents`): slots the call collected already (a Reset, a
/// change of view), or the window's range of its view, read into `slots`.
pub(super) enum Contents<'a> {
    Collected(&'a [Slot]),
    Range { view: &'a mut View, offset: usize, limit: usize, slots: &'a mut Vec<Slot> },
}

/// Ends a window's diffs of one call: its contents when the sink wants them,
/// its view's length, then `window_done`.
pub(super) fn finish_window(
    sink: &mut dyn DiffSink,
    window_id: WindowId,
    view_len: usize,
    limit: usize,
    collection: &Collection,
    contents: Contents<'_>,
) {
    if sink.wants_contents(window_id, limit) {
        let slots: &[Slot] = match contents {
            Contents::Collected(slots) => slots,
            Contents::Range { view, offset, limit, slots } => {
                slots.clear();
                view.collect_range(collection, offset, limit, slots);
                slots
            }
        };
        // A sink reading the contents (a window digest) reads every row's id and
        // version, cold in a large collection: asked for all at once, their
        // misses overlap instead of coming one row after another.
        for &slot in slots {
            collection.prefetch_id_and_version(slot);
        }
        sink.window_contents(window_id, ItemList::new(collection, slots));
    }
    sink.view_len(window_id, view_len);
    sink.window_done(window_id);
}

fn check_window_limit(limit: usize) -> Result<(), ViewError> {
    if limit > limits::MAX_WINDOW_LIMIT {
        return Err(ViewError::WindowTooLarge { limit, limit_max: limits::MAX_WINDOW_LIMIT });
    }
    Ok(())
}
