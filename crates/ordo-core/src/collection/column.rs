//! Column storage: one column per field, indexed by slot (structure of arrays).
//!
//! Bools and null flags are bitmaps; integers and floats their 64 raw bits; a
//! string column is in one of two layouts, which every reader sees through
//! `Column::str_at`: heads (`Column::Str`, see `string_head`) or a dictionary
//! (`Column::Interned`, see `interned`). Values arrive already validated, so the
//! writes here never fail.

use crate::prefetch::prefetch;
use crate::schema::FieldType;
use crate::value::Value;

use super::interned::InternedColumn;
use super::string_head::{LongStrings, StrRef, StringHead};

/// One bit per slot. Null flags and bools are bits rather than bytes so that, at a
/// million items, they take 125 KB a column and stay in the CPU's L2 cache: reading a
/// random item's flags then costs no memory access of its own.
///
/// A boxed slice, 16 bytes, where a `Vec` and a bit count took 32: the bitmap's
/// length is its collection's slot count, which every caller knows (`push` takes
/// the slot), and its capacity is the slice's length (grown by doubling, in
/// `grow`). A user's empty collection holds a bitmap or two per field, and this is
/// what lets a `Column` stay within 48 bytes. Bits past the slot count may be
/// stale (after `Column::truncate`): `push` writes its bit either way.
#[derive(Default)]
pub(crate) struct Bitmap {
    words: Box<[u64]>,
}

impl Bitmap {
    /// Asks the cache for the word holding bit `index` (see `crate::prefetch`).
    #[inline]
    pub(crate) fn prefetch(&self, index: usize) {
        if let Some(word) = self.words.get(index / 64) {
            prefetch(word);
        }
    }

    /// Appends slot `slot`'s bit; `slot` is the collection's slot count before the push.
    #[inline]
    fn push(&mut self, slot: usize, bit: bool) {
        if slot / 64 >= self.words.len() {
            self.grow(slot / 64 + 1);
        }
        self.set(slot, bit);
    }

    /// Makes room for at least `n_words` words, doubling so that pushes stay amortised O(1).
    #[cold]
    fn grow(&mut self, n_words: usize) {
        self.resize_words(n_words.max(self.words.len() * 2));
    }

    fn resize_words(&mut self, n_words: usize) {
        let mut words = std::mem::take(&mut self.words).into_vec();
        // Exact, so that `into_boxed_slice` has nothing to shrink (no second reallocation).
        words.reserve_exact(n_words.saturating_sub(words.len()));
        words.resize(n_words, 0);
        self.words = words.into_boxed_slice();
    }

    #[inline]
    pub(crate) fn get(&self, index: usize) -> bool {
        self.words[index / 64] >> (index % 64) & 1 == 1
    }

    #[inline]
    fn set(&mut self, index: usize, bit: bool) {
        let mask = 1 << (index % 64);
        if bit {
            self.words[index / 64] |= mask;
        } else {
            self.words[index / 64] &= !mask;
        }
    }

    /// Makes room for `n_bits` bits in all (the slot count plus those to come).
    fn reserve(&mut self, n_bits: usize) {
        let n_words = n_bits.div_ceil(64);
        if n_words > self.words.len() {
            self.resize_words(n_words);
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.words.len() * 8
    }
}

impl std::ops::Index<usize> for Bitmap {
    type Output = bool;

