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

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot, watch};

use ordo_core::{Batch, CollectionId, Schema, WindowId};
use ordo_store::{Database, PendingWrite, MAX_BATCHES_PER_COMMIT, MAX_BYTES_PER_COMMIT};

use crate::encode::write_versioned_item;
use crate::error::{ApiError, ErrorCode};
use crate::metrics::{self, Stage, WriterGauges, METRICS};
use crate::min_seq::SeqWatch;
use crate::routing::{is_reserved_name, CollectionEntry, Routes};
use crate::wire::{Position, Projection, Seek, WindowSpec};
use crate::write_guard::WriteGuard;

mod fanout;
mod messages;
mod schema_change;
mod view_budget;

pub use fanout::share_key;
pub use messages::{
    Answer, Command, ConnShared, FrameBody, Outbox, Outgoing, SessionId, SubHandle, WriteReply, WriteResults,
    WriterSender, FRAME_OVERHEAD_BYTES,
};
pub use schema_change::{EndReason, FieldChange};

use fanout::{Fanout, FanoutTarget, SessionState, SharedWindow, SubState};

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

/// A request's list of parts while its batches are in the group being written.
struct WriteParts {
    list: Vec<(CollectionId, Batch)>,
    /// How many of the group's writes are this request's.
    n_parts: usize,
}

