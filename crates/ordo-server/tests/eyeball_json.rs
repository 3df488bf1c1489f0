//! The diff JSON the server writes is byte-for-byte what serde_json writes for
//! `eyeball_im::VectorDiff<Item>` (eyeball-im's own `Serialize`), so a Rust client
//! can keep using eyeball's types. Diffs come from a real engine, every kind of them.

use std::collections::BTreeSet;

use eyeball_im::VectorDiff;
use ordo_core::{
    Batch, DiffRef, DiffSink, Engine, FieldType, Filter, ItemRef, OwnedValue, Schema, SortKey, Value, ViewDef, WindowId,
};
use ordo_server::encode::write_diff;
use ordo_server::wire::Projection;
use serde::ser::SerializeMap;

/// The item as a client library would model it, serialised with serde.
#[derive(Clone)]
struct Item {
    id: String,
    version: u64,
    fields: Vec<(String, OwnedValue)>,
    payload: Option<Box<serde_json::value::RawValue>>,
}

struct Fields<'a>(&'a [(String, OwnedValue)]);

impl serde::Serialize for Fields<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0 {
            match value {
                OwnedValue::Null => map.serialize_entry(name, &())?,
                OwnedValue::Bool(v) => map.serialize_entry(name, v)?,
                OwnedValue::I64(v) => map.serialize_entry(name, v)?,
                OwnedValue::U64(v) => map.serialize_entry(name, v)?,
                OwnedValue::F64(v) => map.serialize_entry(name, v)?,
                OwnedValue::Str(v) => map.serialize_entry(name, v)?,
            }
        }
        map.end()
    }
}

impl serde::Serialize for Item {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("version", &self.version)?;
        map.serialize_entry("fields", &Fields(&self.fields))?;
        match &self.payload {
            Some(raw) => map.serialize_entry("payload", raw)?,
            None => map.serialize_entry("payload", &())?,
        }
        map.end()
    }
}

fn item(item: ItemRef<'_>) -> Item {
    let schema = item.schema();
    let fields = schema
        .fields()
        .iter()
        .map(|field| (field.name.clone(), item.field_by_name(&field.name).unwrap().to_owned_value()))
        .collect();
    let payload = (!item.payload().is_empty()).then(|| {
        serde_json::value::RawValue::from_string(String::from_utf8(item.payload().to_vec()).unwrap()).unwrap()
    });
    Item { id: item.id().to_owned(), version: item.version(), fields, payload }
}

struct Checker {
    projection: Projection,
    kinds: BTreeSet<&'static str>,
    n_checked: usize,
}

impl DiffSink for Checker {
    fn diff(&mut self, _window: WindowId, diff: DiffRef<'_>) {
        let mut ours = Vec::new();
        write_diff(&mut ours, diff, &self.projection);
        let theirs = serde_json::to_vec(&diff.to_vector_diff(item)).unwrap();
        assert_eq!(String::from_utf8(ours).unwrap(), String::from_utf8(theirs).unwrap());
        let kind = match diff.to_vector_diff(|_| ()) {
            VectorDiff::Append { .. } => "Append",
            VectorDiff::Clear => "Clear",
            VectorDiff::PushFront { .. } => "PushFront",
            VectorDiff::PushBack { .. } => "PushBack",
            VectorDiff::PopFront => "PopFront",
            VectorDiff::PopBack => "PopBack",
            VectorDiff::Insert { .. } => "Insert",
            VectorDiff::Set { .. } => "Set",
            VectorDiff::Remove { .. } => "Remove",
            VectorDiff::Truncate { .. } => "Truncate",
            VectorDiff::Reset { .. } => "Reset",
        };
        self.kinds.insert(kind);
        self.n_checked += 1;
    }
}

#[test]
fn every_diff_kind_is_byte_identical_to_eyeball_im_serde() {
    let mut engine = Engine::new();
    let schema = Schema::new()
        .with_field("name", FieldType::String)
        .with_field("recency", FieldType::U64)
        .with_field("delta", FieldType::I64)
        .with_field("score", FieldType::F64)
        .with_field("dm", FieldType::Bool);
    let rooms = engine.create_collection("rooms", schema.clone()).unwrap();
    let mut checker = Checker { projection: Projection::all(&schema), kinds: BTreeSet::new(), n_checked: 0 };
    let by_recency = ViewDef::new(Filter::True, vec![SortKey::desc("recency")]);
    let window = engine.open_window(rooms, &by_recency, 0, 6, &mut checker).unwrap();
    let mut rng = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let names = ["Alice", "b\"o\\b", "Ünïcode ✓", "tab\there", "ctl\u{1}", "zoë"];
    for step in 0..400u64 {
        let mut batch = Batch::new();
        for _ in 0..1 + next() % 3 {
            let id = format!("!{}:example.org", next() % 12);
            if next() % 6 == 0 {
                batch.remove(&id);
                continue;
            }
            let payload = format!("{{\"text\":\"message {step}\",\"n\":[1,2.5,null]}}");
            batch
                .upsert(&id)
                .set("name", Value::Str(names[(next() % 6) as usize]))
                .set("recency", Value::U64(next() % 50))
                .set("delta", Value::I64(-((next() % 1000) as i64)))
                .set("score", if next() % 3 == 0 { Value::Null } else { Value::F64((next() % 1000) as f64 / 7.0) })
                .set("dm", Value::Bool(next() % 2 == 0))
                .payload(if next() % 4 == 0 { b"" } else { payload.as_bytes() });
        }
        engine.apply_batch(rooms, &batch, &mut checker).unwrap();
        match next() % 8 {
            0 => engine.set_window_range(window, next() as usize % 4, 1 + next() as usize % 8, &mut checker).unwrap(),
            1 => {
                let filter = if next() % 2 == 0 { Filter::True } else { Filter::eq("dm", OwnedValue::Bool(true)) };
                engine
                    .set_window_view(window, &ViewDef::new(filter, vec![SortKey::desc("recency")]), &mut checker)
                    .unwrap()
            }
            2 => engine
                .set_window_view(
                    window,
                    &ViewDef::new(Filter::eq("name", OwnedValue::Str("nobody".into())), vec![]),
                    &mut checker,
                )
                .unwrap(),
            _ => {}
        }
    }
    assert!(checker.n_checked > 500, "{}", checker.n_checked);
    let expected: BTreeSet<&str> = [
        "Append",
        "Clear",
        "Insert",
        "PopBack",
        "PopFront",
        "PushBack",
        "PushFront",
        "Remove",
        "Reset",
        "Set",
        "Truncate",
    ]
    .into();
    let missing: Vec<_> = expected.difference(&checker.kinds).collect();
    assert!(missing.is_empty(), "diff kinds never produced, so never checked: {missing:?}");
}
