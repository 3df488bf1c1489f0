//! A connection's subscription state (`Session`), which outlives the connection
//! for resume, and the `Registry` of parked sessions: each belongs to the identity
//! that opened it, and all of them stay within a server-wide and a per-identity
//! memory budget (the oldest go first).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::frame::DiffsExtra;
use crate::limits;
use crate::sub_table::SubTable;
use crate::wire::WindowSpec;
use crate::writer::{ConnShared, FrameBody, OutboxReceiver, SessionId, SubHandle, FRAME_OVERHEAD_BYTES};

/// A subscription as its connection knows it.
pub(super) struct SubEntry {
    pub(super) client_id: String,
    pub(super) collection: Arc<crate::routing::CollectionEntry>,
    pub(super) spec: WindowSpec,
    /// The `seq` of the last frame sent.
    pub(super) seq: u64,
    /// The last frames sent, for replay on resume.
    pub(super) retained: VecDeque<RetainedFrame>,
    pub(super) retained_bytes: usize,
    /// Frames before the next Reset are stale (a resume that could not replay).
    pub(super) awaiting_reset: bool,
    /// The range (`offset`, `limit`) of an answer that was dropped with a stale
    /// frame: the next frame written for this subscription carries it instead.
    pub(super) range_due: Option<(u64, u64)>,
    /// The `req` of the `subscribe` that made it: its first frame carries it.
    pub(super) subscribe_req: Option<Box<str>>,
    /// The `req` of the `unsubscribe` sent for it: `unsubscribed` carries it.
    pub(super) unsubscribe_req: Option<Box<str>>,
}

/// A frame kept for replay: sent again exactly as it was (`write_seq`, `total`
/// and all), but without `req`: the request it answered was the old connection's.
#[derive(Clone, Debug)]
pub(super) struct RetainedFrame {
    pub(super) seq: u64,
    pub(super) write_seq: u64,
    pub(super) body: FrameBody,
    pub(super) n_diffs: u32,
    pub(super) extra: DiffsExtra,
}

impl SubEntry {
    pub(super) fn retain(&mut self, frame: RetainedFrame) {
        self.retained_bytes += frame.body.len();
        self.retained.push_back(frame);
        while self.retained.len() > limits::RETAINED_FRAMES_PER_SUBSCRIPTION
            || self.retained_bytes > limits::RETAINED_BYTES_PER_SUBSCRIPTION
        {
            let dropped = self.retained.pop_front().expect("over a limit, so not empty");
            self.retained_bytes -= dropped.body.len();
        }
    }
}

/// The owner of every session until connections carry identities.
pub const ANONYMOUS_OWNER: &str = "anonymous";

/// A connection's subscription state; it outlives the connection for resume.
pub struct Session {
    pub(super) id: SessionId,
    /// The resume token: 128 random bits, replaced at every resume.
    pub(super) token: String,
    /// The identity that opened the session: parked sessions are budgeted per
    /// owner, and only the same owner may resume one.
    pub(super) owner: Arc<str>,
    pub(super) shared: Arc<ConnShared>,
    pub(super) outbox: OutboxReceiver,
    pub(super) table: SubTable<SubEntry>,
    pub(super) by_client_id: HashMap<String, SubHandle>,
    pub(super) next_handle: SubHandle,
}

impl Session {
    /// The estimated bytes a parked session holds, besides the frames queued for
    /// it (those are read live: they may grow while it is parked). See
    /// `limits::PARKED_WINDOW_ITEM_BYTES`.
    pub(super) fn parked_cost_bytes(&self) -> usize {
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
    pub(super) fn cost_bytes(&self) -> usize {
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
    pub(super) fn remove(&mut self, token: &str) -> Option<ParkedSession> {
        let parked = self.by_token.remove(token)?;
        self.by_age.remove(&parked.parked_index);
        Some(parked)
    }

    /// Drops the oldest sessions until both budgets hold; returns their ids.
    /// One pass, oldest first: a session goes while the total, or its owner's
    /// total, is over budget.
    pub(super) fn evict_over_budget(&mut self) -> Vec<SessionId> {
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
    pub(super) fn park(&self, session: Session, retention: Duration) -> Vec<SessionId> {
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
    pub(super) fn take(&self, token: &str, owner: &str) -> Option<Session> {
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
