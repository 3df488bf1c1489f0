//! Items and diffs as JSON, written straight from the engine's borrowed data into
//! a caller-owned buffer. A diff's JSON is byte-for-byte what `serde_json` writes
//! for `eyeball_im::VectorDiff<Item>`, with `Item` as `write_item` shows it (a test
//! checks it against eyeball-im itself).

use ordo_core::{DiffRef, ItemList, ItemRef, Value};

use crate::frame::{write_json_str, write_u64};
use crate::wire::Projection;

/// `{"id":..,"version":N,"fields":{..},"payload":..}`: one item, wherever the
/// server sends one (diff frames, `GET`, one-shot queries). The payload is stored
/// JSON text, copied as is; the version (the last write that changed the item) is
/// what a window digest hashes with the id.
pub fn write_item(out: &mut Vec<u8>, item: ItemRef<'_>, projection: &Projection) {
    out.extend_from_slice(b"{\"id\":");
    write_json_str(out, item.id());
    out.extend_from_slice(b",\"version\":");
    write_u64(out, item.version());
    out.extend_from_slice(b",\"fields\":{");
    let schema = item.schema();
    for (index, &field_id) in projection.fields.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_json_str(out, &schema.field(field_id).name);
        out.push(b':');
        write_value(out, item.field(field_id));
    }
    for (index, name) in projection.through.iter().enumerate() {
        if index > 0 || !projection.fields.is_empty() {
            out.push(b',');
        }
        write_json_str(out, name);
        out.push(b':');
        // The window's view reads it, so the engine has it (null if ever not).
        let value = schema.view_field_id(name).map_or(Value::Null, |field_id| item.field(field_id));
        write_value(out, value);
    }
    out.push(b'}');
    if projection.payload {
        out.extend_from_slice(b",\"payload\":");
        let payload = item.payload();
        if payload.is_empty() {
            out.extend_from_slice(b"null");
        } else {
            out.extend_from_slice(payload);
        }
    }
    out.push(b'}');
}

pub fn write_value(out: &mut Vec<u8>, value: Value<'_>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::I64(number) => {
            if number < 0 {
                out.push(b'-');
            }
            write_u64(out, number.unsigned_abs())
        }
        Value::U64(number) => write_u64(out, number),
        // serde_json's own float formatting (shortest round-trip; non-finite as null).
        Value::F64(number) => serde_json::to_writer(&mut *out, &number).expect("writing to a Vec cannot fail"),
        Value::Str(text) => write_json_str(out, text),
    }
}

pub fn write_items(out: &mut Vec<u8>, items: ItemList<'_>, projection: &Projection) {
    out.push(b'[');
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_item(out, item, projection);
    }
    out.push(b']');
}

/// One diff in eyeball-im's serde form, e.g. `{"Insert":{"index":0,"value":{..}}}`.
pub fn write_diff(out: &mut Vec<u8>, diff: DiffRef<'_>, projection: &Projection) {
    match diff {
        DiffRef::Append { values } => {
            out.extend_from_slice(b"{\"Append\":{\"values\":");
            write_items(out, values, projection);
            out.extend_from_slice(b"}}");
        }
        DiffRef::Clear => out.extend_from_slice(b"{\"Clear\":{}}"),
        DiffRef::PushFront { value } => {
            out.extend_from_slice(b"{\"PushFront\":{\"value\":");
            write_item(out, value, projection);
            out.extend_from_slice(b"}}");
        }
        DiffRef::PushBack { value } => {
            out.extend_from_slice(b"{\"PushBack\":{\"value\":");
            write_item(out, value, projection);
            out.extend_from_slice(b"}}");
        }
        DiffRef::PopFront => out.extend_from_slice(b"{\"PopFront\":{}}"),
        DiffRef::PopBack => out.extend_from_slice(b"{\"PopBack\":{}}"),
        DiffRef::Insert { index, value } => {
            out.extend_from_slice(b"{\"Insert\":{\"index\":");
            write_u64(out, index as u64);
            out.extend_from_slice(b",\"value\":");
            write_item(out, value, projection);
            out.extend_from_slice(b"}}");
        }
        DiffRef::Set { index, value } => {
            out.extend_from_slice(b"{\"Set\":{\"index\":");
            write_u64(out, index as u64);
            out.extend_from_slice(b",\"value\":");
            write_item(out, value, projection);
            out.extend_from_slice(b"}}");
        }
        DiffRef::Remove { index } => {
            out.extend_from_slice(b"{\"Remove\":{\"index\":");
            write_u64(out, index as u64);
            out.extend_from_slice(b"}}");
        }
        DiffRef::Truncate { length } => {
            out.extend_from_slice(b"{\"Truncate\":{\"length\":");
            write_u64(out, length as u64);
            out.extend_from_slice(b"}}");
        }
        DiffRef::Reset { values } => {
            out.extend_from_slice(b"{\"Reset\":{\"values\":");
            write_items(out, values, projection);
            out.extend_from_slice(b"}}");
        }
    }
}
