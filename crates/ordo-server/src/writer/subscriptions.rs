//! The writer thread's side of subscriptions: sessions opened and dropped,
//! subscriptions opened on a shared or a new engine window, their windows moved
//! or given a new view (`set_range`, `set_view`) and answered exactly once, the
//! resets due to a connection that fell behind, and windows closed with their
//! last subscriber.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ordo_core::{CollectionId, Schema, WindowId};
use ordo_store::Database;

use super::fanout::{digest_due, FanoutTarget, SessionState, SharedWindow, SubState};
use super::{share_key, Answer, ConnShared, Outbox, Outgoing, SessionId, SubHandle, Writer};
use crate::error::{ApiError, ErrorCode};
use crate::metrics::{self, METRICS};
use crate::wire::{Position, Seek, WindowSpec};

impl Writer {
    pub(super) fn open_session(&mut self, session: SessionId, shared: Arc<ConnShared>, outbox: Outbox) {
        self.fanout.sessions.insert(session, SessionState { shared, outbox, subs: HashMap::new() });
    }

    /// Forgets a session, closing the windows only its subscriptions held.
    pub(super) fn drop_session(&mut self, session: SessionId) {
        if let Some(state) = self.fanout.sessions.get(&session) {
            let handles: Vec<SubHandle> = state.subs.keys().copied().collect();
            for handle in handles {
                self.detach(session, handle);
            }
        }
        self.fanout.sessions.remove(&session);
    }

    /// Opens a subscription (checked against the schema the network task checked
    /// its request against); a refusal is told to the connection.
    pub(super) fn subscribe_checked(
        &mut self,
        session: SessionId,
        handle: SubHandle,
        collection: CollectionId,
        schema: &Schema,
        spec: WindowSpec,
        owner: Option<Arc<str>>,
    ) {
        let subscribed = self
            .check_schema(collection, schema)
            .and_then(|()| self.subscribe_related(session, handle, collection, spec, owner));
        if let Err(error) = subscribed {
            self.fanout.send(session, Outgoing::SubscribeFailed { handle, error });
        }
    }

    pub(super) fn unsubscribe(&mut self, session: SessionId, handle: SubHandle) {
        self.detach(session, handle);
        self.fanout.send(session, Outgoing::Unsubscribed { handle });
    }

