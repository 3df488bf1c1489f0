//! One WebSocket connection: its task, which opens the session, waits on every
//! source of work at once (the client's frames among them, read in place: no
//! reader task, no inbound queue) and routes each event, and closes it. The
//! task owns the session (its subscription table, sequence numbers and retained
//! frames) and both halves of the socket, and is the only one that writes.
//!
//! Frames of diffs arrive from the writer thread as shared bodies; the task wraps
//! each in its envelope (`sub`, `seq`) in one reused buffer, so sending a frame
//! allocates nothing once the buffer has grown.
//!
//! The jobs, by file: `read` (client frames), `requests` (client messages),
//! `subscriptions` (opening and changing windows), `park` (waiting for `min_seq`),
//! `resume`, `identity` (the token and the rules), `outbox` (what the writer
//! thread sends), `write` (frames to the socket), `session` (the state kept for
//! resume).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fastwebsockets::WebSocket;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{ReadHalf, WriteHalf};
use tokio::sync::watch;

use crate::access::{ConnectionSlot, Gate};
use crate::auth::{self, Identity, Role};
use crate::limits;
use crate::metrics::{self, METRICS};
use crate::min_seq::SeqWatch;
use crate::rate_limit::TokenBucket;
use crate::routing::Routes;
use crate::sub_table::SubTable;
use crate::writer::{Command, ConnShared, Outgoing, SessionId, WriterSender};

mod identity;
mod outbox;
mod park;
mod read;
mod registry;
mod requests;
mod resume;
mod session;
mod subscriptions;
mod write;

use identity::expiry_deadline;
use park::ParkedRequest;
use read::{FrameReader, Inbound};
pub use registry::Registry;
use session::{RetainedFrame, SubEntry};
pub use session::{Session, ANONYMOUS_OWNER};

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
    // Both directions are framed here (`read`, `write`): fastwebsockets does the
    // upgrade only, so that a held connection keeps no fixed-size buffers.
    let (read_half, writer) = tokio::io::split(ws.into_inner());
    let mut connection = Box::pin(Connection::open(writer, context, slot)).await;
    if let Some(connection) = connection.as_mut() {
        tracing::debug!(session = connection.session.id, "websocket opened");
        connection.run(read_half).await;
    }
    METRICS.connections.fetch_sub(1, Ordering::Relaxed);
    if let Some(connection) = connection {
        connection.log_close();
        Box::pin(connection.finish()).await;
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
    /// What one client frame meant (at most two events: a close's echo, then the end).
    Inbound([Option<Inbound>; 2]),
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
        let (outbox_tx, outbox) = crate::writer::outbox();
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
            // Both buffers grow with the first frame: a connection that never
            // gets one costs nothing here (see `RETAINED_BUFFER_BYTES`).
            out: Vec::new(),
            session,
            context,
            frame: Vec::new(),
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

    /// The rare events' handlers (a client's request, the auth deadline, an
    /// unpark) are boxed when they run: their state machines are large, and
    /// inline they would make every idle connection's task as large as the
    /// largest of them. Frames to the client (`on_outgoing`) stay inline.
    async fn run(&mut self, mut read_half: ReadHalf<Stream>) {
        let mut reader = FrameReader::default();
        let mut shutdown = self.context.shutdown.clone();
        while !self.closed {
            let timed = self.auth_deadline.is_some();
            let parked = self.parked.as_ref().map(|parked| parked.min_seq);
            let event = tokio::select! {
                messages = reader.next_events(&mut read_half), if parked.is_none() => Event::Inbound(messages),
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
                && self.identity.as_ref().is_some_and(|identity| identity.role != Role::Admin)
            {
                self.close(CLOSE_RULES_CHANGED, "access rules changed; reconnect and resume").await;
                break;
            }
            match event {
                Event::Inbound(messages) => {
                    for message in messages.into_iter().flatten() {
                        Box::pin(self.on_inbound(message)).await;
                    }
                }
                Event::Outgoing(Some(outgoing)) => {
                    let delivery = std::pin::pin!(self.deliver(outgoing));
                    metrics::delivering_frames(delivery).await
                }
                Event::Outgoing(None) => self.close(CLOSE_GOING_AWAY, "server stopping").await,
                Event::Shutdown => self.close(CLOSE_GOING_AWAY, "server stopping").await,
                Event::AuthDeadline => Box::pin(self.on_auth_deadline()).await,
                Event::Evicted => {
                    let reason = "too many connections are waiting for `auth`; this one waited longest";
                    self.close(CLOSE_UNAUTHORIZED, reason).await;
                }
                Event::Unpark => Box::pin(self.unpark()).await,
            }
        }
    }

    /// Handles what the writer thread queued, `first` and whatever else is ready
    /// (under load, one syscall carries many frames), and writes it.
    async fn deliver(&mut self, first: Outgoing) {
        self.on_outgoing(first).await;
        while self.out.len() < WRITE_BATCH_BYTES {
            match self.session.outbox.try_recv() {
                Some(outgoing) => self.on_outgoing(outgoing).await,
                None => break,
            }
        }
        self.flush().await;
        self.maybe_report_drained().await;
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
}

/// Resolves when the connection's socket, still without an identity, must close
/// to make room among those waiting for `auth` (see `Gate::open_connection`).
async fn evicted(slot: &mut Option<ConnectionSlot>) {
    match slot {
        Some(slot) => slot.evicted().await,
        None => std::future::pending().await,
    }
}
