//! Reference fields: views that sort, filter and show a target's fields through
//! a `ref` field (`room.recency`), kept exact when either side changes.
//!
//! A *link* is one ref field of a referencing collection that some view reads
//! through. It holds the reverse index (target id → referencing slots, see
//! `reference`) and the *derived fields* its views read: for each target field
//! read (`room.recency`), a column of the referencing collection holding the
//! target's current value for every referencing item (null while the target is
//! absent). Views compile against derived fields like any column, so the sort
//! prefix, comparisons, filters and diffs need nothing new, and the prefix never
//! contradicts the order (it is encoded from the same column the comparison reads).
//!
//! Writes keep derived columns exact:
//! - an upsert that writes a ref field (or creates an item) re-reads its target,
//!   and counts the link's derived fields among the fields it changes;
//! - after a batch on a *target* collection, every referencing item of every
//!   target id the batch touched is refreshed: its changed derived values are
//!   written between its removal from and re-insertion into each view that reads
//!   through the link (a move), or, when none changed, the views record a `Set`
//!   (the target's other fields or payload, shown through a projection, may have
//!   changed). Views that read nothing through the link are not visited. The
//!   refresh reads the target collection as the batch left it, so the diffs
//!   reflect the batch's end state. Cost: O(r · log n) for r referencing items.
//!
//! A link is maintained only while a view reads through it; when its last view
//! goes it turns *stale*, and the next view to need it rebuilds its index and
//! derived columns in one scan (as a view build scans the collection).

use thin_vec::ThinVec;

use crate::batch::Batch;
use crate::error::ViewError;
use crate::ids::{CollectionId, Slot};
use crate::limits;
use crate::reference::RefIndex;
use crate::schema::{FieldId, FieldType};
use crate::value::Value;
use crate::view_def::ViewDef;

use super::collection_table::OtherCollections;
use super::refresh::{refresh_referencing, RefreshContext, TargetChange};
use super::{CollectionState, Engine};

/// One ref field of a collection that views read through.
pub(super) struct RefLink {
    pub(super) ref_field: FieldId,
    pub(super) target: CollectionId,
    /// `(derived field of the referencing collection, field of the target)`.
    pub(super) derived: Vec<(FieldId, FieldId)>,
    pub(super) index: RefIndex,
    /// Views that read through the link; while 0 the link is not maintained.
    pub(super) n_views: usize,
    /// Index and derived columns out of date (no view read through the link for a while).
    pub(super) is_stale: bool,
}

impl RefLink {
    fn is_live(&self) -> bool {
        !self.is_stale
    }
}

/// The reference state of one collection.
#[derive(Default)]
pub(super) struct CollectionRefs {
    /// Links out of this collection (at most one per ref field; at most 64, one bit
    /// each in `Engine::view_links`).
    pub(super) links: ThinVec<RefLink>,
    /// Links into this collection: `(referencing collection, link index)`.
    pub(super) referrers: ThinVec<(CollectionId, u8)>,
}

/// What one view reads through references: its links (one bit per link of its
/// collection) and its derived fields (one bit per [`FieldId::derived_index`],
/// which stays under `limits::MAX_DERIVED_FIELDS` = 64), whether it filters,
/// sorts or only shows them (`ViewDef::shown`).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ViewReads {
    links: u64,
    derived: u64,
}

impl ViewReads {
    /// Whether the view reads or shows one of the derived fields in `mask`.
    pub(super) fn reads_any_derived(&self, mask: u64) -> bool {
        self.derived & mask != 0
    }
}

/// A target field read through a reference, resolved.
struct RefRead<'a> {
    name: &'a str,
    ref_field: FieldId,
    target: CollectionId,
    target_field: FieldId,
}

/// Every field name a view definition reads.
fn names_read<'a>(def: &'a ViewDef, out: &mut Vec<&'a str>) {
    def.filter.any_field(&mut |field| {
        out.push(field);
        false
    });
    out.extend(def.sort.iter().map(|key| key.field.as_str()));
    out.extend(def.shown.iter().map(String::as_str));
}

/// Whether two values of one column are the same (floats by bits: `-0.0` and
/// `0.0` encode differently in a sort prefix).
pub(super) fn same_value(left: Value<'_>, right: Value<'_>) -> bool {
    match (left, right) {
        (Value::F64(left), Value::F64(right)) => left.to_bits() == right.to_bits(),
        (left, right) => left == right,
    }
}

