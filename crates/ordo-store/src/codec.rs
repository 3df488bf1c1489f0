//! The on-disk encoding of keys and values (format 3; byte layouts in `docs/STORAGE.md`).
//!
//! Every variable-length part carries its length in front of it, so decoding
//! never scans for a delimiter, and every record starts with its own version
//! byte. Integers are little-endian, except collection numbers in keys, which are
//! big-endian so that LMDB's byte order groups a collection's items together.

use ordo_core::{CollectionId, FieldType, Schema, Value};

/// The layout version of the whole data directory, kept in the `meta` database.
/// Format 2: schema changes and drops, each with its own sequence number that
/// no log record carries, and item records with the item's version (see
/// `docs/STORAGE.md`); a format-1 directory is upgraded at open.
/// Format 3: `ref` fields in schema records (type code 6 and the target's
/// collection number); format-1 and format-2 directories open as they are.
pub const FORMAT_VERSION: u32 = 3;
/// The oldest format this build upgrades.
pub const OLDEST_UPGRADABLE_FORMAT: u32 = 1;

/// The version byte at the start of every schema record.
const RECORD_VERSION: u8 = 1;

/// The version byte of item records written now: 2 carries the item's version
/// (the sequence number of the last batch that changed it) after the byte.
const ITEM_RECORD_VERSION: u8 = 2;
/// Item records of format 1, without an item version, are still read: their
/// items get version 0 (no batch has sequence number 0) until they next change.
const ITEM_RECORD_VERSION_1: u8 = 1;

/// A record that cannot be decoded: the data directory was damaged or written by
/// something else. Carries what was expected, for the error message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corrupt(pub &'static str);

/// Reads a little-endian record front to back; every read is bounds-checked.
pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n_bytes: usize, what: &'static str) -> Result<&'a [u8], Corrupt> {
        if self.bytes.len() < n_bytes {
            return Err(Corrupt(what));
        }
        let (head, rest) = self.bytes.split_at(n_bytes);
        self.bytes = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, Corrupt> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, Corrupt> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().expect("2 bytes")))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, Corrupt> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, Corrupt> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    pub(crate) fn str(&mut self, n_bytes: usize, what: &'static str) -> Result<&'a str, Corrupt> {
        std::str::from_utf8(self.take(n_bytes, what)?).map_err(|_| Corrupt(what))
    }

    pub(crate) fn finish(&self, what: &'static str) -> Result<(), Corrupt> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(Corrupt(what))
        }
    }
}

/// Item keys: the collection number (big-endian) then the item id's bytes.
pub fn item_key(buffer: &mut Vec<u8>, collection_number: u32, id: &str) {
    buffer.clear();
    buffer.extend_from_slice(&collection_number.to_be_bytes());
    buffer.extend_from_slice(id.as_bytes());
}

/// Splits an item key into its collection number and id.
pub fn split_item_key(key: &[u8]) -> Result<(u32, &str), Corrupt> {
    if key.len() < 5 {
        return Err(Corrupt("an item key: 4-byte collection number and a non-empty id"));
    }
    let (number, id) = key.split_at(4);
    let id = std::str::from_utf8(id).map_err(|_| Corrupt("an item id in UTF-8"))?;
    Ok((u32::from_be_bytes(number.try_into().expect("4 bytes")), id))
}

/// Splits the first `u32 key length, key, u32 record length, record` entry off a
/// load chunk (an in-memory format between the load's two threads, never on disk).
pub fn split_chunk_entry(chunk: &[u8]) -> Result<ChunkEntry<'_>, Corrupt> {
    let mut reader = Reader { bytes: chunk };
    let key_len = reader.u32("a chunk key length")? as usize;
    let key = reader.take(key_len, "a chunk key")?;
    let record_len = reader.u32("a chunk record length")? as usize;
    let record = reader.take(record_len, "a chunk record")?;
    Ok(ChunkEntry { key, record, rest: reader.bytes })
}

