//! The check of one value against its field, shared by every path that writes
//! one (a batch's validation, the one-item path, atomic operands, bulk loads):
//! the value converted to the field's type, and refused when no conversion
//! exists, when it is NaN or when a string is over the limit. Beside `schema`
//! and `value`, below the engine, so the storage paths need not reach up into it.

use crate::error::BatchError;
use crate::limits;
use crate::schema::FieldType;
use crate::value::Value;

/// Converts a value to its field's type and checks it against the limits.
pub(crate) fn check_field_value<'a>(
    op_index: usize,
    name: &str,
    field_type: FieldType,
    value: Value<'a>,
) -> Result<Value<'a>, BatchError> {
    if let Some(value) = accepted_value(field_type, value) {
        return Ok(value);
    }
    match value.coerce_to(field_type) {
        None => Err(BatchError::WrongType {
            op_index,
            field: name.to_owned(),
            expected: field_type.name(),
            found: value.type_name(),
        }),
        Some(Value::F64(number)) if number.is_nan() => Err(BatchError::NotANumber { op_index, field: name.to_owned() }),
        Some(Value::Str(text)) if text.len() > limits::MAX_STRING_FIELD_BYTES => {
            Err(BatchError::StringTooLong { op_index, field: name.to_owned(), value_bytes: text.len() })
        }
        Some(value) => unreachable!("refused by accepted_value: {value:?}"),
    }
}

/// The value converted to its field's type, when the field accepts it (`None`:
/// refused, and `check_field_value` says why). Allocates nothing.
#[inline]
pub(crate) fn accepted_value(field_type: FieldType, value: Value<'_>) -> Option<Value<'_>> {
    match value.coerce_to(field_type) {
        Some(Value::F64(number)) if number.is_nan() => None,
        Some(Value::Str(text)) if text.len() > limits::MAX_STRING_FIELD_BYTES => None,
        converted => converted,
    }
}
