//! A log record's bytes: the frame (`u32 body length, u32 CRC-32 of the body,
//! body`), a batch encoded into the body with its values already converted to
//! their field types, the seq marker (a record with no operations), and a
//! record found, checked and decoded back into a batch.

use ordo_core::{Batch, Schema, Value};

use crate::codec::{Corrupt, Reader};

/// Bytes before a record's body: its length and its CRC.
const HEADER_BYTES: usize = 8;
/// The fixed part of a body: seq, collection number, op count.
const BODY_FIXED_BYTES: usize = 16;

const OP_UPSERT: u8 = 1;
const OP_REMOVE: u8 = 2;

const VALUE_NULL: u8 = 0;
const VALUE_BOOL: u8 = 1;
const VALUE_I64: u8 = 2;
const VALUE_U64: u8 = 3;
const VALUE_F64: u8 = 4;
const VALUE_STR: u8 = 5;

/// The collection number of a *seq marker*: a record with no operations that
/// only says "these sequence numbers were used, and changed no item". Cluster
/// mode writes one for every stream entry that wrote no batch (refused at apply
/// time, a collection creation) and for the seqs a stream message leaves
/// unused, so that the log's sequence numbers stay consecutive and follow the
/// stream's, and a restart resumes right after the entry (see
/// `docs/STORAGE.md`, "Seq markers"). No collection ever gets this number.
///
/// A marker's body is a batch's fixed part: its seq is the *last* seq it uses
/// and its op count how many it uses before that one (0: the seq alone), so a
/// run of unused seqs of any length is one record.
pub(crate) const MARKER_COLLECTION: u32 = u32::MAX;

