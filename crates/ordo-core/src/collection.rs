//! A keyed collection: typed hot columns kept apart from the cold payload.
//!
//! Items live in slots (`u32`). Each hot field is one column indexed by slot
//! (structure of arrays), so filters and key encoders touch only the fields they
//! read, and the payload, which is only ever carried, never shares a cache line
//! with them. Slots freed by a remove are recycled only after the batch that
//! freed them has delivered its diffs, so a diff may still borrow their data.
//!
//! The columns themselves are in `column`, their two string layouts in
//! `string_head` and `interned`; this module keeps beside them the ids and their
//! index, the versions and the payloads, and hands out items (`ItemRef`).

use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};
use thin_vec::ThinVec;

use crate::ids::Slot;
use crate::prefetch::prefetch;
use crate::schema::{FieldId, FieldType, Schema};
use crate::slot_id::{IdIndexEntry, SlotId};
use crate::value::{OwnedValue, Value};

mod column;
mod interned;
mod string_head;

pub(crate) use column::Column;
use interned::NULL_HANDLE;
use string_head::StringHead;

/// As a long string's copy (`string_head::copy_reusing_capacity_str`), for a payload
/// (an item's buffer is reused by its next payload).
fn copy_reusing_capacity_payload(target: &mut ThinVec<u8>, bytes: &[u8]) {
    target.clear();
    if target.capacity() < bytes.len() {
        target.reserve(bytes.len().next_power_of_two().max(16));
    }
    target.extend_from_slice(bytes);
}

/// Heap bytes of a payload: none when it never held bytes; else its buffer and
/// the length and capacity `ThinVec` keeps in front of it.
fn thin_payload_heap_bytes(payload: &ThinVec<u8>) -> usize {
    match payload.capacity() {
        0 => 0,
        capacity => capacity + 2 * std::mem::size_of::<usize>(),
    }
}

/// An id-index entry waiting for a bulk load to finish, with its id's hash.
pub(crate) struct PendingIndexEntry {
    hash: u64,
    entry: IdIndexEntry,
}

pub struct Collection {
    name: Box<str>,
    /// Shared with the collections created with an identical schema (see
    /// `engine::shared`), copied on write.
    schema: Arc<Schema>,
    columns: Vec<Column>,
    /// The columns of the schema's derived fields (target fields read through a
    /// reference, kept here so that views sort and filter on them as on any
    /// column), by [`FieldId::derived_index`]. Written only by `engine::references`.
    derived_columns: ThinVec<Column>,
    /// Per slot, the item's id (held only here: the id index refers to it).
    ids: Vec<SlotId>,
    /// One pointer per slot up to the last slot that was given a payload; the
    /// slots after it have an empty one. A collection whose items carry no
    /// payload (memberships) holds none, and an empty payload allocates nothing
    /// (see `Cargo.toml`).
    payloads: Vec<ThinVec<u8>>,
    /// Per slot: the version of the item, the sequence number of the last batch that changed it.
    versions: Vec<u64>,
    alive: Vec<bool>,
    /// id -> slot, by the id's hash (see `IdIndexEntry`).
    id_index: HashTable<IdIndexEntry>,
    hasher: DefaultHashBuilder,
    /// Slots ready for reuse. This and the other vectors that are empty in most
    /// collections are thin (8 bytes where a `Vec` is 24): every user's list pays
    /// for their headers (the 1 KiB of fixed heap per list of `tests/it/many_lists.rs`).
    free_slots: ThinVec<Slot>,
    /// Slots removed by the batch being applied; they join `free_slots` once its diffs are out.
    freed_this_batch: ThinVec<Slot>,
    n_items: usize,
}

