//! The client: HTTP helpers plus one background task that owns the WebSocket,
//! reconnects with backoff, authenticates, resumes, and re-subscribes a list whose
//! frames went missing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, timeout, Instant};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::auth::{Auth, TokenSource};
use crate::http::Http;
use crate::list::{LiveList, Shared, TypedSink};
use crate::nodes::{NodeRotation, NodeUrls};
use crate::protocol::{Event, ListSink, Phase, ProtocolState, Refused, WelcomeAuth};
use crate::wire::{Ended, View};
use crate::Error;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long a connect, the `welcome` and the `authed` may each take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// What the entries of one `resume` may take: a client frame is at most 64 KiB, and
/// the rest of the message (the op, the session) is well under 1 KiB.
const RESUME_BUDGET_BYTES: usize = 63 * 1024;
/// Fresh subscriptions a list may take in a row without applying a frame (see `Task::recover`).
const MAX_RECOVERIES: u32 = 3;
/// A token is refreshed this long before its `exp` (or halfway, for shorter-lived ones).
const REFRESH_MARGIN_SECS: u64 = 60;

pub(crate) enum Command {
    Subscribe { sub: String, message: Map<String, Value>, sink: Box<dyn ListSink> },
    SetRange { sub: String, offset: u64, limit: u64 },
    SetView { sub: String, filter: Option<Value>, sort: Option<Value> },
    Unsubscribe { sub: String },
}

/// The connection as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionState {
    /// Connecting, or waiting before the next attempt (`attempt`: failures in a row;
    /// `last_error`: why the last attempt failed, e.g. a token the server refused).
    Connecting { attempt: u32, last_error: Option<String> },
    /// Welcomed, authenticated and resumed: frames flow.
    Connected { session: String },
    /// The client is gone.
    Closed,
}

/// Reconnection delays: `min` doubling up to `max`, with up to 25 % random jitter so
/// that many clients of one restarted server do not come back at the same instant.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { min: Duration::from_millis(200), max: Duration::from_secs(10) }
    }
}

impl Backoff {
    #[cfg(test)]
    fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, jitter_unit())
    }

    /// The delay after `attempt` failures in a row: `min * 2^attempt` capped at `max`,
    /// plus `unit` (in `0..1`) times a quarter of it.
    pub(crate) fn delay_with(&self, attempt: u32, unit: f64) -> Duration {
        let base = self.min.saturating_mul(1u32 << attempt.min(16)).min(self.max);
        base + base.mul_f64(unit.clamp(0.0, 1.0) / 4.0)
    }
}

/// A number in `0..1` for jitter (from the clock: no random generator needed for this).
fn jitter_unit() -> f64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |now| now.subsec_nanos());
    f64::from(nanos % 1000) / 1000.0
}

/// Builds a `Client`.
pub struct ClientBuilder {
    urls: NodeUrls,
    auth: Auth,
    backoff: Backoff,
    http_timeout: Duration,
}

impl ClientBuilder {
    pub fn auth(mut self, auth: Auth) -> ClientBuilder {
        self.auth = auth;
        self
    }

    pub fn backoff(mut self, backoff: Backoff) -> ClientBuilder {
        self.backoff = backoff;
        self
    }

    /// How long an HTTP request may wait for its whole answer (30 s by default).
    pub fn http_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.http_timeout = timeout;
        self
    }

    /// Starts the connection task (on the current tokio runtime). Never fails: the task
    /// connects, and reconnects, in the background.
    pub fn build(self) -> Client {
        let tokens = Arc::new(TokenSource::new(self.auth));
        let nodes = NodeRotation::new(self.urls);
        let http = Http::new(nodes.urls(), tokens.clone(), self.http_timeout);
        let (commands, receiver) = mpsc::unbounded_channel();
        let (state_tx, state_rx) = watch::channel(ConnectionState::Connecting { attempt: 0, last_error: None });
        let current = Arc::new(Mutex::new(nodes.current().to_owned()));
        let (node_tx, node_rx) = watch::channel(nodes.current().to_owned());
        let task = Task {
            nodes,
            current: current.clone(),
            node: node_tx,
            served: false,
            tokens,
            backoff: self.backoff,
            commands: receiver,
            state: ProtocolState::new(),
            specs: BTreeMap::new(),
            before_change: BTreeMap::new(),
            status: state_tx,
            refresh_at: None,
            last_error: None,
            recoveries: BTreeMap::new(),
        };
        tokio::spawn(task.run());
        Client { http, commands, next_id: Arc::new(AtomicU64::new(1)), state: state_rx, current, node: node_rx }
    }
}

