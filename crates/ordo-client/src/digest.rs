//! The window digest (`docs/PROTOCOL.md`, "Window digest"): 64-bit FNV-1a over
//! each row of a list, in order, as its position (`u32` LE), its id's length
//! (`u32` LE) and UTF-8 bytes, and its version (`u64` LE), written as 16
//! lowercase hex digits. A client computes it after applying a frame and
//! compares it with the frame's `digest`.

use serde::Deserialize;

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// What the digest reads of an item: its id and version (an item without a
/// version, from a server older than the digest, counts as version 0).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RowKey {
    pub id: String,
    #[serde(default)]
    pub version: u64,
}

/// The digest of `rows`, in order.
pub fn window_digest<'a>(rows: impl IntoIterator<Item = &'a RowKey>) -> u64 {
    let mut state = FNV_OFFSET_BASIS;
    let mut hash = |bytes: &[u8]| {
        for &byte in bytes {
            state = (state ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
        }
    };
    for (position, row) in rows.into_iter().enumerate() {
        // A window holds at most 1 000 rows and an id at most 255 bytes: both fit.
        hash(&(position as u32).to_le_bytes());
        hash(&(row.id.len() as u32).to_le_bytes());
        hash(row.id.as_bytes());
        hash(&row.version.to_le_bytes());
    }
    state
}

/// A digest as frames carry it: 16 lowercase hex digits.
pub fn digest_hex(digest: u64) -> String {
    format!("{digest:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest_of(rows: &[(&str, u64)]) -> String {
        let rows: Vec<RowKey> = rows.iter().map(|&(id, version)| RowKey { id: id.to_owned(), version }).collect();
        digest_hex(window_digest(&rows))
    }

    /// The test vectors of docs/PROTOCOL.md ("Window digest").
    #[test]
    fn the_protocol_test_vectors() {
        assert_eq!(digest_of(&[]), "cbf29ce484222325");
        assert_eq!(digest_of(&[("!a:example.org", 41)]), "fb4342cbbbdad2a8");
        assert_eq!(digest_of(&[("a", 1), ("b", 2)]), "716f5483434e8e56");
        assert_eq!(digest_of(&[("b", 2), ("a", 1)]), "8c00f122685fe562");
        assert_eq!(digest_of(&[("Chloé", u64::MAX), ("z", 0)]), "f02c69445f483225");
    }
}
