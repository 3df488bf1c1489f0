//! The writer thread: the only owner of the engine and the store. Network tasks
//! send it typed, pre-checked requests through one bounded queue; it commits
//! writes in groups, applies them, and encodes each changed window's diffs once,
//! handing the shared bytes to every subscriber's outbound queue. Nothing on this
//! path takes a lock.
//!
//! Slow consumers: each connection's queued bytes are counted (an atomic shared
//! with its connection task). A frame that would push a connection past its
//! budget is not queued: instead the connection's *epoch* goes up (its task then
//! drops every older frame still queued) and each of its subscriptions is marked
//! for a reset, which is sent once the task reports that it has drained.
//!
//! Here: the `Writer` and its command loop. Its parts by job: `messages` (what
//! the network side and the writer say to each other), `fanout` (the diff sink
//! and the subscriptions it serves), `writes` (group commits, guarded writes),
//! `subscriptions` (opening, moving and closing subscriptions' windows),
//! `queries` (one-shot reads), `schema_change` (collections created, changed
//! and dropped) and `view_budget` (each identity's views).

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use ordo_core::{CollectionId, WindowId};
use ordo_store::Database;

use crate::error::ApiError;
use crate::metrics;
use crate::min_seq::SeqWatch;
use crate::routing::{is_reserved_name, CollectionEntry, Routes};

mod fanout;
mod messages;
mod outbox_queue;
mod queries;
mod relations;
mod schema_change;
mod subscriptions;
mod view_budget;
mod writes;

pub use fanout::share_key;
pub use messages::{
    Answer, Command, ConnShared, FrameBody, Outgoing, SessionId, SubHandle, WriteReply, WriteResults, WriterSender,
    FRAME_OVERHEAD_BYTES,
};
pub use outbox_queue::{outbox, Outbox, OutboxReceiver};
pub use schema_change::{EndReason, FieldChange};

use fanout::Fanout;
use subscriptions::WindowChange;
use writes::GroupBuffers;

/// Most windows waiting for the writer's idle time to finish their views' indexes.
const MAX_UNPREPARED_WINDOWS: usize = 4096;
/// Views of collections up to this size are sorted in full when their first
/// window opens (about 0.1 ms for 1 000 rooms), not in idle time: in chat runs
/// the writes came right after the subscriptions, before the idle time, and
/// groups of the first second cost 50–170 µs a batch instead of 13.
const EAGER_PREPARE_MAX_ITEMS: usize = 16 * 1024;

/// The reserved collection that holds the access rules (one item, `RULES_ITEM`,
/// whose payload is the rules document), so that they are as durable as the
/// data, replayed with it and copied with it. Clients cannot reach it.
pub const RULES_COLLECTION: &str = "_ordo/rules";
pub const RULES_ITEM: &str = "rules";

pub struct Writer {
    database: Database,
    fanout: Fanout,
    routes: Routes,
    /// The `seq` of the last batch applied, for requests waiting on a `min_seq`:
    /// published after each group is applied and before it is acknowledged.
    last_seq: watch::Sender<u64>,
    /// Windows opened since the writer was last idle. Views sort lazily (only what
    /// the first window shows); the rest is sorted at the view's first update,
    /// which then pays for it. The writer sorts these when it has nothing to do.
    unprepared: Vec<WindowId>,
    /// Cluster mode's writer-side state (`None` in single-node mode).
    cluster: Option<Box<crate::cluster::apply::Applier>>,
    /// The views each budgeted identity holds.
    view_budgets: view_budget::ViewBudgets,
}

impl Writer {
    pub fn new(database: Database, routes: Routes, outbound_budget: usize) -> Writer {
        let fanout = Fanout::new(outbound_budget, database.last_seq());
        let (last_seq, _) = watch::channel(database.last_seq());
        Writer {
            database,
            fanout,
            routes,
            last_seq,
            unprepared: Vec::new(),
            cluster: None,
            view_budgets: Default::default(),
        }
    }

    /// Cluster mode: this writer applies the stream's entries.
    /// Cluster mode: the writer's own queue, for its snapshot thread to wake it.
    pub fn wake_with(&mut self, commands: &mpsc::Sender<Command>) {
        if let Some(applier) = &mut self.cluster {
            applier.wake_writer_with(commands.downgrade());
        }
    }

    pub fn with_cluster(mut self, applier: crate::cluster::apply::Applier) -> Writer {
        self.cluster = Some(Box::new(applier));
        self
    }

    pub fn database(&self) -> &Database {
        &self.database
    }

    pub(crate) fn database_mut(&mut self) -> &mut Database {
        &mut self.database
    }

    pub(crate) fn routes(&self) -> &Routes {
        &self.routes
    }

    /// The `seq` of the last batch applied, as it changes.
    pub fn seq_watch(&self) -> SeqWatch {
        self.last_seq.subscribe()
    }

    /// Tells waiting requests the new last `seq`: called after anything that may
    /// have written, before the writes are acknowledged, so that a client never
    /// waits for a `seq` it was already given.
    pub(crate) fn publish_seq(&mut self) {
        let last_seq = self.database.last_seq();
        self.fanout.write_seq = last_seq;
        self.last_seq.send_if_modified(|published| {
            let changed = *published != last_seq;
            *published = last_seq;
            changed
        });
    }

