//! Model-based test of reference fields: random batches over rooms (targets) and
//! memberships (referencing items) — targets removed and re-created, references
//! changing target, references to targets that never exist — with windows sorted
//! and filtered through `room.*`. After every step, each window's contents rebuilt
//! from the diffs it received must equal the naive reference: a join (each
//! membership with its room's fields, null when the room is absent), then the
//! filter, a full sort and a slice.
//!
//! `ORDO_MODEL_SEEDS` and `ORDO_MODEL_STEPS` lengthen the run; `ORDO_MODEL_SEED`
//! replays one seed. A failure prints its seed.

use std::collections::BTreeMap;

use ordo_core::{
    Batch, CollectingSink, CollectionId, CompareOp, Engine, FieldType, Filter, OwnedDiff, OwnedItem, OwnedValue,
    Schema, SortKey, Value, ViewDef, WindowId,
};

use crate::ref_fields::{members_schema, rooms_schema};
use crate::reference::{ReferenceCollection, Rng};

/// Rooms r0..r7 come and go; r8 and r9 are referenced but never created.
const ROOMS: [&str; 10] = ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"];
const N_CREATED_ROOMS: usize = 8;
const OWNERS: [&str; 3] = ["a", "b", "c"];
const ROOM_NAMES: [&str; 6] = ["alpha", "Alpha", "beta", "a long room name past the column head", "", "zeta"];

/// The joined schema of the reference: the membership's fields, then the room's under dotted names.
fn joined_schema() -> Schema {
    Schema::new()
        .with_field("owner", FieldType::String)
        .with_field("room", FieldType::String)
        .with_field("unread", FieldType::U64)
        .with_field("room.name", FieldType::String)
        .with_field("room.recency", FieldType::U64)
        .with_field("room.muted", FieldType::Bool)
}

fn defs() -> Vec<ViewDef> {
    let owner = |owner: &str| Filter::eq("owner", OwnedValue::Str(owner.to_owned()));
    vec![
        ViewDef::new(owner("a"), vec![SortKey::desc("room.recency")]).showing(vec!["room.name".into()]),
        ViewDef::new(owner("b"), vec![SortKey::desc("room.recency"), SortKey::asc("room.name")]),
        ViewDef::new(Filter::True, vec![SortKey::asc("room.name"), SortKey::desc("unread")]),
        ViewDef::new(
            Filter::All(vec![
                Filter::eq("room.muted", OwnedValue::Bool(false)),
                Filter::compare("unread", CompareOp::Ge, OwnedValue::U64(1)),
            ]),
            vec![SortKey::desc("room.recency")],
        ),
        ViewDef::new(Filter::Not(Box::new(Filter::is_null("room.recency"))), vec![SortKey::asc("unread")])
            .showing(vec!["room.name".into(), "room.muted".into()]),
        // Reads nothing through the reference.
        ViewDef::new(owner("c"), vec![SortKey::desc("unread")]),
        // Keyed on the reference itself.
        ViewDef::new(Filter::eq("room", OwnedValue::Str("r1".into())), vec![SortKey::asc("room.recency")]),
        ViewDef::new(
            Filter::Any(vec![
                Filter::prefix("room.name", "a"),
                Filter::compare("room.recency", CompareOp::Gt, OwnedValue::U64(10)),
            ]),
            vec![SortKey::desc("room.recency"), SortKey::asc("unread")],
        ),
        ViewDef::new(
            Filter::All(vec![owner("a"), Filter::compare("room.recency", CompareOp::Lt, OwnedValue::U64(15))]),
            vec![SortKey::asc("room.name").case_insensitive(), SortKey::desc("room.recency")],
        ),
        // Shows a room field without sorting or filtering through the reference.
        ViewDef::new(owner("b"), vec![SortKey::desc("unread")]).showing(vec!["room.muted".into()]),
    ]
}

