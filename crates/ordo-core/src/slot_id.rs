//! Item ids, stored once: in their slot, and only referred to by the id index.
//!
//! An id used to be held twice: a `String` per slot (24
//! bytes and a heap buffer: ~39 B per membership) and again inline in a 32-byte
//! id-index entry (~38 B with the table's slack). Now the slot holds a 32-byte
//! [`SlotId`] (ids of up to 30 bytes inline, longer ones boxed) and the index
//! holds 8-byte [`IdIndexEntry`]s: the slot and 32 more bits of the id's hash, so
//! that a probe compares the id itself (`ids[slot]`, one more cache line) only
//! when those bits match, which is almost only for the id sought.

use crate::ids::Slot;

/// Longest id held inline in its slot. Matrix room ids (`!` + 18 letters +
/// `:server`) and `ordo-bench`'s (`!room00000001:example.org`, 25 bytes) fit: a
/// boxed id costs a lookup two more cache misses at 1M items (measured with 22
/// bytes inline, which left the benchmark's room ids boxed).
const INLINE_ID_BYTES_MAX: usize = 30;

/// An item's id: inline when short, else in a box (kept across reuses of the
/// slot, so a long id replacing a long id allocates only when it is longer).
pub(crate) enum SlotId {
    Inline {
        len: u8,
        bytes: [u8; INLINE_ID_BYTES_MAX],
    },
    // The box keeps the enum at 32 bytes (a `String` would make it 40).
    #[allow(clippy::box_collection)]
    Long(Box<String>),
}

const _: () = assert!(std::mem::size_of::<SlotId>() == 32);

impl SlotId {
    pub(crate) fn new(id: &str) -> SlotId {
        if id.len() <= INLINE_ID_BYTES_MAX {
            let mut bytes = [0; INLINE_ID_BYTES_MAX];
            bytes[..id.len()].copy_from_slice(id.as_bytes());
            SlotId::Inline { len: id.len() as u8, bytes }
        } else {
            SlotId::Long(Box::new(id.to_owned()))
        }
    }

    /// Replaces the id, reusing a long id's buffer for a long one.
    pub(crate) fn set(&mut self, id: &str) {
        match self {
            SlotId::Long(string) if id.len() > INLINE_ID_BYTES_MAX => {
                string.clear();
                string.push_str(id);
            }
            _ => *self = SlotId::new(id),
        }
    }

    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            SlotId::Inline { len, bytes } => &bytes[..*len as usize],
            SlotId::Long(string) => string.as_bytes(),
        }
    }

    #[inline]
    pub(crate) fn as_str(&self) -> &str {
        match self {
            SlotId::Inline { len, bytes } => {
                let bytes = &bytes[..*len as usize];
                debug_assert!(std::str::from_utf8(bytes).is_ok(), "an inline id holds a whole `&str`");
                // SAFETY: an `Inline` is made only by `SlotId::new`, from a `&str` of
                // `len` bytes copied whole (its fields are never written elsewhere:
                // `set` replaces the whole value), so these bytes are that `&str`'s,
                // valid UTF-8. Every diff reads its item's id through here. Tested by
                // `slot_ids_read_back_whole`.
                unsafe { std::str::from_utf8_unchecked(bytes) }
            }
            SlotId::Long(string) => string,
        }
    }

    /// Heap bytes beyond the 32 in the slot's vector.
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            SlotId::Inline { .. } => 0,
            SlotId::Long(string) => std::mem::size_of::<String>() + string.capacity(),
        }
    }
}

/// One id-index entry: the slot, and the high 32 bits of its id's hash, compared
/// before the id (hashbrown's own control byte holds 7 bits of it).
#[derive(Clone, Copy)]
pub(crate) struct IdIndexEntry {
    pub(crate) slot: Slot,
    tag: u32,
}

const _: () = assert!(std::mem::size_of::<IdIndexEntry>() == 8);

impl IdIndexEntry {
    #[inline]
    pub(crate) fn new(hash: u64, slot: Slot) -> IdIndexEntry {
        IdIndexEntry { slot, tag: tag_of(hash) }
    }

    /// Whether this entry holds the id `id`, whose hash is `hash`.
    #[inline]
    pub(crate) fn holds(&self, hash: u64, id: &[u8], ids: &[SlotId]) -> bool {
        self.tag == tag_of(hash) && ids[self.slot as usize].as_bytes() == id
    }
}

#[inline]
fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SlotId::as_str` skips the UTF-8 check (`unsafe`): every id comes back
    /// whole, inline or boxed, across the 30-byte edge and multi-byte characters,
    /// and after being replaced by a shorter or longer one.
    #[test]
    fn slot_ids_read_back_whole() {
        let pieces = ["a", "é", "€", "😀"];
        let mut texts = Vec::new();
        for n_bytes in 0..=40 {
            for piece in pieces {
                let mut text = String::new();
                while text.len() + piece.len() <= n_bytes {
                    text.push_str(piece);
                }
                while text.len() < n_bytes {
                    text.push('z');
                }
                texts.push(text);
            }
        }
        let mut reused = SlotId::new("");
        for text in &texts {
            let id = SlotId::new(text);
            assert_eq!(id.as_str(), text);
            assert_eq!(id.as_bytes(), text.as_bytes());
            assert_eq!(matches!(id, SlotId::Inline { .. }), text.len() <= INLINE_ID_BYTES_MAX, "{text:?}");
            reused.set(text);
            assert_eq!(reused.as_str(), text);
        }
        for text in texts.iter().rev() {
            reused.set(text);
            assert_eq!(reused.as_str(), text);
        }
    }
}
