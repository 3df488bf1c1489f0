//! What a user asks for: a filter and a sort over a collection. Plain data, compiled
//! against the schema by `filter::CompiledFilter` and `sort::CompiledSort`.

use std::hash::Hash;

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
    /// `field <op> other`: two fields of the same item, either possibly read
    /// through a reference (`room.last_seq > read_upto`). Both must be of
    /// comparable types: two integers (`i64` and `u64` compare exactly, without
    /// conversion), two `f64`s, two strings (a `ref` compares as the id it
    /// holds), or two bools (`eq` and `ne` only). A float is never compared with
    /// an integer: no conversion between them is exact for every value, and the
    /// compiler refuses the pair rather than round. A null on either side fails
    /// the comparison, for every op including `Ne`.
    CompareFields {
        field: String,
        op: CompareOp,
        other: String,
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
    /// Case-insensitive substring test on a string field: full Unicode case folding
    /// and canonical equivalence (both sides are folded, then put in NFC, so a
    /// decomposed "e" + U+0301 matches a precomposed "é"), with an ASCII fast path.
    /// With `accent_insensitive`, combining marks are dropped from both sides after
    /// canonical decomposition, so "emile" matches "Émile".
    Contains {
        field: String,
        needle: String,
        accent_insensitive: bool,
    },
    /// Case-insensitive prefix test on a string field, folded like `Contains`.
    Prefix {
        field: String,
        prefix: String,
        accent_insensitive: bool,
    },
    All(Vec<Filter>),
    Any(Vec<Filter>),
    Not(Box<Filter>),
}

impl Filter {
    /// See [`ViewDef::hash_shape`].
    fn hash_shape(&self, state: &mut impl std::hash::Hasher) {
        std::mem::discriminant(self).hash(state);
        match self {
            Filter::True => {}
            Filter::Compare { field, op, value } => {
                field.hash(state);
                op.hash(state);
                hash_value_shape(value, state);
            }
            Filter::CompareFields { field, op, other } => {
                field.hash(state);
                op.hash(state);
                other.hash(state);
            }
            Filter::In { field, values } => {
                field.hash(state);
                values.iter().for_each(|value| hash_value_shape(value, state));
            }
            Filter::IsNull { field } => field.hash(state),
            Filter::Contains { field, needle: text, accent_insensitive }
            | Filter::Prefix { field, prefix: text, accent_insensitive } => {
                field.hash(state);
                text.hash(state);
                accent_insensitive.hash(state);
            }
            Filter::All(children) | Filter::Any(children) => {
                children.len().hash(state);
                children.iter().for_each(|child| child.hash_shape(state));
            }
            Filter::Not(child) => child.hash_shape(state),
        }
    }

    /// Whether `test` holds for the name of any field the filter reads (each
    /// leaf's, in order, both sides of a field-to-field comparison; stops at the
    /// first that does).
    pub fn any_field<'a>(&'a self, test: &mut impl FnMut(&'a str) -> bool) -> bool {
        match self {
            Filter::True => false,
            Filter::CompareFields { field, other, .. } => test(field) || test(other),
            Filter::Compare { field, .. }
            | Filter::In { field, .. }
            | Filter::IsNull { field }
            | Filter::Contains { field, .. }
            | Filter::Prefix { field, .. } => test(field),
            Filter::All(children) | Filter::Any(children) => children.iter().any(|child| child.any_field(test)),
            Filter::Not(child) => child.any_field(test),
        }
    }

    pub fn eq(field: &str, value: OwnedValue) -> Filter {
        Filter::Compare { field: field.to_owned(), op: CompareOp::Eq, value }
    }

    pub fn compare(field: &str, op: CompareOp, value: OwnedValue) -> Filter {
        Filter::Compare { field: field.to_owned(), op, value }
    }

    /// `field <op> other`, two fields of one item (see [`Filter::CompareFields`]).
    pub fn compare_fields(field: &str, op: CompareOp, other: &str) -> Filter {
        Filter::CompareFields { field: field.to_owned(), op, other: other.to_owned() }
    }

    pub fn contains(field: &str, needle: &str) -> Filter {
        Filter::Contains { field: field.to_owned(), needle: needle.to_owned(), accent_insensitive: false }
    }

    pub fn prefix(field: &str, prefix: &str) -> Filter {
        Filter::Prefix { field: field.to_owned(), prefix: prefix.to_owned(), accent_insensitive: false }
    }

