//! Cluster mode (`ordo serve --cluster <nats urls>`): many nodes over one
//! NATS JetStream stream. Every change of state is an entry of the stream
//! (`entry`), alone in a stream message or in a pack of them (`pack`); every
//! node applies the stream in order on its writer thread (`apply`), each entry
//! at exactly the seq its message's stream sequence and its place in the
//! message give it (`pack::SeqScheme`), which is the global `seq` (item
//! versions, write answers, frames' `write_seq`); a node that takes
//! a request publishes it (`log`), waits for JetStream's acknowledgement and for
//! its own writer to apply it, and answers with that apply's outcome.
//!
//! Invariants (see ARCHITECTURE.md, "Cluster mode"):
//! - the store's `last_seq()` is the last entry applied: each entry uses exactly
//!   its sequence number, with a seq marker when it wrote no batch (refused,
//!   a collection created) and for the seqs its message leaves unused, so a
//!   restart resumes at the message after the last one applied whole;
//! - the outcome of an entry depends only on the state before it (the same on
//!   every node), never on the node: rules, schema and preconditions are checked
//!   at apply time; a local failure (a full disk) stops applying instead of
//!   turning into a refusal, and the consumer starts again from the last entry
//!   applied.

pub mod apply;
pub mod batch;
pub mod coalesce;
pub mod consume;
pub mod entry;
pub mod gap;
pub mod lag;
pub mod log;
pub mod pack;
mod retry;
pub mod routes;
pub mod snapshot;
pub mod stream_check;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};

use ordo_store::Ack;

use crate::error::{ApiError, ErrorCode};
use crate::routing::CollectionEntry;

pub use lag::Status;

/// The stream's one subject.
pub const SUBJECT: &str = "ordo.log";
/// JetStream drops a publish whose `Nats-Msg-Id` it saw within this window.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long a request waits for the stream's acknowledgement, per attempt.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts of one publish (each with the same message id, so at most one lands).
pub const PUBLISH_ATTEMPTS: u32 = 3;
/// How long a publish refused at once (no stream leader yet: a stream just
/// created, or a leader being elected again) is sent again, with backoff,
/// before it counts as a failed attempt; each attempt has its own (`retry`),
/// so a short election costs the writer latency, not a `503`.
pub const NO_LEADER_WAIT: Duration = Duration::from_secs(5);
/// The longest a node may go on sending one entry again, counted from its
/// first send (each attempt: the send, then the acknowledgement, each bounded
/// by `PUBLISH_TIMEOUT`, and the wait for a leader; a publish "in process"
/// waits within it too): the stream's duplicate window must be at least this
/// (`stream_check`).
pub const PUBLISH_RETRY_SPAN: Duration =
    Duration::from_secs(PUBLISH_ATTEMPTS as u64 * (2 * PUBLISH_TIMEOUT.as_secs() + NO_LEADER_WAIT.as_secs()));
/// How long a request waits for its own node to apply its entry once published.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// `--cluster` and its companion flags.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub urls: Vec<String>,
    pub node_name: String,
    pub stream: String,
    pub replicas: usize,
    pub max_lag: u64,
    /// `--stream-max-msgs` / `--stream-max-age`: the stream's retention when this
    /// node creates it (0: unlimited). See docs/SCALING.md for the rule that
    /// ties them to `--snapshot-every`.
    pub stream_max_msgs: u64,
    pub stream_max_age: Duration,
    /// `--snapshot-dir`: where snapshots are published and looked for.
    pub snapshot_dir: Option<std::path::PathBuf>,
    /// `--snapshot-every`: entries between two snapshots this node writes (0: it writes none).
    pub snapshot_every: u64,
    /// `--coalesce-*`: how the entries of requests arriving together are grouped.
    pub coalesce: coalesce::CoalesceOptions,
}

impl ClusterOptions {
    pub fn new(
        urls: &str,
        node_name: Option<String>,
        listen: std::net::SocketAddr,
        stream: String,
        replicas: usize,
        max_lag: u64,
    ) -> Result<ClusterOptions, String> {
        let urls: Vec<String> =
            urls.split(',').map(str::trim).filter(|url| !url.is_empty()).map(str::to_owned).collect();
        if urls.is_empty() {
            return Err("--cluster takes one or more NATS URLs, comma-separated".to_owned());
        }
        if !(1..=5).contains(&replicas) {
            return Err("--stream-replicas is 1..=5 (JetStream's limit)".to_owned());
        }
        let valid_name = |name: &str| {
            !name.is_empty()
                && name.len() <= 64
                && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte))
        };
        if !valid_name(&stream) {
            return Err(format!("--stream `{stream}`: 1 to 64 ASCII letters, digits, `-`, `_` or `.`"));
        }
        let node_name = node_name.unwrap_or_else(|| format!("{}-{}", hostname(), listen.port()));
        if !valid_name(&node_name) {
            return Err(format!("--node-name `{node_name}`: 1 to 64 ASCII letters, digits, `-`, `_` or `.`"));
        }
        Ok(ClusterOptions {
            urls,
            node_name,
            stream,
            replicas,
            max_lag,
            stream_max_msgs: 0,
            stream_max_age: Duration::ZERO,
            snapshot_dir: None,
            snapshot_every: 0,
            coalesce: coalesce::CoalesceOptions::default(),
        })
    }
}

