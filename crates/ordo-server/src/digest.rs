//! The window digest (`docs/PROTOCOL.md`, "Window digest"): an order-sensitive
//! 64-bit FNV-1a hash of a window's rows, each as its position, its id and its
//! version, so that a client can check that the list it built from the diffs is
//! the server's. Streamed row by row into a `u64`: computing it allocates nothing.

use ordo_core::ItemList;

/// FNV-1a's 64-bit offset basis: the digest of an empty window.
pub const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A digest being computed: feed the rows in window order, then `finish`.
#[derive(Clone, Copy, Debug)]
pub struct WindowDigest {
    state: u64,
    n_rows: u32,
}

impl Default for WindowDigest {
    fn default() -> WindowDigest {
        WindowDigest { state: FNV_OFFSET_BASIS, n_rows: 0 }
    }
}

impl WindowDigest {
    /// The next row: its position (rows so far, as a `u32` LE), its id's UTF-8
    /// length (`u32` LE) and bytes, then its version (`u64` LE).
    pub fn push_row(&mut self, id: &str, version: u64) {
        self.bytes(&self.n_rows.to_le_bytes());
        // Ids are at most 255 bytes (the engine's limit), so the length fits.
        self.bytes(&(id.len() as u32).to_le_bytes());
        self.bytes(id.as_bytes());
        self.bytes(&version.to_le_bytes());
        self.n_rows += 1;
    }

    pub fn finish(self) -> u64 {
        self.state
    }

    #[inline(always)]
    fn bytes(&mut self, bytes: &[u8]) {
        // A local keeps the state in a register across the bytes: FNV-1a is one
        // dependent xor and multiply per byte, so a store and reload per byte
        // would double its cost.
        let mut state = self.state;
        for &byte in bytes {
            state = (state ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
        }
        self.state = state;
    }
}

/// The digest of a window's contents, read straight from the engine's items.
pub fn window_digest(items: ItemList<'_>) -> u64 {
    let mut digest = WindowDigest::default();
    for item in items.iter() {
        digest.push_row(item.id(), item.version());
    }
    digest.finish()
}

/// Appends `digest` as 16 lowercase hex digits, the form frames carry.
pub fn write_digest_hex(out: &mut Vec<u8>, digest: u64) {
    const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(HEX_DIGITS[((digest >> (shift * 4)) & 0xf) as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest_of(rows: &[(&str, u64)]) -> String {
        let mut digest = WindowDigest::default();
        for &(id, version) in rows {
            digest.push_row(id, version);
        }
        let mut out = Vec::new();
        write_digest_hex(&mut out, digest.finish());
        String::from_utf8(out).unwrap()
    }

    /// The test vectors of docs/PROTOCOL.md ("Window digest"), which every client checks too.
    #[test]
    fn the_protocol_test_vectors() {
        assert_eq!(digest_of(&[]), "cbf29ce484222325");
        assert_eq!(digest_of(&[("!a:example.org", 41)]), "fb4342cbbbdad2a8");
        assert_eq!(digest_of(&[("a", 1), ("b", 2)]), "716f5483434e8e56");
        assert_eq!(digest_of(&[("b", 2), ("a", 1)]), "8c00f122685fe562");
        assert_eq!(digest_of(&[("Chloé", u64::MAX), ("z", 0)]), "f02c69445f483225");
    }

    /// A naive reference: the bytes laid out in a buffer, then hashed in one go.
    #[test]
    fn streaming_matches_hashing_the_laid_out_bytes() {
        let mut rng = crate::rng::Rng::new(5);
        for _ in 0..200 {
            let n_rows = rng.index(20);
            let rows: Vec<(String, u64)> = (0..n_rows)
                .map(|_| {
                    let id: String = (0..1 + rng.index(30)).map(|_| char::from(b'a' + rng.index(26) as u8)).collect();
                    (id, rng.next_u64() >> rng.index(64))
                })
                .collect();
            let mut laid_out = Vec::new();
            for (position, (id, version)) in rows.iter().enumerate() {
                laid_out.extend_from_slice(&(position as u32).to_le_bytes());
                laid_out.extend_from_slice(&(id.len() as u32).to_le_bytes());
                laid_out.extend_from_slice(id.as_bytes());
                laid_out.extend_from_slice(&version.to_le_bytes());
            }
            let expected = laid_out
                .iter()
                .fold(FNV_OFFSET_BASIS, |state, &byte| (state ^ u64::from(byte)).wrapping_mul(FNV_PRIME));
            let mut digest = WindowDigest::default();
            for (id, version) in &rows {
                digest.push_row(id, *version);
            }
            assert_eq!(digest.finish(), expected);
        }
    }

    #[test]
    fn hex_is_sixteen_lowercase_digits() {
        let mut out = Vec::new();
        write_digest_hex(&mut out, 0);
        write_digest_hex(&mut out, u64::MAX);
        write_digest_hex(&mut out, 0x0123_4567_89ab_cdef);
        assert_eq!(out, b"0000000000000000ffffffffffffffff0123456789abcdef");
    }
}
