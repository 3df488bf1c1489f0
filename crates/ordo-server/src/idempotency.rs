//! Idempotency keys: the answers a node remembers for write requests sent
//! with an `Idempotency-Key` header, so that a client that lost an answer can
//! send the same request again without applying it twice.
//!
//! The table holds, per (identity key, idempotency key), the request's
//! fingerprint and either the first attempt's answer (status and body) or a
//! wake-up for the requests that arrive while the first is in flight. A retry
//! with the same fingerprint gets the answer; one with another fingerprint is
//! refused (`Begin::Reused`). Entry points: [`Idempotency::begin`] and
//! [`Ticket::finish`] (a ticket dropped unfinished frees its key, so that a
//! retry runs the request again).
//!
//! Invariants: every bound holds after each call (`IdempotencyLimits`): a key
//! is forgotten once older than the window, or to make room (oldest answer
//! first, that identity's own first when it is at its bound); a key in flight
//! is never forgotten, so a table full of keys in flight refuses new ones
//! (`Begin::Full`). The table lives in one process's memory: see
//! docs/PROTOCOL.md, "Idempotency keys", for what that leaves out.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

/// The longest `Idempotency-Key` value, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;
/// How long an answer is remembered, from its request's arrival.
pub const IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);
/// Most keys remembered per identity (the oldest answer is forgotten first).
pub const MAX_IDEMPOTENCY_KEYS_PER_IDENTITY: usize = 1_000;
/// Most keys remembered in all.
pub const MAX_IDEMPOTENCY_KEYS: usize = 100_000;
/// Most bytes of remembered answers in all (bodies and keys).
pub const MAX_IDEMPOTENCY_BYTES: usize = 64 * 1024 * 1024;

/// Whether `key` is a valid `Idempotency-Key`: 1 to `MAX_IDEMPOTENCY_KEY_BYTES`
/// bytes of ASCII letters, digits, `_`, `-`, `.` or `:`.
pub fn is_valid_key(key: &[u8]) -> bool {
    !key.is_empty()
        && key.len() <= MAX_IDEMPOTENCY_KEY_BYTES
        && key.iter().all(|byte| byte.is_ascii_alphanumeric() || b"_-.:".contains(byte))
}

/// The table's bounds (the constants above, smaller in tests).
#[derive(Clone, Copy, Debug)]
pub struct IdempotencyLimits {
    pub window: Duration,
    pub max_keys_per_identity: usize,
    pub max_keys: usize,
    pub max_bytes: usize,
}

impl Default for IdempotencyLimits {
    fn default() -> IdempotencyLimits {
        IdempotencyLimits {
            window: IDEMPOTENCY_WINDOW,
            max_keys_per_identity: MAX_IDEMPOTENCY_KEYS_PER_IDENTITY,
            max_keys: MAX_IDEMPOTENCY_KEYS,
            max_bytes: MAX_IDEMPOTENCY_BYTES,
        }
    }
}

/// A request's fingerprint: its method, path and body, hashed twice with
/// per-process random keys (128 bits), so a caller cannot make two of its own
/// requests collide by design, nor would it gain anything but its own old answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint(u64, u64);

/// An answer as first sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// What a request with a key does.
pub enum Begin {
    /// It is the first: run it, then finish the ticket with its answer.
    Run(Ticket),
    /// It was answered: send this again.
    Replay(Answer),
    /// The key was used by another request (another fingerprint).
    Reused,
    /// The first is in flight: wait for the receiver to close, then begin again.
    Wait(watch::Receiver<()>),
    /// Every key the bounds allow is in flight: the request is refused.
    Full,
}

type TableKey = (Arc<str>, Box<str>);

enum State {
    /// Dropping the sender (finished or abandoned) wakes the waiting requests.
    InFlight(watch::Receiver<()>),
    Done(Answer),
}

struct Slot {
    fingerprint: Fingerprint,
    serial: u64,
    started_at: Instant,
    state: State,
}

