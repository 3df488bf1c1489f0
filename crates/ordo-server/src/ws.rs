//! One WebSocket connection. A reader task turns client frames into messages; the
//! connection task owns the session (its subscription table, sequence numbers and
//! retained frames) and the write half, and is the only one that writes.
//!
//! Frames of diffs arrive from the writer thread as shared bodies; the task wraps
//! each in its envelope (`sub`, `seq`) in one reused buffer, so sending a frame
//! allocates nothing once the buffer has grown.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fastwebsockets::{OpCode, Role, WebSocket};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncWriteExt, WriteHalf};
use tokio::sync::{mpsc, watch};

use crate::access::{ConnectionSlot, Gate};
use crate::auth::{self, Identity, Role as AuthRole};
use crate::error::{ApiError, ErrorCode};
use crate::frame::{write_diffs_frame, write_json_str, DiffsHeader};
use crate::limits;
use crate::metrics::{self, Stage, METRICS};
use crate::min_seq::{self, SeqCheck, SeqWatch};
use crate::rate_limit::TokenBucket;
use crate::routing::Routes;
use crate::sub_table::SubTable;
use crate::wire::{self, ClientMessage, WindowSpec};
use crate::writer::{Answer, Command, ConnShared, Outgoing, SessionId, SubHandle, WriterSender, FRAME_OVERHEAD_BYTES};

mod identity;
mod park;
mod read;
mod resume;
mod session;

use identity::expiry_deadline;
use park::{Parked, ParkedRequest};
use read::{read_frames, Inbound, MaskCheck};
pub use session::{Registry, Session, ANONYMOUS_OWNER};
use session::{RetainedFrame, SubEntry};

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

/// Everything a connection needs from the server.
#[derive(Clone)]
pub struct ConnectionContext {
    pub writer: WriterSender,
    pub routes: Routes,
    pub registry: Arc<Registry>,
    pub config: ConnectionConfig,
    pub shutdown: watch::Receiver<bool>,
    pub limits_json: Arc<serde_json::Value>,
    pub gate: Arc<Gate>,
    /// Who opened the connection, when the upgrade carried a token (or auth is off).
    pub identity: Option<Arc<Identity>>,
    /// The `seq` of the last batch applied, for `min_seq`.
    pub seq: SeqWatch,
    /// Cluster mode: the lag, which refuses new subscribers past `--cluster-max-lag`.
    pub cluster: Option<Arc<crate::cluster::Shared>>,
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
        tracing::debug!(session = connection.session.id, "websocket opened");
        connection.run(inbound_rx).await;
    }
    reader_task.abort();
    METRICS.connections.fetch_sub(1, Ordering::Relaxed);
    if let Some(connection) = connection {
        connection.log_close();
        connection.finish().await;
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
    /// Fires at `auth_deadline`: one timer for the connection's life, reset when
    /// the deadline moves (a new timer per event would register with the timer
    /// driver on every frame).
    auth_timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// The token expired and `auth_expired` was sent: the grace is running.
    in_grace: bool,
    /// The identity's connection slot (readers are capped), held while connected.
    slot: Option<ConnectionSlot>,
    /// The rules' version this connection's views were built under.
    rules_version: u64,
    /// A request waiting for the store to reach its `min_seq`. Meanwhile no
    /// later message is read (they are answered in order), frames still flow.
    parked: Option<ParkedRequest>,
    /// Fires when the parked request's wait is over (`limits::MIN_SEQ_WAIT_MS`).
    park_timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// The last `seq` applied, watched while a request is parked.
    seq: SeqWatch,
    /// The close code and reason the server sent, if it closed the connection.
    closed_with: Option<(u16, String)>,
}

enum Event {
    Inbound(Option<Inbound>),
    Outgoing(Option<Outgoing>),
    Shutdown,
    AuthDeadline,
    /// Too many sockets wait for their `auth`, and this one has waited longest.
    Evicted,
    /// The parked request's `min_seq` was reached, or its wait ran out.
    Unpark,
}

