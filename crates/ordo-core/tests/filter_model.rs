//! Filters through the public API: a model-based test against a naive reference
//! evaluator, one test per compile error, and the case-folding and accent examples.
//!
//! Items are put into an [`Engine`] collection with batches and read back as
//! `ItemRef`s, which [`CompiledFilter::matches_item`] evaluates.

use std::cmp::Ordering;

use unicode_normalization::char::canonical_combining_class;
use unicode_normalization::UnicodeNormalization;

use ordo_core::limits::{MAX_FILTER_DEPTH, MAX_FILTER_IN_VALUES, MAX_FILTER_NODES};
use ordo_core::{
    Batch, CollectionId, CompareOp, CompiledFilter, Engine, FieldId, FieldType, Filter, NullSink, OwnedValue, Schema,
    ViewError,
};

// The shared seeded generator (a failure prints its seed).
use ordo_test_kit::rng::Rng as Prng;

const FIELD_NAMES: [&str; 6] = ["flag", "signed", "unsigned", "float", "text", "other_text"];

fn model_schema() -> Schema {
    Schema::new()
        .with_field("flag", FieldType::Bool)
        .with_field("signed", FieldType::I64)
        .with_field("unsigned", FieldType::U64)
        .with_field("float", FieldType::F64)
        .with_field("text", FieldType::String)
        .with_field("other_text", FieldType::String)
}

const SIGNED_POOL: [i64; 9] = [i64::MIN, -1_000_000, -3, -1, 0, 1, 2, 7, i64::MAX];
const UNSIGNED_POOL: [u64; 8] = [0, 1, 2, 7, 1 << 40, 1 << 63, u64::MAX - 1, u64::MAX];
const FLOAT_POOL: [f64; 11] = [f64::NEG_INFINITY, -1e300, -2.5, -1.0, -0.0, 0.0, 1.0, 2.0, 7.0, 1e300, f64::INFINITY];
const TEXT_POOL: [&str; 30] = [
    "",
    "a",
    "abc",
    "ABC",
    "Ωmega",
    "ωMEGA",
    "straße",
    "STRASSE",
    "Strasse am See",
    "ÉCOLE",
    "école",
    "ECOLE",
    "İstanbul",
    "istanbul",
    "ΣΊΣΥΦΟΣ",
    "σίσυφος",
    "\u{212A}elvin",
    "kelvin",
    "ſun",
    "ﬁne",
    "x ss y",
    "mega",
    // Accents, precomposed and decomposed (canonically equivalent pairs).
    "Émile",
    "E\u{301}mile",
    "emile",
    "Việt Nam",
    "Vie\u{323}\u{302}t Nam",
    "Łódź",
    "Ångström",
    "A\u{30A}ngstro\u{308}m",
];

fn random_value(prng: &mut Prng, field_type: FieldType) -> OwnedValue {
    if prng.one_in(5) {
        return OwnedValue::Null;
    }
    match field_type {
        FieldType::Bool => OwnedValue::Bool(prng.one_in(2)),
        FieldType::I64 => OwnedValue::I64(*prng.pick(&SIGNED_POOL)),
        FieldType::U64 => OwnedValue::U64(*prng.pick(&UNSIGNED_POOL)),
        FieldType::F64 => OwnedValue::F64(*prng.pick(&FLOAT_POOL)),
        FieldType::String | FieldType::Ref(_) => OwnedValue::Str((*prng.pick(&TEXT_POOL)).to_owned()),
    }
}

/// A literal valid for `field_type`, sometimes of another integer type that
/// converts losslessly, to exercise conversion.
fn random_literal(prng: &mut Prng, field_type: FieldType) -> OwnedValue {
    match field_type {
        FieldType::Bool => OwnedValue::Bool(prng.one_in(2)),
        FieldType::I64 if prng.one_in(4) => OwnedValue::U64(*prng.pick(&[0, 1, 7, i64::MAX as u64])),
        FieldType::I64 => OwnedValue::I64(*prng.pick(&SIGNED_POOL)),
        FieldType::U64 if prng.one_in(4) => OwnedValue::I64(*prng.pick(&[0, 1, 7, i64::MAX])),
        FieldType::U64 => OwnedValue::U64(*prng.pick(&UNSIGNED_POOL)),
        FieldType::F64 => match prng.below(6) {
            0 => OwnedValue::I64(*prng.pick(&[-1, 0, 2, 7, -(1 << 53)])),
            1 => OwnedValue::U64(*prng.pick(&[0, 1, 7, 1 << 63])),
            _ => OwnedValue::F64(*prng.pick(&FLOAT_POOL)),
        },
        FieldType::String | FieldType::Ref(_) => OwnedValue::Str(random_needle(prng)),
    }
}

