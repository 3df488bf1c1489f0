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

use thin_vec::ThinVec;

use crate::anchor::{resolve_anchor, ItemPosition, WindowAnchor, WindowRange};
use crate::batch::{Batch, OpKind, StoredOp};
use crate::bulk_load::BulkLoad;
use crate::collection::Collection;
use crate::diff::{DiffRef, DiffSink, ItemList};
use crate::error::{BatchError, LoadError, ViewError};
use crate::filter::FilterScratch;
use crate::ids::{CollectionId, Slot, WindowId};
use crate::key_index::{KeyIndex, KeyMove, ViewKey};
use crate::limits;
use crate::list_diff::{emit_list_diff, ListDiffScratch};
use crate::order_tree::Entry;
use crate::resolve::{self, Overlay};
use crate::schema::{FieldId, Schema, SchemaError};
use crate::view::{compare_entries, View, ViewPlan};
use crate::view_def::ViewDef;
use crate::window::{ViewChange, Window};
use crate::OwnedItem;

mod collection_table;
mod references;
mod schema_change;
mod shared;
mod single_upsert;
mod validate;

use collection_table::{CollectionTable, OtherCollections};
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

struct WindowSlot {
    generation: u32,
    window: Option<Window>,
}

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

    fn apply_plain_batch(
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
            // Room for a typical batch's diffs, so that a window's first updates do not allocate.
            pending: Vec::with_capacity(range.limit.min(4) + 1),
            needs_reset: false,
        });
        let window_id = WindowId { index: window_index, generation: slot.generation };
        self.views[view_index as usize].as_mut().expect("live view").windows.push(window_index);
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
            finish_window(sink, window_id, view.len());
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
            finish_window(sink, window_id, new_len);
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
        finish_window(sink, window_id, view.len());
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
            Some(key) => state.keys.add_view(key, view_index),
            None => state.unkeyed_views.push(view_index),
        }
        self.register_view_links(collection_id, view_index, link_mask);
        Ok(view_index)
    }

    /// Removes a window from its view, dropping the view when no window is left.
    fn detach_window(&mut self, view_index: u32, window_index: u32) {
        let view = self.views[view_index as usize].as_mut().expect("live view");
        view.windows.retain(|&index| index != window_index);
        self.drop_view_if_unused(view_index);
    }

    /// Drops a view that no window looks at.
    fn drop_view_if_unused(&mut self, view_index: u32) {
        let view = self.views[view_index as usize].as_mut().expect("live view");
        if view.windows.is_empty() {
            let (collection, key) = (view.collection, view.key);
            let view = self.views[view_index as usize].take().expect("live view");
            self.shared.release_plan(view.plan);
            self.free_views.push(view_index);
            let state = &mut self.collections[collection];
            match key {
                Some(key) => state.keys.remove_view(key, view_index),
                None => state.unkeyed_views.retain(|&index| index != view_index),
            }
            self.unregister_view_links(collection, view_index);
        }
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
    state.keys.add_view(key, view_index);
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

/// Ends a window's diffs of one call: its view's length, then `window_done`.
fn finish_window(sink: &mut dyn DiffSink, window_id: WindowId, view_len: usize) {
    sink.view_len(window_id, view_len);
    sink.window_done(window_id);
}

fn check_window_limit(limit: usize) -> Result<(), ViewError> {
    if limit > limits::MAX_WINDOW_LIMIT {
        return Err(ViewError::WindowTooLarge { limit, limit_max: limits::MAX_WINDOW_LIMIT });
    }
    Ok(())
}

/// Lists in `scratch.visited_views` the views an operation on an item visits:
/// every unkeyed view and, per keyed field, the views keyed by the item's old value
/// and by its new one; fills `scratch.key_moves` with those values' hashes. `slot`
/// is the item's (`None`: a new item); `written` the upsert writing it (`None`: a
/// remove, after which the item has no value). A view keyed by a value the item
/// neither had nor gets holds it neither before nor after, so skipping it changes
/// nothing. The lists are disjoint (a view has at most one key), so no view is
/// listed twice.
fn plan_visits(
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
        if let Some(hash) = old {
            visited_views.extend_from_slice(field.views_of_hash(hash));
        }
        if let (Some(hash), true) = (new, new != old) {
            visited_views.extend_from_slice(field.views_of_hash(hash));
        }
        key_moves.push(KeyMove { old, new });
    }
}

/// Takes a slot's entry out of every view in `scratch.visited_views`, recording
/// old ranks. `slot` is `None` for a new item (in no view yet). `changed_fields`
/// lists the fields the operation writes (`None`: all of them, as for a remove);
/// a view that reads none of them keeps the entry where it is.
fn remove_from_views(
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
                fields.iter().any(|&field_id| view.plan.sort.reads_field(field_id)),
                fields.iter().any(|&field_id| view.plan.filter.reads_fields().contains(&field_id)),
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
                            view.plan.sort.encode_prefix(&state.collection, slot),
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
        let (sort, collection) = (&view.plan.sort, &state.collection);
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
enum OldRank {
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
fn insert_into_views(
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
fn insert_entry(view: &mut View, collection: &Collection, slot: Slot, is_member: bool) -> Option<usize> {
    view.set_member(slot, is_member);
    if is_member {
        let entry = Entry { prefix: view.plan.sort.encode_prefix(collection, slot), slot };
        let sort = &view.plan.sort;
        let tree = view.index.tree_mut();
        Some(tree.insert(entry, |left, right| compare_entries(sort, collection, left, right)))
    } else {
        None
    }
}

#[allow(clippy::too_many_arguments)]
fn apply_upsert(
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
    state.keys.apply_moves(slot, &scratch.key_moves);
    insert_into_views(state, views, windows, scratch, slot, true);
}

/// Returns whether the id existed.
fn apply_remove(
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
    state.keys.apply_moves(slot, &scratch.key_moves);
    if !state.refs.links.is_empty() {
        references::hashes_before(state, Some(slot), &mut scratch.ref_hashes);
        references::before_remove(state, &scratch.ref_hashes, slot);
    }
    state.collection.remove_slot(slot);
    true
}

/// Hands every touched window's diffs to the sink; returns how many windows changed.
fn deliver_pending(
    collection: &Collection,
    views: &mut [Option<View>],
    windows: &mut [WindowSlot],
    scratch: &mut Scratch,
    sink: &mut dyn DiffSink,
) -> usize {
    let n_windows = scratch.touched_windows.len();
    for &window_index in &scratch.touched_windows {
        let slot = &mut windows[window_index as usize];
        let window_id = WindowId { index: window_index, generation: slot.generation };
        let window = slot.window.as_mut().expect("live window");
        let view = views[window.view as usize].as_mut().expect("live view");
        let final_len = window.len_for(view.len());
        // A reset costs one diff carrying `final_len` values; recorded diffs carry at most one each.
        if window.needs_reset || window.pending.len() > final_len.max(1) {
            if final_len == 0 {
                sink.diff(window_id, DiffRef::Clear);
            } else {
                let slots = &mut scratch.new_slots;
                slots.clear();
                view.collect_range(collection, window.offset, window.limit, slots);
                sink.diff(window_id, DiffRef::Reset { values: ItemList::new(collection, slots) });
            }
        } else {
            for &pending in &window.pending {
                sink.diff(window_id, pending.resolve(collection));
            }
        }
        finish_window(sink, window_id, view.len());
        window.pending.clear();
        window.needs_reset = false;
    }
    scratch.touched_windows.clear();
    n_windows
}
