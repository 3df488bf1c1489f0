//! The writing side of a connection: server frames (final, unmasked) queued into
//! one buffer and written together, with the slow-client deadline, and the JSON
//! frames the connection task answers with itself (`error`, `ack`, `ended`, close).
//! Only the connection task writes.

use std::time::{Duration, Instant};

use fastwebsockets::OpCode;
use tokio::io::AsyncWriteExt;

use super::{Connection, CLOSE_SLOW};
use crate::error::ApiError;
use crate::frame::write_json_str;
use crate::metrics::{self, Stage, METRICS};

/// What a connection's frame and write buffers keep between uses: the usual
/// frames (a diff, an ack) fit, so a busy connection reuses its buffers without
/// allocating, while one large frame (a big snapshot) or a burst does not stay
/// resident for the rest of an idle connection's life: with a hundred thousand
/// connections held, each kilobyte kept is a hundred megabytes. A window's
/// first frame (its rows) is usually larger and is given back after it.
pub(super) const RETAINED_BUFFER_BYTES: usize = 2048;

/// Gives back what `buffer` holds beyond [`RETAINED_BUFFER_BYTES`] once it is empty again.
fn release_excess(buffer: &mut Vec<u8>) {
    if buffer.capacity() > RETAINED_BUFFER_BYTES {
        buffer.clear();
        buffer.shrink_to(RETAINED_BUFFER_BYTES);
    }
}

impl Connection {
    /// Frames `self.frame` (a server frame: final, unmasked) into `self.out`.
    pub(super) fn queue_frame(&mut self, opcode: OpCode) {
        let length = self.frame.len();
        let opcode = match opcode {
            OpCode::Continuation => 0x0,
            OpCode::Text => 0x1,
            OpCode::Binary => 0x2,
            OpCode::Close => 0x8,
            OpCode::Ping => 0x9,
            OpCode::Pong => 0xA,
        };
        self.out.push(0x80 | opcode);
        if length < 126 {
            self.out.push(length as u8);
        } else if length <= u16::MAX as usize {
            self.out.push(126);
            self.out.extend_from_slice(&(length as u16).to_be_bytes());
        } else {
            self.out.push(127);
            self.out.extend_from_slice(&(length as u64).to_be_bytes());
        }
        self.out.extend_from_slice(&self.frame);
        release_excess(&mut self.frame);
        metrics::add(&METRICS.frames_sent, 1);
    }

    /// Writes every queued frame. A write that makes no progress for the whole
    /// deadline means the client stopped reading: the close frame could not get
    /// through a full socket, so the connection is simply dropped (its session is
    /// kept for resume).
    pub(super) async fn flush(&mut self) {
        if self.closed || self.out.is_empty() {
            self.out.clear();
            return;
        }
        let deadline = self.context.config.slow_close_after;
        let started = Instant::now();
        match tokio::time::timeout(deadline, self.writer.write_all(&self.out)).await {
            Ok(Ok(())) => {
                metrics::record_stage(Stage::SocketWrite, started.elapsed());
                metrics::add(&METRICS.bytes_sent, self.out.len() as u64);
            }
            Ok(Err(_)) => self.closed = true,
            Err(_) => {
                metrics::add(&METRICS.closed_slow, 1);
                // The socket is full, so the close frame gets a moment only: it
                // reaches a client that resumes reading just now, no other.
                self.out.clear();
                self.close(CLOSE_SLOW, "slow: the connection stopped reading").await;
            }
        }
        self.out.clear();
        release_excess(&mut self.out);
    }

    pub(super) async fn write(&mut self, opcode: OpCode) {
        self.queue_frame(opcode);
        self.flush().await;
    }