    /// Fills the routing table from the collections loaded at start.
    pub fn publish_routes(&self) {
        let engine = self.database.engine();
        let mut routes = self.routes.write().expect("routes lock");
        for id in engine.collection_ids() {
            let collection = engine.collection(id).expect("listed");
            // The server's own collections (the access rules) are not routable.
            if is_reserved_name(collection.name()) {
                continue;
            }
            let entry = Arc::new(CollectionEntry::from_engine(engine, id).expect("listed"));
            // Names stored by an older, case-sensitive build could collide; the first wins.
            if routes.insert(collection.name(), entry).is_err() {
                tracing::warn!(
                    collection = collection.name(),
                    "collection `{}` differs from another only by case; it is not routable",
                    collection.name()
                );
            }
        }
    }

    /// Runs until every sender is gone, then returns the database (closing it is
    /// the caller's choice). Writes queued during a commit share the next one.
    pub fn run(mut self, mut commands: mpsc::Receiver<Command>) -> Database {
        metrics::set_thread_kind(metrics::ThreadKind::Writer);
        let mut buffers = GroupBuffers::default();
        let mut waiting: Option<Command> = None;
        loop {
            let command = match waiting.take() {
                Some(command) => command,
                None => match self.next_command_or_prepare(&mut commands) {
                    Some(command) => command,
                    None => return self.database,
                },
            };
            let Command::Write { batches, reply, queued_at, guards, results } = command else {
                self.handle(command);
                self.end_lost_relations();
                continue;
            };
            if guards.is_empty() {
                waiting = self.write_group(&mut buffers, &mut commands, (batches, reply, queued_at, results));
            } else {
                self.guarded_write(batches, guards, (reply, queued_at, results));
            }
            self.end_lost_relations();
        }
    }

    /// A window was opened (its first frame is queued). A small view is sorted
    /// at once; a large one waits for the writer's idle time (see `unprepared`).
    fn note_unprepared(&mut self, window: WindowId, collection: CollectionId) {
        let n_items = self.database.engine().collection(collection).map_or(usize::MAX, |collection| collection.len());
        if n_items <= EAGER_PREPARE_MAX_ITEMS {
            let _ = self.database.prepare_window(window);
            return;
        }
        // Past the bound (a writer never idle) a view just sorts at its first update.
        if self.unprepared.len() < MAX_UNPREPARED_WINDOWS {
            self.unprepared.push(window);
        }
    }

    /// The next command; while none is waiting, finishes the indexes of new
    /// windows one at a time (see `unprepared`), then blocks.
    fn next_command_or_prepare(&mut self, commands: &mut mpsc::Receiver<Command>) -> Option<Command> {
        loop {
            match commands.try_recv() {
                Ok(command) => return Some(command),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty) => match self.unprepared.pop() {
                    // A window closed since is refused, and one opened in its place
                    // is sorted a little early: both harmless.
                    Some(window) => {
                        let _ = self.database.prepare_window(window);
                    }
                    None => return commands.blocking_recv(),
                },
            }
        }
    }

    fn handle(&mut self, command: Command) {
        self.handle_command(command);
        // Whatever the command wrote (the rules, say) is visible to waiting requests.
        self.publish_seq();
    }

    fn handle_command(&mut self, command: Command) {
        match command {
            Command::Write { .. } => unreachable!("writes are grouped by `run`"),
            Command::CreateCollection { name, schema, reply } => {
                let _ = reply.send(self.create_collection(&name, schema));
            }
            Command::ChangeFields { collection, change, reply } => {
                let _ = reply.send(self.change_fields(collection, change));
            }
            Command::DropCollection { collection, reply } => {
                let _ = reply.send(self.drop_collection(collection));
            }
            Command::Query { collection, schema, spec, reply } => {
                let result = self
                    .check_schema(collection, &schema)
                    .and_then(|()| self.check_relation_now(&spec))
                    .and_then(|()| self.query(collection, spec));
                let _ = reply.send(result);
            }
            Command::ApplyEntries(run) => {
                let Some(mut applier) = self.cluster.take() else {
                    tracing::error!("entries came to a writer not in cluster mode");
                    return;
                };
                crate::cluster::apply::apply_run(self, &mut applier, run);
                self.cluster = Some(applier);
            }
            Command::SnapshotFinished => {
                if let Some(mut applier) = self.cluster.take() {
                    applier.after_snapshot(self);
                    self.cluster = Some(applier);
                }
            }
            Command::SetRules { doc, reply } => {
                let _ = reply.send(self.set_rules(&doc));
            }
            Command::GetItem { collection, id, predicate, reply } => {
                let _ = reply.send(self.get_item(collection, &id, predicate.as_ref()));
            }
            Command::StartBackup { reply } => {
                let _ = reply.send(self.database.start_backup().map_err(ApiError::from));
            }
            Command::CollectionLen { collection, reply } => {
                let _ = reply.send(self.collection_len(collection));
            }
            Command::ItemIds { collection, reply } => {
                let _ = reply.send(self.item_ids(collection));
            }
            Command::Gauges { reply } => {
                let _ = reply.send(self.gauges());
            }
            Command::OpenSession { session, shared, outbox } => self.open_session(session, shared, outbox),
            Command::DropSession { session } => self.drop_session(session),
            Command::Subscribe { session, handle, collection, schema, spec, owner } => {
                self.subscribe_checked(session, handle, collection, &schema, spec, owner);
            }
            Command::SetRange { session, handle, position, limit, req } => {
                self.answer_window_change(session, handle, WindowChange::Range(position, limit), None, None, req);
            }
            Command::SetView { session, handle, def, req, owner, relation } => {
                self.answer_window_change(session, handle, WindowChange::View(def), relation, owner, req);
            }
            Command::Unsubscribe { session, handle } => self.unsubscribe(session, handle),
            Command::Resync { session, handle } => self.send_reset(session, handle),
            Command::Drained { session } => self.send_due_resets(session),
        }
    }
}
