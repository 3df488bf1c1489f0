//! Interned (dictionary-encoded) string columns.
//!
//! A column of references, or of a string field with few distinct values (a
//! membership's `owner`), repeats the same strings over and over. Stored per
//! slot in the head layout (`Column::Str`: a 32-byte `StringHead`, which also
//! marks null, and an 8-byte long-string pointer) it costs 40 bytes a slot; interned it
//! costs a 4-byte handle per slot, and each distinct string is stored once in the
//! column's dictionary, with a count of the slots holding it.
//!
//! Invariants (checked by `StringDict::check` in the tests):
//! - a handle is live iff its count is non-zero; the index holds exactly the live
//!   handles, and no two live handles hold equal strings;
//! - each live handle's count is the number of slots holding it (null is
//!   `NULL_HANDLE`, held by no entry);
//! - a handle whose count drops to zero leaves the index and joins the free list;
//!   its head and long-string buffer stay, so that reusing it for a string of no
//!   greater length allocates nothing.
//!
//! A string column starts interned and converts once, in O(slots), to the head
//! layout when its distinct values pass `CONVERT_DISTINCT_MIN` and half its slots
//! (room names are unique: they keep the head layout, which sort keys and text
//! filters read without following a handle). It never converts back. A reference
//! column stays interned (its ids repeat as often as targets are shared).

use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;

use super::string_head::{LongStrings, StrRef, StringHead};
use crate::prefetch::prefetch;

/// The handle of a null slot.
pub(crate) const NULL_HANDLE: u32 = u32::MAX;

/// A string column converts to the head layout only past this many distinct
/// values. Low enough that a small collection of unique names (a 100-room list of
/// `many-lists`) converts, for interned unique strings cost more than heads (a
/// handle, and a head, long-string pointer, count and table entry per string:
/// ~60 bytes against ~41). A column filled so that its first slots hold more than
/// this many distinct values although the whole has few (memberships loaded room
/// by room rather than user by user) converts too: the decision sees only the
/// slots so far, and is never taken back.
pub(crate) const CONVERT_DISTINCT_MIN: usize = 64;

/// The distinct strings of one column, each with its count of slots.
#[derive(Default)]
pub(crate) struct StringDict {
    /// Per handle, the string's head (and the whole string when short).
    heads: Vec<StringHead>,
    /// Per handle, the string when longer than its head.
    long: LongStrings,
    /// Per handle, the number of slots holding it; 0 for a free handle.
    counts: Vec<u32>,
    /// The live handles, hashed by their string's bytes.
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// Handles whose count fell to zero, reused before new ones are made.
    free: Vec<u32>,
    n_live: usize,
}

impl StringDict {
    #[inline]
    pub(crate) fn str_ref(&self, handle: u32) -> StrRef<'_> {
        StrRef::new(&self.heads[handle as usize], &self.long, handle as usize)
    }

    #[inline]
    pub(crate) fn text(&self, handle: u32) -> &str {
        self.str_ref(handle).text()
    }

    /// Number of distinct strings held.
    #[cfg(test)]
    pub(crate) fn n_live(&self) -> usize {
        self.n_live
    }

    /// The handle of `text`, if some slot holds it.
    pub(crate) fn find(&self, text: &str) -> Option<u32> {
        let hash = self.hasher.hash_one(text.as_bytes());
        self.index.find(hash, |&handle| self.text(handle) == text).copied()
    }

    /// The handle of `text`, its count raised by one; a new (or reused free) one
    /// if no slot holds it yet.
    pub(crate) fn acquire(&mut self, text: &str) -> u32 {
        let hash = self.hasher.hash_one(text.as_bytes());
        let (heads, long) = (&self.heads, &self.long);
        if let Some(&handle) =
            self.index.find(hash, |&handle| StrRef::new(&heads[handle as usize], long, handle as usize).text() == text)
        {
            self.counts[handle as usize] += 1;
            return handle;
        }
        let handle = match self.free.pop() {
            Some(handle) => {
                self.heads[handle as usize] = StringHead::new(text);
                self.long.set(handle as usize, text);
                handle
            }
            None => {
                let handle = self.heads.len() as u32;
                assert!(handle < NULL_HANDLE, "a column holds fewer than 2^32 - 1 distinct strings");
                self.heads.push(StringHead::new(text));
                self.long.push(text);
                self.counts.push(0);
                handle
            }
        };
        self.counts[handle as usize] = 1;
        let (heads, long, hasher) = (&self.heads, &self.long, &self.hasher);
        self.index.insert_unique(hash, handle, |&handle| {
            hasher.hash_one(StrRef::new(&heads[handle as usize], long, handle as usize).text().as_bytes())
        });
        self.n_live += 1;
        handle
    }

    /// Lowers a handle's count by one; at zero the handle is freed.
    pub(crate) fn release(&mut self, handle: u32) {
        let count = &mut self.counts[handle as usize];
        debug_assert!(*count > 0, "released a free handle");
        *count -= 1;
        if *count > 0 {
            return;
        }
        let hash = self.hasher.hash_one(self.text(handle).as_bytes());
        match self.index.find_entry(hash, |&entry| entry == handle) {
            Ok(entry) => {
                entry.remove();
            }
            Err(_) => unreachable!("a live handle is in the index"),
        }
        self.free.push(handle);
        self.n_live -= 1;
    }

    fn heap_bytes(&self) -> usize {
        self.heads.capacity() * std::mem::size_of::<StringHead>()
            + self.long.heap_bytes()
            + self.counts.capacity() * 4
            + self.index.capacity() * (4 + 1)
            + self.free.capacity() * 4
    }

    /// Checks the invariants against the handles of every slot (a full scan, for tests).
    #[cfg(test)]
    fn check(&self, slot_handles: &[u32]) {
        let mut counts = vec![0u32; self.heads.len()];
        for &handle in slot_handles.iter().filter(|&&handle| handle != NULL_HANDLE) {
            counts[handle as usize] += 1;
        }
        assert_eq!(counts, self.counts, "counts are the slots holding each handle");
        let n_live = counts.iter().filter(|&&count| count > 0).count();
        assert_eq!(self.n_live, n_live);
        assert_eq!(self.index.len(), n_live, "the index holds the live handles");
        assert_eq!(self.free.len() + n_live, self.heads.len(), "every handle is live or free");
        for handle in (0..self.heads.len() as u32).filter(|&handle| counts[handle as usize] > 0) {
            assert_eq!(self.find(self.text(handle)), Some(handle), "a live handle is found by its string");
        }
    }
}