    /// A `set_range` or `set_view`, answered exactly once: by the frame of its
    /// diffs (which takes the answer from `fanout.answer` when it is queued), by
    /// an `Ack` when no frame went out, or by the error. A new view on a
    /// collection read by relationship comes with its `relation`.
    pub(super) fn answer_window_change(
        &mut self,
        session: SessionId,
        handle: SubHandle,
        change: WindowChange,
        relation: Option<Arc<crate::related::RelationCheck>>,
        owner: Option<Arc<str>>,
        req: Option<Box<str>>,
    ) {
        self.fanout.answer = Some(((session, handle), Answer { req }));
        let result = match change {
            WindowChange::View(def) => self.change_view_related(session, handle, def, owner, relation),
            change => self.change_window(session, handle, change),
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
        let mut spec = self.fanout.windows.get(&sub.window)?.spec.clone();
        spec.relation = self.fanout.relations.check_of((session, handle));
        Some(Box::new(spec))
    }

    pub(super) fn subscribe(
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
        let spec_wants_digest = spec.digest;
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
        let wants_digest = spec_wants_digest;
        state.subs.insert(handle, SubState { window, needs_reset: false, last_total: None, range_due, wants_digest });
        self.send_reset(session, handle);
        if opened_now {
            // After the first frame is queued: the client does not wait for the sort.
            self.note_unprepared(window, collection);
        }
        Ok(())
    }

    /// Sends one subscription a Reset with its window's contents (and, for a tail
    /// window, its `offset` and `limit`).
    pub(super) fn send_reset(&mut self, session: SessionId, handle: SubHandle) {
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

    pub(super) fn send_due_resets(&mut self, session: SessionId) {
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

    pub(super) fn change_window(
        &mut self,
        session: SessionId,
        handle: SubHandle,
        change: WindowChange,
    ) -> Result<(), ApiError> {
        let sub = self
            .fanout
            .sessions
            .get(&session)
            .and_then(|state| state.subs.get(&handle))
            .ok_or_else(|| ApiError::new(ErrorCode::UnknownSubscription, "no such subscription"))?;
        let old_window = sub.window;
        let collection = self.fanout.windows[&old_window].collection;
        let (spec, answer) = self.changed_spec(old_window, &change)?;
        let window = self.private_window(session, handle, old_window)?;
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
                let digest = self.digest_for(session, handle, window)?;
                self.fanout.push_empty(session, handle, view_len, digest);
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
        self.rekey(window, collection, spec);
        Ok(())
    }

    /// The window's definition once `change` applies to it, and, for a
    /// key-positioned request, where it lands (told to the client). Nothing
    /// changes yet, so a refusal here leaves the subscription as it was.
    fn changed_spec(
        &mut self,
        window: WindowId,
        change: &WindowChange,
    ) -> Result<(WindowSpec, Option<(usize, usize)>), ApiError> {
        let shared = &self.fanout.windows[&window];
        let collection = shared.collection;
        let mut spec = shared.spec.clone();
        let mut answer = None;
        match change {
            WindowChange::Range(position, limit) => {
                spec.set_position(position.clone());
                spec.limit = *limit;
                check_seek_visible(&self.database, collection, spec.seek.as_ref())?;
                // Found first (on the window as it is, before any private copy), so
                // that a refusal changes nothing and the frame can say where it landed.
                let range = self.database.resolve_window_anchor(window, spec.anchor(), *limit)?;
                spec.resolve(range);
                if matches!(position, Position::Seek(_) | Position::Tail) {
                    answer = Some((range.offset, range.limit));
                }
            }
            WindowChange::View(def) => spec.def = def.clone(),
        }
        Ok((spec, answer))
    }

    /// The window a subscription may change alone: its own, or, when it shares
    /// it, a private copy it moves to first (so the change reaches it alone).
    fn private_window(
        &mut self,
        session: SessionId,
        handle: SubHandle,
        old_window: WindowId,
    ) -> Result<WindowId, ApiError> {
        let shared = &self.fanout.windows[&old_window];
        if shared.subscribers.len() == 1 {
            return Ok(old_window);
        }
        let collection = shared.collection;
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
        Ok(window)
    }

    /// The window now has a new identity (`spec`): re-keys it for sharing when
    /// that key is free.
    fn rekey(&mut self, window: WindowId, collection: CollectionId, spec: WindowSpec) {
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
    }

    /// A `set_view` that left the window's rows as they were but changed how many
    /// the view holds is answered by a frame with no diffs and the new `total`,
    /// not an `ack`: otherwise the client would show the old view's count until
    /// its window next changed.
    fn tell_new_total(&mut self, session: SessionId, handle: SubHandle, window: WindowId) -> Result<(), ApiError> {
        let view_len = self.database.view_len(window)?;
        if self.fanout.sub_mut(session, handle).is_some_and(|sub| sub.last_total != Some(view_len)) {
            let digest = self.digest_for(session, handle, window)?;
            self.fanout.push_empty(session, handle, view_len, digest);
        }
        Ok(())
    }

    /// The digest of `window` as it is now, when a frame of this subscription
    /// carries one (`digest_due`): read through the engine like any frame's.
    fn digest_for(&mut self, session: SessionId, handle: SubHandle, window: WindowId) -> Result<Option<u64>, ApiError> {
        let wants_digest = self.fanout.sub_mut(session, handle).is_some_and(|sub| sub.wants_digest);
        let (_, limit) = self.database.engine().window_range(window)?;
        if !digest_due(limit, wants_digest) {
            return Ok(None);
        }
        self.fanout.digest = None;
        self.fanout.target = FanoutTarget::DigestOnly;
        let result = self.database.emit_window_reset(window, &mut self.fanout);
        self.fanout.target = FanoutTarget::Subscribers;
        result?;
        Ok(self.fanout.digest.take())
    }

    /// Removes a subscription from its window, closing the window with its last subscriber.
    pub(super) fn detach(&mut self, session: SessionId, handle: SubHandle) {
        self.view_budgets.release((session, handle));
        self.release_relation((session, handle));
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

pub(super) enum WindowChange {
    Range(Position, usize),
    View(ordo_core::ViewDef),
}

/// Refuses an item anchor outside the caller's access rule exactly as a missing
/// item (`not_found`, the same message): the item's place would tell it exists.
pub(super) fn check_seek_visible(
    database: &Database,
    collection: CollectionId,
    seek: Option<&Seek>,
) -> Result<(), ApiError> {
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
