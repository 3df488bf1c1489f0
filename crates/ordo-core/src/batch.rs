//! Batches: the only way items change. A batch is caller-owned and reusable:
//! `clear` keeps its buffers, so building the next batch allocates nothing once
//! the buffers have grown to the working size.

use crate::limits::MAX_BATCH_BYTES;
use crate::value::Value;

/// A value as stored inside a batch: strings point into the batch's text arena.
#[derive(Clone, Copy, Debug)]
pub(crate) enum StoredValue {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str { start: u32, len: u32 },
}

impl StoredValue {
    /// The value, its string (if any) read from `text`, the arena it points into.
    pub(crate) fn read<'t>(self, text: &'t str) -> Value<'t> {
        match self {
            StoredValue::Null => Value::Null,
            StoredValue::Bool(flag) => Value::Bool(flag),
            StoredValue::I64(number) => Value::I64(number),
            StoredValue::U64(number) => Value::U64(number),
            StoredValue::F64(number) => Value::F64(number),
            StoredValue::Str { start, len } => Value::Str(&text[start as usize..(start + len) as usize]),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct StoredField {
    pub(crate) name_start: u32,
    pub(crate) name_len: u32,
    pub(crate) value: StoredValue,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    Upsert,
    Remove,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct StoredOp {
    pub(crate) kind: OpKind,
    pub(crate) id_start: u32,
    pub(crate) id_len: u32,
    pub(crate) fields_start: u32,
    pub(crate) fields_len: u32,
    /// The op's atomic field operations, in `Batch::atomics`.
    pub(crate) atomics_start: u32,
    pub(crate) atomics_len: u32,
    /// `None`: keep the item's payload (partial update); a new item starts empty.
    pub(crate) payload: Option<(u32, u32)>,
    pub(crate) precondition: Option<Precondition>,
}

/// An atomic operation on one field of an upsert, resolved against the item's
/// current value when the batch is applied (on the writer, so concurrent writers
/// never lose an update).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Adds the value (null counts as 0). Numeric fields only.
    Increment,
    /// Subtracts the value (null counts as 0). Numeric fields only.
    Decrement,
    /// Sets the value if it is greater than the current one, or the current one is null.
    SetMax,
    /// Sets the value if it is less than the current one, or the current one is null.
    SetMin,
}

impl AtomicOp {
    /// The name used in error messages and on the wire.
    pub fn name(self) -> &'static str {
        match self {
            AtomicOp::Increment => "increment",
            AtomicOp::Decrement => "decrement",
            AtomicOp::SetMax => "set_max",
            AtomicOp::SetMin => "set_min",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct StoredAtomic {
    pub(crate) op: AtomicOp,
    pub(crate) field: StoredField,
}

/// A condition an operation puts on its item's state just before it; a batch
/// with a failed one is refused whole ([`crate::BatchError::Conflict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precondition {
    Exists,
    NotExists,
    /// The item exists and its version (the sequence number of the last batch
    /// that changed it) is this one.
    Version(u64),
}

/// A list of upserts and removes, applied whole or rejected whole.
#[derive(Default)]
pub struct Batch {
    pub(crate) ops: Vec<StoredOp>,
    pub(crate) fields: Vec<StoredField>,
    pub(crate) atomics: Vec<StoredAtomic>,
    text: String,
    payload_bytes: Vec<u8>,
    /// Set when an addition would pass `MAX_BATCH_BYTES`; the addition is dropped
    /// and the batch is refused when applied.
    pub(crate) is_oversized: bool,
    /// Some operation has an atomic field operation or a precondition: the batch
    /// must be resolved against the items' state before it is applied or logged.
    needs_state: bool,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Empties the batch, keeping its buffers for the next one.
    pub fn clear(&mut self) {
        self.ops.clear();
        self.fields.clear();
        self.atomics.clear();
        self.text.clear();
        self.payload_bytes.clear();
        self.is_oversized = false;
        self.needs_state = false;
    }

    /// Bytes held (ids, names, strings, payloads), checked against `MAX_BATCH_BYTES`.
    pub fn n_bytes(&self) -> usize {
        self.text.len() + self.payload_bytes.len()
    }

    fn has_room_for(&mut self, n_bytes: usize) -> bool {
        if self.n_bytes() + n_bytes > MAX_BATCH_BYTES {
            self.is_oversized = true;
        }
        !self.is_oversized
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Whether an operation has an atomic field operation or a precondition, so
    /// that applying the batch depends on the items' state: a store logs such a
    /// batch only once resolved to plain values (see [`crate::Engine::resolve_batch`]).
    pub fn needs_state(&self) -> bool {
        self.needs_state
    }

    fn push_text(&mut self, text: &str) -> (u32, u32) {
        if !self.has_room_for(text.len()) {
            return (0, 0);
        }
        let start = self.text.len() as u32;
        self.text.push_str(text);
        (start, text.len() as u32)
    }

    /// Starts an upsert: a new item gets the fields set on the returned builder
    /// (others null); an existing one keeps every field not set.
    pub fn upsert(&mut self, id: &str) -> UpsertBuilder<'_> {
        let (id_start, id_len) = self.push_text(id);
        let fields_start = self.fields.len() as u32;
        let atomics_start = self.atomics.len() as u32;
        self.ops.push(StoredOp {
            kind: OpKind::Upsert,
            id_start,
            id_len,
            fields_start,
            fields_len: 0,
            atomics_start,
            atomics_len: 0,
            payload: None,
            precondition: None,
        });
        UpsertBuilder { batch: self }
    }

    /// Removes an item; removing an absent id is a no-op.
    pub fn remove(&mut self, id: &str) {
        self.push_remove(id, None);
    }

    /// Removes an item if `precondition` holds; otherwise the batch is refused whole.
    pub fn remove_if(&mut self, id: &str, precondition: Precondition) {
        self.push_remove(id, Some(precondition));
    }

    fn push_remove(&mut self, id: &str, precondition: Option<Precondition>) {
        let (id_start, id_len) = self.push_text(id);
        self.needs_state |= precondition.is_some();
        self.ops.push(StoredOp {
            kind: OpKind::Remove,
            id_start,
            id_len,
            fields_start: 0,
            fields_len: 0,
            atomics_start: 0,
            atomics_len: 0,
            payload: None,
            precondition,
        });
    }

    fn push_value(&mut self, value: Value<'_>) -> StoredValue {
        match value {
            Value::Null => StoredValue::Null,
            Value::Bool(flag) => StoredValue::Bool(flag),
            Value::I64(number) => StoredValue::I64(number),
            Value::U64(number) => StoredValue::U64(number),
            Value::F64(number) => StoredValue::F64(number),
            Value::Str(text) => {
                let (start, len) = self.push_text(text);
                StoredValue::Str { start, len }
            }
        }
    }

    /// The operations in order, for readers outside the engine (a store persisting them).
    pub fn ops(&self) -> impl ExactSizeIterator<Item = BatchOp<'_>> + '_ {
        self.ops.iter().map(move |op| BatchOp { batch: self, op })
    }

    pub(crate) fn id(&self, op: &StoredOp) -> &str {
        &self.text[op.id_start as usize..(op.id_start + op.id_len) as usize]
    }

    pub(crate) fn op_fields(&self, op: &StoredOp) -> &[StoredField] {
        &self.fields[op.fields_start as usize..(op.fields_start + op.fields_len) as usize]
    }

    pub(crate) fn op_atomics(&self, op: &StoredOp) -> &[StoredAtomic] {
        &self.atomics[op.atomics_start as usize..(op.atomics_start + op.atomics_len) as usize]
    }

    pub(crate) fn field_name(&self, field: &StoredField) -> &str {
        &self.text[field.name_start as usize..(field.name_start + field.name_len) as usize]
    }

    pub(crate) fn field_value(&self, field: &StoredField) -> Value<'_> {
        field.value.read(&self.text)
    }

    /// The value the last op (an upsert) sets `name` to last, if it sets it.
    pub(crate) fn last_op_value(&self, name: &str) -> Option<Value<'_>> {
        let op = self.ops.last()?;
        let field = self.op_fields(op).iter().rev().find(|field| self.field_name(field) == name)?;
        Some(self.field_value(field))
    }

    /// Sets a field on the last op, an upsert, replacing the value the op
    /// already sets for it if any: an op sets each field once (validation
    /// refuses a repeat), so an atomic's result replaces the op's own set.
    pub(crate) fn push_set_to_last(&mut self, name: &str, value: Value<'_>) {
        let op = *self.ops.last().expect("an upsert was started");
        let value = self.push_value(value);
        let fields = op.fields_start as usize..(op.fields_start + op.fields_len) as usize;
        if let Some(index) = fields.into_iter().find(|&index| self.field_name(&self.fields[index]) == name) {
            self.fields[index].value = value;
            return;
        }
        let (name_start, name_len) = self.push_text(name);
        self.fields.push(StoredField { name_start, name_len, value });
        self.ops.last_mut().expect("an upsert was started").fields_len += 1;
    }

    pub(crate) fn payload(&self, op: &StoredOp) -> Option<&[u8]> {
        op.payload.map(|(start, len)| &self.payload_bytes[start as usize..(start + len) as usize])
    }
}

