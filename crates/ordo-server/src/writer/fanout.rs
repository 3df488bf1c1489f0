//! The writer thread's diff sink (`Fanout`): the sessions and subscriptions it
//! serves, the engine windows they share, and where each window change's
//! encoded frame goes (`FanoutTarget`). Each changed window's diffs are encoded
//! once and the shared bytes queued to every subscriber, within each
//! connection's outbound budget: a frame that would push a connection past it
//! raises the connection's epoch and marks its subscriptions for a reset.
//! Each frame carries the window digest when due (`digest_due`), hashed from
//! the window's contents as the engine reads them after the change.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use ordo_core::{CollectionId, DiffRef, DiffSink, ItemList, WindowId};

use super::{Answer, ConnShared, FrameBody, Outbox, Outgoing, SessionId, SubHandle, FRAME_OVERHEAD_BYTES};
use crate::digest::window_digest;
use crate::encode::{write_diff, write_items};
use crate::frame::DiffsExtra;
use crate::limits::DIGEST_WINDOW_ROWS_MAX;
use crate::metrics::{self, METRICS};
use crate::wire::{Projection, WindowSpec};

pub(super) struct SessionState {
    pub(super) shared: Arc<ConnShared>,
    pub(super) outbox: Outbox,
    pub(super) subs: HashMap<SubHandle, SubState>,
}

pub(super) struct SubState {
    pub(super) window: WindowId,
    /// A reset is due (the connection fell behind): diffs are not queued meanwhile.
    pub(super) needs_reset: bool,
    /// The last `total` queued for this subscription. Kept per subscription, not
    /// per window: subscribers of one window joined at different times, and each
    /// is told the total on its own first frame. Every frame after it is queued
    /// (or dropped only together with a reset that carries a total again), and a
    /// resume replays the frames as sent, so the client saw exactly this value.
    pub(super) last_total: Option<usize>,
    /// Where a key-positioned request placed the window, told to the client on the
    /// next frame queued for this subscription (the answer, or a later reset when
    /// the answer could not be queued).
    pub(super) range_due: Option<(usize, usize)>,
    /// The subscription asked for the window digest (`"digest": true`), which
    /// windows larger than `DIGEST_WINDOW_ROWS_MAX` carry only when asked.
    pub(super) wants_digest: bool,
}

/// Whether a frame of a window of `limit` rows carries the window digest for a
/// subscription: always up to `DIGEST_WINDOW_ROWS_MAX` rows, above only when asked.
pub(super) fn digest_due(limit: usize, wants_digest: bool) -> bool {
    limit <= DIGEST_WINDOW_ROWS_MAX || wants_digest
}

/// An engine window and the subscriptions that share it (identical collection,
/// view, range and projection: the leaderboard case).
pub(super) struct SharedWindow {
    pub(super) collection: CollectionId,
    pub(super) spec: WindowSpec,
    pub(super) share_key: Option<String>,
    pub(super) subscribers: Vec<(SessionId, SubHandle)>,
}

/// Where the frames being encoded go: the writer sets it before each engine
/// call that may report diffs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum FanoutTarget {
    /// Every subscriber of the window.
    Subscribers,
    /// One subscription only (its first frame, a reset, a private change).
    Only(SessionId, SubHandle),
    /// Items of a Reset go into `captured` (one-shot queries).
    Capture,
    /// Nothing is queued; the window's digest goes into `digest` (the empty
    /// frame that answers a request that changed nothing carries it too).
    DigestOnly,
    Discard,
}

/// The writer thread's diff sink: encodes each window's diffs once and fans the
/// bytes out.
pub(super) struct Fanout {
    pub(super) sessions: HashMap<SessionId, SessionState>,
    pub(super) windows: HashMap<WindowId, SharedWindow>,
    pub(super) windows_by_key: HashMap<String, WindowId>,
    pub(super) target: FanoutTarget,
    /// The window whose diffs are being encoded into `body`.
    current: Option<WindowId>,
    body: Vec<u8>,
    n_diffs: u32,
    is_reset: bool,
    /// The digest of the window being encoded, once the engine gave its contents.
    pub(super) digest: Option<u64>,
    /// The limit of the window being encoded, as the engine told it (`wants_contents`).
    window_limit: usize,
    /// The view length of the window being encoded (see `DiffSink::view_len`).
    view_len: usize,
    pub(super) captured: Vec<u8>,
    pub(super) capture_projection: Option<Projection>,
    pub(super) outbound_budget: usize,
    /// The `seq` of the batch being applied, or of the last one applied: what
    /// every frame encoded now reflects.
    pub(super) write_seq: u64,
    /// The request being handled and its subscription, until a frame of that
    /// subscription is queued (its diffs, or the empty frame of a key-positioned
    /// request that changed nothing): that frame answers it.
    pub(super) answer: Option<((SessionId, SubHandle), Answer)>,
    /// The relationships views of collections read by relationship depend on.
    pub(super) relations: super::relations::RelationWatches,
}

