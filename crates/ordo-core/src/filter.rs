//! Filters compiled against a schema.
//!
//! Compilation (`compile`) resolves field names to [`FieldId`]s, converts every literal to its
//! field's type once, folds `contains` / `prefix` needles once (see `text_match`), and checks the
//! limits in [`crate::limits`]. What remains for evaluation is a flat, pre-order
//! `Vec` of small nodes: a combinator records where its subtree ends, so children are
//! visited by walking forward through one contiguous allocation instead of chasing
//! boxed pointers. Strings, needles and `in` sets sit in side tables so that the
//! nodes themselves stay small and several fit in one cache line.
//!
//! Evaluation never allocates once the caller's [`FilterScratch`] has grown to the
//! longest folded haystack it meets: ASCII text is compared in place, and only
//! non-ASCII haystacks of `contains` are folded, into the scratch buffer.

use std::cmp::Ordering;

use crate::collection::{Collection, Column, ItemRef};
use crate::error::ViewError;
use crate::ids::Slot;
use crate::schema::{FieldId, Schema};
use crate::text_match::{contains_folded, starts_with_folded, FoldedNeedle};
use crate::value::Value;
use crate::view_def::{CompareOp, Filter};

mod compile;

/// A [`Filter`] compiled against a [`Schema`]; evaluate it only on items of a
/// collection with that schema.
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledFilter {
    /// Pre-order: a node's children follow it directly. Never empty; node 0 is the root.
    nodes: Vec<Node>,
    /// String literals of `Compare` nodes, indexed by [`Literal::Str`].
    texts: Vec<String>,
    /// Needles of `Contains` / `Prefix` nodes, in their search form.
    needles: Vec<FoldedNeedle>,
    /// Literal sets of `In` nodes.
    in_sets: Vec<InSet>,
    /// Every field any node reads, sorted and deduplicated.
    fields_read: Vec<FieldId>,
}

/// Caller-owned buffers reused across evaluations, so that steady-state evaluation
/// allocates nothing. One scratch serves any number of filters, one at a time.
#[derive(Clone, Debug, Default)]
pub struct FilterScratch {
    /// The folded haystack of a non-ASCII `contains`; cleared, never shrunk.
    folded_haystack: String,
}

/// Index into one of the side tables. `u32` rather than `usize` keeps nodes small;
/// the node limit keeps every table far below `u32::MAX`.
type TableIndex = u32;

#[derive(Clone, Debug, PartialEq)]
enum Node {
    /// `True`, an empty `All` (true) or an empty `Any` (false).
    Constant(bool),
    Compare {
        field_id: FieldId,
        op: CompareOp,
        literal: Literal,
    },
    /// Two fields of one item, of types the compiler checked comparable.
    CompareFields {
        field_id: FieldId,
        op: CompareOp,
        other_field_id: FieldId,
    },
    In {
        field_id: FieldId,
        set: TableIndex,
    },
    IsNull {
        field_id: FieldId,
    },
    Contains {
        field_id: FieldId,
        needle: TableIndex,
    },
    Prefix {
        field_id: FieldId,
        needle: TableIndex,
    },
    /// Children occupy `index + 1 .. subtree_end`.
    All {
        subtree_end: TableIndex,
    },
    Any {
        subtree_end: TableIndex,
    },
    /// The one child is at `index + 1`; its subtree also ends at `subtree_end`.
    Not {
        subtree_end: TableIndex,
    },
}

/// A literal already converted to its field's type, so evaluation compares like with like.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Literal {
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(TableIndex),
}

/// The literals of one `in`, typed like the field and sorted for binary search.
#[derive(Clone, Debug, PartialEq)]
enum InSet {
    Bool {
        accepts_false: bool,
        accepts_true: bool,
    },
    I64(Vec<i64>),
    U64(Vec<u64>),
    /// Sorted by `total_cmp`, with -0.0 stored as 0.0 (see [`normalize_zero`]).
    F64(Vec<f64>),
    Str(Vec<String>),
}

