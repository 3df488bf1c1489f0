//! Model test of windows placed by key (`around`, `after`, `before`) and of tail
//! windows, against the naive reference: random writes interleaved with random
//! opens, moves and view changes of anchored windows. After every step each
//! window rebuilt from its diffs equals the reference's slice at the range the
//! anchor gives (computed here from the reference alone), tail windows follow the
//! view's end, and the view length reported to the sink is the reference's.
//!
//! `ORDO_MODEL_SEEDS` and `ORDO_MODEL_STEPS` lengthen the run; `ORDO_MODEL_SEED`
//! replays one seed. A failure prints its seed.

use std::cmp::Ordering;
use std::collections::HashMap;

use ordo_core::{
    Batch, CollectingSink, CollectionId, DiffRef, DiffSink, Engine, FieldType, Filter, ItemPosition, OwnedDiff,
    OwnedItem, OwnedValue, Schema, SortKey, Value, ViewDef, ViewError, WindowAnchor, WindowId, WindowRange,
};

use crate::reference::{compare_items, matches, ReferenceCollection, Rng};

const FIELDS: [(&str, FieldType); 3] =
    [("name", FieldType::String), ("score", FieldType::I64), ("flag", FieldType::Bool)];
const NAMES: [&str; 6] = ["alpha", "Alpha", "beta", "gamma", "", "a name longer than the index's cached prefix"];

fn schema() -> Schema {
    FIELDS.iter().fold(Schema::new(), |schema, (name, field_type)| schema.with_field(name, *field_type))
}

fn defs() -> Vec<ViewDef> {
    vec![
        ViewDef::new(Filter::True, vec![SortKey::asc("score")]),
        ViewDef::new(Filter::eq("flag", OwnedValue::Bool(true)), vec![SortKey::desc("score"), SortKey::asc("name")]),
        ViewDef::new(
            Filter::compare("score", ordo_core::CompareOp::Gt, OwnedValue::I64(0)),
            vec![SortKey::asc("name")],
        ),
        ViewDef::new(Filter::True, vec![SortKey::asc("name").case_insensitive()]),
        // Keyed (an equality conjunct): built from the key's candidates.
        ViewDef::new(Filter::All(vec![Filter::eq("flag", OwnedValue::Bool(false))]), vec![]),
    ]
}

/// A sink that keeps diffs (as `CollectingSink`) and the view lengths reported.
#[derive(Default)]
struct TotalsSink {
    diffs: CollectingSink,
    view_lens: Vec<(WindowId, usize)>,
}

impl DiffSink for TotalsSink {
    fn diff(&mut self, window: WindowId, diff: DiffRef<'_>) {
        self.diffs.diff(window, diff);
    }

    fn view_len(&mut self, window: WindowId, view_len: usize) {
        self.view_lens.push((window, view_len));
    }
}

/// How a window was placed: a tail window's range moves with the view's end.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Placement {
    Fixed { offset: usize },
    Tail,
}

struct ClientWindow {
    id: WindowId,
    def: ViewDef,
    placement: Placement,
    limit: usize,
    items: Vec<OwnedItem>,
}

#[derive(Clone, Debug)]
enum Anchor {
    Offset(usize),
    Around(String, usize),
    After(String),
    Before(String),
    Tail,
}

impl Anchor {
    fn as_anchor(&self) -> WindowAnchor<'_> {
        match self {
            Anchor::Offset(offset) => WindowAnchor::Offset(*offset),
            Anchor::Around(id, row) => WindowAnchor::Around { id, row: *row },
            Anchor::After(id) => WindowAnchor::After(id),
            Anchor::Before(id) => WindowAnchor::Before(id),
            Anchor::Tail => WindowAnchor::Tail,
        }
    }
}

struct Harness {
    engine: Engine,
    collection: CollectionId,
    schema: Schema,
    reference: ReferenceCollection,
    windows: Vec<ClientWindow>,
    sink: TotalsSink,
    batch: Batch,
    n_ids: usize,
    /// Steps on which a tail window slid (a row entered or left above its end).
    n_tail_slides: usize,
    n_not_found: usize,
    n_anchored_outside_view: usize,
}

fn random_id(rng: &mut Rng, n_ids: usize) -> String {
    format!("!r{:03}", rng.below(n_ids))
}

impl Harness {
    fn view(&self, def: &ViewDef) -> Vec<OwnedItem> {
        self.reference.view(&self.schema, def)
    }

