//! When a node sends one publish again, and when it gives up (`Retry`): the
//! policy alone, without I/O, so each case is tested by itself. `log::finish`
//! follows it, always with the same message id, so at most one attempt lands.
//!
//! - A timed-out attempt (a dead or frozen NATS server, a lost answer) is a
//!   failed attempt; the next one is sent at once, up to `PUBLISH_ATTEMPTS`.
//! - A publish refused at once (no stream answers: a leader being elected) is
//!   sent again with backoff for up to `NO_LEADER_WAIT` *per attempt*, counted
//!   from that attempt's start, so an attempt after a timeout still waits out
//!   the election that followed the timeout.
//! - A publish answered "duplicate message id is in process" (an earlier
//!   attempt is being proposed and the stream has not decided) is sent again
//!   with backoff without counting an attempt: it gets the stream's decision
//!   (the first attempt's sequence, or a new entry if that one was dropped).
//! - Nothing is sent again past `PUBLISH_RETRY_SPAN` after the first send:
//!   the stream's duplicate window covers that span (`stream_check`), so no
//!   attempt can land as a second entry.

use std::time::Duration;

use async_nats::jetstream;
use tokio::time::Instant;

use super::{NO_LEADER_WAIT, PUBLISH_ATTEMPTS, PUBLISH_RETRY_SPAN};

/// JetStream's error code for "duplicate message id is in process".
const MSG_ID_IN_PROCESS: u64 = 10158;
/// The first wait before a publish refused at once is sent again; it doubles.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Why an attempt failed, as far as retrying goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    TimedOut,
    /// The stream has an attempt with this message id in flight.
    InProcess,
    /// Anything else the stream answered at once ("no stream found": no leader).
    RefusedAtOnce,
}

impl Refusal {
    pub fn of(error: &jetstream::context::PublishError) -> Refusal {
        if error.kind() == jetstream::context::PublishErrorKind::TimedOut {
            return Refusal::TimedOut;
        }
        let code = std::error::Error::source(error)
            .and_then(|source| source.downcast_ref::<jetstream::Error>())
            .and_then(|error| serde_json::to_value(error.error_code()).ok())
            .and_then(|code| code.as_u64());
        if code == Some(MSG_ID_IN_PROCESS) {
            Refusal::InProcess
        } else {
            Refusal::RefusedAtOnce
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Send the same publish again after this wait.
    SendAfter(Duration),
    /// Answer `503` (the entry may still be applied).
    GiveUp,
}

/// The retry state of one publish.
#[derive(Debug)]
pub struct Retry {
    first_sent: Instant,
    attempt: u32,
    attempt_started: Instant,
    backoff: Duration,
}

impl Retry {
    /// A publish first sent at `first_sent`.
    pub fn new(first_sent: Instant) -> Retry {
        Retry { first_sent, attempt: 1, attempt_started: first_sent, backoff: FIRST_BACKOFF }
    }

    /// What to do after an attempt failed with `refusal` at `now`.
    pub fn next(&mut self, refusal: Refusal, now: Instant) -> Next {
        let next = match refusal {
            Refusal::TimedOut => self.next_attempt(now),
            Refusal::RefusedAtOnce if now.duration_since(self.attempt_started) + self.backoff < NO_LEADER_WAIT => {
                self.back_off()
            }
            Refusal::RefusedAtOnce => self.next_attempt(now),
            Refusal::InProcess => self.back_off(),
        };
        match next {
            Next::SendAfter(delay) if now.duration_since(self.first_sent) + delay >= PUBLISH_RETRY_SPAN => Next::GiveUp,
            next => next,
        }
    }

    fn next_attempt(&mut self, now: Instant) -> Next {
        if self.attempt >= PUBLISH_ATTEMPTS {
            return Next::GiveUp;
        }
        self.attempt += 1;
        self.attempt_started = now;
        self.backoff = FIRST_BACKOFF;
        Next::SendAfter(Duration::ZERO)
    }

    fn back_off(&mut self) -> Next {
        let delay = self.backoff;
        self.backoff = (delay * 2).min(MAX_BACKOFF);
        Next::SendAfter(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::PUBLISH_TIMEOUT;

    /// Feeds `refusal` until the policy gives up; the time each attempt takes
    /// (`took`) passes before each answer. Returns the sends and the time given up.
    fn until_given_up(refusal: Refusal, took: Duration) -> (u32, Duration) {
        let start = Instant::now();
        let mut retry = Retry::new(start);
        let (mut now, mut sends) = (start, 1);
        loop {
            now += took;
            match retry.next(refusal, now) {
                Next::SendAfter(delay) => {
                    now += delay;
                    sends += 1;
                }
                Next::GiveUp => return (sends, now - start),
            }
            assert!(sends < 10_000, "never gives up");
        }
    }

    #[test]
    fn timeouts_give_up_after_the_attempts() {
        assert_eq!(until_given_up(Refusal::TimedOut, PUBLISH_TIMEOUT), (PUBLISH_ATTEMPTS, PUBLISH_TIMEOUT * 3));
    }

    #[test]
    fn a_publish_refused_at_once_waits_for_a_leader_on_every_attempt() {
        let (_, gave_up) = until_given_up(Refusal::RefusedAtOnce, Duration::ZERO);
        assert!(gave_up >= (NO_LEADER_WAIT - MAX_BACKOFF) * PUBLISH_ATTEMPTS, "{gave_up:?}");
        assert!(gave_up <= NO_LEADER_WAIT * PUBLISH_ATTEMPTS, "{gave_up:?}");
    }

    /// The chaos run's case: after a timed-out attempt, the next one still
    /// gets a whole `NO_LEADER_WAIT` for the election.
    #[test]
    fn an_attempt_after_a_timeout_gets_its_own_wait_for_a_leader() {
        let start = Instant::now();
        let mut retry = Retry::new(start);
        let mut now = start + PUBLISH_TIMEOUT;
        assert_eq!(retry.next(Refusal::TimedOut, now), Next::SendAfter(Duration::ZERO));
        let second_attempt = now;
        while now.duration_since(second_attempt) < NO_LEADER_WAIT - MAX_BACKOFF {
            match retry.next(Refusal::RefusedAtOnce, now) {
                Next::SendAfter(delay) => now += delay,
                Next::GiveUp => panic!("gave up {:?} into the second attempt", now - second_attempt),
            }
        }
    }

    #[test]
    fn a_message_id_in_process_is_asked_again_without_using_attempts_until_the_span() {
        let (sends, gave_up) = until_given_up(Refusal::InProcess, Duration::from_millis(1));
        assert!(sends > PUBLISH_ATTEMPTS * 10, "{sends}");
        assert!(gave_up <= PUBLISH_RETRY_SPAN && gave_up >= PUBLISH_RETRY_SPAN - MAX_BACKOFF, "{gave_up:?}");
    }

    #[test]
    fn nothing_is_sent_again_past_the_span_the_duplicate_window_covers() {
        for refusal in [Refusal::TimedOut, Refusal::RefusedAtOnce, Refusal::InProcess] {
            for took_ms in [0, 7, 900, 5_000, 20_000] {
                let (_, gave_up) = until_given_up(refusal, Duration::from_millis(took_ms));
                let last_send = gave_up.saturating_sub(Duration::from_millis(took_ms));
                assert!(last_send < PUBLISH_RETRY_SPAN, "{refusal:?} {took_ms} ms: {gave_up:?}");
            }
        }
    }
}
