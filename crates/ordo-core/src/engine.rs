//! The engine: collections, views and windows, and the batch apply loop.
//!
//! Applying a batch has three phases. *Validate* checks every operation against
//! the schema and the limits without touching anything, so a rejected batch leaves
//! no trace. *Apply* changes items one operation at a time: for each view of the
//! collection the item's old entry leaves the index, the item's fields are written,
//! and its new entry enters the index; each window records, by slot, the diffs
//! caused by that move. *Deliver* resolves each touched window's recorded diffs to
//! borrowed item data (or a reset, when that is smaller) and hands them to the sink.
//! All three phases use buffers owned by the engine and reused across batches.
//!
//! An operation visits only the views its item can be in, before or after: every
//! unkeyed view, and the keyed views of the item's old and new key values (see
//! `key_index`). So its cost does not grow with the number of views keyed by other
//! values, such as other users' views under a row predicate.
//!
//! This module is the facade: the `Engine` and its state, collections, and the
//! entry points of a batch. The phases and the rest of the API live beside it:
//! `validate` (the first phase), `apply` (the apply loop and the deliver phase),
//! `single_upsert` (the one-item path), `windows` (the window API), `references`
//! (reference links and their refresh), `schema_change` (fields added and removed,
//! collections dropped), `collection_table` and `shared` (the tables of
//! collections, schemas and view plans).

use thin_vec::ThinVec;

use crate::batch::Batch;
use crate::bulk_load::BulkLoad;
use crate::collection::Collection;
use crate::diff::DiffSink;
use crate::error::{BatchError, LoadError};
use crate::filter::FilterScratch;
use crate::ids::{CollectionId, Slot};
use crate::key_index::{KeyIndex, KeyMove};
use crate::limits;
use crate::list_diff::ListDiffScratch;
use crate::resolve::{self, Overlay};
use crate::schema::{FieldId, Schema, SchemaError};
use crate::view::View;
use crate::window::Window;

mod apply;
mod collection_table;
mod references;
mod refresh;
mod schema_change;
mod shared;
mod single_upsert;
mod validate;
mod windows;

use apply::OldRank;
use collection_table::CollectionTable;
pub use schema_change::SchemaChangeError;
use validate::validate_batch;

struct CollectionState {
    collection: Collection,
    /// Views on this collection without an equality key (indices into
    /// `Engine::views`): every update of the collection visits them.
    unkeyed_views: ThinVec<u32>,
    /// Views keyed by an equality conjunct, and the equality index of each field
    /// that keys one: an update visits only the views of its item's key values.
    keys: KeyIndex,
    /// Reference links out of this collection and into it (see `references`).
    refs: references::CollectionRefs,
}

impl CollectionState {
    fn has_views(&self) -> bool {
        !self.unkeyed_views.is_empty() || !self.keys.is_empty()
    }
}

/// Aligned to cache lines: a message moves every member's list, and each list's
/// window is cold. What a move and its delivery read (`Window`'s first fields,
/// its first diffs) is in the first line, one miss.
#[repr(C, align(64))]
struct WindowSlot {
    generation: u32,
    window: Option<Window>,
}

const _: () = assert!(std::mem::size_of::<WindowSlot>() == 128);

