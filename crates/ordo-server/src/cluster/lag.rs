//! How far this node is behind the stream: `/v1/health`'s `cluster` object,
//! the `ordo_cluster_*` metrics, and the `lagging` refusal of new subscribers.
//!
//! The stream's last seq is only known as of the last time the stream said it
//! (a poll every second, or a delivered entry). While the stream cannot be read
//! (no stream leader during an election, NATS unreachable), the last known value
//! is kept and its age reported: past `STALE_AFTER` the lag in seconds is at
//! least that age (it is never 0 for a node that cannot tell), and past
//! `STALE_LAGGING_AFTER` the node counts as lagging.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::pack::SeqScheme;
use crate::error::{ApiError, ErrorCode};

pub struct Status {
    pub node: String,
    max_lag: u64,
    /// The seq of the last entry applied (the writer thread stores it after each entry).
    applied_seq: AtomicU64,
    /// How the stream's messages number their entries (`SeqScheme`'s shift),
    /// set once the stream is opened, before anything is applied.
    seq_shift: AtomicU32,
    /// The stream's last sequence as last seen (a delivered message's info, or
    /// the stream's state, polled every second).
    stream_last_seq: AtomicU64,
    /// When the stream received the last entry applied (Unix nanoseconds; 0: none yet).
    applied_published_ns: AtomicU64,
    /// When the stream last told this node its last seq (Unix nanoseconds).
    stream_seen_ns: AtomicU64,
    /// Why this node stopped applying for good (a gap in the stream): set once,
    /// then the node shuts down (`cluster::gap`).
    fatal: Mutex<Option<String>>,
}

/// The stream's state is stale after this long without word from it (three
/// missed polls): `lag_seconds` is then at least its age.
pub const STALE_AFTER: Duration = Duration::from_secs(3);
/// After this long without word from the stream, the node cannot tell how far
/// behind it is and counts as lagging (refuses new subscribers). Longer than a
/// stream leader election takes, so a failover does not make every node refuse.
pub const STALE_LAGGING_AFTER: Duration = Duration::from_secs(10);

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as u64)
}

impl Status {
    pub fn new(node: String, max_lag: u64, applied_seq: u64) -> Status {
        Status {
            node,
            max_lag,
            applied_seq: AtomicU64::new(applied_seq),
            seq_shift: AtomicU32::new(0),
            // Unknown until the stream is asked, before the node serves.
            stream_last_seq: AtomicU64::new(applied_seq),
            applied_published_ns: AtomicU64::new(0),
            // Counted from start: the stream is asked before the node serves.
            stream_seen_ns: AtomicU64::new(now_ns()),
            fatal: Mutex::new(None),
        }
    }

    pub fn applied_seq(&self) -> u64 {
        self.applied_seq.load(Ordering::Acquire)
    }

    pub(crate) fn set_scheme(&self, scheme: SeqScheme) {
        self.seq_shift.store(scheme.shift(), Ordering::Release);
        // Until the stream says its last seq, it holds what this node applied.
        self.stream_last_seq.store(self.applied_stream_seq(), Ordering::Release);
    }

    pub fn scheme(&self) -> SeqScheme {
        SeqScheme::with_shift(self.seq_shift.load(Ordering::Acquire))
    }

    /// The last stream message applied whole.
    pub fn applied_stream_seq(&self) -> u64 {
        self.scheme().applied_stream_seq(self.applied_seq())
    }

    /// The first stream message this node still needs (`SeqScheme::resume_stream_seq`).
    pub fn resume_stream_seq(&self) -> u64 {
        self.scheme().resume_stream_seq(self.applied_seq())
    }

    pub fn stream_last_seq(&self) -> u64 {
        self.stream_last_seq.load(Ordering::Acquire).max(self.applied_stream_seq())
    }

    pub(crate) fn set_applied(&self, seq: u64, published_ns: u64) {
        self.applied_seq.store(seq, Ordering::Release);
        self.applied_published_ns.store(published_ns, Ordering::Release);
    }

    /// The stream holds seq `seq` (an entry delivered): raises the last
    /// sequence as seen (never lowers it) and marks it fresh.
    pub(crate) fn saw_stream_seq(&self, seq: u64) {
        self.saw_stream_seq_at(seq, now_ns());
    }

    pub(crate) fn saw_stream_seq_at(&self, seq: u64, at_ns: u64) {
        self.stream_last_seq.fetch_max(seq, Ordering::AcqRel);
        self.stream_seen_ns.fetch_max(at_ns, Ordering::AcqRel);
    }

