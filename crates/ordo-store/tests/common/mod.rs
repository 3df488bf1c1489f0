//! Shared by the store's tests: a seeded generator of batches, and a reference
//! model of a collection that applies them with plain maps (written apart from
//! both the engine and the store's merge code, so that the tests compare).

#![allow(dead_code)]

use std::collections::BTreeMap;

use ordo_core::{Batch, Engine, FieldType, OwnedItem, OwnedValue, Schema, Value};

/// The shared seeded generator (a failure prints its seed).
pub use ordo_test_kit::rng::Rng;

/// Every field type, so that every encoding is exercised.
pub fn test_schema() -> Schema {
    Schema::new()
        .with_field("name", FieldType::String)
        .with_field("recency", FieldType::U64)
        .with_field("unread", FieldType::U64)
        .with_field("is_dm", FieldType::Bool)
        .with_field("score", FieldType::F64)
        .with_field("delta", FieldType::I64)
}

/// One generated operation, kept apart from `Batch` so the model never reads the
/// engine's own representation.
#[derive(Clone, Debug)]
pub enum GenOp {
    Upsert { id: String, fields: Vec<(&'static str, OwnedValue)>, payload: Option<Vec<u8>> },
    Remove { id: String },
}

const NAMES: [&str; 8] =
    ["alpha", "Beta", "gamma", "Zoë", "émile", "", "a much longer room name than the head", "ßtraße"];

fn random_value(rng: &mut Rng, field: &'static str) -> OwnedValue {
    if rng.chance(10) {
        return OwnedValue::Null;
    }
    match field {
        "name" => OwnedValue::Str(format!("{}{}", NAMES[rng.below(NAMES.len())], rng.below(50))),
        "recency" | "unread" => OwnedValue::U64(rng.below(1000) as u64),
        "is_dm" => OwnedValue::Bool(rng.chance(50)),
        "score" => OwnedValue::F64([-1.5, 0.0, 2.25, f64::INFINITY, -0.0][rng.below(5)]),
        _ => OwnedValue::I64(rng.below(2000) as i64 - 1000),
    }
}

/// A batch of 1..=`max_ops` operations on ids `{prefix}0 .. {prefix}{n_ids-1}`.
pub fn random_ops(rng: &mut Rng, prefix: &str, n_ids: usize, max_ops: usize) -> Vec<GenOp> {
    const FIELDS: [&str; 6] = ["name", "recency", "unread", "is_dm", "score", "delta"];
    let n_ops = 1 + rng.below(max_ops);
    (0..n_ops)
        .map(|_| {
            let id = format!("{prefix}{}", rng.below(n_ids));
            if rng.chance(15) {
                return GenOp::Remove { id };
            }
            let n_fields = rng.below(FIELDS.len() + 1);
            let mut fields: Vec<(&'static str, OwnedValue)> = Vec::with_capacity(n_fields);
            for _ in 0..n_fields {
                let field = FIELDS[rng.below(FIELDS.len())];
                let value = random_value(rng, field);
                // An op sets each field once (the engine refuses a repeat): a field
                // drawn again keeps its place and takes the value drawn last.
                match fields.iter_mut().find(|(named, _)| *named == field) {
                    Some((_, earlier)) => *earlier = value,
                    None => fields.push((field, value)),
                }
            }
            let payload = rng.chance(60).then(|| {
                let len = [0, 3, 40, 300][rng.below(4)];
                (0..len).map(|index| (index as u8).wrapping_add(rng.below(256) as u8)).collect()
            });
            GenOp::Upsert { id, fields, payload }
        })
        .collect()
}

pub fn fill_batch(batch: &mut Batch, ops: &[GenOp]) {
    batch.clear();
    for op in ops {
        match op {
            GenOp::Remove { id } => batch.remove(id),
            GenOp::Upsert { id, fields, payload } => {
                let mut upsert = batch.upsert(id);
                for (field, value) in fields {
                    upsert = upsert.set(field, value.as_value());
                }
                if let Some(payload) = payload {
                    upsert.payload(payload);
                }
            }
        }
    }
}

/// The reference: id → item, changed by plain map operations.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Model {
    pub items: BTreeMap<String, OwnedItem>,
}

impl Model {
    pub fn apply(&mut self, schema: &Schema, ops: &[GenOp]) {
        for op in ops {
            match op {
                GenOp::Remove { id } => {
                    self.items.remove(id);
                }
                GenOp::Upsert { id, fields, payload } => {
                    let item = self.items.entry(id.clone()).or_insert_with(|| OwnedItem {
                        id: id.clone(),
                        fields: vec![OwnedValue::Null; schema.len()],
                        payload: Vec::new(),
                    });
                    for (field, value) in fields {
                        item.fields[schema.field_id(field).unwrap().index()] = value.clone();
                    }
                    if let Some(payload) = payload {
                        item.payload = payload.clone();
                    }
                }
            }
        }
    }
}

/// Every item of an engine collection, by id.
pub fn engine_items(engine: &Engine, collection: &str) -> BTreeMap<String, OwnedItem> {
    let collection = engine.collection(engine.collection_id(collection).expect("collection exists")).unwrap();
    collection.items().map(|item| (item.id().to_owned(), item.to_owned_item())).collect()
}

pub fn assert_engine_matches(engine: &Engine, collection: &str, model: &Model, context: &str) {
    let actual = engine_items(engine, collection);
    if actual != model.items {
        let missing: Vec<_> = model.items.keys().filter(|id| !actual.contains_key(*id)).collect();
        let extra: Vec<_> = actual.keys().filter(|id| !model.items.contains_key(*id)).collect();
        let differing: Vec<_> =
            actual.iter().filter(|(id, item)| model.items.get(*id).is_some_and(|expected| expected != *item)).collect();
        panic!(
            "{context}: collection `{collection}` differs from the model: missing {missing:?}, extra {extra:?}, \
             differing {differing:?}"
        );
    }
}

/// A value of a field no schema accepts, for refused batches.
pub fn bad_value() -> Value<'static> {
    Value::F64(f64::NAN)
}