/// One entry of a load chunk, and what follows it.
pub struct ChunkEntry<'a> {
    pub key: &'a [u8],
    pub record: &'a [u8],
    pub rest: &'a [u8],
}

pub fn collection_key(collection_number: u32) -> [u8; 4] {
    collection_number.to_be_bytes()
}

pub fn decode_collection_key(key: &[u8]) -> Result<u32, Corrupt> {
    let bytes: [u8; 4] = key.try_into().map_err(|_| Corrupt("a 4-byte collection number"))?;
    Ok(u32::from_be_bytes(bytes))
}

pub fn encode_collection(buffer: &mut Vec<u8>, name: &str, schema: &Schema) {
    buffer.clear();
    buffer.push(RECORD_VERSION);
    buffer.extend_from_slice(&(name.len() as u16).to_le_bytes());
    buffer.extend_from_slice(name.as_bytes());
    buffer.push(schema.len() as u8);
    for field in schema.fields() {
        buffer.push(field_type_code(field.field_type));
        if let FieldType::Ref(target) = field.field_type {
            // A stored schema's reference carries the target's collection number (see `stored_target`).
            buffer.extend_from_slice(&(target.index() as u32).to_le_bytes());
        }
        buffer.push(field.name.len() as u8);
        buffer.extend_from_slice(field.name.as_bytes());
    }
}

pub fn decode_collection(bytes: &[u8]) -> Result<(String, Schema), Corrupt> {
    let mut reader = Reader { bytes };
    if reader.u8("a collection record version")? != RECORD_VERSION {
        return Err(Corrupt("collection record version 1"));
    }
    let name_len = reader.u16("a collection name length")? as usize;
    let name = reader.str(name_len, "a collection name in UTF-8")?.to_owned();
    let n_fields = reader.u8("a field count")?;
    let mut schema = Schema::new();
    for _ in 0..n_fields {
        let mut field_type = field_type_from_code(reader.u8("a field type")?)?;
        if let FieldType::Ref(_) = field_type {
            field_type = FieldType::Ref(stored_target(reader.u32("a ref field's target collection number")?));
        }
        let name_len = reader.u8("a field name length")? as usize;
        let field_name = reader.str(name_len, "a field name in UTF-8")?;
        schema = schema.try_with_field(field_name, field_type).map_err(|_| Corrupt("a valid schema"))?;
    }
    reader.finish("the end of the collection record")?;
    Ok((name, schema))
}

fn field_type_code(field_type: FieldType) -> u8 {
    match field_type {
        FieldType::Bool => 1,
        FieldType::I64 => 2,
        FieldType::U64 => 3,
        FieldType::F64 => 4,
        FieldType::String => 5,
        FieldType::Ref(_) => 6,
    }
}

/// The target of a `ref` field in a schema as the store keeps it: the raw id
/// carries the target's collection number, which `Database` maps to and from
/// the engine's `CollectionId` (see `database::stored_schema`).
pub fn stored_target(collection_number: u32) -> CollectionId {
    CollectionId::from_raw_parts(collection_number, STORED_TARGET_GENERATION)
}

/// The generation of a stored target id: no engine collection gets it in practice
/// (a slot would have to be reused four billion times), and stored schemas never
/// reach an engine unmapped.
pub const STORED_TARGET_GENERATION: u32 = u32::MAX;

fn field_type_from_code(code: u8) -> Result<FieldType, Corrupt> {
    Ok(match code {
        1 => FieldType::Bool,
        2 => FieldType::I64,
        3 => FieldType::U64,
        4 => FieldType::F64,
        5 => FieldType::String,
        // The target is read after the code.
        6 => FieldType::Ref(stored_target(0)),
        _ => return Err(Corrupt("a field type code 1..=6")),
    })
}

/// A byte range inside an item record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

