//! Subscribers: one WebSocket each, its copy of the window and its checks.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fastwebsockets::{FragmentCollector, Frame, OpCode, Payload};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper::header::{CONNECTION, HOST, UPGRADE};
use hyper::upgrade::Upgraded;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};

use super::stats::{ms, Clock, Histogram};
use super::wire::{AuthReply, FrameKind, Item, ItemFields, ServerFrame, WelcomeAuth, WireDiff};
use super::{Result, CLOSE_TIMEOUT, MAX_SERVER_FRAME_BYTES, WELCOME_TIMEOUT};

/// Which fields of an item carry the update's number and its send time.
#[derive(Clone, Copy)]
pub struct UpdateMarks {
    pub number: fn(&ItemFields) -> Option<u64>,
    pub stamp_us: fn(&ItemFields) -> Option<u64>,
}

/// Seconds of the process clock a [`Timeline`] covers (the longest write phase
/// plus set-up); later samples go into the last second.
pub const TIMELINE_SECONDS: usize = 4096;

/// End-to-end latency per second of send time, coarse enough to keep for an hour:
/// it shows whether the tail is spread evenly or comes in bursts.
pub struct Timeline {
    pub seconds: Vec<TimelineSecond>,
}

#[derive(Default)]
pub struct TimelineSecond {
    pub n_samples: AtomicU64,
    pub over_5ms: AtomicU64,
    pub over_10ms: AtomicU64,
    pub over_25ms: AtomicU64,
    pub max_us: AtomicU64,
    /// The wake meter's latest wake-up in this second (see `WakeMeter`).
    pub wake_max_us: AtomicU64,
}