/// An interned string column: a handle per slot into the column's dictionary.
pub(crate) struct InternedColumn {
    handles: Vec<u32>,
    /// Made with the column's first string: a user's empty collection holds one
    /// column per field, and an empty dictionary inline (~150 bytes) would cost
    /// each of them that much (`many-lists` counts it).
    dict: Option<Box<StringDict>>,
    /// False for a reference column, which stays interned.
    may_convert: bool,
}

impl InternedColumn {
    #[inline]
    pub(crate) fn prefetch_slot(&self, slot: usize) {
        if let Some(handle) = self.handles.get(slot) {
            prefetch(handle);
        }
    }

    /// Asks the cache for the head of the string `slot` holds (its handle read).
    #[inline]
    pub(crate) fn prefetch_text(&self, slot: usize) {
        let handle = self.handles.get(slot).copied().unwrap_or(NULL_HANDLE);
        if let (Some(dict), false) = (&self.dict, handle == NULL_HANDLE) {
            if let Some(head) = dict.heads.get(handle as usize) {
                prefetch(head);
            }
        }
    }

    pub(crate) fn new(may_convert: bool) -> InternedColumn {
        InternedColumn { handles: Vec::new(), dict: None, may_convert }
    }

    pub(crate) fn len(&self) -> usize {
        self.handles.len()
    }

    /// The slot's handle (`NULL_HANDLE` for null).
    #[inline]
    pub(crate) fn handle(&self, slot: usize) -> u32 {
        self.handles[slot]
    }

    /// The handle of `text`, if some slot holds it.
    pub(crate) fn find(&self, text: &str) -> Option<u32> {
        self.dict.as_ref().and_then(|dict| dict.find(text))
    }

    #[cfg(test)]
    fn dict(&self) -> &StringDict {
        self.dict.as_deref().expect("a string was set")
    }

    /// The dictionary, which a slot holding a handle implies.
    #[inline]
    fn held_dict(&self) -> &StringDict {
        match &self.dict {
            Some(dict) => dict,
            None => unreachable!("a slot holds a handle only once the dictionary exists"),
        }
    }

    fn dict_mut(&mut self) -> &mut StringDict {
        self.dict.get_or_insert_with(Default::default)
    }