impl Collection {
    pub(crate) fn new(name: &str, schema: impl Into<Arc<Schema>>) -> Collection {
        let schema = schema.into();
        let columns = schema.fields().iter().map(|field| Column::new(field.field_type)).collect();
        Collection {
            name: name.into(),
            schema,
            columns,
            derived_columns: ThinVec::new(),
            ids: Vec::new(),
            payloads: Vec::new(),
            versions: Vec::new(),
            alive: Vec::new(),
            id_index: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            free_slots: ThinVec::new(),
            freed_this_batch: ThinVec::new(),
            n_items: 0,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The schema as shared: views compile against it and share plans by it.
    pub(crate) fn shared_schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    /// The schema, for the engine to let go of when the collection is dropped.
    pub(crate) fn into_shared_schema(self) -> Arc<Schema> {
        self.schema
    }

    /// Number of live items.
    pub fn len(&self) -> usize {
        self.n_items
    }

    pub fn is_empty(&self) -> bool {
        self.n_items == 0
    }

    /// Number of slots ever allocated (live, freed and pending).
    pub(crate) fn slot_capacity(&self) -> usize {
        self.ids.len()
    }

    pub(crate) fn find_slot(&self, id: &str) -> Option<Slot> {
        let hash = self.hasher.hash_one(id.as_bytes());
        self.id_index.find(hash, |entry| entry.holds(hash, id.as_bytes(), &self.ids)).map(|entry| entry.slot)
    }

    pub fn get(&self, id: &str) -> Option<ItemRef<'_>> {
        self.find_slot(id).map(|slot| self.item(slot))
    }

    pub(crate) fn item(&self, slot: Slot) -> ItemRef<'_> {
        ItemRef { collection: self, slot }
    }

    /// Live items in slot order (not a view order).
    pub fn items(&self) -> impl Iterator<Item = ItemRef<'_>> + '_ {
        (0..self.ids.len() as Slot).filter(|&slot| self.alive[slot as usize]).map(|slot| self.item(slot))
    }

