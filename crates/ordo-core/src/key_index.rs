//! Keyed views and the equality index.
//!
//! A view whose filter requires `field == literal` at its top level (the filter
//! itself, or one child of a top-level `all`; see
//! [`crate::CompiledFilter::equality_key`]) can only ever hold items whose `field` has
//! that value. Such a view is *keyed* by `(field, value)`: it is listed under that
//! key instead of in its collection's list of unkeyed views, and an update visits
//! it only when the item's old or new value of `field` is the key's value. A
//! server that conjoins a row predicate (`owner == "u42"`) into every view of
//! 10 000 users thus visits, per update, the views of the item's owner and not
//! the 10 000.
//!
//! Keys are 64-bit hashes of the value, never the value itself: no string is
//! copied into the index, and two values that collide share one entry. That is
//! safe because a key only ever *narrows* the candidates: every visited view
//! still evaluates its whole filter, and a view built from its key's slots still
//! tests each of them. A collision costs work, never correctness.
//!
//! For every field that keys at least one view, the index also lists, per value,
//! the live slots holding it (the *equality index*), so that building a keyed
//! view reads only those slots instead of filtering the whole collection. It is
//! built by one scan when the field's first keyed view appears, kept exact by
//! every upsert and remove, and dropped with the field's last keyed view (so a
//! collection without views, the only kind a bulk load accepts, has none to
//! maintain). Each value's slots form a doubly linked list threaded through two
//! per-slot arrays: an item changing value is unlinked and linked in O(1), and
//! never allocates, however the number of items per value drifts (a `Vec` per
//! value would grow each time a value reached a new high).
//!
//! A keyed field stored interned (a membership's `owner`: a 4-byte handle per
//! slot, see `collection::interned`) also keeps, per handle, its value's views
//! when they are none or one (a user's list): the *lone-view table*. Finding a
//! slot's views through it reads the slot's handle and one 4-byte cell, where
//! the hash needs the string's head, the table's control bytes and its bucket:
//! three dependent misses per member when a room's message moves every
//! member's list. Invariant (checked by `KeyIndex::check`): for every handle a
//! live slot holds, the cell is exact, `NO_VIEW`, the one view, or `SEVERAL`.
//! It is kept so by every slot that takes a handle (`apply_moves`, which also
//! sees a handle freed and reused for another string under the same hash) and
//! by every view added or removed (which rewrites the cells of its value's
//! slots). A freed handle's cell is stale and never read: no slot holds it. A
//! column that leaves the interned layout has no handles, and its slots are
//! looked up by hash again.

use hashbrown::{DefaultHashBuilder, HashTable};
use smallvec::SmallVec;
use std::hash::BuildHasher;
use thin_vec::ThinVec;

use crate::collection::Collection;
use crate::ids::Slot;
use crate::prefetch::prefetch;
use crate::schema::FieldId;
use crate::value::Value;

/// The key a view is registered under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ViewKey {
    pub(crate) field_id: FieldId,
    pub(crate) hash: u64,
}

/// A slot's key hash for one keyed field before and after the operation being
/// applied (`None`: null, or no item), and its handle before it when the field
/// is stored interned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyMove {
    pub(crate) old: Option<u64>,
    pub(crate) new: Option<u64>,
    pub(crate) old_handle: Option<u32>,
}

/// The end of a slot list.
const NO_SLOT: Slot = Slot::MAX;

/// A lone-view cell: no view is keyed by the handle's value.
const NO_VIEW: u32 = u32::MAX;
/// A lone-view cell: several views are keyed by the handle's value (look them
/// up by hash). Also what a cell the table has not grown to yet reads as.
const SEVERAL: u32 = u32::MAX - 1;

/// One value (hash) of a keyed field: the views keyed by it and the slots holding it.
struct KeyEntry {
    hash: u64,
    /// Usually one (a user's list): inline, so that finding the entry finds its
    /// views without a dependent miss on an allocation of their own.
    views: SmallVec<[u32; 2]>,
    /// Head of the list of slots holding the value, linked by `KeyedField::next`.
    first_slot: Slot,
    n_slots: u32,
}

