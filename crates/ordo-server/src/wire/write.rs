//! Writes on the wire: batch requests decoded straight into engine batches.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use ordo_core::{Batch, Schema, UpsertBuilder};

use super::*;
use crate::error::{ApiError, ErrorCode};
use crate::limits;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;
    use ordo_core::{FieldType, Value};
    use serde_json::Value as Json;

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