    pub(crate) fn live_slots(&self) -> impl Iterator<Item = Slot> + '_ {
        (0..self.ids.len() as Slot).filter(|&slot| self.alive[slot as usize])
    }

    pub(crate) fn id_of(&self, slot: Slot) -> &str {
        self.ids[slot as usize].as_str()
    }

    /// Reads one field of a slot.
    pub(crate) fn value(&self, slot: Slot, field_id: FieldId) -> Value<'_> {
        let slot = slot as usize;
        // The field's type is looked up only for word columns, the one kind that
        // needs it: a bool or string read (a filter's `left == false`, a keyed
        // view's `owner == user`) skips the schema.
        match self.column(field_id) {
            Column::Bool { present, .. } if !present.get(slot) => Value::Null,
            Column::Bool { values, .. } => Value::Bool(values.get(slot)),
            Column::Word { present, .. } if !present[slot] => Value::Null,
            Column::Word { bits, .. } => match self.schema.field(field_id).field_type {
                FieldType::I64 => Value::I64(bits[slot] as i64),
                FieldType::U64 => Value::U64(bits[slot]),
                _ => Value::F64(f64::from_bits(bits[slot])),
            },
            // Short strings are read from the column's head, not their heap buffer; a
            // null's head is never whole, so only a long string or a null asks `is_null`.
            Column::Str { values, heads } => match heads[slot].whole() {
                Some(text) => Value::Str(text),
                None if heads[slot].is_null() => Value::Null,
                None => Value::Str(values.get(slot)),
            },
            Column::Interned(column) => column.get(slot).map_or(Value::Null, |text| Value::Str(text.text())),
        }
    }

    /// The handle of `text` in an interned column (a reference field's), if some
    /// slot holds it: comparing handles then compares the strings.
    pub(crate) fn interned_handle(&self, field_id: FieldId, text: &str) -> Option<u32> {
        match self.column(field_id) {
            Column::Interned(column) => column.find(text),
            _ => unreachable!("reference columns stay interned"),
        }
    }

    /// A slot's handle when `field_id`'s column is interned (any string column
    /// may be, until it converts to heads) and the slot is not null.
    #[inline]
    pub(crate) fn handle_of(&self, slot: Slot, field_id: FieldId) -> Option<u32> {
        match self.column(field_id) {
            Column::Interned(column) => Some(column.handle(slot as usize)).filter(|&handle| handle != NULL_HANDLE),
            _ => None,
        }
    }

    /// A slot's handle in an interned column (`NULL_HANDLE` for null).
    #[inline]
    pub(crate) fn handle_at(&self, slot: Slot, field_id: FieldId) -> u32 {
        match self.column(field_id) {
            Column::Interned(column) => column.handle(slot as usize),
            _ => unreachable!("reference columns stay interned"),
        }
    }

    /// Asks the cache for `slot`'s value of `field_id` ahead of a read.
    #[inline]
    pub(crate) fn prefetch_value(&self, slot: Slot, field_id: FieldId) {
        self.column(field_id).prefetch_slot(slot as usize);
    }

    /// Asks the cache for what every sink reads of `slot`'s item in a diff: its
    /// id, payload pointer and version (each in its own per-slot vector).
    #[inline]
    pub(crate) fn prefetch_item(&self, slot: Slot) {
        self.prefetch_id_and_version(slot);
        if let Some(payload) = self.payloads.get(slot as usize) {
            prefetch(payload);
        }
    }

    /// Asks the cache for what names `slot`'s item and its state: its id and
    /// version (what a window digest reads of each row).
    #[inline]
    pub(crate) fn prefetch_id_and_version(&self, slot: Slot) {
        let slot = slot as usize;
        if slot < self.ids.len() {
            prefetch(&self.ids[slot]);
            prefetch(&self.versions[slot]);
        }
    }

    /// For an interned string field, once `slot`'s entry is in cache: asks for its string.
    #[inline]
    pub(crate) fn prefetch_text(&self, slot: Slot, field_id: FieldId) {
        self.column(field_id).prefetch_text(slot as usize);
    }

    #[inline]
    pub(crate) fn column(&self, field_id: FieldId) -> &Column {
        if field_id.is_derived() {
            return &self.derived_columns[field_id.derived_index()];
        }
        &self.columns[field_id.index()]
    }

    /// Adds a derived field (a target field read through a reference) with a
    /// null column; returns its id. The engine fills it.
    pub(crate) fn add_derived_column(&mut self, name: &str, field_type: FieldType) -> FieldId {
        debug_assert!(!matches!(field_type, FieldType::Ref(_)), "derived fields hold values, not references");
        let mut column = Column::new(field_type);
        column.reserve(0, self.ids.len());
        for slot in 0..self.ids.len() {
            column.push_null(slot);
        }
        self.derived_columns.push(column);
        let field_id = Arc::make_mut(&mut self.schema).push_derived(name, field_type);
        debug_assert_eq!(field_id.derived_index(), self.derived_columns.len() - 1);
        field_id
    }

    /// Forgets every derived field (their views are gone or being recompiled).
    pub(crate) fn clear_derived_columns(&mut self) {
        self.derived_columns.clear();
        if !self.schema.derived_fields().is_empty() {
            self.schema = Arc::new(self.schema.without_derived());
        }
    }

    /// Makes room for `n_items` more items in every table (bulk loads).
    pub(crate) fn reserve(&mut self, n_items: usize) {
        let (ids, hasher) = (&self.ids, &self.hasher);
        self.id_index.reserve(n_items, |entry| hasher.hash_one(ids[entry.slot as usize].as_bytes()));
        self.ids.reserve(n_items);
        self.versions.reserve(n_items);
        self.alive.reserve(n_items);
        let n_slots = self.ids.len();
        for column in self.columns.iter_mut().chain(&mut self.derived_columns) {
            column.reserve(n_slots, n_items);
        }
    }

    /// Allocates a slot for a new id, with every field null and an empty payload.
    /// Reuses a freed slot when there is one, so steady-state churn allocates nothing
    /// (except when the new id is longer than the recycled slot's buffer).
    pub(crate) fn insert_slot(&mut self, id: &str) -> Slot {
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                let index = slot as usize;
                self.ids[index].set(id);
                if let Some(payload) = self.payloads.get_mut(index) {
                    payload.clear();
                }
                self.versions[index] = 0;
                for column in self.columns.iter_mut().chain(&mut self.derived_columns) {
                    column.set_null(index);
                }
                slot
            }
            None => {
                let slot = self.ids.len() as Slot;
                self.ids.push(SlotId::new(id));
                self.versions.push(0);
                self.alive.push(false);
                for column in self.columns.iter_mut().chain(&mut self.derived_columns) {
                    column.push_null(slot as usize);
                }
                slot
            }
        };
        self.alive[slot as usize] = true;
        let hash = self.hasher.hash_one(id.as_bytes());
        let (ids, hasher) = (&self.ids, &self.hasher);
        self.id_index.insert_unique(hash, IdIndexEntry::new(hash, slot), |entry| {
            hasher.hash_one(ids[entry.slot as usize].as_bytes())
        });
        self.n_items += 1;
        slot
    }

    /// Appends an item (`values` validated: each converts to its field's type)
    /// without entering its id in the id index: the bulk-load
    /// path, which indexes every new slot at the end in one cache-friendly pass
    /// ([`Collection::index_slots_from`]). Until then the id cannot be found.
    pub(crate) fn push_unindexed_slot(&mut self, id: &str, version: u64, values: &[Value<'_>], payload: &[u8]) -> Slot {
        debug_assert_eq!(values.len(), self.columns.len());
        let schema = &self.schema;
        let slot = self.ids.len() as Slot;
        self.ids.push(SlotId::new(id));
        // Exactly the payload's size: a bulk load keeps memory at what the data needs
        // (a million ~200-byte previews would take 256 bytes each if rounded up). The
        // first update that brings a longer payload rounds the buffer up, once.
        if !payload.is_empty() {
            self.payloads.resize_with(slot as usize, ThinVec::new);
            self.payloads.push(ThinVec::from(payload));
        }
        self.versions.push(version);
        self.alive.push(true);
        for ((column, field), &value) in self.columns.iter_mut().zip(schema.fields()).zip(values) {
            column.push(slot as usize, value.coerce_to(field.field_type).expect("validated by the caller"));
        }
        // Derived fields are rebuilt by the engine before a view reads them (their links are stale).
        for column in &mut self.derived_columns {
            column.push_null(slot as usize);
        }
        self.n_items += 1;
        slot
    }

    /// The id-index entry of a slot pushed by [`Collection::push_unindexed_slot`],
    /// with its id's hash: made while the id is at hand, entered by
    /// [`Collection::index_slots_from`].
    pub(crate) fn pending_index_entry(&self, slot: Slot) -> PendingIndexEntry {
        let hash = self.hasher.hash_one(self.ids[slot as usize].as_bytes());
        PendingIndexEntry { hash, entry: IdIndexEntry::new(hash, slot) }
    }

    /// Enters the pending entries of slots `first_slot..` into the id index. On a
    /// duplicate id, nothing is entered, the slots are removed again, and the
    /// duplicate is returned.
    ///
    /// Why the sort: inserting a million ids in key order touches the index's
    /// buckets at random, a cache and TLB miss each (~450 ns per id on the
    /// benchmark machine). hashbrown places an entry by the low bits of its hash,
    /// so inserting in order of those bits walks the table front to back. The
    /// entries carry 32 bits of their hash, so the walk compares ids (`ids[slot]`,
    /// at random) only on a real duplicate.
    pub(crate) fn index_slots_from(
        &mut self,
        first_slot: Slot,
        pending: &mut [PendingIndexEntry],
    ) -> Result<(), String> {
        debug_assert_eq!(first_slot as usize + pending.len(), self.ids.len());
        let (ids, hasher) = (&self.ids, &self.hasher);
        self.id_index.reserve(pending.len(), |entry| hasher.hash_one(ids[entry.slot as usize].as_bytes()));
        // hashbrown's capacity is 7/8 of its power-of-two bucket count (for 8+ buckets).
        let n_buckets = (self.id_index.capacity() / 7 * 8) as u64;
        if n_buckets.is_power_of_two() {
            let bucket_mask = n_buckets - 1;
            pending.sort_unstable_by_key(|pending| pending.hash & bucket_mask);
        }
        let mut n_inserted = 0;
        let mut duplicate = None;
        for pending in pending.iter() {
            let id = ids[pending.entry.slot as usize].as_bytes();
            match self.id_index.entry(
                pending.hash,
                |entry| entry.holds(pending.hash, id, ids),
                |entry| hasher.hash_one(ids[entry.slot as usize].as_bytes()),
            ) {
                hashbrown::hash_table::Entry::Occupied(_) => {
                    duplicate = Some(pending.entry.slot);
                    break;
                }
                hashbrown::hash_table::Entry::Vacant(vacant) => {
                    vacant.insert(pending.entry);
                    n_inserted += 1;
                }
            }
        }
        let Some(duplicate) = duplicate else { return Ok(()) };
        let duplicate_id = self.ids[duplicate as usize].as_str().to_owned();
        for pending in &pending[..n_inserted] {
            match self.id_index.find_entry(pending.hash, |entry| entry.slot == pending.entry.slot) {
                Ok(entry) => {
                    entry.remove();
                }
                Err(_) => unreachable!("entered above"),
            }
        }
        self.truncate_slots(first_slot);
        Err(duplicate_id)
    }

    /// Removes slots `first_slot..`, which must be unindexed (a bulk load rolled back).
    pub(crate) fn truncate_slots(&mut self, first_slot: Slot) {
        let len = first_slot as usize;
        if len >= self.ids.len() {
            return;
        }
        let n_removed = self.alive[len..].iter().filter(|&&alive| alive).count();
        self.ids.truncate(len);
        self.payloads.truncate(len);
        self.versions.truncate(len);
        self.alive.truncate(len);
        for column in self.columns.iter_mut().chain(&mut self.derived_columns) {
            column.truncate(len);
        }
        self.n_items -= n_removed;
    }

    pub(crate) fn set_value(&mut self, slot: Slot, field_id: FieldId, value: Value<'_>) {
        if field_id.is_derived() {
            self.derived_columns[field_id.derived_index()].set(slot as usize, value);
            return;
        }
        self.columns[field_id.index()].set(slot as usize, value);
    }

    pub(crate) fn set_version(&mut self, slot: Slot, version: u64) {
        self.versions[slot as usize] = version;
    }

    pub(crate) fn version_of(&self, slot: Slot) -> u64 {
        self.versions[slot as usize]
    }

    pub(crate) fn set_payload(&mut self, slot: Slot, payload: &[u8]) {
        let index = slot as usize;
        if index >= self.payloads.len() {
            if payload.is_empty() {
                return;
            }
            // Grows with the slots given a payload; amortised like a Vec push.
            self.payloads.resize_with(index + 1, ThinVec::new);
        }
        copy_reusing_capacity_payload(&mut self.payloads[index], payload);
    }

    /// Unlinks an item from the id index. Its data stays readable until
    /// [`Collection::recycle_freed_slots`], because diffs of the current batch may reference it.
    pub(crate) fn remove_slot(&mut self, slot: Slot) {
        let hash = self.hasher.hash_one(self.ids[slot as usize].as_bytes());
        match self.id_index.find_entry(hash, |entry| entry.slot == slot) {
            Ok(entry) => {
                entry.remove();
            }
            Err(_) => unreachable!("a live slot is always in the id index"),
        }
        self.alive[slot as usize] = false;
        self.freed_this_batch.push(slot);
        self.n_items -= 1;
    }

    pub(crate) fn recycle_freed_slots(&mut self) {
        self.free_slots.append(&mut self.freed_this_batch);
    }

    /// Appends a column to a schema already checked (`schema` is the current one
    /// plus the new field, last), holding `value` (of the field's type, or null) in
    /// every slot, live or free: a free slot's fields are reset when it is reused.
    pub(crate) fn add_column(&mut self, schema: Schema, value: Value<'_>) {
        debug_assert_eq!(schema.len(), self.schema.len() + 1);
        let field_type = schema.fields().last().expect("the new field").field_type;
        let mut column = Column::new(field_type);
        column.reserve(0, self.ids.len());
        for slot in 0..self.ids.len() {
            column.push(slot, value);
        }
        self.columns.push(column);
        self.schema = Arc::new(schema);
    }

    /// Removes a field's column; the fields after it move down by one.
    pub(crate) fn remove_column(&mut self, field_id: FieldId) {
        self.columns.remove(field_id.index());
        // `without_field` drops the derived fields; the engine adds back those its views still read.
        self.derived_columns.clear();
        self.schema = Arc::new(self.schema.without_field(field_id));
    }

    /// Whether a string or reference field's column is interned (`None`: no such
    /// string field). For tests of the two layouts; not a stable API.
    #[doc(hidden)]
    pub fn string_column_is_interned(&self, field_name: &str) -> Option<bool> {
        match self.column(self.schema.field_id(field_name)?) {
            Column::Interned(_) => Some(true),
            Column::Str { .. } => Some(false),
            Column::Bool { .. } | Column::Word { .. } => None,
        }
    }

    /// Approximate heap bytes held, for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        self.heap_parts().iter().map(|&(_, bytes)| bytes).sum()
    }

    /// [`Collection::heap_bytes`] by part, to see where the bytes per item go: the
    /// ids, the id index, payloads, versions and liveness, then each column by
    /// field name (derived fields by their dotted name).
    pub fn heap_parts(&self) -> Vec<(String, usize)> {
        let mut parts = vec![
            (
                "ids".to_owned(),
                self.ids.capacity() * std::mem::size_of::<SlotId>()
                    + self.ids.iter().map(SlotId::heap_bytes).sum::<usize>(),
            ),
            ("id index".to_owned(), self.id_index.allocation_size()),
            (
                "payloads".to_owned(),
                self.payloads.capacity() * std::mem::size_of::<ThinVec<u8>>()
                    + self.payloads.iter().map(thin_payload_heap_bytes).sum::<usize>(),
            ),
            (
                "versions, alive, free slots".to_owned(),
                self.versions.capacity() * 8 + self.alive.capacity() + self.free_slots.capacity() * 4,
            ),
        ];
        let field_ids = (0..self.columns.len())
            .map(|index| FieldId(index as u16))
            .chain((0..self.derived_columns.len()).map(FieldId::derived));
        for (field_id, column) in field_ids.zip(self.columns.iter().chain(&self.derived_columns)) {
            let bytes = match column {
                Column::Bool { values, present } => values.heap_bytes() + present.heap_bytes(),
                Column::Word { bits, present } => bits.capacity() * 8 + present.heap_bytes(),
                Column::Str { values, heads } => {
                    heads.capacity() * std::mem::size_of::<StringHead>() + values.heap_bytes()
                }
                Column::Interned(column) => column.heap_bytes(),
            };
            parts.push((format!("column {}", self.schema.field(field_id).name), bytes));
        }
        parts
    }
}