/// An Ordo client: `http()` for requests, `subscribe` for live lists. Cheap to clone;
/// the connection closes when the client and every list are dropped.
#[derive(Clone)]
pub struct Client {
    http: Http,
    commands: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicU64>,
    state: watch::Receiver<ConnectionState>,
    current: Arc<Mutex<String>>,
    node: watch::Receiver<String>,
}

impl Client {
    /// `urls` is the server's base URL, `http://host:port`, or the base URLs of several
    /// nodes of one cluster (`["http://a:7070", "http://b:7070"]`): the client uses the
    /// first, and on a lost connection (or a failed connect) moves to the next, round
    /// robin, waiting the backoff only once a whole round failed. Every resume entry and
    /// re-subscription asks for `min_seq` = the greatest `write_seq` the list applied, so
    /// a list never goes back in time on a node that lags (README, "Several nodes").
    ///
    /// # Panics
    /// With an empty list.
    pub fn builder(urls: impl Into<NodeUrls>) -> ClientBuilder {
        ClientBuilder {
            urls: urls.into(),
            auth: Auth::None,
            backoff: Backoff::default(),
            http_timeout: Duration::from_secs(30),
        }
    }

    pub fn http(&self) -> &Http {
        &self.http
    }

    /// The connection's state, to watch.
    pub fn connection(&self) -> watch::Receiver<ConnectionState> {
        self.state.clone()
    }

    /// The base URL of the node in use, or being connected to.
    pub fn current_url(&self) -> String {
        self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The base URL of the node that serves the client (its connection is set up), to
    /// watch: it changes when the client fails over to another node.
    pub fn node(&self) -> watch::Receiver<String> {
        self.node.clone()
    }

    /// A live window of `view` over `collection` (`view.limit` is required by the server).
    /// Items decode into `T` (e.g. `Item<MyFields>` or `serde_json::Value`); an item that
    /// does not decode makes its frame unappliable, and the list subscribes again.
    pub fn subscribe<T>(&self, collection: &str, view: View) -> Result<LiveList<T>, Error>
    where
        T: DeserializeOwned + Clone + Send + Sync + 'static,
    {
        let sub = format!("l{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let Value::Object(mut message) =
            serde_json::to_value(&view).map_err(|error| Error::Decode(error.to_string()))?
        else {
            return Err(Error::Decode("a view that is not an object".to_owned()));
        };
        message.insert("collection".to_owned(), Value::String(collection.to_owned()));
        let shared = Shared::<T>::new();
        let sink: Box<dyn ListSink> = Box::new(TypedSink { shared: shared.clone() });
        self.commands.send(Command::Subscribe { sub: sub.clone(), message, sink }).map_err(|_| Error::Closed)?;
        Ok(LiveList { sub, shared, commands: self.commands.clone() })
    }
}

/// Why a connection ended.
enum Lost {
    /// Every handle is gone: stop.
    Shutdown,
    /// Connect again; `healthy` when it had been fully set up (the backoff starts over),
    /// `stale_token` when the server refused the token (fetch a fresh one first).
    Retry { healthy: bool, stale_token: bool },
}

struct Task {
    nodes: NodeRotation,
    /// `Client::current_url`.
    current: Arc<Mutex<String>>,
    /// `Client::node`: the node of the last connection set up.
    node: watch::Sender<String>,
    /// A connection was set up at least once (`node` then names a node that served).
    served: bool,
    tokens: Arc<TokenSource>,
    backoff: Backoff,
    commands: mpsc::UnboundedReceiver<Command>,
    state: ProtocolState<Box<dyn ListSink>>,
    /// Each subscription's definition as last sent (`subscribe` without `op` and `sub`):
    /// what a resume or a re-subscribe sends.
    specs: BTreeMap<String, Map<String, Value>>,
    /// A subscription's definition before its last `set_range` / `set_view`: restored when
    /// the server refuses that request (the subscription stays as it was), so a later
    /// resume does not ask for the refused window.
    before_change: BTreeMap<String, Map<String, Value>>,
    status: watch::Sender<ConnectionState>,
    refresh_at: Option<Instant>,
    /// Why the last connection attempt failed or ended.
    last_error: Option<String>,
    /// Fresh subscriptions in a row, per list, with no frame applied since (see `recover`).
    recoveries: BTreeMap<String, u32>,
}

/// The keys that place a window by an item or at the end instead of by `offset`
/// (`docs/PROTOCOL.md`, windows by key): at most one of them, `offset` included, may be sent.
const POSITION_KEYS: [&str; 4] = ["around", "after", "before", "tail"];

/// A `set_range` by offset: the definition a resume sends is placed by offset from now on.
fn place_by_offset(spec: &mut Map<String, Value>, offset: u64, limit: u64) {
    for key in POSITION_KEYS {
        spec.remove(key);
    }
    spec.insert("offset".to_owned(), offset.into());
    spec.insert("limit".to_owned(), limit.into());
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |now| now.as_secs())
}

async fn send(socket: &mut Socket, message: Value) -> Result<(), ()> {
    socket.send(Message::text(message.to_string())).await.map_err(|_| ())
}

impl Task {
    async fn run(mut self) {
        let mut attempt = 0u32;
        let mut stale_token = false;
        loop {
            let _ = self.status.send(ConnectionState::Connecting { attempt, last_error: self.last_error.clone() });
            match self.connection(stale_token).await {
                Lost::Shutdown => break,
                Lost::Retry { healthy, stale_token: stale } => {
                    stale_token = stale;
                    attempt = if healthy { 0 } else { attempt.saturating_add(1) };
                    if healthy {
                        self.nodes.succeeded();
                    }
                }
            }
            let _ = self.status.send(ConnectionState::Connecting { attempt, last_error: self.last_error.clone() });
            // The next node (round robin); the backoff once a whole round failed.
            let delay = self.nodes.fail(&self.backoff, jitter_unit());
            *self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = self.nodes.current().to_owned();
            // Commands that come while disconnected change what the next resume lists.
            let wake = Instant::now() + delay;
            loop {
                tokio::select! {
                    _ = sleep_until(wake) => break,
                    command = self.commands.recv() => match command {
                        Some(command) => self.offline(command),
                        None => {
                            let _ = self.status.send(ConnectionState::Closed);
                            return;
                        }
                    },
                }
            }
        }
        let _ = self.status.send(ConnectionState::Closed);
    }

