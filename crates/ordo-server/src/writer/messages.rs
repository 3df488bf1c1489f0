//! What the network side and the writer thread say to each other: the
//! `Command`s a network task (or the cluster's consumer) sends the writer
//! through its one bounded queue, and the `Outgoing` messages the writer sends
//! back to a connection, with the state a connection shares with the writer
//! (`ConnShared`) to count its queued bytes.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::Outbox;

use ordo_core::{Batch, CollectionId, Schema};
use ordo_store::Ack;

use super::{EndReason, FieldChange};
use crate::error::ApiError;
use crate::frame::DiffsExtra;
use crate::metrics::WriterGauges;
use crate::routing::CollectionEntry;
use crate::wire::{Position, WindowSpec};
use crate::write_guard::WriteGuard;

pub type SessionId = u64;
/// A subscription's number within its session: handed out in increasing order.
pub type SubHandle = u32;

/// Bytes counted for a queued frame beyond its body: the envelope and the queue node.
pub const FRAME_OVERHEAD_BYTES: usize = 96;

/// State a connection shares with the writer thread.
#[derive(Default, Debug)]
pub struct ConnShared {
    /// Bytes of frames queued and not yet written (with `FRAME_OVERHEAD_BYTES` each).
    pub queued_bytes: AtomicUsize,
    /// Raised when the connection fell behind: frames of older epochs are dropped.
    pub epoch: AtomicU64,
    /// The writer thread wants to hear when the queue is empty (resets are due).
    pub want_drain_notice: AtomicBool,
}

pub use crate::frame_body::FrameBody;

/// A client request on one subscription (`set_range`, `set_view`) that the
/// writer thread answers: with the frame of its diffs, or, when it has none
/// (nothing changed, or the connection is behind and a Reset is due), with
/// `Outgoing::Ack`. `req` is the client's request id, if it sent one.
#[derive(Debug, Default)]
pub struct Answer {
    pub req: Option<Box<str>>,
}

/// What the writer thread sends a connection.
#[derive(Debug)]
pub enum Outgoing {
    /// One frame of diffs for one subscription. `body` is the JSON array of diffs,
    /// shared by every subscriber of the window.
    Diffs {
        handle: SubHandle,
        epoch: u64,
        body: FrameBody,
        n_diffs: u32,
        is_reset: bool,
        /// The `seq` of the last batch the window reflects after these diffs.
        write_seq: u64,
        /// The request this frame answers, if any (its own change of window).
        answers: Option<Answer>,
        /// The envelope's own fields for this subscription (`total`, `offset`).
        extra: DiffsExtra,
        /// When the writer thread queued it (for `Stage::FrameQueue`).
        queued_at: Instant,
    },
    /// A request on the subscription succeeded without a frame of its own.
    Ack {
        handle: SubHandle,
        req: Option<Box<str>>,
    },
    /// The subscription was refused; the task forgets it and tells the client.
    SubscribeFailed {
        handle: SubHandle,
        error: ApiError,
    },
    /// A window change was refused; the subscription is unchanged and keeps `spec`
    /// (which the connection records again: it recorded the refused one when it
    /// sent the change).
    RequestFailed {
        handle: SubHandle,
        error: ApiError,
        spec: Option<Box<WindowSpec>>,
        req: Option<Box<str>>,
    },
    Unsubscribed {
        handle: SubHandle,
    },
    /// The server ended the subscription (its collection was dropped, a field
    /// its view reads was removed, or the relationship it was read by ended);
    /// the task forgets it and tells the client.
    Ended {
        handle: SubHandle,
        reason: EndReason,
        message: String,
    },
    /// Wakes the task so it checks `want_drain_notice` (carries no frame).
    Wake,
}

pub type WriteResults = Vec<Result<Ack, ApiError>>;

/// The answer to a `Command::Write`: a result per part, and the parts' batches
/// back (with the list that carried them) so the network thread reuses their buffers.
pub struct WriteReply {
    pub results: WriteResults,
    pub batches: Vec<(CollectionId, Batch)>,
}