impl KeyEntry {
    /// The entry's lone-view cell.
    fn lone_view(&self) -> u32 {
        match self.views[..] {
            [] => NO_VIEW,
            [view] => view,
            _ => SEVERAL,
        }
    }
}

/// A field that keys at least one view, with its equality index.
pub(crate) struct KeyedField {
    pub(crate) field_id: FieldId,
    n_views: usize,
    /// By `hash`. An entry exists while it has a view or a slot.
    entries: HashTable<KeyEntry>,
    /// Per slot, the next and previous slot of its value's list (`NO_SLOT` at the
    /// ends, and for slots in no list: null values, free slots).
    next: Vec<Slot>,
    previous: Vec<Slot>,
    /// Per handle of the field's interned column: its value's views when none
    /// or one (see the module's doc). Grows with the handles.
    lone_view_by_handle: Vec<u32>,
}

/// The keyed views and equality indexes of one collection.
#[derive(Default)]
pub(crate) struct KeyIndex {
    hasher: DefaultHashBuilder,
    /// Usually one field (the row predicate's); searched linearly. Thin: most
    /// collections have none, and each pays for the header.
    fields: ThinVec<KeyedField>,
}

impl KeyIndex {
    /// The hash a value is keyed under; `None` for null and floats (which are never
    /// keys: `-0.0 == 0.0` would need equal hashes). Within one field every value
    /// has the field's type, so types need no tag.
    #[inline]
    pub(crate) fn hash_value(&self, value: Value<'_>) -> Option<u64> {
        match value {
            Value::Bool(flag) => Some(self.hasher.hash_one(flag)),
            Value::I64(number) => Some(self.hasher.hash_one(number)),
            Value::U64(number) => Some(self.hasher.hash_one(number)),
            Value::Str(text) => Some(self.hasher.hash_one(text)),
            Value::Null | Value::F64(_) => None,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    pub(crate) fn fields(&self) -> &[KeyedField] {
        &self.fields
    }

    pub(crate) fn n_views(&self) -> usize {
        self.fields.iter().map(|field| field.n_views).sum()
    }

    fn field(&self, field_id: FieldId) -> Option<&KeyedField> {
        self.fields.iter().find(|field| field.field_id == field_id)
    }

    /// Views registered under `key`.
    pub(crate) fn views_of(&self, key: ViewKey) -> &[u32] {
        self.field(key.field_id).map_or(&[], |field| field.views_of_hash(key.hash))
    }

    /// Appends to `out` the live slots whose value of `key.field_id` hashes to
    /// `key.hash` (a superset of the slots holding the key's value, on a collision).
    pub(crate) fn collect_slots(&self, key: ViewKey, out: &mut Vec<Slot>) {
        let Some(field) = self.field(key.field_id) else { return };
        let Some(entry) = field.entry(key.hash) else { return };
        out.reserve(entry.n_slots as usize);
        let mut slot = entry.first_slot;
        while slot != NO_SLOT {
            out.push(slot);
            slot = field.next[slot as usize];
        }
    }

    /// Makes sure `field_id` has an equality index, building it by one scan of the
    /// collection if it has none (the field's first keyed view).
    pub(crate) fn ensure_field(&mut self, collection: &Collection, field_id: FieldId) {
        if self.field(field_id).is_some() {
            return;
        }
        let mut field = KeyedField {
            field_id,
            n_views: 0,
            entries: HashTable::new(),
            next: vec![NO_SLOT; collection.slot_capacity()],
            previous: vec![NO_SLOT; collection.slot_capacity()],
            lone_view_by_handle: Vec::new(),
        };
        for slot in collection.live_slots() {
            if let Some(hash) = self.hash_value(collection.value(slot, field_id)) {
                field.add_slot(slot, hash);
                if let Some(handle) = collection.handle_of(slot, field_id) {
                    field.set_lone_view(handle, NO_VIEW);
                }
            }
        }
        // Usually the only keyed field: room for one (a `KeyedField` is 96 bytes, and
        // a push would make room for four, paid by every user's collection).
        self.fields.reserve_exact(1);
        self.fields.push(field);
    }

    /// Registers a view under `key`; the field's index must exist (`ensure_field`).
    pub(crate) fn add_view(&mut self, collection: &Collection, key: ViewKey, view_index: u32) {
        let field = self.fields.iter_mut().find(|field| field.field_id == key.field_id).expect("ensure_field ran");
        field.n_views += 1;
        field.entry_or_insert(key.hash).views.push(view_index);
        field.rewrite_lone_views(collection, key.hash);
    }

    /// Unregisters a view; drops the field's index with its last keyed view.
    pub(crate) fn remove_view(&mut self, collection: &Collection, key: ViewKey, view_index: u32) {
        let field_position =
            self.fields.iter().position(|field| field.field_id == key.field_id).expect("a keyed view's field");
        let field = &mut self.fields[field_position];
        let entry = field.entry_mut(key.hash).expect("a keyed view's entry");
        let view_position = entry.views.iter().position(|&index| index == view_index).expect("registered");
        entry.views.swap_remove(view_position);
        field.rewrite_lone_views(collection, key.hash);
        field.remove_entry_if_empty(key.hash);
        field.n_views -= 1;
        if field.n_views == 0 {
            // Not `swap_remove`: keeping the order keeps visits (and so delivery) deterministic.
            self.fields.remove(field_position);
        }
    }

    /// Moves `slot` between entries as `moves` (one per field, in `fields()` order)
    /// says, once `collection` holds the slot's new values.
    pub(crate) fn apply_moves(&mut self, collection: &Collection, slot: Slot, moves: &[KeyMove]) {
        debug_assert_eq!(moves.len(), self.fields.len());
        for (field, key_move) in self.fields.iter_mut().zip(moves) {
            let new_handle = key_move.new.and(collection.handle_of(slot, field.field_id));
            if key_move.old == key_move.new {
                // Another string under the same hash may have taken a freed handle
                // whose cell still names the views of the string it held before.
                if let (Some(hash), Some(handle), false) = (key_move.new, new_handle, new_handle == key_move.old_handle)
                {
                    let lone_view = field.entry(hash).expect("the slot's entry").lone_view();
                    field.set_lone_view(handle, lone_view);
                }
                continue;
            }
            if let Some(hash) = key_move.old {
                field.remove_slot(slot, hash);
            }
            if let Some(hash) = key_move.new {
                field.add_slot(slot, hash);
                if let Some(handle) = new_handle {
                    let lone_view = field.entry(hash).expect("just linked").lone_view();
                    field.set_lone_view(handle, lone_view);
                }
            }
        }
    }

    /// The views keyed by `slot`'s value of `field`: through the lone-view
    /// table when the field is stored interned and the value has at most one.
    #[inline]
    pub(crate) fn views_of_slot<'a>(&self, field: &'a KeyedField, collection: &Collection, slot: Slot) -> &'a [u32] {
        if let Some(handle) = collection.handle_of(slot, field.field_id) {
            match field.lone_view_by_handle.get(handle as usize) {
                Some(&NO_VIEW) => return &[],
                Some(&SEVERAL) | None => {}
                Some(view) => return std::slice::from_ref(view),
            }
        }
        self.hash_value(collection.value(slot, field.field_id)).map_or(&[], |hash| field.views_of_hash(hash))
    }

