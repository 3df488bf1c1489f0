//! The few WebSocket frames a holding client needs (RFC 6455): reading the
//! server's (never masked) and writing its own (always masked), so that a
//! connection costs this process a socket and a small buffer, not a full
//! client library's state.

/// Opcodes the holder tells apart.
pub const TEXT: u8 = 0x1;
pub const CLOSE: u8 = 0x8;
pub const PING: u8 = 0x9;
pub const PONG: u8 = 0xA;

/// A server frame's header, parsed from the front of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub opcode: u8,
    /// Bytes of the header, before the payload.
    pub header_len: usize,
    pub payload_len: usize,
}

/// Why a buffer's front is not a frame the holder accepts.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameError {
    /// A server must not mask its frames (RFC 6455, 5.1).
    Masked,
    TooLarge(u64),
}

/// The header at the front of `buffer`, `Ok(None)` while it is incomplete.
/// Payloads above `max_payload` are refused, so a buffer never grows past it.
pub fn parse_header(buffer: &[u8], max_payload: usize) -> Result<Option<Header>, FrameError> {
    let [first, second, rest @ ..] = buffer else { return Ok(None) };
    if second & 0x80 != 0 {
        return Err(FrameError::Masked);
    }
    let (header_len, payload_len) = match second & 0x7F {
        126 => match rest {
            [a, b, ..] => (4, u64::from(u16::from_be_bytes([*a, *b]))),
            _ => return Ok(None),
        },
        127 => match rest.get(..8) {
            Some(bytes) => (10, u64::from_be_bytes(bytes.try_into().expect("eight bytes"))),
            None => return Ok(None),
        },
        short => (2, u64::from(short)),
    };
    if payload_len > max_payload as u64 {
        return Err(FrameError::TooLarge(payload_len));
    }
    Ok(Some(Header { opcode: first & 0x0F, header_len, payload_len: payload_len as usize }))
}

/// Appends a final, masked client frame of `opcode` carrying `payload`.
pub fn write_masked(out: &mut Vec<u8>, opcode: u8, payload: &[u8], mask: [u8; 4]) {
    out.push(0x80 | opcode);
    match payload.len() {
        len @ 0..=125 => out.push(0x80 | len as u8),
        len @ 126..=0xFFFF => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        len => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(index, byte)| byte ^ mask[index % 4]));
}

/// The largest number after each `"<field>":` in `payload` (a frame's JSON):
/// the newest update a frame carries, wherever in the frame its item sits.
pub fn max_number_after(payload: &[u8], marker: &[u8]) -> Option<u64> {
    let mut best = None;
    let mut rest = payload;
    while let Some(at) = find(rest, marker) {
        rest = &rest[at + marker.len()..];
        let digits = rest.iter().take_while(|byte| byte.is_ascii_digit()).count();
        let number = std::str::from_utf8(&rest[..digits]).ok().and_then(|text| text.parse::<u64>().ok());
        best = best.max(number);
    }
    best
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unmasks a client frame the way a server does, to check `write_masked`.
    fn unmask(frame: &[u8]) -> (u8, Vec<u8>) {
        let (len, at) = match frame[1] & 0x7F {
            126 => (u16::from_be_bytes([frame[2], frame[3]]) as usize, 4),
            127 => (u64::from_be_bytes(frame[2..10].try_into().unwrap()) as usize, 10),
            short => (short as usize, 2),
        };
        assert_eq!(frame[1] & 0x80, 0x80, "a client frame is masked");
        let mask = &frame[at..at + 4];
        let payload = frame[at + 4..].iter().enumerate().map(|(index, byte)| byte ^ mask[index % 4]).collect();
        assert_eq!(frame.len(), at + 4 + len);
        (frame[0] & 0x0F, payload)
    }

    #[test]
    fn masked_frames_of_every_length_form_unmask_to_their_payload() {
        for len in [0, 1, 125, 126, 300, 65_535, 65_536, 70_000] {
            let payload: Vec<u8> = (0..len).map(|index| (index % 251) as u8).collect();
            let mut frame = Vec::new();
            write_masked(&mut frame, TEXT, &payload, [0x12, 0x34, 0x56, 0x78]);
            assert_eq!(frame[0], 0x81);
            assert_eq!(unmask(&frame), (TEXT, payload), "length {len}");
        }
    }

    #[test]
    fn headers_parse_once_complete_in_each_length_form() {
        let short = [0x81, 5, b'h', b'e', b'l', b'l', b'o'];
        assert_eq!(parse_header(&short, 100), Ok(Some(Header { opcode: TEXT, header_len: 2, payload_len: 5 })));
        let medium = [0x81, 126, 0x01, 0x00];
        assert_eq!(parse_header(&medium[..3], 1000), Ok(None));
        assert_eq!(parse_header(&medium, 1000), Ok(Some(Header { opcode: TEXT, header_len: 4, payload_len: 256 })));
        let mut long = vec![0x82, 127];
        long.extend_from_slice(&70_000u64.to_be_bytes());
        assert_eq!(parse_header(&long[..9], 100_000), Ok(None));
        assert_eq!(parse_header(&long, 100_000), Ok(Some(Header { opcode: 2, header_len: 10, payload_len: 70_000 })));
        assert_eq!(parse_header(&long, 1_000), Err(FrameError::TooLarge(70_000)));
        assert_eq!(parse_header(&[0x81, 0x85], 100), Err(FrameError::Masked));
        assert_eq!(parse_header(&[0x89], 100), Ok(None));
    }

    #[test]
    fn the_newest_number_is_found_wherever_the_field_sits() {
        let frame = br#"{"diffs":[{"op":"set","item":{"id":"t","fields":{"score":9,"n":7}}},{"op":"push","item":{"fields":{"n":12}}}]}"#;
        assert_eq!(max_number_after(frame, br#""n":"#), Some(12));
        assert_eq!(max_number_after(br#"{"m":3}"#, br#""n":"#), None);
    }
}
