//! Keyed views: an update visits only the views of its item's old and new key
//! values, plus the unkeyed ones, however many users have views. Counted through
//! `EngineStats::n_view_visits`, not assumed.

use ordo_core::{
    Batch, CollectingSink, CollectionId, CompareOp, Engine, FieldType, Filter, OwnedDiff, OwnedValue, Schema, SortKey,
    Value, ViewDef, WindowId,
};

pub const N_USERS: usize = 1_000;
const ITEMS_PER_USER: usize = 10;

pub fn shared_schema() -> Schema {
    Schema::new().with_field("owner", FieldType::String).with_field("recency", FieldType::U64)
}

pub fn user_name(user: usize) -> String {
    format!("user-{user:04}")
}

pub fn item_id(item: usize) -> String {
    format!("item-{item:06}")
}

/// What the server opens for a user: the row predicate conjoined with the client's filter.
pub fn user_def(user: usize) -> ViewDef {
    ViewDef::new(
        Filter::All(vec![
            Filter::eq("owner", OwnedValue::Str(user_name(user))),
            Filter::compare("recency", CompareOp::Ge, OwnedValue::U64(0)),
        ]),
        vec![SortKey::desc("recency")],
    )
}

/// Views no key can narrow: every update must visit them.
fn unkeyed_defs() -> Vec<ViewDef> {
    let owner = |user: usize| Filter::eq("owner", OwnedValue::Str(user_name(user)));
    vec![
        ViewDef::new(Filter::True, vec![SortKey::desc("recency")]),
        ViewDef::new(Filter::Any(vec![owner(1), owner(2)]), vec![SortKey::desc("recency")]),
        ViewDef::new(Filter::Not(Box::new(owner(3))), vec![SortKey::asc("recency")]),
    ]
}

/// A collection of `N_USERS * ITEMS_PER_USER` items, item `i` owned by user `i % N_USERS`.
pub fn shared_collection(engine: &mut Engine) -> CollectionId {
    let collection = engine.create_collection("shared", shared_schema()).unwrap();
    let mut batch = Batch::new();
    for item in 0..N_USERS * ITEMS_PER_USER {
        batch
            .upsert(&item_id(item))
            .set("owner", Value::Str(&user_name(item % N_USERS)))
            .set("recency", Value::U64(item as u64))
            .payload(b"preview");
    }
    engine.apply_batch(collection, &batch, &mut CollectingSink::new()).unwrap();
    collection
}

struct Setup {
    engine: Engine,
    collection: CollectionId,
    user_windows: Vec<WindowId>,
    sink: CollectingSink,
}

fn setup(is_keyed: bool) -> Setup {
    let mut engine = Engine::new();
    engine.set_view_keying(is_keyed);
    let collection = shared_collection(&mut engine);
    let mut sink = CollectingSink::new();
    let user_windows =
        (0..N_USERS).map(|user| engine.open_window(collection, &user_def(user), 0, 20, &mut sink).unwrap()).collect();
    for def in unkeyed_defs() {
        engine.open_window(collection, &def, 0, 20, &mut sink).unwrap();
    }
    sink.diffs.clear();
    Setup { engine, collection, user_windows, sink }
}

impl Setup {
    /// Applies one upsert; returns the views it visited.
    fn upsert(&mut self, item: usize, owner: Option<usize>, recency: u64) -> u64 {
        let mut batch = Batch::new();
        let owner_name = owner.map(user_name);
        let upsert = batch.upsert(&item_id(item)).set("recency", Value::U64(recency));
        if let Some(owner_name) = &owner_name {
            upsert.set("owner", Value::Str(owner_name));
        }
        self.apply(&batch)
    }

    fn apply(&mut self, batch: &Batch) -> u64 {
        let before = self.engine.stats().n_view_visits;
        self.engine.apply_batch(self.collection, batch, &mut self.sink).unwrap();
        self.engine.stats().n_view_visits - before
    }

    fn user_window_items(&mut self, user: usize) -> Vec<String> {
        let items = self.engine.window_items(self.user_windows[user]).unwrap();
        items.into_iter().map(|item| item.id).collect()
    }
}

