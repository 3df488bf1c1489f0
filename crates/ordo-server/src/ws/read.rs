//! The reading side of a connection: client frames reassembled and size-checked
//! (fastwebsockets), and what RFC 6455 forbids refused with close 1002, among it
//! unmasked frames, which fastwebsockets lets through (`MaskCheck`).

use fastwebsockets::{Frame, OpCode, WebSocketError, WebSocketRead};
use tokio::io::ReadHalf;
use tokio::sync::mpsc;

use super::{Stream, CLOSE_NOT_UTF8, CLOSE_PROTOCOL_ERROR, CLOSE_TOO_BIG};
use crate::limits;

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

pub(super) async fn read_frames(
    mut reader: WebSocketRead<MaskCheck<ReadHalf<Stream>>>,
    inbound: mpsc::Sender<Inbound>,
) {
    reader.set_max_message_size(limits::MAX_INBOUND_FRAME_BYTES + 1);
    // A fragmented message is reassembled here, within the same limit.
    let mut message: Vec<u8> = Vec::new();
    let mut message_is_text = false;
    // Whether a fragmented message has begun and not ended (RFC 6455 §5.4: a
    // continuation belongs inside one, a new text or binary frame outside).
    let mut in_message = false;
    loop {
        let reply_to = inbound.clone();
        let mut send = move |frame: Frame<'_>| {
            let reply = Inbound::Reply(frame.opcode, frame.payload.to_vec());
            let reply_to = reply_to.clone();
            async move { reply_to.send(reply).await.map_err(|_| std::io::Error::other("connection gone")) }
        };
        let event = match reader.read_frame(&mut send).await {
            Ok(frame) => match frame.opcode {
                OpCode::Close => Inbound::Closed,
                OpCode::Ping | OpCode::Pong => continue,
                OpCode::Continuation if !in_message => {
                    Inbound::Fatal(CLOSE_PROTOCOL_ERROR, "protocol error: a continuation frame outside a message")
                }
                OpCode::Text | OpCode::Binary if in_message => {
                    Inbound::Fatal(CLOSE_PROTOCOL_ERROR, "protocol error: a new message inside a fragmented one")
                }
                OpCode::Text | OpCode::Binary | OpCode::Continuation => {
                    if frame.opcode != OpCode::Continuation {
                        message.clear();
                        message_is_text = frame.opcode == OpCode::Text;
                    }
                    in_message = !frame.fin;
                    if message.len() + frame.payload.len() > limits::MAX_INBOUND_FRAME_BYTES {
                        Inbound::Fatal(CLOSE_TOO_BIG, "message too big")
                    } else {
                        message.extend_from_slice(&frame.payload);
                        if !frame.fin {
                            continue;
                        }
                        if !message_is_text {
                            Inbound::Binary
                        } else if std::str::from_utf8(&message).is_err() {
                            Inbound::Fatal(CLOSE_NOT_UTF8, "text frame is not UTF-8")
                        } else {
                            Inbound::Text(std::mem::take(&mut message))
                        }
                    }
                }
            },
            Err(WebSocketError::FrameTooLarge) => Inbound::Fatal(CLOSE_TOO_BIG, "message too big"),
            Err(WebSocketError::InvalidUTF8) => Inbound::Fatal(CLOSE_NOT_UTF8, "text frame is not UTF-8"),
            Err(WebSocketError::IoError(error)) if UnmaskedFrame::is(&error) => {
                Inbound::Fatal(CLOSE_PROTOCOL_ERROR, "protocol error: an unmasked client frame")
            }
            // fastwebsockets found the frame malformed: RFC 6455 asks for 1002, not
            // a silent drop. (An invalid close code got its 1002 reply already.)
            Err(
                WebSocketError::ReservedBitsNotZero
                | WebSocketError::InvalidValue
                | WebSocketError::ControlFrameFragmented
                | WebSocketError::PingFrameTooLarge
                | WebSocketError::InvalidFragment
                | WebSocketError::InvalidContinuationFrame
                | WebSocketError::InvalidCloseFrame
                | WebSocketError::InvalidCloseCode,
            ) => Inbound::Fatal(CLOSE_PROTOCOL_ERROR, "protocol error: a malformed frame"),
            Err(_) => Inbound::Closed,
        };
        let last = !matches!(event, Inbound::Text(_) | Inbound::Binary);
        if inbound.send(event).await.is_err() || last {
            return;
        }
    }
}