/// A borrowed view of one item: what filters read and what diff sinks receive.
#[derive(Clone, Copy)]
pub struct ItemRef<'a> {
    collection: &'a Collection,
    slot: Slot,
}

impl<'a> ItemRef<'a> {
    pub fn id(&self) -> &'a str {
        self.collection.id_of(self.slot)
    }

    pub fn payload(&self) -> &'a [u8] {
        self.collection.payloads.get(self.slot as usize).map_or(&[], |payload| payload)
    }

    /// The item's version: the sequence number of the last batch that upserted
    /// it (see [`crate::Engine::apply_batch_at`]); 0 for an item loaded without one.
    pub fn version(&self) -> u64 {
        self.collection.version_of(self.slot)
    }

    pub fn field(&self, field_id: FieldId) -> Value<'a> {
        self.collection.value(self.slot, field_id)
    }

    /// Reads a field by name; `None` if the schema has no such field.
    pub fn field_by_name(&self, name: &str) -> Option<Value<'a>> {
        self.collection.schema.field_id(name).map(|field_id| self.field(field_id))
    }

    pub fn schema(&self) -> &'a Schema {
        &self.collection.schema
    }

    /// Copies the item out, for callers that keep items beyond the borrow.
    pub fn to_owned_item(&self) -> OwnedItem {
        OwnedItem {
            id: self.id().to_owned(),
            fields: (0..self.collection.schema.len())
                .map(|index| self.field(FieldId(index as u16)).to_owned_value())
                .collect(),
            payload: self.payload().to_vec(),
        }
    }
}

