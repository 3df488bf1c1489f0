//! Decoding what clients send (JSON) into the engine's types, checked against the
//! collection's schema and the server's limits. Everything here runs on network
//! threads, so the writer thread only ever sees typed, pre-checked requests.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value as Json;

use ordo_core::{
    Batch, CompareOp, FieldId, FieldType, Filter, OwnedValue, Schema, SortKey, UpsertBuilder, Value, ViewDef,
};

use crate::error::{ApiError, ErrorCode};
use crate::limits;

/// `PUT /v1/collections/{name}`
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaRequest {
    pub fields: Vec<FieldRequest>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldRequest {
    pub name: String,
    #[serde(rename = "type")]
    pub field_type: String,
}

impl SchemaRequest {
    pub fn to_schema(&self) -> Result<Schema, ApiError> {
        let mut schema = Schema::new();
        for field in &self.fields {
            let field_type = parse_field_type(&field.field_type).ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidSchema,
                    format!(
                        "field `{}` has type `{}`; the types are bool, i64, u64, f64 and string",
                        field.name, field.field_type
                    ),
                )
            })?;
            schema = schema.try_with_field(&field.name, field_type)?;
        }
        Ok(schema)
    }
}

pub fn parse_field_type(name: &str) -> Option<FieldType> {
    Some(match name {
        "bool" => FieldType::Bool,
        "i64" => FieldType::I64,
        "u64" => FieldType::U64,
        "f64" => FieldType::F64,
        "string" => FieldType::String,
        _ => return None,
    })
}

pub fn schema_json(name: &str, schema: &Schema, n_items: Option<usize>) -> Json {
    let fields: Vec<Json> = schema
        .fields()
        .iter()
        .map(|field| serde_json::json!({"name": field.name, "type": field.field_type.name()}))
        .collect();
    let mut object = serde_json::json!({"name": name, "fields": fields});
    if let Some(n_items) = n_items {
        object["items"] = n_items.into();
    }
    object
}

/// `POST /v1/collections/{name}/batch`. Strings borrow from the request body:
/// decoding a write allocates nothing per op (see `fill_batch`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest<'a> {
    #[serde(borrow)]
    pub ops: Vec<OpRequest<'a>>,
}

/// `POST /v1/batch`
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MultiBatchRequest<'a> {
    #[serde(borrow)]
    pub writes: Vec<CollectionWrite<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectionWrite<'a> {
    #[serde(borrow)]
    pub collection: Cow<'a, str>,
    #[serde(borrow)]
    pub ops: Vec<OpRequest<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpRequest<'a> {
    #[serde(borrow)]
    pub op: Cow<'a, str>,
    #[serde(borrow)]
    pub id: Cow<'a, str>,
    /// The object of field values, decoded straight into the batch by `fill_batch`.
    #[serde(default, borrow)]
    pub fields: Option<&'a RawValue>,
    /// `Some` whenever the key is present, even as `null` (which clears the payload).
    #[serde(default, borrow, deserialize_with = "present")]
    pub payload: Option<&'a RawValue>,
}

fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(deserializer).map(Some)
}

/// Appends the ops to `batch`, typing each field value by the schema.
pub fn fill_batch(
    batch: &mut Batch,
    schema: &Schema,
    ops: &[OpRequest<'_>],
    first_op_index: usize,
) -> Result<(), ApiError> {
    for (index, op) in ops.iter().enumerate() {
        let op_index = first_op_index + index;
        match &*op.op {
            "upsert" => {
                let mut builder = batch.upsert(&op.id);
                if let Some(fields) = op.fields {
                    builder = set_fields(builder, fields, schema, op_index)?;
                }
                if let Some(payload) = &op.payload {
                    let text = payload.get();
                    if nesting_exceeds(text.as_bytes(), limits::MAX_PAYLOAD_DEPTH) {
                        return Err(ApiError::new(
                            ErrorCode::InvalidBatch,
                            format!(
                                "op {op_index}: the payload nests arrays and objects more than {} deep \
                                 (max_payload_depth)",
                                limits::MAX_PAYLOAD_DEPTH
                            ),
                        ));
                    }
                    builder.payload(if text == "null" { b"" } else { text.as_bytes() });
                }
            }
            "remove" => {
                if op.fields.is_some() || op.payload.is_some() {
                    return Err(ApiError::bad_request(format!("op {op_index}: a remove takes only an `id`")));
                }
                batch.remove(&op.id);
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "op {op_index}: unknown op `{other}`; the ops are `upsert` and `remove`"
                )))
            }
        }
    }
    Ok(())
}