impl CompiledFilter {
    /// Compiles `filter` against `schema`, refusing unknown fields, literals that do
    /// not convert losslessly to their field's type, null and NaN literals, operations
    /// that do not apply to a field's type, and filters over the size limits.
    pub fn compile(filter: &Filter, schema: &Schema) -> Result<CompiledFilter, ViewError> {
        compile::compile(filter, schema)
    }

    /// Every field the filter reads, sorted and deduplicated. An update that changes
    /// none of them cannot change whether its item matches.
    pub fn reads_fields(&self) -> &[FieldId] {
        &self.fields_read
    }

    /// The first top-level equality conjunct on a bool, integer or string field:
    /// `field == literal` as the whole filter, or as a child of a top-level `all`
    /// (the first such child, so the choice is deterministic). Every item the filter
    /// accepts holds that value, so a view needs to look only at those items (see
    /// `key_index`). Equalities under `any` or `not` do not qualify, and neither do
    /// floats (`-0.0 == 0.0`, yet their bits differ).
    pub(crate) fn equality_key(&self) -> Option<(FieldId, Value<'_>)> {
        let key_of = |node: &Node| match *node {
            // A field read through a reference changes when its target does, which the
            // equality index does not follow: never a key.
            Node::Compare { field_id, op: CompareOp::Eq, literal } if !field_id.is_derived() => match literal {
                Literal::Bool(flag) => Some((field_id, Value::Bool(flag))),
                Literal::I64(number) => Some((field_id, Value::I64(number))),
                Literal::U64(number) => Some((field_id, Value::U64(number))),
                Literal::Str(index) => Some((field_id, Value::Str(&self.texts[index as usize]))),
                Literal::F64(_) => None,
            },
            _ => None,
        };
        match self.nodes[0] {
            Node::All { subtree_end } => {
                let mut child_index = 1;
                while child_index < subtree_end as usize {
                    if let Some(key) = key_of(&self.nodes[child_index]) {
                        return Some(key);
                    }
                    child_index = self.subtree_end(child_index);
                }
                None
            }
            ref root => key_of(root),
        }
    }

    /// Whether the item in `slot` passes. `collection` must have the schema the
    /// filter was compiled against.
    pub(crate) fn matches(&self, collection: &Collection, slot: Slot, scratch: &mut FilterScratch) -> bool {
        self.evaluate(0, &|field_id| collection.value(slot, field_id), scratch)
    }

    /// Appends to `out` every live slot of `collection` that passes. The common
    /// one-comparison filters on a bool or integer column (`left == false`) run as
    /// one tight loop over that column, which is what building a view over a million
    /// items needs; any other filter goes item by item.
    pub(crate) fn select_matching(&self, collection: &Collection, scratch: &mut FilterScratch, out: &mut Vec<Slot>) {
        match self.nodes[..] {
            [Node::Constant(result)] => {
                if result {
                    out.extend(collection.live_slots());
                }
            }
            [Node::Compare { field_id, op, literal }] => {
                match (collection.column(field_id), literal) {
                    (Column::Bool { values, present }, Literal::Bool(literal)) => {
                        // A null never matches.
                        out.extend(collection.live_slots().filter(|&slot| {
                            present.get(slot as usize) && satisfies(values.get(slot as usize).cmp(&literal), op)
                        }));
                    }
                    (Column::Word { bits, present }, Literal::U64(literal)) => {
                        out.extend(collection.live_slots().filter(|&slot| {
                            present[slot as usize] && satisfies(bits[slot as usize].cmp(&literal), op)
                        }));
                    }
                    (Column::Word { bits, present }, Literal::I64(literal)) => {
                        out.extend(collection.live_slots().filter(|&slot| {
                            present[slot as usize] && satisfies((bits[slot as usize] as i64).cmp(&literal), op)
                        }));
                    }
                    _ => out.extend(collection.live_slots().filter(|&slot| self.matches(collection, slot, scratch))),
                }
            }
            [Node::Contains { field_id, needle }] | [Node::Prefix { field_id, needle }] => {
                // Contains and prefix compile only on string fields.
                let column = collection.column(field_id);
                let needle = &self.needles[needle as usize];
                let is_contains = matches!(self.nodes[0], Node::Contains { .. });
                out.extend(collection.live_slots().filter(|&slot| {
                    let Some(text) = column.str_at(slot as usize) else { return false };
                    // A short string is whole in its head (the column's, or the
                    // dictionary's): test it there and skip the cache miss on the
                    // string's own buffer.
                    let text = text.text();
                    if is_contains {
                        contains_folded(text, needle, &mut scratch.folded_haystack)
                    } else {
                        starts_with_folded(text, needle)
                    }
                }));
            }
            _ => out.extend(collection.live_slots().filter(|&slot| self.matches(collection, slot, scratch))),
        }
    }

