//! One WebSocket connection. A reader task turns client frames into messages; the
//! connection task owns the session (its subscription table, sequence numbers and
//! retained frames) and the write half, and is the only one that writes.
//!
//! Frames of diffs arrive from the writer thread as shared bodies; the task wraps
//! each in its envelope (`sub`, `seq`) in one reused buffer, so sending a frame
//! allocates nothing once the buffer has grown.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fastwebsockets::{Frame, OpCode, Role, WebSocket, WebSocketError, WebSocketRead};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};

use crate::access::{ConnectionSlot, Gate};
use crate::auth::{self, AuthFailure, Identity, Role as AuthRole};
use crate::core::{
    share_key, Command, ConnShared, CoreSender, FrameBody, Outgoing, Routes, SessionId, SubHandle, FRAME_OVERHEAD_BYTES,
};
use crate::error::{ApiError, ErrorCode};
use crate::frame::{write_diffs_frame, write_json_str};
use crate::limits;
use crate::metrics::{self, Stage, METRICS};
use crate::rate_limit::TokenBucket;
use crate::rules::Action;
use crate::sub_table::SubTable;
use crate::wire::{self, ClientMessage, WindowSpec};

type Stream = TokioIo<Upgraded>;

pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// RFC 6455 §7.4.1: a frame the protocol forbids (unmasked, reserved bits or
/// opcode, a fragmented control frame, a continuation out of place).
pub const CLOSE_PROTOCOL_ERROR: u16 = 1002;
pub const CLOSE_NOT_UTF8: u16 = 1007;
pub const CLOSE_TOO_BIG: u16 = 1009;
pub const CLOSE_SLOW: u16 = 4001;
/// The access rules changed: reconnect and resume (views are rebuilt under the new rules).
pub const CLOSE_RULES_CHANGED: u16 = 4403;
/// No valid token: none came within `AUTH_TIMEOUT_SECS` of connecting, or the
/// token expired and no fresh one came within `AUTH_EXPIRY_GRACE_SECS`.
pub const CLOSE_UNAUTHORIZED: u16 = 4401;

/// Frames written in one syscall, at most (about): bounds the latency of the first.
const WRITE_BATCH_BYTES: usize = 64 * 1024;

/// Settings of every connection, from the command line.
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    pub outbound_budget: usize,
    pub slow_close_after: Duration,
    pub messages_per_second: u32,
    pub session_retention: Duration,
    /// A connection without a token must send `auth` within this (`--auth-timeout`).
    pub auth_timeout: Duration,
    /// After its token expires, a connection has this long to send a fresh one (`--auth-grace`).
    pub auth_grace: Duration,
}

/// A subscription as its connection knows it.
struct SubEntry {
    client_id: String,
    collection: Arc<crate::core::CollectionEntry>,
    spec: WindowSpec,
    /// The `seq` of the last frame sent.
    seq: u64,
    /// The last frames sent, for replay on resume: (seq, body).
    retained: VecDeque<(u64, FrameBody, u32)>,
    retained_bytes: usize,
    /// Frames before the next Reset are stale (a resume that could not replay).
    awaiting_reset: bool,
}

impl SubEntry {
    fn retain(&mut self, seq: u64, body: FrameBody, n_diffs: u32) {
        self.retained_bytes += body.len();
        self.retained.push_back((seq, body, n_diffs));
        while self.retained.len() > limits::RETAINED_FRAMES_PER_SUBSCRIPTION
            || self.retained_bytes > limits::RETAINED_BYTES_PER_SUBSCRIPTION
        {
            let (_, dropped, _) = self.retained.pop_front().expect("over a limit, so not empty");
            self.retained_bytes -= dropped.len();
        }
    }
}

/// The owner of every session until connections carry identities.
pub const ANONYMOUS_OWNER: &str = "anonymous";

/// A connection's subscription state; it outlives the connection for resume.
pub struct Session {
    id: SessionId,
    /// The resume token: 128 random bits, replaced at every resume.
    token: String,
    /// The identity that opened the session: parked sessions are budgeted per
    /// owner, and only the same owner may resume one.
    owner: Arc<str>,
    shared: Arc<ConnShared>,
    outbox: mpsc::UnboundedReceiver<Outgoing>,
    table: SubTable<SubEntry>,
    by_client_id: HashMap<String, SubHandle>,
    next_handle: SubHandle,
}

impl Session {
    /// The estimated bytes a parked session holds, besides the frames queued for
    /// it (those are read live: they may grow while it is parked). See
    /// `limits::PARKED_WINDOW_ITEM_BYTES`.
    fn parked_cost_bytes(&self) -> usize {
        let subs: usize = self
            .table
            .iter()
            .map(|(_, entry)| {
                limits::PARKED_SUBSCRIPTION_OVERHEAD_BYTES
                    + entry.client_id.len()
                    + entry.retained_bytes
                    + entry.retained.len() * FRAME_OVERHEAD_BYTES
                    + entry.spec.limit.saturating_mul(limits::PARKED_WINDOW_ITEM_BYTES)
            })
            .sum();
        limits::PARKED_SESSION_OVERHEAD_BYTES + subs
    }
}