/// Mostly a piece of a pool string with its case changed, so that matches are common.
fn random_needle(prng: &mut Prng) -> String {
    let source: Vec<char> = prng.pick(&TEXT_POOL).chars().collect();
    let start = prng.below(source.len() + 1);
    let end = start + prng.below(source.len() - start + 1);
    let piece: String = source[start..end].iter().collect();
    match prng.below(5) {
        0 => piece.to_uppercase(),
        1 => piece.to_lowercase(),
        2 => (*prng.pick(&[
            "ß", "SS", "σ", "ς", "İ", "i\u{307}", "é", "k", "\u{212A}", "FI", "z", "e\u{301}", "\u{301}", "ô", "lodz",
            "ang",
        ]))
        .to_owned(),
        _ => piece,
    }
}

fn random_op(prng: &mut Prng, field_type: FieldType) -> CompareOp {
    if field_type == FieldType::Bool {
        *prng.pick(&[CompareOp::Eq, CompareOp::Ne])
    } else {
        *prng.pick(&[CompareOp::Eq, CompareOp::Ne, CompareOp::Lt, CompareOp::Le, CompareOp::Gt, CompareOp::Ge])
    }
}

fn random_filter(prng: &mut Prng, schema: &Schema, depth_left: usize) -> Filter {
    if depth_left > 0 && prng.below(5) < 2 {
        return match prng.below(3) {
            0 => Filter::All((0..prng.below(4)).map(|_| random_filter(prng, schema, depth_left - 1)).collect()),
            1 => Filter::Any((0..prng.below(4)).map(|_| random_filter(prng, schema, depth_left - 1)).collect()),
            _ => Filter::Not(Box::new(random_filter(prng, schema, depth_left - 1))),
        };
    }
    let field_name = *prng.pick(&FIELD_NAMES);
    let field_type = schema.field(schema.field_id(field_name).expect("pool names exist")).field_type;
    let field = field_name.to_owned();
    match prng.below(14) {
        0 => Filter::True,
        12 | 13 => random_field_comparison(prng, schema, field_name, field_type),
        1 => Filter::IsNull { field },
        2 | 3 => Filter::In { field, values: (0..prng.below(5)).map(|_| random_literal(prng, field_type)).collect() },
        4..=7 if field_type == FieldType::String => {
            let needle = random_needle(prng);
            let accent_insensitive = prng.one_in(2);
            if prng.one_in(2) {
                Filter::Contains { field, needle, accent_insensitive }
            } else {
                Filter::Prefix { field, prefix: needle, accent_insensitive }
            }
        }
        _ => Filter::Compare { field, op: random_op(prng, field_type), value: random_literal(prng, field_type) },
    }
}

/// `field <op> other` with `other` of a type the compiler accepts against
/// `field`'s: the same type, or the other integer type; often the field itself.
fn random_field_comparison(prng: &mut Prng, schema: &Schema, field: &str, field_type: FieldType) -> Filter {
    let is_integer = |field_type| matches!(field_type, FieldType::I64 | FieldType::U64);
    let comparable: Vec<&str> = FIELD_NAMES
        .iter()
        .copied()
        .filter(|other| {
            let other_type = schema.field(schema.field_id(other).expect("pool names exist")).field_type;
            other_type == field_type || (is_integer(field_type) && is_integer(other_type))
        })
        .collect();
    let other: &str = prng.pick::<&str>(&comparable);
    Filter::compare_fields(field, random_op(prng, field_type), other)
}

/// Numbers compared mathematically, whatever their representation.
fn reference_number(value: &OwnedValue) -> Option<f64> {
    match value {
        OwnedValue::I64(number) => Some(*number as f64),
        OwnedValue::U64(number) => Some(*number as f64),
        OwnedValue::F64(number) => Some(*number),
        _ => None,
    }
}

fn reference_integer(value: &OwnedValue) -> Option<i128> {
    match value {
        OwnedValue::I64(number) => Some(i128::from(*number)),
        OwnedValue::U64(number) => Some(i128::from(*number)),
        _ => None,
    }
}

fn reference_ordering(value: &OwnedValue, literal: &OwnedValue) -> Option<Ordering> {
    match (value, literal) {
        (OwnedValue::Null, _) => None,
        (OwnedValue::Bool(value), OwnedValue::Bool(literal)) => Some(value.cmp(literal)),
        (OwnedValue::Str(value), OwnedValue::Str(literal)) => Some(value.as_bytes().cmp(literal.as_bytes())),
        _ => match (reference_integer(value), reference_integer(literal)) {
            (Some(value), Some(literal)) => Some(value.cmp(&literal)),
            // Float literals against float fields; integer literals for floats are
            // generated only when exactly representable, so `as f64` is exact.
            _ => reference_number(value)?.partial_cmp(&reference_number(literal)?),
        },
    }
}

/// The search form, naively and with another normalizer than the engine's: NFD,
/// case fold, then (accent-insensitive) NFD again and every combining mark
/// dropped, then NFC.
fn reference_fold(text: &str, accent_insensitive: bool) -> String {
    let folded = caseless::default_case_fold_str(&text.nfd().collect::<String>());
    if accent_insensitive {
        folded.nfd().filter(|&character| canonical_combining_class(character) == 0).nfc().collect()
    } else {
        folded.nfc().collect()
    }
}

