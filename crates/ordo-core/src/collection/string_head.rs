//! A string column's head layout: each value's first bytes held in the column
//! (`StringHead`), and the rest of a longer string in a box of its own
//! (`LongStrings`). Both string layouts hand out values as `StrRef`s. A leaf of
//! the collection: the column and the interned layout both build on it.

/// The first `STRING_HEAD_BYTES` bytes of a string, zero-padded, and its length;
/// or, in a head-layout column, `StringHead::NULL` for a null slot.
#[derive(Clone, Copy, Default)]
pub(crate) struct StringHead {
    bytes: [u8; STRING_HEAD_BYTES],
    len: u32,
}

/// Room names are 12 to 20 bytes: this holds them whole.
pub(super) const STRING_HEAD_BYTES: usize = 28;

const _: () = assert!(std::mem::size_of::<StringHead>() == 32);

impl StringHead {
    /// A null slot of a head-layout column: a length no string reaches (values are
    /// at most `MAX_STRING_FIELD_BYTES`), so `whole` answers `None` for it, and a
    /// reader that gets `None` there tells null from long with `is_null`.
    pub(crate) const NULL: StringHead = StringHead { bytes: [0; STRING_HEAD_BYTES], len: u32::MAX };

    pub(crate) fn new(text: &str) -> StringHead {
        debug_assert!(text.len() < u32::MAX as usize, "validated: at most MAX_STRING_FIELD_BYTES");
        let mut head = StringHead { bytes: [0; STRING_HEAD_BYTES], len: text.len() as u32 };
        let n_bytes = text.len().min(STRING_HEAD_BYTES);
        head.bytes[..n_bytes].copy_from_slice(&text.as_bytes()[..n_bytes]);
        head
    }

    #[inline]
    pub(crate) fn is_null(&self) -> bool {
        self.len == u32::MAX
    }

    /// The first 16 bytes, big-endian: comparing these compares the strings' first
    /// 16 bytes (zero-padded).
    #[inline]
    pub(crate) fn prefix(&self) -> u128 {
        let mut first = [0u8; 16];
        first.copy_from_slice(&self.bytes[..16]);
        u128::from_be_bytes(first)
    }

    /// The whole string, when it fits in the head.
    #[inline]
    pub(crate) fn whole(&self) -> Option<&str> {
        let len = self.len as usize;
        if len <= STRING_HEAD_BYTES {
            let bytes = &self.bytes[..len];
            debug_assert!(std::str::from_utf8(bytes).is_ok(), "a head holds a whole `&str`");
            // SAFETY: `bytes` and `len` are private and set only by `StringHead::new`
            // (and `Default`: no bytes; `NULL`'s length fails the test above), which copies `text.len()` bytes of a `&str`
            // whole when they fit; `len <= STRING_HEAD_BYTES` means they did, so these
            // are exactly that `&str`'s bytes, valid UTF-8. Checking again cost 14 % of
            // a shared-rooms message (the `owner == user` filter reads the head of every
            // membership it tests). Tested by `string_heads_return_whole_strings`.
            Some(unsafe { std::str::from_utf8_unchecked(bytes) })
        } else {
            None
        }
    }
}

/// A string column's values that do not fit in their head, per slot: 8 bytes
/// for a slot whose string fits (room names, owners, reference ids: nothing to
/// keep but the head), where a `String` per slot took 24. A long string keeps its
/// box and buffer across updates, so rewriting it allocates only when it grows.
#[derive(Default)]
pub(crate) struct LongStrings {
    // The box is the point: `Option<Box<String>>` is 8 bytes where `String` is 24,
    // and the extra allocation exists only for strings that need a buffer anyway.
    #[allow(clippy::box_collection)]
    strings: Vec<Option<Box<String>>>,
}

impl LongStrings {
    /// The slot's string if longer than a head; `""` otherwise (read the head).
    #[inline]
    pub(crate) fn get(&self, slot: usize) -> &str {
        self.strings[slot].as_deref().map_or("", String::as_str)
    }

    pub(crate) fn push(&mut self, text: &str) {
        self.strings.push((text.len() > STRING_HEAD_BYTES).then(|| Box::new(text.to_owned())));
    }

    pub(crate) fn set(&mut self, slot: usize, text: &str) {
        if text.len() > STRING_HEAD_BYTES {
            let string = self.strings[slot].get_or_insert_with(Default::default);
            copy_reusing_capacity_str(string, text);
        }
        // A short string leaves the slot's long one in place (stale, never read:
        // the head says the string is whole), so that the buffer is reused when the
        // value grows again.
    }

    pub(super) fn reserve(&mut self, n_items: usize) {
        self.strings.reserve(n_items);
    }

    pub(super) fn truncate(&mut self, len: usize) {
        self.strings.truncate(len);
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.strings.capacity() * std::mem::size_of::<Option<Box<String>>>()
            + self
                .strings
                .iter()
                .flatten()
                .map(|string| std::mem::size_of::<String>() + string.capacity())
                .sum::<usize>()
    }
}

const _: () = assert!(std::mem::size_of::<Option<Box<String>>>() == 8);

/// One string of a string column, in either layout: its head, and where its
/// bytes are if longer than the head (read only then, a pointer chase).
#[derive(Clone, Copy)]
pub(crate) struct StrRef<'a> {
    pub(crate) head: &'a StringHead,
    long: &'a LongStrings,
    index: usize,
}

impl<'a> StrRef<'a> {
    #[inline]
    pub(crate) fn new(head: &'a StringHead, long: &'a LongStrings, index: usize) -> StrRef<'a> {
        StrRef { head, long, index }
    }

    /// The whole string: from the head when it fits there.
    #[inline]
    pub(crate) fn text(&self) -> &'a str {
        self.head.whole().unwrap_or_else(|| self.long.get(self.index))
    }
}

fn copy_reusing_capacity_str(target: &mut String, text: &str) {
    target.clear();
    if target.capacity() < text.len() {
        // Round up so that small growth (a name edited, a longer preview) stays allocation-free.
        target.reserve(text.len().next_power_of_two().max(16));
    }
    target.push_str(text);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `StringHead::whole` skips the UTF-8 check (`unsafe`): every string that fits
    /// must come back whole and every longer one not at all, including strings whose
    /// 28th byte falls inside a multi-byte character.
    #[test]
    fn string_heads_return_whole_strings() {
        let pieces = ["a", "é", "€", "😀"];
        for n_bytes in 0..=40 {
            for (index, piece) in pieces.iter().enumerate() {
                // Fill with `piece`, then pad with ASCII to exactly `n_bytes`.
                let mut text = String::new();
                while text.len() + piece.len() <= n_bytes {
                    text.push_str(piece);
                }
                while text.len() < n_bytes {
                    text.push((b'a' + index as u8) as char);
                }
                let head = StringHead::new(&text);
                if n_bytes <= STRING_HEAD_BYTES {
                    assert_eq!(head.whole(), Some(text.as_str()), "{n_bytes} bytes of {piece:?}");
                } else {
                    assert_eq!(head.whole(), None, "{n_bytes} bytes of {piece:?}");
                }
            }
        }
        assert_eq!(StringHead::default().whole(), Some(""));
    }
}