    pub(super) async fn close(&mut self, code: u16, reason: &str) {
        if self.closed {
            return;
        }
        self.closed_with = Some((code, reason.to_owned()));
        self.frame.clear();
        self.frame.extend_from_slice(&code.to_be_bytes());
        self.frame.extend_from_slice(reason.as_bytes());
        self.queue_frame(OpCode::Close);
        let patience = if code == CLOSE_SLOW { Duration::from_millis(100) } else { Duration::from_secs(1) };
        let _ = tokio::time::timeout(patience, self.writer.write_all(&self.out)).await;
        self.out.clear();
        self.closed = true;
    }

    pub(super) async fn send_json(&mut self, value: &serde_json::Value) {
        self.frame.clear();
        serde_json::to_writer(&mut self.frame, value).expect("JSON to a Vec");
        self.write(OpCode::Text).await;
    }

    pub(super) async fn send_error(&mut self, error: &ApiError, sub: Option<&str>, req: Option<&str>) {
        metrics::count_error(error.code);
        // `debug`: a client may send up to its message rate of refused requests.
        tracing::debug!(
            session = self.session.id,
            code = error.code.as_str(),
            sub,
            "websocket request refused: {}",
            error.message
        );
        self.frame.clear();
        self.frame.extend_from_slice(b"{\"type\":\"error\",\"code\":\"");
        self.frame.extend_from_slice(error.code.as_str().as_bytes());
        self.frame.extend_from_slice(b"\",\"message\":");
        write_json_str(&mut self.frame, &error.message);
        if let Some(sub) = sub {
            self.frame.extend_from_slice(b",\"sub\":");
            write_json_str(&mut self.frame, sub);
        }
        push_req(&mut self.frame, req);
        self.frame.push(b'}');
        self.write(OpCode::Text).await;
    }

    /// `{"type":"ack","req":..,"sub":..}`: a request on `sub` took effect without
    /// a frame of its own (`req` absent when the request had none).
    pub(super) fn queue_ack(&mut self, sub: &str, req: Option<&str>) {
        self.frame.clear();
        self.frame.extend_from_slice(b"{\"type\":\"ack\"");
        push_req(&mut self.frame, req);
        self.frame.extend_from_slice(b",\"sub\":");
        write_json_str(&mut self.frame, sub);
        self.frame.push(b'}');
        self.queue_frame(OpCode::Text);
    }

    /// `{"type":"ended","sub":..,"reason":..,"message":..}`
    pub(super) async fn send_ended(&mut self, client_id: &str, reason: crate::writer::EndReason, message: &str) {
        self.frame.clear();
        self.frame.extend_from_slice(b"{\"type\":\"ended\",\"sub\":");
        write_json_str(&mut self.frame, client_id);
        self.frame.extend_from_slice(b",\"reason\":\"");
        self.frame.extend_from_slice(reason.as_str().as_bytes());
        self.frame.extend_from_slice(b"\",\"message\":");
        write_json_str(&mut self.frame, message);
        self.frame.push(b'}');
        self.write(OpCode::Text).await;
    }
}

/// Appends `,"req":<req>` when there is one.
pub(super) fn push_req(frame: &mut Vec<u8>, req: Option<&str>) {
    if let Some(req) = req {
        frame.extend_from_slice(b",\"req\":");
        write_json_str(frame, req);
    }
}

#[cfg(test)]
mod tests {
    use super::{release_excess, RETAINED_BUFFER_BYTES};

    #[test]
    fn a_buffer_keeps_its_usual_room_and_gives_back_a_large_frames() {
        let mut usual = Vec::with_capacity(RETAINED_BUFFER_BYTES);
        usual.extend_from_slice(b"a diff");
        release_excess(&mut usual);
        assert_eq!((usual.len(), usual.capacity()), (6, RETAINED_BUFFER_BYTES), "reused as it is");
        let mut large = vec![0u8; 10 * RETAINED_BUFFER_BYTES];
        release_excess(&mut large);
        assert!(large.is_empty());
        assert!(large.capacity() <= RETAINED_BUFFER_BYTES, "kept {} bytes", large.capacity());
    }
}