fn reference_matches(filter: &Filter, schema: &Schema, row: &[OwnedValue]) -> bool {
    let field_value = |name: &str| &row[schema.field_id(name).expect("known field").index()];
    match filter {
        Filter::True => true,
        Filter::Compare { field, op, value } => match reference_ordering(field_value(field), value) {
            None => false,
            Some(ordering) => match op {
                CompareOp::Eq => ordering.is_eq(),
                CompareOp::Ne => ordering.is_ne(),
                CompareOp::Lt => ordering.is_lt(),
                CompareOp::Le => ordering.is_le(),
                CompareOp::Gt => ordering.is_gt(),
                CompareOp::Ge => ordering.is_ge(),
            },
        },
        Filter::CompareFields { field, op, other } => match (field_value(field), field_value(other)) {
            (OwnedValue::Null, _) | (_, OwnedValue::Null) => false,
            (left, right) => reference_ordering(left, right).is_some_and(|ordering| match op {
                CompareOp::Eq => ordering.is_eq(),
                CompareOp::Ne => ordering.is_ne(),
                CompareOp::Lt => ordering.is_lt(),
                CompareOp::Le => ordering.is_le(),
                CompareOp::Gt => ordering.is_gt(),
                CompareOp::Ge => ordering.is_ge(),
            }),
        },
        Filter::In { field, values } => {
            values.iter().any(|literal| reference_ordering(field_value(field), literal) == Some(Ordering::Equal))
        }
        Filter::IsNull { field } => matches!(field_value(field), OwnedValue::Null),
        Filter::Contains { field, needle, accent_insensitive } => match field_value(field) {
            OwnedValue::Str(text) => {
                reference_fold(text, *accent_insensitive).contains(&reference_fold(needle, *accent_insensitive))
            }
            _ => false,
        },
        Filter::Prefix { field, prefix, accent_insensitive } => match field_value(field) {
            OwnedValue::Str(text) => {
                reference_fold(text, *accent_insensitive).starts_with(&reference_fold(prefix, *accent_insensitive))
            }
            _ => false,
        },
        Filter::All(children) => children.iter().all(|child| reference_matches(child, schema, row)),
        Filter::Any(children) => children.iter().any(|child| reference_matches(child, schema, row)),
        Filter::Not(child) => !reference_matches(child, schema, row),
    }
}

fn collect_field_names<'a>(filter: &'a Filter, names: &mut Vec<&'a str>) {
    match filter {
        Filter::True => {}
        Filter::Compare { field, .. }
        | Filter::In { field, .. }
        | Filter::IsNull { field }
        | Filter::Contains { field, .. }
        | Filter::Prefix { field, .. } => names.push(field),
        Filter::CompareFields { field, other, .. } => names.extend([field.as_str(), other.as_str()]),
        Filter::All(children) | Filter::Any(children) => {
            children.iter().for_each(|child| collect_field_names(child, names))
        }
        Filter::Not(child) => collect_field_names(child, names),
    }
}

/// A fresh engine holding one collection with `rows` (item ids `item-<index>`).
fn engine_with_rows(schema: &Schema, rows: &[Vec<OwnedValue>]) -> (Engine, CollectionId) {
    let mut engine = Engine::new();
    let collection_id = engine.create_collection("model", schema.clone()).expect("collection is created");
    let mut batch = Batch::new();
    for (item_index, row) in rows.iter().enumerate() {
        let mut upsert = batch.upsert(&format!("item-{item_index}"));
        for (field, value) in schema.fields().iter().zip(row) {
            // A new item starts with every field null, so nulls need not be set.
            if !matches!(value, OwnedValue::Null) {
                upsert = upsert.set(&field.name, value.as_value());
            }
        }
    }
    engine.apply_batch(collection_id, &batch, &mut NullSink).expect("batch is valid");
    (engine, collection_id)
}