fn hostname() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: `gethostname` writes at most `buffer.len()` bytes into our buffer.
    let result = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    let end = buffer.iter().position(|&byte| byte == 0).unwrap_or(buffer.len());
    let name = if result == 0 { String::from_utf8_lossy(&buffer[..end]).into_owned() } else { String::new() };
    let name: String = name.chars().filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c)).collect();
    if name.is_empty() {
        "ordo".to_owned()
    } else {
        name
    }
}

/// What applying an entry produced, handed to the request that published it.
#[derive(Debug)]
pub enum Outcome {
    Write(Result<Ack, ApiError>),
    Create(Result<(bool, Arc<CollectionEntry>), ApiError>),
    Fields(Result<(u64, Arc<CollectionEntry>), ApiError>),
    Drop(Result<u64, ApiError>),
    Rules(Result<u64, ApiError>),
    Postgres(Result<crate::pg_follow::stream_entry::Applied, ApiError>),
    /// The entry did not decode (this node never publishes one).
    Malformed(ApiError),
}

impl Outcome {
    /// The error of a refused entry, if it was.
    pub fn error(&self) -> Option<&ApiError> {
        match self {
            Outcome::Write(Err(error))
            | Outcome::Create(Err(error))
            | Outcome::Fields(Err(error))
            | Outcome::Drop(Err(error))
            | Outcome::Rules(Err(error))
            | Outcome::Postgres(Err(error))
            | Outcome::Malformed(error) => Some(error),
            _ => None,
        }
    }
}

/// State shared by the network side (publishers, the consumer) and the writer
/// thread: requests waiting for their entries' outcomes, and the lag.
pub struct Shared {
    /// `<node>/<boot>/`: the message ids this process publishes start with it.
    msg_id_prefix: String,
    counter: AtomicU64,
    pending: Mutex<HashMap<String, oneshot::Sender<Outcome>>>,
    pub status: Status,
    /// The writer asks the consumer to start again from the last entry applied
    /// (after a local failure to apply one).
    pub restart: Notify,
    /// Fires once when this node stops applying for good (`gap`): the server
    /// then shuts down and exits with `status.fatal()`.
    pub fatal: Notify,
}

impl Shared {
    pub fn new(node_name: &str, max_lag: u64, applied_seq: u64) -> Arc<Shared> {
        let mut boot = [0u8; 6];
        getrandom::fill(&mut boot).expect("the OS's random numbers");
        let boot: String = boot.iter().map(|byte| format!("{byte:02x}")).collect();
        Arc::new(Shared {
            msg_id_prefix: format!("{node_name}/{boot}/"),
            counter: AtomicU64::new(0),
            pending: Mutex::new(HashMap::new()),
            status: Status::new(node_name.to_owned(), max_lag, applied_seq),
            restart: Notify::new(),
            fatal: Notify::new(),
        })
    }

    /// This node cannot go on applying the stream without a gap: it applies
    /// nothing more, says why (log, `/v1/health`'s `cluster.fatal`, lagging),
    /// and shuts down (`server::serve` returns the message: exit status 1).
    pub fn stop_for_good(&self, message: String) {
        if self.status.set_fatal(message.clone()) {
            tracing::error!("stopping: {message}");
            self.fatal.notify_one();
        }
    }

    /// A new message id (this process's prefix and `suffix`, else a number of
    /// its own), and the receiver its entry's outcome will come to.
    fn register(&self, suffix: Option<&str>) -> (String, oneshot::Receiver<Outcome>) {
        let id = match suffix {
            Some(suffix) => format!("{}{suffix}", self.msg_id_prefix),
            None => format!("{}{}", self.msg_id_prefix, self.counter.fetch_add(1, Ordering::Relaxed)),
        };
        let (sender, receiver) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(id.clone(), sender);
        (id, receiver)
    }

    fn forget(&self, id: &str) {
        self.pending.lock().expect("pending lock").remove(id);
    }

    /// Hands an applied entry's outcome to the request waiting for it, if this
    /// process published it and the request still waits.
    pub fn deliver(&self, msg_id: Option<&str>, outcome: Outcome) {
        let Some(id) = msg_id.filter(|id| id.starts_with(&self.msg_id_prefix)) else { return };
        let waiting = self.pending.lock().expect("pending lock").remove(id);
        if let Some(waiting) = waiting {
            let _ = waiting.send(outcome);
        }
    }
}

pub use log::Cluster;

pub(crate) fn unavailable(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::ClusterUnavailable, message)
}
