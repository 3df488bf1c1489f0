//! Views that read through reference fields on the wire: `room.recency` in a
//! `sort`, `room.name` in a `filter` or in `fields` (docs/PROTOCOL.md, "Reading
//! through references").
//!
//! A network task checks every dotted name a request reads before the request
//! reaches the writer thread: one hop only, through a `ref` field, to a field the
//! target has; and the **access rule**: the caller must be allowed to read the
//! target collection *whole* (a read rule without a row predicate, or admin), or
//! a `through` rule must grant it the target through exactly this reference
//! (`{"through":"members.room"}` for `room.*` in a view of `members`).
//! Why not a row predicate on the target: the engine keeps one derived column
//! per (referencing collection, target field), shared by every view of every
//! caller, and a referencing item shows its target's fields whatever item that
//! is. Limiting reads to the target rows a caller may see would need a
//! per-caller predicate evaluated on each target row for each referencing item,
//! on every target update and in every view: no longer one shared column, nor
//! O(log n) per update. A `through` grant needs none: the view's own rule on the
//! referencing collection is conjoined as for any view, so the caller sees a
//! target's fields only in referencing items it may read, and the rule set
//! guarantees it cannot point those references itself (`rules::through`).
//! Anything else (a row-limited or absent read rule on the target) refuses the
//! view with `forbidden`, naming the target collection. The check runs wherever a
//! view is built for a caller: `subscribe`, `set_view`, `resume` and a one-shot
//! query.
//!
//! The checked names extend a copy of the collection's schema
//! ([`Schema::with_read_through`]), against which the filter, sort and
//! projection then compile like any other; the engine adds its own derived
//! fields when the window opens (`ViewDef::shown` carries the projected ones).

use serde_json::Value as Json;

use ordo_core::{FieldType, Schema};

use crate::access::Gate;
use crate::auth::Identity;
use crate::error::{ApiError, ErrorCode};
use crate::routing::{CollectionEntry, Routes};
use crate::wire::SortRequest;

impl CollectionEntry {
    /// The name of the collection a `ref` field targets.
    fn target_of(&self, ref_field: &str) -> Option<&str> {
        self.ref_targets.iter().find(|(field, _)| field == ref_field).map(|(_, target)| target.as_str())
    }
}

/// Who is asking, for the access check.
pub struct Reader<'a> {
    pub gate: &'a Gate,
    pub routes: &'a Routes,
    pub identity: &'a Identity,
}

/// Checks every name the view request reads through a reference and returns the
/// schema to check the request against: `None` when it reads nothing through
/// one (the entry's own schema), else the entry's schema extended with them.
pub fn read_schema(
    reader: &Reader<'_>,
    entry: &CollectionEntry,
    filter: &Json,
    sort: &[SortRequest],
    fields: Option<&[String]>,
) -> Result<Option<Schema>, ApiError> {
    let mut names = Vec::new();
    filter_names(filter, 0, &mut names);
    names.extend(sort.iter().map(|key| key.field.as_str()));
    names.extend(fields.into_iter().flatten().map(String::as_str));
    // A schema field's own name wins (names with dots predate references).
    names.retain(|name| name.contains('.') && entry.schema.field_id(name).is_none());
    if names.is_empty() {
        return Ok(None);
    }
    names.sort_unstable();
    names.dedup();
    let mut schema = (*entry.schema).clone();
    for name in names {
        let field_type = check_read(reader, entry, name)?;
        schema = schema.with_read_through(name, field_type);
    }
    Ok(Some(schema))
}

/// One dotted name: its target field's type, or why it may not be read.
fn check_read(reader: &Reader<'_>, entry: &CollectionEntry, name: &str) -> Result<FieldType, ApiError> {
    let invalid = |message: String| ApiError::new(ErrorCode::InvalidView, message);
    let (ref_name, target_field) = name.split_once('.').expect("dotted");
    if target_field.contains('.') {
        return Err(invalid(format!(
            "`{name}` reads through more than one reference; a view reads one hop: `ref_field.target_field`"
        )));
    }
    let Some(ref_id) = entry.schema.field_id(ref_name) else {
        return Err(invalid(format!(
            "`{name}` names no field: `{}` has no field `{ref_name}` to read through",
            entry.name
        )));
    };
    let ref_type = entry.schema.field(ref_id).field_type;
    let (FieldType::Ref(target_id), Some(target_name)) = (ref_type, entry.target_of(ref_name)) else {
        return Err(invalid(format!(
            "`{name}` reads through `{ref_name}`, which is a {} field; only a `ref` field can be read through with a dot",
            ref_type.name()
        )));
    };
    // The access rule first: a caller who may not read the target learns nothing of its fields.
    if !reader.gate.rules().may_read_through(reader.identity, target_name, &entry.name, ref_name) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "`{name}` reads through `{ref_name}` into `{target_name}`; a view may read through a reference only when this identity may read every item of `{target_name}`, or a rule lets it read `{target_name}` through `{}.{ref_name}`",
                entry.name
            ),
        ));
    }
    let target = reader.routes.read().expect("routes lock").get(target_name).cloned();
    let Some(target) = target.filter(|target| target.id == target_id) else {
        return Err(invalid(format!(
            "the target of `{ref_name}` changed while this request was on its way; send it again"
        )));
    };
    let Some(field_id) = target.schema.field_id(target_field) else {
        return Err(invalid(format!(
            "`{name}`: collection `{target_name}`, which `{ref_name}` references, has no field `{target_field}`"
        )));
    };
    Ok(target.schema.field(field_id).field_type)
}

/// The field names of a filter's JSON: each comparison's `field`, and its
/// `value` when that names a field (`{"field": NAME}`), which reads the item as
/// much as the `field` side does and so passes the same access check. Walks no
/// deeper, and no more nodes, than a filter may have (the parse refuses the
/// rest anyway).
fn filter_names<'a>(json: &'a Json, depth: usize, out: &mut Vec<&'a str>) {
    if depth > ordo_core::limits::MAX_FILTER_DEPTH || out.len() > ordo_core::limits::MAX_FILTER_NODES {
        return;
    }
    let Json::Object(object) = json else { return };
    if let Some(Json::String(field)) = object.get("field") {
        out.push(field);
    }
    if let Some(Json::String(other)) = object.get("value").and_then(|value| value.get("field")) {
        out.push(other);
    }
    for key in ["all", "any"] {
        if let Some(Json::Array(children)) = object.get(key) {
            for child in children {
                filter_names(child, depth + 1, out);
            }
        }
    }
    if let Some(child) = object.get("not") {
        filter_names(child, depth + 1, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_names_are_found_at_every_level_and_the_walk_is_bounded() {
        let filter = serde_json::json!({"all": [
            {"field": "room.name", "prefix": "a"},
            {"not": {"any": [{"field": "unread", "op": "gt", "value": 1}, {"field": "room.recency", "is_null": true}]}},
            {"field": "read_upto", "op": "lt", "value": {"field": "room.last_seq"}}
        ]});
        let mut names = Vec::new();
        filter_names(&filter, 0, &mut names);
        assert_eq!(names, ["room.name", "unread", "room.recency", "read_upto", "room.last_seq"]);

        let mut deep = serde_json::json!({"field": "room.name", "is_null": true});
        for _ in 0..ordo_core::limits::MAX_FILTER_DEPTH + 5 {
            deep = serde_json::json!({ "not": deep });
        }
        let mut names = Vec::new();
        filter_names(&deep, 0, &mut names);
        assert!(names.is_empty(), "past the depth limit, nothing is walked (the parse refuses it)");
    }
}