    /// Asks the cache for what [`KeyIndex::views_of_slot`] reads past the slot's
    /// value, once that is in cache: its lone-view cell, or its string.
    #[inline]
    pub(crate) fn prefetch_views_of_slot(&self, field: &KeyedField, collection: &Collection, slot: Slot) {
        match collection.handle_of(slot, field.field_id) {
            Some(handle) => {
                if let Some(cell) = field.lone_view_by_handle.get(handle as usize) {
                    prefetch(cell);
                }
            }
            None => collection.prefetch_text(slot, field.field_id),
        }
    }

    /// Follows a field's removal from the schema: the fields after it move down
    /// by one. No keyed view may read the removed field any more (they were ended).
    pub(crate) fn remap_after_removal(&mut self, removed: FieldId) {
        for field in &mut self.fields {
            assert_ne!(field.field_id, removed, "views keyed by a removed field are ended first");
            if field.field_id > removed {
                field.field_id = FieldId(field.field_id.0 - 1);
            }
        }
    }

    /// Heap bytes held, each part counted by its allocation: the fields' array,
    /// and per field its hash table, the views listed under each value and the
    /// two per-slot link arrays (8 B per slot of the collection).
    pub(crate) fn heap_bytes(&self) -> usize {
        thin_vec_heap_bytes(&self.fields) + self.fields.iter().map(KeyedField::heap_bytes).sum::<usize>()
    }

