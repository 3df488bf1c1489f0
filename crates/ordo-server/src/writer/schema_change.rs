//! Schema changes and drops on the writer thread: the store makes them durable
//! and closes the engine windows they end; here every subscription of those
//! windows is ended (`Outgoing::Ended`, which its connection turns into an
//! `ended` frame, parked sessions included: the message waits in their queue),
//! the windows that stay have their projections follow the new schema and get a
//! Reset in the new shape, and the routing table publishes the new entry (or
//! frees the name after a drop).

use std::sync::Arc;

use ordo_core::{CollectionId, FieldType, OwnedValue, Schema, WindowId};

use super::fanout::FanoutTarget;
use super::{share_key, Outgoing, Writer};
use crate::error::{ApiError, ErrorCode};
use crate::routing::CollectionEntry;
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
    /// The relationship a view of a collection read by relationship depends on
    /// ended (`writer/relations`).
    AccessEnded,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::CollectionDropped => "collection_dropped",
            EndReason::FieldRemoved => "field_removed",
            EndReason::AccessEnded => "access_ended",
        }
    }
}

impl Writer {
    pub(crate) fn change_fields(
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
        self.fanout.target = FanoutTarget::Discard;
        let result = match &change {
            FieldChange::Add { name, field_type, default } => self
                .database
                .add_field(collection, name, *field_type, default, &mut self.fanout)
                .map(|seq| (seq, Vec::new())),
            FieldChange::Remove { name } => self.database.remove_field(collection, name, &mut self.fanout),
        };
        self.fanout.target = FanoutTarget::Subscribers;
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

    pub(crate) fn drop_collection(&mut self, collection: CollectionId) -> Result<u64, ApiError> {
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

    /// Refuses a request checked against a schema the collection no longer has
    /// (a field was added or removed while it was queued): its projection's field
    /// ids would name other fields, or none.
    pub(super) fn check_schema(&self, collection: CollectionId, schema: &Schema) -> Result<(), ApiError> {
        match self.database.engine().collection(collection) {
            None => Err(ApiError::new(crate::error::ErrorCode::UnknownCollection, "no such collection")),
            Some(current) if current.schema() != schema => Err(ApiError::new(
                crate::error::ErrorCode::InvalidView,
                format!("the schema of `{}` changed while this request was on its way; send it again", current.name()),
            )),
            Some(_) => Ok(()),
        }
    }

    /// Ends every subscription of the given (already closed) engine windows.
    fn end_windows(&mut self, ended: &[WindowId], reason: super::EndReason, message: &str) {
        self.relations_closed_by_engine(ended);
        for window in ended {
            let Some(shared) = self.fanout.windows.remove(window) else { continue };
            if let Some(key) = shared.share_key {
                self.fanout.windows_by_key.remove(&key);
            }
            for (session, handle) in shared.subscribers {
                self.view_budgets.release((session, handle));
                self.release_relation((session, handle));
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
    /// field, takes a new one too, a listed one never), windows are keyed again for sharing, and each
    /// gets a Reset in the new shape, encoded once for all its subscribers.
    fn follow_schema(&mut self, collection: CollectionId, old_schema: &Schema, new_schema: &Schema) {
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
            projection.fields = if !projection.is_listed {
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
            self.fanout.target = FanoutTarget::Subscribers;
            let reset = self.database.emit_window_reset(window, &mut self.fanout);
            debug_assert!(reset.is_ok(), "a window kept across a change is live");
        }
    }

    /// Publishes the collection's new schema to the network tasks.
    fn republish(&mut self, collection: CollectionId, schema: Schema) -> Arc<CollectionEntry> {
        let mut routes = self.routes.write().expect("routes lock");
        let name = self.database.engine().collection(collection).expect("live").name().to_owned();
        let mut entry = CollectionEntry::from_engine(self.database.engine(), collection).expect("live");
        entry.schema = Arc::new(schema.without_derived());
        let entry = Arc::new(entry);
        routes.remove(&name);
        routes.insert(&name, entry.clone()).expect("the name was just freed");
        entry
    }
}

impl Writer {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::writer::Command;
    use tokio::sync::oneshot;

    /// A query checked by a network task against the schema before a removal,
    /// reaching the writer after it: its projection's field ids are stale, and
    /// it is refused instead of being encoded with them.
    #[test]
    fn a_request_checked_against_a_schema_since_changed_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let options = ordo_store::StoreOptions { preallocate_log: false, ..Default::default() };
        let (database, _) = ordo_store::Database::open(dir.path(), options, &mut |_| {}).unwrap();
        let mut writer = Writer::new(database, Default::default(), 1 << 20);
        let schema = Schema::new().with_field("a", FieldType::U64).with_field("b", FieldType::String);
        let (_, entry) = writer.create_collection("rooms", schema).unwrap();
        let mut batch = ordo_core::Batch::new();
        batch.upsert("x").set("a", ordo_core::Value::U64(1)).set("b", ordo_core::Value::Str("text"));
        let mut group = [ordo_store::PendingWrite::new(entry.id, batch)];
        writer.database.write_group(&mut group, &mut writer.fanout);
        let spec =
            crate::wire::window_spec(&entry.schema, &serde_json::Value::Null, &[], Default::default(), 10, None, true)
                .unwrap();
        writer.change_fields(entry.id, FieldChange::Remove { name: "a".into() }).unwrap();

        let (reply, mut answer) = oneshot::channel();
        writer.handle(Command::Query { collection: entry.id, schema: entry.schema.clone(), spec: spec.clone(), reply });
        let refused = answer.try_recv().expect("answered at once").expect_err("a stale projection");
        assert_eq!(refused.code, ErrorCode::InvalidView, "{refused}");

        // Checked against the current schema, the same request is answered.
        let current = writer.routes.read().unwrap().get("rooms").unwrap().clone();
        let spec = crate::wire::window_spec(
            &current.schema,
            &serde_json::Value::Null,
            &[],
            Default::default(),
            10,
            None,
            true,
        )
        .unwrap();
        let (reply, mut answer) = oneshot::channel();
        writer.handle(Command::Query { collection: entry.id, schema: current.schema.clone(), spec, reply });
        let body = answer.try_recv().unwrap().unwrap();
        assert!(String::from_utf8(body).unwrap().contains(r#""fields":{"b":"text"}"#));
    }

    /// A write under a filtered write rule, whose guard (field ids of the grant's
    /// equalities) was built before a removal moved the fields: refused, never
    /// checked with ids that now name other fields.
    #[test]
    fn a_guarded_write_checked_against_a_schema_since_changed_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let options = ordo_store::StoreOptions { preallocate_log: false, ..Default::default() };
        let (database, _) = ordo_store::Database::open(dir.path(), options, &mut |_| {}).unwrap();
        let mut writer = Writer::new(database, Default::default(), 1 << 20);
        let schema = Schema::new().with_field("a", FieldType::U64).with_field("owner", FieldType::String);
        let (_, entry) = writer.create_collection("notes", schema).unwrap();
        let mut grant = crate::write_rules::WriteGrant::default();
        let owner_is_u1 = serde_json::json!({"field": "owner", "op": "eq", "value": "u1"});
        grant.add(&crate::write_rules::WriteLimits::EVERYTHING, crate::rules::Grant::Where(vec![owner_is_u1]));
        let guard =
            Arc::new(crate::write_guard::WriteGuard::new(&grant, &entry.schema).unwrap().expect("a filtered grant"));
        writer.change_fields(entry.id, FieldChange::Remove { name: "a".into() }).unwrap();

        // Owner `u2`: outside the grant. With the stale id 1 (no field now) the check
        // would read past the schema; it must be refused before it is checked.
        let mut batch = ordo_core::Batch::new();
        batch.upsert("n1").set("owner", ordo_core::Value::Str("u2"));
        let (reply, mut answer) = oneshot::channel();
        let command = Command::Write {
            batches: vec![(entry.id, batch)],
            reply,
            queued_at: std::time::Instant::now(),
            guards: vec![(0, guard)],
            results: Vec::new(),
        };
        let Command::Write { batches, reply, queued_at, guards, results } = command else { unreachable!() };
        writer.guarded_write(batches, guards, (reply, queued_at, results));
        let results = answer.try_recv().expect("answered at once").results;
        let refused = results[0].as_ref().expect_err("a stale guard");
        assert_eq!(refused.code, ErrorCode::InvalidBatch, "{refused}");
        assert!(writer.database.engine().collection(entry.id).unwrap().is_empty(), "nothing was written");
    }
}