/// Where a field's value comes from when an item record is (re)written: an
/// upsert overlays the values it sets on the item's current record, whose
/// untouched fields are copied over byte for byte.
#[derive(Clone, Copy, Debug)]
pub enum FieldSource<'a> {
    Null,
    /// A value already converted to the field's type.
    New(Value<'a>),
    /// The field's encoded bytes in the old record.
    Old(Span),
}

#[derive(Clone, Copy, Debug)]
pub enum PayloadSource<'a> {
    New(&'a [u8]),
    Old(Span),
}

/// Encodes an item record: `record version (2), u64 item version, n_fields,
/// presence bitmap, present values in schema order, payload length, payload`.
/// `Old` sources point into `old_record`.
pub fn encode_item(
    buffer: &mut Vec<u8>,
    old_record: &[u8],
    item_version: u64,
    fields: &[FieldSource<'_>],
    payload: PayloadSource<'_>,
) {
    buffer.clear();
    buffer.push(ITEM_RECORD_VERSION);
    buffer.extend_from_slice(&item_version.to_le_bytes());
    buffer.push(fields.len() as u8);
    let bitmap_start = buffer.len();
    buffer.resize(bitmap_start + fields.len().div_ceil(8), 0);
    for (index, source) in fields.iter().enumerate() {
        match *source {
            FieldSource::Null | FieldSource::New(Value::Null) => continue,
            FieldSource::Old(span) => buffer.extend_from_slice(&old_record[span.start as usize..span.end as usize]),
            FieldSource::New(Value::Bool(flag)) => buffer.push(u8::from(flag)),
            FieldSource::New(Value::I64(number)) => buffer.extend_from_slice(&number.to_le_bytes()),
            FieldSource::New(Value::U64(number)) => buffer.extend_from_slice(&number.to_le_bytes()),
            FieldSource::New(Value::F64(number)) => buffer.extend_from_slice(&number.to_le_bytes()),
            FieldSource::New(Value::Str(text)) => {
                buffer.extend_from_slice(&(text.len() as u32).to_le_bytes());
                buffer.extend_from_slice(text.as_bytes());
            }
        }
        buffer[bitmap_start + index / 8] |= 1 << (index % 8);
    }
    let payload = match payload {
        PayloadSource::New(bytes) => bytes,
        PayloadSource::Old(span) => &old_record[span.start as usize + 4..span.end as usize],
    };
    buffer.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buffer.extend_from_slice(payload);
}

/// Finds the encoded bytes of each field of an item record (`None`: null) and of
/// its payload (length prefix included), checking the record's structure.
pub fn scan_item(bytes: &[u8], schema: &Schema, spans: &mut Vec<Option<Span>>) -> Result<Span, Corrupt> {
    spans.clear();
    walk_item(bytes, schema, |field| spans.push(field.map(|(_, span)| span))).map(|(_, payload)| payload)
}

/// The item version an item record carries (0 for a record version 1, which has none).
pub fn item_version(bytes: &[u8]) -> Result<u64, Corrupt> {
    let mut reader = Reader { bytes };
    match reader.u8("an item record version")? {
        ITEM_RECORD_VERSION => reader.u64("an item version"),
        ITEM_RECORD_VERSION_1 => Ok(0),
        _ => Err(Corrupt("item record version 1 or 2")),
    }
}

/// Decodes an item record into one value per schema field (`values` is cleared
/// first) and returns the item's version and payload. Values borrow from
/// `bytes`: nothing is copied.
pub fn decode_item<'a>(
    bytes: &'a [u8],
    schema: &Schema,
    values: &mut Vec<Value<'a>>,
) -> Result<(u64, &'a [u8]), Corrupt> {
    values.clear();
    let (item_version, payload) =
        walk_item(bytes, schema, |field| values.push(field.map_or(Value::Null, |(value, _)| value)))?;
    Ok((item_version, &bytes[payload.start as usize + 4..payload.end as usize]))
}