/// Buffers reused by every batch and window change.
#[derive(Default)]
struct Scratch {
    filter: FilterScratch,
    /// The resolved field of each `batch.fields` entry, filled by validation.
    resolved_fields: Vec<FieldId>,
    /// For the operation being applied: the views it visits (see `plan_visits`) and,
    /// position for position, where the item was in each.
    visited_views: Vec<u32>,
    old_ranks: Vec<OldRank>,
    /// For the operation being applied, per keyed field of its collection: the
    /// item's key before and after.
    key_moves: Vec<KeyMove>,
    touched_windows: Vec<u32>,
    old_slots: Vec<Slot>,
    new_slots: Vec<Slot>,
    list_diff: ListDiffScratch,
    /// Fields an operation changes, when references add derived fields to them.
    changed_fields: Vec<FieldId>,
    /// Per reference link, the hash the item's reference held before the operation.
    ref_hashes: Vec<Option<u64>>,
    /// The slots referencing a target a batch changed, read out of the reverse index.
    referencing_slots: Vec<Slot>,
    /// A chunk of those whose derived values change, and the views each moves in
    /// (see `engine/refresh`).
    gathered_items: Vec<refresh::GatheredItem>,
    gathered_views: Vec<u32>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchSummary {
    pub n_upserted: usize,
    pub n_removed: usize,
    /// Windows that received diffs.
    pub n_windows_changed: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateCollectionError {
    NameTaken {
        name: String,
    },
    /// Empty, or longer than `MAX_COLLECTION_NAME_BYTES`.
    NameInvalid {
        name_bytes: usize,
    },
    TooManyCollections {
        n_collections_max: usize,
    },
    Schema(SchemaError),
}

impl std::fmt::Display for CreateCollectionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CreateCollectionError::NameTaken { name } => {
                write!(f, "a collection named `{name}` exists already")
            }
            CreateCollectionError::NameInvalid { name_bytes } => write!(
                f,
                "a collection name must be 1..={} bytes; this one is {name_bytes}",
                limits::MAX_COLLECTION_NAME_BYTES
            ),
            CreateCollectionError::TooManyCollections { n_collections_max } => {
                write!(f, "an engine holds at most {n_collections_max} collections")
            }
            CreateCollectionError::Schema(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for CreateCollectionError {}

/// Counts for monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub n_collections: usize,
    pub n_items: usize,
    pub n_views: usize,
    /// Views registered under an equality key (included in `n_views`).
    pub n_keyed_views: usize,
    pub n_windows: usize,
    /// Views visited by the operations of every batch applied so far (one per view
    /// per operation). Divided by the operations applied, it is the work per update
    /// that grows with the number of views.
    pub n_view_visits: u64,
    /// Batches applied by the one-item path (`engine/single_upsert.rs`).
    pub n_single_upserts: u64,
}

#[derive(Default)]
pub struct Engine {
    collections: CollectionTable,
    views: Vec<Option<View>>,
    free_views: Vec<u32>,
    windows: Vec<WindowSlot>,
    free_windows: Vec<u32>,
    scratch: Scratch,
    /// See [`Engine::set_view_keying`].
    is_view_keying_disabled: bool,
    /// See [`Engine::set_single_upsert_path`].
    is_single_upsert_path_disabled: bool,
    n_view_visits: u64,
    n_single_upserts: u64,
    /// The highest version given to a batch so far (see [`Engine::apply_batch`]).
    last_version: u64,
    /// Batches staged by a store's group commit (see [`Engine::resolve_batch`]).
    overlay: Overlay,
    /// Where `apply_batch` resolves a batch with atomic operations or preconditions, reused.
    resolved: Batch,
    /// Per view (by index): the reference links of its collection it reads
    /// through and the derived fields it reads or shows (see `references`).
    view_links: Vec<references::ViewReads>,
    /// Schemas and view plans held once for every collection and view that has one.
    shared: shared::Shared,
}

impl Engine {
    pub fn new() -> Engine {
        Engine::default()
    }

    pub fn create_collection(&mut self, name: &str, schema: Schema) -> Result<CollectionId, CreateCollectionError> {
        self.check_create_collection(name, &schema)?;
        let collection_id = self.collections.insert(CollectionState {
            collection: Collection::new(name, self.shared.schema(schema)),
            unkeyed_views: ThinVec::new(),
            keys: KeyIndex::default(),
            refs: references::CollectionRefs::default(),
        });
        Ok(collection_id)
    }

    /// Checks that a collection named `name` could be created now (a store checks
    /// before it writes the schema to disk).
    pub fn check_new_collection(&self, name: &str) -> Result<(), CreateCollectionError> {
        if name.is_empty() || name.len() > limits::MAX_COLLECTION_NAME_BYTES {
            return Err(CreateCollectionError::NameInvalid { name_bytes: name.len() });
        }
        if self.collections.id_by_name(name).is_some() {
            return Err(CreateCollectionError::NameTaken { name: name.to_owned() });
        }
        if self.collections.len() >= limits::MAX_COLLECTIONS {
            return Err(CreateCollectionError::TooManyCollections { n_collections_max: limits::MAX_COLLECTIONS });
        }
        Ok(())
    }

    /// Checks that a collection named `name` with `schema` could be created now:
    /// the name as [`Engine::check_new_collection`], and every `ref` field's target live.
    pub fn check_create_collection(&self, name: &str, schema: &Schema) -> Result<(), CreateCollectionError> {
        self.check_new_collection(name)?;
        for field in schema.fields() {
            if let Some(target) = field.field_type.ref_target() {
                if self.collections.get(target).is_none() {
                    return Err(CreateCollectionError::Schema(SchemaError::UnknownRefTarget {
                        field: field.name.clone(),
                    }));
                }
            }
        }
        Ok(())
    }

    pub fn collection_id(&self, name: &str) -> Option<CollectionId> {
        self.collections.id_by_name(name)
    }

    /// Every live collection, in slot order (creation order until a drop frees a slot).
    pub fn collection_ids(&self) -> impl ExactSizeIterator<Item = CollectionId> + use<> {
        self.collections.ids().into_iter()
    }

    pub fn collection(&self, collection_id: CollectionId) -> Option<&Collection> {
        self.collections.get(collection_id).map(|state| &state.collection)
    }

    /// Heap bytes of a collection's equality index (its keyed fields' tables, the
    /// views listed per value and the per-slot links), for memory accounting:
    /// apart from [`Collection::heap_bytes`], like the reverse indexes
    /// ([`Engine::reference_heap_bytes`]).
    pub fn equality_index_heap_bytes(&self, collection_id: CollectionId) -> usize {
        self.collections.get(collection_id).map_or(0, |state| state.keys.heap_bytes())
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            n_collections: self.collections.len(),
            n_items: self.collections.iter().map(|state| state.collection.len()).sum(),
            n_views: self.views.iter().filter(|view| view.is_some()).count(),
            n_keyed_views: self.collections.iter().map(|state| state.keys.n_views()).sum(),
            n_windows: self.windows.iter().filter(|slot| slot.window.is_some()).count(),
            n_view_visits: self.n_view_visits,
            n_single_upserts: self.n_single_upserts,
        }
    }

    /// For benchmarks and tests only: with `false`, views created from now on are
    /// never keyed, so every update visits them and building one filters the whole
    /// collection (the engine as it was before keyed views). Views already created
    /// keep what they are, except a collection's lone view, which a second view
    /// created with keying on keys (see `key_lone_view`). Results are the same
    /// either way; only the cost differs.
    #[doc(hidden)]
    pub fn set_view_keying(&mut self, is_enabled: bool) {
        self.is_view_keying_disabled = !is_enabled;
    }

    /// For tests and benchmarks only: with `false`, every batch takes the general
    /// path, also the single upserts `engine/single_upsert.rs` would apply. Results
    /// are the same either way (tests/it/single_upsert.rs); only the cost differs.
    #[doc(hidden)]
    pub fn set_single_upsert_path(&mut self, is_enabled: bool) {
        self.is_single_upsert_path_disabled = !is_enabled;
    }

    /// For tests: checks every collection's equality indexes against its items
    /// (a full scan; panics on a mismatch).
    #[doc(hidden)]
    pub fn check_key_indexes(&self) {
        for state in self.collections.iter() {
            state.keys.check(&state.collection);
        }
    }

    /// Applies a batch whole, or rejects it whole with the first error found.
    /// Every window whose contents changed receives its diffs through `sink`.
    /// The items it upserts get the next version number (one more than the
    /// highest given so far); see [`Engine::apply_batch_at`] to choose it.
    pub fn apply_batch(
        &mut self,
        collection_id: CollectionId,
        batch: &Batch,
        sink: &mut dyn DiffSink,
    ) -> Result<BatchSummary, BatchError> {
        self.apply_batch_at(collection_id, batch, self.last_version + 1, sink)
    }

    /// As [`Engine::apply_batch`], giving the items the batch upserts the version
    /// `version` (a store passes the batch's sequence number, so that an item's
    /// version is the last batch that changed it). Atomic operations and
    /// preconditions are resolved against the collection's items first.
    pub fn apply_batch_at(
        &mut self,
        collection_id: CollectionId,
        batch: &Batch,
        version: u64,
        sink: &mut dyn DiffSink,
    ) -> Result<BatchSummary, BatchError> {
        if !batch.needs_state() {
            return self.apply_plain_batch(collection_id, batch, version, sink);
        }
        let mut resolved = std::mem::take(&mut self.resolved);
        // Nothing is staged outside a store's validation of a group.
        self.overlay.clear();
        let outcome = self.resolve_batch(collection_id, batch, version, &mut resolved);
        self.overlay.clear();
        let outcome = outcome.and_then(|()| self.apply_plain_batch(collection_id, &resolved, version, sink));
        self.resolved = resolved;
        outcome
    }

    /// Group commit, for a store that validates several batches before applying
    /// any: forgets the batches staged for the previous group.
    pub fn begin_group(&mut self) {
        self.overlay.clear();
    }

    /// Records a plain batch (validated, no atomic operations or preconditions)
    /// accepted into the group being validated, to be applied at `version`: a
    /// later [`Engine::resolve_batch`] of the group sees the items as it leaves them.
    pub fn stage_batch(&mut self, collection_id: CollectionId, batch: &Batch, version: u64) {
        debug_assert!(!batch.needs_state());
        if let Some(state) = self.collections.get(collection_id) {
            // Keyed by the collection's slot: a group holds no drop, so no slot changes hands within it.
            self.overlay.stage_batch(collection_id.index() as u32, state.collection.schema(), batch, version);
        }
    }

    /// Resolves a batch's atomic operations and preconditions into `out`, a plain
    /// batch of concrete values that applies the same change (what a store logs,
    /// so that a replay does not depend on the state it replays onto). Reads the
    /// items as the collection holds them, changed by the batches staged since
    /// [`Engine::begin_group`] and by the batch's own earlier operations. On
    /// success the resolved batch is staged at `version`; a failed precondition
    /// is [`BatchError::Conflict`], and then nothing is staged.
    pub fn resolve_batch(
        &mut self,
        collection_id: CollectionId,
        batch: &Batch,
        version: u64,
        out: &mut Batch,
    ) -> Result<(), BatchError> {
        let state = self.collections.get(collection_id).ok_or(BatchError::UnknownCollection)?;
        validate_batch(&state.collection, batch, 0, &mut self.scratch.resolved_fields)?;
        let index = collection_id.index() as u32;
        resolve::resolve_batch(index, &state.collection, &mut self.overlay, batch, version, out)
    }

    /// Checks a batch as [`Engine::apply_batch`] would, without applying it: a store
    /// validates batches before they touch the disk. `n_items_pending` counts the
    /// items that batches accepted but not yet applied may add to the collection.
    pub fn validate_batch(
        &mut self,
        collection_id: CollectionId,
        batch: &Batch,
        n_items_pending: usize,
    ) -> Result<(), BatchError> {
        let state = self.collections.get(collection_id).ok_or(BatchError::UnknownCollection)?;
        validate_batch(&state.collection, batch, n_items_pending, &mut self.scratch.resolved_fields)
    }

    /// Starts a bulk load into a collection that has no views: the path a store
    /// uses to rebuild the engine at start (views are built afterwards, sorting
    /// once). `n_items_hint` presizes the tables. See [`BulkLoad`].
    pub fn bulk_load(&mut self, collection_id: CollectionId, n_items_hint: usize) -> Result<BulkLoad<'_>, LoadError> {
        let state = self.collections.get(collection_id).ok_or(LoadError::UnknownCollection)?;
        // Without views there are no keyed views, hence no equality index for the
        // load to maintain (`KeyIndex` drops a field's index with its last view).
        if state.has_views() {
            return Err(LoadError::CollectionHasViews);
        }
        // Views reading this collection through a reference count as its views:
        // the load does not refresh them.
        let referrers = state.refs.referrers.clone();
        for &(referrer, link_index) in &referrers {
            let link = &self.collections.get(referrer).expect("live").refs.links[link_index as usize];
            if link.n_views > 0 {
                return Err(LoadError::CollectionHasViews);
            }
        }
        // Links without views are rebuilt when a view needs them again.
        for &(referrer, link_index) in &referrers {
            self.collections.get_mut(referrer).expect("live").refs.links[link_index as usize].is_stale = true;
        }
        let state = self.collections.get_mut(collection_id).expect("checked");
        for link in &mut state.refs.links {
            link.is_stale = true;
        }
        Ok(BulkLoad::new(&mut state.collection, n_items_hint))
    }
}

