//! Schema changes and drops, durably: checked against the engine, written to
//! LMDB in one transaction after a checkpoint of everything before them, given
//! the next sequence number, and only then applied to the engine (whose windows
//! end or reset). As for batches, memory never runs ahead of the disk; a crash
//! at any moment leaves the collection as it was or as it became.
//!
//! Why not a log record: a change rewrites (or deletes) every item of its
//! collection, so it is LMDB work in any case, and a log record would have to
//! be replayed into LMDB by the checkpointer, whose record decoding would then
//! depend on which schema each record was written under. A forced checkpoint
//! followed by one transaction is atomic with respect to `kill -9` by LMDB's
//! own guarantee, and it is what creating a collection does already.

use ordo_core::{CollectionId, DiffSink, FieldType, OwnedValue, SchemaChangeError, WindowId};

use super::Database;
use crate::error::StoreError;
use crate::store::{FieldChange, SchemaChange};

impl Database {
    /// Appends a field to a collection; existing items take `default` (null:
    /// no value). Windows on the collection get a `Reset` through `sink`.
    /// Returns the change's sequence number once it is durable.
    pub fn add_field(
        &mut self,
        collection: CollectionId,
        name: &str,
        field_type: FieldType,
        default: &OwnedValue,
        sink: &mut dyn DiffSink,
    ) -> Result<u64, StoreError> {
        let new_schema =
            self.engine.check_add_field(collection, name, field_type, default).map_err(StoreError::SchemaChange)?;
        // Stored converted to the field's type, as the engine holds it.
        let default = default.as_value().coerce_to(field_type).expect("checked").to_owned_value();
        let (number, old) = self.live(collection)?;
        let change = SchemaChange::Fields {
            number,
            name: old.name().to_owned(),
            old_schema: self.stored_schema(old.schema()),
            new_schema: self.stored_schema(&new_schema),
            change: FieldChange::Added { default: default.clone() },
        };
        let seq = self.commit_change(change)?;
        // The change is a write of its own: the Resets it causes reflect it.
        sink.begin_batch(seq);
        self.engine.add_field(collection, name, field_type, &default, sink).expect("checked before the disk");
        Ok(seq)
    }

    /// Removes a field from a collection. Returns the change's sequence number
    /// and the windows that read the field, now closed; other windows on the
    /// collection get a `Reset` through `sink`.
    pub fn remove_field(
        &mut self,
        collection: CollectionId,
        name: &str,
        sink: &mut dyn DiffSink,
    ) -> Result<(u64, Vec<WindowId>), StoreError> {
        let new_schema = self.engine.check_remove_field(collection, name).map_err(StoreError::SchemaChange)?;
        let (number, old) = self.live(collection)?;
        let field_index = old.schema().field_id(name).expect("checked").index();
        let change = SchemaChange::Fields {
            number,
            name: old.name().to_owned(),
            old_schema: self.stored_schema(old.schema()),
            new_schema: self.stored_schema(&new_schema),
            change: FieldChange::Removed { field_index },
        };
        let seq = self.commit_change(change)?;
        sink.begin_batch(seq);
        let ended = self.engine.remove_field(collection, name, sink).expect("checked before the disk");
        Ok((seq, ended))
    }

    /// Drops a collection: its items are deleted from disk, every window on it
    /// is closed (and returned), its name is free and `collection` is dead.
    /// Returns the drop's sequence number.
    pub fn drop_collection(&mut self, collection: CollectionId) -> Result<(u64, Vec<WindowId>), StoreError> {
        let (number, _) = self.live(collection)?;
        // A collection a `ref` field targets stays until that field is removed.
        self.engine.check_not_referenced(collection).map_err(StoreError::SchemaChange)?;
        let seq = self.commit_change(SchemaChange::Drop { number })?;
        let ended = self.engine.drop_collection(collection).expect("checked before the disk");
        self.collection_numbers[collection.index()] = None;
        Ok((seq, ended))
    }

    /// `schema` as the store keeps it: each `ref` field's target is the target
    /// collection's number (the engine's ids live only as long as the process).
    pub(crate) fn stored_schema(&self, schema: &ordo_core::Schema) -> ordo_core::Schema {
        let numbers = &self.collection_numbers;
        map_ref_targets(schema, |target| {
            let number = numbers[target.index()].expect("a ref field targets a live collection");
            crate::codec::stored_target(number)
        })
    }

    fn live(&self, collection: CollectionId) -> Result<(u32, &ordo_core::Collection), StoreError> {
        let unknown = || StoreError::SchemaChange(SchemaChangeError::UnknownCollection);
        let state = self.engine.collection(collection).ok_or_else(unknown)?;
        let number = self.collection_numbers.get(collection.index()).copied().flatten().ok_or_else(unknown)?;
        Ok((number, state))
    }

    /// Writes `change` to LMDB as the next sequence number; returns it.
    fn commit_change(&mut self, change: SchemaChange) -> Result<u64, StoreError> {
        if let Some(stall) = self.checkpointer.stall() {
            return Err(stall.to_error(&self.dir));
        }
        let seq = self.wal.last_seq() + 1;
        self.checkpointer.change_schema(change, seq)?;
        // Durable from here on. A failure to start the next log segment stops
        // further appends (until a restart, which finds the change in LMDB) but
        // does not undo the change: the engine must follow the disk.
        let _ = self.wal.skip_seq(seq);
        self.remove_checkpointed_log();
        Ok(seq)
    }
}

/// `schema` with every `ref` field's target replaced by `map(target)`.
pub(crate) fn map_ref_targets(
    schema: &ordo_core::Schema,
    mut map: impl FnMut(CollectionId) -> CollectionId,
) -> ordo_core::Schema {
    let mut mapped = ordo_core::Schema::new();
    for field in schema.fields() {
        let field_type = match field.field_type {
            FieldType::Ref(target) => FieldType::Ref(map(target)),
            other => other,
        };
        mapped = mapped.try_with_field(&field.name, field_type).expect("the same names as a valid schema");
    }
    mapped
}

/// Orders stored collections so that every `ref` field's target comes before the
/// collection holding it (the engine refuses cycles, so an order exists), keeping
/// the stored order otherwise. Fails when a target is not among them. Linear in the
/// collections per level of references (one level in practice).
pub(crate) fn targets_first(
    stored: Vec<crate::store::StoredCollection>,
) -> Result<Vec<crate::store::StoredCollection>, ()> {
    let has_refs = |collection: &crate::store::StoredCollection| {
        collection.schema.fields().iter().any(|field| field.field_type.ref_target().is_some())
    };
    let (mut ordered, mut pending): (Vec<_>, Vec<_>) = stored.into_iter().partition(|collection| !has_refs(collection));
    let mut done: std::collections::HashSet<u32> = ordered.iter().map(|collection| collection.number).collect();
    while !pending.is_empty() {
        let (ready, rest): (Vec<_>, Vec<_>) = pending.into_iter().partition(|collection| {
            let mut targets = collection.schema.fields().iter().filter_map(|field| field.field_type.ref_target());
            targets.all(|target| done.contains(&(target.index() as u32)))
        });
        if ready.is_empty() {
            return Err(());
        }
        done.extend(ready.iter().map(|collection| collection.number));
        ordered.extend(ready);
        pending = rest;
    }
    Ok(ordered)
}
