//! The reading side of a connection: client frames parsed (RFC 6455 §5.2),
//! unmasked, reassembled and size-checked, and what the RFC forbids refused
//! with the close code it names.
//!
//! The reader keeps only what the frame being read needs: its buffer grows to
//! a frame's size while that frame arrives and goes back to
//! [`RETAINED_READ_BYTES`] once it is handled. A held connection is mostly
//! idle, and with a hundred thousand of them a fixed 8 KiB read buffer (what
//! fastwebsockets keeps) would be 800 MB.

use fastwebsockets::OpCode;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{CLOSE_NOT_UTF8, CLOSE_PROTOCOL_ERROR, CLOSE_TOO_BIG};
use crate::limits;

/// What the read buffer keeps between frames, and the least it asks the socket
/// for: a client's usual message (a `subscribe`, a `set_range`) fits.
pub(super) const RETAINED_READ_BYTES: usize = 512;

/// A control frame's payload limit (RFC 6455 §5.5).
const MAX_CONTROL_PAYLOAD: usize = 125;

/// The longest frame header: 2 bytes, an 8-byte length, a 4-byte mask.
const MAX_HEADER_BYTES: usize = 14;

pub(super) enum Inbound {
    Text(Vec<u8>),
    Binary,
    /// A frame the protocol obliges us to send (pong, close reply).
    Reply(OpCode, Vec<u8>),
    /// The client closed, or the stream ended.
    Closed,
    /// A protocol violation: close with this code.
    Fatal(u16, &'static str),
}

/// A client frame's header, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FrameHeader {
    fin: bool,
    opcode: OpCode,
    mask: [u8; 4],
    /// Bytes of the header itself.
    header_len: usize,
    payload_len: usize,
}

