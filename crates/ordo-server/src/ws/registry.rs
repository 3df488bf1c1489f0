//! The `Registry` of parked sessions: sessions whose connection is gone, held
//! for resume until they expire or the parked budgets
//! (`limits::MAX_PARKED_BYTES` server-wide, `MAX_PARKED_BYTES_PER_OWNER` per
//! identity) push them out, oldest first. Each belongs to the identity that
//! opened it.
//!
//! Every parked session has a *counted* cost: its estimate
//! (`Session::parked_cost_bytes`) plus the frames queued for it, as read when
//! it was parked and again at each `expire` (once a second), which re-reads
//! every session's queue. The registry keeps the sums of the counted costs,
//! server-wide and per owner, so parking checks the budgets without reading
//! every other session: a mass disconnect of n connections costs O(n log n)
//! under the registry's lock, not O(n²). Frames queued for a session after it
//! was parked count from the next `expire`.
//!
//! Invariant: after every `park` and `expire`, the counted costs are within
//! both budgets.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::session::Session;
use crate::limits;
use crate::writer::SessionId;

/// A session held for resume.
struct ParkedSession {
    session: Session,
    expires: Instant,
    /// Its place in `RegistryInner::by_age` and its owner's `OwnerParked::by_age`.
    parked_index: u64,
    /// `Session::parked_cost_bytes` when it was parked (its table does not change while parked).
    estimate_bytes: usize,
    /// `estimate_bytes` plus the frames queued for it, when last read.
    counted_bytes: usize,
}

impl ParkedSession {
    fn live_cost_bytes(&self) -> usize {
        self.estimate_bytes + self.session.shared.queued_bytes.load(Ordering::Acquire)
    }
}

/// One owner's parked sessions.
#[derive(Default)]
struct OwnerParked {
    counted_bytes: usize,
    /// Their `parked_index`es, oldest first.
    by_age: BTreeSet<u64>,
}

/// Sessions held for resume (see the module doc).
#[derive(Default)]
pub struct Registry {
    inner: Mutex<RegistryInner>,
}

#[derive(Default)]
struct RegistryInner {
    by_token: HashMap<String, ParkedSession>,
    /// Tokens by the order they were parked in, oldest first.
    by_age: BTreeMap<u64, String>,
    next_parked_index: u64,
    /// The sum of every parked session's `counted_bytes`.
    counted_bytes: usize,
    owners: HashMap<Arc<str>, OwnerParked>,
}

fn over_total(bytes: usize) -> bool {
    bytes > limits::MAX_PARKED_BYTES
}

fn over_owner(bytes: usize) -> bool {
    bytes > limits::MAX_PARKED_BYTES_PER_OWNER
}

impl RegistryInner {
    fn insert(&mut self, token: String, parked: ParkedSession) {
        self.remove(&token);
        self.counted_bytes += parked.counted_bytes;
        let owner = self.owners.entry(parked.session.owner.clone()).or_default();
        owner.counted_bytes += parked.counted_bytes;
        owner.by_age.insert(parked.parked_index);
        self.by_age.insert(parked.parked_index, token.clone());
        self.by_token.insert(token, parked);
    }

    fn remove(&mut self, token: &str) -> Option<ParkedSession> {
        let parked = self.by_token.remove(token)?;
        self.by_age.remove(&parked.parked_index);
        self.counted_bytes -= parked.counted_bytes;
        let owner = self.owners.get_mut(&parked.session.owner).expect("a parked session's owner is listed");
        owner.counted_bytes -= parked.counted_bytes;
        owner.by_age.remove(&parked.parked_index);
        if owner.by_age.is_empty() {
            self.owners.remove(&parked.session.owner);
        }
        Some(parked)
    }

    fn owner_counted_bytes(&self, owner: &str) -> usize {
        self.owners.get(owner).map_or(0, |parked| parked.counted_bytes)
    }

    /// Restores the invariant after `owner` parked a session (only the total
    /// and that owner's sum grew): the oldest go while the total is over, then
    /// the owner's oldest while its sum is. That is what one pass oldest first
    /// drops when a single owner can be over.
    fn evict_after_park(&mut self, owner: &str) -> Vec<SessionId> {
        let mut evicted = Vec::new();
        loop {
            let index = if over_total(self.counted_bytes) {
                self.by_age.keys().next().copied()
            } else if over_owner(self.owner_counted_bytes(owner)) {
                self.owners.get(owner).and_then(|parked| parked.by_age.first().copied())
            } else {
                break;
            };
            let token = self.by_age[&index.expect("over a budget, so a session is parked")].clone();
            evicted.push(self.remove(&token).expect("listed").session.id);
        }
        evicted
    }

    /// Reads every parked session's queue again and sums the counted costs anew.
    fn recount(&mut self) {
        let RegistryInner { by_token, counted_bytes, owners, .. } = self;
        *counted_bytes = 0;
        owners.values_mut().for_each(|owner| owner.counted_bytes = 0);
        for parked in by_token.values_mut() {
            parked.counted_bytes = parked.live_cost_bytes();
            *counted_bytes += parked.counted_bytes;
            owners.get_mut(&parked.session.owner).expect("listed").counted_bytes += parked.counted_bytes;
        }
    }

    /// One pass oldest first: a session goes while the total, or its owner's
    /// sum, is over budget.
    fn evict_over_budget(&mut self) -> Vec<SessionId> {
        let any_owner_over = self.owners.values().any(|owner| over_owner(owner.counted_bytes));
        if !over_total(self.counted_bytes) && !any_owner_over {
            return Vec::new();
        }
        let oldest_first: Vec<String> = self.by_age.values().cloned().collect();
        let mut evicted = Vec::new();
        for token in oldest_first {
            let owner = &self.by_token[&token].session.owner;
            if over_total(self.counted_bytes) || over_owner(self.owner_counted_bytes(owner)) {
                evicted.push(self.remove(&token).expect("listed").session.id);
            }
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
        let owner = session.owner.clone();
        let estimate_bytes = session.parked_cost_bytes();
        let expires = Instant::now() + retention;
        let mut parked = ParkedSession { session, expires, parked_index, estimate_bytes, counted_bytes: 0 };
        parked.counted_bytes = parked.live_cost_bytes();
        inner.insert(token, parked);
        inner.evict_after_park(&owner)
    }

    /// The parked session `token` names, if `owner` opened it.
    pub(super) fn take(&self, token: &str, owner: &str) -> Option<Session> {
        let mut inner = self.inner.lock().expect("registry lock");
        if &*inner.by_token.get(token)?.session.owner != owner {
            return None;
        }
        inner.remove(token).map(|parked| parked.session)
    }

    /// Drops expired sessions, then counts every parked session's queued
    /// frames again and drops the oldest while over the budgets; returns their
    /// ids so their windows can be closed.
    pub fn expire(&self, now: Instant) -> Vec<SessionId> {
        let mut inner = self.inner.lock().expect("registry lock");
        let expired: Vec<String> =
            inner.by_token.iter().filter(|(_, parked)| parked.expires <= now).map(|(token, _)| token.clone()).collect();
        let mut dropped: Vec<SessionId> =
            expired.iter().filter_map(|token| inner.remove(token)).map(|parked| parked.session.id).collect();
        inner.recount();
        dropped.extend(inner.evict_over_budget());
        dropped
    }
}

#[cfg(test)]
mod tests;