#[test]
fn an_update_visits_only_the_views_of_its_old_and_new_keys() {
    let mut keyed = setup(true);
    let stats = keyed.engine.stats();
    assert_eq!((stats.n_views, stats.n_keyed_views), (N_USERS + 3, N_USERS));
    let n_unkeyed = 3;

    // Same owner, new recency: the owner's view and the unkeyed ones.
    let item = 5 * N_USERS + 7;
    assert_eq!(keyed.upsert(item, None, 1_000_000), n_unkeyed + 1);
    assert_eq!(keyed.user_window_items(7)[0], item_id(item));
    // A new owner: the old owner's view and the new owner's, and the unkeyed ones.
    keyed.sink.diffs.clear();
    assert_eq!(keyed.upsert(item, Some(8), 1_000_001), n_unkeyed + 2);
    assert!(!keyed.user_window_items(7).contains(&item_id(item)));
    assert_eq!(keyed.user_window_items(8)[0], item_id(item));
    let touched: Vec<WindowId> = keyed.sink.diffs.iter().map(|(window, _)| *window).collect();
    assert!(touched.contains(&keyed.user_windows[7]) && touched.contains(&keyed.user_windows[8]));
    for (user, window) in keyed.user_windows.iter().enumerate() {
        assert!(user == 7 || user == 8 || !touched.contains(window), "user {user}'s window got diffs");
    }
    // A remove: the old owner's view; a new item: the new owner's.
    let mut batch = Batch::new();
    batch.remove(&item_id(item));
    assert_eq!(keyed.apply(&batch), n_unkeyed + 1);
    assert!(!keyed.user_window_items(8).contains(&item_id(item)));
    // Removing it again: no item, no visit.
    assert_eq!(keyed.apply(&batch), 0);
    assert_eq!(keyed.upsert(N_USERS * ITEMS_PER_USER, Some(9), 2_000_000), n_unkeyed + 1);
    assert_eq!(keyed.user_window_items(9)[0], item_id(N_USERS * ITEMS_PER_USER));
    // Between owners with no view: only the unkeyed views.
    assert_eq!(keyed.upsert(1, Some(N_USERS + 1), 3), n_unkeyed + 1);
    assert_eq!(keyed.upsert(1, Some(N_USERS + 2), 4), n_unkeyed);
    // A batch of many updates: at most two keyed views per operation.
    let mut batch = Batch::new();
    let n_ops = 500;
    let names: Vec<String> = (0..n_ops).map(|op| user_name(op * 7 % N_USERS)).collect();
    for (op, name) in names.iter().enumerate() {
        batch.upsert(&item_id(op * 13)).set("owner", Value::Str(name)).set("recency", Value::U64(op as u64));
    }
    let visits = keyed.apply(&batch);
    assert!(visits <= (n_ops * (n_unkeyed as usize + 2)) as u64, "{visits} visits for {n_ops} updates");
    keyed.engine.check_key_indexes();

    // The counter counts what it claims: without keys, every update visits every view.
    let mut unkeyed = setup(false);
    assert_eq!(unkeyed.engine.stats().n_keyed_views, 0);
    assert_eq!(unkeyed.upsert(item, None, 1_000_000), (N_USERS + 3) as u64);
}

#[test]
fn a_keyed_view_is_built_from_its_key_and_shared_like_any_view() {
    let mut engine = Engine::new();
    let collection = shared_collection(&mut engine);
    let mut sink = CollectingSink::new();
    // A collection's lone view is not keyed (the index would save no work); the
    // second keys both.
    let other = engine.open_window(collection, &user_def(7), 0, 5, &mut sink).unwrap();
    assert_eq!((engine.stats().n_views, engine.stats().n_keyed_views), (1, 0), "a lone view is not keyed");
    let first = engine.open_window(collection, &user_def(42), 0, 5, &mut sink).unwrap();
    let second = engine.open_window(collection, &user_def(42), 2, 5, &mut sink).unwrap();
    let stats = engine.stats();
    assert_eq!((stats.n_views, stats.n_keyed_views, stats.n_windows), (2, 2, 3), "equal definitions share a view");
    assert_eq!(engine.view_len(first).unwrap(), ITEMS_PER_USER);
    let expected: Vec<String> = (0..5).map(|rank| item_id((ITEMS_PER_USER - 1 - rank) * N_USERS + 42)).collect();
    let Some(OwnedDiff::Reset { values }) = sink.take_for(first).pop() else { panic!("no reset") };
    assert_eq!(values.iter().map(|item| item.id.clone()).collect::<Vec<_>>(), expected);
    assert_eq!(engine.window_items(second).unwrap().len(), 5);
    // The last window of the key's last view drops the view and the equality index;
    // a new view builds them again, from the items as they are now: alone, by
    // filtering; keyed, once a second view comes.
    engine.close_window(first).unwrap();
    engine.close_window(second).unwrap();
    engine.close_window(other).unwrap();
    assert_eq!(engine.stats().n_keyed_views, 0);
    let mut batch = Batch::new();
    batch.upsert(&item_id(0)).set("owner", Value::Str(&user_name(42)));
    engine.apply_batch(collection, &batch, &mut sink).unwrap();
    let window = engine.open_window(collection, &user_def(42), 0, 20, &mut sink).unwrap();
    assert_eq!(engine.view_len(window).unwrap(), ITEMS_PER_USER + 1);
    assert_eq!(engine.stats().n_keyed_views, 0);
    let other = engine.open_window(collection, &user_def(7), 0, 5, &mut sink).unwrap();
    assert_eq!(engine.stats().n_keyed_views, 2, "the second view keys the lone one");
    // The converted view follows updates through the index: an item leaves it.
    batch.clear();
    batch.upsert(&item_id(0)).set("owner", Value::Str(&user_name(7)));
    engine.apply_batch(collection, &batch, &mut sink).unwrap();
    assert_eq!(engine.view_len(window).unwrap(), ITEMS_PER_USER);
    assert_eq!(engine.view_len(other).unwrap(), ITEMS_PER_USER + 1);
    engine.check_key_indexes();
}
