//! Entries missing from what the consumer delivers (a node never applies past a silent gap).
//!
//! The stream's seqs are dense: Ordo publishes every entry on one subject and
//! never deletes one. A consumer that delivers seq S when it expected E < S
//! therefore skipped E..S−1, and only two things remove entries from a stream:
//! - its retention (`max_msgs`, `max_age`) dropped them, oldest first, while this
//!   node was behind (paused, cut off, or its consumer restarted just after the
//!   drop: the start-up check can pass an instant before retention moves on).
//!   The stream's first seq is then past E, for good. Applying S would leave a
//!   hole no later entry fills: the node stops instead ([`Shared::stop_for_good`]),
//!   and at its next start `snapshot::check_resume` refuses with the same gap
//!   until its data directory is emptied and it restores a snapshot;
//! - an operator deleted those entries by hand (`nats stream rmm`): the stream
//!   still holds entries before them (first seq ≤ E). Every node that reads the
//!   stream from then on records the same seq markers (`apply::apply_next`), so
//!   they agree with each other; a node that applied them earlier does not (the
//!   operator's doing, logged).
//!
//! The two are told apart by reading the stream's bounds *after* the jump was
//! seen: retention only ever raises the first seq, so a first seq ≤ E then
//! means E..S−1 were not dropped by retention.
//!
//! A reading can also be stale. A NATS server frozen while it led the stream
//! (SIGSTOP, a partition) answers as that leader for a moment once it runs
//! again, with the stream as it was: its last seq can be below what this node
//! applied since. A stream's last seq never goes down, so a reading of the
//! bound stream (same creation time) that ends before this node's seq is such
//! an answer, and the consumer reads again instead of stopping; only a stream
//! created again under the same name stops the node.
//!
//! [`Shared::stop_for_good`]: super::Shared::stop_for_good

use super::log::StreamState;
use super::snapshot::{check_resume, StreamBounds};
use super::Cluster;

/// The consumer expected `expected` and was handed `delivered` (greater).
/// `Ok` when the missing entries were deleted by hand (apply goes on, with seq
/// markers); `Err` when the consumer must not go on: the node stopped for good
/// (retention dropped them; `status.fatal()` is set), or the stream's bounds
/// could not be read (the consumer starts again and checks at its start).
pub async fn check(cluster: &Cluster, expected: u64, delivered: u64) -> Result<(), String> {
    let state = cluster.stream_state().await.map_err(|error| {
        format!("seq {delivered} delivered where {expected} was expected, and then {error}; consuming again")
    })?;
    refuse_stale(cluster, &state, expected - 1)?;
    cluster.shared.status.stream_said_last_seq(state.last_seq);
    let bounds = StreamBounds { first_seq: state.first_seq, last_seq: state.last_seq };
    verdict(&cluster.options.stream, expected, delivered, bounds)
        .inspect_err(|message| cluster.shared.stop_for_good(message.clone()))
}

/// `Err` (read again) when `state`, a reading of the stream this node bound
/// to, ends before `local_seq`, which this node applied from that stream: the
/// answer of a server that has not caught up (see the module doc).
fn refuse_stale(cluster: &Cluster, state: &StreamState, local_seq: u64) -> Result<(), String> {
    if !is_stale(cluster.is_bound_stream(state), state.last_seq, local_seq) {
        return Ok(());
    }
    let message = format!(
        "the stream's state as a NATS server answered ends at seq {}, before this node's seq {local_seq}: a \
         server that has not caught up answered (one just thawed after a freeze, say); reading again",
        state.last_seq
    );
    tracing::warn!(stream_last_seq = state.last_seq, local_seq, "{message}");
    Err(message)
}

/// Whether a reading that ends at `last_seq` is stale for a node at `local_seq`.
fn is_stale(is_bound_stream: bool, last_seq: u64, local_seq: u64) -> bool {
    is_bound_stream && last_seq < local_seq
}

/// What the stream's bounds, read after the jump from `expected` to `delivered`,
/// say about it: `Err` with the message the operator sees when the node must stop.
pub fn verdict(stream: &str, expected: u64, delivered: u64, bounds: StreamBounds) -> Result<(), String> {
    match check_resume(expected - 1, bounds) {
        Ok(_) => {
            tracing::warn!(
                expected,
                delivered,
                first_seq = bounds.first_seq,
                "the stream has no entries {expected}..={} although it holds older ones: they were deleted by hand; \
                 recording them as empty",
                delivered - 1
            );
            Ok(())
        }
        Err(error) => Err(format!(
            "stream `{stream}`: the consumer delivered seq {delivered} where this node needs seq {expected}: entries \
             {expected}..={} are gone from the stream. Applying on would leave a silent gap, so this node applies \
             nothing more and stops. {error}",
            delivered - 1
        )),
    }
}

/// Whether a consumer that starts at `start_seq` can: `Err` (after stopping the
/// node for good) when the stream no longer holds it; `Err` alone (read again)
/// when the reading is stale.
pub fn check_start(cluster: &Cluster, start_seq: u64, state: &StreamState) -> Result<(), String> {
    refuse_stale(cluster, state, start_seq - 1)?;
    let bounds = StreamBounds { first_seq: state.first_seq, last_seq: state.last_seq };
    check_resume(start_seq - 1, bounds).map(|_| ()).map_err(|error| {
        let message = format!(
            "stream `{}`: the consumer must start at seq {start_seq}, which the stream no longer holds: this node \
             applies nothing more and stops. {error}",
            cluster.options.stream
        );
        cluster.shared.stop_for_good(message.clone());
        message
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jump_past_the_first_seq_stops_and_an_interior_hole_does_not() {
        let bounds = |first_seq, last_seq| StreamBounds { first_seq, last_seq };
        // Retention dropped 11..=40: the stream now starts at 41.
        let error = verdict("ORDO", 11, 41, bounds(41, 90)).unwrap_err();
        for part in ["seq 41 where this node needs seq 11", "11..=40", "stops", "cannot start without a gap"] {
            assert!(error.contains(part), "{error}");
        }
        // Retention moved on further since the jump was seen: still a gap.
        assert!(verdict("ORDO", 11, 41, bounds(60, 90)).is_err());
        // Dropped at the first seq exactly: the stream starts at 12, 11 is gone.
        assert!(verdict("ORDO", 11, 12, bounds(12, 90)).is_err());
        // 11..=40 deleted by hand while 5.. are still there: markers, no stop.
        assert!(verdict("ORDO", 11, 41, bounds(5, 90)).is_ok());
        assert!(verdict("ORDO", 11, 41, bounds(11, 90)).is_ok());
    }

    #[test]
    fn a_reading_behind_this_node_is_stale_only_for_the_bound_stream() {
        // The bound stream, read behind seq 13 this node applied: a stale answer.
        assert!(is_stale(true, 5, 13));
        assert!(!is_stale(true, 13, 13));
        assert!(!is_stale(true, 20, 13));
        // A stream created again under the name: not stale, the node stops.
        assert!(!is_stale(false, 5, 13));
    }
}
