//! The limit on fields read through references (`limits::MAX_DERIVED_FIELDS`):
//! each distinct `ref.field` name a collection's views read costs a derived
//! column on every referencing item, so their number is bounded. Tested at its
//! edge: the last name under the limit opens, the next is refused and leaves
//! nothing behind, and names already derived stay free to reuse.

use ordo_core::{limits, CollectingSink, Engine, FieldType, Filter, Schema, SortKey, ViewDef, ViewError};

/// Target fields per reference: two references over them give more distinct
/// names than the limit allows.
const TARGET_FIELDS: usize = 40;

fn sorted_by(names: &[String]) -> ViewDef {
    ViewDef::new(Filter::True, names.iter().map(|name| SortKey::asc(name)).collect())
}

#[test]
fn the_derived_field_after_the_last_allowed_is_refused_and_leaves_nothing_behind() {
    const { assert!(2 * TARGET_FIELDS > limits::MAX_DERIVED_FIELDS, "the test needs more names than the limit") };
    let mut engine = Engine::new();
    let mut rooms_schema = Schema::new();
    for i in 0..TARGET_FIELDS {
        rooms_schema = rooms_schema.with_field(&format!("f{i}"), FieldType::U64);
    }
    let rooms = engine.create_collection("rooms", rooms_schema).unwrap();
    let members = engine
        .create_collection(
            "members",
            Schema::new().with_field("a", FieldType::Ref(rooms)).with_field("b", FieldType::Ref(rooms)),
        )
        .unwrap();
    let mut sink = CollectingSink::new();
    // Every name through `a`, then through `b` until the limit, a few per view
    // (a view has at most `MAX_SORT_KEYS` keys).
    let names: Vec<String> =
        (0..TARGET_FIELDS).map(|i| format!("a.f{i}")).chain((0..TARGET_FIELDS).map(|i| format!("b.f{i}"))).collect();
    let (allowed, refused) = names.split_at(limits::MAX_DERIVED_FIELDS);
    for chunk in allowed.chunks(limits::MAX_SORT_KEYS) {
        engine.open_window(members, &sorted_by(chunk), 0, 10, &mut sink).unwrap();
    }

    // One new name past the limit, alone or next to names already derived.
    let next = &refused[..1];
    for view in [sorted_by(next), sorted_by(&[allowed[0].clone(), next[0].clone()])] {
        let error = engine.open_window(members, &view, 0, 10, &mut sink).unwrap_err();
        assert!(
            matches!(error, ViewError::TooManyDerivedFields { n_fields_max } if n_fields_max == limits::MAX_DERIVED_FIELDS),
            "{error:?}"
        );
        assert!(error.to_string().contains(&limits::MAX_DERIVED_FIELDS.to_string()), "{error}");
    }
    // The refusals derived nothing: a view of names already derived still opens,
    // and the next name is still refused (not taken by a failed attempt).
    engine.open_window(members, &sorted_by(&allowed[limits::MAX_DERIVED_FIELDS - 3..]), 0, 10, &mut sink).unwrap();
    assert!(matches!(
        engine.open_window(members, &sorted_by(next), 0, 10, &mut sink),
        Err(ViewError::TooManyDerivedFields { .. })
    ));
}