    /// Where `id` is or would be in `def`'s view, by the reference alone.
    fn expected_position(&self, def: &ViewDef, id: &str) -> Option<ItemPosition> {
        let item = self.reference.items.get(id)?;
        let rank = self
            .view(def)
            .iter()
            .filter(|other| compare_items(&def.sort, &self.schema, other, item) == Ordering::Less)
            .count();
        Some(ItemPosition { rank, is_member: matches(&def.filter, &self.schema, item) })
    }

    /// The range an anchor must give, by the reference alone (`None`: unknown id).
    fn expected_range(&self, def: &ViewDef, anchor: &Anchor, limit: usize) -> Option<WindowRange> {
        let len = self.view(def).len();
        let fixed = |offset, limit| WindowRange { offset, limit, is_tail: false };
        Some(match anchor {
            Anchor::Offset(offset) => fixed(*offset, limit),
            Anchor::Tail => WindowRange { offset: len.saturating_sub(limit), limit, is_tail: true },
            Anchor::Around(id, row) => {
                let rank = self.expected_position(def, id)?.rank;
                fixed(rank.saturating_sub(*row).min(len.saturating_sub(limit)), limit)
            }
            Anchor::After(id) => {
                let position = self.expected_position(def, id)?;
                fixed(position.rank + usize::from(position.is_member), limit)
            }
            Anchor::Before(id) => {
                let end = self.expected_position(def, id)?.rank;
                let offset = end.saturating_sub(limit);
                fixed(offset, end - offset)
            }
        })
    }

    fn random_anchor(&self, rng: &mut Rng, limit: usize) -> Anchor {
        let id = random_id(rng, self.n_ids);
        match rng.below(6) {
            0 => Anchor::Offset(rng.below(self.n_ids / 2 + 4)),
            1 => Anchor::Around(id, rng.below(limit.max(1))),
            2 => Anchor::After(id),
            3 => Anchor::Before(id),
            _ => Anchor::Tail,
        }
    }

    /// Checks an anchored open or move against the reference; returns the range.
    fn check_range(
        &mut self,
        def: &ViewDef,
        anchor: &Anchor,
        limit: usize,
        result: Result<WindowRange, ViewError>,
        context: &str,
    ) -> Option<WindowRange> {
        let expected = self.expected_range(def, anchor, limit);
        match (result, expected) {
            (Ok(range), Some(expected)) => {
                assert_eq!(range, expected, "{context}: range of {anchor:?} (limit {limit}) on {def:?}");
                if let Anchor::Around(id, _) | Anchor::After(id) | Anchor::Before(id) = anchor {
                    if !self.expected_position(def, id).expect("known").is_member {
                        self.n_anchored_outside_view += 1;
                    }
                }
                Some(range)
            }
            (Err(ViewError::UnknownItem { id }), None) => {
                assert!(!self.reference.items.contains_key(&id), "{context}");
                self.n_not_found += 1;
                None
            }
            (result, expected) => panic!("{context}: {anchor:?} gave {result:?}, expected {expected:?}"),
        }
    }

    fn random_batch(&mut self, rng: &mut Rng) -> bool {
        self.batch.clear();
        let max_ops = if rng.chance(50) { 1 } else { 5 };
        let n_ops = 1 + rng.below(max_ops);
        for _ in 0..n_ops {
            let id = random_id(rng, self.n_ids);
            if rng.chance(25) {
                self.batch.remove(&id);
                self.reference.items.remove(&id);
                continue;
            }
            let mut item = self.reference.items.get(&id).cloned().unwrap_or_else(|| OwnedItem {
                id: id.clone(),
                fields: vec![OwnedValue::Null; FIELDS.len()],
                payload: Vec::new(),
            });
            let name = OwnedValue::Str(rng.pick(&NAMES).to_string());
            let score = OwnedValue::I64(rng.below(7) as i64 - 3);
            let flag = OwnedValue::Bool(rng.chance(50));
            let mut builder = self.batch.upsert(&id);
            for (index, value) in [name, score, flag].into_iter().enumerate() {
                if rng.chance(60) {
                    builder = builder.set(FIELDS[index].0, value.as_value());
                    item.fields[index] = value;
                }
            }
            self.reference.items.insert(id, item);
        }
        self.engine.apply_batch(self.collection, &self.batch, &mut self.sink).expect("valid batch");
        n_ops == 1
    }