/// A field-to-field comparison between comparable fields, through the reference
/// or not: `unread` (0..=3) against `room.recency` (0..20) flips as either side
/// changes, as "unread" (`room.last_seq > read_upto`) does when a room gets a
/// message or a member reads it.
fn random_field_comparison(rng: &mut Rng) -> Filter {
    let op = *rng.pick(&[CompareOp::Eq, CompareOp::Ne, CompareOp::Lt, CompareOp::Le, CompareOp::Gt, CompareOp::Ge]);
    let (field, other) = *rng.pick(&[
        ("room.recency", "unread"),
        ("unread", "room.recency"),
        ("room.recency", "room.recency"),
        ("room.name", "owner"),
        ("room", "owner"),
        ("room.name", "room"),
        ("unread", "unread"),
    ]);
    if rng.chance(10) {
        return Filter::compare_fields("room.muted", *rng.pick(&[CompareOp::Eq, CompareOp::Ne]), "room.muted");
    }
    Filter::compare_fields(field, op, other)
}

/// Views filtering on field-to-field comparisons: keyed by owner or by room
/// (the server's row predicate and a room's members), unkeyed, under `not` and
/// `any`; sorted and shown through the reference so that the same target update
/// moves an item and flips its filter.
fn random_comparison_defs(rng: &mut Rng, n_defs: usize) -> Vec<ViewDef> {
    (0..n_defs)
        .map(|_| {
            let comparison = random_field_comparison(rng);
            let filter = match rng.below(5) {
                0 | 1 => {
                    Filter::All(vec![Filter::eq("owner", OwnedValue::Str(rng.pick(&OWNERS).to_string())), comparison])
                }
                2 => Filter::All(vec![Filter::eq("room", OwnedValue::Str(rng.pick(&ROOMS).to_string())), comparison]),
                3 => Filter::Not(Box::new(comparison)),
                _ => Filter::Any(vec![comparison, random_field_comparison(rng)]),
            };
            let sort = match rng.below(3) {
                0 => vec![SortKey::desc("room.recency")],
                1 => vec![SortKey::asc("unread"), SortKey::asc("room.name")],
                _ => Vec::new(),
            };
            let shown = if rng.chance(50) { vec!["room.name".to_owned()] } else { Vec::new() };
            ViewDef::new(filter, sort).showing(shown)
        })
        .collect()
}

/// The room fields a view reads or shows, by their dotted names.
fn room_fields_read(def: &ViewDef) -> Vec<String> {
    fn walk(filter: &Filter, out: &mut Vec<String>) {
        match filter {
            Filter::True => {}
            Filter::Compare { field, .. }
            | Filter::In { field, .. }
            | Filter::IsNull { field }
            | Filter::Contains { field, .. }
            | Filter::Prefix { field, .. } => out.push(field.clone()),
            Filter::CompareFields { field, other, .. } => out.extend([field.clone(), other.clone()]),
            Filter::All(children) | Filter::Any(children) => children.iter().for_each(|child| walk(child, out)),
            Filter::Not(child) => walk(child, out),
        }
    }
    let mut out = Vec::new();
    walk(&def.filter, &mut out);
    out.extend(def.sort.iter().map(|key| key.field.clone()));
    out.extend(def.shown.iter().cloned());
    out.retain(|name| name.starts_with("room."));
    out
}

/// The index in `defs()` of the view that reads nothing through the reference.
const NO_REF_VIEW: usize = 5;

struct Model {
    rooms: BTreeMap<String, OwnedItem>,
    members: BTreeMap<String, OwnedItem>,
}

impl Model {
    fn joined(&self) -> ReferenceCollection {
        let mut joined = ReferenceCollection::default();
        for member in self.members.values() {
            let room = match &member.fields[1] {
                OwnedValue::Str(id) => self.rooms.get(id),
                _ => None,
            };
            let mut fields = member.fields.clone();
            match room {
                Some(room) => fields.extend(room.fields.iter().cloned()),
                None => fields.extend([OwnedValue::Null, OwnedValue::Null, OwnedValue::Null]),
            }
            joined.items.insert(
                member.id.clone(),
                OwnedItem { id: member.id.clone(), fields, payload: member.payload.clone() },
            );
        }
        joined
    }
}