#[test]
fn filter_model_random_filters_match_reference() {
    const N_SEEDS: u64 = 200;
    const N_ITEMS: usize = 24;
    const N_FILTERS_PER_SEED: usize = 40;
    let schema = model_schema();
    let mut n_matches = 0usize;
    let mut n_cases = 0usize;
    for seed in 0..N_SEEDS {
        let mut prng = Prng(seed);
        let rows: Vec<Vec<OwnedValue>> = (0..N_ITEMS)
            .map(|_| schema.fields().iter().map(|field| random_value(&mut prng, field.field_type)).collect())
            .collect();
        let (engine, collection_id) = engine_with_rows(&schema, &rows);
        let collection = engine.collection(collection_id).expect("collection exists");
        for _ in 0..N_FILTERS_PER_SEED {
            let filter = random_filter(&mut prng, &schema, 4);
            let compiled = match CompiledFilter::compile(&filter, &schema) {
                Ok(compiled) => compiled,
                Err(error) => panic!("seed {seed}: valid filter refused ({error}): {filter:?}"),
            };
            let mut names = Vec::new();
            collect_field_names(&filter, &mut names);
            let mut expected_fields: Vec<FieldId> =
                names.iter().map(|name| schema.field_id(name).expect("known field")).collect();
            expected_fields.sort_unstable();
            expected_fields.dedup();
            assert_eq!(compiled.reads_fields(), expected_fields.as_slice(), "seed {seed}: {filter:?}");
            for (item_index, row) in rows.iter().enumerate() {
                let item = collection.get(&format!("item-{item_index}")).expect("item exists");
                let expected = reference_matches(&filter, &schema, row);
                let actual = compiled.matches_item(item);
                assert_eq!(actual, expected, "seed {seed}: filter {filter:?}\nrow: {row:?}");
                n_matches += expected as usize;
                n_cases += 1;
            }
        }
    }
    // Guards against a generator that only ever produces true or false.
    assert!(n_matches > n_cases / 10 && n_matches < n_cases * 9 / 10, "{n_matches} of {n_cases}");
}

// ----- Compile errors: one test per kind. -----

fn compile_error(filter: &Filter) -> ViewError {
    match CompiledFilter::compile(filter, &model_schema()) {
        Ok(_) => panic!("expected a compile error for {filter:?}"),
        Err(error) => error,
    }
}

fn compiles(filter: &Filter) -> bool {
    CompiledFilter::compile(filter, &model_schema()).is_ok()
}

fn wrong_type(field: &str, expected: &'static str, found: &'static str) -> ViewError {
    ViewError::WrongType { field: field.to_owned(), expected, found }
}

/// `depth` nested `not`s around a leaf.
fn nested_nots(depth: usize) -> Filter {
    (0..depth).fold(Filter::True, |inner, _| Filter::Not(Box::new(inner)))
}

#[test]
fn filter_compile_error_unknown_field() {
    let unknown = ViewError::UnknownField { field: "missing".to_owned() };
    assert_eq!(compile_error(&Filter::eq("missing", OwnedValue::I64(1))), unknown);
    assert_eq!(compile_error(&Filter::is_null("missing")), unknown);
    assert_eq!(compile_error(&Filter::contains("missing", "x")), unknown);
    assert_eq!(compile_error(&Filter::prefix("missing", "x")), unknown);
    assert_eq!(compile_error(&Filter::In { field: "missing".to_owned(), values: vec![] }), unknown);
    // Found inside combinators too.
    let nested = Filter::All(vec![Filter::True, Filter::Not(Box::new(Filter::is_null("missing")))]);
    assert_eq!(compile_error(&nested), unknown);
}

#[test]
fn filter_compile_error_wrong_type() {
    assert_eq!(
        compile_error(&Filter::eq("signed", OwnedValue::Str("1".to_owned()))),
        wrong_type("signed", "i64", "string")
    );
    assert_eq!(compile_error(&Filter::eq("text", OwnedValue::I64(1))), wrong_type("text", "string", "i64"));
    assert_eq!(compile_error(&Filter::eq("flag", OwnedValue::I64(1))), wrong_type("flag", "bool", "i64"));
    assert_eq!(compile_error(&Filter::eq("signed", OwnedValue::Bool(true))), wrong_type("signed", "i64", "bool"));
    // A float never converts to an integer field, even a whole one.
    assert_eq!(compile_error(&Filter::eq("signed", OwnedValue::F64(3.0))), wrong_type("signed", "i64", "f64"));
    assert_eq!(compile_error(&Filter::eq("unsigned", OwnedValue::F64(3.0))), wrong_type("unsigned", "u64", "f64"));
    // Integers convert only losslessly.
    assert_eq!(compile_error(&Filter::eq("unsigned", OwnedValue::I64(-1))), wrong_type("unsigned", "u64", "i64"));
    assert_eq!(
        compile_error(&Filter::eq("signed", OwnedValue::U64(i64::MAX as u64 + 1))),
        wrong_type("signed", "i64", "u64")
    );
    assert_eq!(compile_error(&Filter::eq("float", OwnedValue::I64((1 << 53) + 1))), wrong_type("float", "f64", "i64"));
    assert_eq!(compile_error(&Filter::eq("float", OwnedValue::I64(i64::MAX))), wrong_type("float", "f64", "i64"));
    assert_eq!(compile_error(&Filter::eq("float", OwnedValue::U64(u64::MAX))), wrong_type("float", "f64", "u64"));
    // Checked inside `in` lists as well.
    let in_list = Filter::In { field: "unsigned".to_owned(), values: vec![OwnedValue::U64(1), OwnedValue::I64(-5)] };
    assert_eq!(compile_error(&in_list), wrong_type("unsigned", "u64", "i64"));

    // The lossless conversions are accepted.
    assert!(compiles(&Filter::eq("unsigned", OwnedValue::I64(0))));
    assert!(compiles(&Filter::eq("unsigned", OwnedValue::I64(i64::MAX))));
    assert!(compiles(&Filter::eq("signed", OwnedValue::U64(i64::MAX as u64))));
    assert!(compiles(&Filter::eq("float", OwnedValue::I64(1 << 53))));
    assert!(compiles(&Filter::eq("float", OwnedValue::I64(i64::MIN))));
    assert!(compiles(&Filter::eq("float", OwnedValue::U64(1 << 63))));
}

