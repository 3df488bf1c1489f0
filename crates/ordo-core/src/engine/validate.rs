//! Validation: a batch is checked whole, against the schema and the limits,
//! before anything changes, so that a rejected batch leaves no trace.

use crate::batch::{Batch, OpKind};
use crate::collection::Collection;
use crate::error::BatchError;
use crate::field_check::check_field_value;
use crate::limits;
use crate::resolve;
use crate::schema::FieldId;

/// Checks a whole batch before anything changes. Fills `resolved_fields`.
/// `n_items_pending` counts items that batches accepted but not yet applied will
/// add (a store validates a group of batches before committing any of them).
pub(super) fn validate_batch(
    collection: &Collection,
    batch: &Batch,
    n_items_pending: usize,
    resolved_fields: &mut Vec<FieldId>,
) -> Result<(), BatchError> {
    if batch.ops.len() > limits::MAX_OPS_PER_BATCH {
        return Err(BatchError::TooManyOps { n_ops: batch.ops.len() });
    }
    if batch.is_oversized {
        return Err(BatchError::BatchTooLarge);
    }
    let n_upserts = batch.ops.iter().filter(|op| op.kind == OpKind::Upsert).count();
    if collection.len().saturating_add(n_items_pending).saturating_add(n_upserts) > limits::MAX_ITEMS_PER_COLLECTION {
        return Err(BatchError::CollectionFull { n_items_max: limits::MAX_ITEMS_PER_COLLECTION });
    }
    resolved_fields.clear();
    let schema = collection.schema();
    for (op_index, op) in batch.ops.iter().enumerate() {
        let id = batch.id(op);
        if id.is_empty() {
            return Err(BatchError::IdEmpty { op_index });
        }
        if id.len() > limits::MAX_ID_BYTES {
            return Err(BatchError::IdTooLong { op_index, id_bytes: id.len() });
        }
        if let Some(payload) = batch.payload(op) {
            if payload.len() > limits::MAX_PAYLOAD_BYTES {
                return Err(BatchError::PayloadTooLarge { op_index, payload_bytes: payload.len() });
            }
        }
        let op_fields_start = resolved_fields.len();
        for field in batch.op_fields(op) {
            let name = batch.field_name(field);
            let field_id =
                schema.field_id(name).ok_or_else(|| BatchError::UnknownField { op_index, field: name.to_owned() })?;
            // A field set twice has no one value: a caller that checks the first
            // (an access rule) and an apply that keeps the last would disagree.
            // The scan is short: a schema has at most 64 fields, and the first
            // repeat ends it.
            if resolved_fields[op_fields_start..].contains(&field_id) {
                return Err(BatchError::FieldRepeated { op_index, field: name.to_owned() });
            }
            let field_type = schema.field(field_id).field_type;
            check_field_value(op_index, name, field_type, batch.field_value(field))?;
            resolved_fields.push(field_id);
        }
        for atomic in batch.op_atomics(op) {
            let name = batch.field_name(&atomic.field);
            let field_id =
                schema.field_id(name).ok_or_else(|| BatchError::UnknownField { op_index, field: name.to_owned() })?;
            resolve::check_atomic(
                op_index,
                name,
                schema.field(field_id).field_type,
                atomic.op,
                batch.field_value(&atomic.field),
            )?;
        }
    }
    Ok(())
}