impl Engine {
    /// Resolves the names a view reads through references (`room.recency`),
    /// refusing bad ones, and makes sure each has a live link and derived field
    /// (so that the view then compiles against the collection's schema). Returns
    /// the links and derived fields the view reads, one bit each.
    pub(super) fn prepare_view_refs(
        &mut self,
        collection_id: CollectionId,
        def: &ViewDef,
    ) -> Result<ViewReads, ViewError> {
        let mut names = Vec::new();
        names_read(def, &mut names);
        let state = self.collections.get(collection_id).ok_or(ViewError::UnknownCollection)?;
        let schema = state.collection.schema();
        let mut reads = Vec::new();
        for name in names {
            // A schema field's own name wins (names with dots predate references).
            if schema.field_id(name).is_some() {
                continue;
            }
            let Some((ref_name, target_name)) = name.split_once('.') else { continue };
            if target_name.contains('.') {
                return Err(ViewError::TooManyHops { field: name.to_owned() });
            }
            let ref_field =
                schema.field_id(ref_name).ok_or_else(|| ViewError::UnknownField { field: name.to_owned() })?;
            let FieldType::Ref(target) = schema.field(ref_field).field_type else {
                return Err(ViewError::NotAReference { field: name.to_owned(), ref_field: ref_name.to_owned() });
            };
            let target_state = self.collections.get(target).ok_or(ViewError::UnknownCollection)?;
            let target_field = target_state
                .collection
                .schema()
                .field_id(target_name)
                .ok_or_else(|| ViewError::UnknownField { field: name.to_owned() })?;
            reads.push(RefRead { name, ref_field, target, target_field });
        }
        if reads.is_empty() {
            return Ok(ViewReads::default());
        }
        let n_new_derived = {
            let mut new_names: Vec<&str> =
                reads.iter().map(|read| read.name).filter(|name| schema.view_field_id(name).is_none()).collect();
            new_names.sort_unstable();
            new_names.dedup();
            new_names.len()
        };
        if schema.derived_fields().len() + n_new_derived > limits::MAX_DERIVED_FIELDS {
            return Err(ViewError::TooManyDerivedFields { n_fields_max: limits::MAX_DERIVED_FIELDS });
        }
        // Checked: from here on nothing fails.
        let mut view_reads = ViewReads::default();
        for read in &reads {
            let link_index = self.ensure_link(collection_id, read.ref_field, read.target);
            self.ensure_derived(collection_id, link_index, read.name, read.target_field);
            view_reads.links |= 1 << link_index;
            let schema = self.collections.get(collection_id).expect("checked").collection.schema();
            let derived = schema.view_field_id(read.name).expect("ensured");
            view_reads.derived |= 1 << derived.derived_index();
        }
        for link_index in 0..64 {
            if view_reads.links & (1 << link_index) != 0 {
                self.rebuild_if_stale(collection_id, link_index);
            }
        }
        let state = self.collections.get(collection_id).expect("checked");
        super::apply::reserve_for_refreshes(state, &mut self.scratch);
        Ok(view_reads)
    }

    fn ensure_link(&mut self, collection_id: CollectionId, ref_field: FieldId, target: CollectionId) -> usize {
        let state = self.collections.get_mut(collection_id).expect("checked");
        if let Some(index) = state.refs.links.iter().position(|link| link.ref_field == ref_field) {
            return index;
        }
        // One link per ref field, and a schema has at most 64 fields.
        debug_assert!(state.refs.links.len() < 64);
        state.refs.links.push(RefLink {
            ref_field,
            target,
            derived: Vec::new(),
            index: RefIndex::default(),
            n_views: 0,
            is_stale: true,
        });
        let link_index = state.refs.links.len() - 1;
        let target_state = self.collections.get_mut(target).expect("checked");
        target_state.refs.referrers.push((collection_id, link_index as u8));
        link_index
    }

    fn ensure_derived(&mut self, collection_id: CollectionId, link_index: usize, name: &str, target_field: FieldId) {
        let (state, others) = self.collections.split_mut(collection_id).expect("checked");
        if state.collection.schema().view_field_id(name).is_some() {
            return;
        }
        let link = &state.refs.links[link_index];
        let target = others.get(link.target).expect("checked");
        let field_type = target.collection.schema().field(target_field).field_type.value_type();
        let derived = state.collection.add_derived_column(name, field_type);
        let link = &mut state.refs.links[link_index];
        link.derived.push((derived, target_field));
        if link.is_live() {
            // Fill the new column now; a stale link fills all of its columns below.
            fill_derived_column(state, &others, link_index, derived, target_field);
        }
    }