pub enum Command {
    CreateCollection {
        name: String,
        schema: Schema,
        reply: oneshot::Sender<Result<(bool, Arc<CollectionEntry>), ApiError>>,
    },
    /// One HTTP write: batches (one per collection part), each atomic on its own.
    Write {
        batches: Vec<(CollectionId, Batch)>,
        reply: oneshot::Sender<WriteReply>,
        /// When the request was handed to the writer (for `Stage::WriteQueue`).
        queued_at: Instant,
        /// Parts written under a filtered write rule, by index: checked against
        /// the items as they are before the part is written (empty for most writes,
        /// which then allocates nothing).
        guards: Vec<(usize, Arc<WriteGuard>)>,
        /// An empty list the answer's results go into, with room for one per part:
        /// the sender's (a network thread's, kept from an earlier write), so that
        /// answering allocates nothing on this thread.
        results: WriteResults,
    },
    /// Admin schema changes (`POST /v1/collections/{name}/fields`,
    /// `DELETE .../fields/{field}`): the answer is the new entry and the `seq`.
    ChangeFields {
        collection: CollectionId,
        change: FieldChange,
        reply: oneshot::Sender<Result<(u64, Arc<CollectionEntry>), ApiError>>,
    },
    /// `DELETE /v1/collections/{name}`: the answer is the drop's `seq`.
    DropCollection {
        collection: CollectionId,
        reply: oneshot::Sender<Result<u64, ApiError>>,
    },
    /// Cluster mode: a run of consecutive stream entries, each applied at
    /// exactly its seq (see `cluster::apply`). Mutating requests never come as
    /// commands then: they are published, and come back as entries.
    ApplyEntries(Vec<crate::cluster::apply::Delivered>),
    /// Cluster mode: a snapshot's copy ended (from its thread); the next one
    /// starts if it came due meanwhile.
    SnapshotFinished,
    /// Replaces the access rules: `doc` is written to the reserved collection
    /// `_ordo/rules` (durable like any batch); the answer is its `seq`.
    SetRules {
        doc: String,
        reply: oneshot::Sender<Result<u64, ApiError>>,
    },
    Query {
        collection: CollectionId,
        /// The schema `spec` was checked against (its projection holds field ids).
        schema: Arc<Schema>,
        spec: WindowSpec,
        reply: oneshot::Sender<Result<Vec<u8>, ApiError>>,
    },
    GetItem {
        collection: CollectionId,
        id: String,
        /// An access rule's row predicate: an item outside it reads as missing.
        predicate: Option<ordo_core::Filter>,
        reply: oneshot::Sender<Option<Vec<u8>>>,
    },
    CollectionLen {
        collection: CollectionId,
        reply: oneshot::Sender<usize>,
    },
    /// The ids of every item of the collection (none when it is gone): what a
    /// followed PostgreSQL table's `TRUNCATE` removes. Its follower is the
    /// collection's only writer, so the ids are still all there when its write
    /// comes.
    ItemIds {
        collection: CollectionId,
        reply: oneshot::Sender<Vec<String>>,
    },
    Gauges {
        reply: oneshot::Sender<WriterGauges>,
    },
    /// Starts a hot backup: the writer only pins the log and hands the backup
    /// back; the copy runs on a blocking thread (`backup.rs`).
    StartBackup {
        reply: oneshot::Sender<Result<ordo_store::Backup, ApiError>>,
    },
    OpenSession {
        session: SessionId,
        shared: Arc<ConnShared>,
        outbox: Outbox,
    },
    DropSession {
        session: SessionId,
    },
    Subscribe {
        session: SessionId,
        handle: SubHandle,
        collection: CollectionId,
        /// The schema `spec` was checked against (its projection holds field ids).
        schema: Arc<Schema>,
        spec: WindowSpec,
        /// The identity whose view budget the subscription's view is charged to
        /// (`None`: not budgeted; see `writer::view_budget`).
        owner: Option<Arc<str>>,
    },
    SetRange {
        session: SessionId,
        handle: SubHandle,
        position: Position,
        limit: usize,
        req: Option<Box<str>>,
    },
    SetView {
        session: SessionId,
        handle: SubHandle,
        def: ordo_core::ViewDef,
        req: Option<Box<str>>,
        /// As `Subscribe::owner`.
        owner: Option<Arc<str>>,
        /// On a collection read by relationship, the new view's relationship
        /// (`WindowSpec::relation`).
        relation: Option<Arc<crate::related::RelationCheck>>,
    },
    Unsubscribe {
        session: SessionId,
        handle: SubHandle,
    },
    /// Send this subscription a fresh Reset (a resume that cannot replay).
    Resync {
        session: SessionId,
        handle: SubHandle,
    },
    /// The connection's queue is empty: send the resets that are due.
    Drained {
        session: SessionId,
    },
}

pub type WriterSender = mpsc::Sender<Command>;