/// Sets the fields and payload of the upsert just started.
pub struct UpsertBuilder<'a> {
    batch: &'a mut Batch,
}

impl UpsertBuilder<'_> {
    /// Sets a field by name. Unknown names and wrong types are reported when the batch is applied.
    pub fn set(self, field: &str, value: Value<'_>) -> Self {
        let (name_start, name_len) = self.batch.push_text(field);
        let value = self.batch.push_value(value);
        self.batch.fields.push(StoredField { name_start, name_len, value });
        self.batch.ops.last_mut().expect("an upsert was started").fields_len += 1;
        self
    }

    /// Sets a field, replacing the value this upsert already sets for it, if
    /// any. For readers of batches recorded before an op could set a field only
    /// once (a write-ahead log, where an atomic's result followed the op's own
    /// set of the field): the last value is the one that was applied.
    pub fn set_replacing(self, field: &str, value: Value<'_>) -> Self {
        self.batch.push_set_to_last(field, value);
        self
    }

    /// Adds an atomic operation on a field, applied after the fields `set` on
    /// this upsert, in the order added (see [`AtomicOp`]).
    pub fn atomic(self, op: AtomicOp, field: &str, value: Value<'_>) -> Self {
        let (name_start, name_len) = self.batch.push_text(field);
        let value = self.batch.push_value(value);
        self.batch.atomics.push(StoredAtomic { op, field: StoredField { name_start, name_len, value } });
        self.batch.ops.last_mut().expect("an upsert was started").atomics_len += 1;
        self.batch.needs_state = true;
        self
    }

    /// `field += delta` (see [`AtomicOp::Increment`]).
    pub fn increment(self, field: &str, delta: Value<'_>) -> Self {
        self.atomic(AtomicOp::Increment, field, delta)
    }

    /// `field -= delta` (see [`AtomicOp::Decrement`]).
    pub fn decrement(self, field: &str, delta: Value<'_>) -> Self {
        self.atomic(AtomicOp::Decrement, field, delta)
    }

    /// `field = max(field, value)` (see [`AtomicOp::SetMax`]).
    pub fn set_max(self, field: &str, value: Value<'_>) -> Self {
        self.atomic(AtomicOp::SetMax, field, value)
    }

    /// `field = min(field, value)` (see [`AtomicOp::SetMin`]).
    pub fn set_min(self, field: &str, value: Value<'_>) -> Self {
        self.atomic(AtomicOp::SetMin, field, value)
    }

    /// Applies the upsert only if `precondition` holds; otherwise the batch is refused whole.
    pub fn precondition(self, precondition: Precondition) -> Self {
        self.batch.ops.last_mut().expect("an upsert was started").precondition = Some(precondition);
        self.batch.needs_state = true;
        self
    }

    /// Whether the upsert sets `field` or has an atomic operation on it already
    /// (for callers that allow a field once per operation).
    pub fn names_field(&self, field: &str) -> bool {
        let batch = &*self.batch;
        let op = batch.ops.last().expect("an upsert was started");
        batch.op_fields(op).iter().any(|stored| batch.field_name(stored) == field)
            || batch.op_atomics(op).iter().any(|atomic| batch.field_name(&atomic.field) == field)
    }

    /// Replaces the item's opaque payload.
    pub fn payload(self, payload: &[u8]) -> Self {
        if !self.batch.has_room_for(payload.len()) {
            return self;
        }
        let start = self.batch.payload_bytes.len() as u32;
        self.batch.payload_bytes.extend_from_slice(payload);
        self.batch.ops.last_mut().expect("an upsert was started").payload = Some((start, payload.len() as u32));
        self
    }
}