    #[inline]
    fn index(&self, index: usize) -> &bool {
        if self.get(index) {
            &true
        } else {
            &false
        }
    }
}

pub(crate) enum Column {
    Bool {
        values: Bitmap,
        present: Bitmap,
    },
    /// `I64`, `U64` and `F64` fields, stored as their 64 raw bits.
    Word {
        bits: Vec<u64>,
        present: Bitmap,
    },
    Str {
        /// The strings longer than their head; see `LongStrings`.
        values: LongStrings,
        /// The first bytes of each value, held in the column itself: sort keys are
        /// encoded from here, and short strings (room names) filtered here, without
        /// following the pointer to the string's heap buffer (a cache miss per item
        /// when views are built or items move). A null is `StringHead::NULL`: the
        /// head is read anyway, so presence costs no bitmap (and no load of its own).
        heads: Vec<StringHead>,
    },
    /// A string column with a handle per slot into a dictionary of its distinct
    /// values (see `interned`): references, and strings with few distinct
    /// values. A string column starts here and converts to `Str` once its values
    /// are mostly distinct.
    Interned(InternedColumn),
}

// A user's empty collection has one column per field (7 in a room list), so each
// byte here counts seven times in every list (an empty list must stay within
// 1 KiB of heap: `tests/it/many_lists.rs`). 48 is the head layout's two vectors; the other variants fit beside one of
// their capacities' niches, which then holds the tag: bitmaps are boxed slices
// sized by the slot count (16 bytes), an interned column keeps its dictionary boxed
// (40 bytes), and a string's presence is in its head.
const _: () = assert!(std::mem::size_of::<Column>() <= 48);

impl Column {
    /// Asks the cache for `slot`'s entry of this column ahead of a read.
    #[inline]
    pub(crate) fn prefetch_slot(&self, slot: usize) {
        match self {
            Column::Bool { values, present } => {
                values.prefetch(slot);
                present.prefetch(slot);
            }
            Column::Word { bits, present } => {
                if let Some(word) = bits.get(slot) {
                    prefetch(word);
                }
                present.prefetch(slot);
            }
            Column::Str { heads, .. } => {
                if let Some(head) = heads.get(slot) {
                    prefetch(head);
                }
            }
            Column::Interned(column) => column.prefetch_slot(slot),
        }
    }

    /// For an interned column, once `slot`'s handle is in cache: asks for the
    /// string it names (a keyed view's `owner`, hashed to find the view).
    #[inline]
    pub(crate) fn prefetch_text(&self, slot: usize) {
        if let Column::Interned(column) = self {
            column.prefetch_text(slot);
        }
    }

    pub(super) fn new(field_type: FieldType) -> Column {
        match field_type {
            FieldType::Bool => Column::Bool { values: Bitmap::default(), present: Bitmap::default() },
            FieldType::I64 | FieldType::U64 | FieldType::F64 => {
                Column::Word { bits: Vec::new(), present: Bitmap::default() }
            }
            // A reference holds its target's id, a string; ids repeat as often as
            // targets are shared, so a reference column stays interned.
            FieldType::Ref(_) => Column::Interned(InternedColumn::new(false)),
            FieldType::String => Column::Interned(InternedColumn::new(true)),
        }
    }

    /// A string column's value at `slot`, in either layout; `None` for null.
    #[inline]
    pub(crate) fn str_at(&self, slot: usize) -> Option<StrRef<'_>> {
        match self {
            Column::Str { values, heads } => {
                let head = &heads[slot];
                (!head.is_null()).then(|| StrRef::new(head, values, slot))
            }
            Column::Interned(column) => column.get(slot),
            _ => unreachable!("only string columns hold strings"),
        }
    }

    /// Rewrites an interned column in the head layout, once its values are mostly
    /// distinct (O(slots), allocates once; see `InternedColumn::wants_heads`).
    #[cold]
    fn convert_to_heads(&mut self) {
        let Column::Interned(column) = self else { return };
        let n_slots = column.len();
        let (mut values, mut heads) = (LongStrings::default(), Vec::new());
        values.reserve(n_slots);
        heads.reserve(n_slots);
        for slot in 0..n_slots {
            let text = column.get(slot);
            values.push(text.map_or("", |text| text.text()));
            heads.push(text.map_or(StringHead::NULL, |text| *text.head));
        }
        *self = Column::Str { values, heads };
    }

    /// Makes room for `n_more` slots past the current `n_slots`.
    pub(super) fn reserve(&mut self, n_slots: usize, n_more: usize) {
        match self {
            Column::Bool { values, present } => {
                values.reserve(n_slots + n_more);
                present.reserve(n_slots + n_more);
            }
            Column::Word { bits, present } => {
                bits.reserve(n_more);
                present.reserve(n_slots + n_more);
            }
            Column::Str { values, heads } => {
                values.reserve(n_more);
                heads.reserve(n_more);
            }
            Column::Interned(column) => column.reserve(n_more),
        }
    }