/// Whether `json` (valid JSON text, as a `RawValue` holds) nests arrays and
/// objects more than `max_depth` deep. One pass over the bytes, no recursion
/// (the text may nest 100 000 deep): brackets inside strings are skipped, and
/// so is every escaped character. A scalar payload costs one comparison.
pub fn nesting_exceeds(json: &[u8], max_depth: usize) -> bool {
    if !matches!(json.first(), Some(b'[' | b'{')) {
        return false;
    }
    let mut depth = 0usize;
    let mut index = 0;
    while index < json.len() {
        match json[index] {
            b'"' => {
                index += 1;
                while index < json.len() {
                    match json[index] {
                        b'\\' => index += 2,
                        b'"' => break,
                        _ => index += 1,
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > max_depth {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        index += 1;
    }
    false
}

/// Decodes an op's `fields` object into the upsert, field by field, without an
/// intermediate map: names and strings borrow from the request body.
fn set_fields<'b>(
    builder: UpsertBuilder<'b>,
    fields: &RawValue,
    schema: &Schema,
    op_index: usize,
) -> Result<UpsertBuilder<'b>, ApiError> {
    let mut refused = None;
    let visitor = FieldsVisitor { builder, schema, op_index, refused: &mut refused };
    let mut deserializer = serde_json::Deserializer::from_str(fields.get());
    let result = serde::Deserializer::deserialize_map(&mut deserializer, visitor);
    match (result, refused) {
        (_, Some(error)) => Err(error),
        (Ok(builder), None) => Ok(builder),
        (Err(error), None) => {
            // Positions would count from the start of `fields`, not of the body: say which op instead.
            let text = error.to_string();
            let what = text.rfind(" at line ").map_or(text.as_str(), |end| &text[..end]);
            let message = format!("op {op_index}: `fields`: {what}");
            Err(match error.classify() {
                serde_json::error::Category::Data => ApiError::bad_request(message),
                _ => ApiError::new(ErrorCode::BadJson, format!("not valid JSON: {message}")),
            })
        }
    }
}

struct FieldsVisitor<'b, 'r> {
    builder: UpsertBuilder<'b>,
    schema: &'r Schema,
    op_index: usize,
    /// A field the schema refuses; the visitor then stops with a placeholder error.
    refused: &'r mut Option<ApiError>,
}

impl<'de, 'b> serde::de::Visitor<'de> for FieldsVisitor<'b, '_> {
    type Value = UpsertBuilder<'b>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a map")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<UpsertBuilder<'b>, A::Error> {
        let FieldsVisitor { mut builder, schema, op_index, refused } = self;
        while let Some(BorrowedStr(name)) = map.next_key::<BorrowedStr<'de>>()? {
            let literal: Literal<'de> = map.next_value()?;
            let Some(field_id) = schema.field_id(&name) else {
                *refused = Some(ApiError::new(
                    ErrorCode::InvalidBatch,
                    format!("op {op_index}: the schema has no field `{name}`"),
                ));
                return Err(serde::de::Error::custom("refused"));
            };
            let field_type = schema.field(field_id).field_type;
            match literal.typed(field_type) {
                Some(value) => builder = builder.set(&name, value),
                None => {
                    *refused = Some(ApiError::new(
                        ErrorCode::InvalidBatch,
                        format!("op {op_index}: field `{name}` is {field_type}; {} does not fit", literal.describe()),
                    ));
                    return Err(serde::de::Error::custom("refused"));
                }
            }
        }
        Ok(builder)
    }
}

/// A string that borrows from the input unless it had escapes to undo.
struct BorrowedStr<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for BorrowedStr<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor;
        impl<'de> serde::de::Visitor<'de> for StrVisitor {
            type Value = BorrowedStr<'de>;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Owned(text.to_owned())))
            }
        }
        deserializer.deserialize_str(StrVisitor)
    }
}

