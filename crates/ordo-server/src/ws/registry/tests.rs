//! The registry against a naive model of its documented rule: costs counted
//! when parked and at each `expire`, and one pass oldest first dropping a
//! session while the total, or its owner's sum, is over budget.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Registry;
use crate::limits::{MAX_PARKED_BYTES, MAX_PARKED_BYTES_PER_OWNER, PARKED_SESSION_OVERHEAD_BYTES};
use crate::rng::Rng;
use crate::sub_table::SubTable;
use crate::writer::{ConnShared, SessionId};
use crate::ws::Session;

const OWNERS: [&str; 4] = ["ana", "bo", "cy", "di"];
const HELD: Duration = Duration::from_secs(3600);

fn session(id: SessionId, owner: &str, queued_bytes: usize) -> (Session, Arc<ConnShared>) {
    let shared = Arc::new(ConnShared::default());
    shared.queued_bytes.store(queued_bytes, Ordering::Release);
    let session = Session {
        id,
        token: format!("token-{id}"),
        owner: Arc::from(owner),
        shared: shared.clone(),
        outbox: crate::writer::outbox().1,
        table: SubTable::new(),
        by_client_id: HashMap::new(),
        next_handle: 0,
    };
    (session, shared)
}

/// A parked session as the model holds it, oldest first in `Model::parked`.
struct ModelSession {
    id: SessionId,
    owner: &'static str,
    counted: usize,
    shared: Arc<ConnShared>,
}

#[derive(Default)]
struct Model {
    parked: Vec<ModelSession>,
}

impl Model {
    fn park(&mut self, id: SessionId, owner: &'static str, shared: Arc<ConnShared>) -> Vec<SessionId> {
        let counted = PARKED_SESSION_OVERHEAD_BYTES + shared.queued_bytes.load(Ordering::Acquire);
        self.parked.push(ModelSession { id, owner, counted, shared });
        self.one_pass()
    }

    fn take(&mut self, id: SessionId, owner: &str) -> bool {
        let Some(place) = self.parked.iter().position(|parked| parked.id == id && parked.owner == owner) else {
            return false;
        };
        self.parked.remove(place);
        true
    }

    fn expire(&mut self) -> Vec<SessionId> {
        for parked in &mut self.parked {
            parked.counted = PARKED_SESSION_OVERHEAD_BYTES + parked.shared.queued_bytes.load(Ordering::Acquire);
        }
        self.one_pass()
    }

    fn one_pass(&mut self) -> Vec<SessionId> {
        let mut evicted = Vec::new();
        let mut place = 0;
        while place < self.parked.len() {
            let total: usize = self.parked.iter().map(|parked| parked.counted).sum();
            let owner = self.parked[place].owner;
            let owner_sum: usize =
                self.parked.iter().filter(|parked| parked.owner == owner).map(|parked| parked.counted).sum();
            if total > MAX_PARKED_BYTES || owner_sum > MAX_PARKED_BYTES_PER_OWNER {
                evicted.push(self.parked.remove(place).id);
            } else {
                place += 1;
            }
        }
        evicted
    }

    fn ids(&self) -> Vec<SessionId> {
        let mut ids: Vec<SessionId> = self.parked.iter().map(|parked| parked.id).collect();
        ids.sort_unstable();
        ids
    }
}

fn sorted(mut ids: Vec<SessionId>) -> Vec<SessionId> {
    ids.sort_unstable();
    ids
}

fn parked_ids(registry: &Registry) -> Vec<SessionId> {
    let inner = registry.inner.lock().unwrap();
    let by_age: Vec<SessionId> = inner.by_age.values().map(|token| inner.by_token[token].session.id).collect();
    let total: usize = inner.by_token.values().map(|parked| parked.counted_bytes).sum();
    assert_eq!(inner.counted_bytes, total, "the total is the sum of the counted costs");
    for (owner, sums) in &inner.owners {
        let owned = inner.by_token.values().filter(|parked| parked.session.owner == *owner);
        assert_eq!(sums.counted_bytes, owned.clone().map(|parked| parked.counted_bytes).sum::<usize>(), "{owner}");
        assert_eq!(sums.by_age.len(), owned.count(), "{owner}'s sessions");
    }
    sorted(by_age)
}

