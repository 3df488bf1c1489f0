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
            old_schema: old.schema().clone(),
            new_schema,
            change: FieldChange::Added { default: default.clone() },
        };
        let seq = self.commit_change(change)?;
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
            old_schema: old.schema().clone(),
            new_schema,
            change: FieldChange::Removed { field_index },
        };
        let seq = self.commit_change(change)?;
        let ended = self.engine.remove_field(collection, name, sink).expect("checked before the disk");
        Ok((seq, ended))
    }

    /// Drops a collection: its items are deleted from disk, every window on it
    /// is closed (and returned), its name is free and `collection` is dead.
    /// Returns the drop's sequence number.
    pub fn drop_collection(&mut self, collection: CollectionId) -> Result<(u64, Vec<WindowId>), StoreError> {
        let (number, _) = self.live(collection)?;
        let seq = self.commit_change(SchemaChange::Drop { number })?;
        let ended = self.engine.drop_collection(collection).expect("checked before the disk");
        self.collection_numbers[collection.index()] = None;
        Ok((seq, ended))
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
