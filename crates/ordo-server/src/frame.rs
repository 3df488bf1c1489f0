//! Writing server frames into a caller-owned, reused `Vec<u8>`.
//!
//! Every function appends to `out` and never clears it. A connection keeps
//! one buffer and clears it between frames, so once the buffer has grown to
//! its largest frame, writing a frame allocates nothing (the arena idea of
//! go-capnp's message builder).
//!
//! Strings are escaped exactly as `serde_json` writes them in compact form,
//! byte for byte (`docs/PROTOCOL.md` promises `serde_json`'s output).

use crate::digest::write_digest_hex;

/// What follows the backslash when escaping a byte; 0 for a byte copied as
/// is, `u` for `\u00XX`. The same choices as `serde_json`: `"`, `\` and the
/// control characters below 0x20 are escaped, nothing else (not `/`, not
/// DEL, not U+2028).
const ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = b'u';
        byte += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// Lowercase, as `serde_json` writes `\u00XX`.
const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends `s` as a JSON string, quotes included, escaped as `serde_json`
/// escapes it.
pub fn write_json_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // Bytes that need no escape (all of a typical id) are copied a run at a
    // time; multi-byte UTF-8 never needs one (its bytes are all >= 0x80).
    let mut run_start = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        let escape = ESCAPE[usize::from(byte)];
        if escape == 0 {
            continue;
        }
        out.extend_from_slice(&bytes[run_start..index]);
        if escape == b'u' {
            let high = HEX_DIGITS[usize::from(byte >> 4)];
            let low = HEX_DIGITS[usize::from(byte & 0xf)];
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', high, low]);
        } else {
            out.extend_from_slice(&[b'\\', escape]);
        }
        run_start = index + 1;
    }
    out.extend_from_slice(&bytes[run_start..]);
    out.push(b'"');
}

/// Appends `value` in decimal, without allocating.
pub fn write_u64(out: &mut Vec<u8>, mut value: u64) {
    // u64::MAX has 20 digits.
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[start..]);
}

/// The fields of a `diffs` frame that belong to one subscription's frame rather
/// than to the diffs shared by every subscriber of a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiffsExtra {
    /// `"total":N`: the view's length (on a Reset, and when it changed).
    pub total: Option<u64>,
    /// `"offset":N,"limit":M`: where a key-positioned request placed the window.
    pub range: Option<(u64, u64)>,
    /// `"digest":"<16 hex digits>"`: the window digest after the frame (`crate::digest`).
    pub digest: Option<u64>,
}

/// A diffs frame's envelope: everything but the diffs.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiffsHeader<'a> {
    /// The client's subscription id.
    pub sub: &'a str,
    /// The frame's number within its subscription.
    pub seq: u64,
    /// The `seq` of the last batch the window reflects after this frame.
    pub write_seq: u64,
    /// The client's id of the request this frame answers, if any.
    pub req: Option<&'a str>,
    /// `offset`, `limit` and `total`, when due.
    pub extra: DiffsExtra,
}