    /// Applies the diffs delivered; returns each window's diffs for inspection.
    fn deliver(&mut self, context: &str) -> HashMap<WindowId, Vec<OwnedDiff>> {
        let mut by_window: HashMap<WindowId, Vec<OwnedDiff>> = HashMap::new();
        for (id, diff) in self.sink.diffs.diffs.drain(..) {
            by_window.entry(id).or_default().push(diff);
        }
        for window in &mut self.windows {
            for diff in by_window.get(&window.id).into_iter().flatten() {
                let result =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| diff.clone().apply(&mut window.items)));
                assert!(result.is_ok(), "{context}: {diff:?} does not apply to a window of {}", window.items.len());
            }
        }
        let lens: Vec<(WindowId, usize)> = self.sink.view_lens.drain(..).collect();
        for (window_id, view_len) in lens {
            let window = self.windows.iter().find(|window| window.id == window_id).expect("a live window");
            assert_eq!(view_len, self.view(&window.def).len(), "{context}: view length reported");
            assert!(by_window.contains_key(&window_id), "{context}: a length without diffs");
        }
        by_window
    }

    fn check(&mut self, context: &str) {
        for window in &self.windows {
            let view = self.view(&window.def);
            let offset = match window.placement {
                Placement::Fixed { offset } => offset,
                Placement::Tail => view.len().saturating_sub(window.limit),
            };
            let expected: Vec<OwnedItem> = view.into_iter().skip(offset).take(window.limit).collect();
            let ids = |items: &[OwnedItem]| items.iter().map(|item| item.id.clone()).collect::<Vec<_>>();
            assert_eq!(
                ids(&window.items),
                ids(&expected),
                "{context}: window {:?} ({:?}, limit {}, def {:?})",
                window.id,
                window.placement,
                window.limit,
                window.def
            );
            assert_eq!(window.items, expected, "{context}: item data");
            let (engine_offset, engine_limit) = self.engine.window_range(window.id).unwrap();
            assert_eq!((engine_offset, engine_limit), (offset, window.limit), "{context}: window_range");
        }
    }
}

fn placement_of(range: WindowRange) -> Placement {
    if range.is_tail {
        Placement::Tail
    } else {
        Placement::Fixed { offset: range.offset }
    }
}

