//! Relationships checked and watched on the writer thread, for views of a
//! collection read by relationship (`related`, docs/SECURITY.md "Reading by
//! relationship").
//!
//! A relationship is a view over the related collection (the caller's read
//! rule there AND `to_field == value`, `RelationCheck::def`). Each distinct one
//! is one engine window of limit 1, a *watch*, shared by every subscription
//! that depends on it, so no polling: the engine reports the watch's length
//! like any window's. A view opens only while its watch holds an item
//! (`watch_relation`); when the length drops to 0 during a batch, the sink
//! (`Fanout::view_len`) detaches every dependent subscription and queues its
//! `ended` / `access_ended` at once, so that no frame of a later batch reaches
//! it; `end_lost_relations` frees what they held once the command is done.
//!
//! **Invariant:** a subscription listed as a dependent is attached to a live
//! watch whose view holds an item; every watch has at least one dependent, or
//! is closed before the command that emptied it returns.

use std::collections::HashMap;
use std::sync::Arc;

use ordo_core::{WindowAnchor, WindowId};

use super::fanout::{Fanout, FanoutTarget};
use super::schema_change::EndReason;
use super::{Outgoing, SessionId, SubHandle, Writer};
use crate::error::{ApiError, ErrorCode};
use crate::related::RelationCheck;
use crate::wire::WindowSpec;

type SubKey = (SessionId, SubHandle);

/// The watches, and what waits for the end of the current command.
#[derive(Default)]
pub(super) struct RelationWatches {
    by_key: HashMap<String, WindowId>,
    watches: HashMap<WindowId, Watch>,
    of_sub: HashMap<SubKey, WindowId>,
    /// Subscriptions whose relationship ended, detached from their windows by
    /// the sink (the window named), still to be told.
    lost: Vec<(SessionId, SubHandle, WindowId)>,
    /// Watches emptied during a batch, still to be closed (the engine is
    /// delivering when the sink learns it).
    emptied: Vec<WindowId>,
}

struct Watch {
    check: Arc<RelationCheck>,
    dependents: Vec<SubKey>,
}

/// What an `ended` frame of a lost relationship says.
const ACCESS_ENDED_MESSAGE: &str =
    "the relationship this subscription was read by ended (the related item was removed or no longer relates)";

impl RelationWatches {
    pub(super) fn is_watch(&self, window: WindowId) -> bool {
        !self.watches.is_empty() && self.watches.contains_key(&window)
    }

    /// The relationship a subscription is read by, if any.
    pub(super) fn check_of(&self, sub: SubKey) -> Option<Arc<RelationCheck>> {
        let window = self.of_sub.get(&sub)?;
        Some(self.watches[window].check.clone())
    }

    /// Forgets a watch whose view became empty (or whose window the engine
    /// closed) and returns the subscriptions that depended on it.
    fn take_watch(&mut self, window: WindowId) -> Vec<SubKey> {
        let Some(watch) = self.watches.remove(&window) else { return Vec::new() };
        self.by_key.remove(&watch.check.key());
        for sub in &watch.dependents {
            self.of_sub.remove(sub);
        }
        watch.dependents
    }
}

impl Fanout {
    /// The sink saw a watch's view become empty: its dependents are detached
    /// from their windows now (no later frame reaches them) and ended once the
    /// command is done; the watch closes then too.
    pub(super) fn relation_emptied(&mut self, window: WindowId) {
        let dependents = self.relations.take_watch(window);
        self.relations.emptied.push(window);
        self.detach_lost(dependents);
    }

    /// Detaches each subscription from its window and queues its `ended` at
    /// once: right behind the last frame it was due, before any frame of a
    /// later batch of the same command (a group commit, a cluster run) is queued
    /// to its connection. What needs the engine waits for the command's end.
    fn detach_lost(&mut self, dependents: Vec<SubKey>) {
        for (session, handle) in dependents {
            let Some(sub) = self.sessions.get_mut(&session).and_then(|state| state.subs.remove(&handle)) else {
                continue;
            };
            if let Some(shared) = self.windows.get_mut(&sub.window) {
                shared.subscribers.retain(|&subscriber| subscriber != (session, handle));
            }
            self.relations.lost.push((session, handle, sub.window));
            let message = ACCESS_ENDED_MESSAGE.to_owned();
            self.send(session, Outgoing::Ended { handle, reason: EndReason::AccessEnded, message });
        }
    }
}

impl Writer {
    /// A subscribe: on a collection read by relationship, the relationship is
    /// checked first and the subscription then depends on its watch.
    pub(super) fn subscribe_related(
        &mut self,
        session: SessionId,
        handle: SubHandle,
        collection: ordo_core::CollectionId,
        mut spec: WindowSpec,
        owner: Option<Arc<str>>,
    ) -> Result<(), ApiError> {
        // The shared window keeps no caller's relationship (`WindowSpec::relation`).
        let Some(relation) = spec.relation.take() else {
            return self.subscribe(session, handle, collection, spec, owner);
        };
        let watch = self.watch_relation(&relation)?;
        let result = self.subscribe(session, handle, collection, spec, owner);
        self.settle_relation((session, handle), watch, result.is_ok());
        result
    }

