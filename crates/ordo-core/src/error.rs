//! Typed errors with messages a user can act on.

use std::fmt;

use crate::batch::Precondition;
use crate::limits;

/// Why a batch was rejected. A rejected batch changes nothing.
#[derive(Clone, Debug, PartialEq)]
pub enum BatchError {
    /// `op_index` is the position of the offending operation in the batch.
    IdEmpty {
        op_index: usize,
    },
    IdTooLong {
        op_index: usize,
        id_bytes: usize,
    },
    UnknownField {
        op_index: usize,
        field: String,
    },
    /// An upsert sets one field more than once.
    FieldRepeated {
        op_index: usize,
        field: String,
    },
    WrongType {
        op_index: usize,
        field: String,
        expected: &'static str,
        found: &'static str,
    },
    NotANumber {
        op_index: usize,
        field: String,
    },
    StringTooLong {
        op_index: usize,
        field: String,
        value_bytes: usize,
    },
    PayloadTooLarge {
        op_index: usize,
        payload_bytes: usize,
    },
    TooManyOps {
        n_ops: usize,
    },
    /// The batch grew past `MAX_BATCH_BYTES` while it was built.
    BatchTooLarge,
    CollectionFull {
        n_items_max: usize,
    },
    UnknownCollection,
    /// An atomic operation on a field whose type it does not apply to
    /// (`increment` on a string, `set_max` on a bool).
    AtomicNotApplicable {
        op_index: usize,
        field: String,
        operation: &'static str,
        field_type: &'static str,
    },
    /// An `increment`/`decrement` whose result leaves the field's type: below 0
    /// or above `u64::MAX` for u64, outside `i64` for i64, not finite for f64.
    Overflow {
        op_index: usize,
        field: String,
        operation: &'static str,
        field_type: &'static str,
    },
    /// An operation's precondition did not hold. `found` is the item's version
    /// (`None`: no such item) just before the operation.
    Conflict {
        op_index: usize,
        id: String,
        expected: Precondition,
        found: Option<u64>,
    },
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::IdEmpty { op_index } => write!(f, "op {op_index}: the item id is empty"),
            BatchError::IdTooLong { op_index, id_bytes } => write!(
                f,
                "op {op_index}: the item id is {id_bytes} bytes; at most {} are allowed",
                limits::MAX_ID_BYTES
            ),
            BatchError::UnknownField { op_index, field } => {
                write!(f, "op {op_index}: the schema has no field `{field}`")
            }
            BatchError::FieldRepeated { op_index, field } => {
                write!(f, "op {op_index}: field `{field}` is set more than once; set each field once per op")
            }
            BatchError::WrongType { op_index, field, expected, found } => {
                write!(f, "op {op_index}: field `{field}` is {expected}, got {found}")
            }
            BatchError::NotANumber { op_index, field } => {
                write!(f, "op {op_index}: field `{field}` got NaN; f64 fields must be ordered, so NaN is refused")
            }
            BatchError::StringTooLong { op_index, field, value_bytes } => write!(
                f,
                "op {op_index}: field `{field}` is {value_bytes} bytes; at most {} are allowed",
                limits::MAX_STRING_FIELD_BYTES
            ),
            BatchError::PayloadTooLarge { op_index, payload_bytes } => write!(
                f,
                "op {op_index}: the payload is {payload_bytes} bytes; at most {} are allowed",
                limits::MAX_PAYLOAD_BYTES
            ),
            BatchError::TooManyOps { n_ops } => {
                write!(f, "the batch has {n_ops} operations; at most {} are allowed", limits::MAX_OPS_PER_BATCH)
            }
            BatchError::BatchTooLarge => write!(
                f,
                "the batch holds more than {} bytes of ids, strings and payloads; split it",
                limits::MAX_BATCH_BYTES
            ),
            BatchError::CollectionFull { n_items_max } => {
                write!(f, "the collection would exceed {n_items_max} items")
            }
            BatchError::UnknownCollection => write!(f, "no such collection"),
            BatchError::AtomicNotApplicable { op_index, field, operation, field_type } => {
                write!(f, "op {op_index}: `{operation}` does not apply to field `{field}` of type {field_type}")
            }
            BatchError::Overflow { op_index, field, operation, field_type } => write!(
                f,
                "op {op_index}: `{operation}` of field `{field}` would leave the range of {field_type}; \
                 the batch is refused"
            ),
            BatchError::Conflict { op_index, id, expected, found } => {
                write!(f, "op {op_index} (`{id}`): ")?;
                match (expected, found) {
                    (Precondition::Version(expected), Some(found)) => {
                        write!(f, "expected version {expected}, found {found}")
                    }
                    (Precondition::Version(expected), None) => {
                        write!(f, "expected version {expected}, found no item")
                    }
                    (Precondition::Exists, _) => write!(f, "expected the item to exist, found no item"),
                    (Precondition::NotExists, Some(found)) => {
                        write!(f, "expected no item, found one at version {found}")
                    }
                    (Precondition::NotExists, None) => write!(f, "expected no item"),
                }
            }
        }
    }
}