fn upsert_naive(
    map: &mut BTreeMap<String, OwnedItem>,
    n_fields: usize,
    id: &str,
    sets: &[(usize, OwnedValue)],
    payload: Option<&[u8]>,
) {
    let item = map.entry(id.to_owned()).or_insert_with(|| OwnedItem {
        id: id.to_owned(),
        fields: vec![OwnedValue::Null; n_fields],
        payload: Vec::new(),
    });
    for (index, value) in sets {
        item.fields[*index] = value.clone();
    }
    if let Some(payload) = payload {
        item.payload = payload.to_vec();
    }
}

fn maybe_null(rng: &mut Rng, make: impl FnOnce(&mut Rng) -> OwnedValue) -> OwnedValue {
    if rng.chance(10) {
        OwnedValue::Null
    } else {
        make(rng)
    }
}

/// Returns the rooms the batch touches.
fn rooms_batch(rng: &mut Rng, model: &mut Model, batch: &mut Batch) -> Vec<&'static str> {
    batch.clear();
    let mut touched = Vec::new();
    for _ in 0..1 + rng.below(4) {
        let id = ROOMS[rng.below(N_CREATED_ROOMS)];
        touched.push(id);
        if rng.chance(20) {
            batch.remove(id);
            model.rooms.remove(id);
            continue;
        }
        let mut sets = Vec::new();
        if rng.chance(50) || !model.rooms.contains_key(id) {
            sets.push((0, maybe_null(rng, |rng| OwnedValue::Str(rng.pick(&ROOM_NAMES).to_string()))));
        }
        if rng.chance(70) {
            sets.push((1, maybe_null(rng, |rng| OwnedValue::U64(rng.below(20) as u64))));
        }
        if rng.chance(30) {
            sets.push((2, maybe_null(rng, |rng| OwnedValue::Bool(rng.chance(50)))));
        }
        let payload = rng.chance(30).then(|| format!("preview {}", rng.below(100)).into_bytes());
        let mut upsert = batch.upsert(id);
        for (index, value) in &sets {
            upsert = upsert.set(["name", "recency", "muted"][*index], value.as_value());
        }
        if let Some(payload) = &payload {
            upsert.payload(payload);
        }
        upsert_naive(&mut model.rooms, 3, id, &sets, payload.as_deref());
    }
    touched
}

/// The values a diff carries (an item whose shown data changed must be among them).
fn carried(diff: &OwnedDiff) -> Vec<&str> {
    match diff {
        OwnedDiff::Append { values } | OwnedDiff::Reset { values } => {
            values.iter().map(|item| item.id.as_str()).collect()
        }
        OwnedDiff::PushFront { value }
        | OwnedDiff::PushBack { value }
        | OwnedDiff::Insert { value, .. }
        | OwnedDiff::Set { value, .. } => vec![value.id.as_str()],
        _ => Vec::new(),
    }
}

fn members_batch(rng: &mut Rng, model: &mut Model, batch: &mut Batch, n_member_ids: usize) {
    batch.clear();
    for _ in 0..1 + rng.below(4) {
        let id = format!("m{}", rng.below(n_member_ids));
        if rng.chance(15) {
            batch.remove(&id);
            model.members.remove(&id);
            continue;
        }
        let mut sets = Vec::new();
        let is_new = !model.members.contains_key(&id);
        if is_new || rng.chance(10) {
            sets.push((0, OwnedValue::Str(rng.pick(&OWNERS).to_string())));
        }
        if is_new || rng.chance(40) {
            sets.push((1, maybe_null(rng, |rng| OwnedValue::Str(rng.pick(&ROOMS).to_string()))));
        }
        if rng.chance(60) {
            sets.push((2, maybe_null(rng, |rng| OwnedValue::U64(rng.below(4) as u64))));
        }
        let mut upsert = batch.upsert(&id);
        for (index, value) in &sets {
            upsert = upsert.set(["owner", "room", "unread"][*index], value.as_value());
        }
        upsert_naive(&mut model.members, 3, &id, &sets, None);
    }
}

struct OpenWindow {
    id: WindowId,
    def: usize,
    offset: usize,
    limit: usize,
    local: Vec<OwnedItem>,
}

