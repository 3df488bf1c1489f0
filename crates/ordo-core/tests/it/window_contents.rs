//! `DiffSink::window_contents`: after every call that changed a window, a sink
//! that asks gets the window's contents read from the view, and they equal the
//! list its diffs built (the contents a server hashes into a frame's digest).

use std::collections::HashMap;

use ordo_core::{
    Batch, CollectionId, DiffRef, DiffSink, Engine, Filter, ItemList, ItemRef, OwnedValue, SortKey, Value, ViewDef,
    WindowAnchor, WindowId,
};

use crate::alloc::room_schema;
use crate::reference::Rng;

/// A row as the digest sees it: the id and the version.
type Row = (String, u64);

fn row(item: ItemRef<'_>) -> Row {
    (item.id().to_owned(), item.version())
}

fn rows(items: ItemList<'_>) -> Vec<Row> {
    items.iter().map(row).collect()
}

/// Applies every diff to its window's list and checks each `window_contents`
/// against that list; asks for contents only for windows up to `limit_max` rows.
struct CheckingSink {
    lists: HashMap<WindowId, Vec<Row>>,
    limit_max: usize,
    /// Windows whose diffs came in the current call, in order.
    changed: Vec<WindowId>,
    n_contents: usize,
    n_done: usize,
}

impl DiffSink for CheckingSink {
    fn diff(&mut self, window: WindowId, diff: DiffRef<'_>) {
        if self.changed.last() != Some(&window) {
            self.changed.push(window);
        }
        let list = self.lists.entry(window).or_default();
        match diff {
            DiffRef::Append { values } => list.extend(rows(values)),
            DiffRef::Clear => list.clear(),
            DiffRef::PushFront { value } => list.insert(0, row(value)),
            DiffRef::PushBack { value } => list.push(row(value)),
            DiffRef::PopFront => {
                list.remove(0);
            }
            DiffRef::PopBack => {
                list.pop();
            }
            DiffRef::Insert { index, value } => list.insert(index, row(value)),
            DiffRef::Set { index, value } => list[index] = row(value),
            DiffRef::Remove { index } => {
                list.remove(index);
            }
            DiffRef::Truncate { length } => list.truncate(length),
            DiffRef::Reset { values } => *list = rows(values),
        }
    }

    fn wants_contents(&mut self, window: WindowId, limit: usize) -> bool {
        assert_eq!(self.changed.last(), Some(&window), "contents asked for a window with no diffs");
        limit <= self.limit_max
    }

    fn window_contents(&mut self, window: WindowId, items: ItemList<'_>) {
        assert_eq!(rows(items), self.lists[&window], "contents of {window:?} differ from its diffs");
        self.n_contents += 1;
    }

    fn window_done(&mut self, _window: WindowId) {
        self.n_done += 1;
    }
}

fn upsert_random(engine: &mut Engine, rooms: CollectionId, rng: &mut Rng, batch: &mut Batch, sink: &mut CheckingSink) {
    batch.clear();
    for _ in 0..1 + rng.below(6) {
        let id = format!("room{:02}", rng.below(60));
        if rng.one_in(6) {
            batch.remove(&id);
        } else {
            batch
                .upsert(&id)
                .set("name", Value::Str(&format!("n{}", rng.below(30))))
                .set("recency", Value::U64(rng.below(1_000) as u64))
                .set("left", Value::Bool(rng.one_in(4)));
        }
    }
    engine.apply_batch(rooms, batch, sink).unwrap();
}

#[test]
fn contents_equal_the_diffs_after_every_call() {
    for seed in 1..=20 {
        let mut rng = Rng::new(seed);
        let mut engine = Engine::new();
        let rooms = engine.create_collection("rooms", room_schema()).unwrap();
        let mut sink =
            CheckingSink { lists: HashMap::new(), limit_max: 8, changed: Vec::new(), n_contents: 0, n_done: 0 };
        let mut batch = Batch::new();
        let by_recency = ViewDef::new(Filter::True, vec![SortKey::desc("recency")]);
        let joined = ViewDef::new(Filter::eq("left", OwnedValue::Bool(false)), vec![SortKey::asc("name")]);
        let mut windows = vec![
            engine.open_window(rooms, &by_recency, 0, 5, &mut sink).unwrap(),
            engine.open_window(rooms, &joined, 3, 8, &mut sink).unwrap(),
            // Past `limit_max`: its contents are never asked for.
            engine.open_window(rooms, &by_recency, 0, 20, &mut sink).unwrap(),
        ];
        let (tail, _) = engine.open_window_at(rooms, &joined, WindowAnchor::Tail, 4, &mut sink).unwrap();
        windows.push(tail);
        for _ in 0..300 {
            sink.changed.clear();
            let (contents_before, done_before) = (sink.n_contents, sink.n_done);
            let window = windows[rng.below(windows.len())];
            match rng.below(10) {
                0 => engine.set_window_range(window, rng.below(10), 1 + rng.below(8), &mut sink).unwrap(),
                1 => engine
                    .set_window_view(window, if rng.chance(50) { &by_recency } else { &joined }, &mut sink)
                    .unwrap(),
                2 => engine.emit_window_reset(window, &mut sink).unwrap(),
                _ => upsert_random(&mut engine, rooms, &mut rng, &mut batch, &mut sink),
            }
            // Every window that changed and fits got its contents, once.
            let n_changed = sink.n_done - done_before;
            assert_eq!(n_changed, sink.changed.len(), "seed {seed}");
            let n_small = sink.changed.iter().filter(|window| engine.window_range(**window).unwrap().1 <= 8).count();
            assert_eq!(sink.n_contents - contents_before, n_small, "seed {seed}");
        }
        for window in windows {
            let expected: Vec<String> = engine.window_items(window).unwrap().into_iter().map(|item| item.id).collect();
            let got: Vec<String> = sink.lists[&window].iter().map(|(id, _)| id.clone()).collect();
            assert_eq!(got, expected, "seed {seed}");
        }
    }
}