#[test]
fn filter_compile_error_null_literal() {
    let null_literal = ViewError::NullLiteral { field: "signed".to_owned() };
    assert_eq!(compile_error(&Filter::eq("signed", OwnedValue::Null)), null_literal);
    assert_eq!(compile_error(&Filter::compare("signed", CompareOp::Ne, OwnedValue::Null)), null_literal);
    let in_list = Filter::In { field: "signed".to_owned(), values: vec![OwnedValue::I64(1), OwnedValue::Null] };
    assert_eq!(compile_error(&in_list), null_literal);
}

#[test]
fn filter_compile_error_not_a_number() {
    let not_a_number = ViewError::NotANumber { field: "float".to_owned() };
    assert_eq!(compile_error(&Filter::eq("float", OwnedValue::F64(f64::NAN))), not_a_number);
    assert_eq!(compile_error(&Filter::compare("float", CompareOp::Lt, OwnedValue::F64(-f64::NAN))), not_a_number);
    let in_list =
        Filter::In { field: "float".to_owned(), values: vec![OwnedValue::F64(1.0), OwnedValue::F64(f64::NAN)] };
    assert_eq!(compile_error(&in_list), not_a_number);
    assert!(compiles(&Filter::eq("float", OwnedValue::F64(f64::INFINITY))));
}

#[test]
fn filter_compile_error_not_applicable() {
    let not_applicable = |field: &str, operation: &'static str, field_type: &'static str| ViewError::NotApplicable {
        field: field.to_owned(),
        operation,
        field_type,
    };
    assert_eq!(compile_error(&Filter::contains("signed", "1")), not_applicable("signed", "contains", "i64"));
    assert_eq!(compile_error(&Filter::contains("flag", "t")), not_applicable("flag", "contains", "bool"));
    assert_eq!(compile_error(&Filter::prefix("float", "1")), not_applicable("float", "prefix", "f64"));
    assert_eq!(compile_error(&Filter::prefix("unsigned", "1")), not_applicable("unsigned", "prefix", "u64"));
    for (op, symbol) in [(CompareOp::Lt, "<"), (CompareOp::Le, "<="), (CompareOp::Gt, ">"), (CompareOp::Ge, ">=")] {
        let filter = Filter::compare("flag", op, OwnedValue::Bool(true));
        assert_eq!(compile_error(&filter), not_applicable("flag", symbol, "bool"));
    }
    assert!(compiles(&Filter::compare("flag", CompareOp::Eq, OwnedValue::Bool(true))));
    assert!(compiles(&Filter::compare("flag", CompareOp::Ne, OwnedValue::Bool(false))));
    assert!(compiles(&Filter::In { field: "flag".to_owned(), values: vec![OwnedValue::Bool(false)] }));
}

#[test]
fn filter_compile_error_incomparable_fields() {
    let incomparable = |field: &str, field_type, other: &str, other_type| ViewError::IncomparableFields {
        field: field.to_owned(),
        field_type,
        other: other.to_owned(),
        other_type,
    };
    let compare = |field: &str, other: &str| Filter::compare_fields(field, CompareOp::Lt, other);
    assert_eq!(compile_error(&compare("text", "signed")), incomparable("text", "string", "signed", "i64"));
    assert_eq!(compile_error(&compare("flag", "unsigned")), incomparable("flag", "bool", "unsigned", "u64"));
    // A float against an integer is refused rather than rounded, either way round.
    assert_eq!(compile_error(&compare("float", "signed")), incomparable("float", "f64", "signed", "i64"));
    assert_eq!(compile_error(&compare("unsigned", "float")), incomparable("unsigned", "u64", "float", "f64"));
    // Found inside combinators, and unknown names on either side are named.
    let nested = Filter::Not(Box::new(Filter::Any(vec![Filter::True, compare("text", "flag")])));
    assert_eq!(compile_error(&nested), incomparable("text", "string", "flag", "bool"));
    assert_eq!(compile_error(&compare("signed", "missing")), ViewError::UnknownField { field: "missing".to_owned() });
    assert_eq!(compile_error(&compare("missing", "signed")), ViewError::UnknownField { field: "missing".to_owned() });
    // Bools compare for equality only, as with a literal.
    assert_eq!(
        compile_error(&Filter::compare_fields("flag", CompareOp::Gt, "flag")),
        ViewError::NotApplicable { field: "flag".to_owned(), operation: ">", field_type: "bool" }
    );
    assert!(compiles(&Filter::compare_fields("flag", CompareOp::Ne, "flag")));
    assert!(compiles(&compare("signed", "unsigned")));
    assert!(compiles(&compare("unsigned", "signed")));
    assert!(compiles(&compare("float", "float")));
    assert!(compiles(&compare("text", "other_text")));
}

