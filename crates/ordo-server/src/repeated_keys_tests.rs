//! Every JSON text the server reads, with one key repeated in one of its objects
//! (at every depth, spelled as written or with an escape), is refused by the
//! decoding its route uses, with the documented error; the same text without
//! the repetition is accepted, so the refusal is the repetition's. A refused
//! text never becomes a batch, a view, a rule set or an identity, so nothing
//! is written. Seeded: a failure names its seed and text.

use serde_json::{json, Value as Json};

use ordo_core::{Batch, FieldType, Schema};

use crate::api::{parse, parse_write};
use crate::auth::{AuthFailure, AuthOptions, Verifier};
use crate::cluster::entry::Decoded;
use crate::error::{ApiError, ErrorCode};
use crate::rng::Rng;
use crate::rules::RulesDoc;
use crate::wire::{self, AddFieldRequest, BatchRequest, ClientMessage, MultiBatchRequest, QueryRequest, SchemaRequest};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

fn schema() -> Schema {
    Schema::new()
        .with_field("owner", FieldType::String)
        .with_field("score", FieldType::I64)
        .with_field("n", FieldType::U64)
        .with_field("ratio", FieldType::F64)
}

fn filter() -> Json {
    json!({"all": [
        {"field": "owner", "op": "eq", "value": "alice"},
        {"not": {"any": [{"field": "score", "op": "gt", "value": 1}, {"field": "n", "in": [1, 2]}]}},
        {"field": "owner", "prefix": "al", "accent_insensitive": true},
    ]})
}

fn op() -> Json {
    json!({"op": "upsert", "id": "a", "if": {"version": 3},
        "fields": {"owner": "alice", "score": 1}, "increment": {"n": 1}, "set_max": {"ratio": 0.5},
        "payload": {"last": {"text": "hi", "marks": [{"at": 1, "kind": "b"}]}, "n": 2}})
}

/// How a route reads a text: `Ok` when accepted, else the error it answers.
type Decode = fn(&[u8]) -> Result<(), ApiError>;

fn write_body(body: &[u8]) -> Result<(), ApiError> {
    let request: BatchRequest = parse_write(body)?;
    wire::fill_batch(&mut Batch::new(), &schema(), &request.ops, 0)
}

fn multi_write_body(body: &[u8]) -> Result<(), ApiError> {
    let request: MultiBatchRequest = parse_write(body)?;
    for part in &request.writes {
        wire::fill_batch(&mut Batch::new(), &schema(), &part.ops, 0)?;
    }
    Ok(())
}

fn message(text: &[u8]) -> Result<(), ApiError> {
    crate::strict_json::parse::<ClientMessage>(text, "the message").map(drop)
}

/// A cluster entry as every node applies it: decoded, then its caller's claims
/// read (a node reads them when the caller is not the last one's), its ops
/// typed and its raw documents read.
fn entry(bytes: &[u8]) -> Result<(), ApiError> {
    let decoded = Decoded::decode(bytes).map_err(|error| ApiError::from_json(&error))?;
    decoded.caller.identity().map_err(|error| ApiError::from_json(&error))?;
    wire::fill_batch(&mut Batch::new(), &schema(), decoded.ops.as_deref().unwrap_or(&[]), 0)?;
    if let Some(rules) = decoded.rules {
        crate::strict_json::parse::<RulesDoc>(rules.get().as_bytes(), "the entry")?;
    }
    Ok(())
}

/// The token of `claims` (text as signed), verified; a refusal as `unauthorized`.
fn claims(text: &[u8]) -> Result<(), ApiError> {
    let claims = serde_json::value::RawValue::from_string(String::from_utf8(text.to_vec()).unwrap()).unwrap();
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    let token = jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_secret(SECRET)).unwrap();
    let verifier = Verifier::new(&AuthOptions { secret: Some(SECRET.to_vec()), ..AuthOptions::default() }).unwrap();
    match verifier.verify(&token) {
        Ok(_) => Ok(()),
        Err(AuthFailure::BadClaims) => Err(ApiError::new(ErrorCode::BadJson, "bad_claims")),
        Err(failure) => Err(ApiError::new(ErrorCode::Unauthorized, format!("{failure:?}"))),
    }
}