    /// Whether `item` passes. Allocates a fresh scratch buffer when a non-ASCII
    /// `contains` needs one; meant for tests and reference models, not hot paths.
    ///
    /// On an item of a collection with another schema the answer is meaningless, but
    /// this does not panic: fields past the end of that schema read as null.
    pub fn matches_item(&self, item: ItemRef<'_>) -> bool {
        let n_fields = item.schema().len();
        let read_field = |field_id: FieldId| {
            if field_id.index() < n_fields {
                item.field(field_id)
            } else {
                Value::Null
            }
        };
        self.evaluate(0, &read_field, &mut FilterScratch::default())
    }

    /// Evaluates the subtree rooted at `node_index`. Recursion is bounded by
    /// `MAX_FILTER_DEPTH`, which compilation enforces.
    ///
    /// Generic over how fields are read so that [`CompiledFilter::matches`] (collection
    /// and slot) and [`CompiledFilter::matches_item`] (an `ItemRef`) share one evaluator.
    fn evaluate<'value, ReadField>(
        &self,
        node_index: usize,
        read_field: &ReadField,
        scratch: &mut FilterScratch,
    ) -> bool
    where
        ReadField: Fn(FieldId) -> Value<'value>,
    {
        match self.nodes[node_index] {
            Node::Constant(result) => result,
            Node::Compare { field_id, op, literal } => {
                compare_with_literal(read_field(field_id), op, literal, &self.texts)
            }
            Node::CompareFields { field_id, op, other_field_id } => {
                compare_field_values(read_field(field_id), op, read_field(other_field_id))
            }
            Node::In { field_id, set } => is_in_set(read_field(field_id), &self.in_sets[set as usize]),
            Node::IsNull { field_id } => read_field(field_id).is_null(),
            Node::Contains { field_id, needle } => match read_field(field_id) {
                Value::Str(haystack) => {
                    contains_folded(haystack, &self.needles[needle as usize], &mut scratch.folded_haystack)
                }
                _ => false,
            },
            Node::Prefix { field_id, needle } => match read_field(field_id) {
                Value::Str(haystack) => starts_with_folded(haystack, &self.needles[needle as usize]),
                _ => false,
            },
            Node::All { subtree_end } => {
                let mut child_index = node_index + 1;
                while child_index < subtree_end as usize {
                    if !self.evaluate(child_index, read_field, scratch) {
                        return false;
                    }
                    child_index = self.subtree_end(child_index);
                }
                true
            }
            Node::Any { subtree_end } => {
                let mut child_index = node_index + 1;
                while child_index < subtree_end as usize {
                    if self.evaluate(child_index, read_field, scratch) {
                        return true;
                    }
                    child_index = self.subtree_end(child_index);
                }
                false
            }
            Node::Not { .. } => !self.evaluate(node_index + 1, read_field, scratch),
        }
    }

    /// One past the last node of the subtree rooted at `node_index`.
    fn subtree_end(&self, node_index: usize) -> usize {
        match self.nodes[node_index] {
            Node::All { subtree_end } | Node::Any { subtree_end } | Node::Not { subtree_end } => subtree_end as usize,
            _ => node_index + 1,
        }
    }
}

