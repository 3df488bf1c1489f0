//! What a user asks for: a filter and a sort over a collection. Plain data, compiled
//! against the schema by `filter::CompiledFilter` and `sort::CompiledSort`.

use crate::value::OwnedValue;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A filter expression. Comparisons against a null field are false (so `not` of one
/// is true); test for null with [`Filter::IsNull`].
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    /// Every item passes.
    True,
    /// `field <op> value`. Strings compare by bytes (case-sensitive); the literal's
    /// type must match the field's (integers convert when lossless).
    Compare {
        field: String,
        op: CompareOp,
        value: OwnedValue,
    },
    /// `field in [values]`.
    In {
        field: String,
        values: Vec<OwnedValue>,
    },
    /// `field is null`.
    IsNull {
        field: String,
    },
    /// Case-insensitive substring test on a string field (ASCII fast path, full
    /// Unicode case folding otherwise).
    Contains {
        field: String,
        needle: String,
    },
    /// Case-insensitive prefix test on a string field.
    Prefix {
        field: String,
        prefix: String,
    },
    All(Vec<Filter>),
    Any(Vec<Filter>),
    Not(Box<Filter>),
}

impl Filter {
    pub fn eq(field: &str, value: OwnedValue) -> Filter {
        Filter::Compare { field: field.to_owned(), op: CompareOp::Eq, value }
    }

    pub fn compare(field: &str, op: CompareOp, value: OwnedValue) -> Filter {
        Filter::Compare { field: field.to_owned(), op, value }
    }

    pub fn contains(field: &str, needle: &str) -> Filter {
        Filter::Contains { field: field.to_owned(), needle: needle.to_owned() }
    }

    pub fn prefix(field: &str, prefix: &str) -> Filter {
        Filter::Prefix { field: field.to_owned(), prefix: prefix.to_owned() }
    }

    pub fn is_null(field: &str) -> Filter {
        Filter::IsNull { field: field.to_owned() }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Ascending,
    Descending,
}

/// One sort key. Nulls sort last whatever the direction.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SortKey {
    pub field: String,
    pub direction: Direction,
    /// Strings only: compare case-insensitively (full Unicode case folding).
    pub case_insensitive: bool,
}

impl SortKey {
    pub fn asc(field: &str) -> SortKey {
        SortKey { field: field.to_owned(), direction: Direction::Ascending, case_insensitive: false }
    }

    pub fn desc(field: &str) -> SortKey {
        SortKey { field: field.to_owned(), direction: Direction::Descending, case_insensitive: false }
    }

    pub fn case_insensitive(mut self) -> SortKey {
        self.case_insensitive = true;
        self
    }
}

/// A view definition. The item id, ascending, always follows the sort keys, so the
/// order is total and deterministic. Identical definitions on one collection share
/// one sorted index.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewDef {
    pub filter: Filter,
    pub sort: Vec<SortKey>,
}

impl ViewDef {
    pub fn new(filter: Filter, sort: Vec<SortKey>) -> ViewDef {
        ViewDef { filter, sort }
    }
}