fn cases() -> Vec<(&'static str, Json, Decode)> {
    let entry_caller = json!({"sub": "alice", "role": "writer", "claims": {"team": {"id": 7, "tags": [{"a": 1}]}}});
    vec![
        ("POST .../batch", json!({"ops": [op(), {"op": "remove", "id": "b", "if": {"exists": true}}]}), write_body),
        ("POST /v1/batch", json!({"writes": [{"collection": "notes", "ops": [op()]}]}), multi_write_body),
        (
            "POST .../query",
            json!({"filter": filter(), "sort": [{"field": "score", "dir": "desc"}], "around": {"id": "a", "row": 0},
                "limit": 5, "fields": ["owner"], "payload": false, "min_seq": 1}),
            |body| parse::<QueryRequest>(body).map(drop),
        ),
        (
            "PUT /v1/rules",
            json!({"rules": [{"collection": "notes", "roles": ["reader"], "read": {"filter": filter()},
                "write": {"filter": {"all": [{"field": "owner", "op": "eq", "value": "$sub"}]}}, "create": false}]}),
            |body| parse::<RulesDoc>(body).map(drop),
        ),
        (
            "PUT /v1/collections/{name}",
            json!({"fields": [{"name": "owner", "type": "string"}, {"name": "room", "type": "ref", "target": "rooms"}]}),
            |body| parse::<SchemaRequest>(body).map(drop),
        ),
        ("POST .../fields", json!({"name": "pinned", "type": "bool", "default": false}), |body| {
            parse::<AddFieldRequest>(body).map(drop)
        }),
        (
            "subscribe",
            json!({"op": "subscribe", "sub": "s", "collection": "notes", "filter": filter(),
                "sort": [{"field": "owner", "collation": "fr"}], "tail": true, "limit": 5, "req": "r"}),
            message,
        ),
        ("set_range", json!({"op": "set_range", "sub": "s", "around": {"id": "a", "row": 1}, "limit": 5}), message),
        ("set_view", json!({"op": "set_view", "sub": "s", "filter": filter(), "sort": [{"field": "score"}]}), message),
        ("unsubscribe", json!({"op": "unsubscribe", "sub": "s", "req": "r"}), message),
        (
            "resume",
            json!({"op": "resume", "session": "abc", "subs": [{"sub": "s", "collection": "notes", "filter": filter(),
                "limit": 5, "last_seq": 3, "min_seq": 2}]}),
            message,
        ),
        ("auth", json!({"op": "auth", "token": "t", "req": "r"}), message),
        (
            "token claims",
            json!({"sub": "alice", "role": "reader", "exp": crate::auth::now_unix() + 600,
                "team": {"id": 7, "members": [{"name": "bob"}]}}),
            claims,
        ),
        (
            "cluster write entry",
            json!({"kind": "write", "collection": "notes", "ops": [op()], "caller": entry_caller}),
            entry,
        ),
        (
            "cluster rules entry",
            json!({"kind": "set_rules", "rules": {"rules": [{"collection": "notes", "roles": ["reader"],
                "read": {"filter": filter()}}]}, "caller": entry_caller}),
            entry,
        ),
    ]
}

/// The number of objects with at least one key in `value`, in pre-order.
fn count_objects(value: &Json) -> usize {
    match value {
        Json::Object(map) => usize::from(!map.is_empty()) + map.values().map(count_objects).sum::<usize>(),
        Json::Array(values) => values.iter().map(count_objects).sum(),
        _ => 0,
    }
}

/// Where and how to repeat a key: the `object`-th object (pre-order), its
/// `key`-th key, written again after all its keys or before them, the copy's
/// name escaped (`\u0061` for `a`) or not, with the same value or another.
struct Repeat {
    object: usize,
    key: usize,
    copy_first: bool,
    escape: bool,
    same_value: bool,
}

fn write_key(out: &mut String, key: &str, escape: bool) {
    match key.chars().next() {
        Some(first) if escape => {
            out.push_str(&format!("\"\\u{:04x}", first as u32));
            out.push_str(&serde_json::to_string(&key[first.len_utf8()..]).unwrap()[1..]);
        }
        _ => out.push_str(&serde_json::to_string(key).unwrap()),
    }
}

/// Another value of the same kind (so that the copy is refused for being a copy,
/// not for a type its field does not take).
fn other_value(value: &Json) -> Json {
    match value {
        Json::String(text) => Json::String(format!("{text}-other")),
        Json::Bool(flag) => Json::Bool(!flag),
        Json::Number(number) => match (number.as_u64(), number.as_i64()) {
            (Some(value), _) => json!(value + 1),
            (None, Some(value)) => json!(value + 1),
            _ => json!(number.as_f64().unwrap() + 1.0),
        },
        other => other.clone(),
    }
}

/// `value` as JSON text, with the repetition `repeat` (pre-order count `seen`).
fn write_repeated(value: &Json, repeat: &Repeat, seen: &mut usize, out: &mut String) {
    match value {
        Json::Object(map) if !map.is_empty() => {
            let here = *seen == repeat.object;
            *seen += 1;
            let mut entries: Vec<(String, bool, Json)> =
                map.iter().map(|(key, value)| (key.clone(), false, value.clone())).collect();
            if here {
                let (key, _, value) = entries[repeat.key % entries.len()].clone();
                // A copy written first keeps the value: a typed parse checks each value
                // as it comes, so a first copy it refuses would be refused for its value.
                let value = if repeat.same_value || repeat.copy_first { value } else { other_value(&value) };
                let copy = (key, repeat.escape, value);
                if repeat.copy_first {
                    entries.insert(0, copy);
                } else {
                    entries.push(copy);
                }
            }
            out.push('{');
            for (index, (key, escape, value)) in entries.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_key(out, key, *escape);
                out.push(':');
                write_repeated(value, repeat, seen, out);
            }
            out.push('}');
        }
        Json::Array(values) => {
            out.push('[');
            for (index, value) in values.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_repeated(value, repeat, seen, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[test]
fn a_key_repeated_anywhere_in_anything_the_server_reads_is_refused() {
    let seed = 0x5eed_0b1e;
    let mut rng = Rng::new(seed);
    for (name, template, decode) in cases() {
        let text = template.to_string();
        assert_eq!(decode(text.as_bytes()).map_err(|error| error.message), Ok(()), "{name}: {text}");
        let n_objects = count_objects(&template);
        // Every object at least once, then random ones.
        for round in 0..n_objects + 40 {
            let repeat = Repeat {
                object: if round < n_objects { round } else { rng.index(n_objects) },
                key: rng.index(8),
                copy_first: rng.chance(50),
                escape: rng.chance(50),
                same_value: rng.chance(50),
            };
            let mut text = String::new();
            write_repeated(&template, &repeat, &mut 0, &mut text);
            let refused = decode(text.as_bytes()).err();
            let code = refused.as_ref().map(|error| error.code);
            assert_eq!(code, Some(ErrorCode::BadJson), "{name} (seed {seed}): {text}: {refused:?}");
        }
    }
}