/// `i64` against `u64` compares the numbers, not a rounding of them: through
/// `f64`, `i64::MAX` and `2^63` would be equal, and `-1` against `u64::MAX`
/// would wrap if cast.
#[test]
fn filter_field_comparison_of_integers_is_exact_across_types() {
    let schema = Schema::new().with_field("signed", FieldType::I64).with_field("unsigned", FieldType::U64);
    let cases: [(Option<i64>, Option<u64>, Option<Ordering>); 7] = [
        (Some(i64::MAX), Some(1 << 63), Some(Ordering::Less)),
        (Some(i64::MAX), Some(i64::MAX as u64), Some(Ordering::Equal)),
        (Some(-1), Some(u64::MAX), Some(Ordering::Less)),
        (Some(i64::MIN), Some(0), Some(Ordering::Less)),
        (Some(0), Some(0), Some(Ordering::Equal)),
        (Some(7), None, None),
        (None, Some(7), None),
    ];
    let ops = [CompareOp::Eq, CompareOp::Ne, CompareOp::Lt, CompareOp::Le, CompareOp::Gt, CompareOp::Ge];
    for (signed, unsigned, ordering) in cases {
        let rows = vec![vec![
            signed.map_or(OwnedValue::Null, OwnedValue::I64),
            unsigned.map_or(OwnedValue::Null, OwnedValue::U64),
        ]];
        let (engine, collection_id) = engine_with_rows(&schema, &rows);
        let item = engine.collection(collection_id).unwrap().get("item-0").unwrap();
        for op in ops {
            let expected = ordering.is_some_and(|ordering| match op {
                CompareOp::Eq => ordering.is_eq(),
                CompareOp::Ne => ordering.is_ne(),
                CompareOp::Lt => ordering.is_lt(),
                CompareOp::Le => ordering.is_le(),
                CompareOp::Gt => ordering.is_gt(),
                CompareOp::Ge => ordering.is_ge(),
            });
            let forward = CompiledFilter::compile(&Filter::compare_fields("signed", op, "unsigned"), &schema).unwrap();
            assert_eq!(forward.matches_item(item), expected, "{signed:?} {op:?} {unsigned:?}");
            // The same comparison written the other way round: the ordering reverses.
            let backward_expected = ordering.is_some_and(|ordering| match op {
                CompareOp::Eq => ordering.is_eq(),
                CompareOp::Ne => ordering.is_ne(),
                CompareOp::Lt => ordering.is_gt(),
                CompareOp::Le => ordering.is_ge(),
                CompareOp::Gt => ordering.is_lt(),
                CompareOp::Ge => ordering.is_le(),
            });
            let backward = CompiledFilter::compile(&Filter::compare_fields("unsigned", op, "signed"), &schema).unwrap();
            assert_eq!(backward.matches_item(item), backward_expected, "{unsigned:?} {op:?} {signed:?}");
        }
    }
}

#[test]
fn filter_compile_error_too_deep() {
    let too_deep = ViewError::FilterTooDeep { depth_max: MAX_FILTER_DEPTH };
    assert!(compiles(&nested_nots(MAX_FILTER_DEPTH)));
    assert_eq!(compile_error(&nested_nots(MAX_FILTER_DEPTH + 1)), too_deep);
    // Every combinator counts towards the depth.
    let mixed = (0..=MAX_FILTER_DEPTH).fold(Filter::True, |inner, level| match level % 3 {
        0 => Filter::All(vec![inner]),
        1 => Filter::Any(vec![inner]),
        _ => Filter::Not(Box::new(inner)),
    });
    assert_eq!(compile_error(&mixed), too_deep);
    // Refused promptly, without recursing through the whole of a hostile input.
    assert_eq!(compile_error(&nested_nots(10_000)), too_deep);
}

#[test]
fn filter_compile_error_too_large() {
    let too_large = ViewError::FilterTooLarge { n_nodes_max: MAX_FILTER_NODES };
    // An `all` node plus its children.
    let wide = |n_children: usize| Filter::All(vec![Filter::True; n_children]);
    assert!(compiles(&wide(MAX_FILTER_NODES - 1)));
    assert_eq!(compile_error(&wide(MAX_FILTER_NODES)), too_large);
    assert_eq!(compile_error(&wide(1_000_000)), too_large);
    // Nodes are counted across the whole tree, leaves and combinators alike.
    let branch = || Filter::Any(vec![Filter::is_null("text"), Filter::Not(Box::new(Filter::True))]);
    let n_branches_fitting = (MAX_FILTER_NODES - 1) / 4;
    assert!(compiles(&Filter::All(vec![branch(); n_branches_fitting])));
    assert_eq!(compile_error(&Filter::All(vec![branch(); n_branches_fitting + 1])), too_large);
}