/// A field value as written, before the schema types it. Arrays and objects
/// are skipped: no field holds one.
enum Literal<'de> {
    Null,
    Bool(bool),
    /// A non-negative integer.
    U64(u64),
    /// A negative integer.
    I64(i64),
    F64(f64),
    Str(Cow<'de, str>),
    Array,
    Object,
}

impl<'de> Deserialize<'de> for Literal<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LiteralVisitor;
        impl<'de> serde::de::Visitor<'de> for LiteralVisitor {
            type Value = Literal<'de>;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Literal::Null)
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(Literal::Null)
            }
            fn visit_bool<E>(self, value: bool) -> Result<Self::Value, E> {
                Ok(Literal::Bool(value))
            }
            fn visit_u64<E>(self, value: u64) -> Result<Self::Value, E> {
                Ok(Literal::U64(value))
            }
            fn visit_i64<E>(self, value: i64) -> Result<Self::Value, E> {
                Ok(if value >= 0 { Literal::U64(value as u64) } else { Literal::I64(value) })
            }
            fn visit_f64<E>(self, value: f64) -> Result<Self::Value, E> {
                Ok(Literal::F64(value))
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(Literal::Str(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
                Ok(Literal::Str(Cow::Owned(text.to_owned())))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Literal::Array)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(Literal::Object)
            }
        }
        deserializer.deserialize_any(LiteralVisitor)
    }
}

impl<'a> Literal<'a> {
    /// A value already parsed (filters): the same typing rules as a write's fields.
    fn from_json(json: &'a Json) -> Literal<'a> {
        match json {
            Json::Null => Literal::Null,
            Json::Bool(value) => Literal::Bool(*value),
            Json::Number(number) => match (number.as_u64(), number.as_i64()) {
                (Some(value), _) => Literal::U64(value),
                (None, Some(value)) => Literal::I64(value),
                _ => Literal::F64(number.as_f64().unwrap_or(f64::NAN)),
            },
            Json::String(value) => Literal::Str(Cow::Borrowed(value)),
            Json::Array(_) => Literal::Array,
            Json::Object(_) => Literal::Object,
        }
    }

    /// The value as a field of `field_type`, converting numbers when that is lossless.
    fn typed(&self, field_type: FieldType) -> Option<Value<'_>> {
        Some(match (self, field_type) {
            (Literal::Null, _) => Value::Null,
            (Literal::Bool(value), FieldType::Bool) => Value::Bool(*value),
            (Literal::Str(value), FieldType::String) => Value::Str(value),
            (Literal::U64(value), FieldType::I64) => Value::I64(i64::try_from(*value).ok()?),
            (Literal::I64(value), FieldType::I64) => Value::I64(*value),
            (Literal::U64(value), FieldType::U64) => Value::U64(*value),
            (Literal::U64(value), FieldType::F64) => Value::F64(*value as f64),
            (Literal::I64(value), FieldType::F64) => Value::F64(*value as f64),
            (Literal::F64(value), FieldType::F64) => Value::F64(*value),
            _ => return None,
        })
    }

    /// What was found, for an error message.
    fn describe(&self) -> String {
        match self {
            Literal::Null => "null".to_owned(),
            Literal::Bool(value) => format!("the bool {value}"),
            Literal::U64(value) => format!("the number {value}"),
            Literal::I64(value) => format!("the number {value}"),
            Literal::F64(value) => match serde_json::Number::from_f64(*value) {
                Some(number) => format!("the number {number}"),
                None => format!("the number {value}"),
            },
            Literal::Str(_) => "a string".to_owned(),
            Literal::Array => "an array".to_owned(),
            Literal::Object => "an object".to_owned(),
        }
    }
}

fn typed_owned_value(json: &Json, field_type: Option<FieldType>) -> Result<OwnedValue, String> {
    let literal = Literal::from_json(json);
    match field_type {
        Some(field_type) => {
            literal.typed(field_type).map(|value| value.to_owned_value()).ok_or_else(|| literal.describe())
        }
        // An unknown field: keep the literal's own type; the engine names the field in its error.
        None => Ok(match literal {
            Literal::Null => OwnedValue::Null,
            Literal::Bool(value) => OwnedValue::Bool(value),
            Literal::U64(value) => i64::try_from(value).map_or(OwnedValue::U64(value), OwnedValue::I64),
            Literal::I64(value) => OwnedValue::I64(value),
            Literal::F64(value) => OwnedValue::F64(value),
            Literal::Str(value) => OwnedValue::Str(value.into_owned()),
            Literal::Array | Literal::Object => return Err(literal.describe()),
        }),
    }
}