    /// The stream's own state says its last sequence is `seq`: that replaces
    /// the value as seen, lower or not. A value raised past what the stream
    /// holds would otherwise never come down, and the node would count as
    /// lagging for good (restarting its consumer every few seconds to wait
    /// for entries that do not exist). A state older than an entry seen
    /// meanwhile lowers it only until the next poll, a second later.
    pub(crate) fn stream_said_last_seq(&self, seq: u64) {
        self.stream_last_seq.store(seq, Ordering::Release);
        self.stream_seen_ns.fetch_max(now_ns(), Ordering::AcqRel);
    }

    /// How long since the stream last told this node its last sequence.
    pub fn stream_state_age(&self) -> Duration {
        Duration::from_nanos(now_ns().saturating_sub(self.stream_seen_ns.load(Ordering::Acquire)))
    }

    /// Whether `stream_last_seq` is older than `STALE_AFTER`: the lag in entries
    /// is then a lower bound.
    pub fn is_stream_state_stale(&self) -> bool {
        self.stream_state_age() > STALE_AFTER
    }

    /// Records why this node stops applying for good; false if it was already.
    pub(crate) fn set_fatal(&self, message: String) -> bool {
        let mut fatal = self.fatal.lock().expect("fatal lock");
        if fatal.is_some() {
            return false;
        }
        *fatal = Some(message);
        true
    }

    pub fn fatal(&self) -> Option<String> {
        self.fatal.lock().expect("fatal lock").clone()
    }

    /// Stream messages not yet applied whole (entries, in a stream of one entry per message).
    pub fn lag_entries(&self) -> u64 {
        self.stream_last_seq() - self.applied_stream_seq()
    }

    /// Zero when caught up; else how long ago the stream received the last
    /// entry this node applied (a bound on how stale its views are). While the
    /// stream's state is stale, at least its age: entries may have come since
    /// without this node hearing of them.
    pub fn lag_seconds(&self) -> f64 {
        let stale = if self.is_stream_state_stale() { self.stream_state_age().as_secs_f64() } else { 0.0 };
        if self.lag_entries() == 0 {
            return stale;
        }
        let published = self.applied_published_ns.load(Ordering::Acquire);
        if published == 0 {
            return stale;
        }
        (now_ns().saturating_sub(published) as f64 / 1e9).max(stale)
    }

    /// Over `--cluster-max-lag` entries behind, or without word from the stream
    /// for `STALE_LAGGING_AFTER`, or stopped for good: new subscribers are refused.
    pub fn is_lagging(&self) -> bool {
        self.lag_entries() > self.max_lag
            || self.stream_state_age() > STALE_LAGGING_AFTER
            || self.fatal.lock().expect("fatal lock").is_some()
    }

    /// `lagging` (503) when this node is too far behind to take a subscriber.
    pub fn check_not_lagging(&self) -> Result<(), ApiError> {
        if !self.is_lagging() {
            return Ok(());
        }
        let why = if let Some(fatal) = self.fatal() {
            format!("this node stopped applying the stream ({fatal})")
        } else if self.lag_entries() > self.max_lag {
            format!(
                "this node is {} entries behind the stream (over --cluster-max-lag {})",
                self.lag_entries(),
                self.max_lag
            )
        } else {
            format!(
                "this node has not been able to read the stream's state for {:.0} s, so it cannot tell how far behind it is",
                self.stream_state_age().as_secs_f64()
            )
        };
        Err(ApiError::new(ErrorCode::Lagging, format!("{why}; try another node or again later")))
    }

    /// `/v1/health`'s `cluster` object.
    pub fn health_json(&self) -> serde_json::Value {
        serde_json::json!({
            "node": self.node,
            "applied_seq": self.applied_seq(),
            "applied_stream_seq": self.applied_stream_seq(),
            "stream_last_seq": self.stream_last_seq(),
            "lag_entries": self.lag_entries(),
            "lag_seconds": self.lag_seconds(),
            "stream_state_age_seconds": self.stream_state_age().as_secs_f64(),
            "stream_state_stale": self.is_stream_state_stale(),
            "lagging": self.is_lagging(),
            "fatal": self.fatal(),
        })
    }

