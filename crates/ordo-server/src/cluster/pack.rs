//! Many entries in one stream message, and the seqs they get.
//!
//! The stream's cost is per message (its store's write, each replica's apply,
//! the acknowledgement), so the node that takes writes packs the entries of a
//! group into one message (`coalesce`). Every node then applies a message's
//! entries each at a seq of its own, derived from the message's stream seq
//! alone so that every node numbers alike (the [`SeqScheme`]).
//!
//! A pack is binary, so it can never be read as a JSON entry (which starts
//! with `{`): the byte [`PACK_TAG`], the entry count (`u16`, little endian),
//! then for each entry its message id (`u16` length, UTF-8 bytes) and its
//! payload (`u32` length, the entry's JSON as published alone).

use bytes::{BufMut, Bytes, BytesMut};

/// The first byte of a pack (a JSON entry starts with `{`).
pub const PACK_TAG: u8 = 0x01;
/// Bytes a pack adds: the tag and the count, then per entry the two lengths.
pub const PACK_HEADER_BYTES: usize = 3;
pub const PACK_ENTRY_OVERHEAD_BYTES: usize = 6;

/// How a stream message's entries are numbered: with `shift` bits, message
/// `s` owns the seqs `s << shift ..= (s << shift) + 2^shift − 1`, and its `k`
/// entries take the *last* `k` of them. So every node numbers alike from the
/// stream seq and the entry's place alone, and a message is applied whole
/// exactly when the last seq applied is the last of its range: a node that
/// stopped inside a message knows it from its store's `last_seq()` and
/// consumes that message again (skipping what it holds).
///
/// `shift` 0 is the scheme of a stream written one entry per message: an
/// entry's seq is its stream seq. It is kept in the stream's metadata
/// ([`SEQ_SHIFT_METADATA`]) by the node that creates the stream; a stream
/// without it was created before packs and keeps one entry per message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqScheme {
    shift: u32,
}

/// The stream metadata key holding the [`SeqScheme`]'s shift.
pub const SEQ_SHIFT_METADATA: &str = "ordo_seq_shift";
/// The shift of a stream this node creates: up to 256 entries in one message.
pub const PACKED_SHIFT: u32 = 8;

impl SeqScheme {
    /// One entry per message, its seq the stream's.
    pub const ONE_PER_MESSAGE: SeqScheme = SeqScheme { shift: 0 };
    pub const PACKED: SeqScheme = SeqScheme { shift: PACKED_SHIFT };

    /// The scheme a stream's metadata value names (`None`: one per message);
    /// `Err` for a value this build cannot follow.
    pub fn from_metadata(value: Option<&str>) -> Result<SeqScheme, String> {
        match value {
            None => Ok(SeqScheme::ONE_PER_MESSAGE),
            Some(text) => match text.parse::<u32>() {
                Ok(shift) if shift <= 16 => Ok(SeqScheme { shift }),
                _ => Err(format!(
                    "the stream's `{SEQ_SHIFT_METADATA}` is `{text}`, which this build cannot follow (0..=16)"
                )),
            },
        }
    }

    pub(crate) fn with_shift(shift: u32) -> SeqScheme {
        SeqScheme { shift }
    }

    pub fn shift(self) -> u32 {
        self.shift
    }

    pub fn metadata_value(self) -> String {
        self.shift.to_string()
    }

    /// Most entries one message may hold.
    pub fn max_entries(self) -> usize {
        1 << self.shift
    }

    pub fn packs(self) -> bool {
        self.shift > 0
    }

    fn mask(self) -> u64 {
        (1u64 << self.shift) - 1
    }

    /// The seq of entry `index` of the `n_entries` of stream message `stream_seq`.
    pub fn entry_seq(self, stream_seq: u64, n_entries: usize, index: usize) -> u64 {
        debug_assert!(index < n_entries && n_entries <= self.max_entries());
        (stream_seq << self.shift) + self.mask() + 1 - n_entries as u64 + index as u64
    }

    /// The last stream message applied whole when `seq` is the last seq applied.
    pub fn applied_stream_seq(self, seq: u64) -> u64 {
        let message = seq >> self.shift;
        if seq & self.mask() == self.mask() {
            message
        } else {
            message.saturating_sub(1)
        }
    }

    /// The first stream message to consume when `seq` is the last seq applied:
    /// the one after the last applied whole (a message applied in part is
    /// consumed again, its entries at or below `seq` skipped).
    pub fn resume_stream_seq(self, seq: u64) -> u64 {
        self.applied_stream_seq(seq) + 1
    }
}