fn describe(json: &Json) -> String {
    Literal::from_json(json).describe()
}

/// `"sort": null` means no sort, as `"filter": null` means no filter.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The `sub` of a client message that is refused before it is parsed (rate
/// limited), so the error can name the subscription it concerns.
#[derive(Deserialize)]
pub struct SubOnly {
    pub sub: Option<String>,
}

/// `POST /v1/collections/{name}/query`: the collection is in the path.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    #[serde(default)]
    pub filter: Json,
    #[serde(default, deserialize_with = "null_as_default")]
    pub sort: Vec<SortRequest>,
    #[serde(default)]
    pub offset: usize,
    pub limit: usize,
    #[serde(default)]
    pub fields: Option<Vec<String>>,
    #[serde(default = "yes")]
    pub payload: bool,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SortRequest {
    pub field: String,
    #[serde(default)]
    pub dir: SortDirection,
    #[serde(default)]
    pub case_insensitive: bool,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SortDirection {
    #[default]
    Asc,
    Desc,
}

/// Which parts of each item a window sends.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Projection {
    /// Fields in the order the client listed them (all fields, in schema order, by default).
    pub fields: Vec<FieldId>,
    pub payload: bool,
}

impl Projection {
    pub fn all(schema: &Schema) -> Projection {
        Projection { fields: (0..schema.len()).map(|index| field_id_at(schema, index)).collect(), payload: true }
    }
}

fn field_id_at(schema: &Schema, index: usize) -> FieldId {
    schema.field_id(&schema.fields()[index].name).expect("a schema's own field")
}

/// A checked window request: everything the writer thread needs.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowSpec {
    pub def: ViewDef,
    pub offset: usize,
    pub limit: usize,
    pub projection: Projection,
}

pub fn check_range(offset: usize, limit: usize) -> Result<(), ApiError> {
    if limit > limits::MAX_WINDOW_LIMIT {
        return Err(ApiError::limit(format!(
            "the window limit is {limit}; at most {} is allowed",
            limits::MAX_WINDOW_LIMIT
        )));
    }
    if offset > limits::MAX_WINDOW_OFFSET {
        return Err(ApiError::limit(format!(
            "the window offset is {offset}; at most {} is allowed",
            limits::MAX_WINDOW_OFFSET
        )));
    }
    Ok(())
}

pub fn window_spec(
    schema: &Schema,
    filter: &Json,
    sort: &[SortRequest],
    offset: usize,
    limit: usize,
    fields: Option<&[String]>,
    payload: bool,
) -> Result<WindowSpec, ApiError> {
    check_range(offset, limit)?;
    let def = view_def(schema, filter, sort)?;
    let projection = match fields {
        None => Projection { payload, ..Projection::all(schema) },
        Some(names) => {
            if names.len() > ordo_core::limits::MAX_FIELDS_PER_SCHEMA {
                return Err(ApiError::limit("the projection lists more fields than a schema can have"));
            }
            let mut ids = Vec::with_capacity(names.len());
            for name in names {
                let field_id = schema.field_id(name).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::InvalidView,
                        format!("the projection names `{name}`, which the schema does not have"),
                    )
                })?;
                if ids.contains(&field_id) {
                    return Err(ApiError::new(ErrorCode::InvalidView, format!("the projection names `{name}` twice")));
                }
                ids.push(field_id);
            }
            Projection { fields: ids, payload }
        }
    };
    Ok(WindowSpec { def, offset, limit, projection })
}

pub fn view_def(schema: &Schema, filter: &Json, sort: &[SortRequest]) -> Result<ViewDef, ApiError> {
    let mut n_nodes = 0;
    let filter = filter_from_json(schema, filter, 1, &mut n_nodes)?;
    if sort.len() > ordo_core::limits::MAX_SORT_KEYS {
        return Err(ApiError::limit(format!(
            "the sort has {} keys; at most {} are allowed",
            sort.len(),
            ordo_core::limits::MAX_SORT_KEYS
        )));
    }
    let sort = sort
        .iter()
        .map(|key| {
            match key.dir {
                SortDirection::Asc => SortKey::asc(&key.field),
                SortDirection::Desc => SortKey::desc(&key.field),
            }
            .with_case(key.case_insensitive)
        })
        .collect();
    let def = ViewDef::new(filter, sort);
    // Compiling here reports every view error on the network thread, with the
    // engine's own checks; the writer thread then cannot refuse the view.
    ordo_core::CompiledFilter::compile(&def.filter, schema)?;
    ordo_core::CompiledSort::compile(&def.sort, schema)?;
    Ok(def)
}