/// Maps -0.0 to 0.0. Filters compare floats numerically, where the two zeros are
/// equal, but `total_cmp` (used to sort and search `in` sets) tells them apart.
fn normalize_zero(number: f64) -> f64 {
    if number == 0.0 {
        0.0
    } else {
        number
    }
}

/// `value <op> literal`; false when the value is null, for every op including `Ne`.
fn compare_with_literal(value: Value<'_>, op: CompareOp, literal: Literal, texts: &[String]) -> bool {
    let ordering = match (value, literal) {
        (Value::Bool(value), Literal::Bool(literal)) => value.cmp(&literal),
        (Value::I64(value), Literal::I64(literal)) => value.cmp(&literal),
        (Value::U64(value), Literal::U64(literal)) => value.cmp(&literal),
        (Value::F64(value), Literal::F64(literal)) => match value.partial_cmp(&literal) {
            Some(ordering) => ordering,
            // Unreachable: batches refuse NaN values and compilation NaN literals.
            None => return false,
        },
        // `str` orders by bytes, which is what string comparisons promise.
        (Value::Str(value), Literal::Str(index)) => value.cmp(texts[index as usize].as_str()),
        // Null, or (on a collection with another schema) a value of the wrong type.
        _ => return false,
    };
    satisfies(ordering, op)
}

/// `left <op> right` for two fields of one item; false when either is null, for
/// every op including `Ne`. Integers of the two types compare exactly (through
/// `i128`, which holds every `i64` and `u64`).
fn compare_field_values(left: Value<'_>, op: CompareOp, right: Value<'_>) -> bool {
    let ordering = match (left, right) {
        (Value::Bool(left), Value::Bool(right)) => left.cmp(&right),
        (Value::I64(left), Value::I64(right)) => left.cmp(&right),
        (Value::U64(left), Value::U64(right)) => left.cmp(&right),
        (Value::I64(left), Value::U64(right)) => i128::from(left).cmp(&i128::from(right)),
        (Value::U64(left), Value::I64(right)) => i128::from(left).cmp(&i128::from(right)),
        (Value::F64(left), Value::F64(right)) => match left.partial_cmp(&right) {
            Some(ordering) => ordering,
            // Unreachable: batches refuse NaN values.
            None => return false,
        },
        (Value::Str(left), Value::Str(right)) => left.cmp(right),
        // Null on either side, or (on a collection with another schema) types the
        // compiler did not check.
        _ => return false,
    };
    satisfies(ordering, op)
}

/// Whether `value.cmp(literal) == ordering` satisfies `value <op> literal`.
#[inline]
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

