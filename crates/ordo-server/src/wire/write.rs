//! Writes on the wire: batch requests decoded straight into engine batches.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use smallvec::SmallVec;

use ordo_core::{AtomicOp, Batch, FieldType, Precondition, Schema, UpsertBuilder, Value};

use super::*;
use crate::error::{ApiError, ErrorCode};
use crate::limits;
use crate::strict_json;

/// `POST /v1/collections/{name}/batch`. Strings borrow from the request body:
/// decoding a write allocates nothing per op (see `fill_batch`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest<'a> {
    #[serde(borrow)]
    pub ops: InlineOps<'a>,
}

/// A write's ops: one, the usual case (a message, a read marker), is held
/// inline, so decoding it allocates nothing; more spill to the heap.
pub type InlineOps<'a> = SmallVec<[OpRequest<'a>; 1]>;

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
    pub ops: InlineOps<'a>,
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
    /// Atomic field operations, `{"field": operand}` each (see `docs/PROTOCOL.md`).
    #[serde(default, borrow)]
    pub increment: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub decrement: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub set_max: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub set_min: Option<&'a RawValue>,
    /// The op's precondition: `{"exists":true}`, `{"exists":false}` or `{"version":N}`.
    #[serde(default, rename = "if")]
    pub condition: Option<IfRequest>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IfRequest {
    exists: Option<bool>,
    #[serde(default, deserialize_with = "exact_version")]
    version: Option<u64>,
}

/// A version as written: an integer wider than 64 bits is refused as one
/// (`bad_json`), never read as the `f64` serde_json would round it to.
fn exact_version<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    let raw = <&'de RawValue>::deserialize(deserializer)?;
    let text = raw.get();
    if let Err(refusal) = strict_json::check(text.as_bytes(), 0, strict_json::Integers::Exact64) {
        return Err(serde::de::Error::custom(refusal.to_api_error("`if`").message));
    }
    serde_json::from_str(text).map_err(serde::de::Error::custom)
}

impl IfRequest {
    fn precondition(&self, op_index: usize) -> Result<Precondition, ApiError> {
        match (self.exists, self.version) {
            (Some(true), None) => Ok(Precondition::Exists),
            (Some(false), None) => Ok(Precondition::NotExists),
            (None, Some(version)) => Ok(Precondition::Version(version)),
            _ => Err(ApiError::bad_request(format!(
                "op {op_index}: `if` takes exactly one of `exists` (true or false) or `version` (a number)"
            ))),
        }
    }
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
                if let Some(condition) = &op.condition {
                    builder = builder.precondition(condition.precondition(op_index)?);
                }
                if let Some(fields) = op.fields {
                    builder = set_fields(builder, fields, schema, op_index, None)?;
                }
                for (atomic, operands) in [
                    (AtomicOp::Increment, op.increment),
                    (AtomicOp::Decrement, op.decrement),
                    (AtomicOp::SetMax, op.set_max),
                    (AtomicOp::SetMin, op.set_min),
                ] {
                    if let Some(operands) = operands {
                        builder = set_fields(builder, operands, schema, op_index, Some(atomic))?;
                    }
                }
                if let Some(payload) = &op.payload {
                    let text = payload.get();
                    check_payload(text.as_bytes(), op_index)?;
                    builder.payload(if text == "null" { b"" } else { text.as_bytes() });
                }
            }
            "remove" => {
                let has_atomics =
                    op.increment.is_some() || op.decrement.is_some() || op.set_max.is_some() || op.set_min.is_some();
                if op.fields.is_some() || op.payload.is_some() || has_atomics {
                    return Err(ApiError::bad_request(format!(
                        "op {op_index}: a remove takes only an `id` (and an `if`)"
                    )));
                }
                match &op.condition {
                    Some(condition) => batch.remove_if(&op.id, condition.precondition(op_index)?),
                    None => batch.remove(&op.id),
                }
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

/// A payload is stored as sent and read by every client: it must have one
/// meaning (no key repeated in an object, at any depth) and nest at most
/// `MAX_PAYLOAD_DEPTH` deep. One pass over the bytes, no recursion (the text may
/// nest 100 000 deep); a scalar payload costs a few comparisons. Its integers
/// may be of any width: the server never reads them.
fn check_payload(text: &[u8], op_index: usize) -> Result<(), ApiError> {
    match strict_json::check(text, limits::MAX_PAYLOAD_DEPTH, strict_json::Integers::AsWritten) {
        Ok(()) => Ok(()),
        Err(strict_json::Refusal::TooDeep) => Err(ApiError::new(
            ErrorCode::InvalidBatch,
            format!(
                "op {op_index}: the payload nests arrays and objects more than {} deep (max_payload_depth)",
                limits::MAX_PAYLOAD_DEPTH
            ),
        )),
        Err(refusal) => Err(refusal.to_api_error(&format!("op {op_index}'s payload"))),
    }
}

/// Decodes an op's `fields` object (or, with `atomic`, the object of one atomic
/// operation's operands) into the upsert, field by field, without an
/// intermediate map: names and strings borrow from the request body.
fn set_fields<'b>(
    builder: UpsertBuilder<'b>,
    fields: &RawValue,
    schema: &Schema,
    op_index: usize,
    atomic: Option<AtomicOp>,
) -> Result<UpsertBuilder<'b>, ApiError> {
    let mut refused = None;
    let visitor = FieldsVisitor { builder, schema, op_index, atomic, refused: &mut refused };
    let mut deserializer = serde_json::Deserializer::from_str(fields.get());
    let result = serde::Deserializer::deserialize_map(&mut deserializer, visitor);
    match (result, refused) {
        (_, Some(error)) => Err(error),
        (Ok(builder), None) => Ok(builder),
        (Err(error), None) => {
            // Positions would count from the start of `fields`, not of the body: say which op instead.
            let text = error.to_string();
            let what = text.rfind(" at line ").map_or(text.as_str(), |end| &text[..end]);
            let key = atomic.map_or("fields", AtomicOp::name);
            let message = format!("op {op_index}: `{key}`: {what}");
            Err(match error.classify() {
                serde_json::error::Category::Data => ApiError::bad_request(message),
                _ => ApiError::new(ErrorCode::BadJson, format!("not valid JSON: {message}")),
            })
        }
    }
}

