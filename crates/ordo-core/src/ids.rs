//! The handles every layer passes around: collection and window ids, which the
//! engine gives out, and slots, which name an item inside its collection. A leaf:
//! it imports nothing from the crate, so the schema and the storage can name a
//! collection or an item without reaching up into the engine.

/// Index of an item's storage inside its collection.
pub(crate) type Slot = u32;

/// Identifies a collection. A dropped collection's id stays dead: a collection
/// created later may reuse its slot (`index`) but never its generation, so an
/// old id is refused as unknown instead of naming the new collection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CollectionId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl CollectionId {
    /// The collection's slot: dense, reused after a drop (for tables indexed by collection).
    pub fn index(self) -> usize {
        self.index as usize
    }

    /// Raised each time the slot is reused after a drop.
    pub fn generation(self) -> u32 {
        self.generation
    }

    /// An id made of raw parts: for a store, which persists a `ref` field's target
    /// as its own number for the collection and maps it back to a live id at open.
    /// Names no collection of an engine unless those parts came from one.
    #[doc(hidden)]
    pub fn from_raw_parts(index: u32, generation: u32) -> CollectionId {
        CollectionId { index, generation }
    }
}

/// Identifies an open window. Ids are not reused while the engine lives
/// (a generation counter guards recycled storage).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WindowId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl WindowId {
    /// A stable number for logs and wire protocols.
    pub fn as_u64(self) -> u64 {
        (self.generation as u64) << 32 | self.index as u64
    }
}
