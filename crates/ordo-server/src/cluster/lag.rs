//! How far this node is behind the stream: `/v1/health`'s `cluster` object,
//! the `ordo_cluster_*` metrics, and the `lagging` refusal of new subscribers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{ApiError, ErrorCode};

pub struct Status {
    pub node: String,
    max_lag: u64,
    /// The last entry applied (the writer thread stores it after each entry).
    applied_seq: AtomicU64,
    /// The stream's last sequence as last seen (a delivered message's info, or
    /// the stream's state, polled every second).
    stream_last_seq: AtomicU64,
    /// When the stream received the last entry applied (Unix nanoseconds; 0: none yet).
    applied_published_ns: AtomicU64,
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as u64)
}

impl Status {
    pub fn new(node: String, max_lag: u64, applied_seq: u64) -> Status {
        Status {
            node,
            max_lag,
            applied_seq: AtomicU64::new(applied_seq),
            // Unknown until the stream is asked, before the node serves.
            stream_last_seq: AtomicU64::new(applied_seq),
            applied_published_ns: AtomicU64::new(0),
        }
    }

    pub fn applied_seq(&self) -> u64 {
        self.applied_seq.load(Ordering::Acquire)
    }

    pub fn stream_last_seq(&self) -> u64 {
        self.stream_last_seq.load(Ordering::Acquire).max(self.applied_seq())
    }

    pub(crate) fn set_applied(&self, seq: u64, published_ns: u64) {
        self.applied_seq.store(seq, Ordering::Release);
        self.applied_published_ns.store(published_ns, Ordering::Release);
    }

    /// Raises the stream's last sequence as seen (never lowers it).
    pub(crate) fn saw_stream_seq(&self, seq: u64) {
        self.stream_last_seq.fetch_max(seq, Ordering::AcqRel);
    }

    pub fn lag_entries(&self) -> u64 {
        self.stream_last_seq() - self.applied_seq()
    }

    /// Zero when caught up; else how long ago the stream received the last
    /// entry this node applied (a bound on how stale its views are).
    pub fn lag_seconds(&self) -> f64 {
        if self.lag_entries() == 0 {
            return 0.0;
        }
        let published = self.applied_published_ns.load(Ordering::Acquire);
        if published == 0 {
            return 0.0;
        }
        now_ns().saturating_sub(published) as f64 / 1e9
    }

    /// Over `--cluster-max-lag` entries behind: new subscribers are refused.
    pub fn is_lagging(&self) -> bool {
        self.lag_entries() > self.max_lag
    }

    /// `lagging` (503) when this node is too far behind to take a subscriber.
    pub fn check_not_lagging(&self) -> Result<(), ApiError> {
        if self.is_lagging() {
            return Err(ApiError::new(
                ErrorCode::Lagging,
                format!(
                    "this node is {} entries behind the stream (over --cluster-max-lag {}); try another node or again later",
                    self.lag_entries(),
                    self.max_lag
                ),
            ));
        }
        Ok(())
    }

    /// `/v1/health`'s `cluster` object.
    pub fn health_json(&self) -> serde_json::Value {
        serde_json::json!({
            "node": self.node,
            "applied_seq": self.applied_seq(),
            "stream_last_seq": self.stream_last_seq(),
            "lag_entries": self.lag_entries(),
            "lag_seconds": self.lag_seconds(),
            "lagging": self.is_lagging(),
        })
    }

    /// The `ordo_cluster_*` lines of `/metrics`.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        // No `node` label: one process is one node, like every other series here.
        let _ = writeln!(out, "# HELP ordo_cluster_applied_seq The last stream entry this node applied.");
        let _ = writeln!(out, "# TYPE ordo_cluster_applied_seq gauge");
        let _ = writeln!(out, "ordo_cluster_applied_seq {}", self.applied_seq());
        let _ = writeln!(out, "# HELP ordo_cluster_lag_entries Stream entries not yet applied by this node.");
        let _ = writeln!(out, "# TYPE ordo_cluster_lag_entries gauge");
        let _ = writeln!(out, "ordo_cluster_lag_entries {}", self.lag_entries());
        let _ = writeln!(
            out,
            "# HELP ordo_cluster_lag_seconds Age of the last entry applied while behind (0 when caught up)."
        );
        let _ = writeln!(out, "# TYPE ordo_cluster_lag_seconds gauge");
        let _ = writeln!(out, "ordo_cluster_lag_seconds {:.3}", self.lag_seconds());
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
        assert_eq!(status.stream_last_seq(), 16, "never lowered");
        status.set_applied(16, now_ns() - 2_000_000_000);
        assert_eq!(status.lag_entries(), 0);
        assert!(!status.is_lagging());
        status.saw_stream_seq(17);
        assert!(status.lag_seconds() >= 2.0);
    }
}