    /// A command while no connection is up: recorded for the next resume.
    fn offline(&mut self, command: Command) {
        match command {
            Command::Subscribe { sub, message, sink } => {
                self.state.subscribe(&sub, sink);
                self.specs.insert(sub, message);
            }
            Command::SetRange { sub, offset, limit } => {
                if let Some(spec) = self.specs.get_mut(&sub) {
                    place_by_offset(spec, offset, limit);
                }
            }
            Command::SetView { sub, filter, sort } => {
                if let Some(spec) = self.specs.get_mut(&sub) {
                    spec.insert("filter".to_owned(), filter.unwrap_or(Value::Null));
                    spec.insert("sort".to_owned(), sort.unwrap_or(Value::Null));
                }
            }
            Command::Unsubscribe { sub } => {
                self.state.forget(&sub);
                self.drop_spec(&sub);
            }
        }
    }

    fn drop_spec(&mut self, sub: &str) {
        self.recoveries.remove(sub);
        self.specs.remove(sub);
        self.before_change.remove(sub);
    }

    fn subscribe_message(&self, sub: &str) -> Value {
        let mut message = self.specs.get(sub).cloned().unwrap_or_default();
        message.insert("op".to_owned(), "subscribe".into());
        message.insert("sub".to_owned(), sub.into());
        // Never older than what the list already showed (this may be another node).
        if let Some(floor) = self.state.floor_seq(sub) {
            message.insert("min_seq".to_owned(), floor.into());
        }
        Value::Object(message)
    }

