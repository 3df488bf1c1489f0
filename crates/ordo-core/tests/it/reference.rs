//! The naive reference: a map of items, filtered, fully sorted and sliced on every
//! read. Written independently of the engine (no engine code evaluates filters or
//! orders here), so the model test compares two implementations.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};

use icu_collator::options::{CollatorOptions, Strength};
use icu_collator::CollatorBorrowed;
use icu_locale_core::Locale;
use unicode_normalization::char::canonical_combining_class;
use unicode_normalization::UnicodeNormalization;

use ordo_core::{AtomicOp, CompareOp, Direction, Filter, OwnedItem, OwnedValue, Schema, SortKey, ViewDef};

#[derive(Clone, Default)]
pub struct ReferenceCollection {
    pub items: BTreeMap<String, OwnedItem>,
    /// Each item's version: the number of the last accepted batch that upserted it.
    pub versions: BTreeMap<String, u64>,
}

/// An atomic operation, naively: the new value, or `None` when it overflows the
/// field's type (integers in `i128`, floats must stay finite). `set_max`/`set_min`
/// keep the current value when it is not beaten (`Some(current)`).
pub fn reference_atomic(op: AtomicOp, current: &OwnedValue, operand: &OwnedValue) -> Option<OwnedValue> {
    let sign = if op == AtomicOp::Decrement { -1 } else { 1 };
    match (op, current, operand) {
        (AtomicOp::Increment | AtomicOp::Decrement, OwnedValue::F64(_) | OwnedValue::Null, OwnedValue::F64(delta)) => {
            let current = if let OwnedValue::F64(value) = current { *value } else { 0.0 };
            let result = current + sign as f64 * delta;
            result.is_finite().then_some(OwnedValue::F64(result))
        }
        (AtomicOp::Increment | AtomicOp::Decrement, _, _) => {
            let as_int = |value: &OwnedValue| match value {
                OwnedValue::Null => 0i128,
                OwnedValue::I64(number) => *number as i128,
                OwnedValue::U64(number) => *number as i128,
                other => panic!("not an integer: {other:?}"),
            };
            let result = as_int(current) + sign * as_int(operand);
            match (current, operand) {
                (OwnedValue::I64(_), _) | (OwnedValue::Null, OwnedValue::I64(_)) => {
                    i64::try_from(result).ok().map(OwnedValue::I64)
                }
                _ => u64::try_from(result).ok().map(OwnedValue::U64),
            }
        }
        (_, OwnedValue::Null, _) => Some(operand.clone()),
        (_, _, _) => {
            let ordering = compare_values(operand, current).expect("same type");
            let wins = if op == AtomicOp::SetMax { ordering == Ordering::Greater } else { ordering == Ordering::Less };
            Some(if wins { operand.clone() } else { current.clone() })
        }
    }
}

/// The seeded generator of every model test here (a failure prints its seed).
pub use ordo_test_kit::rng::Rng;

fn fold(text: &str) -> String {
    caseless::default_case_fold_str(text)
}

/// What `contains` and `prefix` compare, naively and with another normalizer than
/// the engine's: NFD, case fold, then (accent-insensitive) NFD again and every
/// combining mark dropped, then NFC.
fn search_fold(text: &str, accent_insensitive: bool) -> String {
    let folded = fold(&text.nfd().collect::<String>());
    if accent_insensitive {
        folded.nfd().filter(|&character| canonical_combining_class(character) == 0).nfc().collect()
    } else {
        folded.nfc().collect()
    }
}

thread_local! {
    static COLLATORS: RefCell<HashMap<(String, bool), CollatorBorrowed<'static>>> = RefCell::new(HashMap::new());
}

/// The collator's own comparison, at the strength the engine documents: tertiary,
/// or secondary when case-insensitive. (`root` is CLDR's name for `und`.)
fn collate(locale: &str, case_insensitive: bool, left: &str, right: &str) -> Ordering {
    COLLATORS.with(|collators| {
        let mut collators = collators.borrow_mut();
        let collator = collators.entry((locale.to_owned(), case_insensitive)).or_insert_with(|| {
            let locale = if locale == "root" { Locale::UNKNOWN } else { Locale::try_from_str(locale).unwrap() };
            let mut options = CollatorOptions::default();
            options.strength = Some(if case_insensitive { Strength::Secondary } else { Strength::Tertiary });
            CollatorBorrowed::try_new((&locale).into(), options).unwrap()
        });
        collator.compare(left, right)
    })
}

fn field_index(schema: &Schema, name: &str) -> usize {
    schema.field_id(name).expect("reference filters use known fields").index()
}