    /// Brings a stale link up to date: its index by one scan, its derived columns from the targets.
    fn rebuild_if_stale(&mut self, collection_id: CollectionId, link_index: usize) {
        let (state, others) = self.collections.split_mut(collection_id).expect("checked");
        if state.refs.links[link_index].is_live() {
            return;
        }
        let derived = {
            let CollectionState { collection, refs, .. } = &mut *state;
            let link = &mut refs.links[link_index];
            link.index = RefIndex::default();
            for slot in collection.live_slots() {
                if let Value::Str(id) = collection.value(slot, link.ref_field) {
                    let hash = link.index.hash_id(id);
                    link.index.link(slot, hash);
                }
            }
            link.index.spare_after_build();
            link.is_stale = false;
            link.derived.clone()
        };
        for (derived_field, target_field) in derived {
            fill_derived_column(state, &others, link_index, derived_field, target_field);
        }
    }

    /// Heap bytes of a collection's reverse indexes (its derived columns count
    /// in [`crate::Collection::heap_bytes`]), for memory accounting.
    pub fn reference_heap_bytes(&self, collection_id: CollectionId) -> usize {
        self.collections.get(collection_id).map_or(0, |state| {
            state.refs.links.iter().map(|link| link.index.heap_bytes() + link.derived.capacity() * 4).sum()
        })
    }

    /// Records what a new view reads through references.
    pub(super) fn register_view_links(&mut self, collection_id: CollectionId, view_index: u32, reads: ViewReads) {
        let index = view_index as usize;
        while self.view_links.len() <= index {
            super::push_with_slack_of_an_eighth(&mut self.view_links, ViewReads::default());
        }
        self.view_links[index] = reads;
        let mask = reads.links;
        let state = self.collections.get_mut(collection_id).expect("live");
        for (link_index, link) in state.refs.links.iter_mut().enumerate() {
            if mask & (1 << link_index) != 0 {
                link.n_views += 1;
            }
        }
    }

    /// Records that a view is gone; a link without views turns stale.
    pub(super) fn unregister_view_links(&mut self, collection_index: u32, view_index: u32) {
        let Some(reads) = self.view_links.get_mut(view_index as usize).map(std::mem::take) else { return };
        let mask = reads.links;
        if mask == 0 {
            return;
        }
        let state = &mut self.collections[collection_index];
        for (link_index, link) in state.refs.links.iter_mut().enumerate() {
            if mask & (1 << link_index) != 0 {
                link.n_views -= 1;
                if link.n_views == 0 {
                    link.is_stale = true;
                }
            }
        }
    }

    /// Forgets every link out of a collection and its derived fields, closing the
    /// windows whose views read through them (a schema change of the collection
    /// or of a target: derived fields are positional and target field ids shift).
    pub(super) fn forget_refs_of(&mut self, collection_id: CollectionId) -> Vec<crate::ids::WindowId> {
        let Some(state) = self.collections.get(collection_id) else { return Vec::new() };
        if state.refs.links.is_empty() {
            return Vec::new();
        }
        let reading: Vec<usize> = (0..self.views.len())
            .filter(|&index| {
                self.views[index].as_ref().is_some_and(|view| view.collection == collection_id.index)
                    && self.view_links.get(index).is_some_and(|reads| reads.links != 0)
            })
            .collect();
        let ended = self.close_windows_of_views(&reading);
        let state = self.collections.get_mut(collection_id).expect("checked");
        let links = std::mem::take(&mut state.refs.links);
        state.collection.clear_derived_columns();
        for link in links {
            if let Some(target) = self.collections.get_mut(link.target) {
                target.refs.referrers.retain(|&(referrer, _)| referrer != collection_id);
            }
        }
        ended
    }

    /// After a batch on `target_id`: refreshes every item referencing an id the
    /// batch touched, in every view reading through its link, and delivers those
    /// views' windows. Returns how many windows changed.
    pub(super) fn refresh_referrers(
        &mut self,
        target_id: CollectionId,
        batch: &Batch,
        sink: &mut dyn crate::diff::DiffSink,
    ) -> usize {
        let Some(target_state) = self.collections.get(target_id) else { return 0 };
        let n_referrers = target_state.refs.referrers.len();
        let mut n_windows_changed = 0;
        for referrer_index in 0..n_referrers {
            let (referrer_id, link_index) =
                self.collections.get(target_id).expect("live").refs.referrers[referrer_index];
            let link_index = link_index as usize;
            let Engine { collections, views, windows, scratch, view_links, n_view_visits, .. } = self;
            let Some((state, others)) = collections.split_mut(referrer_id) else { continue };
            if !state.refs.links[link_index].is_live() {
                continue;
            }
            let target = others.get(target_id).expect("live");
            // Copied out of the index (which the refreshes leave alone) so that the
            // refreshes may borrow the collection's state mutably.
            let mut referencing = std::mem::take(&mut scratch.referencing_slots);
            for op in &batch.ops {
                let id = batch.id(op);
                let link = &state.refs.links[link_index];
                let ref_field = link.ref_field;
                // A reference column is interned: the id's handle, looked up once,
                // stands for the id (no slot refers to an id the dictionary lacks).
                let Some(handle) = state.collection.interned_handle(ref_field, id) else { continue };
                referencing.clear();
                referencing.extend_from_slice(link.index.slots(link.index.hash_id(id)));
                let change = TargetChange { target, target_slot: target.collection.find_slot(id), link_index, handle };
                let mut context = RefreshContext { views, windows, scratch, view_links, n_view_visits };
                refresh_referencing(state, &change, &mut context, &referencing);
            }
            scratch.referencing_slots = referencing;
            n_windows_changed += super::apply::deliver_pending(&state.collection, views, windows, scratch, sink);
        }
        n_windows_changed
    }
}