/// A rule's filter (claims already bound) as an engine filter over `schema`,
/// under the same limits and checks as a client's.
pub fn filter_from_rule(schema: &Schema, filter: &Json) -> Result<Filter, ApiError> {
    let mut n_nodes = 0;
    let filter = filter_from_json(schema, filter, 1, &mut n_nodes)?;
    ordo_core::CompiledFilter::compile(&filter, schema)?;
    Ok(filter)
}

/// Conjoins an access rule's predicate into a checked view: the client's filter
/// can then only narrow what the rule lets through. The combined filter is
/// compiled again (it is one level deeper than either part).
pub fn restrict(def: &mut ViewDef, predicate: Option<&Filter>, schema: &Schema) -> Result<(), ApiError> {
    let Some(predicate) = predicate else { return Ok(()) };
    let client = std::mem::replace(&mut def.filter, Filter::True);
    def.filter = match client {
        Filter::True => predicate.clone(),
        client => Filter::All(vec![predicate.clone(), client]),
    };
    ordo_core::CompiledFilter::compile(&def.filter, schema).map_err(|_| {
        ApiError::limit("the filter is too deep or too large once this collection's access rule is added to it")
    })?;
    Ok(())
}

trait WithCase {
    fn with_case(self, case_insensitive: bool) -> Self;
}

impl WithCase for SortKey {
    fn with_case(self, case_insensitive: bool) -> SortKey {
        if case_insensitive {
            self.case_insensitive()
        } else {
            self
        }
    }
}