/// Appends a pack of `entries` (message id, payload) to `out`.
pub fn encode(entries: &[(String, Bytes)], out: &mut BytesMut) {
    assert!(entries.len() <= usize::from(u16::MAX), "a pack holds at most {} entries", u16::MAX);
    out.reserve(packed_bytes(entries));
    out.put_u8(PACK_TAG);
    out.put_u16_le(entries.len() as u16);
    for (id, payload) in entries {
        assert!(id.len() <= usize::from(u16::MAX), "a message id of {} bytes", id.len());
        out.put_u16_le(id.len() as u16);
        out.put_slice(id.as_bytes());
        out.put_u32_le(payload.len() as u32);
        out.put_slice(payload);
    }
}

/// The bytes a pack of `entries` takes.
pub fn packed_bytes(entries: &[(String, Bytes)]) -> usize {
    PACK_HEADER_BYTES
        + entries.iter().map(|(id, payload)| PACK_ENTRY_OVERHEAD_BYTES + id.len() + payload.len()).sum::<usize>()
}

/// Whether `message` is a pack (else it is one entry's JSON).
pub fn is_pack(message: &[u8]) -> bool {
    message.first() == Some(&PACK_TAG)
}

/// An entry's message id: a slice of its message (no copy), checked UTF-8.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MsgId(Bytes);

impl MsgId {
    pub fn as_str(&self) -> &str {
        // Checked when made (`decode`, `From<String>`); a few ns for an id.
        std::str::from_utf8(&self.0).expect("a message id is UTF-8")
    }
}

impl From<String> for MsgId {
    fn from(id: String) -> MsgId {
        MsgId(Bytes::from(id))
    }
}

/// A pack whose layout `decode` checked: its entries, each message id and
/// payload a slice of the message, read without allocating (a follower reads
/// every entry of every message).
#[derive(Debug)]
pub struct Pack {
    message: Bytes,
    count: usize,
}

impl Pack {
    /// Its entries: 1 to the scheme's `max_entries` (`decode` refuses an empty pack).
    pub fn n_entries(&self) -> usize {
        self.count
    }

    /// The entries in order.
    pub fn entries(&self) -> impl Iterator<Item = (MsgId, Bytes)> + '_ {
        let mut at = PACK_HEADER_BYTES;
        (0..self.count).map(move |_| {
            let (id, payload) = entry_at(&self.message, at).expect("checked by `decode`");
            at = payload.end;
            (MsgId(self.message.slice(id)), self.message.slice(payload))
        })
    }
}

/// A pack's entries, checked: `Err` for a message that is not a pack, one cut
/// short or followed by bytes, one with an id that is not UTF-8, and one that
/// holds no entry or more than `max_entries`.
pub fn decode(message: &Bytes, max_entries: usize) -> Result<Pack, String> {
    let header = message.get(..PACK_HEADER_BYTES).ok_or("a message shorter than a pack's header")?;
    if header[0] != PACK_TAG {
        return Err("not a pack".to_owned());
    }
    let count = usize::from(u16::from_le_bytes([header[1], header[2]]));
    if count == 0 || count > max_entries {
        return Err(format!("a pack of {count} entries (a message holds 1 to {max_entries})"));
    }
    let mut at = PACK_HEADER_BYTES;
    for index in 0..count {
        let (id, payload) =
            entry_at(message, at).ok_or_else(|| format!("a pack cut short in entry {index} of {count}"))?;
        if std::str::from_utf8(&message[id]).is_err() {
            return Err(format!("entry {index} of a pack has an id that is not UTF-8"));
        }
        at = payload.end;
    }
    if at != message.len() {
        return Err(format!("{} bytes after a pack's {count} entries", message.len() - at));
    }
    Ok(Pack { message: message.clone(), count })
}

/// The byte ranges of the id and the payload of the entry that starts at
/// `at`; `None` when the message ends first.
fn entry_at(message: &[u8], at: usize) -> Option<(std::ops::Range<usize>, std::ops::Range<usize>)> {
    let id_len = usize::from(u16::from_le_bytes(read(message, at)?));
    let id = at + 2..at + 2 + id_len;
    let payload_len = u32::from_le_bytes(read(message, id.end)?) as usize;
    let payload = id.end + 4..id.end + 4 + payload_len;
    (payload.end <= message.len()).then_some((id, payload))
}

