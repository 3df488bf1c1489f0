//! Diff delivery. Windows emit `eyeball_im::VectorDiff`-shaped diffs into a
//! caller-provided [`DiffSink`] that borrows item data, so a server can encode
//! straight into its own buffers; nothing builds an owned diff list on the hot path.

use crate::collection::{Collection, ItemRef, OwnedItem};
use crate::ids::{Slot, WindowId};

/// Items borrowed from a collection, in window order.
#[derive(Clone, Copy)]
pub struct ItemList<'a> {
    collection: &'a Collection,
    slots: &'a [Slot],
}

impl<'a> ItemList<'a> {
    pub(crate) fn new(collection: &'a Collection, slots: &'a [Slot]) -> ItemList<'a> {
        ItemList { collection, slots }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn get(&self, index: usize) -> ItemRef<'a> {
        self.collection.item(self.slots[index])
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = ItemRef<'a>> + 'a {
        let collection = self.collection;
        self.slots.iter().map(move |&slot| collection.item(slot))
    }

    pub fn to_owned_items(&self) -> Vec<OwnedItem> {
        self.iter().map(|item| item.to_owned_item()).collect()
    }
}

impl std::fmt::Debug for ItemList<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter().map(|item| item.id())).finish()
    }
}

/// One diff with borrowed items. Same variants and semantics as `eyeball_im::VectorDiff`.
#[derive(Clone, Copy, Debug)]
pub enum DiffRef<'a> {
    Append { values: ItemList<'a> },
    Clear,
    PushFront { value: ItemRef<'a> },
    PushBack { value: ItemRef<'a> },
    PopFront,
    PopBack,
    Insert { index: usize, value: ItemRef<'a> },
    Set { index: usize, value: ItemRef<'a> },
    Remove { index: usize },
    Truncate { length: usize },
    Reset { values: ItemList<'a> },
}

impl DiffRef<'_> {
    pub fn to_owned_diff(&self) -> OwnedDiff {
        match *self {
            DiffRef::Append { values } => OwnedDiff::Append { values: values.to_owned_items() },
            DiffRef::Clear => OwnedDiff::Clear,
            DiffRef::PushFront { value } => OwnedDiff::PushFront { value: value.to_owned_item() },
            DiffRef::PushBack { value } => OwnedDiff::PushBack { value: value.to_owned_item() },
            DiffRef::PopFront => OwnedDiff::PopFront,
            DiffRef::PopBack => OwnedDiff::PopBack,
            DiffRef::Insert { index, value } => OwnedDiff::Insert { index, value: value.to_owned_item() },
            DiffRef::Set { index, value } => OwnedDiff::Set { index, value: value.to_owned_item() },
            DiffRef::Remove { index } => OwnedDiff::Remove { index },
            DiffRef::Truncate { length } => OwnedDiff::Truncate { length },
            DiffRef::Reset { values } => OwnedDiff::Reset { values: values.to_owned_items() },
        }
    }

    /// Number of item values the diff carries.
    pub fn n_values(&self) -> usize {
        match self {
            DiffRef::Append { values } | DiffRef::Reset { values } => values.len(),
            DiffRef::PushFront { .. } | DiffRef::PushBack { .. } | DiffRef::Insert { .. } | DiffRef::Set { .. } => 1,
            _ => 0,
        }
    }

    /// Converts to eyeball's type, mapping each borrowed item with `convert`.
    #[cfg(feature = "eyeball")]
    pub fn to_vector_diff<T: Clone>(&self, mut convert: impl FnMut(ItemRef<'_>) -> T) -> eyeball_im::VectorDiff<T> {
        use eyeball_im::VectorDiff;
        match *self {
            DiffRef::Append { values } => VectorDiff::Append { values: values.iter().map(&mut convert).collect() },
            DiffRef::Clear => VectorDiff::Clear,
            DiffRef::PushFront { value } => VectorDiff::PushFront { value: convert(value) },
            DiffRef::PushBack { value } => VectorDiff::PushBack { value: convert(value) },
            DiffRef::PopFront => VectorDiff::PopFront,
            DiffRef::PopBack => VectorDiff::PopBack,
            DiffRef::Insert { index, value } => VectorDiff::Insert { index, value: convert(value) },
            DiffRef::Set { index, value } => VectorDiff::Set { index, value: convert(value) },
            DiffRef::Remove { index } => VectorDiff::Remove { index },
            DiffRef::Truncate { length } => VectorDiff::Truncate { length },
            DiffRef::Reset { values } => VectorDiff::Reset { values: values.iter().map(&mut convert).collect() },
        }
    }
}

/// Receives the diffs of every window that changed. For one window, the diffs of
/// one call (a batch, a window change) arrive in order, followed by `window_done`.
pub trait DiffSink {
    fn diff(&mut self, window: WindowId, diff: DiffRef<'_>);

    /// All diffs of this window for the current call have been delivered.
    fn window_done(&mut self, window: WindowId) {
        let _ = window;
    }

    /// Whether the sink wants `window`'s contents once the call is done (through
    /// `window_contents`); `limit` is the window's limit. Asked once per window and
    /// call, after its diffs. Reading the contents costs a walk of the window's
    /// range, so a sink asks only when it uses them (a server's window digest).
    fn wants_contents(&mut self, window: WindowId, limit: usize) -> bool {
        let _ = (window, limit);
        false
    }

    /// `window`'s contents once the call is done, in window order: sent when
    /// `wants_contents` said so, just before `view_len` and `window_done`. Read
    /// from the view itself, not from the diffs, so a sink can check the diffs
    /// against them.
    fn window_contents(&mut self, window: WindowId, items: ItemList<'_>) {
        let _ = (window, items);
    }

    /// The length of the view behind `window` once the call is done: sent once per
    /// window and call, just before `window_done`, so that a sink can tell its
    /// client the total count without asking the engine (which it cannot borrow
    /// during a batch).
    fn view_len(&mut self, window: WindowId, view_len: usize) {
        let _ = (window, view_len);
    }

    /// The diffs that follow, up to the next call, come from the batch a store
    /// numbered `seq` (its sequence number). The engine never calls this: a store
    /// does, before it applies each batch of a group (and each schema change, whose
    /// Resets reflect it), so that a sink can say which write each frame reflects.
    fn begin_batch(&mut self, seq: u64) {
        let _ = seq;
    }
}

/// A sink that drops everything, for callers that only read windows on demand.
pub struct NullSink;

impl DiffSink for NullSink {
    fn diff(&mut self, _window: WindowId, _diff: DiffRef<'_>) {}
}

/// A diff with owned items, for library users and tests.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedDiff {
    Append { values: Vec<OwnedItem> },
    Clear,
    PushFront { value: OwnedItem },
    PushBack { value: OwnedItem },
    PopFront,
    PopBack,
    Insert { index: usize, value: OwnedItem },
    Set { index: usize, value: OwnedItem },
    Remove { index: usize },
    Truncate { length: usize },
    Reset { values: Vec<OwnedItem> },
}

impl OwnedDiff {
    /// Applies the diff to a local copy of a window, with eyeball's semantics.
    /// Panics on an index out of bounds, as eyeball does: a correct stream never has one.
    pub fn apply(self, items: &mut Vec<OwnedItem>) {
        match self {
            OwnedDiff::Append { mut values } => items.append(&mut values),
            OwnedDiff::Clear => items.clear(),
            OwnedDiff::PushFront { value } => items.insert(0, value),
            OwnedDiff::PushBack { value } => items.push(value),
            OwnedDiff::PopFront => {
                assert!(!items.is_empty(), "PopFront on an empty window");
                items.remove(0);
            }
            OwnedDiff::PopBack => {
                assert!(items.pop().is_some(), "PopBack on an empty window");
            }
            OwnedDiff::Insert { index, value } => items.insert(index, value),
            OwnedDiff::Set { index, value } => items[index] = value,
            OwnedDiff::Remove { index } => {
                items.remove(index);
            }
            OwnedDiff::Truncate { length } => {
                assert!(length <= items.len(), "Truncate past the end");
                items.truncate(length)
            }
            OwnedDiff::Reset { values } => *items = values,
        }
    }

    #[cfg(feature = "eyeball")]
    pub fn into_vector_diff(self) -> eyeball_im::VectorDiff<OwnedItem> {
        use eyeball_im::VectorDiff;
        match self {
            OwnedDiff::Append { values } => VectorDiff::Append { values: values.into_iter().collect() },
            OwnedDiff::Clear => VectorDiff::Clear,
            OwnedDiff::PushFront { value } => VectorDiff::PushFront { value },
            OwnedDiff::PushBack { value } => VectorDiff::PushBack { value },
            OwnedDiff::PopFront => VectorDiff::PopFront,
            OwnedDiff::PopBack => VectorDiff::PopBack,
            OwnedDiff::Insert { index, value } => VectorDiff::Insert { index, value },
            OwnedDiff::Set { index, value } => VectorDiff::Set { index, value },
            OwnedDiff::Remove { index } => VectorDiff::Remove { index },
            OwnedDiff::Truncate { length } => VectorDiff::Truncate { length },
            OwnedDiff::Reset { values } => VectorDiff::Reset { values: values.into_iter().collect() },
        }
    }
}

/// A sink that copies every diff out: the convenient owned form.
#[derive(Default)]
pub struct CollectingSink {
    pub diffs: Vec<(WindowId, OwnedDiff)>,
}

impl CollectingSink {
    pub fn new() -> CollectingSink {
        CollectingSink::default()
    }

    /// Takes the diffs received so far for one window, in order.
    pub fn take_for(&mut self, window: WindowId) -> Vec<OwnedDiff> {
        let (taken, kept): (Vec<_>, Vec<_>) = self.diffs.drain(..).partition(|(id, _)| *id == window);
        self.diffs = kept;
        taken.into_iter().map(|(_, diff)| diff).collect()
    }
}

impl DiffSink for CollectingSink {
    fn diff(&mut self, window: WindowId, diff: DiffRef<'_>) {
        self.diffs.push((window, diff.to_owned_diff()));
    }
}

/// A diff recorded during a batch: items by slot, resolved to borrowed data only
/// when the batch is done (so a diff never sees a half-applied batch).
#[derive(Clone, Copy, Debug)]
pub(crate) enum PendingDiff {
    PushFront(Slot),
    PushBack(Slot),
    PopFront,
    PopBack,
    Insert(u32, Slot),
    Set(u32, Slot),
    Remove(u32),
}

impl PendingDiff {
    /// The item the diff carries, if any.
    pub(crate) fn slot(self) -> Option<Slot> {
        match self {
            PendingDiff::PushFront(slot)
            | PendingDiff::PushBack(slot)
            | PendingDiff::Insert(_, slot)
            | PendingDiff::Set(_, slot) => Some(slot),
            PendingDiff::PopFront | PendingDiff::PopBack | PendingDiff::Remove(_) => None,
        }
    }

    pub(crate) fn resolve(self, collection: &Collection) -> DiffRef<'_> {
        match self {
            PendingDiff::PushFront(slot) => DiffRef::PushFront { value: collection.item(slot) },
            PendingDiff::PushBack(slot) => DiffRef::PushBack { value: collection.item(slot) },
            PendingDiff::PopFront => DiffRef::PopFront,
            PendingDiff::PopBack => DiffRef::PopBack,
            PendingDiff::Insert(index, slot) => DiffRef::Insert { index: index as usize, value: collection.item(slot) },
            PendingDiff::Set(index, slot) => DiffRef::Set { index: index as usize, value: collection.item(slot) },
            PendingDiff::Remove(index) => DiffRef::Remove { index: index as usize },
        }
    }
}