    /// Checks every index against the collection (a full scan, for tests).
    pub(crate) fn check(&self, collection: &Collection) {
        for field in &self.fields {
            let mut n_indexed = 0;
            for entry in field.entries.iter() {
                assert!(!entry.views.is_empty() || entry.n_slots > 0, "an empty entry was kept");
                let (mut slot, mut previous, mut n_slots) = (entry.first_slot, NO_SLOT, 0);
                while slot != NO_SLOT {
                    assert_eq!(field.previous[slot as usize], previous, "the list's back link");
                    assert_eq!(self.hash_value(collection.value(slot, field.field_id)), Some(entry.hash));
                    (previous, slot) = (slot, field.next[slot as usize]);
                    n_slots += 1;
                }
                assert_eq!(n_slots, entry.n_slots);
                n_indexed += n_slots as usize;
                field.check_lone_views(collection, entry);
            }
            let n_live_with_value = collection
                .live_slots()
                .filter(|&slot| self.hash_value(collection.value(slot, field.field_id)).is_some())
                .count();
            assert_eq!(n_indexed, n_live_with_value, "the equality index misses live slots");
        }
    }
}

/// Heap bytes of a `ThinVec`: none while it never held anything; else its
/// elements and the length and capacity it keeps in front of them.
fn thin_vec_heap_bytes<T>(vec: &ThinVec<T>) -> usize {
    match vec.capacity() {
        0 => 0,
        capacity => capacity * std::mem::size_of::<T>() + 2 * std::mem::size_of::<usize>(),
    }
}

impl KeyedField {
    /// Every cell of the entry's handles is exact (see the module's doc).
    fn check_lone_views(&self, collection: &Collection, entry: &KeyEntry) {
        let mut slot = entry.first_slot;
        while slot != NO_SLOT {
            if let Some(handle) = collection.handle_of(slot, self.field_id) {
                let cell = self.lone_view_by_handle.get(handle as usize).copied().unwrap_or(SEVERAL);
                assert_eq!(cell, entry.lone_view(), "the lone-view cell of slot {slot}'s handle {handle}");
            }
            slot = self.next[slot as usize];
        }
    }

    fn set_lone_view(&mut self, handle: u32, lone_view: u32) {
        let handle = handle as usize;
        if handle >= self.lone_view_by_handle.len() {
            // Grows with the column's handles; amortised like a Vec push.
            self.lone_view_by_handle.resize(handle + 1, SEVERAL);
        }
        self.lone_view_by_handle[handle] = lone_view;
    }

    /// Rewrites the lone-view cells of the handles held by the slots of the
    /// value hashing to `hash`, after its views changed. Usually one handle
    /// (several only on a collision), so the walk over the value's slots (a
    /// user's memberships, as many as building the view read) writes one cell
    /// over and over.
    fn rewrite_lone_views(&mut self, collection: &Collection, hash: u64) {
        let Some(entry) = self.entry(hash) else { return };
        let (lone_view, mut slot) = (entry.lone_view(), entry.first_slot);
        while slot != NO_SLOT {
            if let Some(handle) = collection.handle_of(slot, self.field_id) {
                self.set_lone_view(handle, lone_view);
            }
            slot = self.next[slot as usize];
        }
    }

    fn heap_bytes(&self) -> usize {
        self.entries.allocation_size()
            + self
                .entries
                .iter()
                .filter(|entry| entry.views.spilled())
                .map(|entry| entry.views.capacity() * std::mem::size_of::<u32>())
                .sum::<usize>()
            + (self.next.capacity() + self.previous.capacity()) * std::mem::size_of::<Slot>()
            + self.lone_view_by_handle.capacity() * std::mem::size_of::<u32>()
    }

    fn entry(&self, hash: u64) -> Option<&KeyEntry> {
        self.entries.find(hash, |entry| entry.hash == hash)
    }