fn is_in_set(value: Value<'_>, set: &InSet) -> bool {
    match (value, set) {
        (Value::Bool(flag), InSet::Bool { accepts_false, accepts_true }) => {
            if flag {
                *accepts_true
            } else {
                *accepts_false
            }
        }
        (Value::I64(number), InSet::I64(numbers)) => numbers.binary_search(&number).is_ok(),
        (Value::U64(number), InSet::U64(numbers)) => numbers.binary_search(&number).is_ok(),
        (Value::F64(number), InSet::F64(numbers)) => {
            let number = normalize_zero(number);
            numbers.binary_search_by(|candidate| candidate.total_cmp(&number)).is_ok()
        }
        (Value::Str(text), InSet::Str(texts)) => {
            texts.binary_search_by(|candidate| candidate.as_str().cmp(text)).is_ok()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::FieldType;
    use crate::value::OwnedValue;

    fn string_schema() -> Schema {
        Schema::new().with_field("name", FieldType::String)
    }

    /// A collection with one string field holding `text` in slot 0.
    fn collection_with_name(text: &str) -> Collection {
        let mut collection = Collection::new("test", string_schema());
        let slot = collection.insert_slot("item");
        collection.set_value(slot, FieldId(0), Value::Str(text));
        collection
    }

    fn name_matches(filter: &Filter, text: &str) -> bool {
        let schema = string_schema();
        let compiled = CompiledFilter::compile(filter, &schema).expect("filter compiles");
        let collection = collection_with_name(text);
        let slot = collection.find_slot("item").expect("item exists");
        let by_item = compiled.matches_item(collection.item(slot));
        let by_slot = compiled.matches(&collection, slot, &mut FilterScratch::default());
        assert_eq!(by_item, by_slot, "matches and matches_item disagree on {filter:?} over {text:?}");
        by_item
    }

    #[test]
    fn filter_case_folding_examples() {
        assert!(name_matches(&Filter::contains("name", "ß"), "STRASSE"));
        assert!(name_matches(&Filter::contains("name", "ß"), "strasse"));
        assert!(name_matches(&Filter::contains("name", "SS"), "straße"));
        assert!(name_matches(&Filter::prefix("name", "STRAS"), "straße"));
        assert!(name_matches(&Filter::prefix("name", "straß"), "STRASSE"));
        assert!(name_matches(&Filter::contains("name", "éc"), "ÉCOLE"));
        assert!(name_matches(&Filter::prefix("name", "éc"), "ÉCOLE"));
        assert!(name_matches(&Filter::contains("name", "ÉC"), "école"));
        assert!(name_matches(&Filter::contains("name", "σίσ"), "ΣΊΣΥΦΟΣ"));
        // Final sigma folds like the other two.
        assert!(name_matches(&Filter::contains("name", "ΟΣ"), "σίσυφος"));
        assert!(name_matches(&Filter::contains("name", "MEGA"), "Ωmega"));
        assert!(name_matches(&Filter::prefix("name", "ωM"), "Ωmega"));
        // Kelvin sign folds to ASCII 'k'; long s to 's'.
        assert!(name_matches(&Filter::contains("name", "k"), "\u{212A}elvin"));
        assert!(name_matches(&Filter::contains("name", "\u{212A}"), "KELVIN"));
        assert!(name_matches(&Filter::prefix("name", "ſ"), "Sun"));
        // "İ" folds to "i" + combining dot above, so the dotless "is" does not follow "i".
        assert!(name_matches(&Filter::contains("name", "stanbul"), "İstanbul"));
        assert!(name_matches(&Filter::prefix("name", "i"), "İstanbul"));
        assert!(!name_matches(&Filter::prefix("name", "ist"), "İstanbul"));
        assert!(name_matches(&Filter::prefix("name", "İst"), "İSTANBUL"));

        assert!(!name_matches(&Filter::contains("name", "ß"), "strase"));
        assert!(!name_matches(&Filter::contains("name", "é"), "ECOLE"));
        assert!(!name_matches(&Filter::prefix("name", "tras"), "straße"));
        assert!(!name_matches(&Filter::prefix("name", "straßen"), "STRASSE"));
        assert!(!name_matches(&Filter::prefix("name", "ΣΊΣΥΦΟΣ!"), "σίσυφος"));
    }

    #[test]
    fn filter_ascii_fast_path() {
        assert!(name_matches(&Filter::contains("name", "WORLD"), "hello world"));
        assert!(name_matches(&Filter::contains("name", "lo wo"), "HELLO WORLD"));
        assert!(!name_matches(&Filter::contains("name", "worlds"), "hello world"));
        assert!(name_matches(&Filter::prefix("name", "HeL"), "hello"));
        assert!(!name_matches(&Filter::prefix("name", "hello!"), "hello"));
        assert!(!name_matches(&Filter::prefix("name", "ello"), "hello"));
        // Non-letters are not folded.
        assert!(!name_matches(&Filter::contains("name", "@"), "`"));
        assert!(!name_matches(&Filter::contains("name", "["), "{"));
    }

    #[test]
    fn filter_empty_needle_matches_every_string_but_not_null() {
        for text in ["", "a", "Ωmega"] {
            assert!(name_matches(&Filter::contains("name", ""), text));
            assert!(name_matches(&Filter::prefix("name", ""), text));
        }
        let schema = string_schema();
        let mut collection = Collection::new("test", schema.clone());
        let slot = collection.insert_slot("null");
        for filter in [Filter::contains("name", ""), Filter::prefix("name", "")] {
            let compiled = CompiledFilter::compile(&filter, &schema).expect("filter compiles");
            assert!(!compiled.matches_item(collection.item(slot)));
            assert!(!compiled.matches(&collection, slot, &mut FilterScratch::default()));
        }
    }

    #[test]
    fn filter_scratch_is_reused_without_growing() {
        let schema = string_schema();
        let compiled = CompiledFilter::compile(&Filter::contains("name", "ü"), &schema).expect("compiles");
        let mut collection = Collection::new("test", schema);
        let long = collection.insert_slot("long");
        collection.set_value(long, FieldId(0), Value::Str("Grüße aus München, Überlingen und Düsseldorf"));
        let short = collection.insert_slot("short");
        collection.set_value(short, FieldId(0), Value::Str("Ärger"));
        let mut scratch = FilterScratch::default();
        assert!(compiled.matches(&collection, long, &mut scratch));
        let capacity = scratch.folded_haystack.capacity();
        for _ in 0..100 {
            assert!(compiled.matches(&collection, long, &mut scratch));
            assert!(!compiled.matches(&collection, short, &mut scratch));
        }
        assert_eq!(scratch.folded_haystack.capacity(), capacity);
    }

    #[test]
    fn filter_layout_is_flat_preorder() {
        let schema = Schema::new().with_field("a", FieldType::I64).with_field("b", FieldType::Bool);
        let filter = Filter::Any(vec![
            Filter::All(vec![
                Filter::eq("a", OwnedValue::I64(1)),
                Filter::Not(Box::new(Filter::eq("b", OwnedValue::Bool(true)))),
            ]),
            Filter::All(vec![]),
            Filter::is_null("a"),
        ]);
        let compiled = CompiledFilter::compile(&filter, &schema).expect("compiles");
        assert_eq!(compiled.nodes.len(), 7);
        assert_eq!(compiled.nodes[0], Node::Any { subtree_end: 7 });
        assert_eq!(compiled.nodes[1], Node::All { subtree_end: 5 });
        assert_eq!(compiled.nodes[3], Node::Not { subtree_end: 5 });
        assert_eq!(compiled.nodes[5], Node::Constant(true));
        assert_eq!(compiled.reads_fields(), &[FieldId(0), FieldId(1)]);
    }

    #[test]
    fn filter_equality_key_is_the_first_top_level_equality() {
        let schema = Schema::new()
            .with_field("owner", FieldType::String)
            .with_field("n", FieldType::I64)
            .with_field("u", FieldType::U64)
            .with_field("flag", FieldType::Bool)
            .with_field("ratio", FieldType::F64);
        let key = |filter: Filter| {
            let compiled = CompiledFilter::compile(&filter, &schema).expect("compiles");
            compiled.equality_key().map(|(field_id, value)| (field_id, value.to_owned_value()))
        };
        let owner = || Filter::eq("owner", OwnedValue::Str("u42".into()));
        assert_eq!(key(owner()), Some((FieldId(0), OwnedValue::Str("u42".into()))));
        assert_eq!(key(Filter::eq("n", OwnedValue::U64(3))), Some((FieldId(1), OwnedValue::I64(3))));
        assert_eq!(key(Filter::eq("u", OwnedValue::U64(3))), Some((FieldId(2), OwnedValue::U64(3))));
        assert_eq!(key(Filter::eq("flag", OwnedValue::Bool(false))), Some((FieldId(3), OwnedValue::Bool(false))));
        // The first qualifying conjunct, skipping what does not qualify.
        let filter = Filter::All(vec![
            Filter::eq("ratio", OwnedValue::F64(0.0)),
            Filter::Any(vec![Filter::eq("n", OwnedValue::I64(1))]),
            Filter::compare("u", CompareOp::Ne, OwnedValue::U64(1)),
            Filter::eq("flag", OwnedValue::Bool(true)),
            owner(),
        ]);
        assert_eq!(key(filter), Some((FieldId(3), OwnedValue::Bool(true))));
        // Never under `any`, `not`, or a nested `all`; never a float or another operator.
        assert_eq!(key(Filter::Any(vec![owner()])), None);
        assert_eq!(key(Filter::Not(Box::new(owner()))), None);
        assert_eq!(key(Filter::All(vec![Filter::All(vec![owner()])])), None);
        assert_eq!(key(Filter::eq("ratio", OwnedValue::F64(1.0))), None);
        assert_eq!(key(Filter::compare("n", CompareOp::Ge, OwnedValue::I64(1))), None);
        assert_eq!(key(Filter::True), None);
        assert_eq!(key(Filter::All(vec![])), None);
        // Two fields' equality pins no value: never a key, and skipped for the next conjunct.
        assert_eq!(key(Filter::compare_fields("n", CompareOp::Eq, "u")), None);
        assert_eq!(
            key(Filter::All(vec![Filter::compare_fields("owner", CompareOp::Eq, "owner"), owner()])),
            Some((FieldId(0), OwnedValue::Str("u42".into())))
        );
    }

    /// Every pool text against every needle, through `matches` with one shared scratch
    /// (as the engine uses it) and through `matches_item`, against the naive definition:
    /// fold both sides whole, then `str::contains` / `str::starts_with`.
    #[test]
    fn filter_shared_scratch_agrees_with_reference_folding() {
        const TEXTS: [&str; 16] = [
            "",
            "hello",
            "Strasse am See",
            "straße",
            "ÉCOLE",
            "école",
            "İstanbul",
            "ΣΊΣΥΦΟΣ",
            "\u{212A}elvin",
            "ſun",
            "ﬁne",
            "Ωmega",
            "x ss y",
            "日本語のテキスト",
            "Grüße aus München, Überlingen und Düsseldorf",
            "ǅemal",
        ];
        const NEEDLES: [&str; 20] = [
            "", "s", "SS", "ß", "e", "É", "éc", "i", "i\u{307}", "İ", "σ", "ς", "σίσ", "k", "\u{212A}", "fi", "MEGA",
            "テキ", "ÜBER", "ǆ",
        ];
        let schema = string_schema();
        let mut collection = Collection::new("test", schema.clone());
        let slots: Vec<Slot> = TEXTS
            .iter()
            .enumerate()
            .map(|(index, text)| {
                let slot = collection.insert_slot(&format!("item-{index}"));
                collection.set_value(slot, FieldId(0), Value::Str(text));
                slot
            })
            .collect();
        let mut scratch = FilterScratch::default();
        for needle in NEEDLES {
            let folded_needle = caseless::default_case_fold_str(needle);
            let contains = CompiledFilter::compile(&Filter::contains("name", needle), &schema).expect("compiles");
            let prefix = CompiledFilter::compile(&Filter::prefix("name", needle), &schema).expect("compiles");
            for (text, &slot) in TEXTS.iter().zip(&slots) {
                let folded_text = caseless::default_case_fold_str(text);
                let expected_contains = folded_text.contains(folded_needle.as_str());
                let expected_prefix = folded_text.starts_with(folded_needle.as_str());
                assert_eq!(
                    contains.matches(&collection, slot, &mut scratch),
                    expected_contains,
                    "{text:?} contains {needle:?}"
                );
                assert_eq!(
                    contains.matches_item(collection.item(slot)),
                    expected_contains,
                    "{text:?} contains {needle:?}"
                );
                assert_eq!(
                    prefix.matches(&collection, slot, &mut scratch),
                    expected_prefix,
                    "{text:?} prefix {needle:?}"
                );
                assert_eq!(prefix.matches_item(collection.item(slot)), expected_prefix, "{text:?} prefix {needle:?}");
            }
        }
    }
}