fn run_seed(seed: u64, n_steps: usize) -> (usize, usize, usize) {
    let mut rng = Rng(seed);
    let schema = schema();
    let mut engine = Engine::new();
    let collection = engine.create_collection("rooms", schema.clone()).unwrap();
    let defs = defs();
    let mut harness = Harness {
        engine,
        collection,
        schema,
        reference: ReferenceCollection::default(),
        windows: Vec::new(),
        sink: TotalsSink::default(),
        batch: Batch::new(),
        // Every third seed grows the index past one leaf.
        n_ids: if seed % 3 == 2 { 250 } else { 40 },
        n_tail_slides: 0,
        n_not_found: 0,
        n_anchored_outside_view: 0,
    };
    if seed % 3 == 2 {
        // A large start, so that windows open on partially sorted views.
        for _ in 0..60 {
            harness.random_batch(&mut rng);
        }
        harness.sink.diffs.diffs.clear();
        harness.sink.view_lens.clear();
    }
    for step in 0..n_steps {
        let context = format!("seed {seed} step {step}");
        let action = rng.below(100);
        let mut single_op = false;
        let tail_offsets: Vec<usize> =
            harness.windows.iter().map(|w| harness.engine.window_range(w.id).unwrap().0).collect();
        if action < 50 || harness.reference.items.is_empty() {
            single_op = harness.random_batch(&mut rng);
        } else if action < 70 || harness.windows.is_empty() {
            let def = rng.pick(&defs).clone();
            let limit = rng.below(12);
            let anchor = harness.random_anchor(&mut rng, limit);
            let n_views_before = harness.engine.stats().n_views;
            let result =
                harness.engine.open_window_at(harness.collection, &def, anchor.as_anchor(), limit, &mut harness.sink);
            let window_id = result.as_ref().ok().map(|(id, _)| *id);
            if let Some(range) = harness.check_range(&def, &anchor, limit, result.map(|(_, range)| range), &context) {
                harness.windows.push(ClientWindow {
                    id: window_id.expect("opened"),
                    def,
                    placement: placement_of(range),
                    limit: range.limit,
                    items: Vec::new(),
                });
            } else {
                // A refused open leaves no view behind.
                assert!(harness.sink.diffs.diffs.is_empty(), "{context}: diffs of a refused open");
                assert_eq!(harness.engine.stats().n_views, n_views_before, "{context}: a refused open left a view");
            }
        } else if action < 88 {
            let index = rng.below(harness.windows.len());
            let limit = if rng.chance(50) { harness.windows[index].limit } else { rng.below(12) };
            let anchor = harness.random_anchor(&mut rng, limit);
            let window_id = harness.windows[index].id;
            let def = harness.windows[index].def.clone();
            let result = harness.engine.move_window(window_id, anchor.as_anchor(), limit, &mut harness.sink);
            if let Some(range) = harness.check_range(&def, &anchor, limit, result, &context) {
                let window = &mut harness.windows[index];
                (window.placement, window.limit) = (placement_of(range), range.limit);
            } else {
                assert!(harness.sink.diffs.diffs.is_empty(), "{context}: diffs of a refused move");
            }
        } else if action < 95 {
            let index = rng.below(harness.windows.len());
            let def = rng.pick(&defs).clone();
            let window_id = harness.windows[index].id;
            harness.engine.set_window_view(window_id, &def, &mut harness.sink).unwrap();
            harness.windows[index].def = def;
        } else {
            let index = rng.below(harness.windows.len());
            let window = harness.windows.remove(index);
            harness.engine.close_window(window.id).unwrap();
        }
        let diffs = harness.deliver(&context);
        harness.check(&context);
        // Random positions, members or not, against the reference.
        if let Some(window) = harness.windows.first() {
            let (window_id, def) = (window.id, window.def.clone());
            let id = random_id(&mut rng, harness.n_ids);
            let position = harness.engine.item_position(window_id, &id).ok();
            assert_eq!(position, harness.expected_position(&def, &id), "{context}: item_position of {id}");
        }
        // A tail window slides with at most two small diffs per single-row change.
        if single_op {
            for (window, offset_before) in harness.windows.iter().zip(&tail_offsets) {
                let offset_now = harness.engine.window_range(window.id).unwrap().0;
                if window.placement != Placement::Tail || offset_now == *offset_before {
                    continue;
                }
                harness.n_tail_slides += 1;
                let window_diffs = diffs.get(&window.id).map_or(&[][..], |diffs| &diffs[..]);
                assert!(window_diffs.len() <= 2, "{context}: a tail slide sent {window_diffs:?}");
                if window.items.len() >= 2 {
                    assert!(
                        !window_diffs.iter().any(|diff| matches!(diff, OwnedDiff::Reset { .. })),
                        "{context}: a tail slide sent a Reset: {window_diffs:?}"
                    );
                }
            }
        }
    }
    (harness.n_tail_slides, harness.n_not_found, harness.n_anchored_outside_view)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

#[test]
fn anchored_and_tail_windows_rebuilt_from_diffs_equal_the_reference() {
    let n_seeds = env_usize("ORDO_MODEL_SEEDS", 9) as u64;
    let n_steps = env_usize("ORDO_MODEL_STEPS", 200);
    let seeds: Vec<u64> = match std::env::var("ORDO_MODEL_SEED") {
        Ok(seed) => vec![seed.parse().expect("ORDO_MODEL_SEED is a number")],
        Err(_) => (0..n_seeds).collect(),
    };
    let (mut n_slides, mut n_not_found, mut n_outside) = (0, 0, 0);
    for seed in seeds {
        match std::panic::catch_unwind(|| run_seed(seed, n_steps)) {
            Ok((slides, not_found, outside)) => {
                n_slides += slides;
                n_not_found += not_found;
                n_outside += outside;
            }
            Err(panic) => {
                eprintln!("key-window model test failed with seed {seed}; replay with ORDO_MODEL_SEED={seed}");
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("tail slides {n_slides}, unknown ids {n_not_found}, anchors outside their view {n_outside}");
    if n_steps >= 100 {
        assert!(n_slides > 20 && n_not_found > 5 && n_outside > 5, "the run missed a case");
    }
}

#[test]
fn around_row_must_be_a_row_of_the_window() {
    let mut engine = Engine::new();
    let rooms = engine.create_collection("rooms", schema()).unwrap();
    let mut batch = Batch::new();
    batch.upsert("!a").set("score", Value::I64(1));
    engine.apply_batch(rooms, &batch, &mut CollectingSink::new()).unwrap();
    let def = ViewDef::new(Filter::True, vec![]);
    let error = engine
        .open_window_at(rooms, &def, WindowAnchor::Around { id: "!a", row: 5 }, 5, &mut CollectingSink::new())
        .unwrap_err();
    assert_eq!(error, ViewError::AnchorRowOutsideWindow { row: 5, limit: 5 });
    let (window, range) = engine
        .open_window_at(rooms, &def, WindowAnchor::Around { id: "!a", row: 4 }, 5, &mut CollectingSink::new())
        .unwrap();
    assert_eq!(range, WindowRange { offset: 0, limit: 5, is_tail: false });
    assert_eq!(engine.stats().n_views, 1, "the refused open left no view of its own");
    engine.close_window(window).unwrap();
}
