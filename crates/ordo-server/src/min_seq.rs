//! Read-your-writes: `min_seq`. The writer thread publishes the `seq` of the last
//! batch it applied, before it acknowledges that batch, so a client that got a
//! write's answer and then asks with `min_seq` = its `seq` never waits. A request
//! whose `min_seq` is ahead waits on the network side (an HTTP handler, or a
//! connection task that holds that message and the ones after it), never on the
//! writer thread and never by polling: a `watch` channel wakes it. The wait is
//! bounded (`limits::MIN_SEQ_WAIT_MS`), then refused with `seq_not_reached`; a
//! `min_seq` past `limits::MAX_MIN_SEQ_AHEAD` is refused at once.

use std::time::Duration;

use tokio::sync::watch;

use crate::error::{ApiError, ErrorCode};
use crate::limits;

/// The `seq` of the last batch the writer thread applied (0 before the first).
pub type SeqWatch = watch::Receiver<u64>;

/// What a request's `min_seq` asks of it, given the store's last `seq`.
#[derive(Debug)]
pub enum SeqCheck {
    /// No `min_seq`, or the store has reached it: answer at once.
    Reached,
    /// Wait for the store to reach it (at most `MIN_SEQ_WAIT_MS`).
    Wait(u64),
    /// So far ahead that it cannot be reached within the wait: refuse now.
    Refused(ApiError),
}

pub fn check(min_seq: Option<u64>, last_seq: u64) -> SeqCheck {
    match min_seq {
        None => SeqCheck::Reached,
        Some(min_seq) if min_seq <= last_seq => SeqCheck::Reached,
        Some(min_seq) if min_seq - last_seq > limits::MAX_MIN_SEQ_AHEAD => SeqCheck::Refused(ApiError::new(
            ErrorCode::SeqNotReached,
            format!(
                "min_seq {min_seq} is more than {} batches past the last one ({last_seq}); \
                 refused without waiting (max_min_seq_ahead)",
                limits::MAX_MIN_SEQ_AHEAD
            ),
        )),
        Some(min_seq) => SeqCheck::Wait(min_seq),
    }
}

/// The refusal after a wait that ran out.
pub fn not_reached(min_seq: u64, last_seq: u64) -> ApiError {
    ApiError::new(
        ErrorCode::SeqNotReached,
        format!(
            "min_seq {min_seq} was not reached within {} ms (the last batch is {last_seq}); retry later",
            limits::MIN_SEQ_WAIT_MS
        ),
    )
}

pub fn wait_bound() -> Duration {
    Duration::from_millis(limits::MIN_SEQ_WAIT_MS)
}

/// Waits until the store has applied `min_seq` (at once without one), within the bound.
pub async fn wait(seq: &SeqWatch, min_seq: Option<u64>) -> Result<(), ApiError> {
    let target = match check(min_seq, last(seq)) {
        SeqCheck::Reached => return Ok(()),
        SeqCheck::Refused(error) => return Err(error),
        SeqCheck::Wait(target) => target,
    };
    let mut watch = seq.clone();
    let reached = tokio::time::timeout(wait_bound(), async { watch.wait_for(|&last| last >= target).await.is_ok() });
    match reached.await {
        Ok(true) => Ok(()),
        // The writer thread is gone: the server is stopping.
        Ok(false) => Err(ApiError::shutting_down()),
        Err(_) => Err(not_reached(target, last(seq))),
    }
}

/// The `seq` of the last batch applied (the borrow of the watch ends here).
pub fn last(seq: &SeqWatch) -> u64 {
    *seq.borrow()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_seq_is_checked_at_its_edges() {
        assert!(matches!(check(None, 0), SeqCheck::Reached));
        assert!(matches!(check(Some(0), 0), SeqCheck::Reached));
        assert!(matches!(check(Some(41), 42), SeqCheck::Reached));
        assert!(matches!(check(Some(42), 42), SeqCheck::Reached));
        assert!(matches!(check(Some(43), 42), SeqCheck::Wait(43)));
        let far = 42 + limits::MAX_MIN_SEQ_AHEAD;
        assert!(matches!(check(Some(far), 42), SeqCheck::Wait(seq) if seq == far));
        match check(Some(far + 1), 42) {
            SeqCheck::Refused(error) => assert_eq!(error.code, ErrorCode::SeqNotReached),
            other => panic!("{other:?}"),
        }
        assert!(matches!(check(Some(u64::MAX), 0), SeqCheck::Refused(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_when_the_seq_arrives_or_the_bound_passes() {
        let (publish, seq) = watch::channel(10u64);
        assert!(wait(&seq, Some(10)).await.is_ok());
        let waiter = tokio::spawn({
            let seq = seq.clone();
            async move { wait(&seq, Some(12)).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        publish.send_replace(11);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "11 is not 12");
        publish.send_replace(12);
        assert!(waiter.await.unwrap().is_ok());
        let started = tokio::time::Instant::now();
        let error = wait(&seq, Some(13)).await.unwrap_err();
        assert_eq!(error.code, ErrorCode::SeqNotReached);
        assert_eq!(started.elapsed(), wait_bound());
    }
}
