//! What the follower reports: its state, the last position applied and the
//! replication lag, for `/v1/health` and `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use ordo_pgsource::stream::WalPositions;

use super::tables::{self, StoredTable};

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
    /// Cluster mode, another node holds the lease: this one applies the
    /// follower's entries from the stream and stands by to take over.
    Standby = 4,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Copying => "copying",
            State::Streaming => "streaming",
            State::Reconnecting => "reconnecting",
            State::Failed => "failed",
            State::Standby => "standby",
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
    /// The stores of transactions this node's follower made (each one group
    /// commit, or one submission to the stream, of the transactions received
    /// together).
    stores: AtomicU64,
    reconnects: AtomicU64,
    error: Mutex<Option<String>>,
    /// Cluster mode: the follower lease as this node last saw it.
    lease: Mutex<Option<LeaseView>>,
    /// This node's `--pg-table`, as `tables::key`s, to compare with the
    /// record of the followed tables that the lease holder writes.
    own_tables: Mutex<Vec<String>>,
    /// Cluster mode: how that record differs from this node's `--pg-table`
    /// (`None`: it does not, or there is no record yet).
    tables_differ: Mutex<Option<String>>,
}

/// Who holds the follower lease (cluster mode), for `/v1/health`.
#[derive(Clone, Debug, Default)]
pub struct LeaseView {
    /// The holder's node name, if any node holds it.
    pub holder: Option<String>,
    /// Whether this node holds it, and its term (the lease revision it took it at).
    pub held_here: bool,
    pub term: u64,
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
            4 => State::Standby,
            _ => State::Failed,
        }
    }

    /// `transactions` transactions are durable up to `lsn`; `lag_micros` is
    /// how long after the last one's commit in PostgreSQL it was applied here.
    pub fn applied(&self, lsn: u64, lag_micros: u64, transactions: u64) {
        self.applied_lsn.store(lsn, Ordering::Relaxed);
        self.lag_micros.store(lag_micros, Ordering::Relaxed);
        if !self.is_clustered() {
            self.transactions.fetch_add(transactions, Ordering::Relaxed);
        }
        self.stores.fetch_add(1, Ordering::Relaxed);
    }

    /// Cluster mode: every node's apply of a transaction's position entry (the
    /// only count of transactions there, whichever node follows PostgreSQL).
    pub fn applied_from_stream(&self, lsn: u64) {
        self.applied_lsn.fetch_max(lsn, Ordering::Relaxed);
        self.transactions.fetch_add(1, Ordering::Relaxed);
    }

    fn is_clustered(&self) -> bool {
        self.lease.lock().expect("status lock").is_some()
    }

    /// Cluster mode: what this node knows of the lease now.
    pub fn set_lease(&self, lease: LeaseView) {
        *self.lease.lock().expect("status lock") = Some(lease);
    }

    pub fn lease(&self) -> Option<LeaseView> {
        self.lease.lock().expect("status lock").clone()
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

    /// This node's `--pg-table` (see `own_tables`).
    pub fn set_own_tables(&self, keys: Vec<String>) {
        *self.own_tables.lock().expect("status lock") = keys;
    }

    /// Compares the record of the followed tables (the one this node holds,
    /// or one it applies from the stream) with this node's `--pg-table`; a
    /// difference is logged once and reported until a record agrees.
    pub fn check_record(&self, record: Option<&[StoredTable]>) {
        let differs =
            record.and_then(|record| tables::differences(&self.own_tables.lock().expect("status lock"), record));
        let mut reported = self.tables_differ.lock().expect("status lock");
        if differs.is_some() && *reported != differs {
            let message = differs.as_deref().unwrap_or_default();
            eprintln!("ordo: ERROR: {message}");
            tracing::error!(error = message, "this node's --pg-table differs from the followed tables");
        }
        *reported = differs;
    }

    pub fn tables_differ(&self) -> Option<String> {
        self.tables_differ.lock().expect("status lock").clone()
    }

    /// The stream ended for this node (cluster mode: the term is over): no lag
    /// is read from it any more.
    pub fn clear_positions(&self) {
        *self.positions.lock().expect("status lock") = None;
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
            "lease": self.lease().map(|lease| serde_json::json!({
                "holder": lease.holder,
                "held_here": lease.held_here,
                "term": lease.term,
            })),
            "tables_differ": self.tables_differ(),
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
                "ordo_postgres_transaction_stores_total",
                "counter",
                "stores of the transactions received together by this node's follower (one group commit each)",
                self.stores.load(Ordering::Relaxed) as f64,
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
        let held = self.lease().map(|lease| f64::from(u8::from(lease.held_here)));
        let lease_line = held.map(|held| {
            (
                "ordo_postgres_lease_held",
                "gauge",
                "cluster mode: 1 while this node holds the follower lease, else 0",
                held,
            )
        });
        for (name, kind, help, value) in lines.into_iter().chain(lease_line) {
            let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
    }
}