    /// A `set_view`: the new view's relationship (if any) is checked before the
    /// window changes; once it changed, the subscription depends on it instead.
    pub(super) fn change_view_related(
        &mut self,
        session: SessionId,
        handle: SubHandle,
        def: ordo_core::ViewDef,
        owner: Option<Arc<str>>,
        relation: Option<Arc<RelationCheck>>,
    ) -> Result<(), ApiError> {
        let watch = relation.as_ref().map(|relation| self.watch_relation(relation)).transpose()?;
        let result = match owner {
            Some(owner) => self.change_view_within_budget(session, handle, def, owner),
            None => self.change_window(session, handle, super::subscriptions::WindowChange::View(def)),
        };
        match watch {
            Some(watch) => self.settle_relation((session, handle), watch, result.is_ok()),
            None if result.is_ok() => self.release_relation((session, handle)),
            None => {}
        }
        result
    }

    /// A one-shot query on a collection read by relationship: the relationship
    /// must hold now (its watch, if one exists, or a view opened for the check).
    pub(super) fn check_relation_now(&mut self, spec: &WindowSpec) -> Result<(), ApiError> {
        let Some(relation) = &spec.relation else { return Ok(()) };
        let watch = self.watch_relation(relation)?;
        self.close_if_unwatched(watch);
        Ok(())
    }

    /// The watch of `relation`: found, or opened; refused (with the
    /// relationship's own words) when its view holds no item.
    fn watch_relation(&mut self, relation: &Arc<RelationCheck>) -> Result<WindowId, ApiError> {
        self.check_schema(relation.collection, &relation.schema).map_err(|error| match error.code {
            ErrorCode::UnknownCollection => relation.refused(),
            _ => error,
        })?;
        let key = relation.key();
        if let Some(&window) = self.fanout.relations.by_key.get(&key) {
            return Ok(window);
        }
        self.fanout.target = FanoutTarget::Discard;
        let opened = self.database.open_window_at(
            relation.collection,
            &relation.def,
            WindowAnchor::Offset(0),
            1,
            &mut self.fanout,
        );
        self.fanout.target = FanoutTarget::Subscribers;
        let (window, _) = opened?;
        if self.database.view_len(window)? == 0 {
            let _ = self.database.close_window(window);
            return Err(relation.refused());
        }
        let relations = &mut self.fanout.relations;
        relations.by_key.insert(key, window);
        relations.watches.insert(window, Watch { check: relation.clone(), dependents: Vec::new() });
        Ok(window)
    }

    /// After a subscribe or `set_view` that needed `watch`: the subscription
    /// depends on it if the request succeeded (and the subscription lives);
    /// otherwise a watch nobody depends on closes.
    fn settle_relation(&mut self, sub: SubKey, watch: WindowId, succeeded: bool) {
        let lives = self.fanout.sessions.get(&sub.0).is_some_and(|state| state.subs.contains_key(&sub.1));
        if !(succeeded && lives) {
            self.close_if_unwatched(watch);
            return;
        }
        if self.fanout.relations.of_sub.get(&sub) == Some(&watch) {
            return;
        }
        self.release_relation(sub);
        let relations = &mut self.fanout.relations;
        relations.watches.get_mut(&watch).expect("a live watch").dependents.push(sub);
        relations.of_sub.insert(sub, watch);
    }

    /// A subscription no longer depends on its watch (it went, or changed its
    /// view); the watch closes with its last dependent.
    pub(super) fn release_relation(&mut self, sub: SubKey) {
        let Some(window) = self.fanout.relations.of_sub.remove(&sub) else { return };
        if let Some(watch) = self.fanout.relations.watches.get_mut(&window) {
            watch.dependents.retain(|&dependent| dependent != sub);
        }
        self.close_if_unwatched(window);
    }

    fn close_if_unwatched(&mut self, window: WindowId) {
        let relations = &mut self.fanout.relations;
        if relations.watches.get(&window).is_some_and(|watch| watch.dependents.is_empty()) {
            relations.take_watch(window);
            let _ = self.database.close_window(window);
        }
    }

    /// Watches among windows the engine closed (a schema change or a drop of
    /// the related collection): their dependents lose their relationship.
    pub(super) fn relations_closed_by_engine(&mut self, closed: &[WindowId]) {
        for &window in closed {
            if self.fanout.relations.is_watch(window) {
                let dependents = self.fanout.relations.take_watch(window);
                self.fanout.detach_lost(dependents);
            }
        }
    }

    /// After the command during which relationships ended (their subscriptions
    /// were detached and told already): gives their view budgets back, closes
    /// the emptied watches and the windows no one else holds.
    pub(super) fn end_lost_relations(&mut self) {
        let relations = &mut self.fanout.relations;
        if relations.lost.is_empty() && relations.emptied.is_empty() {
            return;
        }
        let emptied = std::mem::take(&mut relations.emptied);
        let lost = std::mem::take(&mut relations.lost);
        for window in emptied {
            let _ = self.database.close_window(window);
        }
        for (session, handle, window) in lost {
            self.view_budgets.release((session, handle));
            self.close_if_unsubscribed(window);
        }
    }

    /// Closes a subscription window that its last subscriber left.
    fn close_if_unsubscribed(&mut self, window: WindowId) {
        if !self.fanout.windows.get(&window).is_some_and(|shared| shared.subscribers.is_empty()) {
            return;
        }
        let shared = self.fanout.windows.remove(&window).expect("checked");
        if let Some(key) = shared.share_key {
            self.fanout.windows_by_key.remove(&key);
        }
        let _ = self.database.close_window(window);
    }
}