impl std::fmt::Debug for ItemRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ItemRef").field("id", &self.id()).finish_non_exhaustive()
    }
}

/// An item copied out of a collection: its id, every field in schema order, and its payload.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnedItem {
    pub id: String,
    pub fields: Vec<OwnedValue>,
    pub payload: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::string_head::STRING_HEAD_BYTES;
    use super::*;

    /// Two ids whose hashes (under `collection`'s hasher) agree in the 32 bits an
    /// id-index entry keeps, found by the birthday bound (~80 000 ids).
    fn ids_with_one_tag(collection: &Collection) -> (String, String) {
        let mut seen = std::collections::HashMap::new();
        for index in 0u64.. {
            let id = format!("!room{index}:example.org");
            let tag = (collection.hasher.hash_one(id.as_bytes()) >> 32) as u32;
            if let Some(other) = seen.insert(tag, id.clone()) {
                return (other, id);
            }
        }
        unreachable!("32-bit tags collide within 2^32 + 1 ids")
    }

    /// An id-index entry whose tag matches is not yet the id sought: the id itself
    /// is compared. Two ids sharing a tag sit in one probe group of a small table
    /// (their control bytes, 7 bits of the tag, match too), so each lookup meets
    /// the other's entry first or second; matching on the tag alone would answer
    /// the wrong slot, or a slot for an absent id.
    #[test]
    fn a_tag_collision_finds_only_the_id_sought() {
        let mut collection = Collection::new("c", Schema::new().with_field("n", FieldType::U64));
        let (first, second) = ids_with_one_tag(&collection);
        assert_ne!(first, second);
        let first_slot = collection.insert_slot(&first);
        assert_eq!(collection.find_slot(&first), Some(first_slot));
        assert_eq!(collection.find_slot(&second), None, "an absent id sharing a tag");
        let second_slot = collection.insert_slot(&second);
        assert_eq!(collection.find_slot(&first), Some(first_slot));
        assert_eq!(collection.find_slot(&second), Some(second_slot));
        collection.remove_slot(first_slot);
        assert_eq!(collection.find_slot(&first), None, "a removed id sharing a tag");
        assert_eq!(collection.find_slot(&second), Some(second_slot));
    }

    /// Reads through the head and through the heap buffer give the written value,
    /// before and after a shorter or longer value replaces it.
    #[test]
    fn string_values_read_back_through_heads() {
        let schema = Schema::new().with_field("name", FieldType::String);
        let mut collection = Collection::new("c", schema);
        let slot = collection.insert_slot("x");
        let field_id = FieldId(0);
        for text in ["ünïcödé ünïcödé ünïcödé 😀", "short", "a much longer value that lives on the heap ✓", ""]
        {
            collection.set_value(slot, field_id, Value::Str(text));
            assert_eq!(collection.value(slot, field_id), Value::Str(text));
        }
    }

    /// A head-layout column marks null in the head (`StringHead::NULL`), with no
    /// bitmap: null, the empty string, a string of exactly the head's length and a
    /// long one must all read back as written, through `value` and `str_at` (what
    /// filters and sort keys read), including a slot set to null and back, a long
    /// string's slot set to null and then to a short one (its stale buffer must not
    /// show), and slots pushed null (new items, a bulk load's nulls).
    #[test]
    fn head_layout_marks_null_in_the_head() {
        let schema = Schema::new().with_field("name", FieldType::String);
        let mut collection = Collection::new("c", schema);
        let field_id = FieldId(0);
        // Distinct names turn the column into the head layout.
        let slots: Vec<Slot> = (0..100).map(|index| collection.insert_slot(&format!("i{index}"))).collect();
        for (index, &slot) in slots.iter().enumerate() {
            collection.set_value(slot, field_id, Value::Str(&format!("room {index}")));
        }
        assert_eq!(collection.string_column_is_interned("name"), Some(false));
        let at_head_length = "h".repeat(STRING_HEAD_BYTES);
        let long = "a long value, past the head, that lives on the heap ✓".repeat(2);
        let texts = [None, Some(""), Some(at_head_length.as_str()), Some(long.as_str())];
        let read = |collection: &Collection, slot: Slot| {
            let through_str_at = collection.column(field_id).str_at(slot as usize).map(|text| text.text());
            let through_value = match collection.value(slot, field_id) {
                Value::Null => None,
                Value::Str(text) => Some(text),
                other => panic!("a string column read {other:?}"),
            };
            assert_eq!(through_str_at, through_value, "slot {slot}");
            through_value.map(str::to_owned)
        };
        // Every value after every other one, so each is also set over null and over itself.
        let slot = slots[3];
        for &before in &texts {
            for &after in &texts {
                for text in [before, after, None, after] {
                    collection.set_value(slot, field_id, text.map_or(Value::Null, Value::Str));
                    assert_eq!(read(&collection, slot).as_deref(), text, "{before:?} then {after:?}");
                }
            }
        }
        // Untouched neighbours keep their values; a new slot (pushed null) reads null.
        assert_eq!(read(&collection, slots[2]).as_deref(), Some("room 2"));
        assert_eq!(read(&collection, slots[4]).as_deref(), Some("room 4"));
        let new_slot = collection.insert_slot("new");
        assert_eq!(read(&collection, new_slot), None);
        collection.set_value(new_slot, field_id, Value::Str(&long));
        assert_eq!(read(&collection, new_slot).as_deref(), Some(long.as_str()));
        // A recycled slot starts null again, its long buffer notwithstanding.
        collection.remove_slot(new_slot);
        collection.recycle_freed_slots();
        assert_eq!(collection.insert_slot("again"), new_slot);
        assert_eq!(read(&collection, new_slot), None);
        // The empty string is not null, and a bulk load's null is.
        collection.set_value(new_slot, field_id, Value::Str(""));
        assert_eq!(read(&collection, new_slot).as_deref(), Some(""));
        let loaded = collection.push_unindexed_slot("loaded", 0, &[Value::Null], b"");
        assert_eq!(read(&collection, loaded), None);
    }

    /// Bitmaps know no length of their own (the slot count is the collection's):
    /// pushes cross word boundaries and grow the box, and a slot pushed again after
    /// a rollback (`truncate_slots`) reads what was pushed, not the stale bit.
    #[test]
    fn bool_columns_read_back_across_growth_and_rollback() {
        let schema = Schema::new().with_field("flag", FieldType::Bool);
        let mut collection = Collection::new("c", schema);
        let field_id = FieldId(0);
        let value_of = |index: usize| match index % 3 {
            0 => Value::Null,
            1 => Value::Bool(true),
            _ => Value::Bool(false),
        };
        for index in 0..300 {
            collection.push_unindexed_slot(&format!("i{index}"), 0, &[value_of(index)], b"");
        }
        for index in 0..300 {
            assert_eq!(collection.value(index as Slot, field_id), value_of(index), "slot {index}");
        }
        // Roll back to mid-word, then push the opposite values over the stale bits.
        collection.truncate_slots(70);
        let flipped = |index: usize| match index % 3 {
            0 => Value::Bool(true),
            1 => Value::Null,
            _ => Value::Bool(true),
        };
        for index in 70..200 {
            collection.push_unindexed_slot(&format!("j{index}"), 0, &[flipped(index)], b"");
        }
        for index in 0..200 {
            let expected = if index < 70 { value_of(index) } else { flipped(index) };
            assert_eq!(collection.value(index as Slot, field_id), expected, "slot {index}");
        }
    }

    /// Items without a payload cost nothing for it, not even a pointer (the
    /// memory figure per membership counts on it); payloads read back whole
    /// through every change, on slots before and after the last one given a
    /// payload, and a slot reused after a remove starts empty.
    #[test]
    fn empty_payloads_take_no_heap_and_payloads_read_back() {
        let mut collection = Collection::new("c", Schema::new());
        let slots: Vec<Slot> = (0..1000).map(|index| collection.insert_slot(&format!("m{index}"))).collect();
        let payload_bytes = |collection: &Collection| {
            collection.heap_parts().into_iter().find(|(part, _)| part == "payloads").expect("payloads part").1
        };
        collection.set_payload(slots[900], b"");
        assert_eq!(payload_bytes(&collection), 0, "no payload, no pointers");
        collection.set_payload(slots[500], b"late");
        assert_eq!(collection.item(slots[500]).payload(), b"late");
        assert_eq!(
            (collection.item(slots[499]).payload(), collection.item(slots[501]).payload()),
            (&b""[..], &b""[..])
        );
        let slot = slots[7];
        let long = vec![b'p'; 300];
        for payload in [&b"preview"[..], &long, b"", b"short again", b""] {
            collection.set_payload(slot, payload);
            assert_eq!(collection.item(slot).payload(), payload);
        }
        assert!(payload_bytes(&collection) >= collection.payloads.capacity() * 8 + 300, "a held buffer is counted");
        collection.set_payload(slot, b"kept");
        collection.remove_slot(slot);
        collection.recycle_freed_slots();
        let reused = collection.insert_slot("new");
        assert_eq!(reused, slot);
        assert_eq!(collection.item(reused).payload(), b"");
    }
}