impl Connection {
    async fn open(writer: WriteHalf<Stream>, context: ConnectionContext, slot: ConnectionSlot) -> Option<Connection> {
        let id = new_session_id();
        let shared = Arc::new(ConnShared::default());
        let (outbox_tx, outbox) = mpsc::unbounded_channel();
        let command = Command::OpenSession { session: id, shared: shared.clone(), outbox: outbox_tx };
        context.writer.send(command).await.ok()?;
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
        let seq = context.seq.clone();
        let bucket = TokenBucket::new(context.config.messages_per_second, limits::WS_MESSAGE_BURST);
        let auth_deadline = match &identity {
            Some(identity) => expiry_deadline(identity),
            None => Some(tokio::time::Instant::now() + context.config.auth_timeout),
        };
        let rules_version = context.gate.rules_version();
        let far = tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
        let auth_timer = Box::pin(tokio::time::sleep_until(auth_deadline.unwrap_or(far)));
        let park_timer = Box::pin(tokio::time::sleep_until(far));
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
            rules_version,
            auth_timer,
            parked: None,
            park_timer,
            seq,
            closed_with: None,
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
            let timed = self.auth_deadline.is_some();
            let parked = self.parked.as_ref().map(|parked| parked.min_seq);
            let event = tokio::select! {
                message = inbound.recv(), if parked.is_none() => Event::Inbound(message),
                outgoing = self.session.outbox.recv() => Event::Outgoing(outgoing),
                _ = shutdown.wait_for(|stopping| *stopping) => Event::Shutdown,
                _ = &mut self.auth_timer, if timed => Event::AuthDeadline,
                _ = evicted(&mut self.slot), if self.identity.is_none() => Event::Evicted,
                // Woken by the writer thread's publication of each new `seq`, not by polling.
                // (An error means the writer is gone: unparking then refuses.)
                _ = self.seq.wait_for(|&seq| parked.is_some_and(|min_seq| seq >= min_seq)), if parked.is_some() => {
                    Event::Unpark
                }
                _ = &mut self.park_timer, if parked.is_some() => Event::Unpark,
            };
            // Nothing is handled under rules that changed meanwhile (an admin's
            // views never depended on them).
            if self.context.gate.rules_version() != self.rules_version
                && self.identity.as_ref().is_some_and(|identity| identity.role != AuthRole::Admin)
            {
                self.close(CLOSE_RULES_CHANGED, "access rules changed; reconnect and resume").await;
                break;
            }
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
                Event::Evicted => {
                    let reason = "too many connections are waiting for `auth`; this one waited longest";
                    self.close(CLOSE_UNAUTHORIZED, reason).await;
                }
                Event::Unpark => self.unpark().await,
            }
        }
    }

    /// One line per ended connection. A close the server chose for this client
    /// (slow, auth, protocol error, rules changed) is `info`; one the client
    /// chose, or the server's stop (a line per client at once), is `debug`.
    fn log_close(&self) {
        let session = self.session.id;
        match &self.closed_with {
            Some((code, reason)) if !matches!(*code, CLOSE_NORMAL | CLOSE_GOING_AWAY) => {
                tracing::info!(session, code, reason = reason.as_str(), "websocket closed by the server: {reason}")
            }
            Some((code, reason)) => tracing::debug!(session, code, reason = reason.as_str(), "websocket closed"),
            None => tracing::debug!(session, reason = "closed by the client", "websocket closed"),
        }
    }

    /// After the connection: a session with subscriptions is held for resume,
    /// within the parked budgets; the sessions that pushes out are closed.
    async fn finish(self) {
        let stopping = *self.context.shutdown.borrow();
        if self.session.table.is_empty() || stopping {
            let _ = self.context.writer.try_send(Command::DropSession { session: self.session.id });
        } else {
            let evicted = self.context.registry.park(self.session, self.context.config.session_retention);
            for session in evicted {
                // The writer frees the session's windows and queued frames.
                if self.context.writer.send(Command::DropSession { session }).await.is_err() {
                    return;
                }
            }
        }
    }

    async fn maybe_report_drained(&mut self) {
        if self.session.outbox.is_empty() && self.session.shared.want_drain_notice.swap(false, Ordering::AcqRel) {
            let _ = self.context.writer.send(Command::Drained { session: self.session.id }).await;
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

    async fn send_json(&mut self, value: &serde_json::Value) {
        self.frame.clear();
        serde_json::to_writer(&mut self.frame, value).expect("JSON to a Vec");
        self.write(OpCode::Text).await;
    }

    async fn send_error(&mut self, error: &ApiError, sub: Option<&str>, req: Option<&str>) {
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
    fn queue_ack(&mut self, sub: &str, req: Option<&str>) {
        self.frame.clear();
        self.frame.extend_from_slice(b"{\"type\":\"ack\"");
        push_req(&mut self.frame, req);
        self.frame.extend_from_slice(b",\"sub\":");
        write_json_str(&mut self.frame, sub);
        self.frame.push(b'}');
        self.queue_frame(OpCode::Text);
    }

    /// Answers a request whose frame was dropped here (the connection fell
    /// behind; the Reset that is due carries the change).
    fn ack_dropped(&mut self, handle: SubHandle, answers: Option<Answer>) {
        let Some(Answer { req }) = answers else { return };
        if let Some(sub) = self.session.table.get(handle).map(|entry| entry.client_id.clone()) {
            self.queue_ack(&sub, req.as_deref());
        }
    }

    /// `{"type":"ended","sub":..,"reason":..,"message":..}`
    async fn send_ended(&mut self, client_id: &str, reason: crate::writer::EndReason, message: &str) {
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

    async fn on_outgoing(&mut self, outgoing: Outgoing) {
        match outgoing {
            Outgoing::Diffs { handle, epoch, body, n_diffs, is_reset, write_seq, answers, extra, queued_at } => {
                metrics::record_stage(Stage::FrameQueue, queued_at.elapsed());
                let cost = body.len() + FRAME_OVERHEAD_BYTES;
                self.session.shared.queued_bytes.fetch_sub(cost, Ordering::AcqRel);
                metrics::sub_queued(cost);
                let is_stale = epoch < self.session.shared.epoch.load(Ordering::Acquire);
                let Some(entry) = self.session.table.get_mut(handle) else { return };
                if is_stale || (entry.awaiting_reset && !is_reset) {
                    // Dropped: the connection fell behind (or a resume could not
                    // replay) and a reset is due; it will say where the window is,
                    // and the request this frame answered gets an `ack` now.
                    entry.range_due = extra.range.or(entry.range_due);
                    self.ack_dropped(handle, answers);
                    return;
                }
                let mut extra = extra;
                extra.range = extra.range.or(entry.range_due.take());
                entry.awaiting_reset = false;
                entry.seq += 1;
                let seq = entry.seq;
                if let Some((offset, limit)) = extra.range {
                    // Where a key-positioned request placed the window: what a resume compares.
                    (entry.spec.offset, entry.spec.limit, entry.spec.seek) = (offset as usize, limit as usize, None);
                }
                entry.retain(RetainedFrame { seq, write_seq, body: body.clone(), n_diffs, extra });
                // A subscription's first frame answers its `subscribe`; a later one
                // may answer a change of window. (Both at once cannot happen: the
                // first frame is the subscribe's Reset. Should it, the change gets an ack.)
                let subscribe_req = entry.subscribe_req.take();
                let (req, also_ack) = match (subscribe_req, answers) {
                    (Some(req), answers) => (Some(req), answers),
                    (None, Some(Answer { req })) => (req, None),
                    (None, None) => (None, None),
                };
                self.frame.clear();
                let header = DiffsHeader { sub: &entry.client_id, seq, write_seq, req: req.as_deref(), extra };
                write_diffs_frame(&mut self.frame, &header, &body);
                let also_ack = also_ack.map(|answer| (entry.client_id.clone(), answer));
                metrics::add(&METRICS.diffs_sent, n_diffs as u64);
                self.queue_frame(OpCode::Text);
                if let Some((sub, Answer { req })) = also_ack {
                    self.queue_ack(&sub, req.as_deref());
                }
            }
            Outgoing::Ack { handle, req } => {
                if let Some(sub) = self.session.table.get(handle).map(|entry| entry.client_id.clone()) {
                    self.queue_ack(&sub, req.as_deref());
                }
            }
            Outgoing::SubscribeFailed { handle, error } => {
                if let Some(entry) = self.session.table.remove(handle) {
                    self.session.by_client_id.remove(&entry.client_id);
                    self.send_error(&error, Some(&entry.client_id), entry.subscribe_req.as_deref()).await;
                }
            }
            Outgoing::RequestFailed { handle, error, spec, req } => {
                let sub = self.session.table.get_mut(handle).map(|entry| {
                    if let Some(spec) = spec {
                        // What the window really is, for a later resume to compare with.
                        entry.spec = *spec;
                    }
                    entry.client_id.clone()
                });
                self.send_error(&error, sub.as_deref(), req.as_deref()).await;
            }
            Outgoing::Unsubscribed { handle } => {
                if let Some(entry) = self.session.table.remove(handle) {
                    self.frame.clear();
                    self.frame.extend_from_slice(b"{\"type\":\"unsubscribed\",\"sub\":");
                    write_json_str(&mut self.frame, &entry.client_id);
                    push_req(&mut self.frame, entry.unsubscribe_req.as_deref());
                    self.frame.push(b'}');
                    self.write(OpCode::Text).await;
                }
            }
            Outgoing::Ended { handle, reason, message } => {
                // The writer has detached it: no frame of it follows, and its id is free.
                if let Some(entry) = self.session.table.remove(handle) {
                    self.session.by_client_id.remove(&entry.client_id);
                    self.send_ended(&entry.client_id, reason, &message).await;
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
                    let (sub, req) = wire::SubAndReq::read(&text);
                    self.send_error(&error, sub.as_deref(), req.as_deref()).await;
                    return;
                }
                match crate::strict_json::parse::<ClientMessage>(&text, "the message") {
                    Ok(message) => self.on_message(message).await,
                    Err(error) => {
                        // Not `sub`: the message is not understood, so no subscription is
                        // refused (a client must not drop its list for a typo).
                        let (_, req) = wire::SubAndReq::read(&text);
                        self.send_error(&error, None, req.as_deref()).await;
                    }
                }
            }
            Inbound::Binary => {
                let error = ApiError::bad_request("binary frames are not part of the protocol; send JSON text");
                self.send_error(&error, None, None).await;
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
        if let Err(error) = wire::check_req(message.req()) {
            // An id that is not one is not echoed; the request does nothing.
            self.send_error(&error, None, None).await;
            return;
        }
        let req: Option<Box<str>> = message.req().map(Box::from);
        if let ClientMessage::Auth { token, .. } = &message {
            // Not counted as the first message: `resume` may follow it.
            if let Err(error) = self.authenticate(token, req.as_deref()).await {
                self.send_error(&error, None, req.as_deref()).await;
            }
            return;
        }
        let Some(identity) = self.identity.clone() else {
            let error = ApiError::new(ErrorCode::Unauthorized, "send `{\"op\":\"auth\",\"token\":..}` first");
            self.send_error(&error, None, req.as_deref()).await;
            return;
        };
        if let Err(error) = self.context.gate.take_request(&identity) {
            self.send_error(&error, None, req.as_deref()).await;
            return;
        }
        let first = std::mem::replace(&mut self.may_resume, false);
        if let Some(min_seq) = self.awaits_its_collection(&message) {
            self.park(min_seq, Parked::Unchecked { message: Box::new(message), req });
            return;
        }
        self.dispatch(message, req, first).await;
    }

    /// The `min_seq` to wait for before checking `message`: a `subscribe` to a
    /// collection this node does not know (yet) whose `min_seq` it has not
    /// reached. In a cluster the collection may come with an entry this node has
    /// not applied; refusing it now would make the answer depend on the node.
    fn awaits_its_collection(&self, message: &ClientMessage) -> Option<u64> {
        let ClientMessage::Subscribe { collection, min_seq, .. } = message else { return None };
        let SeqCheck::Wait(min_seq) = min_seq::check(*min_seq, min_seq::last(&self.seq)) else { return None };
        match self.readable(collection) {
            Err(error) if error.code == ErrorCode::UnknownCollection => Some(min_seq),
            _ => None,
        }
    }

    /// Handles a message from an authenticated client within its request rate.
    async fn dispatch(&mut self, message: ClientMessage, req: Option<Box<str>>, first: bool) {
        let result = match message {
            ClientMessage::Auth { .. } => unreachable!("handled above"),
            ClientMessage::Subscribe {
                sub,
                collection,
                filter,
                sort,
                offset,
                around,
                after,
                before,
                tail,
                limit,
                fields,
                payload,
                min_seq,
                ..
            } => {
                let position = wire::PositionKeys { offset, around, after, before, tail };
                let spec = self.check_subscribe(
                    &sub,
                    &collection,
                    &filter,
                    &sort,
                    position,
                    limit,
                    fields.as_deref(),
                    payload,
                );
                match spec {
                    Ok((collection, spec)) => match min_seq::check(min_seq, min_seq::last(&self.seq)) {
                        SeqCheck::Reached => {
                            self.start_subscription(sub, collection, spec, 0, req.clone()).await;
                            Ok(())
                        }
                        SeqCheck::Wait(min_seq) => {
                            self.park(
                                min_seq,
                                Parked::Subscribe { sub, collection, spec: Box::new(spec), req: req.clone() },
                            );
                            Ok(())
                        }
                        SeqCheck::Refused(error) => Err((error, Some(sub))),
                    },
                    Err(error) => Err((error, Some(sub))),
                }
            }
            ClientMessage::SetRange { sub, offset, around, after, before, tail, limit, .. } => {
                let position = wire::PositionKeys { offset, around, after, before, tail };
                self.set_range(&sub, position, limit, req.clone()).await.map_err(|e| (e, Some(sub)))
            }
            ClientMessage::SetView { sub, filter, sort, .. } => {
                self.set_view(&sub, &filter, &sort, req.clone()).await.map_err(|e| (e, Some(sub)))
            }
            ClientMessage::Unsubscribe { sub, .. } => match self.session.by_client_id.remove(&sub) {
                Some(handle) => {
                    if let Some(entry) = self.session.table.get_mut(handle) {
                        entry.unsubscribe_req = req.clone();
                    }
                    let command = Command::Unsubscribe { session: self.session.id, handle };
                    let _ = self.context.writer.send(command).await;
                    Ok(())
                }
                None => Err((unknown_subscription(&sub), Some(sub))),
            },
            ClientMessage::Resume { session, subs, .. } => {
                if first {
                    // The greatest `min_seq` worth waiting for; entries past
                    // `MAX_MIN_SEQ_AHEAD` are refused by the resume itself.
                    let last_seq = min_seq::last(&self.seq);
                    let wait = subs
                        .iter()
                        .filter_map(|entry| match min_seq::check(entry.min_seq, last_seq) {
                            SeqCheck::Wait(min_seq) => Some(min_seq),
                            SeqCheck::Reached | SeqCheck::Refused(_) => None,
                        })
                        .max();
                    match wait {
                        Some(min_seq) => {
                            self.park(min_seq, Parked::Resume { session, entries: subs, req: req.clone() })
                        }
                        None => self.resume(&session, subs, req.clone()).await,
                    }
                    Ok(())
                } else {
                    Err((ApiError::bad_request("`resume` must be the first message of a connection"), None))
                }
            }
        };
        if let Err((error, sub)) = result {
            self.send_error(&error, sub.as_deref(), req.as_deref()).await;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check_subscribe(
        &self,
        sub: &str,
        collection: &str,
        filter: &serde_json::Value,
        sort: &[wire::SortRequest],
        position: wire::PositionKeys,
        limit: usize,
        fields: Option<&[String]>,
        payload: bool,
    ) -> Result<(Arc<crate::routing::CollectionEntry>, WindowSpec), ApiError> {
        wire::check_sub_id(sub)?;
        if let Some(cluster) = &self.context.cluster {
            cluster.status.check_not_lagging()?;
        }
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
        let read_schema = self.read_schema(&entry, filter, sort, fields)?;
        let schema = read_schema.as_ref().unwrap_or(&entry.schema);
        let mut spec = wire::window_spec(schema, filter, sort, position, limit, fields, payload)?;
        wire::restrict_spec(&mut spec, predicate.as_ref(), schema)?;
        Ok((entry, spec))
    }

    /// Registers the subscription here, then asks the writer thread for its window;
    /// its first frame (a Reset) gets `seq = first_seq + 1`, and `req`.
    async fn start_subscription(
        &mut self,
        client_id: String,
        collection: Arc<crate::routing::CollectionEntry>,
        spec: WindowSpec,
        first_seq: u64,
        req: Option<Box<str>>,
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
            range_due: None,
            subscribe_req: req,
            unsubscribe_req: None,
        };
        self.session.table.insert(handle, entry).expect("handles increase");
        self.session.by_client_id.insert(client_id, handle);
        let schema = collection.schema.clone();
        let owner = self.view_budget_owner();
        let command =
            Command::Subscribe { session: self.session.id, handle, collection: collection.id, schema, spec, owner };
        let _ = self.context.writer.send(command).await;
    }

    fn handle_of(&self, sub: &str) -> Result<SubHandle, ApiError> {
        self.session.by_client_id.get(sub).copied().ok_or_else(|| unknown_subscription(sub))
    }

    async fn set_range(
        &mut self,
        sub: &str,
        position: wire::PositionKeys,
        limit: usize,
        req: Option<Box<str>>,
    ) -> Result<(), ApiError> {
        let handle = self.handle_of(sub)?;
        wire::check_range(0, limit)?;
        let mut position = position.check(limit)?;
        if let wire::Position::Seek(seek) = &mut position {
            // The rules as they are now: an item outside them reads as missing.
            let name = self.session.table.get(handle).expect("mapped handles are live").collection.name.clone();
            let (_, predicate) = self.readable(&name)?;
            seek.rule = predicate;
        }
        let entry = self.session.table.get_mut(handle).expect("mapped handles are live");
        // Recorded now for a later resume to compare with; a key position is
        // recorded when its answer says where it landed.
        entry.spec.set_position(position.clone());
        entry.spec.limit = limit;
        let command = Command::SetRange { session: self.session.id, handle, position, limit, req };
        let _ = self.context.writer.send(command).await;
        Ok(())
    }

    async fn set_view(
        &mut self,
        sub: &str,
        filter: &serde_json::Value,
        sort: &[wire::SortRequest],
        req: Option<Box<str>>,
    ) -> Result<(), ApiError> {
        let handle = self.handle_of(sub)?;
        let entry = self.session.table.get(handle).expect("mapped handles are live");
        let (name, subscribed_id) = (entry.collection.name.clone(), entry.collection.id);
        // The rules and the schema as they are now: a view change never widens past
        // the rules, and may name fields added since the subscription opened.
        let (current, predicate) = self.readable(&name)?;
        if current.id != subscribed_id {
            // Dropped (and made again): the subscription's `ended` is on its way.
            return Err(ApiError::new(
                ErrorCode::UnknownCollection,
                format!("collection `{name}` was dropped since this subscription opened"),
            ));
        }
        let entry = self.session.table.get(handle).expect("mapped handles are live");
        // The projection stays: its fields read through references are checked again too.
        let shown = entry.spec.projection.through.clone();
        let read_schema = self.read_schema(&current, filter, sort, Some(&shown))?;
        let schema = read_schema.as_ref().unwrap_or(&current.schema);
        let mut def = wire::view_def(schema, filter, sort)?.showing(shown);
        wire::restrict(&mut def, predicate.as_ref(), schema)?;
        let entry = self.session.table.get_mut(handle).expect("mapped handles are live");
        entry.spec.def = def.clone();
        let owner = self.view_budget_owner();
        let command = Command::SetView { session: self.session.id, handle, def, req, owner };
        let _ = self.context.writer.send(command).await;
        Ok(())
    }
}

/// Resolves when the connection's socket, still without an identity, must close
/// to make room among those waiting for `auth` (see `Gate::open_connection`).
async fn evicted(slot: &mut Option<ConnectionSlot>) {
    match slot {
        Some(slot) => slot.evicted().await,
        None => std::future::pending().await,
    }
}

/// Appends `,"req":<req>` when there is one.
fn push_req(frame: &mut Vec<u8>, req: Option<&str>) {
    if let Some(req) = req {
        frame.extend_from_slice(b",\"req\":");
        write_json_str(frame, req);
    }
}

fn unknown_subscription(sub: &str) -> ApiError {
    ApiError::new(ErrorCode::UnknownSubscription, format!("no subscription `{sub}` on this connection"))
}
