//! Field values as written in JSON, before a schema types them.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value as Json;

use ordo_core::{FieldType, OwnedValue, Value};

use crate::error::ApiError;
use crate::strict_json;

/// A string that borrows from the input unless it had escapes to undo.
pub(crate) struct BorrowedStr<'de>(pub(crate) Cow<'de, str>);

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
pub(crate) enum Literal<'de> {
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
    /// One value of a write's `fields` (or of an atomic operation), from its
    /// text as the body holds it (`text` is valid JSON: a `RawValue`'s). An
    /// integer is read exactly: one wider than 64 bits is refused (`bad_json`),
    /// not rounded to the `f64` serde_json would make of it. Other numbers are
    /// read by serde_json, as filter literals are, so a write and a filter read
    /// one text as one number. An object or array (no field holds one) must
    /// still name each key once. `op_index` and `key` (`fields`, `increment`…)
    /// say where, in an error.
    pub(crate) fn from_raw(text: &'a str, op_index: usize, key: &str) -> Result<Literal<'a>, ApiError> {
        let refused = |refusal: strict_json::Refusal| refusal.to_api_error(&format!("op {op_index}: `{key}`"));
        match text.as_bytes().first() {
            Some(b'-' | b'0'..=b'9') => {
                strict_json::check(text.as_bytes(), 0, strict_json::Integers::Exact64).map_err(refused)?;
            }
            Some(b'{' | b'[') => {
                strict_json::check(text.as_bytes(), strict_json::MAX_DEPTH, strict_json::Integers::AsWritten)
                    .map_err(refused)?;
            }
            _ => {}
        }
        serde_json::from_str(text).map_err(|error| {
            // Positions would count from the value, not the body: say which op instead.
            let message = error.to_string();
            let what = message.rfind(" at line ").map_or(message.as_str(), |end| &message[..end]);
            let mut refusal = ApiError::from_json(&error);
            refusal.message = format!("not valid JSON: op {op_index}: `{key}`: {what}");
            if what.contains("number out of range") {
                refusal.message.push_str(" (a number must fit an f64: at most about 1.8e308 in magnitude)");
            }
            refusal
        })
    }

    /// A value already parsed (filters): the same typing rules as a write's fields.
    pub(crate) fn from_json(json: &'a Json) -> Literal<'a> {
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

    /// The value as a field of `field_type`, converting numbers only when that is
    /// lossless. Numbers go through the engine's own rule (`Value::coerce_to`), so
    /// a write, a filter literal and a library caller's batch agree exactly.
    ///
    /// The literal keeps the form serde_json read: an integer written without a
    /// fraction or exponent is a `U64`/`I64` (exact, never rounded through an
    /// `f64`), anything else a `F64`. So `9007199254740993` stays that integer
    /// (and is refused by an `f64` field, which cannot hold it), and `1.0` is a
    /// float (accepted by an `i64` field: it is exactly 1).
    pub(crate) fn typed(&self, field_type: FieldType) -> Option<Value<'_>> {
        let value = match self {
            Literal::Null => Value::Null,
            Literal::Bool(value) => Value::Bool(*value),
            Literal::Str(value) => Value::Str(value),
            Literal::U64(value) => Value::U64(*value),
            Literal::I64(value) => Value::I64(*value),
            Literal::F64(value) => Value::F64(*value),
            Literal::Array | Literal::Object => return None,
        };
        value.coerce_to(field_type)
    }

    /// What was found, for an error message.
    pub(crate) fn describe(&self) -> String {
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

pub(crate) fn typed_owned_value(json: &Json, field_type: Option<FieldType>) -> Result<OwnedValue, String> {
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

pub(crate) fn describe(json: &Json) -> String {
    Literal::from_json(json).describe()
}

/// `"sort": null` means no sort, as `"filter": null` means no filter.
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}