/// A session held for resume.
struct ParkedSession {
    session: Session,
    expires: Instant,
    /// Its place in `RegistryInner::by_age`.
    parked_index: u64,
    /// `Session::parked_cost_bytes` when it was parked (its table does not change while parked).
    cost_bytes: usize,
}

impl ParkedSession {
    fn cost_bytes(&self) -> usize {
        self.cost_bytes + self.session.shared.queued_bytes.load(Ordering::Acquire)
    }
}

/// Sessions whose connection is gone, held for resume until they expire or
/// the parked budgets (`limits::MAX_PARKED_BYTES`, `MAX_PARKED_BYTES_PER_OWNER`)
/// push them out, oldest first.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<RegistryInner>,
}

#[derive(Default)]
struct RegistryInner {
    by_token: HashMap<String, ParkedSession>,
    /// Tokens by the order they were parked in, oldest first.
    by_age: std::collections::BTreeMap<u64, String>,
    next_parked_index: u64,
}

impl RegistryInner {
    fn remove(&mut self, token: &str) -> Option<ParkedSession> {
        let parked = self.by_token.remove(token)?;
        self.by_age.remove(&parked.parked_index);
        Some(parked)
    }

    /// Drops the oldest sessions until both budgets hold; returns their ids.
    /// One pass, oldest first: a session goes while the total, or its owner's
    /// total, is over budget.
    fn evict_over_budget(&mut self) -> Vec<SessionId> {
        let mut total_bytes = 0usize;
        let mut owner_bytes: HashMap<Arc<str>, usize> = HashMap::new();
        for parked in self.by_token.values() {
            let cost = parked.cost_bytes();
            total_bytes += cost;
            *owner_bytes.entry(parked.session.owner.clone()).or_default() += cost;
        }
        let over =
            |total: usize, owner: usize| total > limits::MAX_PARKED_BYTES || owner > limits::MAX_PARKED_BYTES_PER_OWNER;
        if !owner_bytes.values().any(|&owner| over(total_bytes, owner)) {
            return Vec::new();
        }
        let mut evicted = Vec::new();
        let mut evicted_tokens = Vec::new();
        for token in self.by_age.values() {
            let parked = &self.by_token[token];
            let owner = owner_bytes.get_mut(&parked.session.owner).expect("counted above");
            if over(total_bytes, *owner) {
                let cost = parked.cost_bytes();
                total_bytes = total_bytes.saturating_sub(cost);
                *owner = owner.saturating_sub(cost);
                evicted_tokens.push(token.clone());
            }
        }
        for token in evicted_tokens {
            let parked = self.remove(&token).expect("listed");
            evicted.push(parked.session.id);
        }
        evicted
    }
}

impl Registry {
    /// Holds `session` for resume; returns the sessions pushed out to stay
    /// within the budgets (maybe this one), whose windows must be closed.
    fn park(&self, session: Session, retention: Duration) -> Vec<SessionId> {
        let mut inner = self.inner.lock().expect("registry lock");
        let parked_index = inner.next_parked_index;
        inner.next_parked_index += 1;
        let token = session.token.clone();
        let cost_bytes = session.parked_cost_bytes();
        let parked = ParkedSession { session, expires: Instant::now() + retention, parked_index, cost_bytes };
        if let Some(replaced) = inner.by_token.insert(token.clone(), parked) {
            inner.by_age.remove(&replaced.parked_index);
        }
        inner.by_age.insert(parked_index, token);
        inner.evict_over_budget()
    }

    /// The parked session `token` names, if `owner` opened it.
    fn take(&self, token: &str, owner: &str) -> Option<Session> {
        let mut inner = self.inner.lock().expect("registry lock");
        if &*inner.by_token.get(token)?.session.owner != owner {
            return None;
        }
        inner.remove(token).map(|parked| parked.session)
    }

    /// Drops expired sessions, and the oldest while over the budgets (frames
    /// queued for parked sessions grow their cost); returns their ids so their
    /// windows can be closed.
    pub fn expire(&self, now: Instant) -> Vec<SessionId> {
        let mut inner = self.inner.lock().expect("registry lock");
        let expired: Vec<String> =
            inner.by_token.iter().filter(|(_, parked)| parked.expires <= now).map(|(token, _)| token.clone()).collect();
        let mut dropped: Vec<SessionId> =
            expired.iter().filter_map(|token| inner.remove(token)).map(|parked| parked.session.id).collect();
        dropped.extend(inner.evict_over_budget());
        dropped
    }
}