/// Moves a request's batches into the group; returns their bytes.
fn add_to_group(
    group: &mut Vec<PendingWrite>,
    replies: &mut Vec<(oneshot::Sender<WriteReply>, WriteParts)>,
    mut batches: Vec<(CollectionId, Batch)>,
    reply: oneshot::Sender<WriteReply>,
    queued_at: Instant,
) -> usize {
    metrics::record_stage(Stage::WriteQueue, queued_at.elapsed());
    let n_bytes = batches.iter().map(|(_, batch)| batch.n_bytes()).sum();
    let n_parts = batches.len();
    group.extend(batches.drain(..).map(|(collection, batch)| PendingWrite::new(collection, batch)));
    replies.push((reply, WriteParts { list: batches, n_parts }));
    n_bytes
}

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
        let mut group: Vec<PendingWrite> = Vec::new();
        // Each request's reply, and its parts' list (emptied into `group`, refilled after).
        let mut replies: Vec<(oneshot::Sender<WriteReply>, WriteParts)> = Vec::new();
        let mut waiting: Option<Command> = None;
        loop {
            let command = match waiting.take() {
                Some(command) => command,
                None => match self.next_command_or_prepare(&mut commands) {
                    Some(command) => command,
                    None => return self.database,
                },
            };
            let Command::Write { batches, reply, queued_at, guards } = command else {
                self.handle(command);
                continue;
            };
            if !guards.is_empty() {
                self.guarded_write(batches, guards, reply, queued_at);
                continue;
            }
            let mut n_bytes = add_to_group(&mut group, &mut replies, batches, reply, queued_at);
            while group.len() < MAX_BATCHES_PER_COMMIT && n_bytes < MAX_BYTES_PER_COMMIT {
                match commands.try_recv() {
                    // A guarded write checks the items as committed, so it starts a group of its own.
                    Ok(Command::Write { batches, reply, queued_at, guards }) if guards.is_empty() => {
                        n_bytes += add_to_group(&mut group, &mut replies, batches, reply, queued_at);
                    }
                    Ok(other) => {
                        waiting = Some(other);
                        break;
                    }
                    Err(_) => break,
                }
            }
            self.fanout.target = FanoutTarget::Subscribers;
            let group_started = Instant::now();
            self.database.write_group(&mut group, &mut self.fanout);
            let log_append = self.database.last_log_append();
            metrics::record_stage(Stage::LogAppend, log_append);
            metrics::record_stage(Stage::Apply, group_started.elapsed().saturating_sub(log_append));
            self.publish_seq();
            let mut done = group.drain(..);
            for (reply, mut parts) in replies.drain(..) {
                let mut results: WriteResults = Vec::with_capacity(parts.n_parts);
                for write in done.by_ref().take(parts.n_parts) {
                    let result = write.result.expect("every write gets a result");
                    // A refusal is counted where it is answered (`api::refused`), with
                    // those that never reach this thread.
                    if result.is_ok() {
                        metrics::add(&METRICS.batches, 1);
                    }
                    results.push(result.map_err(ApiError::from));
                    // The batch goes back to the network thread that built it, for reuse.
                    parts.list.push((write.collection, write.batch));
                }
                let _ = reply.send(WriteReply { results, batches: parts.list });
            }
        }
    }

    /// A write with parts under filtered write rules: each such part is checked
    /// against the committed items (no group is pending, so they are the items
    /// the write will change), refused whole with `forbidden` if an op leaves
    /// the grant, and the rest are committed together.
    fn guarded_write(
        &mut self,
        batches: Vec<(CollectionId, Batch)>,
        guards: Vec<(usize, Arc<WriteGuard>)>,
        reply: oneshot::Sender<WriteReply>,
        queued_at: Instant,
    ) {
        metrics::record_stage(Stage::WriteQueue, queued_at.elapsed());
        let mut refusals: Vec<Option<ApiError>> = (0..batches.len()).map(|_| None).collect();
        for (index, guard) in &guards {
            let (collection, batch) = &batches[*index];
            refusals[*index] = self.guard_refusal(*collection, batch, guard);
        }
        let mut group = Vec::with_capacity(batches.len());
        let mut returned = Vec::with_capacity(batches.len());
        for ((collection, batch), refusal) in batches.into_iter().zip(&refusals) {
            match refusal {
                None => group.push(PendingWrite::new(collection, batch)),
                Some(_) => returned.push((collection, batch)),
            }
        }
        self.fanout.target = FanoutTarget::Subscribers;
        self.database.write_group(&mut group, &mut self.fanout);
        self.publish_seq();
        let mut written = group.into_iter();
        let mut results: WriteResults = Vec::with_capacity(refusals.len());
        for refusal in refusals {
            let result = match refusal {
                Some(error) => Err(error),
                None => {
                    let write = written.next().expect("one write per accepted part");
                    returned.push((write.collection, write.batch));
                    write.result.expect("every write gets a result").map_err(ApiError::from)
                }
            };
            if result.is_ok() {
                metrics::add(&METRICS.batches, 1);
            }
            results.push(result);
        }
        let _ = reply.send(WriteReply { results, batches: returned });
    }

    /// Why a guarded part is refused, if it is: checked against the committed items.
    pub(crate) fn guard_refusal(
        &self,
        collection: CollectionId,
        batch: &Batch,
        guard: &WriteGuard,
    ) -> Option<ApiError> {
        let collection = self.database.engine().collection(collection)?;
        if collection.schema() != guard.schema() {
            // Its field ids would name other fields: refused, never checked with them.
            return Some(ApiError::new(
                ErrorCode::InvalidBatch,
                format!("the schema of `{}` changed while this write was on its way; send it again", collection.name()),
            ));
        }
        if let Err(op) = guard.check(collection, batch) {
            let id = batch.ops().nth(op).map_or("", |op| op.id());
            return Some(ApiError::new(
                ErrorCode::Forbidden,
                format!("op {op}: this identity may not write item `{id}` (its write rule does not allow it)"),
            ));
        }
        None
    }

    /// Cluster mode: a run of write entries, each at its own seq (refused ones
    /// with a seq marker), in one group commit (see `cluster::apply`).
    pub(crate) fn write_run(&mut self, run: &mut [PendingWrite]) {
        self.fanout.target = FanoutTarget::Subscribers;
        self.database.write_run(run, &mut self.fanout);
        let n_written = run.iter().filter(|write| matches!(write.result, Some(Ok(_)))).count();
        metrics::add(&METRICS.batches, n_written as u64);
    }

    /// Writes the access rules into their reserved collection, creating it the first time.
    pub(crate) fn set_rules(&mut self, doc: &str) -> Result<u64, ApiError> {
        let collection = match self.database.engine().collection_id(RULES_COLLECTION) {
            Some(id) => id,
            None => self.database.create_collection(RULES_COLLECTION, Schema::new())?,
        };
        let mut batch = Batch::new();
        batch.upsert(RULES_ITEM).payload(doc.as_bytes());
        self.fanout.target = FanoutTarget::Subscribers;
        let mut group = [PendingWrite::new(collection, batch)];
        self.database.write_group(&mut group, &mut self.fanout);
        self.publish_seq();
        let [write] = group;
        let ack = write.result.expect("every write gets a result")?;
        Ok(ack.seq)
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
                let result = self.check_schema(collection, &schema).and_then(|()| self.query(collection, spec));
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
            Command::SetRules { doc, reply } => {
                let _ = reply.send(self.set_rules(&doc));
            }
            Command::GetItem { collection, id, predicate, reply } => {
                let engine = self.database.engine();
                let item = engine.collection(collection).and_then(|collection| {
                    let item = collection.get(&id)?;
                    if let Some(predicate) = &predicate {
                        // Compiled here: the schema is this collection's for sure.
                        let compiled = ordo_core::CompiledFilter::compile(predicate, collection.schema()).ok()?;
                        if !compiled.matches_item(item) {
                            return None;
                        }
                    }
                    let mut out = Vec::new();
                    write_versioned_item(&mut out, item, &Projection::all(collection.schema()));
                    Some(out)
                });
                let _ = reply.send(item);
            }
            Command::StartBackup { reply } => {
                let _ = reply.send(self.database.start_backup().map_err(ApiError::from));
            }
            Command::CollectionLen { collection, reply } => {
                let _ = reply.send(self.database.engine().collection(collection).map_or(0, |c| c.len()));
            }
            Command::Gauges { reply } => {
                let stats = self.database.engine().stats();
                let _ = reply.send(WriterGauges {
                    n_collections: stats.n_collections,
                    n_items: stats.n_items,
                    n_views: stats.n_views,
                    n_windows: stats.n_windows,
                    n_subscriptions: self.fanout.sessions.values().map(|session| session.subs.len()).sum(),
                    n_sessions: self.fanout.sessions.len(),
                    largest_identity_view_bytes: self.view_budgets.largest_owner_bytes(),
                    n_budgeted_identities: self.view_budgets.n_owners(),
                    last_seq: self.database.last_seq(),
                    checkpointed_seq: self.database.checkpointed_seq(),
                });
            }
            Command::OpenSession { session, shared, outbox } => {
                self.fanout.sessions.insert(session, SessionState { shared, outbox, subs: HashMap::new() });
            }
            Command::DropSession { session } => {
                if let Some(state) = self.fanout.sessions.get(&session) {
                    let handles: Vec<SubHandle> = state.subs.keys().copied().collect();
                    for handle in handles {
                        self.detach(session, handle);
                    }
                }
                self.fanout.sessions.remove(&session);
            }
            Command::Subscribe { session, handle, collection, schema, spec, owner } => {
                let subscribed = self
                    .check_schema(collection, &schema)
                    .and_then(|()| self.subscribe(session, handle, collection, spec, owner));
                if let Err(error) = subscribed {
                    self.fanout.send(session, Outgoing::SubscribeFailed { handle, error });
                }
            }
            Command::SetRange { session, handle, position, limit, req } => {
                self.answer_window_change(session, handle, WindowChange::Range(position, limit), None, req);
            }
            Command::SetView { session, handle, def, req, owner } => {
                self.answer_window_change(session, handle, WindowChange::View(def), owner, req);
            }
            Command::Unsubscribe { session, handle } => {
                self.detach(session, handle);
                self.fanout.send(session, Outgoing::Unsubscribed { handle });
            }
            Command::Resync { session, handle } => self.send_reset(session, handle),
            Command::Drained { session } => self.send_due_resets(session),
        }
    }

    /// A `set_range` or `set_view`, answered exactly once: by the frame of its
    /// diffs (which takes the answer from `fanout.answer` when it is queued), by
    /// an `Ack` when no frame went out, or by the error.
    fn answer_window_change(
        &mut self,
        session: SessionId,
        handle: SubHandle,
        change: WindowChange,
        owner: Option<Arc<str>>,
        req: Option<Box<str>>,
    ) {
        self.fanout.answer = Some(((session, handle), Answer { req }));
        let result = match (change, owner) {
            (WindowChange::View(def), Some(owner)) => self.change_view_within_budget(session, handle, def, owner),
            (change, _) => self.change_window(session, handle, change),
        };
        let answer = self.fanout.answer.take().map(|(_, answer)| answer);
        match result {
            Ok(()) => {
                if let Some(Answer { req }) = answer {
                    self.fanout.send(session, Outgoing::Ack { handle, req });
                }
            }
            Err(error) => {
                let spec = self.current_spec(session, handle);
                let req = answer.and_then(|answer| answer.req);
                self.fanout.send(session, Outgoing::RequestFailed { handle, error, spec, req });
            }
        }
    }

    /// The definition of the window a subscription has now.
    fn current_spec(&self, session: SessionId, handle: SubHandle) -> Option<Box<WindowSpec>> {
        let sub = self.fanout.sessions.get(&session)?.subs.get(&handle)?;
        Some(Box::new(self.fanout.windows.get(&sub.window)?.spec.clone()))
    }

    pub(crate) fn create_collection(
        &mut self,
        name: &str,
        schema: Schema,
    ) -> Result<(bool, Arc<CollectionEntry>), ApiError> {
        if let Some(existing) = self.routes.read().expect("routes lock").get(name) {
            if *existing.schema == schema && existing.name == name {
                return Ok((false, existing.clone()));
            }
            return Err(ApiError::new(
                ErrorCode::CollectionExists,
                format!("a collection named `{}` exists already with another schema or spelling", existing.name),
            ));
        }
        let id = self.database.create_collection(name, schema.clone())?;
        let mut entry = CollectionEntry::from_engine(self.database.engine(), id).expect("just created");
        // The name as the caller spelled it (the engine's may differ only by case).
        entry.name = name.to_owned();
        let entry = Arc::new(entry);
        self.routes
            .write()
            .expect("routes lock")
            .insert(name, entry.clone())
            .map_err(|_| ApiError::new(ErrorCode::Internal, "routing refused a name it had not found"))?;
        Ok((true, entry))
    }

    fn query(&mut self, collection: CollectionId, spec: WindowSpec) -> Result<Vec<u8>, ApiError> {
        let fanout = &mut self.fanout;
        fanout.target = FanoutTarget::Capture;
        fanout.captured.clear();
        fanout.capture_projection = Some(spec.projection.clone());
        let opened = match check_seek_visible(&self.database, collection, spec.seek.as_ref()) {
            Ok(()) => self
                .database
                .open_window_at(collection, &spec.def, spec.anchor(), spec.limit, fanout)
                .map_err(Into::into),
            Err(error) => Err(error),
        };
        let fanout = &mut self.fanout;
        fanout.target = FanoutTarget::Subscribers;
        fanout.capture_projection = None;
        let (window, range) = opened?;
        let total = self.database.view_len(window)?;
        self.database.close_window(window)?;
        let mut out = Vec::with_capacity(fanout.captured.len() + 96);
        out.extend_from_slice(b"{\"total\":");
        crate::frame::write_u64(&mut out, total as u64);
        out.extend_from_slice(b",\"offset\":");
        crate::frame::write_u64(&mut out, range.offset as u64);
        // The writer applies batches one at a time: the answer reflects every
        // batch up to the last one applied, and none after.
        out.extend_from_slice(b",\"write_seq\":");
        crate::frame::write_u64(&mut out, self.database.last_seq());
        out.extend_from_slice(b",\"items\":");
        out.extend_from_slice(&fanout.captured);
        out.push(b'}');
        Ok(out)
    }

    fn subscribe(
        &mut self,
        session: SessionId,
        handle: SubHandle,
        collection: CollectionId,
        spec: WindowSpec,
        owner: Option<Arc<str>>,
    ) -> Result<(), ApiError> {
        if !self.fanout.sessions.contains_key(&session) {
            return Ok(());
        }
        let is_keyed = spec.seek.is_some() || spec.is_tail;
        // A window at an item's place has its identity once found: it is opened
        // first, then shared if no equal window exists.
        let existing = match spec.seek {
            None => self.fanout.windows_by_key.get(&share_key(collection, &spec)).copied(),
            Some(_) => None,
        };
        let mut opened_now = false;
        let window = match existing {
            Some(window) => window,
            None => {
                opened_now = true;
                let mut spec = spec;
                check_seek_visible(&self.database, collection, spec.seek.as_ref())?;
                self.fanout.target = FanoutTarget::Discard;
                let opened =
                    self.database.open_window_at(collection, &spec.def, spec.anchor(), spec.limit, &mut self.fanout);
                self.fanout.target = FanoutTarget::Subscribers;
                let (window, range) = opened?;
                spec.resolve(range);
                let key = share_key(collection, &spec);
                let share_key = match self.fanout.windows_by_key.entry(key) {
                    std::collections::hash_map::Entry::Vacant(vacant) => {
                        let key = vacant.key().clone();
                        vacant.insert(window);
                        Some(key)
                    }
                    std::collections::hash_map::Entry::Occupied(_) => None,
                };
                self.fanout
                    .windows
                    .insert(window, SharedWindow { collection, spec, share_key, subscribers: Vec::new() });
                window
            }
        };
        self.charge_new_subscription((session, handle), owner, window, opened_now)?;
        // The client learns where its window landed on its first frame (from the
        // engine: a shared tail window's offset has moved since it was opened).
        let range_due = if is_keyed { Some(self.database.engine().window_range(window)?) } else { None };
        self.fanout.windows.get_mut(&window).expect("registered").subscribers.push((session, handle));
        let state = self.fanout.sessions.get_mut(&session).expect("checked");
        state.subs.insert(handle, SubState { window, needs_reset: false, last_total: None, range_due });
        self.send_reset(session, handle);
        if opened_now {
            // After the first frame is queued: the client does not wait for the sort.
            self.note_unprepared(window, collection);
        }
        Ok(())
    }

    /// Sends one subscription a Reset with its window's contents (and, for a tail
    /// window, its `offset` and `limit`).
    fn send_reset(&mut self, session: SessionId, handle: SubHandle) {
        let Some(sub) = self.fanout.sessions.get_mut(&session).and_then(|state| state.subs.get_mut(&handle)) else {
            return;
        };
        sub.needs_reset = false;
        let window = sub.window;
        if self.fanout.windows.get(&window).is_some_and(|shared| shared.spec.is_tail) {
            // A tail's offset moved while the client was not following (a resume, a
            // slow connection): the Reset that starts it again says where it is.
            sub.range_due = self.database.engine().window_range(window).ok();
        }
        self.fanout.target = FanoutTarget::Only(session, handle);
        let result = self.database.emit_window_reset(window, &mut self.fanout);
        self.fanout.target = FanoutTarget::Subscribers;
        debug_assert!(result.is_ok(), "a subscription's window is live");
    }

    fn send_due_resets(&mut self, session: SessionId) {
        let Some(state) = self.fanout.sessions.get(&session) else { return };
        let mut due: Vec<SubHandle> = state.subs.iter().filter(|(_, sub)| sub.needs_reset).map(|(&h, _)| h).collect();
        due.sort_unstable();
        for handle in due {
            let state = &self.fanout.sessions[&session];
            let queued = state.shared.queued_bytes.load(Ordering::Acquire);
            if queued >= self.fanout.outbound_budget {
                // The rest wait for the next drain.
                state.shared.want_drain_notice.store(true, Ordering::Release);
                let _ = state.outbox.send(Outgoing::Wake);
                return;
            }
            if !state.subs.get(&handle).is_some_and(|sub| sub.needs_reset) {
                // A reset sent above overflowed the queue again and re-marked everything;
                // the next drain brings them.
                continue;
            }
            metrics::add(&METRICS.resets_slow, 1);
            // Per reset, not per frame: a client this far behind is worth a line.
            tracing::info!(
                session,
                sub = handle,
                "slow consumer: its subscription gets a Reset (its queue was over the outbound budget)"
            );
            self.send_reset(session, handle);
        }
    }

    fn change_window(&mut self, session: SessionId, handle: SubHandle, change: WindowChange) -> Result<(), ApiError> {
        let sub = self
            .fanout
            .sessions
            .get(&session)
            .and_then(|state| state.subs.get(&handle))
            .ok_or_else(|| ApiError::new(ErrorCode::UnknownSubscription, "no such subscription"))?;
        let old_window = sub.window;
        let shared = &self.fanout.windows[&old_window];
        let collection = shared.collection;
        let mut spec = shared.spec.clone();
        let mut answer = None;
        match &change {
            WindowChange::Range(position, limit) => {
                spec.set_position(position.clone());
                spec.limit = *limit;
                check_seek_visible(&self.database, collection, spec.seek.as_ref())?;
                // Found first (on the window as it is, before any private copy), so
                // that a refusal changes nothing and the frame can say where it landed.
                let range = self.database.resolve_window_anchor(old_window, spec.anchor(), *limit)?;
                spec.resolve(range);
                if matches!(position, Position::Seek(_) | Position::Tail) {
                    answer = Some((range.offset, range.limit));
                }
            }
            WindowChange::View(def) => spec.def = def.clone(),
        }
        let shared = &self.fanout.windows[&old_window];
        let window = if shared.subscribers.len() == 1 {
            old_window
        } else {
            // The window is shared: this subscription moves to a private copy first,
            // so the change reaches it alone.
            self.fanout.target = FanoutTarget::Discard;
            let old_spec = self.fanout.windows[&old_window].spec.clone();
            let opened = self.database.open_window_at(
                collection,
                &old_spec.def,
                old_spec.anchor(),
                old_spec.limit,
                &mut self.fanout,
            );
            self.fanout.target = FanoutTarget::Subscribers;
            let (window, _) = opened?;
            self.fanout.windows.insert(
                window,
                SharedWindow { collection, spec: old_spec, share_key: None, subscribers: vec![(session, handle)] },
            );
            let shared = self.fanout.windows.get_mut(&old_window).expect("live");
            shared.subscribers.retain(|&subscriber| subscriber != (session, handle));
            self.fanout.sessions.get_mut(&session).expect("checked").subs.get_mut(&handle).expect("checked").window =
                window;
            window
        };
        if let Some(sub) = self.fanout.sub_mut(session, handle) {
            sub.range_due = answer;
        }
        self.fanout.target = FanoutTarget::Only(session, handle);
        let result = match &change {
            WindowChange::Range(..) => {
                self.database.move_window(window, spec.anchor(), spec.limit, &mut self.fanout).map(|_| ())
            }
            WindowChange::View(def) => self.database.set_window_view(window, def, &mut self.fanout),
        };
        self.fanout.target = FanoutTarget::Subscribers;
        let answer_pending = self.fanout.sub_mut(session, handle).is_some_and(|sub| sub.range_due.is_some());
        match &result {
            Err(_) => {
                if let Some(sub) = self.fanout.sub_mut(session, handle) {
                    sub.range_due = None;
                }
            }
            Ok(()) if answer_pending => {
                // A key-positioned request that changed nothing is still answered: an
                // empty frame says where the window is. (If the subscription awaits a
                // reset, `push` drops this and that reset carries the range instead.)
                let view_len = self.database.view_len(window)?;
                self.fanout.push_empty(session, handle, view_len);
            }
            Ok(()) if matches!(change, WindowChange::View(_)) && self.fanout.answer.is_some() => {
                self.tell_new_total(session, handle, window)?;
            }
            Ok(()) => {}
        }
        result?;
        if matches!(change, WindowChange::View(_)) {
            // A new view behind the window, sorted like any other.
            let collection = self.fanout.windows[&window].collection;
            self.note_unprepared(window, collection);
        }
        // The window now has a new identity: re-key it for sharing when that is free.
        let shared = self.fanout.windows.get_mut(&window).expect("live");
        if let Some(old_key) = shared.share_key.take() {
            self.fanout.windows_by_key.remove(&old_key);
        }
        let new_key = share_key(collection, &spec);
        shared.spec = spec;
        if let std::collections::hash_map::Entry::Vacant(vacant) = self.fanout.windows_by_key.entry(new_key) {
            shared.share_key = Some(vacant.key().clone());
            vacant.insert(window);
        }
        Ok(())
    }

    /// A `set_view` that left the window's rows as they were but changed how many
    /// the view holds is answered by a frame with no diffs and the new `total`,
    /// not an `ack`: otherwise the client would show the old view's count until
    /// its window next changed.
    fn tell_new_total(&mut self, session: SessionId, handle: SubHandle, window: WindowId) -> Result<(), ApiError> {
        let view_len = self.database.view_len(window)?;
        if self.fanout.sub_mut(session, handle).is_some_and(|sub| sub.last_total != Some(view_len)) {
            self.fanout.push_empty(session, handle, view_len);
        }
        Ok(())
    }

    /// Removes a subscription from its window, closing the window with its last subscriber.
    fn detach(&mut self, session: SessionId, handle: SubHandle) {
        self.view_budgets.release((session, handle));
        let Some(sub) = self.fanout.sessions.get_mut(&session).and_then(|state| state.subs.remove(&handle)) else {
            return;
        };
        let Some(shared) = self.fanout.windows.get_mut(&sub.window) else { return };
        shared.subscribers.retain(|&subscriber| subscriber != (session, handle));
        if shared.subscribers.is_empty() {
            let shared = self.fanout.windows.remove(&sub.window).expect("live");
            if let Some(key) = shared.share_key {
                self.fanout.windows_by_key.remove(&key);
            }
            let _ = self.database.close_window(sub.window);
        }
    }
}

enum WindowChange {
    Range(Position, usize),
    View(ordo_core::ViewDef),
}

/// Refuses an item anchor outside the caller's access rule exactly as a missing
/// item (`not_found`, the same message): the item's place would tell it exists.
fn check_seek_visible(database: &Database, collection: CollectionId, seek: Option<&Seek>) -> Result<(), ApiError> {
    let Some(Seek { anchor, rule: Some(rule) }) = seek else { return Ok(()) };
    let Some(collection) = database.engine().collection(collection) else { return Ok(()) };
    let Some(item) = collection.get(anchor.id()) else { return Ok(()) };
    let compiled = ordo_core::CompiledFilter::compile(rule, collection.schema())?;
    if compiled.matches_item(item) {
        Ok(())
    } else {
        Err(ordo_core::ViewError::UnknownItem { id: anchor.id().to_owned() }.into())
    }
}
