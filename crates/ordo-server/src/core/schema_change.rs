//! Schema changes and drops on the writer thread: the store makes them durable
//! and closes the engine windows they end; here every subscription of those
//! windows is ended (`Outgoing::Ended`, which its connection turns into an
//! `ended` frame, parked sessions included: the message waits in their queue),
//! the windows that stay have their projections follow the new schema and get a
//! Reset in the new shape, and the routing table publishes the new entry (or
//! frees the name after a drop).

use std::sync::Arc;

use ordo_core::{CollectionId, FieldType, OwnedValue, Schema, WindowId};

use super::{share_key, CollectionEntry, Core, Outgoing, Route};
use crate::error::ApiError;
use crate::wire::Projection;

/// A change of fields, as checked by the HTTP handler.
#[derive(Debug)]
pub enum FieldChange {
    Add { name: String, field_type: FieldType, default: OwnedValue },
    Remove { name: String },
}

/// Why the server ended a subscription (the `reason` of the `ended` frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    CollectionDropped,
    FieldRemoved,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::CollectionDropped => "collection_dropped",
            EndReason::FieldRemoved => "field_removed",
        }
    }
}

impl Core {
    pub(super) fn change_fields(
        &mut self,
        collection: CollectionId,
        change: FieldChange,
    ) -> Result<(u64, Arc<CollectionEntry>), ApiError> {
        let old_schema = self
            .database
            .engine()
            .collection(collection)
            .ok_or_else(|| ApiError::new(crate::error::ErrorCode::UnknownCollection, "no such collection"))?
            .schema()
            .clone();
        // The engine's resets are encoded below, once projections follow the new schema.
        self.fanout.route = Route::Discard;
        let result = match &change {
            FieldChange::Add { name, field_type, default } => self
                .database
                .add_field(collection, name, *field_type, default, &mut self.fanout)
                .map(|seq| (seq, Vec::new())),
            FieldChange::Remove { name } => self.database.remove_field(collection, name, &mut self.fanout),
        };
        self.fanout.route = Route::Subscribers;
        let (seq, ended) = result?;
        let message = match &change {
            FieldChange::Remove { name } => {
                format!("field `{name}` was removed, and this subscription's view reads it")
            }
            FieldChange::Add { .. } => String::new(),
        };
        self.end_windows(&ended, super::EndReason::FieldRemoved, &message);
        let new_schema = self.database.engine().collection(collection).expect("changed, not dropped").schema().clone();
        self.follow_schema(collection, &old_schema, &new_schema);
        let entry = self.republish(collection, new_schema);
        Ok((seq, entry))
    }

    pub(super) fn drop_collection(&mut self, collection: CollectionId) -> Result<u64, ApiError> {
        let name = match self.database.engine().collection(collection) {
            Some(state) => state.name().to_owned(),
            None => return Err(ApiError::new(crate::error::ErrorCode::UnknownCollection, "no such collection")),
        };
        let (seq, ended) = self.database.drop_collection(collection)?;
        let message = format!("collection `{name}` was dropped");
        self.end_windows(&ended, super::EndReason::CollectionDropped, &message);
        self.unprepared.retain(|window| !ended.contains(window));
        self.routes.write().expect("routes lock").remove(&name);
        Ok(seq)
    }

    /// Ends every subscription of the given (already closed) engine windows.
    fn end_windows(&mut self, ended: &[WindowId], reason: super::EndReason, message: &str) {
        for window in ended {
            let Some(shared) = self.fanout.windows.remove(window) else { continue };
            if let Some(key) = shared.share_key {
                self.fanout.windows_by_key.remove(&key);
            }
            for (session, handle) in shared.subscribers {
                if let Some(state) = self.fanout.sessions.get_mut(&session) {
                    state.subs.remove(&handle);
                }
                let message = message.to_owned();
                self.fanout.send(session, Outgoing::Ended { handle, reason, message });
            }
        }
    }

    /// The windows left on a collection whose fields changed: projections follow
    /// the new schema (a field removed leaves them; the default projection, every
    /// field, takes a new one too), windows are keyed again for sharing, and each
    /// gets a Reset in the new shape, encoded once for all its subscribers.
    fn follow_schema(&mut self, collection: CollectionId, old_schema: &Schema, new_schema: &Schema) {
        let old_all = Projection::all(old_schema);
        let mut windows: Vec<WindowId> = self
            .fanout
            .windows
            .iter()
            .filter(|(_, shared)| shared.collection == collection)
            .map(|(&window, _)| window)
            .collect();
        windows.sort_unstable_by_key(|window| window.as_u64());
        for &window in &windows {
            let shared = self.fanout.windows.get_mut(&window).expect("listed");
            let projection = &mut shared.spec.projection;
            projection.fields = if *projection.fields == *old_all.fields {
                Projection::all(new_schema).fields
            } else {
                // By name: the fields after a removed one moved down.
                let names = projection.fields.iter().map(|&field| &old_schema.field(field).name);
                names.filter_map(|name| new_schema.field_id(name)).collect()
            };
            if let Some(key) = shared.share_key.take() {
                self.fanout.windows_by_key.remove(&key);
            }
        }
        for &window in &windows {
            let shared = self.fanout.windows.get_mut(&window).expect("listed");
            if let std::collections::hash_map::Entry::Vacant(vacant) =
                self.fanout.windows_by_key.entry(share_key(collection, &shared.spec))
            {
                shared.share_key = Some(vacant.key().clone());
                vacant.insert(window);
            }
            self.fanout.route = Route::Subscribers;
            let reset = self.database.emit_window_reset(window, &mut self.fanout);
            debug_assert!(reset.is_ok(), "a window kept across a change is live");
        }
    }

    /// Publishes the collection's new schema to the network tasks.
    fn republish(&mut self, collection: CollectionId, schema: Schema) -> Arc<CollectionEntry> {
        let mut routes = self.routes.write().expect("routes lock");
        let name = self.database.engine().collection(collection).expect("live").name().to_owned();
        let entry = Arc::new(CollectionEntry { id: collection, name: name.clone(), schema: Arc::new(schema) });
        routes.remove(&name);
        routes.insert(&name, entry.clone()).expect("the name was just freed");
        entry
    }
}