/// Reads an item record front to back, checking its structure, and hands each
/// field in schema order to `field` (`None`: null), with its value and the span
/// of its encoded bytes. Returns the item's version and the payload's span
/// (length prefix included).
fn walk_item<'a>(
    bytes: &'a [u8],
    schema: &Schema,
    mut field: impl FnMut(Option<(Value<'a>, Span)>),
) -> Result<(u64, Span), Corrupt> {
    let mut reader = Reader { bytes };
    let item_version = match reader.u8("an item record version")? {
        ITEM_RECORD_VERSION => reader.u64("an item version")?,
        ITEM_RECORD_VERSION_1 => 0,
        _ => return Err(Corrupt("item record version 1 or 2")),
    };
    let n_fields = reader.u8("an item's field count")? as usize;
    if n_fields != schema.len() {
        return Err(Corrupt("an item with as many fields as its schema"));
    }
    let bitmap = reader.take(n_fields.div_ceil(8), "an item's presence bitmap")?;
    let offset = |reader: &Reader<'_>| (bytes.len() - reader.bytes.len()) as u32;
    for (index, field_def) in schema.fields().iter().enumerate() {
        if bitmap[index / 8] >> (index % 8) & 1 == 0 {
            field(None);
            continue;
        }
        let start = offset(&reader);
        let value = match field_def.field_type {
            FieldType::Bool => match reader.u8("a bool")? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                _ => return Err(Corrupt("a bool stored as 0 or 1")),
            },
            FieldType::I64 => Value::I64(reader.u64("an i64")? as i64),
            FieldType::U64 => Value::U64(reader.u64("a u64")?),
            FieldType::F64 => Value::F64(f64::from_bits(reader.u64("an f64")?)),
            FieldType::String | FieldType::Ref(_) => {
                let len = reader.u32("a string length")? as usize;
                Value::Str(reader.str(len, "a string in UTF-8")?)
            }
        };
        field(Some((value, Span { start, end: offset(&reader) })));
    }
    let payload_start = offset(&reader);
    let payload_len = reader.u32("a payload length")? as usize;
    reader.take(payload_len, "a payload")?;
    reader.finish("the end of the item record")?;
    Ok((item_version, Span { start: payload_start, end: offset(&reader) }))
}

/// `meta` keys. Values: `format` a `u32`, `last_seq` a `u64`.
pub const META_FORMAT: &[u8] = b"format";
pub const META_LAST_SEQ: &[u8] = b"last_seq";

pub fn decode_u32(bytes: &[u8], what: &'static str) -> Result<u32, Corrupt> {
    let mut reader = Reader { bytes };
    let value = reader.u32(what)?;
    reader.finish(what)?;
    Ok(value)
}

