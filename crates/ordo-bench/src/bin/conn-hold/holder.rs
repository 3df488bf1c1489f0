//! One held WebSocket: connect from its own loopback source address, upgrade,
//! read `welcome`, wait for the signal to subscribe, subscribe to the window,
//! then read every frame until told to stop, answering pings and keeping the
//! newest update number it saw. Its whole state is the socket and one buffer.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ordo_bench::live::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit};

use crate::board;
use crate::frames::{self, FrameError, Header};

/// The largest server frame accepted: a snapshot of a 20-row window is a few KB.
const MAX_FRAME_BYTES: usize = 1 << 20;
/// A handshake answer longer than this is not the server's.
const MAX_HANDSHAKE_BYTES: usize = 4096;
const READ_CHUNK: usize = 4096;
/// Each step before holding (connect, upgrade, welcome, snapshot) must finish
/// within this: a server that stops answering fails the run instead of hanging it.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
const MASK: [u8; 4] = [0x5A, 0xC3, 0x0F, 0x96];

/// What every holder shares: where to connect and what to watch.
pub struct Plan {
    pub server: SocketAddr,
    pub groups: usize,
    pub window: usize,
}

/// Where the run stands; the holders move it forward.
#[derive(Default)]
pub struct Progress {
    pub connected: AtomicU64,
    pub subscribed: AtomicU64,
    pub failed: AtomicU64,
}

/// The signals from the run to every holder.
#[derive(Clone)]
pub struct Signals {
    pub subscribe: watch::Receiver<bool>,
    pub stop: watch::Receiver<bool>,
}

/// Holds connection `index` (watching group `index % groups`) from `source`
/// until `signals.stop`; `seen` is the newest update number it received.
/// `handshake` is its place among the handshakes in flight, given back once
/// `welcome` came.
pub async fn hold(
    plan: Arc<Plan>,
    index: usize,
    source: Ipv4Addr,
    mut signals: Signals,
    seen: &AtomicU64,
    progress: &Progress,
    handshake: OwnedSemaphorePermit,
) -> Result<()> {
    let mut connection = step("connect", Connection::open(&plan, source)).await?;
    step("welcome", connection.next_text()).await?;
    drop(handshake);
    progress.connected.fetch_add(1, Ordering::Relaxed);
    signals.subscribe.wait_for(|go| *go).await?;
    connection.send(frames::TEXT, &board::subscribe_message(index % plan.groups, plan.window)).await?;
    let snapshot = step("snapshot", connection.next_text()).await?;
    if !snapshot.windows(7).any(|window| window == b"\"diffs\"") {
        return Err(format!("the subscription's first frame is not its diffs: {}", preview(&snapshot)).into());
    }
    progress.subscribed.fetch_add(1, Ordering::Relaxed);
    loop {
        tokio::select! {
            _ = signals.stop.wait_for(|stop| *stop) => break,
            frame = connection.next_text() => {
                if let Some(number) = frames::max_number_after(&frame?, board::NUMBER_MARKER) {
                    seen.fetch_max(number, Ordering::Relaxed);
                }
            }
        }
    }
    let _ = connection.send(frames::CLOSE, &1000u16.to_be_bytes()).await;
    Ok(())
}

async fn step<T>(what: &str, future: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(STEP_TIMEOUT, future)
        .await
        .map_err(|_| format!("{what}: no answer within {STEP_TIMEOUT:?}"))?
}

struct Connection {
    stream: TcpStream,
    /// Bytes read and not yet taken as frames.
    buffer: Vec<u8>,
    out: Vec<u8>,
}

impl Connection {
    async fn open(plan: &Plan, source: Ipv4Addr) -> Result<Connection> {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(source.into(), 0))?;
        let stream = socket.connect(plan.server).await?;
        stream.set_nodelay(true)?;
        let mut connection = Connection { stream, buffer: Vec::with_capacity(READ_CHUNK), out: Vec::new() };
        connection.upgrade(plan.server).await?;
        Ok(connection)
    }

    async fn upgrade(&mut self, server: SocketAddr) -> Result<()> {
        let request = format!(
            "GET /v1/ws HTTP/1.1\r\nHost: {server}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        self.stream.write_all(request.as_bytes()).await?;
        let head_end = loop {
            if let Some(at) = self.buffer.windows(4).position(|window| window == b"\r\n\r\n") {
                break at + 4;
            }
            if self.buffer.len() > MAX_HANDSHAKE_BYTES {
                return Err("the upgrade's answer has no end of head".into());
            }
            self.read_more().await?;
        };
        if !self.buffer.starts_with(b"HTTP/1.1 101") {
            return Err(format!("the upgrade was refused: {}", preview(&self.buffer[..head_end])).into());
        }
        self.buffer.drain(..head_end);
        Ok(())
    }

    /// The next text frame's payload; pings are answered on the way, a close is an error.
    async fn next_text(&mut self) -> Result<Vec<u8>> {
        loop {
            let header = match frames::parse_header(&self.buffer, MAX_FRAME_BYTES) {
                Ok(Some(header)) if self.buffer.len() >= header.header_len + header.payload_len => header,
                Ok(_) => {
                    self.read_more().await?;
                    continue;
                }
                Err(FrameError::Masked) => return Err("the server sent a masked frame".into()),
                Err(FrameError::TooLarge(len)) => return Err(format!("a server frame of {len} bytes").into()),
            };
            let payload = self.take(header);
            match header.opcode {
                frames::TEXT | 0x0 => return Ok(payload),
                frames::PING => self.send(frames::PONG, &payload).await?,
                frames::CLOSE => return Err(format!("closed by the server: {}", preview(&payload)).into()),
                _ => {}
            }
        }
    }

    fn take(&mut self, header: Header) -> Vec<u8> {
        let end = header.header_len + header.payload_len;
        let payload = self.buffer[header.header_len..end].to_vec();
        self.buffer.drain(..end);
        if self.buffer.capacity() > 4 * READ_CHUNK && self.buffer.len() < READ_CHUNK {
            // A large snapshot's room is given back: a hundred thousand idle
            // connections each keeping it would be this process's memory.
            self.buffer.shrink_to(READ_CHUNK);
        }
        payload
    }

    async fn read_more(&mut self) -> Result<()> {
        self.buffer.reserve(READ_CHUNK);
        if self.stream.read_buf(&mut self.buffer).await? == 0 {
            return Err("the server closed the connection".into());
        }
        Ok(())
    }

    async fn send(&mut self, opcode: u8, payload: &[u8]) -> Result<()> {
        self.out.clear();
        frames::write_masked(&mut self.out, opcode, payload, MASK);
        self.stream.write_all(&self.out).await?;
        self.out = Vec::new();
        Ok(())
    }
}

fn preview(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned()
}