    async fn next_frame(socket: &mut Socket) -> Option<Value> {
        loop {
            match socket.next().await? {
                Ok(Message::Text(text)) => {
                    return Some(serde_json::from_str(text.as_str()).unwrap_or_else(|_| json!({"type": "unreadable"})))
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    }

    /// Sends `auth` and waits for `authed`. `Err(stale)` when it did not work.
    async fn authenticate(&mut self, socket: &mut Socket, refresh: bool) -> Result<(), bool> {
        let token = match if refresh { self.tokens.refresh().await } else { self.tokens.current().await } {
            Ok(Some(token)) => token,
            Ok(None) => {
                self.last_error =
                    Some("the server requires a token: give the client `Auth::Token` or `Auth::Provider`".to_owned());
                return Err(false);
            }
            Err(error) => {
                self.last_error = Some(error.to_string());
                return Err(false);
            }
        };
        send(socket, json!({"op": "auth", "token": token})).await.map_err(|_| false)?;
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        loop {
            let frame = timeout(deadline.saturating_duration_since(Instant::now()), Self::next_frame(socket)).await;
            let Ok(Some(frame)) = frame else {
                self.last_error = Some("no `authed` in time".to_owned());
                return Err(false);
            };
            for event in self.state.handle_frame(&frame) {
                match event {
                    Event::Authed(identity) => {
                        self.schedule_refresh(identity.expires_at);
                        return Ok(());
                    }
                    Event::Error { sub: None, code, message, .. } => {
                        self.last_error = Some(format!("auth refused: {code}: {message}"));
                        return Err(true);
                    }
                    _ => {}
                }
            }
        }
    }

    fn schedule_refresh(&mut self, expires_at: u64) {
        if !self.tokens.can_refresh() {
            self.refresh_at = None;
            return;
        }
        let left = expires_at.saturating_sub(now_secs());
        let margin = REFRESH_MARGIN_SECS.min(left / 2);
        self.refresh_at = Some(Instant::now() + Duration::from_secs(left - margin));
    }

    async fn connection(&mut self, stale_token: bool) -> Lost {
        // An answer to a request of the last connection can no longer come.
        self.before_change.clear();
        let ws_url = format!("{}/v1/ws", self.nodes.current().trim_end_matches('/').replacen("http", "ws", 1));
        let mut socket = match timeout(HANDSHAKE_TIMEOUT, tokio_tungstenite::connect_async(ws_url.as_str())).await {
            Ok(Ok((socket, _))) => socket,
            Ok(Err(error)) => {
                self.last_error = Some(format!("connecting to {ws_url}: {error}"));
                return Lost::Retry { healthy: false, stale_token };
            }
            Err(_) => {
                self.last_error = Some(format!("connecting to {ws_url}: timed out"));
                return Lost::Retry { healthy: false, stale_token };
            }
        };
        // The session to resume is the previous connection's, read before this welcome replaces it.
        let resume_session = self.state.session.clone();
        let welcome = match timeout(HANDSHAKE_TIMEOUT, Self::next_frame(&mut socket)).await {
            Ok(Some(frame)) => self.state.handle_frame(&frame),
            _ => return Lost::Retry { healthy: false, stale_token },
        };
        let Some(Event::Welcome { auth, .. }) = welcome.into_iter().next() else {
            return Lost::Retry { healthy: false, stale_token };
        };
        if auth == WelcomeAuth::Required || (self.tokens.has_auth() && auth != WelcomeAuth::None) {
            if let Err(stale) = self.authenticate(&mut socket, stale_token).await {
                // Nothing was resumed on this connection: the next one presents the same
                // session again (it may still be held, and replay).
                self.state.session = resume_session;
                return Lost::Retry { healthy: false, stale_token: stale };
            }
        }
        let entries = self.state.prepare_resume();
        if self.send_resume(&mut socket, resume_session, entries).await.is_err() {
            return Lost::Retry { healthy: false, stale_token: false };
        }
        let session = self.state.session.clone().unwrap_or_default();
        self.last_error = None;
        let url = self.nodes.current().to_owned();
        if !self.served || *self.node.borrow() != url {
            // The failover signal: another node than before serves the client.
            let _ = self.node.send(url);
        }
        self.served = true;
        let _ = self.status.send(ConnectionState::Connected { session });
        self.live(&mut socket).await
    }

    /// Brings every list back on a new connection: one `resume` listing as many as fit
    /// in a client frame (64 KiB), and a fresh `subscribe` for each of the others (their
    /// lists stay as they are until the new subscription's Reset).
    async fn send_resume(
        &mut self,
        socket: &mut Socket,
        session: Option<String>,
        entries: Vec<(String, u64)>,
    ) -> Result<(), ()> {
        let mut listed = Vec::new();
        let mut fresh = Vec::new();
        let mut size = 0;
        for (sub, last_seq) in entries {
            // Never connected before: nothing was applied, so plain subscribes.
            if session.is_none() {
                fresh.push(sub);
                continue;
            }
            let mut entry = self.specs.get(&sub).cloned().unwrap_or_default();
            entry.insert("sub".to_owned(), sub.as_str().into());
            entry.insert("last_seq".to_owned(), last_seq.into());
            // A node that does not know the session (another node's) resets every entry:
            // `min_seq` makes it wait until it has what the list already showed.
            if let Some(floor) = self.state.floor_seq(&sub) {
                entry.insert("min_seq".to_owned(), floor.into());
            }
            let entry = Value::Object(entry);
            let entry_size = entry.to_string().len() + 1;
            if size + entry_size > RESUME_BUDGET_BYTES {
                self.state.resubscribe(&sub);
                fresh.push(sub);
            } else {
                size += entry_size;
                listed.push(entry);
            }
        }
        if let Some(session) = session {
            if !listed.is_empty() || !fresh.is_empty() {
                send(socket, json!({"op": "resume", "session": session, "subs": listed})).await?;
            }
        }
        for sub in fresh {
            send(socket, self.subscribe_message(&sub)).await?;
        }
        Ok(())
    }

    async fn live(&mut self, socket: &mut Socket) -> Lost {
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        loop {
            let refresh_at = self.refresh_at.unwrap_or(far);
            tokio::select! {
                message = socket.next() => {
                    let frame = match message {
                        Some(Ok(Message::Text(text))) => text,
                        Some(Ok(Message::Close(close))) => {
                            let code = close.map(|close| close.code);
                            return Lost::Retry { healthy: true, stale_token: code == Some(CloseCode::from(4401)) };
                        }
                        Some(Ok(_)) => continue,
                        None | Some(Err(_)) => return Lost::Retry { healthy: true, stale_token: false },
                    };
                    let events = match serde_json::from_str::<Value>(frame.as_str()) {
                        Ok(frame) => self.state.handle_frame(&frame),
                        Err(error) => vec![Event::Protocol { message: format!("a frame that is not JSON: {error}"), sub: None }],
                    };
                    for event in events {
                        if let Err(lost) = self.on_event(socket, event).await {
                            return lost;
                        }
                    }
                }
                command = self.commands.recv() => {
                    let Some(command) = command else {
                        let _ = socket.close(None).await;
                        return Lost::Shutdown;
                    };
                    if self.on_command(socket, command).await.is_err() {
                        return Lost::Retry { healthy: true, stale_token: false };
                    }
                }
                _ = sleep_until(refresh_at) => {
                    self.refresh_at = None;
                    if self.refresh(socket).await.is_err() {
                        return Lost::Retry { healthy: true, stale_token: false };
                    }
                }
            }
        }
    }

    /// Sends a fresh token on the live connection; `authed` comes back as a frame.
    async fn refresh(&mut self, socket: &mut Socket) -> Result<(), ()> {
        match self.tokens.refresh().await {
            Ok(Some(token)) => send(socket, json!({"op": "auth", "token": token})).await,
            // The provider failed: try again shortly; the grace period is 30 s.
            _ => {
                self.refresh_at = Some(Instant::now() + Duration::from_secs(2));
                Ok(())
            }
        }
    }

    async fn on_event(&mut self, socket: &mut Socket, event: Event) -> Result<(), Lost> {
        let lost = Lost::Retry { healthy: true, stale_token: false };
        match event {
            Event::Gap { sub, expected_seq, got_seq } => {
                self.recover(socket, sub, "gap", format!("expected seq {expected_seq}, got {got_seq}")).await?;
            }
            Event::InvalidDiffs { sub, seq, message } => {
                self.recover(socket, sub, "invalid_diffs", format!("the diffs of seq {seq} do not apply: {message}"))
                    .await?;
            }
            Event::DigestMismatch { sub, seq, expected, got } => {
                let message = format!("after seq {seq} the list's digest is {got}, the server's {expected}");
                self.recover(socket, sub, "digest_mismatch", message).await?;
            }
            Event::Protocol { sub: Some(sub), message } => self.recover(socket, sub, "protocol", message).await?,
            Event::Change { sub, .. } => {
                self.recoveries.remove(&sub);
            }
            // A frame that names no list may have belonged to any: a new connection and a
            // resume replays (or resets) every list from its last applied `seq`.
            Event::Protocol { sub: None, .. } => return Err(lost),
            Event::AuthExpired { .. } => {
                self.refresh(socket).await.map_err(|_| lost)?;
            }
            Event::Authed(identity) => self.schedule_refresh(identity.expires_at),
            Event::Unsubscribed { sub } | Event::Ended { sub, .. } if !self.state.contains(&sub) => {
                self.drop_spec(&sub);
            }
            Event::Error { sub: Some(sub), .. } if !self.state.contains(&sub) => {
                self.drop_spec(&sub);
            }
            Event::Error { sub: Some(sub), refused: Some(Refused::Request), code, message, .. } => {
                if let Some(before) = self.before_change.remove(&sub) {
                    self.specs.insert(sub.clone(), before);
                }
                if let Some(sink) = self.state.sink_mut(&sub) {
                    sink.note_error(format!("{code}: {message}"));
                }
            }
            Event::Resumed { failed, .. } => {
                for (sub, _, _) in failed {
                    self.drop_spec(&sub);
                }
            }
            // This node lags what the list showed: move on (the core kept the list, and
            // the next connection's resume asks for the same `min_seq`).
            Event::Behind { .. } => return Err(lost),
            _ => {}
        }
        Ok(())
    }

    /// A list lost a frame (or could not read one): it subscribes again under the same id
    /// and keeps its items until the new subscription's Reset replaces them. After
    /// `MAX_RECOVERIES` in a row with no frame applied in between (items that never
    /// decode into `T`, say), the list ends with the last error instead of looping.
    async fn recover(&mut self, socket: &mut Socket, sub: String, code: &str, message: String) -> Result<(), Lost> {
        let lost = || Lost::Retry { healthy: true, stale_token: false };
        if !matches!(self.state.phase(&sub), Some(Phase::Live | Phase::Subscribing)) {
            // An `unsubscribed` is awaited for it, and may have been this very frame:
            // only a new connection (and its resume) can tell.
            return Err(lost());
        }
        let attempts = self.recoveries.entry(sub.clone()).or_insert(0);
        *attempts += 1;
        if *attempts > MAX_RECOVERIES {
            self.recoveries.remove(&sub);
            if let Some(sink) = self.state.sink_mut(&sub) {
                let message = format!("{message} (gave up after {MAX_RECOVERIES} fresh subscriptions)");
                sink.end(Ended { reason: code.to_owned(), message });
            }
            self.state.unsubscribe(&sub);
            self.drop_spec(&sub);
            return send(socket, json!({"op": "unsubscribe", "sub": sub})).await.map_err(|_| lost());
        }
        if let Some(sink) = self.state.sink_mut(&sub) {
            sink.note_error(format!("{code}: {message}; subscribing again"));
        }
        self.state.restart(&sub);
        send(socket, json!({"op": "unsubscribe", "sub": sub})).await.map_err(|_| lost())?;
        send(socket, self.subscribe_message(&sub)).await.map_err(|_| lost())
    }

    async fn on_command(&mut self, socket: &mut Socket, command: Command) -> Result<(), ()> {
        match command {
            Command::Subscribe { sub, message, sink } => {
                self.state.subscribe(&sub, sink);
                self.specs.insert(sub.clone(), message);
                send(socket, self.subscribe_message(&sub)).await
            }
            Command::SetRange { sub, offset, limit } => {
                let Some(spec) = self.specs.get_mut(&sub) else { return Ok(()) };
                self.before_change.insert(sub.clone(), spec.clone());
                place_by_offset(spec, offset, limit);
                send(socket, json!({"op": "set_range", "sub": sub, "offset": offset, "limit": limit})).await
            }
            Command::SetView { sub, filter, sort } => {
                let Some(spec) = self.specs.get_mut(&sub) else { return Ok(()) };
                self.before_change.insert(sub.clone(), spec.clone());
                spec.insert("filter".to_owned(), filter.clone().unwrap_or(Value::Null));
                spec.insert("sort".to_owned(), sort.clone().unwrap_or(Value::Null));
                send(socket, json!({"op": "set_view", "sub": sub, "filter": filter, "sort": sort})).await
            }
            Command::Unsubscribe { sub } => {
                self.drop_spec(&sub);
                self.state.unsubscribe(&sub);
                send(socket, json!({"op": "unsubscribe", "sub": sub})).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_max_with_bounded_jitter() {
        let backoff = Backoff { min: Duration::from_millis(100), max: Duration::from_secs(1) };
        for (attempt, base_ms) in [(0, 100), (1, 200), (2, 400), (3, 800), (4, 1000), (30, 1000)] {
            let delay = backoff.delay(attempt).as_millis();
            assert!((base_ms..=base_ms * 5 / 4).contains(&delay), "attempt {attempt}: {delay} ms");
        }
    }
}