impl Default for Timeline {
    fn default() -> Timeline {
        Timeline::new()
    }
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline { seconds: (0..TIMELINE_SECONDS).map(|_| TimelineSecond::default()).collect() }
    }

    pub fn record(&self, sent_us: u64, latency_us: u64) {
        let second = &self.seconds[((sent_us / 1_000_000) as usize).min(TIMELINE_SECONDS - 1)];
        second.n_samples.fetch_add(1, Ordering::Relaxed);
        for (threshold_us, counter) in
            [(5_000, &second.over_5ms), (10_000, &second.over_10ms), (25_000, &second.over_25ms)]
        {
            if latency_us > threshold_us {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        second.max_us.fetch_max(latency_us, Ordering::Relaxed);
    }

    pub fn record_wake(&self, woke_us: u64, late_us: u64) {
        let second = &self.seconds[((woke_us / 1_000_000) as usize).min(TIMELINE_SECONDS - 1)];
        second.wake_max_us.fetch_max(late_us, Ordering::Relaxed);
    }

    pub fn print(&self) {
        println!(
            "  timeline (second of send time: updates, share over 5 / 10 / 25 ms, max; the machine's latest 1 ms wake-up in that second):"
        );
        for (index, second) in self.seconds.iter().enumerate() {
            let n = second.n_samples.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            let share = |counter: &AtomicU64| 100.0 * counter.load(Ordering::Relaxed) as f64 / n as f64;
            println!(
                "    {index:>4} s: {n:>7}  {:>5.1} % {:>5.1} % {:>5.1} %  max {:>9}  wake-up late by {}",
                share(&second.over_5ms),
                share(&second.over_10ms),
                share(&second.over_25ms),
                ms(second.max_us.load(Ordering::Relaxed)),
                ms(second.wake_max_us.load(Ordering::Relaxed)),
            );
        }
    }
}

/// Counters of all subscribers together, read live by the main task.
pub struct DeliveryCounters {
    pub frames: AtomicU64,
    pub diffs: AtomicU64,
    pub bytes: AtomicU64,
    pub subscribed: AtomicU64,
    pub failed: AtomicU64,
    pub latency_us: Histogram,
    pub timeline: Timeline,
}

impl Default for DeliveryCounters {
    fn default() -> DeliveryCounters {
        DeliveryCounters::new()
    }
}

impl DeliveryCounters {
    pub fn new() -> DeliveryCounters {
        DeliveryCounters {
            frames: AtomicU64::new(0),
            diffs: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            subscribed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            latency_us: Histogram::new(),
            timeline: Timeline::new(),
        }
    }

    pub fn snapshot(&self) -> DeliverySnapshot {
        DeliverySnapshot {
            frames: self.frames.load(Ordering::Relaxed),
            diffs: self.diffs.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

#[derive(Clone, Copy, Default)]
pub struct DeliverySnapshot {
    pub frames: u64,
    pub diffs: u64,
    pub bytes: u64,
}

pub struct SubscriberSpec {
    pub authority: String,
    pub collection: String,
    pub sort_field: &'static str,
    pub window_limit: usize,
    pub marks: UpdateMarks,
    /// Update numbers above this are a corrupted item, not a reason to grow the bitmap.
    pub max_update_number: u64,
    /// With `--auth`: who this subscriber is.
    pub auth: Option<SubscriberAuth>,
    /// The filter (JSON) of its subscription, if any.
    pub filter: Option<String>,
    /// The projection (a JSON array of field names), if not the default one.
    pub fields: Option<&'static str>,
}

/// A subscriber's own identity: its reader token and the `sub` it names.
pub struct SubscriberAuth {
    pub sub: String,
    pub token: Arc<str>,
}

/// Which update numbers a subscriber has received: a bitmap, so that memory is
/// one bit per update of its collection however often items are re-sent.
pub struct SeenUpdates {
    pub words: Vec<u64>,
    pub n_seen: u64,
    pub max_number: u64,
}

impl SeenUpdates {
    /// `Ok(true)` the first time `number` is inserted.
    pub fn insert(&mut self, number: u64) -> std::result::Result<bool, String> {
        if number > self.max_number {
            return Err(format!("update number {number} above the {} the writer can have sent", self.max_number));
        }
        let word = (number / 64) as usize;
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        let bit = 1u64 << (number % 64);
        let fresh = self.words[word] & bit == 0;
        self.words[word] |= bit;
        self.n_seen += u64::from(fresh);
        Ok(fresh)
    }

    pub fn contains(&self, number: u64) -> bool {
        self.words.get((number / 64) as usize).is_some_and(|word| word & (1u64 << (number % 64)) != 0)
    }
}

/// What a subscriber hands back when it stops.
pub struct SubscriberOutcome {
    pub list: Vec<Item>,
    /// The numbers of the updates received, each once.
    pub seen: SeenUpdates,
    pub resets_after_first: u64,
    pub seq_gaps: u64,
    pub protocol_errors: u64,
    pub error_frames: u64,
    pub subscribed: bool,
    pub closed: Option<String>,
    pub first_problem: Option<String>,
}

/// One subscription's client side: its copy of the window and its checks.
pub struct Subscriber {
    spec: SubscriberSpec,
    outcome: SubscriberOutcome,
    last_seq: u64,
}

impl Subscriber {
    pub fn new(spec: SubscriberSpec) -> Subscriber {
        let max_number = spec.max_update_number;
        Subscriber {
            spec,
            outcome: SubscriberOutcome {
                list: Vec::new(),
                seen: SeenUpdates { words: Vec::new(), n_seen: 0, max_number },
                resets_after_first: 0,
                seq_gaps: 0,
                protocol_errors: 0,
                error_frames: 0,
                subscribed: false,
                closed: None,
                first_problem: None,
            },
            last_seq: 0,
        }
    }

    pub fn note(&mut self, problem: String) {
        if self.outcome.first_problem.is_none() {
            self.outcome.first_problem = Some(format!("{}: {problem}", self.spec.collection));
        }
    }

    pub fn protocol_error(&mut self, problem: String) {
        self.outcome.protocol_errors += 1;
        self.note(problem);
    }

    pub fn into_outcome(self) -> SubscriberOutcome {
        self.outcome
    }

    pub async fn run(
        mut self,
        counters: Arc<DeliveryCounters>,
        clock: Clock,
        connect_gate: Arc<Semaphore>,
        mut stop: watch::Receiver<bool>,
    ) -> SubscriberOutcome {
        let connected = {
            let _permit = connect_gate.acquire().await;
            self.connect_and_subscribe().await
        };
        let mut socket = match connected {
            Ok(socket) => socket,
            Err(error) => {
                self.outcome.closed = Some(format!("{}: {error}", self.spec.collection));
                counters.failed.fetch_add(1, Ordering::Relaxed);
                return self.into_outcome();
            }
        };
        loop {
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                read = socket.read_frame() => match read {
                    Err(error) => {
                        self.outcome.closed = Some(format!("{}: {error}", self.spec.collection));
                        break;
                    }
                    Ok(frame) => match frame.opcode {
                        OpCode::Text => {
                            let now_us = clock.now_us();
                            self.on_text(&frame.payload, now_us, &counters);
                        }
                        OpCode::Close => {
                            let code = frame.payload.get(..2).map(|code| u16::from_be_bytes([code[0], code[1]]));
                            self.outcome.closed = Some(format!("{}: closed by the server, code {code:?}", self.spec.collection));
                            break;
                        }
                        OpCode::Binary => self.protocol_error("a binary frame".to_string()),
                        _ => {}
                    },
                },
            }
        }
        if self.outcome.closed.is_none() {
            // A normal closure (1000), as a client leaving would, so that the
            // server does not hold the session for a resume that never comes.
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, socket.write_frame(Frame::close(1000, b""))).await;
        }
        if !self.outcome.subscribed {
            counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.into_outcome()
    }

    pub async fn connect_and_subscribe(&mut self) -> Result<FragmentCollector<TokioIo<Upgraded>>> {
        let stream = TcpStream::connect(&self.spec.authority).await?;
        stream.set_nodelay(true)?;
        let request = Request::builder()
            .method("GET")
            .uri("/v1/ws")
            .header(HOST, &self.spec.authority)
            .header(UPGRADE, "websocket")
            .header(CONNECTION, "upgrade")
            .header("Sec-WebSocket-Key", fastwebsockets::handshake::generate_key())
            .header("Sec-WebSocket-Version", "13")
            .body(Empty::<Bytes>::new())?;
        let (mut socket, _response) = fastwebsockets::handshake::client(&SpawnExecutor, request, stream).await?;
        socket.set_auto_close(true);
        socket.set_auto_pong(true);
        socket.set_max_message_size(MAX_SERVER_FRAME_BYTES);
        let mut socket = FragmentCollector::new(socket);

        // The server speaks first, with `welcome`.
        let welcome = tokio::time::timeout(WELCOME_TIMEOUT, socket.read_frame())
            .await
            .map_err(|_| format!("no welcome frame within {WELCOME_TIMEOUT:?}"))??;
        if welcome.opcode != OpCode::Text {
            return Err(format!("first frame is {:?}, not a text welcome", welcome.opcode).into());
        }
        let frame: ServerFrame = serde_json::from_slice(&welcome.payload)
            .map_err(|error| format!("unparsable welcome ({error}): {}", preview(&welcome.payload)))?;
        if frame.kind != FrameKind::Welcome {
            return Err(format!("first frame is not a welcome: {}", preview(&welcome.payload)).into());
        }
        let welcome_auth = serde_json::from_slice::<WelcomeAuth>(&welcome.payload)?.auth;
        let auth_required = welcome_auth.as_ref().and_then(serde_json::Value::as_str) == Some("required");
        match (&self.spec.auth, auth_required) {
            (Some(auth), true) => Self::authenticate(&mut socket, auth).await?,
            (Some(_), false) => {
                return Err(format!("--auth, but the server's welcome says `auth`: {welcome_auth:?}").into());
            }
            (None, true) => {
                return Err("the server requires auth (welcome `auth`: \"required\"): run with --auth".into())
            }
            (None, false) => {}
        }

        let filter = self.spec.filter.as_ref().map_or(String::new(), |filter| format!(r#""filter":{filter},"#));
        let fields = self.spec.fields.map_or(String::new(), |fields| format!(r#""fields":{fields},"#));
        let subscribe = format!(
            r#"{{"op":"subscribe","sub":"s","collection":"{}",{filter}{fields}"sort":[{{"field":"{}","dir":"desc"}}],"offset":0,"limit":{}}}"#,
            self.spec.collection, self.spec.sort_field, self.spec.window_limit
        );
        socket.write_frame(Frame::text(Payload::Owned(subscribe.into_bytes()))).await?;
        Ok(socket)
    }

    /// What a browser client does after `welcome` says auth is required: sends
    /// its token in an `auth` message and waits for `authed` before subscribing.
    pub async fn authenticate(socket: &mut FragmentCollector<TokioIo<Upgraded>>, auth: &SubscriberAuth) -> Result<()> {
        let message = format!(r#"{{"op":"auth","token":{}}}"#, serde_json::to_string(&*auth.token)?);
        socket.write_frame(Frame::text(Payload::Owned(message.into_bytes()))).await?;
        let reply = tokio::time::timeout(WELCOME_TIMEOUT, socket.read_frame())
            .await
            .map_err(|_| format!("no answer to `auth` within {WELCOME_TIMEOUT:?}"))??;
        if reply.opcode != OpCode::Text {
            return Err(format!("the answer to `auth` is {:?}, not text", reply.opcode).into());
        }
        let parsed: AuthReply = serde_json::from_slice(&reply.payload)
            .map_err(|error| format!("unparsable answer to `auth` ({error}): {}", preview(&reply.payload)))?;
        match parsed.kind.as_str() {
            "authed" if parsed.sub.as_deref() == Some(auth.sub.as_str()) => Ok(()),
            "error" => Err(format!(
                "`auth` refused: {}: {}",
                parsed.code.unwrap_or_default(),
                parsed.message.unwrap_or_default()
            )
            .into()),
            _ => Err(format!("unexpected answer to `auth` as {}: {}", auth.sub, preview(&reply.payload)).into()),
        }
    }

    pub fn on_text(&mut self, payload: &[u8], now_us: u64, counters: &DeliveryCounters) {
        counters.bytes.fetch_add(payload.len() as u64, Ordering::Relaxed);
        let frame: ServerFrame = match serde_json::from_slice(payload) {
            Ok(frame) => frame,
            Err(error) => {
                self.protocol_error(format!("unparsable frame ({error}): {}", preview(payload)));
                return;
            }
        };
        match frame.kind {
            FrameKind::Diffs => self.on_diffs(frame.seq, frame.diffs, now_us, counters),
            FrameKind::Error => {
                self.outcome.error_frames += 1;
                let (code, message) = (frame.code.unwrap_or_default(), frame.message.unwrap_or_default());
                self.note(format!("error frame `{code}`: {message}"));
            }
            other => self.protocol_error(format!("unexpected `{other:?}` frame: {}", preview(payload))),
        }
    }

    pub fn on_diffs(&mut self, seq: Option<u64>, diffs: Vec<WireDiff>, now_us: u64, counters: &DeliveryCounters) {
        counters.frames.fetch_add(1, Ordering::Relaxed);
        counters.diffs.fetch_add(diffs.len() as u64, Ordering::Relaxed);
        let expected_seq = self.last_seq + 1;
        match seq {
            Some(seq) if seq == expected_seq => self.last_seq = seq,
            Some(seq) => {
                self.outcome.seq_gaps += 1;
                self.note(format!("frame seq {seq}, expected {expected_seq}"));
                self.last_seq = seq;
            }
            None => {
                self.protocol_error("a diffs frame without seq".to_string());
                self.last_seq = expected_seq;
            }
        }
        let is_first = !self.outcome.subscribed;
        if is_first && !(diffs.len() == 1 && matches!(diffs[0], WireDiff::Reset { .. })) {
            self.protocol_error(format!("first frame is not a single Reset but {} diffs", diffs.len()));
        }
        for diff in diffs {
            if let Err(problem) = self.apply(diff, is_first, now_us, counters) {
                self.protocol_error(problem);
            }
        }
        if self.outcome.list.len() > self.spec.window_limit {
            let length = self.outcome.list.len();
            self.protocol_error(format!("list of {length} items in a window of {}", self.spec.window_limit));
        }
        if is_first {
            self.outcome.subscribed = true;
            counters.subscribed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Applies one diff with `VectorDiff` semantics, checking every index first.
    pub fn apply(
        &mut self,
        diff: WireDiff,
        is_first_frame: bool,
        now_us: u64,
        counters: &DeliveryCounters,
    ) -> std::result::Result<(), String> {
        let length = self.outcome.list.len();
        match diff {
            WireDiff::Append { values } => {
                for value in &values {
                    self.arrive(value, now_us, counters)?;
                }
                self.outcome.list.extend(values);
            }
            WireDiff::Clear {} => self.outcome.list.clear(),
            WireDiff::PushFront { value } => {
                self.arrive(&value, now_us, counters)?;
                self.outcome.list.insert(0, value);
            }
            WireDiff::PushBack { value } => {
                self.arrive(&value, now_us, counters)?;
                self.outcome.list.push(value);
            }
            WireDiff::PopFront {} => {
                if length == 0 {
                    return Err("PopFront on an empty list".to_string());
                }
                self.outcome.list.remove(0);
            }
            WireDiff::PopBack {} => {
                if self.outcome.list.pop().is_none() {
                    return Err("PopBack on an empty list".to_string());
                }
            }
            WireDiff::Insert { index, value } => {
                if index > length {
                    return Err(format!("Insert at {index} in a list of {length}"));
                }
                self.arrive(&value, now_us, counters)?;
                self.outcome.list.insert(index, value);
            }
            WireDiff::Set { index, value } => {
                if index >= length {
                    return Err(format!("Set at {index} in a list of {length}"));
                }
                self.arrive(&value, now_us, counters)?;
                self.outcome.list[index] = value;
            }
            WireDiff::Remove { index } => {
                if index >= length {
                    return Err(format!("Remove at {index} in a list of {length}"));
                }
                self.outcome.list.remove(index);
            }
            WireDiff::Truncate { length: new_length } => {
                if new_length > length {
                    return Err(format!("Truncate to {new_length} a list of {length}"));
                }
                self.outcome.list.truncate(new_length);
            }
            WireDiff::Reset { values } => {
                if !is_first_frame {
                    self.outcome.resets_after_first += 1;
                }
                for value in &values {
                    self.arrive(value, now_us, counters)?;
                }
                self.outcome.list = values;
            }
        }
        Ok(())
    }

    /// An item reached the client: if it carries an update not seen before,
    /// that update has arrived now.
    pub fn arrive(&mut self, item: &Item, now_us: u64, counters: &DeliveryCounters) -> std::result::Result<(), String> {
        let Some(number) = (self.spec.marks.number)(&item.fields) else {
            return Err(format!("item {} has no update number", item.id));
        };
        // Number 0 marks an item as loaded, never updated.
        if number == 0 || !self.outcome.seen.insert(number)? {
            return Ok(());
        }
        let Some(stamp_us) = (self.spec.marks.stamp_us)(&item.fields) else {
            return Err(format!("item {} has an update number but no send time", item.id));
        };
        counters.latency_us.record(now_us.saturating_sub(stamp_us));
        counters.timeline.record(stamp_us, now_us.saturating_sub(stamp_us));
        Ok(())
    }
}

/// hyper's handshake drives the connection on a task of the current runtime.
pub struct SpawnExecutor;

impl<F> hyper::rt::Executor<F> for SpawnExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::spawn(future);
    }
}

/// The start of a frame, for messages.
pub fn preview(payload: &[u8]) -> String {
    const PREVIEW_BYTES: usize = 300;
    let text = String::from_utf8_lossy(&payload[..payload.len().min(PREVIEW_BYTES)]).into_owned();
    if payload.len() > PREVIEW_BYTES {
        text + "…"
    } else {
        text
    }
}
