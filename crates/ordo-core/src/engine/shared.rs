//! What many collections and views hold alike, held once: schemas and view plans.
//!
//! A million users' lists are a million collections with the same schema and a
//! million views with the same definition. Each used to keep its own copy: the
//! schema's field list and names, the definition and its compiled filter and sort,
//! about 700 B of heap per list before an item was added (the goal for the whole
//! list is 1 KiB of fixed heap: `tests/it/many_lists.rs`). Equal values are now one `Arc` found in an
//! [`Interner`], and each holder keeps a pointer.
//!
//! Sharing is copy-on-write: a collection that changes its schema (a schema
//! change, a derived field added for a view) makes its own copy and leaves the
//! others alone. A plan is compiled against one schema and records which
//! (`ViewPlan::schema`), so two views share a plan only if their collections
//! share the very schema the plan was compiled for; an equal schema in another
//! allocation gets its own plan, which is correct and merely less shared.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Weak};

use hashbrown::{DefaultHashBuilder, HashTable};

use crate::schema::Schema;
use crate::view::{MovePlan, ViewPlan};
use crate::view_def::ViewDef;

/// A set of live shared values, found by hash and an equality test.
///
/// Entries are weak: a value lives while something outside holds it, and the
/// table never keeps one alive. A dead entry's allocation (the `Arc`'s block)
/// stays until the entry goes, so dead entries are dropped when their holder
/// lets go ([`Interner::release`]) and, as a net for the rest, before the table
/// would grow: it never holds more than twice its live values.
pub(crate) struct Interner<T> {
    entries: HashTable<(u64, Weak<T>)>,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner { entries: HashTable::new() }
    }
}

impl<T> Interner<T> {
    /// The live value with `hash` that `is_same` accepts.
    pub(crate) fn find(&self, hash: u64, is_same: impl Fn(&T) -> bool) -> Option<Arc<T>> {
        let (_, weak) = self.entries.find(hash, |(entry_hash, weak)| {
            *entry_hash == hash && weak.upgrade().is_some_and(|value| is_same(&value))
        })?;
        weak.upgrade()
    }

    /// Shares `value` (which [`Interner::find`] did not find).
    pub(crate) fn insert(&mut self, hash: u64, value: T) -> Arc<T> {
        if self.entries.len() == self.entries.capacity() {
            self.entries.retain(|(_, weak)| weak.strong_count() > 0);
        }
        let value = Arc::new(value);
        self.entries.insert_unique(hash, (hash, Arc::downgrade(&value)), |(entry_hash, _)| *entry_hash);
        value
    }

