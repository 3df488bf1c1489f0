//! Borrowed field values, as passed into batches and read out of items.

use crate::schema::FieldType;

/// A field value. `Str` borrows, so reading an item or building a batch never allocates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(&'a str),
}

impl<'a> Value<'a> {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::I64(_) => "i64",
            Value::U64(_) => "u64",
            Value::F64(_) => "f64",
            Value::Str(_) => "string",
        }
    }

    /// Converts the value to a field's type when that is lossless: the result
    /// stands for exactly the same number. `I64` ↔ `U64` in range; an integer into
    /// `F64` only when the `f64` holds it exactly (every integer up to 2^53 in
    /// magnitude, and beyond that those the `f64` spacing reaches: 2^53 + 1 does
    /// not fit, 2^53 + 2 does); an `F64` into `I64`/`U64` only when it is an
    /// integer in the type's range (`1.0` → 1; `1.5`, NaN, ±∞ and 2^63 into `I64`
    /// do not fit). `-0.0` into an integer field is 0: the same number, only the
    /// sign of zero (which no integer has) is dropped. `None` when the value does
    /// not fit. Null fits every type.
    pub fn coerce_to(self, field_type: FieldType) -> Option<Value<'a>> {
        match (self, field_type) {
            (Value::Null, _) => Some(Value::Null),
            (Value::Bool(_), FieldType::Bool)
            | (Value::I64(_), FieldType::I64)
            | (Value::U64(_), FieldType::U64)
            | (Value::F64(_), FieldType::F64)
            | (Value::Str(_), FieldType::String | FieldType::Ref(_)) => Some(self),
            (Value::I64(number), FieldType::U64) => u64::try_from(number).ok().map(Value::U64),
            (Value::U64(number), FieldType::I64) => i64::try_from(number).ok().map(Value::I64),
            (Value::I64(number), FieldType::F64) => exact_f64_of_i64(number).map(Value::F64),
            (Value::U64(number), FieldType::F64) => exact_f64_of_u64(number).map(Value::F64),
            (Value::F64(number), FieldType::I64) => exact_i64_of_f64(number).map(Value::I64),
            (Value::F64(number), FieldType::U64) => exact_u64_of_f64(number).map(Value::U64),
            _ => None,
        }
    }

    pub fn to_owned_value(&self) -> OwnedValue {
        match *self {
            Value::Null => OwnedValue::Null,
            Value::Bool(value) => OwnedValue::Bool(value),
            Value::I64(value) => OwnedValue::I64(value),
            Value::U64(value) => OwnedValue::U64(value),
            Value::F64(value) => OwnedValue::F64(value),
            Value::Str(value) => OwnedValue::Str(value.to_owned()),
        }
    }
}

/// An owned field value, for library users who keep items (see [`crate::OwnedItem`]).
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedValue {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(String),
}

impl OwnedValue {
    pub fn as_value(&self) -> Value<'_> {
        match self {
            OwnedValue::Null => Value::Null,
            OwnedValue::Bool(value) => Value::Bool(*value),
            OwnedValue::I64(value) => Value::I64(*value),
            OwnedValue::U64(value) => Value::U64(*value),
            OwnedValue::F64(value) => Value::F64(*value),
            OwnedValue::Str(value) => Value::Str(value),
        }
    }
}

impl FieldType {
    pub fn name(self) -> &'static str {
        match self {
            FieldType::Bool => "bool",
            FieldType::I64 => "i64",
            FieldType::U64 => "u64",
            FieldType::F64 => "f64",
            FieldType::String => "string",
            FieldType::Ref(_) => "ref",
        }
    }
}

impl std::fmt::Display for FieldType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// 2^63 and 2^64 as `f64` (both exact): the first values past `i64` and `u64`.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

/// `number` as an `f64`, when the `f64` is exactly `number`.
///
/// `as` rounds to the nearest `f64`; converting back with `as` saturates, so the
/// round trip alone would pass `i64::MAX` (it rounds up to 2^63, which saturates
/// back to `i64::MAX`): the range check rules that out.
fn exact_f64_of_i64(number: i64) -> Option<f64> {
    let float = number as f64;
    (float < TWO_POW_63 && float as i64 == number).then_some(float)
}

/// `number` as an `f64`, when the `f64` is exactly `number` (see [`exact_f64_of_i64`]).
fn exact_f64_of_u64(number: u64) -> Option<f64> {
    let float = number as f64;
    (float < TWO_POW_64 && float as u64 == number).then_some(float)
}

/// `number` as an `i64`, when it is an integer in `i64`'s range. NaN and ±∞
/// fail both tests; `-0.0` gives 0.
fn exact_i64_of_f64(number: f64) -> Option<i64> {
    (number.fract() == 0.0 && (-TWO_POW_63..TWO_POW_63).contains(&number)).then_some(number as i64)
}

/// `number` as a `u64`, when it is an integer in `u64`'s range (`-0.0` gives 0).
fn exact_u64_of_f64(number: f64) -> Option<u64> {
    (number.fract() == 0.0 && (-0.0..TWO_POW_64).contains(&number)).then_some(number as u64)
}