#[test]
fn filter_compile_error_too_many_in_values() {
    let in_list = |n_values: usize| Filter::In {
        field: "unsigned".to_owned(),
        values: (0..n_values as u64).map(OwnedValue::U64).collect(),
    };
    assert!(compiles(&in_list(MAX_FILTER_IN_VALUES)));
    assert_eq!(
        compile_error(&in_list(MAX_FILTER_IN_VALUES + 1)),
        ViewError::TooManyInValues { n_values_max: MAX_FILTER_IN_VALUES }
    );
}

// ----- Semantics through `matches_item`. -----

/// Whether each of `texts` (in the `text` field) passes `filter`.
fn text_matches(filter: &Filter, texts: &[&str]) -> Vec<bool> {
    let schema = Schema::new().with_field("text", FieldType::String);
    let rows: Vec<Vec<OwnedValue>> = texts.iter().map(|text| vec![OwnedValue::Str((*text).to_owned())]).collect();
    let (engine, collection_id) = engine_with_rows(&schema, &rows);
    let collection = engine.collection(collection_id).expect("collection exists");
    let compiled = CompiledFilter::compile(filter, &schema).expect("filter compiles");
    (0..texts.len())
        .map(|index| compiled.matches_item(collection.get(&format!("item-{index}")).expect("item exists")))
        .collect()
}

#[test]
fn filter_case_folding_examples() {
    assert_eq!(text_matches(&Filter::contains("text", "ß"), &["STRASSE", "strasse", "Strase"]), [true, true, false]);
    assert_eq!(text_matches(&Filter::prefix("text", "STRAS"), &["straße", "STRASSE", "Stra"]), [true, true, false]);
    assert_eq!(text_matches(&Filter::contains("text", "éc"), &["ÉCOLE", "école", "ECOLE"]), [true, true, false]);
    assert_eq!(text_matches(&Filter::contains("text", "σίσ"), &["ΣΊΣΥΦΟΣ", "σίσυφος", "ΣΙΣΥΦΟΣ"]), [true, true, false]);
    assert_eq!(text_matches(&Filter::contains("text", "ΟΣ"), &["σίσυφος"]), [true]);
    assert_eq!(text_matches(&Filter::contains("text", "MEGA"), &["Ωmega", "omeg"]), [true, false]);
    assert_eq!(text_matches(&Filter::contains("text", ""), &["", "x", "Ωmega"]), [true, true, true]);
    assert_eq!(text_matches(&Filter::prefix("text", ""), &["", "x", "Ωmega"]), [true, true, true]);
}

#[test]
fn filter_accent_and_normalization_examples() {
    let names = ["Émile", "E\u{301}mile", "emile", "EMILE", "Emil", "Zoë"];
    // Canonically equivalent spellings match each other; accents count by default.
    assert_eq!(text_matches(&Filter::contains("text", "émile"), &names), [true, true, false, false, false, false]);
    assert_eq!(
        text_matches(&Filter::contains("text", "e\u{301}mile"), &names),
        [true, true, false, false, false, false]
    );
    // Accent-insensitive: every spelling of Émile, whatever the needle's accents.
    let accentless = Filter::contains("text", "emile").accent_insensitive();
    assert_eq!(text_matches(&accentless, &names), [true, true, true, true, false, false]);
    let accented = Filter::contains("text", "ÉMILE").accent_insensitive();
    assert_eq!(text_matches(&accented, &names), [true, true, true, true, false, false]);
    assert_eq!(
        text_matches(&Filter::prefix("text", "zoe").accent_insensitive(), &names),
        [false; 5].into_iter().chain([true]).collect::<Vec<_>>()
    );
    assert_eq!(text_matches(&Filter::prefix("text", "zoe"), &names), [false; 6]);
    // German and Swedish letters lose their marks; letters without a decomposition do not.
    let words = ["Müller", "Mueller", "Ångström", "Øresund", "Łódź"];
    assert_eq!(
        text_matches(&Filter::contains("text", "muller").accent_insensitive(), &words),
        [true, false, false, false, false]
    );
    assert_eq!(
        text_matches(&Filter::prefix("text", "angstrom").accent_insensitive(), &words),
        [false, false, true, false, false]
    );
    assert_eq!(text_matches(&Filter::prefix("text", "oresund").accent_insensitive(), &words), [false; 5]);
    assert_eq!(text_matches(&Filter::contains("text", "lodz").accent_insensitive(), &words), [false; 5]);
    assert_eq!(
        text_matches(&Filter::contains("text", "łodz").accent_insensitive(), &words),
        [false, false, false, false, true]
    );
}