    /// Drops `value`, and its entry if this was the last holder.
    pub(crate) fn release(&mut self, value: Arc<T>, hash: u64) {
        if Arc::strong_count(&value) == 1 {
            let weak = Arc::downgrade(&value);
            drop(value);
            if let Ok(entry) = self.entries.find_entry(hash, |(_, entry)| Weak::ptr_eq(entry, &weak)) {
                entry.remove();
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The engine's shared schemas and view plans.
#[derive(Default)]
pub(crate) struct Shared {
    hasher: DefaultHashBuilder,
    schemas: Interner<Schema>,
    plans: Interner<ViewPlan>,
    /// The plans' move parts, shared by plans that differ only in their filter's
    /// literals (see [`MovePlan`]).
    move_plans: Interner<MovePlan>,
}

impl Shared {
    /// A schema equal to `schema` (fields and derived fields) shared with the
    /// collections that already have one.
    pub(crate) fn schema(&mut self, mut schema: Schema) -> Arc<Schema> {
        let hash = self.schema_hash(&schema);
        if let Some(shared) = self.schemas.find(hash, |candidate| candidate.is_identical(&schema)) {
            return shared;
        }
        schema.shrink_to_fit();
        self.schemas.insert(hash, schema)
    }

    /// Lets go of a dropped collection's schema.
    pub(crate) fn release_schema(&mut self, schema: Arc<Schema>) {
        let hash = self.schema_hash(&schema);
        self.schemas.release(schema, hash);
    }

    /// The plan of `def` over `schema`, shared with the views that already have it;
    /// `compile` makes one (it fails, and nothing is shared, on a bad definition).
    pub(crate) fn plan<E>(
        &mut self,
        schema: &Arc<Schema>,
        def: &ViewDef,
        compile: impl FnOnce() -> Result<ViewPlan, E>,
    ) -> Result<Arc<ViewPlan>, E> {
        let hash = self.plan_hash(schema, def);
        let is_same = |plan: &ViewPlan| Arc::ptr_eq(&plan.schema, schema) && plan.def == *def;
        if let Some(plan) = self.plans.find(hash, is_same) {
            return Ok(plan);
        }
        let ViewPlan { def, filter, moves, schema } = compile()?;
        let moves = self.move_plan(moves);
        Ok(self.plans.insert(hash, ViewPlan { def, filter, moves, schema }))
    }

    /// A move plan equal to `moves` (just compiled, held only here), shared.
    fn move_plan(&mut self, moves: Arc<MovePlan>) -> Arc<MovePlan> {
        let hash = self.move_plan_hash(&moves);
        if let Some(shared) = self.move_plans.find(hash, |candidate| *candidate == *moves) {
            return shared;
        }
        match Arc::try_unwrap(moves) {
            Ok(moves) => self.move_plans.insert(hash, moves),
            // Held elsewhere too: not shared, which is correct and merely less shared.
            Err(moves) => moves,
        }
    }

    /// Lets go of a dropped view's plan (the view's own hold on the plan's
    /// move plan dropped first).
    pub(crate) fn release_plan(&mut self, plan: Arc<ViewPlan>) {
        let moves = Arc::clone(&plan.moves);
        let hash = self.plan_hash(&plan.schema, &plan.def);
        self.plans.release(plan, hash);
        let hash = self.move_plan_hash(&moves);
        self.move_plans.release(moves, hash);
    }

    fn move_plan_hash(&self, moves: &MovePlan) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        moves.sort.hash_shape(&mut hasher);
        moves.filter_fields.hash(&mut hasher);
        hasher.finish()
    }

    fn schema_hash(&self, schema: &Schema) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        schema.hash_identity(&mut hasher);
        hasher.finish()
    }

    fn plan_hash(&self, schema: &Arc<Schema>, def: &ViewDef) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        // The schema by address: a plan is shared only over the very same schema.
        Arc::as_ptr(schema).hash(&mut hasher);
        def.hash_shape(&mut hasher);
        hasher.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CollectingSink, Engine, FieldType, Filter, OwnedValue, SortKey, Value, WindowId};

    #[test]
    fn lists_differing_only_in_their_filter_literal_share_one_move_plan() {
        let mut engine = Engine::new();
        let mut sink = CollectingSink::new();
        let schema = Schema::new().with_field("owner", FieldType::String).with_field("recency", FieldType::U64);
        let members = engine.create_collection("members", schema).unwrap();
        let mut batch = crate::Batch::new();
        for (id, owner) in [("m1", "a"), ("m2", "b")] {
            batch.upsert(id).set("owner", Value::Str(owner)).set("recency", Value::U64(1));
        }
        engine.apply_batch(members, &batch, &mut sink).unwrap();
        let list =
            |owner: &str, sort: SortKey| ViewDef::new(Filter::eq("owner", OwnedValue::Str(owner.into())), vec![sort]);
        let mut open = |def: ViewDef| engine.open_window(members, &def, 0, 10, &mut sink).unwrap();
        let windows: Vec<WindowId> = vec![
            open(list("a", SortKey::desc("recency"))),
            open(list("b", SortKey::desc("recency"))),
            open(list("a", SortKey::asc("recency"))),
        ];
        let view_of = |window: WindowId| {
            let view_index = engine.windows[window.index as usize].window.as_ref().unwrap().view;
            engine.views[view_index as usize].as_ref().unwrap()
        };
        let (a, b, a_ascending) = (view_of(windows[0]), view_of(windows[1]), view_of(windows[2]));
        assert!(!Arc::ptr_eq(&a.plan, &b.plan), "a plan per owner: the literal differs");
        assert!(Arc::ptr_eq(&a.moves, &b.moves), "one move plan for both owners' lists");
        assert!(Arc::ptr_eq(&a.moves, &a.plan.moves), "a view holds its plan's move plan");
        assert!(!Arc::ptr_eq(&a.moves, &a_ascending.moves), "another sort, another move plan");
        assert_eq!(engine.shared.move_plans.len(), 2);
        for window in windows {
            engine.close_window(window).unwrap();
        }
        assert_eq!(engine.shared.move_plans.len(), 0, "the last view gone, its move plan goes");
    }

    #[test]
    fn equal_values_are_one_and_dead_entries_go() {
        let mut interner: Interner<String> = Interner::default();
        let intern = |interner: &mut Interner<String>, hash: u64, text: &str| {
            interner.find(hash, |value| value == text).unwrap_or_else(|| interner.insert(hash, text.to_owned()))
        };
        let a = intern(&mut interner, 1, "a");
        let again = intern(&mut interner, 1, "a");
        assert!(Arc::ptr_eq(&a, &again));
        // Same hash, different value: a second entry.
        let b = intern(&mut interner, 1, "b");
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(interner.len(), 2);
        // Not the last holder: the entry stays.
        interner.release(again, 1);
        assert_eq!(interner.len(), 2);
        interner.release(a, 1);
        assert_eq!(interner.len(), 1);
        // A value dropped without `release` is not found again, and its entry goes
        // before the table grows.
        drop(b);
        let b2 = intern(&mut interner, 1, "b");
        assert_eq!(Arc::strong_count(&b2), 1);
        let mut held = Vec::new();
        for n in 0..100u64 {
            let value = interner.insert(n + 10, n.to_string());
            if n % 2 == 0 {
                held.push(value);
            }
        }
        assert!(
            interner.len() <= 2 * (held.len() + 1),
            "{} entries for {} live values",
            interner.len(),
            held.len() + 1
        );
    }
}