fn filter_from_json(schema: &Schema, json: &Json, depth: usize, n_nodes: &mut usize) -> Result<Filter, ApiError> {
    let invalid = |message: String| ApiError::new(ErrorCode::InvalidView, message);
    if depth > ordo_core::limits::MAX_FILTER_DEPTH {
        return Err(ApiError::limit(format!(
            "the filter is nested more than {} deep",
            ordo_core::limits::MAX_FILTER_DEPTH
        )));
    }
    *n_nodes += 1;
    if *n_nodes > ordo_core::limits::MAX_FILTER_NODES {
        return Err(ApiError::limit(format!("the filter has more than {} nodes", ordo_core::limits::MAX_FILTER_NODES)));
    }
    let object = match json {
        Json::Null => return Ok(Filter::True),
        Json::Object(object) => object,
        other => return Err(invalid(format!("a filter is a JSON object, not {}", describe(other)))),
    };
    let only = |keys: &[&str]| -> Result<(), ApiError> {
        match object.keys().find(|key| !keys.contains(&key.as_str())) {
            Some(key) => Err(invalid(format!("unexpected key `{key}` in this filter (expected {})", keys.join(", ")))),
            None => Ok(()),
        }
    };
    let children = |list: &Json, n_nodes: &mut usize| -> Result<Vec<Filter>, ApiError> {
        let Json::Array(list) = list else {
            return Err(invalid("`all` and `any` take a list of filters".to_owned()));
        };
        list.iter().map(|child| filter_from_json(schema, child, depth + 1, n_nodes)).collect()
    };
    if let Some(list) = object.get("all") {
        only(&["all"])?;
        return Ok(Filter::All(children(list, n_nodes)?));
    }
    if let Some(list) = object.get("any") {
        only(&["any"])?;
        return Ok(Filter::Any(children(list, n_nodes)?));
    }
    if let Some(inner) = object.get("not") {
        only(&["not"])?;
        return Ok(Filter::Not(Box::new(filter_from_json(schema, inner, depth + 1, n_nodes)?)));
    }
    let field = match object.get("field") {
        Some(Json::String(field)) => field.clone(),
        Some(other) => return Err(invalid(format!("`field` is a string, not {}", describe(other)))),
        None => {
            return Err(invalid(
                "a filter is `{\"field\":..,\"op\":..,\"value\":..}`, `in`, `is_null`, `contains`, `prefix`, `all`, `any` or `not`"
                    .to_owned(),
            ))
        }
    };
    let field_type = schema.field_id(&field).map(|id| schema.field(id).field_type);
    let field_name = field.clone();
    let literal = |json: &Json| {
        typed_owned_value(json, field_type).map_err(|found| {
            invalid(format!(
                "field `{field_name}` is {}; {found} does not fit",
                field_type.map_or("unknown", |t| t.name())
            ))
        })
    };
    let short_string = |json: &Json, what: &str| -> Result<String, ApiError> {
        match json {
            Json::String(text) if text.len() <= limits::MAX_FILTER_STRING_BYTES => Ok(text.clone()),
            Json::String(text) => Err(ApiError::limit(format!(
                "the `{what}` string is {} bytes; at most {} are allowed",
                text.len(),
                limits::MAX_FILTER_STRING_BYTES
            ))),
            other => Err(invalid(format!("`{what}` takes a string, not {}", describe(other)))),
        }
    };
    if let Some(op) = object.get("op") {
        only(&["field", "op", "value"])?;
        let op = match op.as_str() {
            Some("eq") => CompareOp::Eq,
            Some("ne") => CompareOp::Ne,
            Some("lt") => CompareOp::Lt,
            Some("le") => CompareOp::Le,
            Some("gt") => CompareOp::Gt,
            Some("ge") => CompareOp::Ge,
            _ => return Err(invalid(format!("`op` is one of eq, ne, lt, le, gt, ge; got {op}"))),
        };
        let value = object.get("value").ok_or_else(|| invalid("a comparison needs a `value`".to_owned()))?;
        if let Json::String(text) = value {
            if text.len() > ordo_core::limits::MAX_STRING_FIELD_BYTES {
                return Err(ApiError::limit("a comparison's string is longer than a field can be"));
            }
        }
        return Ok(Filter::Compare { field, op, value: literal(value)? });
    }
    if let Some(values) = object.get("in") {
        only(&["field", "in"])?;
        let Json::Array(values) = values else {
            return Err(invalid("`in` takes a list of values".to_owned()));
        };
        if values.len() > ordo_core::limits::MAX_FILTER_IN_VALUES {
            return Err(ApiError::limit(format!(
                "`in` lists {} values; at most {} are allowed",
                values.len(),
                ordo_core::limits::MAX_FILTER_IN_VALUES
            )));
        }
        let values = values.iter().map(literal).collect::<Result<Vec<_>, _>>()?;
        return Ok(Filter::In { field, values });
    }
    if let Some(is_null) = object.get("is_null") {
        only(&["field", "is_null"])?;
        return match is_null {
            Json::Bool(true) => Ok(Filter::IsNull { field }),
            Json::Bool(false) => Ok(Filter::Not(Box::new(Filter::IsNull { field }))),
            other => Err(invalid(format!("`is_null` takes true or false, not {}", describe(other)))),
        };
    }
    if let Some(needle) = object.get("contains") {
        only(&["field", "contains"])?;
        return Ok(Filter::Contains { field, needle: short_string(needle, "contains")? });
    }
    if let Some(prefix) = object.get("prefix") {
        only(&["field", "prefix"])?;
        return Ok(Filter::Prefix { field, prefix: short_string(prefix, "prefix")? });
    }
    Err(invalid(format!("a filter on `{field}` needs one of `op`, `in`, `is_null`, `contains`, `prefix`")))
}

