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
//! that order non-strictly.

use std::cmp::Ordering;

use caseless::Caseless;

use crate::collection::{Collection, Slot};
use crate::error::ViewError;
use crate::limits::MAX_SORT_KEYS;
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
}

#[derive(Clone, Debug, PartialEq)]
pub struct CompiledSort {
    keys: Vec<CompiledSortKey>,
}

impl CompiledSort {
    pub fn compile(sort: &[SortKey], schema: &Schema) -> Result<CompiledSort, ViewError> {
        if sort.len() > MAX_SORT_KEYS {
            return Err(ViewError::TooManySortKeys { n_keys_max: MAX_SORT_KEYS });
        }
        let mut keys: Vec<CompiledSortKey> = Vec::with_capacity(sort.len());
        for key in sort {
            let field_id =
                schema.field_id(&key.field).ok_or_else(|| ViewError::UnknownField { field: key.field.clone() })?;
            if keys.iter().any(|existing| existing.field_id == field_id) {
                return Err(ViewError::DuplicateSortKey { field: key.field.clone() });
            }
            let field_type = schema.field(field_id).field_type;
            if key.case_insensitive && field_type != FieldType::String {
                return Err(ViewError::NotApplicable {
                    field: key.field.clone(),
                    operation: "case-insensitive sort",
                    field_type: field_type.name(),
                });
            }
            keys.push(CompiledSortKey {
                field_id,
                field_type,
                descending: key.direction == Direction::Descending,
                case_insensitive: key.case_insensitive,
            });
        }
        Ok(CompiledSort { keys })
    }

    /// Fields the order depends on: an update touching none of them keeps its item's place.
    pub(crate) fn reads_field(&self, field_id: FieldId) -> bool {
        self.keys.iter().any(|key| key.field_id == field_id)
    }

    /// Encodes a slot's sort keys into its prefix. Reads each key field once.
    pub(crate) fn encode_prefix(&self, collection: &Collection, slot: Slot) -> Prefix {
        let mut writer = BitWriter::default();
        for key in &self.keys {
            if writer.is_full() {
                break;
            }
            let value = collection.value(slot, key.field_id);
            let is_null = value.is_null();
            // Present values sort before nulls, whatever the direction.
            writer.push(is_null as u64, 1);
            let invert = key.descending;
            match (key.field_type, value) {
                (FieldType::String, Value::Str(text)) => {
                    write_string(&mut writer, text, key.case_insensitive, invert);
                    // A string is not self-delimiting within the prefix; later keys are
                    // left to the full comparison.
                    break;
                }
                (FieldType::String, _) => {
                    // Both-null strings must stay aligned for later keys: but as above,
                    // nothing follows a string key in the prefix.
                    break;
                }
                (FieldType::Bool, Value::Bool(flag)) => writer.push(flag as u64 ^ invert as u64, 1),
                (FieldType::Bool, _) => writer.push(0, 1),
                (_, Value::U64(number)) => writer.push(maybe_invert(number, invert), 64),
                (_, Value::I64(number)) => writer.push(maybe_invert((number as u64) ^ (1 << 63), invert), 64),
                (_, Value::F64(number)) => writer.push(maybe_invert(f64_order_bits(number), invert), 64),
                // Null numbers write a filler of the same width, so that both-null
                // items keep the following keys aligned.
                (_, _) => writer.push(0, 64),
            }
        }
        writer.finish()
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

/// Writes a string key: the rest of the prefix is filled with its first bytes (after
/// case folding when asked), zero-padded; descending keys invert everything,
/// padding included, so a string that is a prefix of another still sorts on the
/// correct side (non-strictly) of it.
fn write_string(writer: &mut BitWriter, text: &str, case_insensitive: bool, invert: bool) {
    let mut head = [0u8; 16];
    let n_bytes_room = (128 - writer.n_bits_used).div_ceil(8) as usize;
    if !case_insensitive || text.is_ascii() {
        let n_bytes = text.len().min(n_bytes_room);
        head[..n_bytes].copy_from_slice(&text.as_bytes()[..n_bytes]);
        if case_insensitive {
            head.make_ascii_lowercase();
        }
    } else {
        let mut n_bytes = 0;
        let mut utf8 = [0u8; 4];
        'fold: for folded in text.chars().default_case_fold() {
            for &byte in folded.encode_utf8(&mut utf8).as_bytes() {
                if n_bytes == n_bytes_room {
                    break 'fold;
                }
                head[n_bytes] = byte;
                n_bytes += 1;
            }
        }
    }
    let mut chunk = u128::from_be_bytes(head);
    if invert {
        chunk = !chunk;
    }
    writer.fill_with(chunk);
}

/// Writes bit fields most-significant first into a `u128`, dropping what does not fit.
#[derive(Default)]
struct BitWriter {
    bits: u128,
    n_bits_used: u32,
}

impl BitWriter {
    fn is_full(&self) -> bool {
        self.n_bits_used >= 128
    }

    fn push(&mut self, value: u64, width: u32) {
        debug_assert!(width <= 64 && (width == 64 || value >> width == 0));
        let room = 128 - self.n_bits_used;
        if room == 0 {
            return;
        }
        let (value, width) = if width > room { (value >> (width - room), room) } else { (value, width) };
        self.bits |= (value as u128) << (room - width);
        self.n_bits_used += width;
    }

    /// Fills the remaining bits with the top bits of `chunk`.
    fn fill_with(&mut self, chunk: u128) {
        if self.n_bits_used < 128 {
            self.bits |= chunk >> self.n_bits_used;
            self.n_bits_used = 128;
        }
    }

    fn finish(self) -> Prefix {
        self.bits
    }
}
