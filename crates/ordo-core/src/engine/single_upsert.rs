//! The one-item path: a batch that is a single plain upsert of an item the
//! collection already holds, writing no field that keys a view, in a
//! collection that reads through no reference. That is the chat case (a room's
//! `recency` and preview change), and most live updates.
//!
//! The general path (`validate_batch`, then `apply_upsert`) pays for what such
//! an update does not need, which the profile of `new_message_profile` shows
//! (~550 of ~3 200 instructions per update at 1k rooms):
//! - validation counts the batch's upserts, walks its atomics and pushes every
//!   field's resolved id into a vector, which `apply_upsert` then slices three
//!   times; here the ids and converted values stay in two small arrays;
//! - each value is converted to its field's type twice (validation, then the
//!   write); here once;
//! - `plan_visits` looks for every keyed field among the written ones and
//!   records a key move per keyed field, which `KeyIndex::apply_moves` then
//!   skips because old and new are equal; here a written key field sends the
//!   update to the general path, so the item's key is only read (its views
//!   found) and nothing is moved.
//!
//! Everything that decides an outcome is shared with the general path: the
//! views' removal and insertion (`remove_from_views`, `insert_into_views`, which
//! skip the filter when no filter field is written), the column writes and the
//! versions. Whenever this path cannot prove the batch valid, or the case is not
//! the one above, it returns `false` before changing anything, and the general
//! path applies the batch or reports its error. So errors, diffs and versions
//! are the general path's by construction; `tests/it/single_upsert.rs` runs the
//! same random batches through both and compares them.

use super::apply::{insert_into_views, remove_from_views};
use super::{CollectionState, Scratch, WindowSlot};
use crate::batch::{Batch, OpKind};
use crate::field_check::accepted_value;
use crate::limits;
use crate::schema::FieldId;
use crate::value::Value;
use crate::view::View;

/// More fields than this go to the general path (the arrays live on the stack).
const MAX_FIELDS: usize = 8;

/// Applies `batch` if it is one upsert this path takes (see the module); returns
/// whether it did. When it returns `false` nothing has changed.
pub(super) fn try_apply(
    state: &mut CollectionState,
    views: &mut [Option<View>],
    windows: &mut [WindowSlot],
    scratch: &mut Scratch,
    batch: &Batch,
    version: u64,
) -> bool {
    let [op] = batch.ops.as_slice() else { return false };
    let n_fields = op.fields_len as usize;
    if op.kind != OpKind::Upsert
        || op.atomics_len != 0
        || op.precondition.is_some()
        || batch.is_oversized
        || n_fields > MAX_FIELDS
        || !state.refs.links.is_empty()
        // The general path counts the upsert against the limit even when its item exists.
        || state.collection.len().saturating_add(1) > limits::MAX_ITEMS_PER_COLLECTION
    {
        return false;
    }
    let id = batch.id(op);
    if id.is_empty() || id.len() > limits::MAX_ID_BYTES {
        return false;
    }
    let payload = batch.payload(op);
    if payload.is_some_and(|payload| payload.len() > limits::MAX_PAYLOAD_BYTES) {
        return false;
    }
    let mut field_ids = [FieldId(0); MAX_FIELDS];
    let mut values = [Value::Null; MAX_FIELDS];
    let schema = state.collection.schema();
    for (index, field) in batch.op_fields(op).iter().enumerate() {
        let Some(field_id) = schema.field_id(batch.field_name(field)) else { return false };
        // A repeated field is refused by the general path's validation.
        if field_ids[..index].contains(&field_id) {
            return false;
        }
        let Some(value) = accepted_value(schema.field(field_id).field_type, batch.field_value(field)) else {
            return false;
        };
        field_ids[index] = field_id;
        values[index] = value;
    }
    let (field_ids, values) = (&field_ids[..n_fields], &values[..n_fields]);
    let Some(slot) = state.collection.find_slot(id) else { return false };

    // The views the item is in or may enter: every unkeyed view and the views of
    // its key values, which this update does not change.
    scratch.visited_views.clear();
    scratch.visited_views.extend_from_slice(&state.unkeyed_views);
    for field in state.keys.fields() {
        if field_ids.contains(&field.field_id) {
            return false;
        }
        scratch.visited_views.extend_from_slice(state.keys.views_of_slot(field, &state.collection, slot));
    }

    remove_from_views(state, views, scratch, Some(slot), Some(field_ids));
    for (&field_id, &value) in field_ids.iter().zip(values) {
        state.collection.set_value(slot, field_id, value);
    }
    if let Some(payload) = payload {
        state.collection.set_payload(slot, payload);
    }
    state.collection.set_version(slot, version);
    insert_into_views(state, views, windows, scratch, slot, true);
    true
}