fn compare_values(left: &OwnedValue, right: &OwnedValue) -> Option<Ordering> {
    match (left, right) {
        (OwnedValue::Bool(a), OwnedValue::Bool(b)) => Some(a.cmp(b)),
        (OwnedValue::I64(a), OwnedValue::I64(b)) => Some(a.cmp(b)),
        (OwnedValue::U64(a), OwnedValue::U64(b)) => Some(a.cmp(b)),
        (OwnedValue::F64(a), OwnedValue::F64(b)) => a.partial_cmp(b),
        (OwnedValue::Str(a), OwnedValue::Str(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
        // Literals of another integer type, as the engine converts losslessly.
        (OwnedValue::U64(a), OwnedValue::I64(b)) => Some((*a as i128).cmp(&(*b as i128))),
        (OwnedValue::I64(a), OwnedValue::U64(b)) => Some((*a as i128).cmp(&(*b as i128))),
        _ => None,
    }
}

fn satisfies(ordering: Ordering, op: CompareOp) -> bool {
    match op {
        CompareOp::Eq => ordering == Ordering::Equal,
        CompareOp::Ne => ordering != Ordering::Equal,
        CompareOp::Lt => ordering == Ordering::Less,
        CompareOp::Le => ordering != Ordering::Greater,
        CompareOp::Gt => ordering == Ordering::Greater,
        CompareOp::Ge => ordering != Ordering::Less,
    }
}

pub fn matches(filter: &Filter, schema: &Schema, item: &OwnedItem) -> bool {
    match filter {
        Filter::True => true,
        Filter::Compare { field, op, value } => {
            let field_value = &item.fields[field_index(schema, field)];
            if matches!(field_value, OwnedValue::Null) {
                return false;
            }
            compare_values(field_value, value).is_some_and(|ordering| satisfies(ordering, *op))
        }
        Filter::CompareFields { field, op, other } => {
            let (left, right) = (&item.fields[field_index(schema, field)], &item.fields[field_index(schema, other)]);
            // `compare_values` is None for a null on either side and for types that do not compare.
            compare_values(left, right).is_some_and(|ordering| satisfies(ordering, *op))
        }
        Filter::In { field, values } => {
            let field_value = &item.fields[field_index(schema, field)];
            !matches!(field_value, OwnedValue::Null)
                && values.iter().any(|value| compare_values(field_value, value) == Some(Ordering::Equal))
        }
        Filter::IsNull { field } => {
            matches!(item.fields[field_index(schema, field)], OwnedValue::Null)
        }
        Filter::Contains { field, needle, accent_insensitive } => match &item.fields[field_index(schema, field)] {
            OwnedValue::Str(text) => {
                search_fold(text, *accent_insensitive).contains(&search_fold(needle, *accent_insensitive))
            }
            _ => false,
        },
        Filter::Prefix { field, prefix, accent_insensitive } => match &item.fields[field_index(schema, field)] {
            OwnedValue::Str(text) => {
                search_fold(text, *accent_insensitive).starts_with(&search_fold(prefix, *accent_insensitive))
            }
            _ => false,
        },
        Filter::All(filters) => filters.iter().all(|filter| matches(filter, schema, item)),
        Filter::Any(filters) => filters.iter().any(|filter| matches(filter, schema, item)),
        Filter::Not(filter) => !matches(filter, schema, item),
    }
}

pub fn compare_items(sort: &[SortKey], schema: &Schema, left: &OwnedItem, right: &OwnedItem) -> Ordering {
    for key in sort {
        let index = field_index(schema, &key.field);
        let (a, b) = (&left.fields[index], &right.fields[index]);
        let ordering = match (a, b) {
            (OwnedValue::Null, OwnedValue::Null) => Ordering::Equal,
            (OwnedValue::Null, _) => return Ordering::Greater,
            (_, OwnedValue::Null) => return Ordering::Less,
            (OwnedValue::Str(a), OwnedValue::Str(b)) if key.collation.is_some() => {
                collate(key.collation.as_deref().unwrap(), key.case_insensitive, a, b)
            }
            (OwnedValue::Str(a), OwnedValue::Str(b)) if key.case_insensitive => fold(a).cmp(&fold(b)),
            (OwnedValue::F64(a), OwnedValue::F64(b)) => a.total_cmp(b),
            _ => compare_values(a, b).expect("same field, same type"),
        };
        let ordering = if key.direction == Direction::Descending { ordering.reverse() } else { ordering };
        if ordering != Ordering::Equal {
            return ordering;
        }
    }
    left.id.as_bytes().cmp(right.id.as_bytes())
}

impl ReferenceCollection {
    /// The whole view, naively: filter, full sort, no window.
    pub fn view(&self, schema: &Schema, def: &ViewDef) -> Vec<OwnedItem> {
        let mut items: Vec<OwnedItem> =
            self.items.values().filter(|item| matches(&def.filter, schema, item)).cloned().collect();
        items.sort_by(|a, b| compare_items(&def.sort, schema, a, b));
        items
    }

    pub fn window(&self, schema: &Schema, def: &ViewDef, offset: usize, limit: usize) -> Vec<OwnedItem> {
        self.view(schema, def).into_iter().skip(offset).take(limit).collect()
    }
}