fn read<const N: usize>(message: &[u8], at: usize) -> Option<[u8; N]> {
    message.get(at..at + N).map(|bytes| bytes.try_into().expect("N bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: usize) -> Vec<(String, Bytes)> {
        (0..n).map(|index| (format!("id-{index}"), Bytes::from(format!("{{\"n\":{index}}}")))).collect()
    }

    #[test]
    fn a_pack_decodes_to_its_entries_and_nothing_else_does() {
        for n in [1, 2, 37, 256] {
            let mut out = BytesMut::new();
            encode(&entries(n), &mut out);
            assert_eq!(out.len(), packed_bytes(&entries(n)));
            let message = out.freeze();
            assert!(is_pack(&message));
            let decoded: Vec<(String, Bytes)> = decode(&message, 256)
                .unwrap()
                .entries()
                .map(|(id, payload)| (id.as_str().to_owned(), payload))
                .collect();
            assert_eq!(decoded, entries(n));
            for cut in [1, 3, message.len() / 2, message.len() - 1] {
                assert!(decode(&message.slice(..cut), 256).is_err(), "cut at {cut} of {}", message.len());
            }
            let mut longer = BytesMut::from(&message[..]);
            longer.put_u8(0);
            assert!(decode(&longer.freeze(), 256).is_err(), "a byte after the entries");
        }
        // An id that is not UTF-8 (entry 0's id starts after the header and its length).
        let mut bad_id = BytesMut::new();
        encode(&entries(2), &mut bad_id);
        bad_id[PACK_HEADER_BYTES + 2] = 0xFF;
        assert!(decode(&bad_id.freeze(), 256).unwrap_err().contains("not UTF-8"));
        assert!(!is_pack(b"{\"kind\":\"write\"}"));
        assert!(decode(&Bytes::from_static(b"{\"kind\":\"write\"}"), 256).is_err());
        assert!(decode(&Bytes::from_static(b"{}"), 256).is_err());
    }

    /// A message's entries must fit the seqs it owns: an empty pack, or one of
    /// more entries than the scheme numbers, does not decode.
    #[test]
    fn a_pack_holds_one_to_max_entries() {
        let max = SeqScheme::PACKED.max_entries();
        for (n, fits) in [(0, false), (1, true), (max, true), (max + 1, false)] {
            let mut out = BytesMut::new();
            encode(&entries(n), &mut out);
            assert_eq!(decode(&out.freeze(), max).is_ok(), fits, "a pack of {n} entries");
        }
    }

    #[test]
    fn one_entry_per_message_keeps_the_stream_seqs() {
        let scheme = SeqScheme::ONE_PER_MESSAGE;
        for stream_seq in [1, 2, 1000] {
            assert_eq!(scheme.entry_seq(stream_seq, 1, 0), stream_seq);
            assert_eq!(scheme.applied_stream_seq(stream_seq), stream_seq);
            assert_eq!(scheme.resume_stream_seq(stream_seq), stream_seq + 1);
        }
        assert_eq!(scheme.resume_stream_seq(0), 1);
        assert!(!scheme.packs());
    }

    /// Against a reference that numbers every entry of a list of messages one
    /// by one: seqs rise, every message's range is its own, and the last seq
    /// applied tells which message to consume next.
    #[test]
    fn packed_seqs_rise_and_say_where_to_resume() {
        let scheme = SeqScheme::PACKED;
        let sizes = [1usize, 256, 3, 1, 255, 2];
        let mut last = 0u64;
        assert_eq!(scheme.resume_stream_seq(0), 1);
        for (message_index, &n) in sizes.iter().enumerate() {
            let stream_seq = message_index as u64 + 1;
            for index in 0..n {
                let seq = scheme.entry_seq(stream_seq, n, index);
                assert!(seq > last, "message {stream_seq} entry {index}: {seq} after {last}");
                assert_eq!(seq >> PACKED_SHIFT, stream_seq);
                last = seq;
                let whole = index + 1 == n;
                let resume = scheme.resume_stream_seq(seq);
                assert_eq!(resume, if whole { stream_seq + 1 } else { stream_seq }, "after entry {index} of {n}");
                assert_eq!(scheme.applied_stream_seq(seq), resume - 1);
            }
        }
        assert_eq!(SeqScheme::from_metadata(Some("8")).unwrap(), SeqScheme::PACKED);
        assert_eq!(SeqScheme::from_metadata(None).unwrap(), SeqScheme::ONE_PER_MESSAGE);
        assert!(SeqScheme::from_metadata(Some("x")).is_err());
        assert!(SeqScheme::from_metadata(Some("40")).is_err());
    }
}
