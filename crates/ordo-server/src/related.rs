//! Reads by relationship on the network side (docs/SECURITY.md, "Reading by
//! relationship"). A collection whose read rule is
//! `{"related":{"field":"room","to":"members.room"}}` is read only through views
//! that pin `room` to one value with a top-level equality (or one inside a
//! top-level `all`); the view is then restricted to that value like a row
//! predicate, and the writer thread gets a [`RelationCheck`]: the view, over
//! `members`, of the caller's own readable items whose `room` is that value. It
//! refuses the view when that view is empty, and ends the subscription when it
//! becomes empty (`writer/relations`).
//!
//! Refusals say the same words whether the collection, the related collection
//! or the pinned value exist or not; only the value the client sent is echoed.

use std::sync::Arc;

use serde_json::Value as Json;

use ordo_core::{CollectionId, Filter, Schema, ViewDef};

use crate::access::Gate;
use crate::auth::Identity;
use crate::error::{ApiError, ErrorCode};
use crate::routing::{CollectionEntry, Routes};
use crate::rules::{Action, Grant, Relation};

/// What the writer thread checks, and then watches, for a view opened by
/// relationship: `def` over `collection` (the caller's read rule there AND
/// `to_field == value`) must hold an item.
#[derive(Clone, Debug, PartialEq)]
pub struct RelationCheck {
    pub collection: CollectionId,
    /// The schema `def` was checked against, as for any view request.
    pub schema: Arc<Schema>,
    pub def: ViewDef,
    /// The refusal when the relationship does not hold (the same words whether
    /// the related item exists or not).
    pub refusal: String,
}

impl RelationCheck {
    /// The identity under which views share one watch: equal definitions over
    /// the same collection (generation included) watch the same items.
    pub fn key(&self) -> String {
        format!("{}.{}|{:?}", self.collection.index(), self.collection.generation(), self.def)
    }

    pub fn refused(&self) -> ApiError {
        ApiError::new(ErrorCode::Forbidden, self.refusal.clone())
    }
}

/// How a caller may read the rows of a view it asked for: the row predicate to
/// conjoin (a rule's, or a relationship's pin), and the relationship the writer
/// must check (only for a read by relationship).
pub struct ViewAccess {
    pub predicate: Option<Filter>,
    pub relation: Option<Arc<RelationCheck>>,
}

/// The access of a view request with `filter` on `entry`, under `grant`.
pub fn view_access(
    gate: &Gate,
    routes: &Routes,
    identity: &Identity,
    entry: &CollectionEntry,
    grant: &Grant,
    filter: &Json,
) -> Result<ViewAccess, ApiError> {
    let Grant::Related(relation) = grant else {
        return Ok(ViewAccess { predicate: grant.predicate(&entry.schema)?, relation: None });
    };
    let value = pinned_value(filter, &relation.field).ok_or_else(|| relation.unpinned_refusal())?;
    if entry.schema.field_id(&relation.field).is_none() {
        return Err(rule_does_not_fit(&entry.name));
    }
    let pin = crate::wire::filter_from_rule(&entry.schema, &equality(&relation.field, value))?;
    let refusal = format!(
        "this identity may not read `{}` where `{}` is {}: it reads them only by its relationship to `{}`",
        entry.name, relation.field, value, relation.to_collection
    );
    let check = related_view(gate, routes, identity, relation, value, refusal)?;
    Ok(ViewAccess { predicate: Some(pin), relation: Some(Arc::new(check)) })
}