impl DiffSink for Fanout {
    fn begin_batch(&mut self, seq: u64) {
        self.write_seq = seq;
    }

    fn diff(&mut self, window: WindowId, diff: DiffRef<'_>) {
        match self.target {
            FanoutTarget::Discard | FanoutTarget::DigestOnly => return,
            FanoutTarget::Capture => {
                if let (DiffRef::Reset { values }, Some(projection)) = (diff, &self.capture_projection) {
                    write_items(&mut self.captured, values, projection);
                }
                return;
            }
            FanoutTarget::Subscribers | FanoutTarget::Only(..) => {}
        }
        let Some(shared) = self.windows.get(&window) else { return };
        if self.current != Some(window) {
            self.current = Some(window);
            self.body.clear();
            self.body.push(b'[');
            self.n_diffs = 0;
            self.is_reset = false;
            self.digest = None;
        }
        if self.n_diffs > 0 {
            self.body.push(b',');
        }
        write_diff(&mut self.body, diff, &shared.spec.projection);
        self.n_diffs += 1;
        self.is_reset |= matches!(diff, DiffRef::Reset { .. });
    }

    fn wants_contents(&mut self, window: WindowId, limit: usize) -> bool {
        self.window_limit = limit;
        match self.target {
            FanoutTarget::DigestOnly => true,
            FanoutTarget::Capture | FanoutTarget::Discard => false,
            _ if self.current != Some(window) => false,
            _ if limit <= DIGEST_WINDOW_ROWS_MAX => true,
            // A large window: hashed only when a subscriber the frame goes to asked.
            FanoutTarget::Only(session, handle) => self.sub(session, handle).is_some_and(|sub| sub.wants_digest),
            FanoutTarget::Subscribers => self.windows.get(&window).is_some_and(|shared| {
                shared
                    .subscribers
                    .iter()
                    .any(|&(session, handle)| self.sub(session, handle).is_some_and(|sub| sub.wants_digest))
            }),
        }
    }

    fn window_contents(&mut self, _window: WindowId, items: ItemList<'_>) {
        self.digest = Some(window_digest(items));
    }

    fn view_len(&mut self, window: WindowId, view_len: usize) {
        if view_len == 0 && self.relations.is_watch(window) {
            self.relation_emptied(window);
        }
        if self.current == Some(window) {
            self.view_len = view_len;
        }
    }

    fn window_done(&mut self, window: WindowId) {
        if self.current != Some(window) {
            return;
        }
        self.current = None;
        self.body.push(b']');
        // The one copy per window change, into a recycled body: every subscriber shares it.
        let body = FrameBody::copy_from(&self.body);
        metrics::add(&METRICS.frames_encoded, 1);
        let frame = FrameMeta {
            n_diffs: self.n_diffs,
            is_reset: self.is_reset,
            write_seq: self.write_seq,
            view_len: self.view_len,
            digest: self.digest.take(),
            digest_to_all: digest_due(self.window_limit, false),
            queued_at: Instant::now(),
        };
        match self.target {
            FanoutTarget::Subscribers => {
                let Some(shared) = self.windows.get(&window) else { return };
                // Indexing by position keeps the borrow of `windows` short.
                for index in 0..shared.subscribers.len() {
                    let (session, handle) = self.windows[&window].subscribers[index];
                    self.push(session, handle, body.clone(), frame);
                }
            }
            FanoutTarget::Only(session, handle) => self.push(session, handle, body, frame),
            FanoutTarget::Capture | FanoutTarget::DigestOnly | FanoutTarget::Discard => {}
        }
    }
}

/// What every copy of one encoded frame shares besides its body.
#[derive(Clone, Copy)]
struct FrameMeta {
    n_diffs: u32,
    is_reset: bool,
    write_seq: u64,
    view_len: usize,
    /// The window digest after the frame, when computed: every subscriber of a
    /// window up to `DIGEST_WINDOW_ROWS_MAX` rows gets it, of a larger one only
    /// those that asked (computed then only if one did).
    digest: Option<u64>,
    /// Every subscriber gets `digest` (the window is small), not only those that asked.
    digest_to_all: bool,
    queued_at: Instant,
}