    pub(super) fn truncate(&mut self, len: usize) {
        match self {
            // The bits past `len` stay, stale and unread: the next `push` writes its bit.
            Column::Bool { .. } => {}
            Column::Word { bits, .. } => bits.truncate(len),
            Column::Str { values, heads } => {
                values.truncate(len);
                heads.truncate(len);
            }
            Column::Interned(column) => column.truncate(len),
        }
    }

    /// Appends an already validated value (its type matches the column; `Null` for
    /// none) at `slot`, the collection's slot count before the push.
    pub(super) fn push(&mut self, slot: usize, value: Value<'_>) {
        match (&mut *self, value) {
            (column, Value::Null) => column.push_null(slot),
            (Column::Bool { values, present }, Value::Bool(flag)) => {
                values.push(slot, flag);
                present.push(slot, true);
            }
            (Column::Word { bits, present }, Value::I64(number)) => {
                debug_assert_eq!(bits.len(), slot);
                bits.push(number as u64);
                present.push(slot, true);
            }
            (Column::Word { bits, present }, Value::U64(number)) => {
                debug_assert_eq!(bits.len(), slot);
                bits.push(number);
                present.push(slot, true);
            }
            (Column::Word { bits, present }, Value::F64(number)) => {
                debug_assert_eq!(bits.len(), slot);
                bits.push(number.to_bits());
                present.push(slot, true);
            }
            (Column::Str { values, heads }, Value::Str(text)) => {
                debug_assert_eq!(heads.len(), slot);
                // As in `set`: only strings longer than their head keep a heap copy.
                values.push(text);
                heads.push(StringHead::new(text));
            }
            (Column::Interned(column), Value::Str(text)) => {
                debug_assert_eq!(column.len(), slot);
                column.push(Some(text));
                if column.wants_heads() {
                    self.convert_to_heads();
                }
            }
            (_, value) => unreachable!("load validation lets no {} into this column", value.type_name()),
        }
    }

    pub(super) fn push_null(&mut self, slot: usize) {
        match self {
            Column::Bool { values, present } => {
                values.push(slot, false);
                present.push(slot, false);
            }
            Column::Word { bits, present } => {
                debug_assert_eq!(bits.len(), slot);
                bits.push(0);
                present.push(slot, false);
            }
            Column::Str { values, heads } => {
                debug_assert_eq!(heads.len(), slot);
                values.push("");
                heads.push(StringHead::NULL);
            }
            Column::Interned(column) => {
                debug_assert_eq!(column.len(), slot);
                column.push(None);
            }
        }
    }

    pub(super) fn set_null(&mut self, slot: usize) {
        match self {
            Column::Bool { present, .. } | Column::Word { present, .. } => present.set(slot, false),
            // The slot's long string, if any, stays: its buffer is reused when the value returns.
            Column::Str { heads, .. } => heads[slot] = StringHead::NULL,
            // The handle's count must drop, so that a string no slot holds leaves the dictionary.
            Column::Interned(column) => column.set(slot, None),
        }
    }

    /// Writes an already validated value (its type matches the column).
    pub(super) fn set(&mut self, slot: usize, value: Value<'_>) {
        match (&mut *self, value) {
            (column, Value::Null) => column.set_null(slot),
            (Column::Bool { values, present }, Value::Bool(flag)) => {
                values.set(slot, flag);
                present.set(slot, true);
            }
            (Column::Word { bits, present }, Value::I64(number)) => {
                bits[slot] = number as u64;
                present.set(slot, true);
            }
            (Column::Word { bits, present }, Value::U64(number)) => {
                bits[slot] = number;
                present.set(slot, true);
            }
            (Column::Word { bits, present }, Value::F64(number)) => {
                bits[slot] = number.to_bits();
                present.set(slot, true);
            }
            (Column::Str { values, heads }, Value::Str(text)) => {
                let head = StringHead::new(text);
                // A string that fits in its head is only ever read from there (every
                // reader goes through `StringHead::whole` first): no heap copy, so
                // room names cost no allocation. A longer one reuses the slot's
                // buffer: no allocation unless the new text is longer.
                values.set(slot, text);
                heads[slot] = head;
            }
            (Column::Interned(column), Value::Str(text)) => {
                column.set(slot, Some(text));
                if column.wants_heads() {
                    self.convert_to_heads();
                }
            }
            (_, value) => unreachable!("batch validation lets no {} into this column", value.type_name()),
        }
    }
}