fn open(
    engine: &mut Engine,
    members: CollectionId,
    defs: &[ViewDef],
    rng: &mut Rng,
    sink: &mut CollectingSink,
) -> OpenWindow {
    let def = rng.below(defs.len());
    let (offset, limit) = (rng.below(3), 1 + rng.below(6));
    let id = engine.open_window(members, &defs[def], offset, limit, sink).unwrap();
    OpenWindow { id, def, offset, limit, local: Vec::new() }
}

/// Member ids of the default run: few, so that steps often hit the same items.
const N_MEMBER_IDS: usize = 24;

/// Returns how many times a room batch flipped an item into or out of the
/// filter of a field-to-field view some window looked at (so that a run that
/// stops exercising those flips is noticed).
fn run(seed: u64, n_steps: usize, n_member_ids: usize) -> usize {
    let mut rng = Rng(seed);
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", rooms_schema()).unwrap();
    let members = engine.create_collection("members", members_schema(rooms)).unwrap();
    let mut model = Model { rooms: BTreeMap::new(), members: BTreeMap::new() };
    let mut defs = defs();
    let n_fixed_defs = defs.len();
    defs.extend(random_comparison_defs(&mut rng, 6));
    let mut n_flips_by_target = 0;
    let joined_schema = joined_schema();
    let mut sink = CollectingSink::new();
    let mut batch = Batch::new();
    let mut windows: Vec<OpenWindow> = Vec::new();
    if n_member_ids > N_MEMBER_IDS {
        // Many members first, so that rooms have more referencing items than one
        // chunk of the refresh (`engine/refresh`) holds.
        for _ in 0..n_member_ids / 2 {
            members_batch(&mut rng, &mut model, &mut batch, n_member_ids);
            engine.apply_batch(members, &batch, &mut sink).unwrap();
        }
    }
    for step in 0..n_steps {
        let before = model.joined();
        let mut touched_rooms = Vec::new();
        match rng.below(100) {
            0..=44 => {
                touched_rooms = rooms_batch(&mut rng, &mut model, &mut batch);
                engine.apply_batch(rooms, &batch, &mut sink).unwrap();
            }
            45..=84 => {
                members_batch(&mut rng, &mut model, &mut batch, n_member_ids);
                engine.apply_batch(members, &batch, &mut sink).unwrap();
            }
            85..=92 if windows.len() < 8 => windows.push(open(&mut engine, members, &defs, &mut rng, &mut sink)),
            85..=96 if !windows.is_empty() => {
                // Closing the last window of a view leaves its link stale; reopening rebuilds it.
                let window = windows.swap_remove(rng.below(windows.len()));
                engine.close_window(window.id).unwrap();
            }
            _ if !windows.is_empty() => {
                let index = rng.below(windows.len());
                let window = &mut windows[index];
                (window.offset, window.limit) = (rng.below(4), 1 + rng.below(6));
                engine.set_window_range(window.id, window.offset, window.limit, &mut sink).unwrap();
            }
            _ => windows.push(open(&mut engine, members, &defs, &mut rng, &mut sink)),
        }
        let joined = model.joined();
        if !touched_rooms.is_empty() {
            let member_ids = |joined: &ReferenceCollection, def: &ViewDef| -> Vec<String> {
                joined.view(&joined_schema, def).into_iter().map(|item| item.id).collect::<Vec<_>>()
            };
            let mut looked_at: Vec<usize> = windows.iter().map(|window| window.def).collect();
            looked_at.sort_unstable();
            looked_at.dedup();
            for def in looked_at.into_iter().filter(|&def| def >= n_fixed_defs) {
                let (mut old, mut new) = (member_ids(&before, &defs[def]), member_ids(&joined, &defs[def]));
                old.sort_unstable();
                new.sort_unstable();
                n_flips_by_target += usize::from(old != new);
            }
        }
        for window in &mut windows {
            let diffs = sink.take_for(window.id);
            let n_diffs = diffs.len();
            let seen: Vec<String> = diffs.iter().flat_map(carried).map(str::to_owned).collect();
            let set_ids: Vec<String> = diffs
                .iter()
                .filter_map(|diff| match diff {
                    OwnedDiff::Set { value, .. } => Some(value.id.clone()),
                    _ => None,
                })
                .collect();
            for diff in diffs {
                diff.apply(&mut window.local);
            }
            // A room's change reaches every membership of it in a view that reads or
            // shows a room field whose value changed, and only those: a change of
            // room fields the view neither reads nor shows sends nothing.
            let read = room_fields_read(&defs[window.def]);
            let read_changed = |id: &str| {
                read.iter().any(|name| {
                    let index = joined_schema.field_id(name).expect("a joined field").index();
                    let value =
                        |joined: &ReferenceCollection| joined.items.get(id).map(|item| item.fields[index].clone());
                    value(&before) != value(&joined)
                })
            };
            if window.def == NO_REF_VIEW {
                // Not visited by a room's change.
                assert!(
                    touched_rooms.is_empty() || n_diffs == 0,
                    "seed {seed}, step {step}: a view not reading rooms changed"
                );
            } else {
                for item in &window.local {
                    let room = match &item.fields[1] {
                        OwnedValue::Str(room) => room.as_str(),
                        _ => continue,
                    };
                    if !touched_rooms.contains(&room) {
                        continue;
                    }
                    if read_changed(&item.id) {
                        assert!(
                            seen.contains(&item.id),
                            "seed {seed}, step {step}, view {}: {} shows room {room}, changed, without a diff",
                            window.def,
                            item.id
                        );
                    } else {
                        assert!(
                            !set_ids.contains(&item.id),
                            "seed {seed}, step {step}, view {}: {} got a Set, but nothing it reads of room {room} changed",
                            window.def,
                            item.id
                        );
                    }
                }
            }
            let expected = joined.window(&joined_schema, &defs[window.def], window.offset, window.limit);
            let expected: Vec<(&str, &[OwnedValue], &[u8])> =
                expected.iter().map(|item| (item.id.as_str(), &item.fields[..3], &item.payload[..])).collect();
            let got: Vec<(&str, &[OwnedValue], &[u8])> =
                window.local.iter().map(|item| (item.id.as_str(), &item.fields[..], &item.payload[..])).collect();
            assert_eq!(got, expected, "seed {seed}, step {step}, view {}: {:?}", window.def, defs[window.def]);
        }
    }
    n_flips_by_target
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

#[test]
fn reference_windows_match_the_naive_join() {
    if let Ok(seed) = std::env::var("ORDO_MODEL_SEED") {
        run(seed.parse().unwrap(), env_usize("ORDO_MODEL_STEPS", 400), N_MEMBER_IDS);
        return;
    }
    let n_seeds = env_usize("ORDO_MODEL_SEEDS", 24);
    let n_flips_by_target: usize =
        (0..n_seeds as u64).map(|seed| run(seed, env_usize("ORDO_MODEL_STEPS", 400), N_MEMBER_IDS)).sum();
    println!("room batches flipping a field-to-field filter: {n_flips_by_target}");
    assert!(n_flips_by_target >= n_seeds, "target updates rarely flipped a field-to-field filter: {n_flips_by_target}");
}

/// The same with some 40 members per room: a room's change moves more items
/// than one refresh chunk holds, in up to 8 views each (so that a chunk's views
/// may also fill its buffer and end it early).
#[test]
fn reference_windows_match_the_naive_join_across_refresh_chunks() {
    for seed in 0..env_usize("ORDO_MODEL_SEEDS", 4) as u64 {
        run(1_000 + seed, env_usize("ORDO_MODEL_STEPS", 300), 400);
    }
}

/// The engine's own reads agree with the join too (a value read through a
/// reference is the target's, or null).
#[test]
fn items_keep_their_reference_as_a_string() {
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", rooms_schema()).unwrap();
    let members = engine.create_collection("members", members_schema(rooms)).unwrap();
    let mut batch = Batch::new();
    batch.upsert("m").set("room", Value::Str("r1"));
    engine.apply_batch(members, &batch, &mut CollectingSink::new()).unwrap();
    let item = engine.collection(members).unwrap().get("m").unwrap();
    assert_eq!(item.field_by_name("room"), Some(Value::Str("r1")));
    assert_eq!(item.field_by_name("room.recency"), None);
    assert_eq!(item.to_owned_item().fields.len(), 3);
}