/// Everything a connection needs from the server.
#[derive(Clone)]
pub struct ConnectionContext {
    pub core: CoreSender,
    pub routes: Routes,
    pub registry: Arc<Registry>,
    pub config: ConnectionConfig,
    pub shutdown: watch::Receiver<bool>,
    pub limits_json: Arc<serde_json::Value>,
    pub gate: Arc<Gate>,
    /// Who opened the connection, when the upgrade carried a token (or auth is off).
    pub identity: Option<Arc<Identity>>,
}

/// The writer thread's name for a session (not a secret: the resume token is).
fn new_session_id() -> SessionId {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}

enum Inbound {
    Text(Vec<u8>),
    Binary,
    /// A frame the protocol obliges us to send (pong, close reply).
    Reply(OpCode, Vec<u8>),
    /// The client closed, or the stream ended.
    Closed,
    /// A protocol violation: close with this code.
    Fatal(u16, &'static str),
}

/// Runs one upgraded connection to its end.
pub async fn serve_connection(ws: WebSocket<Stream>, context: ConnectionContext, slot: ConnectionSlot) {
    metrics::add(&METRICS.connections, 1);
    // fastwebsockets parses what the client sends; frames to the client are written
    // here (see `queue_frame`), so that several can share one write.
    let (read_half, writer) = tokio::io::split(ws.into_inner());
    let read_half = MaskCheck::new(read_half);
    let (reader, _unused_writer) = fastwebsockets::after_handshake_split(read_half, tokio::io::sink(), Role::Server);
    let (inbound_tx, inbound_rx) = mpsc::channel(limits::INBOUND_QUEUE_CAPACITY);
    let reader_task = tokio::spawn(read_frames(reader, inbound_tx));
    let mut connection = Connection::open(writer, context, slot).await;
    if let Some(connection) = connection.as_mut() {
        connection.run(inbound_rx).await;
    }
    reader_task.abort();
    METRICS.connections.fetch_sub(1, Ordering::Relaxed);
    if let Some(connection) = connection {
        connection.finish().await;
    }
}

async fn read_frames(mut reader: WebSocketRead<MaskCheck<ReadHalf<Stream>>>, inbound: mpsc::Sender<Inbound>) {
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
struct MaskCheck<R> {
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
    fn new(inner: R) -> MaskCheck<R> {
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

struct Connection {
    writer: WriteHalf<Stream>,
    /// Frames ready for the socket, written together by `flush`.
    out: Vec<u8>,
    session: Session,
    context: ConnectionContext,
    /// The reused buffer every frame is written into.
    frame: Vec<u8>,
    bucket: TokenBucket,
    /// Whether the client may still send `resume` (only as its first message after `auth`).
    may_resume: bool,
    closed: bool,
    /// The verified caller; `None` until an `auth` message when the upgrade had no token.
    identity: Option<Arc<Identity>>,
    /// When the token situation must be looked at again: the auth timeout of a
    /// connection without a token, the token's expiry, or the end of the grace.
    auth_deadline: Option<tokio::time::Instant>,
    /// The token expired and `auth_expired` was sent: the grace is running.
    in_grace: bool,
    /// The identity's connection slot (readers are capped), held while connected.
    slot: Option<ConnectionSlot>,
    rules_changed: watch::Receiver<u64>,
}

enum Event {
    Inbound(Option<Inbound>),
    Outgoing(Option<Outgoing>),
    Shutdown,
    AuthDeadline,
    RulesChanged,
}

impl Connection {
    async fn open(writer: WriteHalf<Stream>, context: ConnectionContext, slot: ConnectionSlot) -> Option<Connection> {
        let id = new_session_id();
        let shared = Arc::new(ConnShared::default());
        let (outbox_tx, outbox) = mpsc::unbounded_channel();
        let command = Command::OpenSession { session: id, shared: shared.clone(), outbox: outbox_tx };
        context.core.send(command).await.ok()?;
        let identity = context.identity.clone();
        let session = Session {
            id,
            token: auth::new_session_token(),
            owner: identity.as_ref().map_or_else(|| Arc::from(""), |identity| identity.key.clone()),
            shared,
            outbox,
            table: SubTable::new(),
            by_client_id: HashMap::new(),
            next_handle: 0,
        };
        let bucket = TokenBucket::new(context.config.messages_per_second, limits::WS_MESSAGE_BURST);
        let auth_deadline = match &identity {
            Some(identity) => expiry_deadline(identity),
            None => Some(tokio::time::Instant::now() + context.config.auth_timeout),
        };
        let rules_changed = context.gate.rules_changed.subscribe();
        let mut connection = Connection {
            writer,
            out: Vec::with_capacity(16 * 1024),
            session,
            context,
            frame: Vec::with_capacity(4096),
            bucket,
            may_resume: true,
            closed: false,
            identity,
            auth_deadline,
            in_grace: false,
            slot: Some(slot),
            rules_changed,
        };
        let auth = match (&connection.identity, connection.context.gate.auth_enabled()) {
            (_, false) => serde_json::json!("none"),
            (Some(identity), true) => identity.to_json(),
            (None, true) => serde_json::json!("required"),
        };
        let welcome = serde_json::json!({
            "type": "welcome",
            "protocol": 1,
            "session": connection.session.token,
            "auth": auth,
            "limits": *connection.context.limits_json,
        });
        connection.send_json(&welcome).await;
        Some(connection)
    }

    async fn run(&mut self, mut inbound: mpsc::Receiver<Inbound>) {
        let mut shutdown = self.context.shutdown.clone();
        while !self.closed {
            let auth_deadline = self.auth_deadline;
            let event = tokio::select! {
                message = inbound.recv() => Event::Inbound(message),
                outgoing = self.session.outbox.recv() => Event::Outgoing(outgoing),
                _ = shutdown.wait_for(|stopping| *stopping) => Event::Shutdown,
                _ = tokio::time::sleep_until(auth_deadline.unwrap_or_else(tokio::time::Instant::now)), if auth_deadline.is_some() => Event::AuthDeadline,
                Ok(()) = self.rules_changed.changed() => Event::RulesChanged,
            };
            match event {
                Event::Inbound(Some(message)) => self.on_inbound(message).await,
                Event::Inbound(None) => self.closed = true,
                Event::Outgoing(Some(outgoing)) => {
                    self.on_outgoing(outgoing).await;
                    // Whatever else is ready joins the same write: under load, one
                    // syscall carries many frames.
                    while self.out.len() < WRITE_BATCH_BYTES {
                        match self.session.outbox.try_recv() {
                            Ok(outgoing) => self.on_outgoing(outgoing).await,
                            Err(_) => break,
                        }
                    }
                    self.flush().await;
                    self.maybe_report_drained().await;
                }
                Event::Outgoing(None) => self.close(CLOSE_GOING_AWAY, "server stopping").await,
                Event::Shutdown => self.close(CLOSE_GOING_AWAY, "server stopping").await,
                Event::AuthDeadline => self.on_auth_deadline().await,
                Event::RulesChanged => {
                    // An admin's views never depended on rules.
                    if self.identity.as_ref().is_some_and(|identity| identity.role != AuthRole::Admin) {
                        self.close(CLOSE_RULES_CHANGED, "access rules changed; reconnect and resume").await;
                    }
                }
            }
        }
    }

    /// The connection's token deadline passed: no token yet (close), the token
    /// just expired (warn, start the grace), or the grace ran out (close).
    async fn on_auth_deadline(&mut self) {
        if self.identity.is_none() {
            refuse_and_count(AuthFailure::Missing);
            self.close(CLOSE_UNAUTHORIZED, "no `auth` message within the auth timeout").await;
        } else if self.in_grace {
            refuse_and_count(AuthFailure::Expired);
            self.close(CLOSE_UNAUTHORIZED, "token expired").await;
        } else {
            self.in_grace = true;
            self.auth_deadline = Some(tokio::time::Instant::now() + self.context.config.auth_grace);
            self.frame.clear();
            self.frame.extend_from_slice(b"{\"type\":\"auth_expired\",\"grace_secs\":");
            crate::frame::write_u64(&mut self.frame, self.context.config.auth_grace.as_secs());
            self.frame.push(b'}');
            self.write(OpCode::Text).await;
        }
    }

    /// `{"op":"auth"}`: a first token, or a fresh one for the same identity.
    async fn authenticate(&mut self, token: &str) -> Result<(), ApiError> {
        if !self.context.gate.auth_enabled() {
            return Err(ApiError::bad_request(
                "this server runs without auth (`welcome.auth` is \"none\"); send no `auth`",
            ));
        }
        let identity = self.context.gate.authenticate(Some(token), "/v1/ws auth")?;
        match &self.identity {
            Some(current) if current.key != identity.key => {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "a connection keeps one identity: a fresh token must name the same one (same claims but exp, nbf, iat, jti)",
                ));
            }
            Some(_) => {}
            None => {
                self.slot = Some(self.context.gate.open_connection(Some(&identity))?);
                self.session.owner = identity.key.clone();
            }
        }
        self.auth_deadline = expiry_deadline(&identity);
        self.in_grace = false;
        let mut answer = identity.to_json();
        answer["type"] = "authed".into();
        self.identity = Some(identity);
        self.send_json(&answer).await;
        Ok(())
    }

    /// After the connection: a session with subscriptions is held for resume,
    /// within the parked budgets; the sessions that pushes out are closed.
    async fn finish(self) {
        let stopping = *self.context.shutdown.borrow();
        if self.session.table.is_empty() || stopping {
            let _ = self.context.core.try_send(Command::DropSession { session: self.session.id });
        } else {
            let evicted = self.context.registry.park(self.session, self.context.config.session_retention);
            for session in evicted {
                // The writer frees the session's windows and queued frames.
                if self.context.core.send(Command::DropSession { session }).await.is_err() {
                    return;
                }
            }
        }
    }

    async fn maybe_report_drained(&mut self) {
        if self.session.outbox.is_empty() && self.session.shared.want_drain_notice.swap(false, Ordering::AcqRel) {
            let _ = self.context.core.send(Command::Drained { session: self.session.id }).await;
        }
    }

    /// Frames `self.frame` (a server frame: final, unmasked) into `self.out`.
    fn queue_frame(&mut self, opcode: OpCode) {
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
        metrics::add(&METRICS.frames_sent, 1);
    }

    /// Writes every queued frame. A write that makes no progress for the whole
    /// deadline means the client stopped reading: the close frame could not get
    /// through a full socket, so the connection is simply dropped (its session is
    /// kept for resume).
    async fn flush(&mut self) {
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
    }

    async fn write(&mut self, opcode: OpCode) {
        self.queue_frame(opcode);
        self.flush().await;
    }

    async fn close(&mut self, code: u16, reason: &str) {
        if self.closed {
            return;
        }
        self.frame.clear();
        self.frame.extend_from_slice(&code.to_be_bytes());
        self.frame.extend_from_slice(reason.as_bytes());
        self.queue_frame(OpCode::Close);
        let patience = if code == CLOSE_SLOW { Duration::from_millis(100) } else { Duration::from_secs(1) };
        let _ = tokio::time::timeout(patience, self.writer.write_all(&self.out)).await;
        self.out.clear();
        self.closed = true;
    }

    async fn send_json(&mut self, value: &serde_json::Value) {
        self.frame.clear();
        serde_json::to_writer(&mut self.frame, value).expect("JSON to a Vec");
        self.write(OpCode::Text).await;
    }

    async fn send_error(&mut self, error: &ApiError, sub: Option<&str>) {
        metrics::count_error(error.code);
        self.frame.clear();
        self.frame.extend_from_slice(b"{\"type\":\"error\",\"code\":\"");
        self.frame.extend_from_slice(error.code.as_str().as_bytes());
        self.frame.extend_from_slice(b"\",\"message\":");
        write_json_str(&mut self.frame, &error.message);
        if let Some(sub) = sub {
            self.frame.extend_from_slice(b",\"sub\":");
            write_json_str(&mut self.frame, sub);
        }
        self.frame.push(b'}');
        self.write(OpCode::Text).await;
    }

    async fn on_outgoing(&mut self, outgoing: Outgoing) {
        match outgoing {
            Outgoing::Diffs { handle, epoch, body, n_diffs, is_reset, queued_at } => {
                metrics::record_stage(Stage::FrameQueue, queued_at.elapsed());
                let cost = body.len() + FRAME_OVERHEAD_BYTES;
                self.session.shared.queued_bytes.fetch_sub(cost, Ordering::AcqRel);
                metrics::sub_queued(cost);
                if epoch < self.session.shared.epoch.load(Ordering::Acquire) {
                    // Dropped: the connection fell behind and a reset is due.
                    return;
                }
                let Some(entry) = self.session.table.get_mut(handle) else { return };
                if entry.awaiting_reset && !is_reset {
                    return;
                }
                entry.awaiting_reset = false;
                entry.seq += 1;
                let seq = entry.seq;
                entry.retain(seq, body.clone(), n_diffs);
                self.frame.clear();
                write_diffs_frame(&mut self.frame, &entry.client_id, seq, &body);
                metrics::add(&METRICS.diffs_sent, n_diffs as u64);
                self.queue_frame(OpCode::Text);
            }
            Outgoing::SubscribeFailed { handle, error } => {
                if let Some(entry) = self.session.table.remove(handle) {
                    self.session.by_client_id.remove(&entry.client_id);
                    self.send_error(&error, Some(&entry.client_id)).await;
                }
            }
            Outgoing::RequestFailed { handle, error, spec } => {
                let sub = self.session.table.get_mut(handle).map(|entry| {
                    if let Some(spec) = spec {
                        // What the window really is, for a later resume to compare with.
                        entry.spec = *spec;
                    }
                    entry.client_id.clone()
                });
                self.send_error(&error, sub.as_deref()).await;
            }
            Outgoing::Unsubscribed { handle } => {
                if let Some(entry) = self.session.table.remove(handle) {
                    self.frame.clear();
                    self.frame.extend_from_slice(b"{\"type\":\"unsubscribed\",\"sub\":");
                    write_json_str(&mut self.frame, &entry.client_id);
                    self.frame.push(b'}');
                    self.write(OpCode::Text).await;
                }
            }
            Outgoing::Wake => {}
        }
    }

    async fn on_inbound(&mut self, inbound: Inbound) {
        match inbound {
            Inbound::Text(text) => {
                if !self.bucket.try_take() {
                    let error = ApiError::new(
                        ErrorCode::RateLimited,
                        format!(
                            "more than {} messages per second; this one was ignored",
                            self.context.config.messages_per_second
                        ),
                    );
                    let sub = serde_json::from_slice::<crate::wire::SubOnly>(&text).ok().and_then(|only| only.sub);
                    self.send_error(&error, sub.as_deref()).await;
                    return;
                }
                match serde_json::from_slice::<ClientMessage>(&text) {
                    Ok(message) => self.on_message(message).await,
                    Err(error) => self.send_error(&ApiError::from_json(&error), None).await,
                }
            }
            Inbound::Binary => {
                let error = ApiError::bad_request("binary frames are not part of the protocol; send JSON text");
                self.send_error(&error, None).await;
            }
            Inbound::Reply(opcode, payload) => {
                if !self.closed {
                    self.frame.clear();
                    self.frame.extend_from_slice(&payload);
                    self.write(opcode).await;
                    if opcode == OpCode::Close {
                        self.closed = true;
                    }
                }
            }
            Inbound::Closed => self.closed = true,
            Inbound::Fatal(code, reason) => self.close(code, reason).await,
        }
    }

    async fn on_message(&mut self, message: ClientMessage) {
        if let ClientMessage::Auth { token } = &message {
            // Not counted as the first message: `resume` may follow it.
            if let Err(error) = self.authenticate(token).await {
                self.send_error(&error, None).await;
            }
            return;
        }
        let Some(identity) = self.identity.clone() else {
            let error = ApiError::new(ErrorCode::Unauthorized, "send `{\"op\":\"auth\",\"token\":..}` first");
            self.send_error(&error, None).await;
            return;
        };
        if let Err(error) = self.context.gate.take_request(&identity) {
            self.send_error(&error, None).await;
            return;
        }
        let first = std::mem::replace(&mut self.may_resume, false);
        let result = match message {
            ClientMessage::Auth { .. } => unreachable!("handled above"),
            ClientMessage::Subscribe { sub, collection, filter, sort, offset, limit, fields, payload } => {
                let spec =
                    self.check_subscribe(&sub, &collection, &filter, &sort, offset, limit, fields.as_deref(), payload);
                match spec {
                    Ok((collection, spec)) => {
                        self.start_subscription(sub, collection, spec, 0).await;
                        Ok(())
                    }
                    Err(error) => Err((error, Some(sub))),
                }
            }
            ClientMessage::SetRange { sub, offset, limit } => {
                self.set_range(&sub, offset, limit).await.map_err(|e| (e, Some(sub)))
            }
            ClientMessage::SetView { sub, filter, sort } => {
                self.set_view(&sub, &filter, &sort).await.map_err(|e| (e, Some(sub)))
            }
            ClientMessage::Unsubscribe { sub } => match self.session.by_client_id.remove(&sub) {
                Some(handle) => {
                    let command = Command::Unsubscribe { session: self.session.id, handle };
                    let _ = self.context.core.send(command).await;
                    Ok(())
                }
                None => Err((unknown_subscription(&sub), Some(sub))),
            },
            ClientMessage::Resume { session, subs } => {
                if first {
                    self.resume(&session, subs).await;
                    Ok(())
                } else {
                    Err((ApiError::bad_request("`resume` must be the first message of a connection"), None))
                }
            }
        };
        if let Err((error, sub)) = result {
            self.send_error(&error, sub.as_deref()).await;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check_subscribe(
        &self,
        sub: &str,
        collection: &str,
        filter: &serde_json::Value,
        sort: &[wire::SortRequest],
        offset: usize,
        limit: usize,
        fields: Option<&[String]>,
        payload: bool,
    ) -> Result<(Arc<crate::core::CollectionEntry>, WindowSpec), ApiError> {
        wire::check_sub_id(sub)?;
        if self.session.by_client_id.contains_key(sub) {
            return Err(ApiError::new(
                ErrorCode::SubscriptionExists,
                format!("subscription `{sub}` exists on this connection; unsubscribe first or pick another id"),
            ));
        }
        if self.session.table.len() >= limits::MAX_SUBSCRIPTIONS_PER_CONNECTION {
            return Err(ApiError::limit(format!(
                "a connection holds at most {} subscriptions",
                limits::MAX_SUBSCRIPTIONS_PER_CONNECTION
            )));
        }
        let (entry, predicate) = self.readable(collection)?;
        let mut spec = wire::window_spec(&entry.schema, filter, sort, offset, limit, fields, payload)?;
        wire::restrict(&mut spec.def, predicate.as_ref(), &entry.schema)?;
        Ok((entry, spec))
    }

    /// The collection as this connection's identity may read it, and the row
    /// predicate its rules bind (conjoined into every view; `None`: every item).
    /// Refused the same way whether the collection exists or not.
    fn readable(&self, name: &str) -> Result<(Arc<crate::core::CollectionEntry>, Option<ordo_core::Filter>), ApiError> {
        let identity =
            self.identity.as_ref().ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "send `auth` first"))?;
        if crate::core::is_reserved_name(name) {
            return Err(ApiError::new(ErrorCode::Forbidden, format!("`{name}` is reserved for the server")));
        }
        let grant = self
            .context
            .gate
            .rules()
            .grant(identity, name, Action::Read)
            .ok_or_else(|| crate::rules::forbidden(name, "read"))?;
        let entry = self.context.routes.read().expect("routes lock").get(name).cloned();
        let entry = entry.ok_or_else(|| ApiError::unknown_collection(name))?;
        if identity.role != AuthRole::Admin && entry.name != name {
            return Err(ApiError::unknown_collection(name));
        }
        let predicate = grant.predicate(&entry.schema)?;
        Ok((entry, predicate))
    }

    /// Registers the subscription here, then asks the writer thread for its window;
    /// its first frame (a Reset) gets `seq = first_seq + 1`.
    async fn start_subscription(
        &mut self,
        client_id: String,
        collection: Arc<crate::core::CollectionEntry>,
        spec: WindowSpec,
        first_seq: u64,
    ) {
        let handle = self.session.next_handle;
        self.session.next_handle += 1;
        let entry = SubEntry {
            client_id: client_id.clone(),
            collection: collection.clone(),
            spec: spec.clone(),
            seq: first_seq,
            retained: VecDeque::new(),
            retained_bytes: 0,
            awaiting_reset: false,
        };
        self.session.table.insert(handle, entry).expect("handles increase");
        self.session.by_client_id.insert(client_id, handle);
        let command = Command::Subscribe { session: self.session.id, handle, collection: collection.id, spec };
        let _ = self.context.core.send(command).await;
    }

    fn handle_of(&self, sub: &str) -> Result<SubHandle, ApiError> {
        self.session.by_client_id.get(sub).copied().ok_or_else(|| unknown_subscription(sub))
    }

    async fn set_range(&mut self, sub: &str, offset: usize, limit: usize) -> Result<(), ApiError> {
        let handle = self.handle_of(sub)?;
        wire::check_range(offset, limit)?;
        let entry = self.session.table.get_mut(handle).expect("mapped handles are live");
        (entry.spec.offset, entry.spec.limit) = (offset, limit);
        let command = Command::SetRange { session: self.session.id, handle, offset, limit };
        let _ = self.context.core.send(command).await;
        Ok(())
    }

    async fn set_view(
        &mut self,
        sub: &str,
        filter: &serde_json::Value,
        sort: &[wire::SortRequest],
    ) -> Result<(), ApiError> {
        let handle = self.handle_of(sub)?;
        let name = self.session.table.get(handle).expect("mapped handles are live").collection.name.clone();
        // The rules as they are now: a view change never widens past them.
        let (_, predicate) = self.readable(&name)?;
        let entry = self.session.table.get_mut(handle).expect("mapped handles are live");
        let mut def = wire::view_def(&entry.collection.schema, filter, sort)?;
        wire::restrict(&mut def, predicate.as_ref(), &entry.collection.schema)?;
        entry.spec.def = def.clone();
        let command = Command::SetView { session: self.session.id, handle, def };
        let _ = self.context.core.send(command).await;
        Ok(())
    }

    async fn resume(&mut self, token: &str, entries: Vec<wire::ResumeEntry>) {
        let mut outcomes: Vec<serde_json::Value> = Vec::with_capacity(entries.len());
        let mut replays: Vec<SubHandle> = Vec::new();
        if let Some(old) = self.context.registry.take(token, &self.session.owner) {
            // Adopt the old session: its queue, table and retained frames.
            let fresh = std::mem::replace(&mut self.session, old);
            let _ = self.context.core.send(Command::DropSession { session: fresh.id }).await;
            // A resume token is good for one resume: whoever saw this one cannot reuse it.
            self.session.token = auth::new_session_token();
        }
        let mut listed: Vec<SubHandle> = Vec::with_capacity(entries.len());
        // Ids seen so far in this resume: a second entry for one id is refused,
        // as a second `subscribe` of it would be.
        let mut seen: HashSet<String> = HashSet::with_capacity(entries.len());
        for entry in entries {
            let checked = if !seen.insert(entry.sub.clone()) {
                Err(ApiError::new(
                    ErrorCode::SubscriptionExists,
                    format!("subscription `{}` is listed twice in this resume; the first entry stands", entry.sub),
                ))
            } else if listed.len() >= limits::MAX_SUBSCRIPTIONS_PER_CONNECTION {
                // The subscriptions not listed are closed below, so after the
                // resume the connection holds exactly the entries listed.
                Err(ApiError::limit(format!(
                    "a connection holds at most {} subscriptions (max_subscriptions_per_connection); \
                     this resume lists more",
                    limits::MAX_SUBSCRIPTIONS_PER_CONNECTION
                )))
            } else {
                self.check_resume_entry(&entry)
            };
            let (collection, spec) = match checked {
                Ok(checked) => checked,
                Err(error) => {
                    metrics::count_error(error.code);
                    outcomes.push(serde_json::json!({"sub": entry.sub, "error": {"code": error.code.as_str(), "message": error.message}}));
                    continue;
                }
            };
            let existing = self.session.by_client_id.get(&entry.sub).copied();
            let same = existing.and_then(|handle| {
                let sub = self.session.table.get(handle)?;
                (sub.collection.id == collection.id
                    && share_key(collection.id, &sub.spec) == share_key(collection.id, &spec))
                .then_some(handle)
            });
            match same {
                Some(handle) => {
                    listed.push(handle);
                    let sub = self.session.table.get_mut(handle).expect("live");
                    let oldest = sub.retained.front().map_or(sub.seq + 1, |(seq, _, _)| *seq);
                    if entry.last_seq <= sub.seq && entry.last_seq + 1 >= oldest {
                        let n = sub.seq - entry.last_seq;
                        metrics::add(&METRICS.resume_replayed, 1);
                        outcomes.push(serde_json::json!({"sub": entry.sub, "replayed": n}));
                        replays.push(handle);
                        sub.awaiting_reset = false;
                        // Remember where to replay from in `seq` until the frames go out.
                        sub.retained.retain(|(seq, _, _)| *seq > entry.last_seq);
                    } else {
                        metrics::add(&METRICS.resume_reset, 1);
                        outcomes.push(serde_json::json!({"sub": entry.sub, "reset": true}));
                        sub.awaiting_reset = true;
                        sub.seq = entry.last_seq;
                        let _ = self.context.core.send(Command::Resync { session: self.session.id, handle }).await;
                    }
                }
                None => {
                    if let Some(handle) = existing {
                        // Same id, another definition: the old one goes.
                        self.forget(handle).await;
                    }
                    metrics::add(&METRICS.resume_reset, 1);
                    outcomes.push(serde_json::json!({"sub": entry.sub, "reset": true}));
                    self.start_subscription(entry.sub.clone(), collection, spec, entry.last_seq).await;
                    listed.push(self.session.next_handle - 1);
                }
            }
        }
        // Subscriptions of the old session that the client did not list are closed.
        let unlisted: Vec<SubHandle> =
            self.session.table.iter().map(|(handle, _)| handle).filter(|handle| !listed.contains(handle)).collect();
        for handle in unlisted {
            self.forget(handle).await;
        }
        let answer = serde_json::json!({"type": "resumed", "session": self.session.token, "subs": outcomes});
        self.send_json(&answer).await;
        for handle in replays {
            let Some(sub) = self.session.table.get(handle) else { continue };
            let frames: Vec<(u64, FrameBody, u32)> = sub.retained.iter().cloned().collect();
            let client_id = sub.client_id.clone();
            for (seq, body, n_diffs) in frames {
                self.frame.clear();
                write_diffs_frame(&mut self.frame, &client_id, seq, &body);
                metrics::add(&METRICS.diffs_sent, n_diffs as u64);
                self.write(OpCode::Text).await;
            }
        }
    }

    /// Closes a subscription without telling the client (it did not ask for it).
    async fn forget(&mut self, handle: SubHandle) {
        if let Some(entry) = self.session.table.remove(handle) {
            self.session.by_client_id.remove(&entry.client_id);
        }
        let _ = self.context.core.send(Command::Unsubscribe { session: self.session.id, handle }).await;
    }

    fn check_resume_entry(
        &self,
        entry: &wire::ResumeEntry,
    ) -> Result<(Arc<crate::core::CollectionEntry>, WindowSpec), ApiError> {
        wire::check_sub_id(&entry.sub)?;
        let (collection, predicate) = self.readable(&entry.collection)?;
        let mut spec = wire::window_spec(
            &collection.schema,
            &entry.filter,
            &entry.sort,
            entry.offset,
            entry.limit,
            entry.fields.as_deref(),
            entry.payload,
        )?;
        wire::restrict(&mut spec.def, predicate.as_ref(), &collection.schema)?;
        Ok((collection, spec))
    }
}

/// When a verified token must be looked at again: its expiry plus the leeway.
fn expiry_deadline(identity: &Identity) -> Option<tokio::time::Instant> {
    if identity.expires_at == u64::MAX {
        return None;
    }
    let left = (identity.expires_at + limits::TOKEN_LEEWAY_SECS).saturating_sub(auth::now_unix());
    Some(tokio::time::Instant::now() + Duration::from_secs(left))
}

fn refuse_and_count(failure: AuthFailure) {
    let _ = crate::access::refuse(failure, "/v1/ws");
}

fn unknown_subscription(sub: &str) -> ApiError {
    ApiError::new(ErrorCode::UnknownSubscription, format!("no subscription `{sub}` on this connection"))
}