/// Queued bytes that put a few sessions over the per-owner budget and a dozen
/// over the server-wide one.
fn queued_bytes(rng: &mut Rng) -> usize {
    match rng.below(4) {
        0 => 0,
        1 => rng.index(1 << 20),
        _ => rng.index(MAX_PARKED_BYTES_PER_OWNER / 2),
    }
}

fn run(seed: u64) {
    let mut rng = Rng::new(seed);
    let registry = Registry::default();
    let mut model = Model::default();
    let mut next_id: SessionId = 1;
    for step in 0..400 {
        let context = format!("seed {seed}, step {step}");
        match rng.below(10) {
            0..=4 => {
                let owner = *rng.pick(&OWNERS);
                let (session, shared) = session(next_id, owner, queued_bytes(&mut rng));
                let evicted = registry.park(session, HELD);
                assert_eq!(sorted(evicted), sorted(model.park(next_id, owner, shared)), "park: {context}");
                next_id += 1;
            }
            5 | 6 if !model.parked.is_empty() => {
                let parked = &model.parked[rng.index(model.parked.len())];
                let (id, right_owner) = (parked.id, parked.owner);
                let owner = if rng.chance(20) { *rng.pick(&OWNERS) } else { right_owner };
                let taken = registry.take(&format!("token-{id}"), owner).map(|session| session.id);
                assert_eq!(taken.is_some(), model.take(id, owner), "take: {context}");
            }
            7 | 8 if !model.parked.is_empty() => {
                // Frames queued for a parked session: counted at the next `expire`.
                let parked = &model.parked[rng.index(model.parked.len())];
                parked.shared.queued_bytes.store(queued_bytes(&mut rng), Ordering::Release);
            }
            _ => {
                let evicted = registry.expire(Instant::now());
                assert_eq!(sorted(evicted), sorted(model.expire()), "expire: {context}");
            }
        }
        assert_eq!(parked_ids(&registry), model.ids(), "parked: {context}");
    }
}

#[test]
fn the_registry_keeps_what_one_pass_oldest_first_keeps() {
    for seed in 0..200 {
        run(seed);
    }
}

#[test]
fn an_expired_session_goes_at_the_next_expire() {
    let registry = Registry::default();
    let (kept, _) = session(1, "ana", 0);
    let (expiring, _) = session(2, "ana", 0);
    assert!(registry.park(kept, HELD).is_empty());
    assert!(registry.park(expiring, Duration::ZERO).is_empty());
    assert_eq!(registry.expire(Instant::now() + Duration::from_millis(1)), vec![2]);
    assert_eq!(parked_ids(&registry), vec![1]);
    assert!(registry.take("token-1", "bo").is_none(), "only its owner resumes it");
    assert_eq!(registry.take("token-1", "ana").map(|session| session.id), Some(1));
}

#[test]
fn frames_queued_after_parking_count_at_the_next_expire() {
    // Each park reads only its own queue: a session's frames queued after it
    // was parked are not counted until `expire`. So 10 000 sessions of one
    // owner, each queueing 1 MiB once parked, stay parked until `expire`
    // counts them.
    let registry = Registry::default();
    let mut queues = Vec::new();
    for id in 0..10_000 {
        let (session, shared) = session(id, "ana", 0);
        assert!(registry.park(session, HELD).is_empty());
        shared.queued_bytes.store(1 << 20, Ordering::Release);
        queues.push(shared);
    }
    assert_eq!(parked_ids(&registry).len(), 10_000);
    let evicted = registry.expire(Instant::now());
    let kept = parked_ids(&registry);
    assert_eq!(evicted.len() + kept.len(), 10_000);
    assert!(kept.len() * ((1 << 20) + PARKED_SESSION_OVERHEAD_BYTES) <= MAX_PARKED_BYTES_PER_OWNER);
    assert_eq!(kept.first().copied(), Some(10_000 - kept.len() as SessionId), "the newest are kept");
}