#[test]
fn filter_null_fails_every_comparison() {
    let schema = model_schema();
    let rows = vec![vec![OwnedValue::Null; schema.len()]];
    let (engine, collection_id) = engine_with_rows(&schema, &rows);
    let item = engine.collection(collection_id).expect("collection exists").get("item-0").expect("item exists");
    let passes = |filter: Filter| CompiledFilter::compile(&filter, &schema).expect("compiles").matches_item(item);
    let literals = [
        ("flag", OwnedValue::Bool(false)),
        ("signed", OwnedValue::I64(0)),
        ("unsigned", OwnedValue::U64(0)),
        ("float", OwnedValue::F64(0.0)),
        ("text", OwnedValue::Str(String::new())),
    ];
    for (field, literal) in literals {
        let ops: &[CompareOp] = if field == "flag" {
            &[CompareOp::Eq, CompareOp::Ne]
        } else {
            &[CompareOp::Eq, CompareOp::Ne, CompareOp::Lt, CompareOp::Le, CompareOp::Gt, CompareOp::Ge]
        };
        for &op in ops {
            assert!(!passes(Filter::compare(field, op, literal.clone())), "{field} {op:?} on null");
            assert!(passes(Filter::Not(Box::new(Filter::compare(field, op, literal.clone())))), "not {field} {op:?}");
        }
        assert!(!passes(Filter::In { field: field.to_owned(), values: vec![literal.clone()] }));
        assert!(passes(Filter::is_null(field)));
    }
    assert!(!passes(Filter::contains("text", "")));
    assert!(!passes(Filter::prefix("text", "")));
    assert!(passes(Filter::All(vec![])));
    assert!(!passes(Filter::Any(vec![])));
    assert!(passes(Filter::True));
}

#[test]
fn filter_values_compare_by_type() {
    let schema = model_schema();
    let rows = vec![vec![
        OwnedValue::Bool(true),
        OwnedValue::I64(-5),
        OwnedValue::U64(u64::MAX),
        OwnedValue::F64(-0.0),
        OwnedValue::Str("a".to_owned()),
    ]];
    let (engine, collection_id) = engine_with_rows(&schema, &rows);
    let item = engine.collection(collection_id).expect("collection exists").get("item-0").expect("item exists");
    let passes = |filter: Filter| CompiledFilter::compile(&filter, &schema).expect("compiles").matches_item(item);

    assert!(passes(Filter::eq("flag", OwnedValue::Bool(true))));
    assert!(passes(Filter::compare("flag", CompareOp::Ne, OwnedValue::Bool(false))));
    assert!(passes(Filter::compare("signed", CompareOp::Lt, OwnedValue::U64(0))));
    assert!(passes(Filter::compare("signed", CompareOp::Ge, OwnedValue::I64(i64::MIN))));
    assert!(passes(Filter::compare("unsigned", CompareOp::Gt, OwnedValue::I64(i64::MAX))));
    // The two zeros are numerically equal, in comparisons and in `in` sets.
    assert!(passes(Filter::eq("float", OwnedValue::F64(0.0))));
    assert!(!passes(Filter::compare("float", CompareOp::Lt, OwnedValue::F64(0.0))));
    assert!(passes(Filter::In { field: "float".to_owned(), values: vec![OwnedValue::F64(0.0)] }));
    assert!(passes(Filter::In { field: "float".to_owned(), values: vec![OwnedValue::I64(0)] }));
    assert!(passes(Filter::compare("float", CompareOp::Gt, OwnedValue::F64(f64::NEG_INFINITY))));
    // Strings compare by bytes: uppercase sorts before lowercase, non-ASCII after ASCII.
    assert!(passes(Filter::compare("text", CompareOp::Gt, OwnedValue::Str("B".to_owned()))));
    assert!(passes(Filter::compare("text", CompareOp::Lt, OwnedValue::Str("é".to_owned()))));
    assert!(!passes(Filter::eq("text", OwnedValue::Str("A".to_owned()))));
    let many: Vec<OwnedValue> = (0..1000).map(|index| OwnedValue::Str(format!("{index}"))).collect();
    assert!(!passes(Filter::In { field: "text".to_owned(), values: many.clone() }));
    let mut with_a = many;
    with_a.push(OwnedValue::Str("a".to_owned()));
    assert!(passes(Filter::In { field: "text".to_owned(), values: with_a }));
    assert!(!passes(Filter::In { field: "text".to_owned(), values: vec![] }));
}

#[test]
fn filter_reads_fields_are_deduplicated_and_sorted() {
    let schema = model_schema();
    let field = |name: &str| schema.field_id(name).expect("known field");
    let filter = Filter::Any(vec![
        Filter::contains("text", "x"),
        Filter::Not(Box::new(Filter::eq("signed", OwnedValue::I64(1)))),
        Filter::is_null("text"),
        Filter::True,
    ]);
    let compiled = CompiledFilter::compile(&filter, &schema).expect("compiles");
    assert_eq!(compiled.reads_fields(), &[field("signed"), field("text")]);
    let constant = CompiledFilter::compile(&Filter::True, &schema).expect("compiles");
    assert!(constant.reads_fields().is_empty());
}