/// Why a header is refused: the close code and the reason sent with it.
type Violation = (u16, &'static str);

const MALFORMED: Violation = (CLOSE_PROTOCOL_ERROR, "protocol error: a malformed frame");
const UNMASKED: Violation = (CLOSE_PROTOCOL_ERROR, "protocol error: an unmasked client frame");
const TOO_BIG: Violation = (CLOSE_TOO_BIG, "message too big");

/// Parses the header at the start of `bytes`: `Ok(None)` while it is incomplete.
/// Refuses what RFC 6455 forbids a client (§5.1–§5.5: reserved bits, unknown
/// opcodes, an unmasked frame, a fragmented or long control frame) and any
/// payload over [`limits::MAX_INBOUND_FRAME_BYTES`], before it is read.
fn parse_header(bytes: &[u8]) -> Result<Option<FrameHeader>, Violation> {
    let [first, second, ..] = *bytes else { return Ok(None) };
    if first & 0x70 != 0 {
        return Err(MALFORMED);
    }
    let opcode = match first & 0x0F {
        0x0 => OpCode::Continuation,
        0x1 => OpCode::Text,
        0x2 => OpCode::Binary,
        0x8 => OpCode::Close,
        0x9 => OpCode::Ping,
        0xA => OpCode::Pong,
        _ => return Err(MALFORMED),
    };
    let fin = first & 0x80 != 0;
    if second & 0x80 == 0 {
        return Err(UNMASKED);
    }
    let n_length_bytes = match second & 0x7F {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let header_len = 2 + n_length_bytes + 4;
    if bytes.len() < header_len {
        return Ok(None);
    }
    let length = match n_length_bytes {
        0 => u64::from(second & 0x7F),
        2 => u64::from(u16::from_be_bytes([bytes[2], bytes[3]])),
        _ => u64::from_be_bytes(bytes[2..10].try_into().expect("8 bytes")),
    };
    let is_control = matches!(opcode, OpCode::Close | OpCode::Ping | OpCode::Pong);
    if is_control && (!fin || length > MAX_CONTROL_PAYLOAD as u64) {
        return Err(MALFORMED);
    }
    if length > limits::MAX_INBOUND_FRAME_BYTES as u64 {
        return Err(TOO_BIG);
    }
    let mask = bytes[header_len - 4..header_len].try_into().expect("4 bytes");
    Ok(Some(FrameHeader { fin, opcode, mask, header_len, payload_len: length as usize }))
}

/// Applies (and so removes) a client frame's mask, the payload's byte `i`
/// XORed with the key's byte `i mod 4`.
fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    let word = u32::from_ne_bytes(mask);
    let mut chunks = payload.chunks_exact_mut(4);
    for chunk in &mut chunks {
        let value = u32::from_ne_bytes(chunk.try_into().expect("4 bytes")) ^ word;
        chunk.copy_from_slice(&value.to_ne_bytes());
    }
    for (byte, key) in chunks.into_remainder().iter_mut().zip(mask) {
        *byte ^= key;
    }
}

/// Whether a close frame may carry `code` (RFC 6455 §7.4: the registered codes
/// an endpoint may send, and the ranges for libraries and applications).
fn close_code_allowed(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// A fragmented message being reassembled (RFC 6455 §5.4).
#[derive(Default)]
struct Message {
    bytes: Vec<u8>,
    is_text: bool,
    /// A first fragment arrived and the final one has not: a continuation
    /// belongs inside one, a new text or binary frame outside.
    open: bool,
}

impl Message {
    /// The event for one data frame with its payload unmasked, or `None` while
    /// the message is not complete.
    fn on_data_frame(&mut self, header: &FrameHeader, payload: &[u8]) -> Option<Inbound> {
        match header.opcode {
            OpCode::Continuation if !self.open => {
                return Some(Inbound::Fatal(
                    CLOSE_PROTOCOL_ERROR,
                    "protocol error: a continuation frame outside a message",
                ))
            }
            OpCode::Text | OpCode::Binary if self.open => {
                return Some(Inbound::Fatal(
                    CLOSE_PROTOCOL_ERROR,
                    "protocol error: a new message inside a fragmented one",
                ))
            }
            OpCode::Continuation => {}
            _ if header.fin => return Some(complete(header.opcode == OpCode::Text, payload.to_vec())),
            _ => {
                self.bytes.clear();
                self.is_text = header.opcode == OpCode::Text;
            }
        }
        if self.bytes.len() + payload.len() > limits::MAX_INBOUND_FRAME_BYTES {
            return Some(Inbound::Fatal(TOO_BIG.0, TOO_BIG.1));
        }
        self.bytes.extend_from_slice(payload);
        self.open = !header.fin;
        (!self.open).then(|| complete(self.is_text, std::mem::take(&mut self.bytes)))
    }
}

/// A whole message: text must be UTF-8 (RFC 6455 §8.1); binary is refused
/// by the protocol, so its bytes are not kept.
fn complete(is_text: bool, bytes: Vec<u8>) -> Inbound {
    if !is_text {
        Inbound::Binary
    } else if std::str::from_utf8(&bytes).is_err() {
        Inbound::Fatal(CLOSE_NOT_UTF8, "text frame is not UTF-8")
    } else {
        Inbound::Text(bytes)
    }
}

/// The events for a close frame: the echo the RFC asks for, then the end; or a
/// refusal of a malformed one (a one-byte payload, a code no endpoint may send,
/// a reason that is not UTF-8).
fn on_close_frame(payload: &[u8]) -> [Option<Inbound>; 2] {
    let refuse = |violation: Violation| [Some(Inbound::Fatal(violation.0, violation.1)), None];
    if payload.len() == 1 {
        return refuse(MALFORMED);
    }
    if let [high, low, reason @ ..] = payload {
        if std::str::from_utf8(reason).is_err() {
            return refuse((CLOSE_NOT_UTF8, "close reason is not UTF-8"));
        }
        if !close_code_allowed(u16::from_be_bytes([*high, *low])) {
            return refuse(MALFORMED);
        }
    }
    [Some(Inbound::Reply(OpCode::Close, payload.to_vec())), Some(Inbound::Closed)]
}

/// A connection's reading state: the bytes read and not yet handled, and the
/// message being reassembled. The connection task polls it beside its other
/// sources of work, so a connection needs no reader task or inbound queue.
#[derive(Default)]
pub(super) struct FrameReader {
    buffer: Vec<u8>,
    message: Message,
}

impl FrameReader {
    /// Reads the next frame and returns what it means (at most two events; a
    /// pong gives none). After `Closed` or `Fatal` the connection is over: the
    /// reader is not asked again.
    ///
    /// Cancel-safe, as `tokio::select!` needs: every byte read is kept in the
    /// buffer until its frame is whole, and nothing changes after the last await.
    pub(super) async fn next_events(&mut self, stream: &mut (impl AsyncRead + Unpin)) -> [Option<Inbound>; 2] {
        let header = match next_frame(stream, &mut self.buffer).await {
            Err(violation) => return [Some(Inbound::Fatal(violation.0, violation.1)), None],
            Ok(None) => return [Some(Inbound::Closed), None],
            Ok(Some(header)) => header,
        };
        let frame_len = header.header_len + header.payload_len;
        let payload = &mut self.buffer[header.header_len..frame_len];
        unmask(payload, header.mask);
        let events = match header.opcode {
            OpCode::Close => on_close_frame(payload),
            OpCode::Ping => [Some(Inbound::Reply(OpCode::Pong, payload.to_vec())), None],
            OpCode::Pong => [None, None],
            _ => [self.message.on_data_frame(&header, payload), None],
        };
        self.buffer.drain(..frame_len);
        if self.buffer.is_empty() && self.buffer.capacity() > RETAINED_READ_BYTES {
            self.buffer.shrink_to(RETAINED_READ_BYTES);
        }
        events
    }
}

/// Reads until `buffer` starts with a whole frame and returns its header;
/// `Ok(None)` when the stream ends or fails first.
async fn next_frame(
    stream: &mut (impl AsyncRead + Unpin),
    buffer: &mut Vec<u8>,
) -> Result<Option<FrameHeader>, Violation> {
    let header = loop {
        if let Some(header) = parse_header(buffer)? {
            break header;
        }
        if !read_more(stream, buffer, MAX_HEADER_BYTES).await {
            return Ok(None);
        }
    };
    let frame_len = header.header_len + header.payload_len;
    while buffer.len() < frame_len {
        // Room for the rest of the frame and the next one's header, in one read when it has arrived.
        if !read_more(stream, buffer, frame_len - buffer.len() + MAX_HEADER_BYTES).await {
            return Ok(None);
        }
    }
    Ok(Some(header))
}

/// Reads what the socket has (at least one byte) into `buffer` with room for
/// `wanted` more bytes; `false` when the stream ended or failed.
async fn read_more(stream: &mut (impl AsyncRead + Unpin), buffer: &mut Vec<u8>, wanted: usize) -> bool {
    buffer.reserve(wanted.max(RETAINED_READ_BYTES.saturating_sub(buffer.len())));
    matches!(stream.read_buf(buffer).await, Ok(n) if n > 0)
}

#[cfg(test)]
mod tests;
