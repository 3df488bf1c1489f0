//! Resolving a batch's atomic field operations and preconditions into a plain
//! batch of concrete values.
//!
//! Why resolve instead of applying atomics in place: a store logs a batch before
//! it applies it, and a replay must not depend on the state it replays onto. So
//! `unread += 1` is logged as `unread = 8`, the value it produced. And a store
//! validates a whole group of batches before applying any (group commit), so a
//! batch must be resolved against the items *as the earlier batches of its group
//! will leave them*: those batches are staged in an [`Overlay`], which answers
//! "what is this item's state now" from the staged operations first and from the
//! collection after. Operations on one item inside one batch compose the same
//! way: each resolved operation is staged before the next is resolved.
//!
//! The overlay is a hash table from (collection, id) to the latest staged
//! operation on that item, each operation linking to the previous one on the
//! same item. Reading a field walks that chain back to the first operation that
//! wrote the field (a remove ends it with null). Every buffer is kept between
//! groups, so steady-state resolution allocates nothing.

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

use crate::batch::{AtomicOp, Batch, OpKind, Precondition, StoredOp, StoredValue};
use crate::collection::Collection;
use crate::error::BatchError;
use crate::field_check::check_field_value;
use crate::schema::{FieldId, FieldType, Schema};
use crate::value::Value;

const NO_OP: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct StagedOp {
    collection: u32,
    hash: u64,
    id_start: u32,
    id_len: u32,
    is_remove: bool,
    version: u64,
    fields_start: u32,
    fields_len: u32,
    /// The previous staged op on the same item, or `NO_OP`.
    prev: u32,
}

#[derive(Clone, Copy)]
struct StagedField {
    field_id: FieldId,
    value: StoredValue,
}

/// Operations of batches accepted but not yet applied (see the module docs).
#[derive(Default)]
pub(crate) struct Overlay {
    ops: Vec<StagedOp>,
    fields: Vec<StagedField>,
    text: String,
    /// Index in `ops` of the latest op on each (collection, id).
    latest: HashTable<u32>,
    hasher: DefaultHashBuilder,
}

/// What an overlay held before a batch was staged, to take the batch back out.
#[derive(Clone, Copy)]
struct Mark {
    n_ops: usize,
    n_fields: usize,
    n_text_bytes: usize,
}

impl Overlay {
    pub(crate) fn clear(&mut self) {
        self.ops.clear();
        self.fields.clear();
        self.text.clear();
        self.latest.clear();
    }

    fn mark(&self) -> Mark {
        Mark { n_ops: self.ops.len(), n_fields: self.fields.len(), n_text_bytes: self.text.len() }
    }

    fn hash(&self, collection: u32, id: &str) -> u64 {
        self.hasher.hash_one((collection, id.as_bytes()))
    }

    fn id(&self, op: &StagedOp) -> &str {
        &self.text[op.id_start as usize..(op.id_start + op.id_len) as usize]
    }

    fn latest_op(&self, collection: u32, id: &str) -> Option<u32> {
        let hash = self.hash(collection, id);
        self.latest
            .find(hash, |&index| {
                let op = &self.ops[index as usize];
                op.collection == collection && self.id(op) == id
            })
            .copied()
    }