    /// The `ordo_cluster_*` lines of `/metrics`.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        // No `node` label: one process is one node, like every other series here.
        let _ = writeln!(out, "# HELP ordo_cluster_applied_seq The seq of the last entry this node applied.");
        let _ = writeln!(out, "# TYPE ordo_cluster_applied_seq gauge");
        let _ = writeln!(out, "ordo_cluster_applied_seq {}", self.applied_seq());
        let _ =
            writeln!(out, "# HELP ordo_cluster_applied_stream_seq The last stream message this node applied whole.");
        let _ = writeln!(out, "# TYPE ordo_cluster_applied_stream_seq gauge");
        let _ = writeln!(out, "ordo_cluster_applied_stream_seq {}", self.applied_stream_seq());
        let _ = writeln!(out, "# HELP ordo_cluster_lag_entries Stream entries not yet applied by this node.");
        let _ = writeln!(out, "# TYPE ordo_cluster_lag_entries gauge");
        let _ = writeln!(out, "ordo_cluster_lag_entries {}", self.lag_entries());
        let _ = writeln!(
            out,
            "# HELP ordo_cluster_lag_seconds Age of the last entry applied while behind (0 when caught up)."
        );
        let _ = writeln!(out, "# TYPE ordo_cluster_lag_seconds gauge");
        let _ = writeln!(out, "ordo_cluster_lag_seconds {:.3}", self.lag_seconds());
        let _ = writeln!(
            out,
            "# HELP ordo_cluster_stream_state_age_seconds Time since the stream last told this node its last entry."
        );
        let _ = writeln!(out, "# TYPE ordo_cluster_stream_state_age_seconds gauge");
        let _ = writeln!(out, "ordo_cluster_stream_state_age_seconds {:.3}", self.stream_state_age().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_what_the_stream_holds_past_the_applied_seq() {
        let status = Status::new("n".to_owned(), 10, 5);
        assert_eq!(status.lag_entries(), 0);
        assert_eq!(status.lag_seconds(), 0.0);
        status.saw_stream_seq(15);
        assert_eq!(status.lag_entries(), 10);
        assert!(!status.is_lagging(), "at the limit is not over it");
        status.saw_stream_seq(16);
        assert!(status.is_lagging());
        assert_eq!(status.check_not_lagging().unwrap_err().code, ErrorCode::Lagging);
        status.saw_stream_seq(3);
        assert_eq!(status.stream_last_seq(), 16, "an entry seen never lowers it");
        status.stream_said_last_seq(15);
        assert_eq!(status.stream_last_seq(), 15, "the stream's own state does");
        assert_eq!(status.lag_entries(), 10);
        status.saw_stream_seq(16);
        status.set_applied(16, now_ns() - 2_000_000_000);
        assert_eq!(status.lag_entries(), 0);
        assert!(!status.is_lagging());
        status.saw_stream_seq(17);
        assert!(status.lag_seconds() >= 2.0);
    }

    /// After a leader kill the stream's state could not be read and lag read 0
    /// while the node waited for entries it had not heard of: a stale state
    /// keeps its last value, says its age, and never reads as "caught up, 0 s".
    #[test]
    fn a_stream_state_that_cannot_be_read_is_reported_stale_never_as_no_lag() {
        let status = Status::new("n".to_owned(), 10, 5);
        status.saw_stream_seq(5);
        assert!(!status.is_stream_state_stale());
        assert_eq!(status.lag_seconds(), 0.0);
        // The last answer came 4 s ago; polls since failed.
        let status = Status::new("n".to_owned(), 10, 5);
        status.stream_seen_ns.store(now_ns() - 4_000_000_000, Ordering::Release);
        status.saw_stream_seq_at(5, 0);
        assert_eq!(status.stream_last_seq(), 5, "the last known value is kept");
        assert_eq!(status.lag_entries(), 0);
        assert!(status.is_stream_state_stale());
        assert!(status.lag_seconds() >= 4.0, "{}", status.lag_seconds());
        assert!(!status.is_lagging(), "stale, but not yet for STALE_LAGGING_AFTER");
        status.stream_seen_ns.store(now_ns() - 11_000_000_000, Ordering::Release);
        assert!(status.is_lagging());
        let refusal = status.check_not_lagging().unwrap_err();
        assert!(refusal.message.contains("cannot tell how far behind"), "{}", refusal.message);
        let health = status.health_json();
        assert_eq!(health["stream_state_stale"], true);
        assert!(health["stream_state_age_seconds"].as_f64().unwrap() >= 11.0);
        // An answer makes it fresh again.
        status.saw_stream_seq(5);
        assert!(!status.is_stream_state_stale() && !status.is_lagging());
        assert_eq!(status.lag_seconds(), 0.0);
    }

    #[test]
    fn a_fatal_stop_is_kept_once_and_makes_the_node_lagging() {
        let status = Status::new("n".to_owned(), 10, 5);
        assert!(status.set_fatal("a gap".to_owned()));
        assert!(!status.set_fatal("another".to_owned()));
        assert_eq!(status.fatal().as_deref(), Some("a gap"));
        assert!(status.is_lagging());
        assert_eq!(status.health_json()["fatal"], "a gap");
    }
}
