//! What the follower reports: its state, the last position applied and the
//! replication lag, for `/v1/health` and `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use ordo_pgsource::stream::WalPositions;

/// The follower's state, as `/v1/health` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    Copying = 0,
    Streaming = 1,
    /// PostgreSQL is unreachable or the walsender ended: retrying with backoff.
    Reconnecting = 2,
    /// Stopped for good: `error` says why (the collections keep their items).
    Failed = 3,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Copying => "copying",
            State::Streaming => "streaming",
            State::Reconnecting => "reconnecting",
            State::Failed => "failed",
        }
    }
}

/// Shared between the follower's task and the HTTP handlers.
#[derive(Default)]
pub struct FollowStatus {
    state: AtomicU8,
    applied_lsn: AtomicU64,
    /// The current stream's positions: the lag in bytes is read from them
    /// when asked, so it follows keepalives and the lag probe between
    /// transactions too.
    positions: Mutex<Option<Arc<WalPositions>>>,
    lag_micros: AtomicU64,
    transactions: AtomicU64,
    reconnects: AtomicU64,
    error: Mutex<Option<String>>,
}

impl FollowStatus {
    pub fn set_state(&self, state: State) {
        self.state.store(state as u8, Ordering::Relaxed);
    }

    pub fn state(&self) -> State {
        match self.state.load(Ordering::Relaxed) {
            0 => State::Copying,
            1 => State::Streaming,
            2 => State::Reconnecting,
            _ => State::Failed,
        }
    }

    /// A transaction (or the copy) is durable up to `lsn`; `lag_micros` is how
    /// long after its commit in PostgreSQL it was applied here.
    pub fn applied(&self, lsn: u64, lag_micros: u64) {
        self.applied_lsn.store(lsn, Ordering::Relaxed);
        self.lag_micros.store(lag_micros, Ordering::Relaxed);
        self.transactions.fetch_add(1, Ordering::Relaxed);
    }

    /// Where the stream starts: the stored position, or the copy's consistent point.
    pub fn start_at(&self, lsn: u64) {
        self.applied_lsn.store(lsn, Ordering::Relaxed);
    }

    pub fn reconnecting(&self, error: &str) {
        self.set_state(State::Reconnecting);
        self.reconnects.fetch_add(1, Ordering::Relaxed);
        *self.error.lock().expect("status lock") = Some(error.to_owned());
    }

    pub fn failed(&self, error: &str) {
        self.set_state(State::Failed);
        *self.error.lock().expect("status lock") = Some(error.to_owned());
    }

    pub fn streaming(&self) {
        self.set_state(State::Streaming);
        *self.error.lock().expect("status lock") = None;
    }

    /// The stream now running: its positions give the lag in bytes.
    pub fn watch_positions(&self, positions: Arc<WalPositions>) {
        *self.positions.lock().expect("status lock") = Some(positions);
    }

    pub fn positions(&self) -> Option<Arc<WalPositions>> {
        self.positions.lock().expect("status lock").clone()
    }

    /// The WAL bytes PostgreSQL has past what Ordo holds durably (0 before the stream starts).
    pub fn lag_bytes(&self) -> u64 {
        self.positions().map_or(0, |positions| positions.lag_bytes())
    }

    pub fn applied_lsn(&self) -> u64 {
        self.applied_lsn.load(Ordering::Relaxed)
    }

    /// `/v1/health`'s `postgres` object.
    pub fn health_json(&self) -> serde_json::Value {
        let lsn = self.applied_lsn();
        serde_json::json!({
            "state": self.state().name(),
            "applied_lsn": format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF),
            "lag_bytes": self.lag_bytes(),
            "lag_seconds": self.lag_micros.load(Ordering::Relaxed) as f64 / 1e6,
            "transactions_applied": self.transactions.load(Ordering::Relaxed),
            "reconnects": self.reconnects.load(Ordering::Relaxed),
            "error": *self.error.lock().expect("status lock"),
        })
    }

    /// Appends the follower's gauges and counters to `/metrics`' text.
    pub fn render_metrics(&self, text: &mut String) {
        let lines = [
            (
                "ordo_postgres_lag_bytes",
                "gauge",
                "WAL bytes PostgreSQL wrote past the position applied here",
                self.lag_bytes() as f64,
            ),
            (
                "ordo_postgres_lag_seconds",
                "gauge",
                "how long after its commit in PostgreSQL the last transaction was applied",
                self.lag_micros.load(Ordering::Relaxed) as f64 / 1e6,
            ),
            (
                "ordo_postgres_applied_lsn",
                "gauge",
                "the last PostgreSQL position applied and durable here",
                self.applied_lsn() as f64,
            ),
            (
                "ordo_postgres_transactions_applied_total",
                "counter",
                "PostgreSQL transactions applied",
                self.transactions.load(Ordering::Relaxed) as f64,
            ),
            (
                "ordo_postgres_reconnects_total",
                "counter",
                "reconnections to PostgreSQL",
                self.reconnects.load(Ordering::Relaxed) as f64,
            ),
            (
                "ordo_postgres_streaming",
                "gauge",
                "1 while the follower streams, else 0",
                f64::from(u8::from(self.state() == State::Streaming)),
            ),
        ];
        for (name, kind, help, value) in lines {
            let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
    }
}
