//! Sort keys compiled against a schema, and their compact cached form.
//!
//! Every item in a view is indexed under a 128-bit *prefix*: the sort keys encoded
//! as one bit string whose unsigned order is the sort order (nulls last, descending
//! keys inverted), cut at 128 bits. Nearly every comparison is decided by comparing
//! two `u128`s held inline in the index; only when two prefixes are equal does the
//! index fall back to [`CompiledSort::compare_full`], which reads the fields and
//! finally the ids. This is the room-list lesson: comparisons must not touch locks,
//! allocate, or chase pointers into item storage.
//!
//! Consistency rule (tested): `prefix(a) < prefix(b)` implies `a < b` in the full order.
//! It holds because the encoding is order-preserving and cutting a bit string keeps
//! that order non-strictly. A collated string key (see `collation`) encodes the head
//! of the string's ICU sort key, which is order-preserving for the collator's order.

use std::cmp::Ordering;

use caseless::Caseless;

use crate::collation::Collation;
use crate::collection::{Collection, Column};
use crate::error::ViewError;
use crate::ids::Slot;
use crate::limits::{MAX_COLLATED_SORT_KEYS, MAX_SORT_KEYS};
use crate::schema::{FieldId, FieldType, Schema};
use crate::value::Value;
use crate::view_def::{Direction, SortKey};

pub(crate) type Prefix = u128;

#[derive(Clone, Debug, PartialEq)]
struct CompiledSortKey {
    field_id: FieldId,
    field_type: FieldType,
    descending: bool,
    case_insensitive: bool,
    /// Strings only: order by this collator instead of by (folded) UTF-8 bytes.
    /// Boxed: rare, and inline it made every key 112 bytes instead of 24, paid by
    /// each view of each collection (one per user in `many-lists`).
    collation: Option<Box<Collation>>,
    /// Where the key's bits start in the prefix, counted from the most significant
    /// bit. Fixed per key: every key but a string has a fixed width (a null bit, then
    /// 1 bit for a bool or 64 for a number; nulls write zeros), and a string key takes
    /// all the bits left, so it is the last key with bits in the prefix.
    bit_offset: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CompiledSort {
    keys: Vec<CompiledSortKey>,
    /// How many of `keys` have bits in the prefix.
    n_prefix_keys: usize,
}

/// Places a `width`-bit component whose first bit is at `bit_offset` (from the top),
/// cutting what falls past bit 127.
#[inline]
fn place(component: u128, width: u32, bit_offset: u32) -> u128 {
    let end = bit_offset + width;
    if end <= 128 {
        component << (128 - end)
    } else {
        component >> (end - 128)
    }
}

impl CompiledSort {
    /// Hashes what tells sorts apart (equal sorts hash alike; a table of shared
    /// sorts compares what the hash finds).
    pub(crate) fn hash_shape(&self, state: &mut impl std::hash::Hasher) {
        use std::hash::Hash;
        self.n_prefix_keys.hash(state);
        for key in &self.keys {
            (key.field_id, key.descending, key.case_insensitive, key.bit_offset).hash(state);
        }
    }