/// Client → server WebSocket messages. Every key is listed (no `flatten`) so that
/// an unknown key is refused rather than ignored.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientMessage {
    Subscribe {
        sub: String,
        collection: String,
        #[serde(default)]
        filter: Json,
        #[serde(default, deserialize_with = "null_as_default")]
        sort: Vec<SortRequest>,
        #[serde(default)]
        offset: usize,
        limit: usize,
        #[serde(default)]
        fields: Option<Vec<String>>,
        #[serde(default = "yes")]
        payload: bool,
    },
    SetRange {
        sub: String,
        #[serde(default)]
        offset: usize,
        limit: usize,
    },
    SetView {
        sub: String,
        #[serde(default)]
        filter: Json,
        #[serde(default, deserialize_with = "null_as_default")]
        sort: Vec<SortRequest>,
    },
    Unsubscribe {
        sub: String,
    },
    Resume {
        session: String,
        subs: Vec<ResumeEntry>,
    },
    /// A token for this connection: the first one, or a fresh one before the last expires.
    Auth {
        token: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeEntry {
    pub sub: String,
    pub last_seq: u64,
    pub collection: String,
    #[serde(default)]
    pub filter: Json,
    #[serde(default, deserialize_with = "null_as_default")]
    pub sort: Vec<SortRequest>,
    #[serde(default)]
    pub offset: usize,
    pub limit: usize,
    #[serde(default)]
    pub fields: Option<Vec<String>>,
    #[serde(default = "yes")]
    pub payload: bool,
}

pub fn check_sub_id(sub: &str) -> Result<(), ApiError> {
    if sub.is_empty() || sub.len() > limits::MAX_SUBSCRIPTION_ID_BYTES {
        return Err(ApiError::limit(format!(
            "a subscription id is 1..={} bytes; this one is {}",
            limits::MAX_SUBSCRIPTION_ID_BYTES,
            sub.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn nesting_depth_skips_strings_and_escapes() {
        for (json, depth) in [
            ("1", 0),
            ("\"[[[\"", 0),
            ("[]", 1),
            ("{\"a\":[1,{\"b\":[]}]}", 4),
            ("[\"]\\\"[[\",[[]]]", 3),
            ("[\"\\\\\",[]]", 2),
            ("[{},{},[[]]]", 3),
        ] {
            assert!(!nesting_exceeds(json.as_bytes(), depth), "{json} is {depth} deep");
            assert!(depth == 0 || nesting_exceeds(json.as_bytes(), depth - 1), "{json} is {depth} deep");
        }
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(nesting_exceeds(deep.as_bytes(), limits::MAX_PAYLOAD_DEPTH));
    }

    /// The decoding `fill_batch` replaced: the whole op parsed into a
    /// `serde_json::Value` first. Kept as the reference the streaming decoder must match.
    fn reference_fill(batch: &mut Batch, schema: &Schema, ops: &[RawOp]) -> Result<(), ErrorCode> {
        let parse = |raw: Option<&Box<RawValue>>| -> Json {
            raw.map_or(Json::Null, |raw| serde_json::from_str(raw.get()).unwrap())
        };
        for op in ops {
            let id = parse(op.get("id"));
            let id = id.as_str().ok_or(ErrorCode::BadRequest)?;
            match parse(op.get("op")).as_str() {
                Some("upsert") => {
                    let mut builder = batch.upsert(id);
                    match parse(op.get("fields")) {
                        Json::Null => {}
                        Json::Object(fields) => {
                            for (name, json) in &fields {
                                let field_id = schema.field_id(name).ok_or(ErrorCode::InvalidBatch)?;
                                let value = reference_typed_value(json, schema.field(field_id).field_type)
                                    .ok_or(ErrorCode::InvalidBatch)?;
                                builder = builder.set(name, value);
                            }
                        }
                        _ => return Err(ErrorCode::BadRequest),
                    }
                    if let Some(payload) = op.get("payload") {
                        let text = payload.get();
                        builder.payload(if text == "null" { b"" } else { text.as_bytes() });
                    }
                }
                Some("remove") => {
                    if !parse(op.get("fields")).is_null() || op.contains_key("payload") {
                        return Err(ErrorCode::BadRequest);
                    }
                    batch.remove(id);
                }
                _ => return Err(ErrorCode::BadRequest),
            }
        }
        Ok(())
    }

    type RawOp = std::collections::BTreeMap<String, Box<RawValue>>;

    /// The typing of field values before `Literal`, from a `serde_json::Value`.
    fn reference_typed_value(json: &Json, field_type: FieldType) -> Option<Value<'_>> {
        Some(match (json, field_type) {
            (Json::Null, _) => Value::Null,
            (Json::Bool(value), FieldType::Bool) => Value::Bool(*value),
            (Json::String(value), FieldType::String) => Value::Str(value),
            (Json::Number(number), FieldType::I64) => Value::I64(number.as_i64()?),
            (Json::Number(number), FieldType::U64) => Value::U64(number.as_u64()?),
            (Json::Number(number), FieldType::F64) => Value::F64(number.as_f64().unwrap_or(f64::NAN)),
            _ => return None,
        })
    }

    /// Ops as comparable data: id, remove?, fields sorted by name, payload.
    type OpDump = (String, bool, Vec<(String, String)>, Option<Vec<u8>>);

    fn dump(batch: &Batch) -> Vec<OpDump> {
        batch
            .ops()
            .map(|op| {
                let mut fields: Vec<(String, String)> =
                    op.fields().map(|(name, value)| (name.to_owned(), format!("{value:?}"))).collect();
                fields.sort();
                (op.id().to_owned(), op.is_remove(), fields, op.payload().map(<[u8]>::to_vec))
            })
            .collect()
    }

    fn random_literal(rng: &mut Rng) -> String {
        match rng.below(14) {
            0 => "null".to_owned(),
            1 => "true".to_owned(),
            2 => format!("{}", rng.below(1000)),
            3 => format!("-{}", rng.below(1000) + 1),
            4 => format!("{}.5", rng.below(100)),
            5 => "18446744073709551615".to_owned(),
            6 => "9223372036854775808".to_owned(),
            7 => "-9223372036854775808".to_owned(),
            8 => "1.0".to_owned(),
            9 => r#""caf\u00e9 \"q\" \n""#.to_owned(),
            10 => "\"plain\"".to_owned(),
            11 => "[1, {\"a\": [2]}]".to_owned(),
            12 => "{\"nested\": {\"x\": null}}".to_owned(),
            _ => "2e3".to_owned(),
        }
    }

    /// Random ops, mostly well-formed, each field value of a random JSON kind:
    /// the streaming decoder and the reference agree on the batch or the error code.
    #[test]
    fn fill_batch_matches_decoding_through_a_json_value() {
        let schema = Schema::new()
            .with_field("name", FieldType::String)
            .with_field("score", FieldType::I64)
            .with_field("count", FieldType::U64)
            .with_field("ratio", FieldType::F64)
            .with_field("flag", FieldType::Bool);
        let names = ["name", "score", "count", "ratio", "flag", "n\\u0061me", "nope"];
        let mut rng = Rng::new(7);
        let (mut n_ok, mut n_refused) = (0, 0);
        for _ in 0..3_000 {
            let mut ops = Vec::new();
            for n in 0..1 + rng.below(3) {
                let kind = *rng.pick(&["upsert", "upsert", "upsert", "remove", "up\\u0073ert", "frob"]);
                let mut op = format!(r#"{{"op":"{kind}","id":"!r{n}\u00e9""#);
                if rng.chance(80) {
                    let mut used = Vec::new();
                    let mut fields = Vec::new();
                    for _ in 0..rng.below(4) {
                        let name = *rng.pick(&names);
                        // Duplicate keys are left out: the map kept the last, the stream sets both.
                        if !used.contains(&name.replace("\\u0061", "a")) {
                            used.push(name.replace("\\u0061", "a"));
                            fields.push(format!(r#""{name}":{}"#, random_literal(&mut rng)));
                        }
                    }
                    let fields = match rng.below(20) {
                        0 => "5".to_owned(),
                        1 => "null".to_owned(),
                        _ => format!("{{{}}}", fields.join(",")),
                    };
                    op.push_str(&format!(r#","fields":{fields}"#));
                }
                if rng.chance(30) {
                    op.push_str(&format!(r#","payload":{}"#, random_literal(&mut rng)));
                }
                op.push('}');
                ops.push(op);
            }
            let body = format!(r#"{{"ops":[{}]}}"#, ops.join(","));
            let request: BatchRequest = serde_json::from_str(&body).expect(&body);
            let reference: std::collections::BTreeMap<String, Vec<RawOp>> = serde_json::from_str(&body).unwrap();
            let mut streamed = Batch::new();
            let mut expected = Batch::new();
            let got = fill_batch(&mut streamed, &schema, &request.ops, 0).map_err(|error| error.code);
            let want = reference_fill(&mut expected, &schema, &reference["ops"]);
            assert_eq!(got, want, "{body}");
            if got.is_ok() {
                assert_eq!(dump(&streamed), dump(&expected), "{body}");
                n_ok += 1;
            } else {
                n_refused += 1;
            }
        }
        assert!(n_ok > 300 && n_refused > 300, "both outcomes exercised: {n_ok} ok, {n_refused} refused");
    }
}
