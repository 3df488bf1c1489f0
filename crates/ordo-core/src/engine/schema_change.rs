//! Schema changes of a live collection, and dropping one.
//!
//! A field is appended with a default every existing item takes; no view reads
//! a field that did not exist, so every window stays as it is. Removing a field
//! ends the windows of every view that reads it (in its filter or its sort): the
//! caller learns which, to tell their holders. The fields after it move down by
//! one, so every other view of the collection is compiled again against the new
//! schema (its filter and sort name fields, and compiling resolves the names to
//! the new ids), and the equality index renumbers its keyed fields. Its sorted
//! index and membership are untouched: no item's data changed, and the sort keys
//! encode values, not field ids. Dropping a collection ends every window on it
//! and frees its name; its id dies with it (see `collection_table`).
//!
//! Every window of the collection that stays open receives a `Reset` after a
//! change of fields: its items (same ids, same order) now carry one field more
//! or one fewer, and a client's copies must take the new shape.
//!
//! These are control-plane operations: O(items) or O(views), with allocations,
//! never on the update path.

use std::sync::Arc;

use super::Engine;
use crate::diff::DiffSink;
use crate::filter::CompiledFilter;
use crate::ids::{CollectionId, WindowId};
use crate::limits;
use crate::schema::{FieldId, FieldType, Schema, SchemaError};
use crate::sort::CompiledSort;
use crate::value::{OwnedValue, Value};
use crate::view::{MovePlan, ViewPlan};

/// Why a schema change or a drop was refused. A refused change changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaChangeError {
    UnknownCollection,
    UnknownField {
        field: String,
    },
    /// A duplicate or invalid name, or one field past `MAX_FIELDS_PER_SCHEMA`.
    Schema(SchemaError),
    DefaultWrongType {
        field: String,
        expected: &'static str,
        found: &'static str,
    },
    DefaultNotANumber {
        field: String,
    },
    DefaultTooLong {
        field: String,
        value_bytes: usize,
    },
    /// A collection is dropped while a ref field of `by` targets it: remove that field first.
    CollectionReferenced {
        by: String,
        field: String,
    },
}

impl std::fmt::Display for SchemaChangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchemaChangeError::UnknownCollection => write!(f, "no such collection"),
            SchemaChangeError::UnknownField { field } => write!(f, "the schema has no field `{field}`"),
            SchemaChangeError::Schema(error) => write!(f, "{error}"),
            SchemaChangeError::CollectionReferenced { by, field } => write!(
                f,
                "collection `{by}` references this collection through field `{field}`; remove that field first"
            ),
            SchemaChangeError::DefaultWrongType { field, expected, found } => {
                write!(f, "the default of field `{field}` must be {expected}, got {found}")
            }
            SchemaChangeError::DefaultNotANumber { field } => {
                write!(f, "the default of field `{field}` is NaN; f64 fields must be ordered, so NaN is refused")
            }
            SchemaChangeError::DefaultTooLong { field, value_bytes } => write!(
                f,
                "the default of field `{field}` is {value_bytes} bytes; at most {} are allowed",
                limits::MAX_STRING_FIELD_BYTES
            ),
        }
    }
}

impl std::error::Error for SchemaChangeError {}

impl Engine {
    /// Checks that `add_field` would succeed; returns the schema it would leave
    /// (a store writes that to disk before the engine changes).
    pub fn check_add_field(
        &self,
        collection_id: CollectionId,
        name: &str,
        field_type: FieldType,
        default: &OwnedValue,
    ) -> Result<Schema, SchemaChangeError> {
        let state = self.collections.get(collection_id).ok_or(SchemaChangeError::UnknownCollection)?;
        let schema =
            state.collection.schema().clone().try_with_field(name, field_type).map_err(SchemaChangeError::Schema)?;
        if let Some(target) = field_type.ref_target() {
            // A collection referencing itself would refresh its own items mid-batch.
            if target == collection_id || self.collections.get(target).is_none() {
                return Err(SchemaChangeError::Schema(SchemaError::UnknownRefTarget { field: name.to_owned() }));
            }
            // References form no cycle, so a store can always create targets first at open.
            if self.refs_reach(target, collection_id) {
                return Err(SchemaChangeError::Schema(SchemaError::RefCycle { field: name.to_owned() }));
            }
        }
        check_default(name, field_type, default.as_value())?;
        Ok(schema)
    }