    pub fn compile(sort: &[SortKey], schema: &Schema) -> Result<CompiledSort, ViewError> {
        if sort.len() > MAX_SORT_KEYS {
            return Err(ViewError::TooManySortKeys { n_keys_max: MAX_SORT_KEYS });
        }
        // Before any collator is built, so that a refused sort costs no locale lookups.
        if sort.iter().filter(|key| key.collation.is_some()).count() > MAX_COLLATED_SORT_KEYS {
            return Err(ViewError::TooManyCollatedSortKeys { n_keys_max: MAX_COLLATED_SORT_KEYS });
        }
        let mut keys: Vec<CompiledSortKey> = Vec::with_capacity(sort.len());
        for key in sort {
            let field_id =
                schema.view_field_id(&key.field).ok_or_else(|| ViewError::UnknownField { field: key.field.clone() })?;
            if keys.iter().any(|existing| existing.field_id == field_id) {
                return Err(ViewError::DuplicateSortKey { field: key.field.clone() });
            }
            // A reference sorts as the string it holds.
            let field_type = schema.field(field_id).field_type.value_type();
            if key.case_insensitive && field_type != FieldType::String {
                return Err(ViewError::NotApplicable {
                    field: key.field.clone(),
                    operation: "case-insensitive sort",
                    field_type: field_type.name(),
                });
            }
            if key.collation.is_some() && field_type != FieldType::String {
                return Err(ViewError::NotApplicable {
                    field: key.field.clone(),
                    operation: "collated sort",
                    field_type: field_type.name(),
                });
            }
            let collation = match &key.collation {
                Some(locale) => Some(Box::new(Collation::new(&key.field, locale, key.case_insensitive)?)),
                None => None,
            };
            keys.push(CompiledSortKey {
                field_id,
                field_type,
                descending: key.direction == Direction::Descending,
                case_insensitive: key.case_insensitive,
                collation,
                bit_offset: 0,
            });
        }
        // A view keeps its sort for life: no spare capacity (one per user's list).
        keys.shrink_to_fit();
        let mut bit_offset = 0;
        let mut n_prefix_keys = 0;
        for key in &mut keys {
            if bit_offset >= 128 {
                break;
            }
            key.bit_offset = bit_offset;
            n_prefix_keys += 1;
            bit_offset += match key.field_type {
                FieldType::Bool => 2,
                FieldType::String => 128,
                _ => 65,
            };
        }
        Ok(CompiledSort { keys, n_prefix_keys })
    }

    /// Fields the order depends on: an update touching none of them keeps its item's place.
    /// Asks the cache for the keys (read by every move of an entry).
    #[inline]
    pub(crate) fn prefetch(&self) {
        crate::prefetch::prefetch_lines(&self.keys, 2);
    }

    pub(crate) fn reads_field(&self, field_id: FieldId) -> bool {
        self.keys.iter().any(|key| key.field_id == field_id)
    }

    /// Encodes a slot's sort keys into its prefix. Reads each key field once; string
    /// keys read the column's cached 16-byte head, not the string itself, unless a
    /// case-insensitive key meets non-ASCII bytes there or the key is collated.
    pub(crate) fn encode_prefix(&self, collection: &Collection, slot: Slot) -> Prefix {
        let mut prefix = 0;
        for key in &self.keys[..self.n_prefix_keys] {
            prefix |= encode_key(key, collection, collection.column(key.field_id), slot);
        }
        prefix
    }

    /// Encodes the prefixes of many slots, key by key: one tight loop per column
    /// instead of a dispatch per item and key (what building a view needs).
    pub(crate) fn encode_prefixes(&self, collection: &Collection, slots: &[Slot], prefixes: &mut Vec<Prefix>) {
        prefixes.clear();
        prefixes.resize(slots.len(), 0);
        for key in &self.keys[..self.n_prefix_keys] {
            let column = collection.column(key.field_id);
            match column {
                Column::Bool { values, present } => {
                    for (prefix, &slot) in prefixes.iter_mut().zip(slots) {
                        *prefix |= encode_bool(key, values.get(slot as usize), present.get(slot as usize));
                    }
                }
                Column::Word { bits, present } => {
                    for (prefix, &slot) in prefixes.iter_mut().zip(slots) {
                        *prefix |= encode_word(key, bits[slot as usize], present[slot as usize]);
                    }
                }
                Column::Str { heads, .. } if !key.case_insensitive && key.collation.is_none() => {
                    let value_offset = key.bit_offset + 1;
                    let invert = if key.descending { u128::MAX } else { 0 };
                    for (prefix, &slot) in prefixes.iter_mut().zip(slots) {
                        let head = &heads[slot as usize];
                        *prefix |= if !head.is_null() {
                            (head.prefix() ^ invert).checked_shr(value_offset).unwrap_or(0)
                        } else {
                            place(1, 1, key.bit_offset)
                        };
                    }
                }
                Column::Str { .. } | Column::Interned(_) => {
                    for (prefix, &slot) in prefixes.iter_mut().zip(slots) {
                        *prefix |= encode_key(key, collection, column, slot);
                    }
                }
            }
        }
    }