/// One operation of a batch, read back.
#[derive(Clone, Copy)]
pub struct BatchOp<'a> {
    batch: &'a Batch,
    op: &'a StoredOp,
}

impl<'a> BatchOp<'a> {
    pub fn id(&self) -> &'a str {
        self.batch.id(self.op)
    }

    pub fn is_remove(&self) -> bool {
        self.op.kind == OpKind::Remove
    }

    /// The fields an upsert sets, by name, in the order they were set (a later
    /// setting of the same field wins). Empty for a remove.
    pub fn fields(&self) -> impl ExactSizeIterator<Item = (&'a str, Value<'a>)> + 'a {
        let batch = self.batch;
        batch.op_fields(self.op).iter().map(move |field| (batch.field_name(field), batch.field_value(field)))
    }

    /// The new payload, or `None` when the upsert keeps the item's payload.
    pub fn payload(&self) -> Option<&'a [u8]> {
        self.batch.payload(self.op)
    }

    /// The atomic field operations of an upsert, in order: `(op, field name, operand)`.
    pub fn atomics(&self) -> impl ExactSizeIterator<Item = (AtomicOp, &'a str, Value<'a>)> + 'a {
        let batch = self.batch;
        batch
            .op_atomics(self.op)
            .iter()
            .map(move |atomic| (atomic.op, batch.field_name(&atomic.field), batch.field_value(&atomic.field)))
    }

    pub fn precondition(&self) -> Option<Precondition> {
        self.op.precondition
    }
}
