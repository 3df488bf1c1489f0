//! Read-your-writes on a connection: a `subscribe` or `resume` whose `min_seq`
//! the store has not reached is parked here until it is (the connection task
//! wakes on the writer's published `seq`) or the bound passes. While a request
//! is parked the connection reads no later message, so requests are still
//! handled in order; frames of live subscriptions keep flowing.

use std::sync::Arc;

use super::Connection;
use crate::metrics::{self, METRICS};
use crate::min_seq;
use crate::routing::CollectionEntry;
use crate::wire::{self, WindowSpec};

/// A request held until the store reaches `min_seq`, already checked otherwise
/// (except `Parked::Unchecked`, checked when the wait is over).
pub(super) struct ParkedRequest {
    pub(super) min_seq: u64,
    pub(super) request: Parked,
}

pub(super) enum Parked {
    Subscribe {
        sub: String,
        collection: Arc<CollectionEntry>,
        spec: Box<WindowSpec>,
        req: Option<Box<str>>,
    },
    /// A `subscribe` to a collection this node did not know when it came
    /// (`Connection::awaits_its_collection`), checked once the wait is over.
    Unchecked {
        message: Box<wire::ClientMessage>,
        req: Option<Box<str>>,
    },
    /// Entries check their own `min_seq` when the resume runs; this waits for the greatest.
    Resume {
        session: String,
        entries: Vec<wire::ResumeEntry>,
        req: Option<Box<str>>,
    },
}

impl Connection {
    /// Holds a checked request until the store reaches `min_seq` or the wait
    /// ends (see `unpark`); no later message is read meanwhile.
    pub(super) fn park(&mut self, min_seq: u64, request: Parked) {
        metrics::add(&METRICS.parked_for_min_seq, 1);
        self.parked = Some(ParkedRequest { min_seq, request });
        self.park_timer.as_mut().reset(tokio::time::Instant::now() + min_seq::wait_bound());
    }

    /// The parked request's wait is over: it runs if its `min_seq` was reached,
    /// and is refused with `seq_not_reached` otherwise (a resume runs anyway,
    /// refusing only the entries whose `min_seq` was not reached).
    pub(super) async fn unpark(&mut self) {
        let Some(ParkedRequest { min_seq, request }) = self.parked.take() else { return };
        let last_seq = min_seq::last(&self.seq);
        match request {
            Parked::Subscribe { sub, collection, spec, req } => {
                if last_seq >= min_seq {
                    self.start_subscription(sub, collection, *spec, 0, req).await;
                } else {
                    self.send_error(&min_seq::not_reached(min_seq, last_seq), Some(&sub), req.as_deref()).await;
                }
            }
            Parked::Unchecked { message, req } => {
                if last_seq >= min_seq {
                    // Not the connection's first message any more: it cannot resume.
                    self.dispatch(*message, req, false).await;
                } else {
                    let sub = match &*message {
                        wire::ClientMessage::Subscribe { sub, .. } => Some(sub.as_str()),
                        _ => None,
                    };
                    self.send_error(&min_seq::not_reached(min_seq, last_seq), sub, req.as_deref()).await;
                }
            }
            Parked::Resume { session, entries, req } => self.resume(&session, entries, req).await,
        }
    }
}