    fn value(&self, field: &StagedField) -> Value<'_> {
        field.value.read(&self.text)
    }

    /// Records one operation of a validated batch (values converted to their
    /// fields' types). Payloads are not kept: nothing resolves against them.
    fn stage_op(&mut self, collection: u32, schema: &Schema, batch: &Batch, op: &StoredOp, version: u64) {
        let id = batch.id(op);
        let hash = self.hash(collection, id);
        let id_start = self.text.len() as u32;
        self.text.push_str(id);
        let fields_start = self.fields.len() as u32;
        for field in batch.op_fields(op) {
            let field_id = schema.field_id(batch.field_name(field)).expect("validated: the field exists");
            let value = batch.field_value(field).coerce_to(schema.field(field_id).field_type).expect("validated");
            let value = match value {
                Value::Null => StoredValue::Null,
                Value::Bool(flag) => StoredValue::Bool(flag),
                Value::I64(number) => StoredValue::I64(number),
                Value::U64(number) => StoredValue::U64(number),
                Value::F64(number) => StoredValue::F64(number),
                Value::Str(text) => {
                    let start = self.text.len() as u32;
                    self.text.push_str(text);
                    StoredValue::Str { start, len: text.len() as u32 }
                }
            };
            self.fields.push(StagedField { field_id, value });
        }
        let index = self.ops.len() as u32;
        let Overlay { ops, text, latest, .. } = self;
        let found = latest.find_mut(hash, |&existing| {
            let op = &ops[existing as usize];
            op.collection == collection && &text[op.id_start as usize..(op.id_start + op.id_len) as usize] == id
        });
        let prev = match found {
            Some(entry) => std::mem::replace(entry, index),
            None => {
                latest.insert_unique(hash, index, |&existing| ops[existing as usize].hash);
                NO_OP
            }
        };
        ops.push(StagedOp {
            collection,
            hash,
            id_start,
            id_len: id.len() as u32,
            is_remove: op.kind == OpKind::Remove,
            version,
            fields_start,
            fields_len: self.fields.len() as u32 - fields_start,
            prev,
        });
    }

    /// Takes every op staged since `mark` back out, latest first.
    fn rollback(&mut self, mark: Mark) {
        while self.ops.len() > mark.n_ops {
            let index = (self.ops.len() - 1) as u32;
            let op = self.ops.pop().expect("checked");
            match self.latest.find_entry(op.hash, |&existing| existing == index) {
                Ok(entry) if op.prev == NO_OP => {
                    entry.remove();
                }
                Ok(mut entry) => *entry.get_mut() = op.prev,
                Err(_) => unreachable!("a staged op is its item's latest until a later one is staged"),
            }
        }
        self.fields.truncate(mark.n_fields);
        self.text.truncate(mark.n_text_bytes);
    }

    pub(crate) fn stage_batch(&mut self, collection: u32, schema: &Schema, batch: &Batch, version: u64) {
        for op in &batch.ops {
            self.stage_op(collection, schema, batch, op, version);
        }
    }

    /// The item's version now (`None`: no such item).
    fn item_version(&self, collection_index: u32, collection: &Collection, id: &str) -> Option<u64> {
        match self.latest_op(collection_index, id) {
            Some(index) => {
                let op = &self.ops[index as usize];
                (!op.is_remove).then_some(op.version)
            }
            None => collection.find_slot(id).map(|slot| collection.version_of(slot)),
        }
    }

    /// The item's field now (null when the item does not exist).
    fn field_value<'a>(
        &'a self,
        collection_index: u32,
        collection: &'a Collection,
        id: &str,
        field_id: FieldId,
    ) -> Value<'a> {
        let mut next = self.latest_op(collection_index, id).unwrap_or(NO_OP);
        while next != NO_OP {
            let op = &self.ops[next as usize];
            if op.is_remove {
                return Value::Null;
            }
            let fields = &self.fields[op.fields_start as usize..(op.fields_start + op.fields_len) as usize];
            // The last write of the field in an op wins, as when fields are applied.
            if let Some(field) = fields.iter().rev().find(|field| field.field_id == field_id) {
                return self.value(field);
            }
            next = op.prev;
        }
        collection.find_slot(id).map_or(Value::Null, |slot| collection.value(slot, field_id))
    }
}

/// Resolves `batch` (validated) into `out`, a plain batch of the same operations
/// whose atomic operations are replaced by the values they produce, checking each
/// precondition against the state the operations before it leave. On success the
/// resolved operations are staged in `overlay` at `version`; on failure nothing is.
pub(crate) fn resolve_batch(
    collection_index: u32,
    collection: &Collection,
    overlay: &mut Overlay,
    batch: &Batch,
    version: u64,
    out: &mut Batch,
) -> Result<(), BatchError> {
    out.clear();
    let mark = overlay.mark();
    let outcome = resolve_ops(collection_index, collection, overlay, batch, version, out);
    if outcome.is_err() {
        overlay.rollback(mark);
        out.clear();
    }
    outcome
}

fn resolve_ops(
    collection_index: u32,
    collection: &Collection,
    overlay: &mut Overlay,
    batch: &Batch,
    version: u64,
    out: &mut Batch,
) -> Result<(), BatchError> {
    let schema = collection.schema();
    for (op_index, op) in batch.ops.iter().enumerate() {
        let id = batch.id(op);
        if let Some(expected) = op.precondition {
            let found = overlay.item_version(collection_index, collection, id);
            let holds = match expected {
                Precondition::Exists => found.is_some(),
                Precondition::NotExists => found.is_none(),
                Precondition::Version(expected) => found == Some(expected),
            };
            if !holds {
                return Err(BatchError::Conflict { op_index, id: id.to_owned(), expected, found });
            }
        }
        if op.kind == OpKind::Remove {
            out.remove(id);
        } else {
            let mut upsert = out.upsert(id);
            for field in batch.op_fields(op) {
                upsert = upsert.set(batch.field_name(field), batch.field_value(field));
            }
            if let Some(payload) = batch.payload(op) {
                upsert.payload(payload);
            }
            for atomic in batch.op_atomics(op) {
                let name = batch.field_name(&atomic.field);
                let field_id = schema.field_id(name).expect("validated: the field exists");
                let field_type = schema.field(field_id).field_type;
                let operand = batch.field_value(&atomic.field);
                let new_value = {
                    // The op's own writes so far (its sets, then atomics already
                    // resolved), else the item as the staged ops leave it.
                    let current = match out.last_op_value(name) {
                        Some(value) => value.coerce_to(field_type).expect("validated"),
                        None => overlay.field_value(collection_index, collection, id, field_id),
                    };
                    apply_atomic(atomic.op, field_type, current, operand).ok_or_else(|| BatchError::Overflow {
                        op_index,
                        field: name.to_owned(),
                        operation: atomic.op.name(),
                        field_type: field_type.name(),
                    })?
                };
                if let Some(value) = new_value {
                    out.push_set_to_last(name, value);
                }
            }
        }
        let resolved = *out.ops.last().expect("pushed above");
        overlay.stage_op(collection_index, schema, out, &resolved, version);
    }
    Ok(())
}