    /// The full order: every sort key, then the id. Used only on equal prefixes.
    pub(crate) fn compare_full(&self, collection: &Collection, left: Slot, right: Slot) -> Ordering {
        for key in &self.keys {
            let left_value = collection.value(left, key.field_id);
            let right_value = collection.value(right, key.field_id);
            let ordering = match (left_value, right_value) {
                (Value::Null, Value::Null) => Ordering::Equal,
                (Value::Null, _) => return Ordering::Greater,
                (_, Value::Null) => return Ordering::Less,
                (Value::Str(left_text), Value::Str(right_text)) if key.collation.is_some() => {
                    let collation = key.collation.as_ref().expect("checked by the guard");
                    let ordering = collation.compare(left_text, right_text);
                    if key.descending {
                        ordering.reverse()
                    } else {
                        ordering
                    }
                }
                (left_value, right_value) => {
                    let ordering = compare_present(left_value, right_value, key.case_insensitive);
                    if key.descending {
                        ordering.reverse()
                    } else {
                        ordering
                    }
                }
            };
            if ordering != Ordering::Equal {
                return ordering;
            }
        }
        collection.id_of(left).cmp(collection.id_of(right))
    }

    /// Order of two indexed entries: prefix first, then the full comparison.
    #[inline]
    pub(crate) fn compare_entries(
        &self,
        collection: &Collection,
        left: (Prefix, Slot),
        right: (Prefix, Slot),
    ) -> Ordering {
        match left.0.cmp(&right.0) {
            Ordering::Equal if left.1 == right.1 => Ordering::Equal,
            Ordering::Equal => self.compare_full(collection, left.1, right.1),
            ordering => ordering,
        }
    }
}

fn maybe_invert(bits: u64, invert: bool) -> u64 {
    if invert {
        !bits
    } else {
        bits
    }
}

/// Maps an f64 to bits whose unsigned order is `f64::total_cmp`'s order.
fn f64_order_bits(number: f64) -> u64 {
    let bits = number.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    }
}

fn compare_present(left: Value<'_>, right: Value<'_>, case_insensitive: bool) -> Ordering {
    match (left, right) {
        (Value::Bool(left), Value::Bool(right)) => left.cmp(&right),
        (Value::I64(left), Value::I64(right)) => left.cmp(&right),
        (Value::U64(left), Value::U64(right)) => left.cmp(&right),
        (Value::F64(left), Value::F64(right)) => left.total_cmp(&right),
        (Value::Str(left), Value::Str(right)) if case_insensitive => compare_case_insensitive(left, right),
        (Value::Str(left), Value::Str(right)) => left.cmp(right),
        _ => unreachable!("a column holds one type"),
    }
}

/// Compares case-folded strings without allocating: bytes when both are ASCII,
/// folded `char` streams otherwise (same order as folded UTF-8 bytes).
pub(crate) fn compare_case_insensitive(left: &str, right: &str) -> Ordering {
    if left.is_ascii() && right.is_ascii() {
        let left_folded = left.bytes().map(|byte| byte.to_ascii_lowercase());
        let right_folded = right.bytes().map(|byte| byte.to_ascii_lowercase());
        return left_folded.cmp(right_folded);
    }
    left.chars().default_case_fold().cmp(right.chars().default_case_fold())
}

const ASCII_HIGH_BITS: u128 = 0x8080_8080_8080_8080_8080_8080_8080_8080;

