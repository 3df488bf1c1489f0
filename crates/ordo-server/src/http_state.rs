//! What every HTTP request's handler shares: the server-wide `HttpState` (the
//! writer's queue, the routing table, the access gate, the limits, cluster
//! mode's stream), and each TCP connection's place under the connection cap
//! (`ConnectionSlot`), which the accept loop takes and a WebSocket keeps.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::access::Gate;
use crate::auth::Identity;
use crate::metrics::{self, METRICS};
use crate::routing::Routes;
use crate::submit::Submitter;
use crate::writer::WriterSender;
use crate::ws::{self, ConnectionContext, Registry};

/// The server-wide state every HTTP handler reads, built once at start.
pub struct HttpState {
    pub writer: WriterSender,
    pub routes: Routes,
    pub registry: Arc<Registry>,
    pub connection: ws::ConnectionConfig,
    pub http_requests_per_second: u32,
    pub shutdown: watch::Receiver<bool>,
    pub limits_json: Arc<serde_json::Value>,
    /// Most TCP connections at once (`limits::connection_cap`).
    pub max_connections: usize,
    /// `--header-timeout`: the most a connection may take to send a request head.
    pub header_timeout: Duration,
    /// The demo chat and its simulator's controls, with `ordo serve --demo` only.
    pub demo: Option<Arc<crate::demo::Demo>>,
    /// `--demo`: `/demo` and `/demo/*` exist (otherwise they are 404).
    pub demo_enabled: bool,
    /// `--demo`: the generated secret that signs the demo users' tokens.
    pub demo_secret: Option<Arc<Vec<u8>>>,
    pub gate: Arc<Gate>,
    /// `--metrics-public`: `/metrics` without an admin token.
    pub metrics_public: bool,
    /// The `seq` of the last batch applied, for `min_seq`.
    pub seq: crate::min_seq::SeqWatch,
    /// Where changes of state go: the writer, or cluster mode's stream.
    pub submit: Submitter,
    /// Cluster mode: the stream's connection (`None`: single-node mode).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// The answers remembered for writes sent with an `Idempotency-Key`.
    pub idempotency: Arc<crate::idempotency::Idempotency>,
    /// `--pg-table`: the follower's status (`None`: nothing followed).
    pub postgres: Option<Arc<crate::pg_follow::FollowStatus>>,
    /// The collections that follow a PostgreSQL table: read-only here.
    pub read_only: crate::pg_follow::ReadOnlyCollections,
    /// The upgraded WebSocket connections' tasks: at a stop the server waits
    /// for them to send their close frames (an upgraded connection has left
    /// hyper's graceful shutdown).
    pub websockets: tokio_util::task::TaskTracker,
}

impl HttpState {
    /// Cluster mode: this node's part of `/v1/health` (`None`: single-node mode).
    pub(crate) fn cluster_health(&self) -> Option<serde_json::Value> {
        self.cluster.as_ref().map(|cluster| cluster.shared.status.health_json())
    }

    /// Cluster mode: appends this node's cluster metrics to `/metrics`' text.
    pub(crate) fn render_cluster_metrics(&self, text: &mut String) {
        if let Some(cluster) = &self.cluster {
            cluster.shared.status.render_metrics(text);
            cluster.coalescer.render_metrics(text);
        }
    }

    /// A write (or schema change) to `name` is refused when it follows a PostgreSQL table.
    pub(crate) fn check_writable(&self, name: &str) -> Result<(), crate::error::ApiError> {
        if self.read_only.contains(name) {
            return Err(crate::error::ApiError::new(
                crate::error::ErrorCode::ReadOnlySource,
                format!("`{name}` follows a PostgreSQL table: write to the table in PostgreSQL"),
            ));
        }
        Ok(())
    }

    /// What a WebSocket connection of `identity` (if it sent a token) runs with.
    pub(crate) fn connection_context(&self, identity: Option<Arc<Identity>>) -> ConnectionContext {
        ConnectionContext {
            writer: self.writer.clone(),
            routes: self.routes.clone(),
            registry: self.registry.clone(),
            config: self.connection.clone(),
            shutdown: self.shutdown.clone(),
            limits_json: self.limits_json.clone(),
            gate: self.gate.clone(),
            identity,
            seq: self.seq.clone(),
            cluster: self.cluster.as_ref().map(|cluster| cluster.shared.clone()),
        }
    }
}

/// One accepted TCP connection's place under the connection cap. The HTTP
/// connection's service holds it, and so does the WebSocket task it upgrades
/// to; the place is free again when the last holder drops it.
pub struct ConnectionSlot(());

impl ConnectionSlot {
    pub(crate) fn take() -> Arc<ConnectionSlot> {
        metrics::add(&METRICS.tcp_connections, 1);
        Arc::new(ConnectionSlot(()))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        METRICS.tcp_connections.fetch_sub(1, Ordering::Relaxed);
    }
}
