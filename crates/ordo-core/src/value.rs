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

    /// Converts the value to a field's type when that is lossless (`I64` ↔ `U64` in
    /// range); `None` when it cannot be. Null fits every type.
    pub fn coerce_to(self, field_type: FieldType) -> Option<Value<'a>> {
        match (self, field_type) {
            (Value::Null, _) => Some(Value::Null),
            (Value::Bool(_), FieldType::Bool)
            | (Value::I64(_), FieldType::I64)
            | (Value::U64(_), FieldType::U64)
            | (Value::F64(_), FieldType::F64)
            | (Value::Str(_), FieldType::String) => Some(self),
            (Value::I64(number), FieldType::U64) => u64::try_from(number).ok().map(Value::U64),
            (Value::U64(number), FieldType::I64) => i64::try_from(number).ok().map(Value::I64),
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
        }
    }
}

impl std::fmt::Display for FieldType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
