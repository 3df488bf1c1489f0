//! Collections with identical schemas share one schema, and views with one
//! definition over it share one compiled plan (`engine::shared`). Sharing must
//! never leak a change: a collection whose schema changes (a field removed, so
//! the fields after it move down; a field added) keeps exact windows, and so do
//! the collections it shared with, before and after, and views opened later.

use ordo_core::{
    Batch, CollectingSink, CollectionId, Engine, FieldType, Filter, OwnedItem, OwnedValue, Schema, SortKey, ViewDef,
    WindowId,
};

use crate::reference::{ReferenceCollection, Rng};

fn schema() -> Schema {
    Schema::new()
        .with_field("owner", FieldType::String)
        .with_field("name", FieldType::String)
        .with_field("recency", FieldType::U64)
        .with_field("flag", FieldType::Bool)
}

/// Reads `recency` and `flag`, which move down when `owner` goes.
fn def() -> ViewDef {
    ViewDef::new(Filter::eq("flag", OwnedValue::Bool(true)), vec![SortKey::desc("recency"), SortKey::asc("name")])
}

struct List {
    collection: CollectionId,
    schema: Schema,
    reference: ReferenceCollection,
    windows: Vec<WindowId>,
}

impl List {
    /// Upserts `n` random items, every field set.
    fn write(&mut self, engine: &mut Engine, rng: &mut Rng, n: usize, sink: &mut CollectingSink) {
        let mut batch = Batch::new();
        for _ in 0..n {
            let id = format!("item{}", rng.below(60));
            let mut fields = Vec::new();
            let mut upsert = batch.upsert(&id);
            for field in self.schema.fields() {
                let value = match field.field_type {
                    FieldType::String => OwnedValue::Str(format!("n{}", rng.below(9))),
                    FieldType::U64 => OwnedValue::U64(rng.below(1_000) as u64),
                    FieldType::Bool => OwnedValue::Bool(rng.chance(60)),
                    other => unreachable!("no {other:?} field here"),
                };
                upsert = upsert.set(&field.name, value.as_value());
                fields.push(value);
            }
            self.reference.items.insert(id.clone(), OwnedItem { id, fields, payload: Vec::new() });
        }
        engine.apply_batch(self.collection, &batch, sink).unwrap();
    }

    fn check(&self, engine: &mut Engine, context: &str) {
        let expected = self.reference.window(&self.schema, &def(), 0, 10);
        assert!(!expected.is_empty(), "{context}: nothing to compare");
        for &window in &self.windows {
            assert_eq!(engine.window_items(window).unwrap(), expected, "{context}");
        }
    }
}

#[test]
fn views_sharing_a_plan_stay_exact_when_one_schema_changes() {
    let mut engine = Engine::new();
    let mut sink = CollectingSink::new();
    let mut rng = Rng(5);
    let mut lists: Vec<List> = ["a", "b", "c"]
        .iter()
        .map(|name| List {
            collection: engine.create_collection(name, schema()).unwrap(),
            schema: schema(),
            reference: ReferenceCollection::default(),
            windows: Vec::new(),
        })
        .collect();
    for list in &mut lists {
        list.write(&mut engine, &mut rng, 40, &mut sink);
        list.windows.push(engine.open_window(list.collection, &def(), 0, 10, &mut sink).unwrap());
        list.check(&mut engine, "before any change");
    }
    // `a` loses its first field: its view is compiled again, with `recency` and
    // `flag` one place down; `b` and `c` keep the plan they shared with it.
    engine.remove_field(lists[0].collection, "owner", &mut sink).unwrap();
    lists[0].schema = Schema::new()
        .with_field("name", FieldType::String)
        .with_field("recency", FieldType::U64)
        .with_field("flag", FieldType::Bool);
    for item in lists[0].reference.items.values_mut() {
        item.fields.remove(0);
    }
    // `b` gains a last field: the plan it shares stays right for it.
    engine.add_field(lists[1].collection, "unread", FieldType::U64, &OwnedValue::U64(0), &mut sink).unwrap();
    lists[1].schema = schema().with_field("unread", FieldType::U64);
    for item in lists[1].reference.items.values_mut() {
        item.fields.push(OwnedValue::U64(0));
    }
    // `d` is created after the changes with the first schema: it shares `c`'s.
    lists.push(List {
        collection: engine.create_collection("d", schema()).unwrap(),
        schema: schema(),
        reference: ReferenceCollection::default(),
        windows: Vec::new(),
    });
    for round in 0..20 {
        for list in &mut lists {
            list.write(&mut engine, &mut rng, 5, &mut sink);
            if round == 3 {
                // Views made after the changes: each list's view goes with its
                // last window and comes back, compiled for the schema of now.
                for window in list.windows.drain(..) {
                    engine.close_window(window).unwrap();
                }
                for _ in 0..2 {
                    list.windows.push(engine.open_window(list.collection, &def(), 0, 10, &mut sink).unwrap());
                }
            }
            if round >= 3 {
                list.check(&mut engine, &format!("round {round}"));
            }
        }
    }
    engine.check_key_indexes();
}