    /// The slot's string; `None` for null.
    #[inline]
    pub(crate) fn get(&self, slot: usize) -> Option<StrRef<'_>> {
        match self.handles[slot] {
            NULL_HANDLE => None,
            handle => Some(self.held_dict().str_ref(handle)),
        }
    }

    pub(crate) fn push(&mut self, text: Option<&str>) {
        let handle = text.map_or(NULL_HANDLE, |text| self.dict_mut().acquire(text));
        self.handles.push(handle);
    }

    /// Sets a slot's string (`None`: null). Setting the string a slot already
    /// holds, or one some other slot holds, allocates nothing.
    #[inline]
    pub(crate) fn set(&mut self, slot: usize, text: Option<&str>) {
        let old = self.handles[slot];
        // The usual update rewrites the value a slot already has (an upsert repeats
        // its owner and room): one compare against the dictionary, no hashing.
        if old != NULL_HANDLE && text == Some(self.held_dict().text(old)) {
            return;
        }
        let new = text.map_or(NULL_HANDLE, |text| self.dict_mut().acquire(text));
        if old != NULL_HANDLE {
            self.dict_mut().release(old);
        }
        self.handles[slot] = new;
    }

    pub(crate) fn reserve(&mut self, n_items: usize) {
        self.handles.reserve(n_items);
    }

    pub(crate) fn truncate(&mut self, len: usize) {
        if len >= self.handles.len() {
            return;
        }
        for index in len..self.handles.len() {
            let handle = self.handles[index];
            if handle != NULL_HANDLE {
                self.dict_mut().release(handle);
            }
        }
        self.handles.truncate(len);
    }

    /// Whether the column holds so many distinct strings that the head layout serves it better.
    #[inline]
    pub(crate) fn wants_heads(&self) -> bool {
        let n_live = self.dict.as_ref().map_or(0, |dict| dict.n_live);
        self.may_convert && n_live > CONVERT_DISTINCT_MIN && n_live * 2 > self.handles.len()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        let dict_bytes = self.dict.as_ref().map_or(0, |dict| std::mem::size_of::<StringDict>() + dict.heap_bytes());
        self.handles.capacity() * 4 + dict_bytes
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        match &self.dict {
            Some(dict) => dict.check(&self.handles),
            None => assert!(self.handles.iter().all(|&handle| handle == NULL_HANDLE), "handles without a dictionary"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    /// Strings short and long (past a head's 28 bytes), some multi-byte.
    fn string(index: usize) -> String {
        match index % 3 {
            0 => format!("s{index}"),
            1 => format!("a long string that does not fit in its head, number {index}"),
            _ => format!("ünï{index}😀"),
        }
    }

    /// Random pushes, sets, nulls and truncations against a naive `Vec<Option<String>>`,
    /// reading back every slot and checking the dictionary's invariants after each step.
    #[test]
    fn interned_column_matches_a_vec_of_strings() {
        for seed in 0..40 {
            let mut rng = Rng(seed);
            let mut column = InternedColumn::new(false);
            let mut model: Vec<Option<String>> = Vec::new();
            let n_distinct = 1 + rng.index(30);
            for step in 0..300 {
                let value = (rng.index(5) != 0).then(|| string(rng.index(n_distinct)));
                match rng.index(10) {
                    0..=2 => {
                        column.push(value.as_deref());
                        model.push(value);
                    }
                    3..=8 if !model.is_empty() => {
                        let slot = rng.index(model.len());
                        column.set(slot, value.as_deref());
                        model[slot] = value;
                    }
                    9 if !model.is_empty() => {
                        let len = rng.index(model.len() + 1);
                        column.truncate(len);
                        model.truncate(len);
                    }
                    _ => {}
                }
                assert_eq!(column.len(), model.len(), "seed {seed} step {step}");
                for (slot, expected) in model.iter().enumerate() {
                    let got = column.get(slot).map(|text| text.text());
                    assert_eq!(got, expected.as_deref(), "seed {seed} step {step} slot {slot}");
                }
                column.check();
                let n_distinct_model = model.iter().flatten().collect::<std::collections::HashSet<_>>().len();
                let n_live = column.dict.as_ref().map_or(0, |dict| dict.n_live());
                assert_eq!(n_live, n_distinct_model, "seed {seed} step {step}");
            }
        }
    }

    /// A handle is freed when its last slot lets go of it and reused by the next new
    /// string, keeping its buffer: the dictionary does not grow under churn.
    #[test]
    fn freed_handles_are_reused() {
        let mut column = InternedColumn::new(false);
        let long = "a long string that does not fit in its head, the first";
        column.push(Some(long));
        column.push(Some(long));
        column.push(Some("short"));
        let first = column.handle(0);
        assert_eq!(column.handle(1), first, "equal strings share a handle");
        column.set(0, Some("other"));
        assert_eq!(column.dict().find(long), Some(first), "still held by slot 1");
        column.set(1, None);
        assert_eq!(column.dict().find(long), None, "freed with its last slot");
        let n_handles = column.dict().heads.len();
        let longer_by_none = "a long string that does not fit in its head, the other";
        column.set(2, Some(longer_by_none));
        assert_eq!(column.handle(2), first, "the freed handle is reused");
        assert_eq!(column.dict().heads.len(), n_handles, "no new handle");
        assert_eq!(column.get(2).map(|text| text.text()), Some(longer_by_none));
        column.check();
        // Churn between a few strings makes no new handles.
        for round in 0..1000 {
            column.set(round % 3, Some(&string(round % 4)));
        }
        assert!(column.dict().heads.len() <= 5, "{} handles", column.dict().heads.len());
        column.check();
    }

    /// Through a collection: slots inserted, set (strings and null), removed and
    /// reused, and truncated, against a naive `Vec<Option<String>>`; the values go
    /// from few to mostly distinct, so the string column converts to the head layout
    /// midway while the reference column stays interned. Every slot is read back
    /// through `value` and `Column::str_at` (what sort keys and filters read).
    #[test]
    fn string_columns_read_back_in_both_layouts() {
        use crate::collection::{Collection, Column};
        use crate::schema::{FieldId, FieldType, Schema};
        use crate::value::Value;

        let schema = Schema::new()
            .with_field("name", FieldType::String)
            .with_field("room", FieldType::Ref(crate::CollectionId::from_raw_parts(0, 0)));
        for seed in 0..3 {
            let mut rng = Rng(seed);
            let mut collection = Collection::new("c", schema.clone());
            let mut model: Vec<[Option<String>; 2]> = Vec::new();
            let mut live: Vec<u32> = Vec::new();
            let n_steps = 8 * CONVERT_DISTINCT_MIN;
            for step in 0..n_steps {
                // Few distinct values at first, then mostly new ones.
                let n_distinct = if step < n_steps / 4 { 20 } else { 1 << 30 };
                let value = |rng: &mut Rng| (rng.index(8) != 0).then(|| string(rng.index(n_distinct)));
                match rng.index(10) {
                    0..=3 => {
                        let slot = collection.insert_slot(&format!("i{step}"));
                        if slot as usize == model.len() {
                            model.push([None, None]);
                        }
                        model[slot as usize] = [None, None];
                        live.push(slot);
                        for (field, held) in model[slot as usize].iter_mut().enumerate() {
                            let text = value(&mut rng);
                            let field_id = FieldId(field as u16);
                            collection.set_value(slot, field_id, text.as_deref().map_or(Value::Null, Value::Str));
                            *held = text;
                        }
                    }
                    4..=7 if !live.is_empty() => {
                        let slot = live[rng.index(live.len())];
                        let field = rng.index(2);
                        let text = value(&mut rng);
                        collection.set_value(
                            slot,
                            FieldId(field as u16),
                            text.as_deref().map_or(Value::Null, Value::Str),
                        );
                        model[slot as usize][field] = text;
                    }
                    8 if !live.is_empty() => {
                        let slot = live.swap_remove(rng.index(live.len()));
                        collection.remove_slot(slot);
                        collection.recycle_freed_slots();
                    }
                    _ => {}
                }
                if step % 97 == 0 || step == n_steps - 1 {
                    for &slot in &live {
                        for (field, expected) in model[slot as usize].iter().enumerate() {
                            let expected = expected.as_deref();
                            let field_id = FieldId(field as u16);
                            let value = collection.value(slot, field_id);
                            assert_eq!(value, expected.map_or(Value::Null, Value::Str), "seed {seed} step {step}");
                            let text = collection.column(field_id).str_at(slot as usize).map(|text| text.text());
                            assert_eq!(text, expected, "seed {seed} step {step}");
                        }
                    }
                    if let Column::Interned(column) = collection.column(FieldId(1)) {
                        column.check();
                    }
                }
            }
            assert_eq!(collection.string_column_is_interned("name"), Some(false), "seed {seed}: converted");
            assert_eq!(collection.string_column_is_interned("room"), Some(true), "seed {seed}: a ref stays");
            // Truncation (a bulk load rolled back) releases the handles it drops.
            collection.truncate_slots(0);
            let Column::Interned(column) = collection.column(FieldId(1)) else { unreachable!() };
            column.check();
            assert_eq!(column.dict.as_ref().map_or(0, |dict| dict.n_live()), 0, "seed {seed}: none held");
        }
    }

    /// Conversion is wanted only for a string column whose distinct values pass the
    /// minimum and half its slots; never for a reference column.
    #[test]
    fn only_string_columns_of_mostly_distinct_values_want_heads() {
        let mut unique = InternedColumn::new(true);
        let mut reference = InternedColumn::new(false);
        let mut repeated = InternedColumn::new(true);
        for index in 0..=CONVERT_DISTINCT_MIN {
            assert!(!unique.wants_heads(), "converted after {index} distinct");
            unique.push(Some(&string(index)));
            reference.push(Some(&string(index)));
            repeated.push(Some(&string(index / 3)));
        }
        assert!(unique.wants_heads());
        assert!(!reference.wants_heads());
        assert!(!repeated.wants_heads(), "a third distinct stays interned");
    }
}