/// The value an atomic operation writes (`Some(None)`: it leaves the field as
/// it is), or `None` when the result leaves the field's type. `current` has the
/// field's type or is null; `operand` was validated for the field.
pub(crate) fn apply_atomic<'b>(
    op: AtomicOp,
    field_type: FieldType,
    current: Value<'_>,
    operand: Value<'b>,
) -> Option<Option<Value<'b>>> {
    match op {
        AtomicOp::Increment | AtomicOp::Decrement => {
            let is_decrement = op == AtomicOp::Decrement;
            let value = match field_type {
                FieldType::F64 => {
                    let current = match current {
                        Value::F64(number) => number,
                        _ => 0.0,
                    };
                    let Some(Value::F64(delta)) = operand.coerce_to(FieldType::F64) else {
                        unreachable!("validated: the operand converts to f64")
                    };
                    let result = if is_decrement { current - delta } else { current + delta };
                    if !result.is_finite() {
                        return None;
                    }
                    Value::F64(result)
                }
                FieldType::I64 | FieldType::U64 => {
                    let current = match current {
                        Value::I64(number) => i128::from(number),
                        Value::U64(number) => i128::from(number),
                        _ => 0,
                    };
                    let delta = integer_operand(operand).expect("validated: an integer operand");
                    let result = if is_decrement { current - delta } else { current + delta };
                    if field_type == FieldType::I64 {
                        Value::I64(i64::try_from(result).ok()?)
                    } else {
                        Value::U64(u64::try_from(result).ok()?)
                    }
                }
                _ => unreachable!("validated: a numeric field"),
            };
            Some(Some(value))
        }
        AtomicOp::SetMax | AtomicOp::SetMin => {
            let operand = operand.coerce_to(field_type).expect("validated: the operand fits the field");
            let ordering = match (operand, current) {
                (_, Value::Null) => return Some(Some(operand)),
                (Value::I64(new), Value::I64(old)) => new.cmp(&old),
                (Value::U64(new), Value::U64(old)) => new.cmp(&old),
                (Value::F64(new), Value::F64(old)) => new.partial_cmp(&old).expect("no NaN is stored"),
                // Byte order, as strings sort (case-sensitive).
                (Value::Str(new), Value::Str(old)) => new.cmp(old),
                _ => unreachable!("validated: a field of an ordered type"),
            };
            let wins = if op == AtomicOp::SetMax { ordering.is_gt() } else { ordering.is_lt() };
            Some(wins.then_some(operand))
        }
    }
}

/// An integer operand as `i128` (`None`: not an integer, after the same lossless
/// conversions a field value gets).
pub(crate) fn integer_operand(operand: Value<'_>) -> Option<i128> {
    match operand.coerce_to(FieldType::I64) {
        Some(Value::I64(number)) => Some(i128::from(number)),
        _ => match operand.coerce_to(FieldType::U64) {
            Some(Value::U64(number)) => Some(i128::from(number)),
            _ => None,
        },
    }
}

/// Checks an atomic operation's field type and operand: `increment`/`decrement`
/// take a numeric field and an operand of its kind (an integer for integer
/// fields); `set_max`/`set_min` take a numeric or string field and a value of
/// its type. Null operands are refused: they would mean nothing.
pub(crate) fn check_atomic(
    op_index: usize,
    name: &str,
    field_type: FieldType,
    op: AtomicOp,
    operand: Value<'_>,
) -> Result<(), BatchError> {
    let applies = match op {
        AtomicOp::Increment | AtomicOp::Decrement => {
            matches!(field_type, FieldType::I64 | FieldType::U64 | FieldType::F64)
        }
        AtomicOp::SetMax | AtomicOp::SetMin => {
            matches!(field_type, FieldType::I64 | FieldType::U64 | FieldType::F64 | FieldType::String)
        }
    };
    if !applies {
        return Err(BatchError::AtomicNotApplicable {
            op_index,
            field: name.to_owned(),
            operation: op.name(),
            field_type: field_type.name(),
        });
    }
    let wrong_type = |expected: &'static str| BatchError::WrongType {
        op_index,
        field: name.to_owned(),
        expected,
        found: operand.type_name(),
    };
    if operand.is_null() {
        return Err(wrong_type(field_type.name()));
    }
    match (op, field_type) {
        (AtomicOp::Increment | AtomicOp::Decrement, FieldType::I64 | FieldType::U64) => {
            integer_operand(operand).map(|_| ()).ok_or_else(|| wrong_type("an integer"))
        }
        (AtomicOp::Increment | AtomicOp::Decrement, _) => {
            check_field_value(op_index, name, FieldType::F64, operand).map(|_| ())
        }
        _ => check_field_value(op_index, name, field_type, operand).map(|_| ()),
    }
}