impl std::error::Error for BatchError {}

/// Why a view definition (filter or sort) or a window request was refused.
#[derive(Clone, Debug, PartialEq)]
pub enum ViewError {
    UnknownCollection,
    UnknownWindow,
    /// A window anchored on an item (`around`, `after`, `before`) names an id the
    /// collection does not hold.
    UnknownItem {
        id: String,
    },
    /// `around`'s row is not a row of the window (`row < limit`).
    AnchorRowOutsideWindow {
        row: usize,
        limit: usize,
    },
    UnknownField {
        field: String,
    },
    /// A literal's type does not match its field's type.
    WrongType {
        field: String,
        expected: &'static str,
        found: &'static str,
    },
    /// The operation does not apply to the field's type (e.g. `contains` on a number,
    /// case-insensitive sort on a bool).
    NotApplicable {
        field: String,
        operation: &'static str,
        field_type: &'static str,
    },
    /// A field-to-field comparison between fields whose types do not compare
    /// (a string with a number, a float with an integer, a bool with anything else).
    IncomparableFields {
        field: String,
        field_type: &'static str,
        other: String,
        other_type: &'static str,
    },
    /// A null literal in a comparison: use `IsNull`.
    NullLiteral {
        field: String,
    },
    NotANumber {
        field: String,
    },
    FilterTooDeep {
        depth_max: usize,
    },
    FilterTooLarge {
        n_nodes_max: usize,
    },
    TooManyInValues {
        n_values_max: usize,
    },
    TooManySortKeys {
        n_keys_max: usize,
    },
    DuplicateSortKey {
        field: String,
    },
    /// A sort key's collation locale is not a BCP 47 tag ICU can use.
    InvalidCollation {
        field: String,
        locale: String,
        reason: String,
    },
    CollationLocaleTooLong {
        field: String,
        n_bytes: usize,
        n_bytes_max: usize,
    },
    TooManyCollatedSortKeys {
        n_keys_max: usize,
    },
    WindowTooLarge {
        limit: usize,
        limit_max: usize,
    },
    /// `field` reads through `ref_field` with a dot, but `ref_field` is not a reference.
    NotAReference {
        field: String,
        ref_field: String,
    },
    /// `field` has more than one dot: references are followed one hop only.
    TooManyHops {
        field: String,
    },
    /// More distinct target fields read through references than a collection holds.
    TooManyDerivedFields {
        n_fields_max: usize,
    },
}

