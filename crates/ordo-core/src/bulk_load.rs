//! Bulk loading: many new items into a collection without views, validated one
//! by one and indexed all at once at the end (see `Collection::index_slots_from`
//! for why the index is built in one pass).

use crate::collection::{Collection, PendingIndexEntry};
use crate::error::{BatchError, LoadError};
use crate::field_check::check_field_value;
use crate::ids::Slot;
use crate::limits;
use crate::value::Value;

/// A bulk load in progress, from [`crate::Engine::bulk_load`]. Items pushed are
/// not visible until [`BulkLoad::finish`]; dropping it unfinished removes them.
pub struct BulkLoad<'a> {
    collection: &'a mut Collection,
    first_slot: Slot,
    /// The id-index entry of each pushed item, in push order.
    pending: Vec<PendingIndexEntry>,
    is_finished: bool,
}

impl<'a> BulkLoad<'a> {
    pub(crate) fn new(collection: &'a mut Collection, n_items_hint: usize) -> BulkLoad<'a> {
        collection.reserve(n_items_hint);
        let first_slot = collection.slot_capacity() as Slot;
        BulkLoad { collection, first_slot, pending: Vec::with_capacity(n_items_hint), is_finished: false }
    }

    /// Adds one item. `values` holds one value per schema field, in schema order.
    /// The item is held to the same limits as a batch; a refused item adds nothing.
    /// Duplicate ids are found by [`BulkLoad::finish`].
    pub fn push(&mut self, id: &str, values: &[Value<'_>], payload: &[u8]) -> Result<(), LoadError> {
        self.push_with_version(id, 0, values, payload)
    }

    /// As [`BulkLoad::push`], with the item's version (see [`crate::ItemRef::version`]).
    pub fn push_with_version(
        &mut self,
        id: &str,
        version: u64,
        values: &[Value<'_>],
        payload: &[u8],
    ) -> Result<(), LoadError> {
        let collection = &mut *self.collection;
        let invalid = |error: BatchError| LoadError::Invalid { id: id.to_owned(), error };
        if id.is_empty() {
            return Err(invalid(BatchError::IdEmpty { op_index: 0 }));
        }
        if id.len() > limits::MAX_ID_BYTES {
            return Err(invalid(BatchError::IdTooLong { op_index: 0, id_bytes: id.len() }));
        }
        if payload.len() > limits::MAX_PAYLOAD_BYTES {
            return Err(invalid(BatchError::PayloadTooLarge { op_index: 0, payload_bytes: payload.len() }));
        }
        if values.len() != collection.schema().len() {
            return Err(LoadError::FieldCount { n_values: values.len(), n_fields: collection.schema().len() });
        }
        if collection.len() >= limits::MAX_ITEMS_PER_COLLECTION {
            return Err(invalid(BatchError::CollectionFull { n_items_max: limits::MAX_ITEMS_PER_COLLECTION }));
        }
        for (field, &value) in collection.schema().fields().iter().zip(values) {
            check_field_value(0, &field.name, field.field_type, value).map_err(invalid)?;
        }
        let slot = collection.push_unindexed_slot(id, version, values, payload);
        self.pending.push(collection.pending_index_entry(slot));
        Ok(())
    }

    /// Number of items pushed so far.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Indexes every pushed item and makes them visible. On a duplicate id (within
    /// the load or with an item already there) no pushed item is kept.
    pub fn finish(mut self) -> Result<usize, LoadError> {
        self.is_finished = true;
        let n_items = self.pending.len();
        self.collection
            .index_slots_from(self.first_slot, &mut self.pending)
            .map_err(|id| LoadError::DuplicateId { id })?;
        Ok(n_items)
    }
}

impl Drop for BulkLoad<'_> {
    fn drop(&mut self) {
        if !self.is_finished {
            self.collection.truncate_slots(self.first_slot);
        }
    }
}