impl Fanout {
    pub(super) fn new(outbound_budget: usize, write_seq: u64) -> Fanout {
        Fanout {
            sessions: HashMap::new(),
            windows: HashMap::new(),
            windows_by_key: HashMap::new(),
            target: FanoutTarget::Subscribers,
            current: None,
            body: Vec::with_capacity(64 * 1024),
            n_diffs: 0,
            is_reset: false,
            digest: None,
            window_limit: 0,
            view_len: 0,
            captured: Vec::new(),
            capture_projection: None,
            outbound_budget,
            write_seq,
            answer: None,
            relations: Default::default(),
        }
    }

    fn push(&mut self, session_id: SessionId, handle: SubHandle, body: FrameBody, frame: FrameMeta) {
        let Some(session) = self.sessions.get_mut(&session_id) else { return };
        let Some(sub) = session.subs.get_mut(&handle) else { return };
        if sub.needs_reset {
            // Superseded by the reset that is due.
            return;
        }
        let cost = body.len() + FRAME_OVERHEAD_BYTES;
        let queued = session.shared.queued_bytes.load(Ordering::Acquire);
        // A frame larger than the whole budget still goes out when the queue is
        // empty; otherwise a big window could never be sent at all.
        if queued > 0 && queued + cost > self.outbound_budget {
            session.shared.epoch.fetch_add(1, Ordering::AcqRel);
            for sub in session.subs.values_mut() {
                sub.needs_reset = true;
            }
            session.shared.want_drain_notice.store(true, Ordering::Release);
            let _ = session.outbox.send(Outgoing::Wake);
            return;
        }
        session.shared.queued_bytes.fetch_add(cost, Ordering::AcqRel);
        metrics::add(&METRICS.outbound_queued_bytes, cost as u64);
        let epoch = session.shared.epoch.load(Ordering::Acquire);
        let FrameMeta { n_diffs, is_reset, write_seq, view_len, digest, digest_to_all, queued_at } = frame;
        let mut extra =
            DiffsExtra { digest: digest.filter(|_| digest_to_all || sub.wants_digest), ..DiffsExtra::default() };
        if is_reset || sub.last_total != Some(view_len) {
            sub.last_total = Some(view_len);
            extra.total = Some(view_len as u64);
        }
        if let Some((offset, limit)) = sub.range_due.take() {
            extra.range = Some((offset as u64, limit as u64));
        }
        // Only a frame of the subscription whose request is being handled answers
        // it (frames that did not go out above leave it for an `Ack`).
        let answers = match &self.answer {
            Some((answered, _)) if *answered == (session_id, handle) => self.answer.take().map(|(_, answer)| answer),
            _ => None,
        };
        let diffs = Outgoing::Diffs { handle, epoch, body, n_diffs, is_reset, write_seq, answers, extra, queued_at };
        if session.outbox.send(diffs).is_err() {
            // The session's receiver is gone (the session is being dropped).
            session.shared.queued_bytes.fetch_sub(cost, Ordering::AcqRel);
            metrics::sub_queued(cost);
        }
    }

    fn sub(&self, session: SessionId, handle: SubHandle) -> Option<&SubState> {
        self.sessions.get(&session)?.subs.get(&handle)
    }

    pub(super) fn sub_mut(&mut self, session: SessionId, handle: SubHandle) -> Option<&mut SubState> {
        self.sessions.get_mut(&session)?.subs.get_mut(&handle)
    }

    /// Queues a frame with no diffs for one subscription (the answer to a request
    /// that changed nothing but must say where the window is, or its new total),
    /// with `digest` (the caller computed it when due for this subscription).
    pub(super) fn push_empty(&mut self, session: SessionId, handle: SubHandle, view_len: usize, digest: Option<u64>) {
        let body = FrameBody::copy_from(b"[]");
        let write_seq = self.write_seq;
        let frame = FrameMeta {
            n_diffs: 0,
            is_reset: false,
            write_seq,
            view_len,
            digest,
            digest_to_all: true,
            queued_at: Instant::now(),
        };
        self.push(session, handle, body, frame);
    }

    pub(super) fn send(&self, session: SessionId, message: Outgoing) {
        if let Some(state) = self.sessions.get(&session) {
            let _ = state.outbox.send(message);
        }
    }
}

/// The identity under which subscriptions share an engine window (the
/// collection's generation too: a collection created in a dropped one's slot is another).
pub fn share_key(collection: CollectionId, spec: &WindowSpec) -> String {
    // A tail window's offset moves with its view: it is identified by being a tail.
    let offset = if spec.is_tail { "tail".to_owned() } else { spec.offset.to_string() };
    format!(
        "{}.{}|{:?}|{}|{}|{:?}",
        collection.index(),
        collection.generation(),
        spec.def,
        offset,
        spec.limit,
        spec.projection
    )
}