/// Writes a derived column for every live referencing slot from its target.
fn fill_derived_column(
    state: &mut CollectionState,
    others: &OtherCollections<'_>,
    link_index: usize,
    derived_field: FieldId,
    target_field: FieldId,
) {
    let link = &state.refs.links[link_index];
    let (ref_field, target) = (link.ref_field, others.get(link.target).expect("a link's target is live"));
    let slots: Vec<Slot> = state.collection.live_slots().collect();
    for slot in slots {
        let value = match state.collection.value(slot, ref_field) {
            Value::Str(id) => {
                target.collection.find_slot(id).map_or(Value::Null, |t| target.collection.value(t, target_field))
            }
            _ => Value::Null,
        };
        state.collection.set_value(slot, derived_field, value);
    }
}

/// Before an upsert or remove of `slot` in a collection with links: the hash each
/// live link's reference holds now (`None`: null, stale link, or a new item).
pub(super) fn hashes_before(state: &CollectionState, slot: Option<Slot>, out: &mut Vec<Option<u64>>) {
    out.clear();
    for link in &state.refs.links {
        out.push(match (slot, link.is_live()) {
            (Some(slot), true) => match state.collection.value(slot, link.ref_field) {
                Value::Str(id) => Some(link.index.hash_id(id)),
                _ => None,
            },
            _ => None,
        });
    }
}

/// Adds to `changed` the derived fields of every live link whose ref field is in
/// `written`: they change with the reference.
pub(super) fn derived_changed_by(state: &CollectionState, written: &[FieldId], changed: &mut Vec<FieldId>) {
    for link in &state.refs.links {
        if link.is_live() && written.contains(&link.ref_field) {
            changed.extend(link.derived.iter().map(|&(derived, _)| derived));
        }
    }
}

/// After an upsert wrote `slot` (`is_new`: a new item; `written`: the fields it
/// wrote): relinks the slot where its reference changed and re-reads the targets
/// of the references it wrote.
pub(super) fn after_upsert(
    state: &mut CollectionState,
    others: &OtherCollections<'_>,
    slot: Slot,
    is_new: bool,
    written: &[FieldId],
    old_hashes: &[Option<u64>],
) {
    let CollectionState { collection, refs, .. } = state;
    for (link, &old_hash) in refs.links.iter_mut().zip(old_hashes) {
        if !link.is_live() || !(is_new || written.contains(&link.ref_field)) {
            continue;
        }
        let target = others.get(link.target).expect("a link's target is live");
        let target_slot = match collection.value(slot, link.ref_field) {
            Value::Str(id) => {
                let new_hash = link.index.hash_id(id);
                if old_hash != Some(new_hash) {
                    if let Some(old_hash) = old_hash {
                        link.index.unlink(slot, old_hash);
                    }
                    link.index.link(slot, new_hash);
                }
                target.collection.find_slot(id)
            }
            _ => {
                if let Some(old_hash) = old_hash {
                    link.index.unlink(slot, old_hash);
                }
                None
            }
        };
        for &(derived, target_field) in &link.derived {
            let value = target_slot.map_or(Value::Null, |t| target.collection.value(t, target_field));
            collection.set_value(slot, derived, value);
        }
    }
}

/// Before a remove of `slot`: takes it out of every live link's index.
pub(super) fn before_remove(state: &mut CollectionState, old_hashes: &[Option<u64>], slot: Slot) {
    for (link, &old_hash) in state.refs.links.iter_mut().zip(old_hashes) {
        if let Some(old_hash) = old_hash {
            link.index.unlink(slot, old_hash);
        }
    }
}