/// The error `MaskCheck` reads fail with after an unmasked frame.
#[derive(Debug)]
struct UnmaskedFrame;

impl std::fmt::Display for UnmaskedFrame {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("an unmasked client frame")
    }
}

impl std::error::Error for UnmaskedFrame {}

impl UnmaskedFrame {
    fn is(error: &std::io::Error) -> bool {
        error.get_ref().is_some_and(|inner| inner.is::<UnmaskedFrame>())
    }
}

/// The client's byte stream on its way to fastwebsockets, which unmasks masked
/// frames but passes unmasked ones through, and whose `Frame` does not say which
/// it was. RFC 6455 §5.1 obliges a server to close on an unmasked client frame,
/// so this follows the frame headers in the stream (skipping payloads, so the
/// cost is per frame, not per byte) and, at the first unmasked header, holds
/// back everything from its mask bit on: fastwebsockets decodes the frames
/// before it, then its next read fails with `UnmaskedFrame`.
pub(super) struct MaskCheck<R> {
    inner: R,
    /// Payload bytes of the current frame still to pass.
    payload_left: u64,
    /// The frame header being read (at most 14 bytes), and how much of it arrived.
    header: [u8; 14],
    n_header: usize,
    /// An unmasked frame was seen: every read fails from now on.
    unmasked: bool,
}

impl<R> MaskCheck<R> {
    pub(super) fn new(inner: R) -> MaskCheck<R> {
        MaskCheck { inner, payload_left: 0, header: [0; 14], n_header: 0, unmasked: false }
    }

    /// Follows the frames through `data`, the bytes just read; returns the index
    /// of the first byte to hold back when a header says "unmasked".
    fn scan(&mut self, data: &[u8]) -> Option<usize> {
        let mut index = 0;
        while index < data.len() {
            if self.payload_left > 0 {
                let n_skipped = self.payload_left.min((data.len() - index) as u64);
                self.payload_left -= n_skipped;
                index += n_skipped as usize;
                continue;
            }
            self.header[self.n_header] = data[index];
            self.n_header += 1;
            if self.n_header == 2 && self.header[1] & 0x80 == 0 {
                return Some(index);
            }
            if self.n_header >= 2 {
                let length_code = self.header[1] & 0x7F;
                let n_length_bytes = match length_code {
                    126 => 2,
                    127 => 8,
                    _ => 0,
                };
                if self.n_header == 2 + n_length_bytes + 4 {
                    self.payload_left = match n_length_bytes {
                        0 => u64::from(length_code),
                        2 => u64::from(u16::from_be_bytes([self.header[2], self.header[3]])),
                        _ => u64::from_be_bytes(self.header[2..10].try_into().expect("8 bytes")),
                    };
                    self.n_header = 0;
                }
            }
            index += 1;
        }
        None
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for MaskCheck<R> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = self.get_mut();
        let unmasked = || std::io::Error::new(std::io::ErrorKind::InvalidData, UnmaskedFrame);
        if this.unmasked {
            return Poll::Ready(Err(unmasked()));
        }
        let n_before = buf.filled().len();
        match std::pin::Pin::new(&mut this.inner).poll_read(context, buf) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        if let Some(n_passed) = this.scan(&buf.filled()[n_before..]) {
            this.unmasked = true;
            if n_passed == 0 {
                // Nothing to pass: an empty read would mean end of stream.
                return Poll::Ready(Err(unmasked()));
            }
            buf.set_filled(n_before + n_passed);
        }
        Poll::Ready(Ok(()))
    }
}