pub fn decode_u64(bytes: &[u8], what: &'static str) -> Result<u64, Corrupt> {
    let mut reader = Reader { bytes };
    let value = reader.u64(what)?;
    reader.finish(what)?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Schema {
        Schema::new()
            .with_field("flag", FieldType::Bool)
            .with_field("signed", FieldType::I64)
            .with_field("unsigned", FieldType::U64)
            .with_field("float", FieldType::F64)
            .with_field("name", FieldType::String)
    }

    #[test]
    fn items_round_trip_and_truncations_are_refused() {
        let schema = schema();
        let fields = [
            FieldSource::New(Value::Bool(true)),
            FieldSource::New(Value::I64(-5)),
            FieldSource::Null,
            FieldSource::New(Value::F64(f64::NEG_INFINITY)),
            FieldSource::New(Value::Str("Zoë")),
        ];
        let mut buffer = Vec::new();
        encode_item(&mut buffer, &[], 41, &fields, PayloadSource::New(b"payload"));
        let mut values = Vec::new();
        let (item_version, payload) = decode_item(&buffer, &schema, &mut values).unwrap();
        assert_eq!((item_version, payload), (41, &b"payload"[..]));
        assert_eq!(
            values,
            [Value::Bool(true), Value::I64(-5), Value::Null, Value::F64(f64::NEG_INFINITY), Value::Str("Zoë")]
        );
        for len in 0..buffer.len() {
            assert!(decode_item(&buffer[..len], &schema, &mut values).is_err(), "truncated to {len} bytes");
        }
        let mut spans = Vec::new();
        for len in 0..buffer.len() {
            assert!(scan_item(&buffer[..len], &schema, &mut spans).is_err(), "truncated to {len} bytes");
        }

        // Re-encoding from the old record's spans, overriding one field and keeping the payload.
        let payload_span = scan_item(&buffer, &schema, &mut spans).unwrap();
        let mut sources: Vec<FieldSource<'_>> =
            spans.iter().map(|span| span.map_or(FieldSource::Null, FieldSource::Old)).collect();
        sources[2] = FieldSource::New(Value::U64(7));
        sources[4] = FieldSource::New(Value::Null);
        let mut merged = Vec::new();
        encode_item(&mut merged, &buffer, 44, &sources, PayloadSource::Old(payload_span));
        let (item_version, payload) = decode_item(&merged, &schema, &mut values).unwrap();
        assert_eq!((item_version, payload), (44, &b"payload"[..]));
        assert_eq!(
            values,
            [Value::Bool(true), Value::I64(-5), Value::U64(7), Value::F64(f64::NEG_INFINITY), Value::Null]
        );

        let mut values = Vec::new();
        buffer.push(0);
        assert!(decode_item(&buffer, &schema, &mut values).is_err(), "a trailing byte");
    }

    /// Format 1 item records (no item version) still decode, as version 0.
    #[test]
    fn format_1_item_records_decode_with_version_0() {
        let schema = Schema::new().with_field("unread", FieldType::U64).with_field("name", FieldType::String);
        // `1, n_fields, bitmap, u64 7, (name null), payload length 2, "hi"`, as format 1 wrote it.
        let mut record = vec![1, 2, 0b01];
        record.extend_from_slice(&7u64.to_le_bytes());
        record.extend_from_slice(&2u32.to_le_bytes());
        record.extend_from_slice(b"hi");
        let mut values = Vec::new();
        let (item_version, payload) = decode_item(&record, &schema, &mut values).unwrap();
        assert_eq!((item_version, payload), (0, &b"hi"[..]));
        assert_eq!(values, [Value::U64(7), Value::Null]);
        // Rewritten (an update keeping every field), it becomes a format 2 record.
        let mut spans = Vec::new();
        let payload_span = scan_item(&record, &schema, &mut spans).unwrap();
        let sources: Vec<FieldSource<'_>> =
            spans.iter().map(|span| span.map_or(FieldSource::Null, FieldSource::Old)).collect();
        let mut rewritten = Vec::new();
        encode_item(&mut rewritten, &record, 9, &sources, PayloadSource::Old(payload_span));
        assert_eq!(rewritten[0], ITEM_RECORD_VERSION);
        let (item_version, payload) = decode_item(&rewritten, &schema, &mut values).unwrap();
        assert_eq!((item_version, payload), (9, &b"hi"[..]));
        assert_eq!(values, [Value::U64(7), Value::Null]);
        let mut unknown = record.clone();
        unknown[0] = 3;
        assert!(decode_item(&unknown, &schema, &mut Vec::new()).is_err(), "an unknown record version");
    }

    #[test]
    fn collections_round_trip() {
        let mut buffer = Vec::new();
        encode_collection(&mut buffer, "rooms", &schema());
        assert_eq!(decode_collection(&buffer).unwrap(), ("rooms".to_owned(), schema()));
        assert!(decode_collection(&buffer[..buffer.len() - 1]).is_err());
    }

    #[test]
    fn item_keys_sort_by_collection_first() {
        let (mut first, mut second) = (Vec::new(), Vec::new());
        item_key(&mut first, 1, "zzz");
        item_key(&mut second, 256, "aaa");
        assert!(first < second);
        assert_eq!(split_item_key(&second).unwrap(), (256, "aaa"));
    }
}