/// One key's bits, placed at the key's offset. Present values sort before nulls,
/// whatever the direction; descending keys invert their value bits.
#[inline(always)]
fn encode_key(key: &CompiledSortKey, collection: &Collection, column: &Column, slot: Slot) -> Prefix {
    match column {
        Column::Bool { values, present } => encode_bool(key, values.get(slot as usize), present.get(slot as usize)),
        Column::Word { bits, present } => encode_word(key, bits[slot as usize], present[slot as usize]),
        Column::Str { .. } | Column::Interned(_) => {
            // Either layout: the head is the column's own or, interned, the dictionary's.
            let Some(text) = column.str_at(slot as usize) else {
                return place(1, 1, key.bit_offset);
            };
            let head = text.head.prefix();
            let folded_head = if let Some(collation) = &key.collation {
                // The sort key needs the whole string (its head may end mid-character);
                // a short one is whole in its head, saving a cache miss.
                collation.sort_key_head(text.text())
            } else if !key.case_insensitive {
                head
            } else if head & ASCII_HIGH_BITS == 0 {
                // All ASCII: folding is lower-casing, byte by byte. Folding is per
                // character, so the head's fold is the fold's head.
                let mut bytes = head.to_be_bytes();
                bytes.make_ascii_lowercase();
                u128::from_be_bytes(bytes)
            } else {
                folded_head_of_slot(collection, slot, key.field_id)
            };
            // The head fills every bit left after the null bit (zero-padded, so a
            // string that is a prefix of another sorts, non-strictly, before it;
            // inverted with its padding when descending).
            let value_bits = if key.descending { !folded_head } else { folded_head };
            let value_offset = key.bit_offset + 1;
            if value_offset >= 128 {
                0
            } else {
                value_bits >> value_offset
            }
        }
    }
}

#[inline]
fn encode_bool(key: &CompiledSortKey, value: bool, present: bool) -> Prefix {
    let component = if present {
        (value ^ key.descending) as u128
    } else {
        0b10 // null: null bit set, value bit zero
    };
    place(component, 2, key.bit_offset)
}

#[inline]
fn encode_word(key: &CompiledSortKey, bits: u64, present: bool) -> Prefix {
    if !present {
        return place(1 << 64, 65, key.bit_offset);
    }
    let ordered = match key.field_type {
        FieldType::U64 => bits,
        FieldType::I64 => bits ^ (1 << 63),
        _ => f64_order_bits(f64::from_bits(bits)),
    };
    place(maybe_invert(ordered, key.descending) as u128, 65, key.bit_offset)
}

/// The slow path of case-insensitive keys: a string with non-ASCII bytes in its head.
#[cold]
#[inline(never)]
fn folded_head_of_slot(collection: &Collection, slot: Slot, field_id: FieldId) -> u128 {
    let Value::Str(text) = collection.value(slot, field_id) else { unreachable!("the string is present") };
    folded_head_of(text)
}