// `FieldsVisitor` keeps the fields an object named in one `u64`, a bit per field.
const _: () = assert!(ordo_core::limits::MAX_FIELDS_PER_SCHEMA <= 64);

struct FieldsVisitor<'b, 'r> {
    builder: UpsertBuilder<'b>,
    schema: &'r Schema,
    op_index: usize,
    /// `None`: the values are set; otherwise they are this operation's operands.
    atomic: Option<AtomicOp>,
    /// A field the schema refuses; the visitor then stops with a placeholder error.
    refused: &'r mut Option<ApiError>,
}

impl<'de, 'b> serde::de::Visitor<'de> for FieldsVisitor<'b, '_> {
    type Value = UpsertBuilder<'b>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a map")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<UpsertBuilder<'b>, A::Error> {
        let FieldsVisitor { mut builder, schema, op_index, atomic, refused } = self;
        let key = atomic.map_or("fields", AtomicOp::name);
        // The schema fields this object named so far, one bit per field (no allocation).
        let mut named: u64 = 0;
        while let Some(BorrowedStr(name)) = map.next_key::<BorrowedStr<'de>>()? {
            let raw: &'de RawValue = map.next_value()?;
            let literal = match Literal::from_raw(raw.get(), op_index, key) {
                Ok(literal) => literal,
                Err(error) => {
                    *refused = Some(error);
                    return Err(serde::de::Error::custom("refused"));
                }
            };
            let Some(field_id) = schema.field_id(&name) else {
                *refused = Some(ApiError::new(
                    ErrorCode::InvalidBatch,
                    format!("op {op_index}: the schema has no field `{name}`"),
                ));
                return Err(serde::de::Error::custom("refused"));
            };
            // One key, one value: serde_json would hand both values of a repeated key
            // over, and a rule checking one while the item keeps the other would let
            // a writer past its rule. (`"own\u0065r"` is `owner` here too: names are unescaped.)
            let bit = 1u64 << field_id.index();
            if named & bit != 0 {
                *refused = Some(ApiError::new(
                    ErrorCode::BadJson,
                    format!("not valid JSON: op {op_index}: `{key}` repeats the key `{name}`; name each key once"),
                ));
                return Err(serde::de::Error::custom("refused"));
            }
            named |= bit;
            // A field named by an atomic operation may appear nowhere else in its
            // op: `{"fields":{"unread":0},"increment":{"unread":1}}` has no one
            // obvious meaning. Checked as each is added, so a body repeating a key
            // costs at most one pass per schema field before it is refused.
            if let Some(atomic) = atomic {
                if builder.names_field(&name) {
                    *refused = Some(ApiError::bad_request(format!(
                        "op {op_index}: field `{name}` is in `{}` and elsewhere in the same op; \
                         name each field once per op",
                        atomic.name()
                    )));
                    return Err(serde::de::Error::custom("refused"));
                }
            }
            let field_type = schema.field(field_id).field_type;
            let typed = match atomic {
                None => literal.typed(field_type),
                Some(atomic) => operand(&literal, atomic, field_type),
            };
            match (typed, atomic) {
                (Some(value), None) => builder = builder.set(&name, value),
                (Some(value), Some(atomic)) => builder = builder.atomic(atomic, &name, value),
                (None, _) => {
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

/// Types an atomic operation's operand by its field, as a set value is typed,
/// except that `increment`/`decrement` of an integer field take any integer
/// (`{"increment":{"unread":-1}}` on a u64 field decrements it). A field the
/// operation does not apply to gets `Null`, which the engine refuses with
/// the reason (`invalid_batch`).
fn operand<'l>(literal: &'l Literal<'_>, atomic: AtomicOp, field_type: FieldType) -> Option<Value<'l>> {
    match (atomic, field_type) {
        (AtomicOp::Increment | AtomicOp::Decrement, FieldType::I64 | FieldType::U64) => {
            literal.typed(FieldType::I64).or_else(|| literal.typed(FieldType::U64))
        }
        (AtomicOp::Increment | AtomicOp::Decrement, FieldType::F64) => literal.typed(FieldType::F64),
        (AtomicOp::Increment | AtomicOp::Decrement, _) => Some(Value::Null),
        (AtomicOp::SetMax | AtomicOp::SetMin, FieldType::Bool) => Some(Value::Null),
        (AtomicOp::SetMax | AtomicOp::SetMin, _) => literal.typed(field_type),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;
    use ordo_core::{FieldType, Value};
    use serde_json::Value as Json;

    #[test]
    fn nesting_depth_skips_strings_and_escapes() {
        let exceeds = |json: &str, depth: usize| {
            strict_json::check(json.as_bytes(), depth, strict_json::Integers::AsWritten)
                == Err(strict_json::Refusal::TooDeep)
        };
        for (json, depth) in [
            ("1", 0),
            ("\"[[[\"", 0),
            ("[]", 1),
            ("{\"a\":[1,{\"b\":[]}]}", 4),
            ("[\"]\\\"[[\",[[]]]", 3),
            ("[\"\\\\\",[]]", 2),
            ("[{},{},[[]]]", 3),
        ] {
            assert!(!exceeds(json, depth), "{json} is {depth} deep");
            assert!(depth == 0 || exceeds(json, depth - 1), "{json} is {depth} deep");
        }
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(check_payload(deep.as_bytes(), 0).is_err());
        let repeated = check_payload(br#"{"a":[{"b":1,"b":2}]}"#, 3).unwrap_err();
        assert_eq!(repeated.code, ErrorCode::BadJson);
        assert!(repeated.message.contains("op 3's payload repeats the key `b`"), "{}", repeated.message);
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
            (Json::Number(number), FieldType::I64) => Value::I64(i64::try_from(exact_integer(number)?).ok()?),
            (Json::Number(number), FieldType::U64) => Value::U64(u64::try_from(exact_integer(number)?).ok()?),
            (Json::Number(number), FieldType::F64) => Value::F64(match number.as_f64() {
                // An integer fits when the f64 round trip (through i128, which
                // does not saturate at these sizes) gives it back.
                Some(float) if !number.is_f64() => {
                    let integer = number.as_i128()?;
                    if float as i128 != integer {
                        return None;
                    }
                    float
                }
                float => float.unwrap_or(f64::NAN),
            }),
            _ => return None,
        })
    }

    /// The integer a JSON number is exactly: itself, or a float with no fraction.
    fn exact_integer(number: &serde_json::Number) -> Option<i128> {
        if let Some(integer) = number.as_i128() {
            return Some(integer);
        }
        let float = number.as_f64()?;
        let integer = float as i128;
        (integer as f64 == float && float.is_finite()).then_some(integer)
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
        match rng.below(17) {
            // Numbers on the edges of exact conversion (docs/PROTOCOL.md).
            14 => "9007199254740993".to_owned(),
            15 => "-0.0".to_owned(),
            16 => "9.223372036854775808e18".to_owned(),
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