    fn entry_mut(&mut self, hash: u64) -> Option<&mut KeyEntry> {
        self.entries.find_mut(hash, |entry| entry.hash == hash)
    }

    fn entry_or_insert(&mut self, hash: u64) -> &mut KeyEntry {
        self.entries
            .entry(hash, |entry| entry.hash == hash, |entry| entry.hash)
            .or_insert_with(|| KeyEntry { hash, views: SmallVec::new(), first_slot: NO_SLOT, n_slots: 0 })
            .into_mut()
    }

    /// Views keyed by the value that hashes to `hash`.
    #[inline]
    pub(crate) fn views_of_hash(&self, hash: u64) -> &[u32] {
        self.entry(hash).map_or(&[], |entry| &entry.views)
    }

    /// Links `slot` at the head of its value's list.
    fn add_slot(&mut self, slot: Slot, hash: u64) {
        if slot as usize >= self.next.len() {
            // Grows with the collection; amortised like a Vec push.
            self.next.resize(slot as usize + 1, NO_SLOT);
            self.previous.resize(slot as usize + 1, NO_SLOT);
        }
        let entry = self.entry_or_insert(hash);
        debug_assert_ne!(entry.first_slot, slot, "slot {slot} linked twice");
        let old_first = std::mem::replace(&mut entry.first_slot, slot);
        entry.n_slots += 1;
        self.next[slot as usize] = old_first;
        self.previous[slot as usize] = NO_SLOT;
        if old_first != NO_SLOT {
            self.previous[old_first as usize] = slot;
        }
    }

    /// Unlinks `slot` from the list of the value hashing to `hash`.
    fn remove_slot(&mut self, slot: Slot, hash: u64) {
        let next = std::mem::replace(&mut self.next[slot as usize], NO_SLOT);
        let previous = std::mem::replace(&mut self.previous[slot as usize], NO_SLOT);
        let entry = self.entries.find_mut(hash, |entry| entry.hash == hash).expect("the slot's old entry");
        entry.n_slots -= 1;
        if previous == NO_SLOT {
            debug_assert_eq!(entry.first_slot, slot, "a slot without a predecessor heads its list");
            entry.first_slot = next;
        } else {
            self.next[previous as usize] = next;
        }
        if next != NO_SLOT {
            self.previous[next as usize] = previous;
        }
        self.remove_entry_if_empty(hash);
    }