/// Appends one framed seq marker using `first_seq..=last_seq` to `buffer`.
pub(crate) fn encode_marker(buffer: &mut Vec<u8>, first_seq: u64, last_seq: u64) {
    debug_assert!(first_seq <= last_seq && last_seq - first_seq <= u64::from(u32::MAX));
    let start = buffer.len();
    buffer.extend_from_slice(&[0; HEADER_BYTES]);
    buffer.extend_from_slice(&last_seq.to_le_bytes());
    buffer.extend_from_slice(&MARKER_COLLECTION.to_le_bytes());
    buffer.extend_from_slice(&((last_seq - first_seq) as u32).to_le_bytes());
    let body_len = (buffer.len() - start - HEADER_BYTES) as u32;
    let crc = crc32fast::hash(&buffer[start + HEADER_BYTES..]);
    buffer[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
    buffer[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Appends one framed record for `batch` to `buffer`. Field values are converted
/// to their field's type first, so that a replay applies exactly what the engine
/// applied. The batch must have been validated against `schema`.
pub(crate) fn encode_record(buffer: &mut Vec<u8>, seq: u64, collection_number: u32, schema: &Schema, batch: &Batch) {
    let start = buffer.len();
    buffer.extend_from_slice(&[0; HEADER_BYTES]);
    buffer.extend_from_slice(&seq.to_le_bytes());
    buffer.extend_from_slice(&collection_number.to_le_bytes());
    buffer.extend_from_slice(&(batch.len() as u32).to_le_bytes());
    for op in batch.ops() {
        let id = op.id().as_bytes();
        if op.is_remove() {
            buffer.push(OP_REMOVE);
            buffer.push(id.len() as u8);
            buffer.extend_from_slice(id);
            continue;
        }
        buffer.push(OP_UPSERT);
        buffer.push(id.len() as u8);
        buffer.extend_from_slice(id);
        buffer.extend_from_slice(&(op.fields().len() as u32).to_le_bytes());
        for (name, value) in op.fields() {
            let field_id = schema.field_id(name).expect("validated: the field exists");
            let value = value.coerce_to(schema.field(field_id).field_type).expect("validated: the value fits");
            buffer.push(field_id.index() as u8);
            match value {
                Value::Null => buffer.push(VALUE_NULL),
                Value::Bool(flag) => buffer.extend_from_slice(&[VALUE_BOOL, u8::from(flag)]),
                Value::I64(number) => {
                    buffer.push(VALUE_I64);
                    buffer.extend_from_slice(&number.to_le_bytes());
                }
                Value::U64(number) => {
                    buffer.push(VALUE_U64);
                    buffer.extend_from_slice(&number.to_le_bytes());
                }
                Value::F64(number) => {
                    buffer.push(VALUE_F64);
                    buffer.extend_from_slice(&number.to_le_bytes());
                }
                Value::Str(text) => {
                    buffer.push(VALUE_STR);
                    buffer.extend_from_slice(&(text.len() as u32).to_le_bytes());
                    buffer.extend_from_slice(text.as_bytes());
                }
            }
        }
        match op.payload() {
            Some(payload) => {
                buffer.push(1);
                buffer.extend_from_slice(&(payload.len() as u32).to_le_bytes());
                buffer.extend_from_slice(payload);
            }
            None => buffer.push(0),
        }
    }
    let body_len = (buffer.len() - start - HEADER_BYTES) as u32;
    let crc = crc32fast::hash(&buffer[start + HEADER_BYTES..]);
    buffer[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
    buffer[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// A record's body whose CRC matched, split from what follows it.
pub(crate) struct RawRecord<'a> {
    /// The first sequence number the record uses: `seq` but for a marker of
    /// several (`MARKER_COLLECTION`).
    pub(crate) first_seq: u64,
    /// The last sequence number it uses: a batch's own.
    pub(crate) seq: u64,
    pub(crate) collection_number: u32,
    pub(crate) body: &'a [u8],
    /// The whole record, header included.
    pub(crate) framed: &'a [u8],
}

/// The next complete, intact record at the start of `bytes`, or `None` when
/// there is none (the end, a cut-off write, or damage), and the bytes it took.
pub(crate) fn next_record(bytes: &[u8]) -> Option<(RawRecord<'_>, usize)> {
    let header = bytes.get(..HEADER_BYTES)?;
    let body_len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    if body_len < BODY_FIXED_BYTES {
        return None;
    }
    let body = bytes.get(HEADER_BYTES..HEADER_BYTES.checked_add(body_len)?)?;
    if crc32fast::hash(body) != crc {
        return None;
    }
    let seq = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
    let collection_number = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
    let first_seq = match collection_number {
        MARKER_COLLECTION => {
            let n_before = u32::from_le_bytes(body[12..16].try_into().expect("4 bytes"));
            seq.checked_sub(u64::from(n_before)).filter(|&first| first >= 1)?
        }
        _ => seq,
    };
    Some((
        RawRecord { first_seq, seq, collection_number, body, framed: &bytes[..HEADER_BYTES + body_len] },
        HEADER_BYTES + body_len,
    ))
}

const DAMAGED: &str = "write-ahead log records that decode under their collection's schema";

/// Rebuilds the batch of a record (`batch` is cleared first). Errors name what
/// was expected, for `StoreError::Corrupt`.
pub(crate) fn decode_batch(record: &RawRecord<'_>, schema: &Schema, batch: &mut Batch) -> Result<(), Corrupt> {
    batch.clear();
    let mut reader = Reader { bytes: &record.body[BODY_FIXED_BYTES..] };
    let n_ops = u32::from_le_bytes(record.body[12..16].try_into().expect("4 bytes"));
    for _ in 0..n_ops {
        let kind = reader.u8(DAMAGED)?;
        let id_len = reader.u8(DAMAGED)? as usize;
        let id = reader.str(id_len, DAMAGED)?;
        match kind {
            OP_REMOVE => batch.remove(id),
            OP_UPSERT => {
                let mut upsert = batch.upsert(id);
                // The schema fields this op set so far, a bit each (a schema has at most 64).
                let mut set_fields: u64 = 0;
                for _ in 0..reader.u32(DAMAGED)? {
                    let field_index = reader.u8(DAMAGED)? as usize;
                    let field = schema.fields().get(field_index).ok_or(Corrupt(DAMAGED))?;
                    let value = match reader.u8(DAMAGED)? {
                        VALUE_NULL => Value::Null,
                        VALUE_BOOL => Value::Bool(reader.u8(DAMAGED)? != 0),
                        VALUE_I64 => Value::I64(reader.u64(DAMAGED)? as i64),
                        VALUE_U64 => Value::U64(reader.u64(DAMAGED)?),
                        VALUE_F64 => Value::F64(f64::from_bits(reader.u64(DAMAGED)?)),
                        VALUE_STR => {
                            let len = reader.u32(DAMAGED)? as usize;
                            Value::Str(reader.str(len, DAMAGED)?)
                        }
                        _ => return Err(Corrupt(DAMAGED)),
                    };
                    if !value.is_null() && value.coerce_to(field.field_type).is_none() {
                        return Err(Corrupt(DAMAGED));
                    }
                    // A log written before an op could set a field only once may hold an
                    // atomic's result after the op's own set of that field: the last was applied.
                    let bit = 1u64 << field_index;
                    upsert = if set_fields & bit == 0 {
                        upsert.set(&field.name, value)
                    } else {
                        upsert.set_replacing(&field.name, value)
                    };
                    set_fields |= bit;
                }
                match reader.u8(DAMAGED)? {
                    0 => {}
                    1 => {
                        let len = reader.u32(DAMAGED)? as usize;
                        upsert.payload(reader.take(len, DAMAGED)?);
                    }
                    _ => return Err(Corrupt(DAMAGED)),
                }
            }
            _ => return Err(Corrupt(DAMAGED)),
        }
    }
    reader.finish(DAMAGED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_core::FieldType;

    /// A log written before an op could set a field only once holds an atomic's
    /// result after the op's own set of that field. It replays as it was applied
    /// then (the last value), into a batch that sets each field once, which the
    /// engine's validation accepts.
    #[test]
    fn a_logged_op_setting_a_field_twice_decodes_to_its_last_value() {
        let schema = Schema::new().with_field("name", FieldType::String).with_field("unread", FieldType::U64);
        let mut logged = Batch::new();
        logged.upsert("!a").set("unread", Value::U64(1)).set("name", Value::Str("A")).set("unread", Value::U64(2));
        let mut buffer = Vec::new();
        encode_record(&mut buffer, 7, 1, &schema, &logged);
        let (record, _) = next_record(&buffer).expect("a whole record");
        let mut batch = Batch::new();
        decode_batch(&record, &schema, &mut batch).unwrap();
        let op = batch.ops().next().unwrap();
        let fields: Vec<(&str, Value<'_>)> = op.fields().collect();
        assert_eq!(fields, [("unread", Value::U64(2)), ("name", Value::Str("A"))]);
        let mut engine = ordo_core::Engine::new();
        let collection = engine.create_collection("c", schema).unwrap();
        engine.apply_batch(collection, &batch, &mut ordo_core::CollectingSink::new()).unwrap();
    }
}