/// The first 16 bytes of the full case fold of `text`, zero-padded.
fn folded_head_of(text: &str) -> u128 {
    let mut head = [0u8; 16];
    let mut n_bytes = 0;
    let mut utf8 = [0u8; 4];
    'fold: for folded in text.chars().default_case_fold() {
        for &byte in folded.encode_utf8(&mut utf8).as_bytes() {
            if n_bytes == head.len() {
                break 'fold;
            }
            head[n_bytes] = byte;
            n_bytes += 1;
        }
    }
    u128::from_be_bytes(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::OwnedValue;

    /// The collated half of the prefix rule, on random strings over an alphabet of
    /// troublemakers: combining marks (alone, stacked, after any letter), letters
    /// that locales tailor, Hangul, CJK, digits, spaces and punctuation, and strings
    /// long enough that the 16-byte head is cut in the middle of the sort key.
    #[test]
    fn collated_prefix_never_contradicts_the_collator() {
        const PIECES: [&str; 24] = [
            "a", "A", "e", "é", "e\u{301}", "\u{301}", "\u{308}", "o", "ö", "Ö", "å", "z", "Z", "ß", "ss", "æ", "ch",
            "가", "\u{1100}", "漢", "1", "10", " ", "-",
        ];
        let mut state = 11u64;
        let mut next = move |n: usize| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as usize % n
        };
        for locale in ["root", "fr", "de", "de-u-co-phonebk", "sv", "da", "es-u-co-trad", "en-u-kn", "ko", "ja"] {
            for case_insensitive in [false, true] {
                let collation = Collation::new("s", locale, case_insensitive).expect("a valid locale");
                let words: Vec<String> =
                    (0..80).map(|_| (0..next(20)).map(|_| PIECES[next(PIECES.len())]).collect()).collect();
                let heads: Vec<u128> = words.iter().map(|word| collation.sort_key_head(word)).collect();
                for (left, &left_head) in words.iter().zip(&heads) {
                    for (right, &right_head) in words.iter().zip(&heads) {
                        // The NFC detour of `compare` changes nothing.
                        assert_eq!(collation.compare(left, right), collation.compare_directly(left, right));
                        if left_head != right_head {
                            assert_eq!(
                                left_head.cmp(&right_head),
                                collation.compare(left, right),
                                "{locale} (case-insensitive: {case_insensitive}): {left:?} against {right:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The index's founding rule: a smaller prefix means a smaller item, for every
    /// key type, direction and collation, with nulls, ties and long shared prefixes.
    #[test]
    fn prefix_order_never_contradicts_the_full_order() {
        let schema = Schema::new()
            .with_field("s", FieldType::String)
            .with_field("u", FieldType::U64)
            .with_field("i", FieldType::I64)
            .with_field("f", FieldType::F64)
            .with_field("b", FieldType::Bool);
        let strings = [
            "",
            "a",
            "A",
            "ab",
            "ab\0",
            "abcdefghijklmnopq",
            "abcdefghijklmnopz",
            "ABCDEFGHIJKLMNOPA",
            "straße",
            "STRASSE",
            "Ωmega",
            "ωMEGA",
            "é",
            "É",
            "zzzzzzzzzzzzzzzzzzzzzzzzz",
            "İx",
            "i̇x",
            "Émile",
            "E\u{301}mile",
            "emile",
            "Eva",
            "Zorn",
            "Öberg",
            "O\u{308}berg",
            "Åsa",
            "Müller",
            "Mueller",
            "file10",
            "file9",
            "côté sud du très long boulevard",
            "côte sud du très long boulevard",
            "가나다",
            "漢字",
        ];
        let mut collection = Collection::new("t", schema.clone());
        let mut state = 7u64;
        let mut next = move |n: usize| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as usize % n
        };
        for index in 0..300 {
            let slot = collection.insert_slot(&format!("id{index}"));
            let values = [
                if next(8) == 0 { OwnedValue::Null } else { OwnedValue::Str(strings[next(strings.len())].into()) },
                if next(8) == 0 { OwnedValue::Null } else { OwnedValue::U64([0, 1, u64::MAX][next(3)]) },
                if next(8) == 0 { OwnedValue::Null } else { OwnedValue::I64([i64::MIN, -1, 0, 5][next(4)]) },
                if next(8) == 0 {
                    OwnedValue::Null
                } else {
                    OwnedValue::F64([-0.0, 0.0, -1.5, f64::INFINITY, f64::NEG_INFINITY][next(5)])
                },
                if next(8) == 0 { OwnedValue::Null } else { OwnedValue::Bool(next(2) == 0) },
            ];
            for (field_index, value) in values.iter().enumerate() {
                collection.set_value(slot, FieldId(field_index as u16), value.as_value());
            }
        }
        let names = ["s", "u", "i", "f", "b"];
        for round in 0..400 {
            let mut keys = Vec::new();
            let mut used = Vec::new();
            for _ in 0..1 + next(3) {
                let name = names[next(names.len())];
                if used.contains(&name) {
                    continue;
                }
                used.push(name);
                let mut key = if next(2) == 0 { SortKey::asc(name) } else { SortKey::desc(name) };
                if name == "s" && next(2) == 0 {
                    key = key.case_insensitive();
                }
                if name == "s" && next(2) == 0 {
                    key = key.collated(["fr", "sv", "de-u-co-phonebk", "root", "en-u-kn"][next(5)]);
                }
                keys.push(key);
            }
            let sort = CompiledSort::compile(&keys, &schema).unwrap();
            let slots: Vec<Slot> = collection.live_slots().collect();
            for _ in 0..200 {
                let (left, right) = (slots[next(slots.len())], slots[next(slots.len())]);
                let (left_prefix, right_prefix) =
                    (sort.encode_prefix(&collection, left), sort.encode_prefix(&collection, right));
                let full = sort.compare_full(&collection, left, right);
                if left_prefix != right_prefix {
                    assert_eq!(
                        left_prefix.cmp(&right_prefix),
                        full,
                        "round {round}: keys {keys:?}, slots {left} {right}"
                    );
                }
            }
        }
    }
}
