//! A connection's subscription state (`Session`), which outlives the connection
//! for resume (held meanwhile by `registry::Registry`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::frame::DiffsExtra;
use crate::limits;
use crate::sub_table::SubTable;
use crate::wire::WindowSpec;
use crate::writer::{ConnShared, FrameBody, OutboxReceiver, SessionId, SubHandle, FRAME_OVERHEAD_BYTES};

/// A subscription as its connection knows it.
pub(super) struct SubEntry {
    pub(super) client_id: String,
    pub(super) collection: Arc<crate::routing::CollectionEntry>,
    pub(super) spec: WindowSpec,
    /// The `seq` of the last frame sent.
    pub(super) seq: u64,
    /// The last frames sent, for replay on resume.
    pub(super) retained: VecDeque<RetainedFrame>,
    pub(super) retained_bytes: usize,
    /// Frames before the next Reset are stale (a resume that could not replay).
    pub(super) awaiting_reset: bool,
    /// The range (`offset`, `limit`) of an answer that was dropped with a stale
    /// frame: the next frame written for this subscription carries it instead.
    pub(super) range_due: Option<(u64, u64)>,
    /// The `req` of the `subscribe` that made it: its first frame carries it.
    pub(super) subscribe_req: Option<Box<str>>,
    /// The `req` of the `unsubscribe` sent for it: `unsubscribed` carries it.
    pub(super) unsubscribe_req: Option<Box<str>>,
}

/// A frame kept for replay: sent again exactly as it was (`write_seq`, `total`
/// and all), but without `req`: the request it answered was the old connection's.
#[derive(Clone, Debug)]
pub(super) struct RetainedFrame {
    pub(super) seq: u64,
    pub(super) write_seq: u64,
    pub(super) body: FrameBody,
    pub(super) n_diffs: u32,
    pub(super) extra: DiffsExtra,
}

impl SubEntry {
    pub(super) fn retain(&mut self, frame: RetainedFrame) {
        self.retained_bytes += frame.body.len();
        self.retained.push_back(frame);
        while self.retained.len() > limits::RETAINED_FRAMES_PER_SUBSCRIPTION
            || self.retained_bytes > limits::RETAINED_BYTES_PER_SUBSCRIPTION
        {
            let dropped = self.retained.pop_front().expect("over a limit, so not empty");
            self.retained_bytes -= dropped.body.len();
        }
    }
}

/// The owner of every session until connections carry identities.
pub const ANONYMOUS_OWNER: &str = "anonymous";

/// A connection's subscription state; it outlives the connection for resume.
pub struct Session {
    pub(super) id: SessionId,
    /// The resume token: 128 random bits, replaced at every resume.
    pub(super) token: String,
    /// The identity that opened the session: parked sessions are budgeted per
    /// owner, and only the same owner may resume one.
    pub(super) owner: Arc<str>,
    pub(super) shared: Arc<ConnShared>,
    pub(super) outbox: OutboxReceiver,
    pub(super) table: SubTable<SubEntry>,
    pub(super) by_client_id: HashMap<String, SubHandle>,
    pub(super) next_handle: SubHandle,
}

impl Session {
    /// The estimated bytes a parked session holds, besides the frames queued for
    /// it (those are read live: they may grow while it is parked). See
    /// `limits::PARKED_WINDOW_ITEM_BYTES`.
    pub(super) fn parked_cost_bytes(&self) -> usize {
        let subs: usize = self
            .table
            .iter()
            .map(|(_, entry)| {
                limits::PARKED_SUBSCRIPTION_OVERHEAD_BYTES
                    + entry.client_id.len()
                    + entry.retained_bytes
                    + entry.retained.len() * FRAME_OVERHEAD_BYTES
                    + entry.spec.limit.saturating_mul(limits::PARKED_WINDOW_ITEM_BYTES)
            })
            .sum();
        limits::PARKED_SESSION_OVERHEAD_BYTES + subs
    }
}