    /// The same `contains` or `prefix` test, ignoring accents (combining marks).
    /// Any other filter is returned unchanged.
    pub fn accent_insensitive(mut self) -> Filter {
        if let Filter::Contains { accent_insensitive, .. } | Filter::Prefix { accent_insensitive, .. } = &mut self {
            *accent_insensitive = true;
        }
        self
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
    /// Strings only: compare case-insensitively (full Unicode case folding; with a
    /// collation, the collator's secondary strength instead).
    pub case_insensitive: bool,
    /// Strings only: order by this locale's collation (a BCP 47 tag such as `fr`,
    /// `sv` or `de-u-co-phonebk`; `root` or `und` for the root collation) instead
    /// of by UTF-8 bytes.
    pub collation: Option<String>,
}

impl SortKey {
    pub fn asc(field: &str) -> SortKey {
        SortKey { field: field.to_owned(), direction: Direction::Ascending, case_insensitive: false, collation: None }
    }

    pub fn desc(field: &str) -> SortKey {
        SortKey { field: field.to_owned(), direction: Direction::Descending, case_insensitive: false, collation: None }
    }

    pub fn case_insensitive(mut self) -> SortKey {
        self.case_insensitive = true;
        self
    }

    pub fn collated(mut self, locale: &str) -> SortKey {
        self.collation = Some(locale.to_owned());
        self
    }
}

fn hash_value_shape(value: &OwnedValue, state: &mut impl std::hash::Hasher) {
    std::mem::discriminant(value).hash(state);
    match value {
        OwnedValue::Null | OwnedValue::F64(_) => {}
        OwnedValue::Bool(value) => value.hash(state),
        OwnedValue::I64(value) => value.hash(state),
        OwnedValue::U64(value) => value.hash(state),
        OwnedValue::Str(value) => value.hash(state),
    }
}

/// A view definition. The item id, ascending, always follows the sort keys, so the
/// order is total and deterministic. Identical definitions on one collection share
/// one sorted index.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewDef {
    pub filter: Filter,
    pub sort: Vec<SortKey>,
    /// Target fields read through references (`room.name`) that the view's
    /// windows show without filtering or sorting on them (a server's
    /// projection). The engine keeps them current like the fields the view
    /// reads, and a change of one gives each window holding the item a `Set`;
    /// a change of a target field no view reads gives nothing. Names that are
    /// not read through a reference are ignored.
    pub shown: Vec<String>,
}

impl ViewDef {
    /// Hashes the definition so that equal definitions hash alike (float literals
    /// are left out: `0.0 == -0.0`); unequal ones mostly differ, which is all a
    /// table of shared plans needs, since it compares what the hash finds.
    pub(crate) fn hash_shape(&self, state: &mut impl std::hash::Hasher) {
        self.filter.hash_shape(state);
        self.sort.hash(state);
        self.shown.hash(state);
    }

    pub fn new(filter: Filter, sort: Vec<SortKey>) -> ViewDef {
        ViewDef { filter, sort, shown: Vec::new() }
    }

    /// The same definition showing these target fields (see [`ViewDef::shown`]).
    pub fn showing(mut self, shown: Vec<String>) -> ViewDef {
        self.shown = shown;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every leaf's name, in order, through every kind of node; and the walk
    /// stops at the first name the test accepts.
    #[test]
    fn any_field_visits_every_leaf_in_order_and_stops_at_the_first_match() {
        let filter = Filter::All(vec![
            Filter::eq("a", OwnedValue::U64(1)),
            Filter::Any(vec![
                Filter::Not(Box::new(Filter::IsNull { field: "b".into() })),
                Filter::True,
                Filter::In { field: "c".into(), values: vec![] },
            ]),
            Filter::contains("d", "x"),
            Filter::prefix("e", "y"),
            Filter::compare_fields("f", CompareOp::Gt, "g"),
        ]);
        let mut seen = Vec::new();
        assert!(!filter.any_field(&mut |name| {
            seen.push(name);
            false
        }));
        assert_eq!(seen, ["a", "b", "c", "d", "e", "f", "g"]);
        seen.clear();
        assert!(filter.any_field(&mut |name| {
            seen.push(name);
            name == "c"
        }));
        assert_eq!(seen, ["a", "b", "c"]);
        assert!(!Filter::True.any_field(&mut |_| true));
    }
}