impl fmt::Display for ViewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ViewError::UnknownCollection => write!(f, "no such collection"),
            ViewError::UnknownWindow => write!(f, "no such window"),
            ViewError::UnknownItem { id } => write!(f, "the collection has no item `{id}`"),
            ViewError::AnchorRowOutsideWindow { row, limit } => {
                write!(f, "row {row} is outside a window of {limit} rows (the row must be below the limit)")
            }
            ViewError::UnknownField { field } => write!(f, "the schema has no field `{field}`"),
            ViewError::WrongType { field, expected, found } => {
                write!(f, "field `{field}` is {expected}, but the filter compares it with {found}")
            }
            ViewError::NotApplicable { field, operation, field_type } => {
                write!(f, "`{operation}` does not apply to field `{field}` of type {field_type}")
            }
            ViewError::IncomparableFields { field, field_type, other, other_type } => write!(
                f,
                "field `{field}` ({field_type}) cannot be compared with field `{other}` ({other_type}); \
                 compare two integers, two f64s, two strings or two bools"
            ),
            ViewError::NullLiteral { field } => {
                write!(f, "field `{field}` is compared with null; use `is null` instead")
            }
            ViewError::NotANumber { field } => write!(f, "field `{field}` is compared with NaN"),
            ViewError::FilterTooDeep { depth_max } => {
                write!(f, "the filter nests deeper than {depth_max} levels")
            }
            ViewError::FilterTooLarge { n_nodes_max } => {
                write!(f, "the filter has more than {n_nodes_max} nodes")
            }
            ViewError::TooManyInValues { n_values_max } => {
                write!(f, "an `in` list holds at most {n_values_max} values")
            }
            ViewError::TooManySortKeys { n_keys_max } => {
                write!(f, "a sort has at most {n_keys_max} keys")
            }
            ViewError::DuplicateSortKey { field } => {
                write!(f, "field `{field}` appears twice in the sort")
            }
            ViewError::InvalidCollation { field, locale, reason } => {
                write!(f, "the collation `{locale}` of sort key `{field}` is refused: {reason}")
            }
            ViewError::CollationLocaleTooLong { field, n_bytes, n_bytes_max } => {
                write!(f, "the collation of sort key `{field}` is {n_bytes} bytes; at most {n_bytes_max} are allowed")
            }
            ViewError::TooManyCollatedSortKeys { n_keys_max } => {
                write!(f, "a sort has at most {n_keys_max} keys with a collation")
            }
            ViewError::NotAReference { field, ref_field } => {
                write!(f, "`{field}` reads through `{ref_field}`, which is not a ref field")
            }
            ViewError::TooManyHops { field } => {
                write!(f, "`{field}` follows more than one reference; only one hop (`ref.field`) is allowed")
            }
            ViewError::TooManyDerivedFields { n_fields_max } => {
                write!(f, "views of a collection read at most {n_fields_max} distinct fields through references")
            }
            ViewError::WindowTooLarge { limit, limit_max } => {
                write!(f, "window limit {limit} is over the maximum of {limit_max}")
            }
        }
    }
}

impl std::error::Error for ViewError {}

/// Why a [`crate::BulkLoad`] refused an item or could not finish.
#[derive(Clone, Debug, PartialEq)]
pub enum LoadError {
    UnknownCollection,
    /// Bulk loading is for collections without views; use batches once views exist.
    CollectionHasViews,
    DuplicateId {
        id: String,
    },
    FieldCount {
        n_values: usize,
        n_fields: usize,
    },
    /// The item breaks a rule a batch would be held to (`op_index` is 0).
    Invalid {
        id: String,
        error: BatchError,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::UnknownCollection => f.write_str("no such collection"),
            LoadError::CollectionHasViews => {
                f.write_str("items can be bulk-loaded only into a collection without views; use a batch")
            }
            LoadError::DuplicateId { id } => write!(f, "item `{id}` is loaded twice"),
            LoadError::FieldCount { n_values, n_fields } => {
                write!(f, "an item was loaded with {n_values} values; the schema has {n_fields} fields")
            }
            LoadError::Invalid { id, error } => write!(f, "item `{id}`: {error}"),
        }
    }
}

impl std::error::Error for LoadError {}