#[derive(Default)]
struct Table {
    slots: HashMap<TableKey, Slot>,
    /// Every slot by serial: oldest first.
    by_age: BTreeMap<u64, TableKey>,
    /// Each identity's slots by serial.
    by_identity: HashMap<Arc<str>, BTreeMap<u64, Box<str>>>,
    n_bytes: usize,
    next_serial: u64,
}

/// The remembered answers of one process.
pub struct Idempotency {
    limits: IdempotencyLimits,
    hashers: (RandomState, RandomState),
    table: Mutex<Table>,
}

/// The right, and the duty, to record the answer of a request with a key.
pub struct Ticket {
    table: Arc<Idempotency>,
    key: TableKey,
    serial: u64,
    /// Dropped once the slot is answered or freed: the waiting requests wake.
    _wake: watch::Sender<()>,
    finished: bool,
}

impl Idempotency {
    pub fn new(limits: IdempotencyLimits) -> Arc<Idempotency> {
        Arc::new(Idempotency {
            limits,
            hashers: (RandomState::new(), RandomState::new()),
            table: Mutex::new(Table::default()),
        })
    }

    pub fn fingerprint(&self, method: &str, path: &str, body: &[u8]) -> Fingerprint {
        let parts = (method, path, body);
        Fingerprint(self.hashers.0.hash_one(parts), self.hashers.1.hash_one(parts))
    }

    /// Looks `key` up for `identity`, at `now`.
    pub fn begin(self: &Arc<Self>, identity: &Arc<str>, key: &str, fingerprint: Fingerprint, now: Instant) -> Begin {
        let mut table = self.table.lock().expect("idempotency lock");
        table.expire(now, self.limits.window);
        let table_key: TableKey = (identity.clone(), Box::from(key));
        if let Some(slot) = table.slots.get(&table_key) {
            if slot.fingerprint != fingerprint {
                return Begin::Reused;
            }
            return match &slot.state {
                State::InFlight(receiver) => Begin::Wait(receiver.clone()),
                State::Done(answer) => Begin::Replay(answer.clone()),
            };
        }
        if !table.make_room(identity, &self.limits) {
            return Begin::Full;
        }
        let (wake, receiver) = watch::channel(());
        let serial = table.insert(table_key.clone(), fingerprint, now, State::InFlight(receiver));
        Begin::Run(Ticket { table: self.clone(), key: table_key, serial, _wake: wake, finished: false })
    }