    /// Appends a field to a live collection; every existing item gets `default`
    /// (`OwnedValue::Null`: no value). Every window on the collection receives a
    /// `Reset` through `sink`: the same items, with the new field.
    pub fn add_field(
        &mut self,
        collection_id: CollectionId,
        name: &str,
        field_type: FieldType,
        default: &OwnedValue,
        sink: &mut dyn DiffSink,
    ) -> Result<(), SchemaChangeError> {
        let schema = self.check_add_field(collection_id, name, field_type, default)?;
        let value = check_default(name, field_type, default.as_value())?;
        let state = self.collections.get_mut(collection_id).expect("checked above");
        state.collection.add_column(schema, value);
        self.reset_windows_of(collection_id, sink);
        Ok(())
    }

    /// Checks that `remove_field` would succeed; returns the schema it would leave.
    pub fn check_remove_field(&self, collection_id: CollectionId, name: &str) -> Result<Schema, SchemaChangeError> {
        let state = self.collections.get(collection_id).ok_or(SchemaChangeError::UnknownCollection)?;
        let schema = state.collection.schema();
        let field_id =
            schema.field_id(name).ok_or_else(|| SchemaChangeError::UnknownField { field: name.to_owned() })?;
        Ok(schema.without_field(field_id))
    }

    /// Removes a field from a live collection. Every window whose view reads it
    /// (filter or sort) is closed; they are returned, by window index, so that the
    /// caller can tell whoever held them. Every other window on the collection
    /// receives a `Reset` through `sink`: the same items, without the field.
    pub fn remove_field(
        &mut self,
        collection_id: CollectionId,
        name: &str,
        sink: &mut dyn DiffSink,
    ) -> Result<Vec<WindowId>, SchemaChangeError> {
        let new_schema = self.check_remove_field(collection_id, name)?;
        let field_id = self.collections.get(collection_id).expect("checked").collection.schema().field_id(name);
        let field_id = field_id.expect("checked");
        // Derived fields (read through references) are positional and name target
        // field ids, which shift: the windows reading through references out of this
        // collection, or into it, end (see `references::forget_refs_of`).
        let mut ended_by_refs = self.forget_refs_of(collection_id);
        let referrers: Vec<CollectionId> = self
            .collections
            .get(collection_id)
            .expect("checked")
            .refs
            .referrers
            .iter()
            .map(|&(referrer, _)| referrer)
            .collect();
        for referrer in referrers {
            ended_by_refs.extend(self.forget_refs_of(referrer));
        }
        // A view reads the field exactly when its definition names it, that is when
        // it no longer compiles without it.
        let mut recompiled = Vec::new();
        let mut ending = Vec::new();
        for (view_index, view) in self.views.iter().enumerate() {
            let Some(view) = view.as_ref().filter(|view| view.collection == collection_id.index) else { continue };
            match (
                CompiledFilter::compile(&view.plan.def.filter, &new_schema),
                CompiledSort::compile(&view.plan.def.sort, &new_schema),
            ) {
                (Ok(filter), Ok(sort)) => recompiled.push((view_index, filter, sort)),
                _ => ending.push(view_index),
            }
        }
        let ended = self.close_windows_of_views(&ending);
        let state = self.collections.get_mut(collection_id).expect("checked");
        state.collection.remove_column(field_id);
        state.keys.remap_after_removal(field_id);
        for (view_index, filter, sort) in recompiled {
            let view = self.views[view_index].as_mut().expect("kept views stay live");
            if let Some(key) = &mut view.key {
                debug_assert_ne!(key.field_id, field_id);
                if key.field_id > field_id {
                    key.field_id = FieldId(key.field_id.0 - 1);
                }
            }
            // Not shared: the collection's schema is its own from now on.
            let moves = Arc::new(MovePlan::new(sort, &filter));
            let plan = ViewPlan {
                def: view.plan.def.clone(),
                filter,
                moves: Arc::clone(&moves),
                schema: Arc::clone(state.collection.shared_schema()),
            };
            view.moves = moves;
            let old_plan = std::mem::replace(&mut view.plan, Arc::new(plan));
            self.shared.release_plan(old_plan);
        }
        self.reset_windows_of(collection_id, sink);
        ended_by_refs.extend(ended);
        Ok(ended_by_refs)
    }