    fn remove_entry_if_empty(&mut self, hash: u64) {
        if let Ok(entry) = self.entries.find_entry(hash, |entry| entry.hash == hash) {
            if entry.get().views.is_empty() && entry.get().n_slots == 0 {
                entry.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{FieldType, Schema};
    use ordo_test_kit::alloc::heap_bytes_on_this_thread;

    fn owner_of(index: usize, n_owners: usize) -> String {
        format!("@user{}", index % n_owners)
    }

    /// A handle freed by one string and taken by another can keep its cell only
    /// if the new string's views are the old one's. When the new string hashes
    /// like the slot's string before it (a collision, forged here: no two short
    /// strings are known to collide), the slot stays in its entry, and only the
    /// handle's change says that the cell must be rewritten.
    #[test]
    fn a_handle_reused_under_an_unchanged_hash_names_its_new_strings_views() {
        let owner = FieldId(0);
        let mut collection = Collection::new("members", Schema::new().with_field("owner", FieldType::String));
        let (slot_a, slot_b) = (collection.insert_slot("a"), collection.insert_slot("b"));
        collection.set_value(slot_a, owner, Value::Str("x"));
        collection.set_value(slot_b, owner, Value::Str("c"));
        let mut index = KeyIndex::default();
        index.ensure_field(&collection, owner);
        let hash = |index: &KeyIndex, text| index.hash_value(Value::Str(text)).expect("a string");
        let (hash_x, hash_c, hash_w) = (hash(&index, "x"), hash(&index, "c"), hash(&index, "w"));
        index.add_view(&collection, ViewKey { field_id: owner, hash: hash_x }, 5);
        index.add_view(&collection, ViewKey { field_id: owner, hash: hash_c }, 6);
        let views_of = |index: &KeyIndex, collection: &Collection, slot| {
            index.views_of_slot(&index.fields()[0], collection, slot).to_vec()
        };
        assert_eq!(views_of(&index, &collection, slot_a), [5]);

        // "x" leaves its handle free.
        let handle_of_x = collection.handle_of(slot_a, owner);
        collection.set_value(slot_a, owner, Value::Str("w"));
        index.apply_moves(
            &collection,
            slot_a,
            &[KeyMove { old: Some(hash_x), new: Some(hash_w), old_handle: handle_of_x }],
        );
        assert_eq!(views_of(&index, &collection, slot_a), [] as [u32; 0]);

        // "y" takes it, under "c"'s hash.
        let handle_of_c = collection.handle_of(slot_b, owner);
        collection.set_value(slot_b, owner, Value::Str("y"));
        assert_eq!(collection.handle_of(slot_b, owner), handle_of_x, "the freed handle is reused");
        index.apply_moves(
            &collection,
            slot_b,
            &[KeyMove { old: Some(hash_c), new: Some(hash_c), old_handle: handle_of_c }],
        );
        assert_eq!(views_of(&index, &collection, slot_b), [6], "not the views of the handle's string before");
    }

    /// `heap_bytes` is what the index holds, counted by the allocator (which
    /// `lib.rs` installs for the unit tests): after its build, after views come
    /// and go, after slots change value, and after the collection grows. A count
    /// by table capacity, or one leaving out the per-slot links, differs.
    #[test]
    fn heap_bytes_equal_what_the_index_allocated() {
        const N_OWNERS: usize = 300;
        let owner = FieldId(0);
        let mut collection = Collection::new("members", Schema::new().with_field("owner", FieldType::String));
        collection.reserve(6_000);
        for index in 0..5_000 {
            let slot = collection.insert_slot(&format!("m{index}"));
            collection.set_value(slot, owner, Value::Str(&owner_of(index, N_OWNERS)));
        }
        // Slots whose owner is set later: null, outside the index when it is built.
        // Setting values every owner already holds allocates nothing in the
        // collection, so that what is counted below is the index's.
        for index in 5_000..6_000 {
            collection.insert_slot(&format!("m{index}"));
        }
        let bytes_before = heap_bytes_on_this_thread();
        let held = |_: &KeyIndex| heap_bytes_on_this_thread() - bytes_before;
        let mut index = KeyIndex::default();
        index.ensure_field(&collection, owner);
        let key = |index: &KeyIndex, user: usize| ViewKey {
            field_id: owner,
            hash: index.hash_value(Value::Str(&owner_of(user, N_OWNERS))).expect("a string"),
        };
        for user in 0..N_OWNERS {
            index.add_view(&collection, key(&index, user), user as u32);
        }
        assert_eq!(held(&index), index.heap_bytes() as i64, "after the build");
        for user in (0..N_OWNERS).step_by(3) {
            index.remove_view(&collection, key(&index, user), user as u32);
        }
        assert_eq!(held(&index), index.heap_bytes() as i64, "after views went");
        for slot in (0..5_000).step_by(7) {
            let old = key(&index, slot).hash;
            let new = key(&index, slot + 1).hash;
            let old_handle = collection.handle_of(slot as Slot, owner);
            collection.set_value(slot as Slot, owner, Value::Str(&owner_of(slot + 1, N_OWNERS)));
            index.apply_moves(&collection, slot as Slot, &[KeyMove { old: Some(old), new: Some(new), old_handle }]);
        }
        for slot in 5_000..6_000 {
            collection.set_value(slot, owner, Value::Str(&owner_of(slot as usize, N_OWNERS)));
            let new = Some(key(&index, slot as usize).hash);
            index.apply_moves(&collection, slot, &[KeyMove { old: None, new, old_handle: None }]);
        }
        assert_eq!(held(&index), index.heap_bytes() as i64, "after moves and new slots");
        assert!(index.heap_bytes() >= 6_000 * 2 * std::mem::size_of::<Slot>(), "the links count");
        drop(index);
        assert_eq!(heap_bytes_on_this_thread(), bytes_before, "the index held all it allocated");
    }
}