/// Appends the frame
/// `{"type":"diffs","sub":<sub>,"seq":<seq>,"write_seq":<write_seq>[,"req":<req>][,"offset":N,"limit":M][,"total":N][,"digest":"<hex>"],"diffs":<diffs_json>}`.
///
/// `diffs_json` must be an encoded JSON array; it is copied verbatim.
pub fn write_diffs_frame(out: &mut Vec<u8>, header: &DiffsHeader<'_>, diffs_json: &[u8]) {
    debug_assert!(
        diffs_json.first() == Some(&b'[') && diffs_json.last() == Some(&b']'),
        "diffs_json must be an encoded JSON array"
    );
    const TYPE_AND_SUB: &[u8] = br#"{"type":"diffs","sub":"#;
    const SEQ: &[u8] = br#","seq":"#;
    const WRITE_SEQ: &[u8] = br#","write_seq":"#;
    const REQ: &[u8] = br#","req":"#;
    const DIFFS: &[u8] = br#","diffs":"#;
    let DiffsHeader { sub, seq, write_seq, req, extra } = *header;
    let req_len = req.map_or(0, |req| REQ.len() + req.len() + 2);
    // One reservation for the common case (no escapes in `sub` or `req`): the
    // quotes, at most 20 digits per number, the extras (the digest's 30 bytes
    // included) and the closing brace.
    out.reserve(
        TYPE_AND_SUB.len()
            + sub.len()
            + 2
            + SEQ.len()
            + 20
            + WRITE_SEQ.len()
            + 20
            + req_len
            + 120
            + DIFFS.len()
            + diffs_json.len()
            + 1,
    );
    out.extend_from_slice(TYPE_AND_SUB);
    write_json_str(out, sub);
    out.extend_from_slice(SEQ);
    write_u64(out, seq);
    out.extend_from_slice(WRITE_SEQ);
    write_u64(out, write_seq);
    if let Some(req) = req {
        out.extend_from_slice(REQ);
        write_json_str(out, req);
    }
    if let Some((offset, limit)) = extra.range {
        out.extend_from_slice(b",\"offset\":");
        write_u64(out, offset);
        out.extend_from_slice(b",\"limit\":");
        write_u64(out, limit);
    }
    if let Some(total) = extra.total {
        out.extend_from_slice(b",\"total\":");
        write_u64(out, total);
    }
    if let Some(digest) = extra.digest {
        out.extend_from_slice(b",\"digest\":\"");
        write_digest_hex(out, digest);
        out.push(b'"');
    }
    out.extend_from_slice(DIFFS);
    out.extend_from_slice(diffs_json);
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::rng::Rng;

    /// Every character that `serde_json` treats specially, its neighbours,
    /// and multi-byte UTF-8 of every length.
    fn random_char(rng: &mut Rng) -> char {
        const SPECIAL: &[char] =
            &['"', '\\', '/', '\u{7f}', '\u{80}', 'é', '€', '\u{2028}', '\u{2029}', '\u{feff}', '😀', '\u{10ffff}'];
        match rng.index(4) {
            // Every control character, and the printable ASCII range.
            0 => char::from(rng.index(0x20) as u8),
            1 => char::from(0x20 + rng.index(0x60) as u8),
            2 => SPECIAL[rng.index(SPECIAL.len())],
            _ => loop {
                if let Some(c) = char::from_u32(rng.index(0x11_0000) as u32) {
                    break c;
                }
            },
        }
    }

    #[test]
    fn json_str_matches_serde_json_byte_for_byte() {
        let mut out = Vec::new();
        let mut check = |s: &str| {
            out.clear();
            write_json_str(&mut out, s);
            let expected = serde_json::to_string(s).unwrap();
            assert_eq!(String::from_utf8_lossy(&out), expected, "input {s:?}");
        };
        check("");
        for byte in 0..=0x7fu8 {
            let c = char::from(byte);
            check(&c.to_string());
            check(&format!("a{c}"));
            check(&format!("{c}b"));
            check(&format!("ab{c}{c}cd"));
        }
        for seed in 1..=50 {
            let mut rng = Rng::new(seed);
            for _ in 0..400 {
                let len = rng.index(40);
                let s: String = (0..len).map(|_| random_char(&mut rng)).collect();
                check(&s);
            }
        }
    }

    #[test]
    fn u64_matches_display() {
        let mut out = Vec::new();
        let mut check = |value: u64| {
            out.clear();
            write_u64(&mut out, value);
            assert_eq!(out, value.to_string().as_bytes());
        };
        let mut power = 1u64;
        for _ in 0..20 {
            check(power - 1);
            check(power);
            check(power + 1);
            power = power.saturating_mul(10);
        }
        check(u64::MAX);
        let mut rng = Rng::new(7);
        for _ in 0..10_000 {
            check(rng.next_u64() >> rng.index(64));
        }
    }

    #[test]
    fn diffs_frame_parses_to_the_expected_object() {
        let diffs = br#"[{"Remove":{"index":4}},{"Insert":{"index":0,"value":{"id":"!a","name":"A \"b\""}}}]"#;
        let diffs_value: serde_json::Value = serde_json::from_slice(diffs).unwrap();
        let (long_sub, long_req) = ("x".repeat(64), "y".repeat(64));
        let cases = [
            ("rooms", 7, 42, None),
            ("", 0, 0, Some("")),
            ("a\"b\\c\n\u{1}é😀", u64::MAX, u64::MAX, Some("r\"1\\\u{7}é")),
            (long_sub.as_str(), 1, 3, Some(long_req.as_str())),
        ];
        for (sub, seq, write_seq, req) in cases {
            let mut out = b"previous frame ".to_vec();
            let header = DiffsHeader { sub, seq, write_seq, req, ..DiffsHeader::default() };
            write_diffs_frame(&mut out, &header, diffs);
            let frame = out.strip_prefix(b"previous frame ").expect("appends, keeping what was there");
            let parsed: serde_json::Value = serde_json::from_slice(frame).unwrap();
            let mut expected = serde_json::json!({"type": "diffs", "sub": sub, "seq": seq, "write_seq": write_seq});
            if let Some(req) = req {
                expected["req"] = req.into();
            }
            expected["diffs"] = diffs_value.clone();
            assert_eq!(parsed, expected, "sub {sub:?}, seq {seq}");
            // Field order and spelling as in docs/PROTOCOL.md.
            let req = req.map(|req| format!(r#","req":{}"#, serde_json::to_string(req).unwrap())).unwrap_or_default();
            let exact = format!(
                r#"{{"type":"diffs","sub":{},"seq":{seq},"write_seq":{write_seq}{req},"diffs":{}}}"#,
                serde_json::to_string(sub).unwrap(),
                std::str::from_utf8(diffs).unwrap()
            );
            assert_eq!(frame, exact.as_bytes());
        }
    }

    #[test]
    fn diffs_frame_extras_come_before_the_diffs() {
        let mut out = Vec::new();
        let extra = DiffsExtra { total: Some(42), range: Some((7, 20)), digest: Some(0xcbf2_9ce4_8422_2325) };
        let header = DiffsHeader { sub: "rooms", seq: 3, write_seq: 9, req: Some("r"), extra };
        write_diffs_frame(&mut out, &header, b"[]");
        assert_eq!(
            out,
            br#"{"type":"diffs","sub":"rooms","seq":3,"write_seq":9,"req":"r","offset":7,"limit":20,"total":42,"digest":"cbf29ce484222325","diffs":[]}"#
        );
        out.clear();
        let extra = DiffsExtra { total: Some(0), range: None, digest: None };
        write_diffs_frame(&mut out, &DiffsHeader { sub: "rooms", seq: 3, write_seq: 9, req: None, extra }, b"[]");
        assert_eq!(out, br#"{"type":"diffs","sub":"rooms","seq":3,"write_seq":9,"total":0,"diffs":[]}"#);
    }

    #[test]
    fn a_reused_buffer_does_not_grow_again() {
        let diffs = format!("[{}]", [r#"{"Set":{"index":3,"value":{"id":"!room:example.org"}}}"#; 6].join(","));
        let extra = DiffsExtra { total: Some(u64::MAX), range: Some((u64::MAX, u64::MAX)), digest: Some(u64::MAX) };
        let header = |seq| DiffsHeader { sub: "rooms", seq, write_seq: u64::MAX - seq, req: None, extra };
        let mut out = Vec::new();
        write_diffs_frame(&mut out, &header(1), diffs.as_bytes());
        let (capacity, pointer) = (out.capacity(), out.as_ptr());
        for seq in 2..1_000 {
            out.clear();
            write_diffs_frame(&mut out, &header(seq), diffs.as_bytes());
            assert_eq!((out.capacity(), out.as_ptr()), (capacity, pointer), "seq {seq}");
        }
    }
}
