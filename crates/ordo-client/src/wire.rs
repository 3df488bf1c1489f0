//! The JSON shapes of the protocol (`docs/PROTOCOL.md`) as plain serde types.
//!
//! Everything the server sends is read leniently: unknown keys are ignored, so a
//! newer server's additions (`write_seq`, `version`, ...) never break this client.

use eyeball_im::VectorDiff;
use imbl::Vector;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// An item as the server sends it: `{"id":..,"version":N,"fields":{..},"payload":..}`
/// (servers older than the window digest send no `version` in diff frames). `F` and
/// `P` default to raw JSON; use your own structs for typed fields and payloads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Item<F = Map<String, Value>, P = Value> {
    pub id: String,
    pub fields: F,
    /// Absent when the view's projection leaves the payload out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<P>,
    /// The `seq` of the last batch that changed the item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
}

/// A mirror of `eyeball_im::VectorDiff`'s serde form. eyeball-im 0.9 implements only
/// `Serialize` for `VectorDiff`, so frames decode into this and convert.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub enum WireDiff<T> {
    Append { values: Vec<T> },
    Clear {},
    PushFront { value: T },
    PushBack { value: T },
    PopFront {},
    PopBack {},
    Insert { index: usize, value: T },
    Set { index: usize, value: T },
    Remove { index: usize },
    Truncate { length: usize },
    Reset { values: Vec<T> },
}

impl<T: Clone> WireDiff<T> {
    /// The list length after this diff, or why it does not apply to a list of `len` items.
    /// `VectorDiff::apply` panics on what this refuses, so every diff is checked first.
    pub fn check(&self, len: usize) -> Result<usize, String> {
        let out_of_range = |kind: &str, index: usize, bound: usize| {
            format!("{kind}: index {index} is out of range for a list of {len} items (at most {bound})")
        };
        Ok(match self {
            WireDiff::Append { values } => len + values.len(),
            WireDiff::Clear {} => 0,
            WireDiff::PushFront { .. } | WireDiff::PushBack { .. } => len + 1,
            WireDiff::PopFront {} | WireDiff::PopBack {} if len == 0 => {
                return Err("a pop from an empty list".to_owned());
            }
            WireDiff::PopFront {} | WireDiff::PopBack {} => len - 1,
            WireDiff::Insert { index, .. } if *index > len => return Err(out_of_range("Insert", *index, len)),
            WireDiff::Insert { .. } => len + 1,
            WireDiff::Set { index, .. } | WireDiff::Remove { index } if *index >= len => {
                let kind = if matches!(self, WireDiff::Set { .. }) { "Set" } else { "Remove" };
                return Err(out_of_range(kind, *index, len.saturating_sub(1)));
            }
            WireDiff::Set { .. } => len,
            WireDiff::Remove { .. } => len - 1,
            WireDiff::Truncate { length } if *length > len => {
                return Err(format!("Truncate: length {length} is past the end of a list of {len} items"));
            }
            WireDiff::Truncate { length } => *length,
            WireDiff::Reset { values } => values.len(),
        })
    }

    pub fn is_reset(&self) -> bool {
        matches!(self, WireDiff::Reset { .. })
    }
}

impl<T: Clone> From<WireDiff<T>> for VectorDiff<T> {
    fn from(diff: WireDiff<T>) -> Self {
        match diff {
            WireDiff::Append { values } => VectorDiff::Append { values: Vector::from(values) },
            WireDiff::Clear {} => VectorDiff::Clear,
            WireDiff::PushFront { value } => VectorDiff::PushFront { value },
            WireDiff::PushBack { value } => VectorDiff::PushBack { value },
            WireDiff::PopFront {} => VectorDiff::PopFront,
            WireDiff::PopBack {} => VectorDiff::PopBack,
            WireDiff::Insert { index, value } => VectorDiff::Insert { index, value },
            WireDiff::Set { index, value } => VectorDiff::Set { index, value },
            WireDiff::Remove { index } => VectorDiff::Remove { index },
            WireDiff::Truncate { length } => VectorDiff::Truncate { length },
            WireDiff::Reset { values } => VectorDiff::Reset { values: Vector::from(values) },
        }
    }
}

/// Decodes a frame's `diffs` and checks that they apply, in order, to a list of `len`
/// items. Nothing is applied: a frame either applies whole or is refused.
pub fn decode_diffs<T: Clone + serde::de::DeserializeOwned>(
    diffs: &Value,
    len: usize,
) -> Result<Vec<WireDiff<T>>, String> {
    let diffs = Vec::<WireDiff<T>>::deserialize(diffs).map_err(|error| format!("diffs that do not decode: {error}"))?;
    let mut length = len;
    for diff in &diffs {
        length = diff.check(length)?;
    }
    Ok(diffs)
}

/// A field of a collection's schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Field {
    pub name: String,
    /// `bool`, `i64`, `u64`, `f64` or `string`.
    #[serde(rename = "type")]
    pub kind: String,
}

impl Field {
    pub fn new(name: impl Into<String>, kind: impl Into<String>) -> Field {
        Field { name: name.into(), kind: kind.into() }
    }
}