    /// Drops a collection: every window on it is closed (and returned, by window
    /// index), its items are freed, its name is free for a new collection, and
    /// `collection_id` is dead (see [`CollectionId`]).
    pub fn drop_collection(&mut self, collection_id: CollectionId) -> Result<Vec<WindowId>, SchemaChangeError> {
        if self.collections.get(collection_id).is_none() {
            return Err(SchemaChangeError::UnknownCollection);
        }
        self.check_not_referenced(collection_id)?;
        // First the views reading through its references, and its links out of the table of their targets.
        let mut ended = self.forget_refs_of(collection_id);
        let views: Vec<usize> = (0..self.views.len())
            .filter(|&index| self.views[index].as_ref().is_some_and(|view| view.collection == collection_id.index))
            .collect();
        ended.extend(self.close_windows_of_views(&views));
        // A view lives only while it has windows, so none of the collection's is left.
        debug_assert!(self.views.iter().flatten().all(|view| view.collection != collection_id.index));
        let state = self.collections.remove(collection_id).expect("checked above");
        self.shared.release_schema(state.collection.into_shared_schema());
        Ok(ended)
    }

    /// Whether following `ref` fields from `from` (any number of hops) reaches `to`.
    fn refs_reach(&self, from: CollectionId, to: CollectionId) -> bool {
        let mut pending = vec![from];
        let mut seen = Vec::new();
        while let Some(collection) = pending.pop() {
            if collection == to {
                return true;
            }
            if seen.contains(&collection) {
                continue;
            }
            seen.push(collection);
            if let Some(state) = self.collections.get(collection) {
                pending.extend(
                    state.collection.schema().fields().iter().filter_map(|field| field.field_type.ref_target()),
                );
            }
        }
        false
    }

    /// Refuses to drop a collection that a ref field of another collection targets.
    pub fn check_not_referenced(&self, collection_id: CollectionId) -> Result<(), SchemaChangeError> {
        for state in self.collections.iter() {
            for field in state.collection.schema().fields() {
                if field.field_type.ref_target() == Some(collection_id) {
                    return Err(SchemaChangeError::CollectionReferenced {
                        by: state.collection.name().to_owned(),
                        field: field.name.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Sends every window on the collection a `Reset` with its current items.
    fn reset_windows_of(&mut self, collection_id: CollectionId, sink: &mut dyn DiffSink) {
        let mut windows: Vec<WindowId> = self
            .views
            .iter()
            .flatten()
            .filter(|view| view.collection == collection_id.index)
            .flat_map(|view| view.windows.iter())
            .map(|&index| WindowId { index, generation: self.windows[index as usize].generation })
            .collect();
        windows.sort_unstable_by_key(|window| window.index);
        for window in windows {
            self.emit_window_reset(window, sink).expect("a live window of a live view");
        }
    }

    /// Closes every window of the listed views (which go with their last window);
    /// returns the windows, by index.
    pub(super) fn close_windows_of_views(&mut self, view_indices: &[usize]) -> Vec<WindowId> {
        let mut ended: Vec<WindowId> = view_indices
            .iter()
            .flat_map(|&view_index| self.views[view_index].as_ref().expect("live view").windows.iter())
            .map(|&index| WindowId { index, generation: self.windows[index as usize].generation })
            .collect();
        ended.sort_unstable_by_key(|window| window.index);
        for &window in &ended {
            self.close_window(window).expect("a live window of a live view");
        }
        ended
    }
}

/// Converts a default to its field's type and checks it against the limits.
fn check_default<'a>(name: &str, field_type: FieldType, default: Value<'a>) -> Result<Value<'a>, SchemaChangeError> {
    match default.coerce_to(field_type) {
        None => Err(SchemaChangeError::DefaultWrongType {
            field: name.to_owned(),
            expected: field_type.name(),
            found: default.type_name(),
        }),
        Some(Value::F64(number)) if number.is_nan() => {
            Err(SchemaChangeError::DefaultNotANumber { field: name.to_owned() })
        }
        Some(Value::Str(text)) if text.len() > limits::MAX_STRING_FIELD_BYTES => {
            Err(SchemaChangeError::DefaultTooLong { field: name.to_owned(), value_bytes: text.len() })
        }
        Some(value) => Ok(value),
    }
}