/// The view over the related collection that must hold an item: the caller's
/// read rule there (a plain one: a chain of relationships is not followed)
/// AND `to_field == value`. Anything that makes it impossible refuses with the
/// relationship's own words.
fn related_view(
    gate: &Gate,
    routes: &Routes,
    identity: &Identity,
    relation: &Relation,
    value: &Json,
    refusal: String,
) -> Result<RelationCheck, ApiError> {
    let refused = || ApiError::new(ErrorCode::Forbidden, refusal.clone());
    let rule = match gate.rules().grant(identity, &relation.to_collection, Action::Read) {
        Some(grant @ (Grant::All | Grant::Where(_))) => grant,
        _ => return Err(refused()),
    };
    let target = routes.read().expect("routes lock").get(&relation.to_collection).cloned();
    let Some(target) = target.filter(|target| target.name == relation.to_collection) else { return Err(refused()) };
    if target.schema.field_id(&relation.to_field).is_none() {
        return Err(rule_does_not_fit(&relation.to_collection));
    }
    // A value that no item of the related field can hold relates to nothing.
    let equal =
        crate::wire::filter_from_rule(&target.schema, &equality(&relation.to_field, value)).map_err(|_| refused())?;
    // The rule's conjuncts first, flattened: the engine keys a view by its first
    // top-level equality, and a watch keyed by the caller's own `owner == $sub`
    // is visited only by that caller's memberships' updates, where one keyed by
    // the room would be visited by every member's (`read_upto` at each read).
    let filter = match rule.predicate(&target.schema)? {
        None => equal,
        Some(Filter::All(mut conjuncts)) => {
            conjuncts.push(equal);
            Filter::All(conjuncts)
        }
        Some(predicate) => Filter::All(vec![predicate, equal]),
    };
    let def = ViewDef::new(filter, Vec::new());
    ordo_core::CompiledFilter::compile(&def.filter, &target.schema).map_err(|_| refused())?;
    Ok(RelationCheck { collection: target.id, schema: target.schema.clone(), def, refusal })
}

/// The value a filter pins `field` to: a top-level `{"field":F,"op":"eq","value":V}`,
/// or one among the children of a top-level `all`; never null (a null pin would
/// read the items whose field is unset, which relate to nothing).
pub fn pinned_value<'a>(filter: &'a Json, field: &str) -> Option<&'a Json> {
    let pin_of = |node: &'a Json| -> Option<&'a Json> {
        let object = node.as_object()?;
        let is_pin = object.len() == 3
            && object.get("field").and_then(Json::as_str) == Some(field)
            && object.get("op").and_then(Json::as_str) == Some("eq");
        object.get("value").filter(|value| is_pin && !value.is_null())
    };
    if let Some(value) = pin_of(filter) {
        return Some(value);
    }
    let children = filter.as_object().filter(|object| object.len() == 1)?.get("all")?.as_array()?;
    children.iter().find_map(pin_of)
}

fn equality(field: &str, value: &Json) -> Json {
    serde_json::json!({"field": field, "op": "eq", "value": value})
}

fn rule_does_not_fit(collection: &str) -> ApiError {
    ApiError::new(
        ErrorCode::Forbidden,
        format!("the access rule of `{collection}` names a field it does not have; ask an admin"),
    )
}

impl Relation {
    /// A request on a collection read by relationship that does not pin it:
    /// the same words whatever the collection holds.
    pub fn unpinned_refusal(&self) -> ApiError {
        ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "this identity reads this collection only by its relationship to `{}`: a view must pin `{}` to one value with a top-level `eq` (or one inside a top-level `all`), and items are not read by id",
                self.to_collection, self.field
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pin_is_a_top_level_equality_or_one_in_a_top_level_all() {
        let pin = json!({"field": "room", "op": "eq", "value": "!r1"});
        assert_eq!(pinned_value(&pin, "room"), Some(&json!("!r1")));
        let in_all = json!({"all": [{"field": "seq", "op": "gt", "value": 3}, pin.clone()]});
        assert_eq!(pinned_value(&in_all, "room"), Some(&json!("!r1")));
        for unpinned in [
            Json::Null,
            json!({"field": "room", "op": "eq", "value": null}),
            json!({"field": "room", "op": "ne", "value": "!r1"}),
            json!({"field": "other", "op": "eq", "value": "!r1"}),
            json!({"any": [pin.clone()]}),
            json!({"not": pin.clone()}),
            json!({"all": [{"all": [pin.clone()]}]}),
            json!({"field": "room", "in": ["!r1"]}),
        ] {
            assert_eq!(pinned_value(&unpinned, "room"), None, "{unpinned}");
        }
    }
}