/// A collection as `PUT`/`GET /v1/collections/{name}` answer it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Collection {
    pub name: String,
    pub fields: Vec<Field>,
    /// Only when the caller may read every row.
    #[serde(default)]
    pub items: Option<u64>,
}

/// A precondition on an op (`"if"`): the batch is refused whole (409 `conflict`) when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precondition {
    /// `{"exists":true}` / `{"exists":false}`.
    Exists(bool),
    /// `{"version":N}`: the item's version (the `seq` of the last batch that changed it).
    Version(u64),
}

/// One op of a batch. Empty maps and `None`s are left out of the JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Op {
    Upsert(Upsert),
    Remove {
        id: String,
        #[serde(rename = "if", skip_serializing_if = "Option::is_none")]
        condition: Option<Precondition>,
    },
}

impl Op {
    /// An upsert of `id` with these fields (a JSON object; anything else sends no fields).
    pub fn upsert(id: impl Into<String>, fields: Value) -> Upsert {
        let fields = match fields {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        Upsert { id: id.into(), fields, ..Upsert::default() }
    }

    pub fn remove(id: impl Into<String>) -> Op {
        Op::Remove { id: id.into(), condition: None }
    }
}

/// `{"op":"upsert",...}`: `fields` to set, `payload` (`Some(Value::Null)` clears it,
/// `None` keeps it), and the atomic `increment` / `set_max` / `set_min` and the `if`
/// precondition.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Upsert {
    pub id: String,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub fields: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub increment: Map<String, Value>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub set_max: Map<String, Value>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub set_min: Map<String, Value>,
    #[serde(rename = "if", skip_serializing_if = "Option::is_none")]
    pub condition: Option<Precondition>,
}

impl Upsert {
    pub fn payload(mut self, payload: Value) -> Upsert {
        self.payload = Some(payload);
        self
    }
    pub fn increment(mut self, field: impl Into<String>, by: impl Into<Value>) -> Upsert {
        self.increment.insert(field.into(), by.into());
        self
    }
    pub fn set_max(mut self, field: impl Into<String>, value: impl Into<Value>) -> Upsert {
        self.set_max.insert(field.into(), value.into());
        self
    }
    pub fn set_min(mut self, field: impl Into<String>, value: impl Into<Value>) -> Upsert {
        self.set_min.insert(field.into(), value.into());
        self
    }
    pub fn when(mut self, condition: Precondition) -> Upsert {
        self.condition = Some(condition);
        self
    }
}

impl From<Upsert> for Op {
    fn from(upsert: Upsert) -> Op {
        Op::Upsert(upsert)
    }
}

/// The answer to a batch: `{"seq":43,"upserted":1,"removed":1}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct WriteResult {
    pub seq: u64,
    #[serde(default)]
    pub upserted: u64,
    #[serde(default)]
    pub removed: u64,
}

/// A field to add (`POST /v1/collections/{name}/fields`): without `default` (or with
/// `null`) the field is null in existing items.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewField {
    pub name: String,
    /// `bool`, `i64`, `u64`, `f64` or `string`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

impl NewField {
    pub fn new(name: impl Into<String>, kind: impl Into<String>) -> NewField {
        NewField { name: name.into(), kind: kind.into(), default: None }
    }

    /// The value every existing item gets.
    pub fn with_default(mut self, default: impl Into<Value>) -> NewField {
        self.default = Some(default.into());
        self
    }
}

/// A collection after a schema change (add or remove a field), with the change's `seq`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SchemaChange {
    #[serde(flatten)]
    pub collection: Collection,
    pub seq: u64,
}

/// The answer to `DELETE /v1/collections/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Dropped {
    pub seq: u64,
    /// The collection's name.
    pub dropped: String,
}

/// The answer to `DELETE .../items/{id}`: `removed` is false when there was no such item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct DeleteResult {
    pub seq: u64,
    pub removed: bool,
}

/// A view and window: the body of a query, and (with `collection`) of a subscription.
/// `extra` carries keys this crate does not name (`min_seq`, `around`, `after`, `tail`, ...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct View {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// A projection: only these fields in every item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
    /// `Some(false)` leaves the payload out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl View {
    pub fn new() -> View {
        View::default()
    }
    pub fn filter(mut self, filter: Value) -> View {
        self.filter = Some(filter);
        self
    }
    pub fn sort(mut self, sort: Value) -> View {
        self.sort = Some(sort);
        self
    }
    pub fn range(mut self, offset: u64, limit: u64) -> View {
        self.offset = Some(offset);
        self.limit = Some(limit);
        self
    }
}

/// The answer to a query. `write_seq` (the last batch the answer reflects) when the server sends it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QueryResult<T> {
    pub total: u64,
    #[serde(default)]
    pub offset: u64,
    pub items: Vec<T>,
    #[serde(default)]
    pub write_seq: Option<u64>,
}

/// Why the server ended a subscription (`{"type":"ended",...}`): `collection_dropped`, `field_removed`, `access_ended`, ...
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub reason: String,
    pub message: String,
}