/// Pushes onto one of the engine's tables of collections, views or windows,
/// growing it by an eighth where a `Vec` doubles: a table just past a power of
/// two would otherwise hold up to twice the structs it needs, and a million
/// users' lists are a million of each (about 500 B a list at worst). Growth
/// stays amortised O(1); these pushes are on the control plane only.
pub(crate) fn push_with_slack_of_an_eighth<T>(table: &mut Vec<T>, value: T) {
    if table.len() == table.capacity() {
        table.reserve_exact((table.len() / 8).max(16));
    }
    table.push(value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::{PendingDiffs, FIRST_DIFFS_END};

    /// A member's move and its delivery read a window's range, flags, diff count
    /// and first two diffs: one line, the slot's first (see `WindowSlot`).
    #[test]
    fn a_windows_range_and_first_diffs_are_in_its_slots_first_line() {
        let slots: Vec<WindowSlot> = (0..4)
            .map(|generation| WindowSlot {
                generation,
                window: Some(Window {
                    view: 0,
                    is_tail: false,
                    needs_reset: false,
                    offset: 0,
                    limit: 20,
                    pending: PendingDiffs::new(),
                }),
            })
            .collect();
        for slot in &slots {
            let slot_start = slot as *const WindowSlot as usize;
            assert_eq!(slot_start % 64, 0, "a slot starts a line");
            let window = slot.window.as_ref().expect("live window");
            let window_start = window as *const Window as usize;
            assert!(window_start - slot_start + FIRST_DIFFS_END <= 64, "the first diffs end past the first line");
        }
    }
}