    /// How many keys are remembered or in flight (for tests and metrics).
    pub fn len(&self) -> usize {
        self.table.lock().expect("idempotency lock").slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Ticket {
    /// Records the answer: a retry with the same key gets it.
    pub fn finish(mut self, answer: Answer) {
        self.finished = true;
        let mut table = self.table.table.lock().expect("idempotency lock");
        let n_bytes = answer.body.len() + self.key.1.len();
        let Some(slot) = table.slots.get_mut(&self.key).filter(|slot| slot.serial == self.serial) else { return };
        slot.state = State::Done(answer);
        table.n_bytes += n_bytes;
        let max_bytes = self.table.limits.max_bytes;
        // The newest answer is kept even alone over the bound: forgetting it
        // would let its retry apply again.
        while table.n_bytes > max_bytes && table.evict_oldest_done(None, Some(self.serial)) {}
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut table = self.table.table.lock().expect("idempotency lock");
        if table.slots.get(&self.key).is_some_and(|slot| slot.serial == self.serial) {
            table.remove(&self.key);
        }
    }
}

impl Table {
    fn insert(&mut self, key: TableKey, fingerprint: Fingerprint, now: Instant, state: State) -> u64 {
        let serial = self.next_serial;
        self.next_serial += 1;
        self.by_age.insert(serial, key.clone());
        self.by_identity.entry(key.0.clone()).or_default().insert(serial, key.1.clone());
        self.slots.insert(key, Slot { fingerprint, serial, started_at: now, state });
        serial
    }

    fn remove(&mut self, key: &TableKey) {
        let Some(slot) = self.slots.remove(key) else { return };
        self.by_age.remove(&slot.serial);
        if let Some(keys) = self.by_identity.get_mut(&key.0) {
            keys.remove(&slot.serial);
            if keys.is_empty() {
                self.by_identity.remove(&key.0);
            }
        }
        if let State::Done(answer) = slot.state {
            self.n_bytes -= answer.body.len() + key.1.len();
        }
    }

    /// Forgets the answers older than `window`; keys in flight stay.
    fn expire(&mut self, now: Instant, window: Duration) {
        let expired: Vec<TableKey> = self
            .by_age
            .values()
            .map_while(|key| {
                let slot = &self.slots[key];
                (now.saturating_duration_since(slot.started_at) >= window).then_some((key, slot))
            })
            .filter(|(_, slot)| matches!(slot.state, State::Done(_)))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &expired {
            self.remove(key);
        }
    }

    /// Frees a place for a new key of `identity`; false when only keys in flight are left to forget.
    fn make_room(&mut self, identity: &Arc<str>, limits: &IdempotencyLimits) -> bool {
        while self.by_identity.get(identity).map_or(0, BTreeMap::len) >= limits.max_keys_per_identity {
            if !self.evict_oldest_done(Some(identity), None) {
                return false;
            }
        }
        while self.slots.len() >= limits.max_keys {
            if !self.evict_oldest_done(None, None) {
                return false;
            }
        }
        true
    }

    /// Forgets the oldest answered key (of `identity`, or of all), never `keep`.
    fn evict_oldest_done(&mut self, identity: Option<&Arc<str>>, keep: Option<u64>) -> bool {
        let is_done = |slots: &HashMap<TableKey, Slot>, key: &TableKey| {
            slots.get(key).is_some_and(|slot| matches!(slot.state, State::Done(_)) && Some(slot.serial) != keep)
        };
        let oldest = match identity {
            Some(identity) => self.by_identity.get(identity).and_then(|keys| {
                keys.values()
                    .map(|key| (identity.clone(), key.clone()))
                    .find(|table_key| is_done(&self.slots, table_key))
            }),
            None => self.by_age.values().find(|table_key| is_done(&self.slots, table_key)).cloned(),
        };
        match oldest {
            Some(key) => {
                self.remove(&key);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> IdempotencyLimits {
        IdempotencyLimits { window: Duration::from_secs(10), max_keys_per_identity: 3, max_keys: 5, max_bytes: 1_000 }
    }

    fn answer(body: &str) -> Answer {
        Answer { status: 200, body: Bytes::copy_from_slice(body.as_bytes()) }
    }

    fn run(table: &Arc<Idempotency>, identity: &Arc<str>, key: &str, body: &str, now: Instant) -> Begin {
        table.begin(identity, key, table.fingerprint("POST", "/v1/batch", body.as_bytes()), now)
    }

    fn answered(table: &Arc<Idempotency>, identity: &Arc<str>, key: &str, body: &str, now: Instant) {
        let Begin::Run(ticket) = run(table, identity, key, body, now) else { panic!("{key}: not the first") };
        ticket.finish(answer(body));
    }

    fn is_replay(begin: Begin, body: &str) -> bool {
        matches!(begin, Begin::Replay(replayed) if replayed == answer(body))
    }

    #[test]
    fn keys_are_checked_at_their_edges() {
        assert!(is_valid_key(b"a"));
        assert!(is_valid_key(b"Az09_-.:"));
        assert!(is_valid_key(&[b'k'; MAX_IDEMPOTENCY_KEY_BYTES]));
        assert!(!is_valid_key(&[b'k'; MAX_IDEMPOTENCY_KEY_BYTES + 1]));
        assert!(!is_valid_key(b""));
        for bad in [&b"a b"[..], b"a/b", b"\xc3\xa9", b"a\n"] {
            assert!(!is_valid_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_retry_gets_the_first_answer_and_another_body_is_refused() {
        let table = Idempotency::new(limits());
        let (alice, bob): (Arc<str>, Arc<str>) = (Arc::from("alice"), Arc::from("bob"));
        let now = Instant::now();
        answered(&table, &alice, "k", "one", now);
        assert!(is_replay(run(&table, &alice, "k", "one", now), "one"));
        assert!(matches!(run(&table, &alice, "k", "two", now), Begin::Reused));
        // Keys are per identity: bob's `k` is his own.
        assert!(matches!(run(&table, &bob, "k", "two", now), Begin::Run(_)));
    }

    #[test]
    fn a_request_in_flight_makes_the_next_wait_and_an_abandoned_one_frees_its_key() {
        let table = Idempotency::new(limits());
        let alice: Arc<str> = Arc::from("alice");
        let now = Instant::now();
        let Begin::Run(ticket) = run(&table, &alice, "k", "one", now) else { panic!() };
        let Begin::Wait(waiting) = run(&table, &alice, "k", "one", now) else { panic!("no wait") };
        assert!(matches!(run(&table, &alice, "k", "two", now), Begin::Reused));
        drop(ticket);
        // The sender is gone: the waiter wakes, and runs the request itself.
        assert!(waiting.has_changed().is_err());
        assert!(table.is_empty());
        assert!(matches!(run(&table, &alice, "k", "one", now), Begin::Run(_)));
    }

    #[test]
    fn an_answer_is_forgotten_at_the_window_not_before() {
        let table = Idempotency::new(limits());
        let alice: Arc<str> = Arc::from("alice");
        let start = Instant::now();
        answered(&table, &alice, "k", "one", start);
        let just_before = start + limits().window - Duration::from_nanos(1);
        assert!(is_replay(run(&table, &alice, "k", "one", just_before), "one"));
        assert!(matches!(run(&table, &alice, "k", "two", start + limits().window), Begin::Run(_)));
    }

    #[test]
    fn an_identity_at_its_bound_forgets_its_oldest_answer_only() {
        let table = Idempotency::new(limits());
        let (alice, bob): (Arc<str>, Arc<str>) = (Arc::from("alice"), Arc::from("bob"));
        let now = Instant::now();
        answered(&table, &bob, "b0", "x", now);
        for key in ["a0", "a1", "a2"] {
            answered(&table, &alice, key, "x", now);
        }
        // At the bound: all three are remembered.
        assert!(is_replay(run(&table, &alice, "a0", "x", now), "x"));
        answered(&table, &alice, "a3", "x", now);
        assert!(matches!(run(&table, &alice, "a0", "y", now), Begin::Run(_)), "a0 was forgotten");
        assert!(is_replay(run(&table, &alice, "a2", "x", now), "x"));
        assert!(is_replay(run(&table, &bob, "b0", "x", now), "x"));
    }

    #[test]
    fn the_table_at_its_bound_forgets_the_oldest_answer_and_never_one_in_flight() {
        let table = Idempotency::new(limits());
        let now = Instant::now();
        let identities: Vec<Arc<str>> = (0..6).map(|n| Arc::from(format!("u{n}"))).collect();
        let mut in_flight = Vec::new();
        for identity in &identities[..5] {
            let Begin::Run(ticket) = run(&table, identity, "k", "x", now) else { panic!() };
            in_flight.push(ticket);
        }
        assert_eq!(table.len(), 5);
        assert!(matches!(run(&table, &identities[5], "k", "x", now), Begin::Full));
        let first = in_flight.remove(0);
        first.finish(answer("x"));
        // The answered key is the oldest that may go: it makes room.
        let Begin::Run(_sixth) = run(&table, &identities[5], "k", "x", now) else { panic!("no room") };
        assert_eq!(table.len(), 5);
    }

    #[test]
    fn answers_over_the_byte_bound_forget_the_oldest_but_never_the_newest() {
        let table = Idempotency::new(limits());
        let alice: Arc<str> = Arc::from("alice");
        let now = Instant::now();
        let big = "b".repeat(600);
        answered(&table, &alice, "k1", &big, now);
        answered(&table, &alice, "k2", &big, now);
        assert!(matches!(run(&table, &alice, "k1", "other", now), Begin::Run(_)), "k1 was forgotten");
        assert!(is_replay(run(&table, &alice, "k2", &big, now), &big));
        let huge = "h".repeat(2_000);
        answered(&table, &alice, "k3", &huge, now);
        assert!(is_replay(run(&table, &alice, "k3", &huge, now), &huge));
    }
}
