//! Access rules: which identities may read, write or create which collections,
//! and the row predicate bound into every view they open. The engine knows
//! nothing of this: a predicate becomes an ordinary filter, conjoined with the
//! client's before the view is built, so views with the same bound predicate
//! share one index as any two equal views do.
//!
//! A rule names a collection pattern (`rooms`, `lists/{sub}`), the roles it is
//! for, and what it grants. `admin` needs no rule. Everything not granted is
//! refused with `forbidden`, whether the collection exists or not.
//!
//! A read rule may also grant a collection only *through* a reference
//! (`{"through":"members.room"}`): nothing directly, its fields only as
//! `room.*` of `members` items the caller may read (see `through`).

mod through;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use ordo_core::{Filter, Schema};

use crate::auth::{Identity, Role};
use crate::error::{ApiError, ErrorCode};
use crate::limits;
use crate::write_rules::{parse_write, WriteDoc, WriteGrant, WriteLimits};

pub use through::ThroughRef;

/// `PUT /v1/rules`: the whole rule set at once.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RulesDoc {
    pub rules: Vec<RuleDoc>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleDoc {
    /// A collection name, or a pattern with `{claim}` placeholders (`lists/{sub}`).
    pub collection: String,
    /// `reader`, `writer` (not `admin`: admins need no rule).
    pub roles: Vec<String>,
    #[serde(default, skip_serializing_if = "AccessDoc::is_none")]
    pub read: AccessDoc,
    /// `true`, `{"filter": F}`, or with field-level limits (`crate::write_rules`).
    #[serde(default, skip_serializing_if = "WriteDoc::is_none")]
    pub write: WriteDoc,
    /// May create a collection of this name (`PUT /v1/collections/{name}`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub create: bool,
}

/// `false` (the default), `true`, `{"filter": ...}` with `$claim` values, or
/// (read only) `{"through": "collection.ref_field"}`, or (read only)
/// `{"related": {"field": F, "to": "COLLECTION.FIELD"}}`. Unknown keys are
/// refused: a misspelt or extra key must not turn one form into another.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(untagged, deny_unknown_fields)]
pub enum AccessDoc {
    #[default]
    #[serde(skip)]
    None,
    Flag(bool),
    /// Checked by `Relation::compile`, so that a malformed form is
    /// `invalid_rules`; `related` beside a `filter` matches no form and is refused.
    Related {
        related: Json,
    },
    Where {
        filter: Json,
    },
    Through {
        through: String,
    },
}

impl AccessDoc {
    fn is_none(&self) -> bool {
        matches!(self, AccessDoc::None | AccessDoc::Flag(false))
    }
}

#[derive(Clone, Debug)]
enum Access {
    Denied,
    All,
    /// The filter as written, claims unbound.
    Where(Json),
    /// Nothing directly; the fields through this reference only (read rules only).
    Through(ThroughRef),
    /// Items related to an item the caller may read in another collection.
    Related(Relation),
}

/// A read by relationship (`"read":{"related":{"field":"room","to":"members.room"}}`):
/// an item is readable when the caller may read (under its own read rule there)
/// an item of `to_collection` whose `to_field` equals the item's `field`. A view
/// must pin `field` to one value; the writer thread checks and then watches the
/// relationship (`related`, `writer/relations`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    pub field: String,
    pub to_collection: String,
    pub to_field: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PatternPart {
    Literal(String),
    Claim(String),
    /// `*`: one or more characters other than `/` (a backend's `lists/*`).
    Any,
}

#[derive(Clone, Debug)]
struct Rule {
    pattern: Vec<PatternPart>,
    roles: Vec<Role>,
    read: Access,
    write: Access,
    /// What the write grant lets an op do besides keeping inside `write`'s filter.
    write_limits: WriteLimits,
    create: bool,
}

/// The rules in force, compiled from a [`RulesDoc`].
#[derive(Debug, Default)]
pub struct RuleSet {
    rules: Vec<Rule>,
    doc: RulesDoc,
}

/// What a grant allows on one collection.
#[derive(Clone, Debug, PartialEq)]
pub enum Grant {
    /// Every item.
    All,
    /// The items some of these filters (claims bound) match.
    Where(Vec<Json>),
    /// Nothing directly: the collection's fields only as read through these
    /// references, from items of their collections the caller may read. Given
    /// only when no rule grants the collection directly; see
    /// [`RuleSet::direct_grant`] and [`RuleSet::may_read_through`].
    Through(Vec<ThroughRef>),
    /// Only views pinning the relation's field to a value the caller relates to.
    Related(Relation),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Read,
    Write,
}

pub type SharedRules = Arc<std::sync::RwLock<Arc<RuleSet>>>;

impl RuleSet {
    pub fn compile(doc: RulesDoc) -> Result<RuleSet, ApiError> {
        let invalid =
            |index: usize, message: String| ApiError::new(ErrorCode::InvalidRules, format!("rule {index}: {message}"));
        if doc.rules.len() > limits::MAX_RULES {
            return Err(ApiError::limit(format!("at most {} rules", limits::MAX_RULES)));
        }
        let mut rules = Vec::with_capacity(doc.rules.len());
        for (index, rule) in doc.rules.iter().enumerate() {
            let pattern = parse_pattern(&rule.collection).map_err(|message| invalid(index, message))?;
            if rule.roles.is_empty() {
                return Err(invalid(index, "`roles` lists no role".to_owned()));
            }
            let mut roles = Vec::with_capacity(rule.roles.len());
            for name in &rule.roles {
                match Role::parse(name) {
                    Some(Role::Admin) => {
                        return Err(invalid(index, "`admin` needs no rule: admins may do everything".to_owned()))
                    }
                    Some(role) => roles.push(role),
                    None => return Err(invalid(index, format!("unknown role `{name}` (reader, writer)"))),
                }
            }
            let read =
                access(&rule.read, Action::Read).map_err(|message| invalid(index, format!("`read`: {message}")))?;
            let (write, write_limits) =
                write_access(&rule.write).map_err(|message| invalid(index, format!("`write`: {message}")))?;
            check_relation_use(&rule.collection, &read, &write).map_err(|message| invalid(index, message))?;
            rules.push(Rule { pattern, roles, read, write, write_limits, create: rule.create });
        }
        through::check_unpointable(&rules)?;
        Ok(RuleSet { rules, doc })
    }

    pub fn doc(&self) -> &RulesDoc {
        &self.doc
    }

    /// What `identity` may do on the collection `name` (as the client spelled it).
    /// `None`: nothing. A [`Grant::Through`] gives nothing directly: every use
    /// on the collection itself goes through [`RuleSet::direct_grant`].
    pub fn grant(&self, identity: &Identity, name: &str, action: Action) -> Option<Grant> {
        if identity.role == Role::Admin {
            return Some(Grant::All);
        }
        let mut filters = Vec::new();
        let mut through = Vec::new();
        let mut related = None;
        for rule in &self.rules {
            if !rule.roles.contains(&identity.role) || !pattern_matches(&rule.pattern, name, identity) {
                continue;
            }
            let access = match action {
                Action::Read => &rule.read,
                Action::Write => &rule.write,
            };
            match access {
                Access::Denied => {}
                Access::All => return Some(Grant::All),
                Access::Where(filter) => {
                    // A filter naming a claim the token lacks grants nothing.
                    if let Some(bound) = bind_claims(filter, identity) {
                        filters.push(bound);
                    }
                }
                Access::Through(via) => through.push(via.clone()),
                Access::Related(relation) => {
                    related.get_or_insert_with(|| relation.clone());
                }
            }
        }
        combine_grants(filters, related, through)
    }

    /// What `identity` may do on `name` itself: open a view, read an item, see
    /// it listed, anchor a window on one of its ids, count its items. A
    /// `through` grant grants none of these, and is refused as no grant at all,
    /// with the same words as a collection that does not exist.
    pub fn direct_grant(&self, identity: &Identity, name: &str, action: Action) -> Option<Grant> {
        self.grant(identity, name, action).filter(|grant| !matches!(grant, Grant::Through(_)))
    }

    /// Whether a view of `referencing` (its exact name) may read the fields of
    /// `target` through its ref field `ref_field`: when `identity` may read every
    /// item of `target`, or a `through` rule grants it `target` through exactly
    /// this reference. Either way the view's own rule on `referencing` is
    /// conjoined as for any view, so the caller sees a target's fields only in
    /// the referencing items it may read.
    pub fn may_read_through(&self, identity: &Identity, target: &str, referencing: &str, ref_field: &str) -> bool {
        if self.grant(identity, target, Action::Read) == Some(Grant::All) {
            return true;
        }
        self.rules.iter().any(|rule| {
            rule.roles.contains(&identity.role)
                && pattern_matches(&rule.pattern, target, identity)
                && matches!(&rule.read, Access::Through(via) if via.is(referencing, ref_field))
        })
    }

    /// What `identity` may write in the collection `name`, rule by rule (see
    /// [`WriteGrant`]). `None`: nothing.
    pub fn write_grant(&self, identity: &Identity, name: &str) -> Option<WriteGrant> {
        if identity.role == Role::Admin {
            return Some(WriteGrant::everything());
        }
        let mut grant = WriteGrant::default();
        for rule in &self.rules {
            if !rule.roles.contains(&identity.role) || !pattern_matches(&rule.pattern, name, identity) {
                continue;
            }
            match &rule.write {
                Access::Denied => {}
                Access::All => grant.add(&rule.write_limits, Grant::All),
                Access::Where(filter) => {
                    // A filter naming a claim the token lacks grants nothing.
                    if let Some(bound) = bind_claims(filter, identity) {
                        grant.add(&rule.write_limits, Grant::Where(vec![bound]));
                    }
                }
                // Read-only forms: `write_access` never makes one (refused at compile time).
                Access::Through(_) | Access::Related(_) => {}
            }
        }
        (!grant.is_empty()).then_some(grant)
    }

    /// Whether some identity of `role` may set (or apply an atomic to) `field`
    /// of some item of `collection`: a rule of the role whose pattern can match
    /// the name (for some claims) grants a write that does not leave the field
    /// out. Whatever its filter: an identity that may set the field on its own
    /// items may set it.
    pub fn may_set_field(&self, role: Role, collection: &str, field: &str) -> bool {
        role == Role::Admin || self.writes_that_can_match(role, collection).any(|rule| rule.write_limits.may_set(field))
    }

    /// Whether some identity of `role` may create items in `collection` (see
    /// [`RuleSet::may_set_field`]).
    pub fn may_create_items(&self, role: Role, collection: &str) -> bool {
        role == Role::Admin || self.writes_that_can_match(role, collection).any(|rule| rule.write_limits.may_create())
    }

    /// The rules of `role` granting some write on a collection their pattern can match.
    fn writes_that_can_match<'a>(&'a self, role: Role, collection: &'a str) -> impl Iterator<Item = &'a Rule> + 'a {
        self.rules.iter().filter(move |rule| {
            !matches!(rule.write, Access::Denied)
                && rule.roles.contains(&role)
                && pattern_can_match(&rule.pattern, collection)
        })
    }

    pub fn may_create(&self, identity: &Identity, name: &str) -> bool {
        identity.role == Role::Admin
            || self.rules.iter().any(|rule| {
                rule.create && rule.roles.contains(&identity.role) && pattern_matches(&rule.pattern, name, identity)
            })
    }

    /// A non-admin's new collection may reference only collections it may read
    /// whole. Checked before any name is looked up, so that a refusal says the
    /// same whether the target exists or not (a schema is no way to probe
    /// names), and so that a reader's collection never pins one it may not read
    /// (a referenced collection cannot be dropped while the reference lasts).
    pub fn check_ref_targets<'a>(
        &self,
        identity: &Identity,
        targets: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ApiError> {
        for target in targets {
            if self.grant(identity, target, Action::Read) != Some(Grant::All) {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    format!("this identity may not reference `{target}`: a ref field's target must be a collection it may read whole"),
                ));
            }
        }
        Ok(())
    }

    /// Whether some rule lets `identity` read `name` directly: the collection
    /// list shows only those.
    pub fn may_read(&self, identity: &Identity, name: &str) -> bool {
        self.direct_grant(identity, name, Action::Read).is_some()
    }
}

impl Rule {
    /// Whether this rule lets `role` set `ref_field` of an item of the
    /// collection named `collection`, or create an item there (an upsert sets
    /// every field it names): a `through` rule on that reference's target is
    /// safe only while no rule does. A write grant (with or without a filter)
    /// on a pattern that can match `collection` counts when its field limits
    /// admit `ref_field` or creating items. A rule's `create`
    /// (of collections) does not count: a collection a non-admin creates may
    /// reference only collections it may read whole, which a `through` target
    /// is not for that role.
    fn may_point_reference(&self, role: Role, collection: &str, ref_field: &str) -> bool {
        self.roles.contains(&role)
            && !matches!(self.write, Access::Denied)
            && pattern_can_match(&self.pattern, collection)
            && (self.write_limits.may_set(ref_field) || self.write_limits.may_create())
    }
}

fn access(doc: &AccessDoc, action: Action) -> Result<Access, String> {
    Ok(match doc {
        AccessDoc::None | AccessDoc::Flag(false) => Access::Denied,
        AccessDoc::Flag(true) => Access::All,
        AccessDoc::Where { filter } => {
            if !filter.is_object() {
                return Err("`filter` is a filter object".to_owned());
            }
            check_no_field_operands(filter, 0)?;
            Access::Where(filter.clone())
        }
        AccessDoc::Through { through } => Access::Through(ThroughRef::parse(through, action)?),
        AccessDoc::Related { related } => Access::Related(Relation::compile(related)?),
    })
}

/// A rule's filter compares fields with values (literals, `$claim`s), never two
/// fields (`{"value": {"field": ...}}`): a rule is a predicate on who the caller
/// is, and an item's fields compared with each other say nothing about that;
/// write rules are checked by the values an op sets, which only literal
/// equalities allow. Walks no deeper than a filter may nest.
fn check_no_field_operands(filter: &Json, depth: usize) -> Result<(), String> {
    if depth > ordo_core::limits::MAX_FILTER_DEPTH {
        return Err(format!("the filter is nested more than {} deep", ordo_core::limits::MAX_FILTER_DEPTH));
    }
    let Json::Object(object) = filter else { return Ok(()) };
    if let (Some(Json::String(field)), Some(Json::Object(_))) = (object.get("field"), object.get("value")) {
        return Err(format!("a rule's filter may not compare two fields (`{field}` with an object value)"));
    }
    for key in ["all", "any"] {
        if let Some(Json::Array(children)) = object.get(key) {
            children.iter().try_for_each(|child| check_no_field_operands(child, depth + 1))?;
        }
    }
    match object.get("not") {
        Some(child) => check_no_field_operands(child, depth + 1),
        None => Ok(()),
    }
}

/// What the matching rules of one collection grant together. A filter rule
/// wins over a relationship (its rows are readable without a pin), and the
/// first relationship stands for the others: one view pins one field, so
/// several relationships of one collection would need several pins. A
/// `through` grant, which grants nothing directly, comes last.
fn combine_grants(filters: Vec<Json>, related: Option<Relation>, through: Vec<ThroughRef>) -> Option<Grant> {
    if !filters.is_empty() {
        return Some(Grant::Where(filters));
    }
    if let Some(relation) = related {
        return Some(Grant::Related(relation));
    }
    (!through.is_empty()).then_some(Grant::Through(through))
}

/// A relationship grants reads only, and never to the collection it relates
/// to: the related collection is read under its own read rule, which must not
/// lead back (a chain of relationships is not followed).
fn check_relation_use(collection: &str, read: &Access, write: &Access) -> Result<(), String> {
    if matches!(write, Access::Related(_)) {
        return Err("`write`: `related` grants reads only".to_owned());
    }
    match read {
        Access::Related(relation) if relation.to_collection == collection => {
            Err(format!("`read`: `related` relates `{collection}` to itself"))
        }
        _ => Ok(()),
    }
}

impl Relation {
    /// `{"field": F, "to": "COLLECTION.FIELD"}`, every key required, no other.
    fn compile(doc: &Json) -> Result<Relation, String> {
        let form = "`related` is {\"field\": F, \"to\": \"COLLECTION.FIELD\"}";
        let object = doc.as_object().ok_or_else(|| form.to_owned())?;
        if let Some(key) = object.keys().find(|key| !matches!(key.as_str(), "field" | "to")) {
            return Err(format!("`related` has an unknown key `{key}` ({form})"));
        }
        let text = |key: &str| match object.get(key) {
            Some(Json::String(text)) if !text.is_empty() => Ok(text.clone()),
            _ => Err(format!("`related.{key}` is missing or not a non-empty string ({form})")),
        };
        let field = text("field")?;
        let to = text("to")?;
        let Some((to_collection, to_field)) = to.rsplit_once('.').filter(|(c, f)| !c.is_empty() && !f.is_empty())
        else {
            return Err(format!("`related.to` is `{to}`; it names a collection and its field: `COLLECTION.FIELD`"));
        };
        if field.contains('.') {
            return Err(format!(
                "`related.field` is `{field}`; it names a field of this collection, not one read through a reference"
            ));
        }
        if to_collection.contains(['{', '}', '*']) || crate::routing::is_reserved_name(to_collection) {
            return Err(format!(
                "`related.to` names `{to_collection}`, which is not a collection name (no pattern, nothing reserved)"
            ));
        }
        Ok(Relation { field, to_collection: to_collection.to_owned(), to_field: to_field.to_owned() })
    }
}

/// A rule's `write`: what it grants, and its limits.
fn write_access(doc: &WriteDoc) -> Result<(Access, WriteLimits), String> {
    Ok(match parse_write(doc)? {
        None => (Access::Denied, WriteLimits::EVERYTHING),
        Some((None, limits)) => (Access::All, limits),
        Some((Some(filter), limits)) => {
            check_no_field_operands(&filter, 0)?;
            check_write_filter(&filter)?;
            (Access::Where(filter), limits)
        }
    })
}

/// A write filter must be `{"field":f,"op":"eq","value":v}` or `{"all":[...]}` of
/// those: the server checks an upsert by the values it sets and an existing
/// item by its fields, which is exact only for equalities.
fn check_write_filter(filter: &Json) -> Result<(), String> {
    let message = "a write filter is an `eq` comparison or `all` of them";
    if let Some(list) = filter.get("all") {
        let list = list.as_array().ok_or(message)?;
        return list.iter().try_for_each(check_write_filter);
    }
    match (filter.get("field"), filter.get("op"), filter.get("value")) {
        (Some(Json::String(_)), Some(Json::String(op)), Some(_))
            if op == "eq" && filter.as_object().map_or(0, |o| o.len()) == 3 =>
        {
            Ok(())
        }
        _ => Err(message.to_owned()),
    }
}

fn parse_pattern(pattern: &str) -> Result<Vec<PatternPart>, String> {
    if pattern.is_empty() || pattern.len() > ordo_core::limits::MAX_COLLECTION_NAME_BYTES {
        return Err(format!("a collection pattern is 1..={} bytes", ordo_core::limits::MAX_COLLECTION_NAME_BYTES));
    }
    let mut parts = Vec::new();
    let mut rest = pattern;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('*') {
            if !matches!(parts.last(), None | Some(PatternPart::Literal(_))) {
                return Err(format!("`{pattern}`: `*` and placeholders must be separated by text"));
            }
            parts.push(PatternPart::Any);
            rest = after;
            continue;
        }
        match rest.find(['{', '*']) {
            Some(0) => {
                let end = rest.find('}').ok_or_else(|| format!("`{pattern}`: a `{{` without its `}}`"))?;
                let claim = &rest[1..end];
                if claim.is_empty() || !claim.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                    return Err(format!("`{pattern}`: `{{{claim}}}` is not a claim name"));
                }
                if matches!(parts.last(), Some(PatternPart::Claim(_) | PatternPart::Any)) {
                    return Err(format!("`{pattern}`: two placeholders must be separated by text"));
                }
                parts.push(PatternPart::Claim(claim.to_owned()));
                rest = &rest[end + 1..];
            }
            Some(start) => {
                parts.push(PatternPart::Literal(rest[..start].to_owned()));
                rest = &rest[start..];
            }
            None => {
                if rest.contains('}') {
                    return Err(format!("`{pattern}`: a `}}` without its `{{`"));
                }
                parts.push(PatternPart::Literal(rest.to_owned()));
                rest = "";
            }
        }
    }
    Ok(parts)
}

/// Whether `name` is exactly the pattern with the identity's claims put in.
/// Exact bytes, not the routing's case-insensitive match: `lists/{sub}` for
/// `U42` is `lists/U42`, and never `lists/u42` (someone else's).
fn pattern_matches(pattern: &[PatternPart], name: &str, identity: &Identity) -> bool {
    let Some((part, later)) = pattern.split_first() else { return name.is_empty() };
    let piece = match part {
        PatternPart::Literal(text) => std::borrow::Cow::Borrowed(text.as_str()),
        PatternPart::Claim(claim) => match identity.claim_text(claim) {
            Some(value) if !value.is_empty() => std::borrow::Cow::Owned(value),
            _ => return false,
        },
        PatternPart::Any => {
            // Every split of the segment; parts never nest, so this is linear per `*`.
            let segment_end = name.find('/').unwrap_or(name.len());
            return (1..=segment_end)
                .filter(|&end| name.is_char_boundary(end))
                .any(|end| pattern_matches(later, &name[end..], identity));
        }
    };
    match name.strip_prefix(piece.as_ref()) {
        Some(after) => pattern_matches(later, after, identity),
        None => false,
    }
}

/// Whether `name` is the pattern with *some* claims put in: a placeholder
/// matches one or more characters a claim may hold (`auth::is_claim_byte`),
/// `*` one or more other than `/`. The positions of `name` each part can end
/// at, part by part: O(parts × name²), both bounded by the pattern and name
/// limits, whatever the placeholders (no backtracking).
fn pattern_can_match(pattern: &[PatternPart], name: &str) -> bool {
    let mut reachable = vec![false; name.len() + 1];
    reachable[0] = true;
    for part in pattern {
        let mut next = vec![false; name.len() + 1];
        for start in (0..=name.len()).filter(|&start| reachable[start]) {
            let rest = &name[start..];
            match part {
                PatternPart::Literal(text) => {
                    if rest.starts_with(text.as_str()) {
                        next[start + text.len()] = true;
                    }
                }
                PatternPart::Claim(_) | PatternPart::Any => {
                    let may_take = |byte: u8| match part {
                        PatternPart::Any => byte != b'/',
                        _ => crate::auth::is_claim_byte(byte),
                    };
                    let run = rest.bytes().take_while(|byte| may_take(*byte)).count();
                    for end in (1..=run).filter(|&end| rest.is_char_boundary(end)) {
                        next[start + end] = true;
                    }
                }
            }
        }
        reachable = next;
    }
    reachable[name.len()]
}

/// The filter with every `"$claim"` string replaced by the claim's value
/// (`"$$..."` is a literal string starting with `$`). `None` when a named claim
/// is missing.
fn bind_claims(filter: &Json, identity: &Identity) -> Option<Json> {
    Some(match filter {
        Json::String(text) => match text.strip_prefix('$') {
            Some(escaped) if escaped.starts_with('$') => Json::String(escaped.to_owned()),
            Some("sub") => Json::String(identity.sub.clone()),
            Some(claim) => match identity.claims.get(claim)? {
                value @ (Json::String(_) | Json::Number(_) | Json::Bool(_)) => value.clone(),
                _ => return None,
            },
            None => filter.clone(),
        },
        Json::Array(list) => Json::Array(list.iter().map(|item| bind_claims(item, identity)).collect::<Option<_>>()?),
        Json::Object(object) => Json::Object(
            object
                .iter()
                .map(|(key, value)| Some((key.clone(), bind_claims(value, identity)?)))
                .collect::<Option<_>>()?,
        ),
        other => other.clone(),
    })
}

impl Grant {
    /// The grant's predicate as an engine filter over `schema`: `None` for every
    /// item. A rule that does not fit the schema refuses (fails closed).
    pub fn predicate(&self, schema: &Schema) -> Result<Option<Filter>, ApiError> {
        let filters = match self {
            Grant::All => return Ok(None),
            Grant::Where(filters) => filters,
            // Never reaches a view or an item read (`RuleSet::direct_grant`); fails closed if it did.
            Grant::Through(_) => {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "this identity may read this collection only through references",
                ))
            }
            // No row predicate stands for a relationship: a path that reads one must
            // go through `related::view_access`; any other is refused (fails closed).
            Grant::Related(relation) => return Err(relation.unpinned_refusal()),
        };
        let mut compiled = Vec::with_capacity(filters.len());
        for filter in filters {
            let filter = crate::wire::filter_from_rule(schema, filter).map_err(|error| {
                ApiError::new(
                    ErrorCode::Forbidden,
                    format!(
                        "the access rule of this collection does not fit its schema ({}); ask an admin",
                        error.message
                    ),
                )
            })?;
            compiled.push(filter);
        }
        Ok(Some(if compiled.len() == 1 { compiled.pop().expect("one") } else { Filter::Any(compiled) }))
    }
}

/// `forbidden`, with the same words whether the collection exists or not.
pub fn forbidden(name: &str, what: &str) -> ApiError {
    ApiError::new(ErrorCode::Forbidden, format!("this identity may not {what} `{name}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(sub: &str, role: Role, claims: Json) -> Identity {
        let claims = claims.as_object().cloned().unwrap_or_default();
        Identity { sub: sub.to_owned(), role, claims, expires_at: u64::MAX, key: Arc::from(sub) }
    }

    fn rules(json: Json) -> RuleSet {
        RuleSet::compile(serde_json::from_value(json).unwrap()).unwrap()
    }

    #[test]
    fn a_user_pattern_grants_only_the_users_own_collection() {
        let set = rules(serde_json::json!({"rules":[{"collection":"lists/{sub}","roles":["reader"],"read":true}]}));
        let u42 = identity("u42", Role::Reader, Json::Null);
        assert_eq!(set.grant(&u42, "lists/u42", Action::Read), Some(Grant::All));
        assert_eq!(set.grant(&u42, "lists/u43", Action::Read), None);
        assert_eq!(set.grant(&u42, "lists/U42", Action::Read), None);
        assert_eq!(set.grant(&u42, "lists/u42x", Action::Read), None);
        assert_eq!(set.grant(&u42, "lists/u42", Action::Write), None);
        let writer = identity("u42", Role::Writer, Json::Null);
        assert_eq!(set.grant(&writer, "lists/u42", Action::Read), None);
    }

    #[test]
    fn a_wildcard_matches_one_segment() {
        let set = rules(serde_json::json!({"rules":[{"collection":"lists/*","roles":["writer"],"write":true},
            {"collection":"t/*-{sub}","roles":["writer"],"read":true}]}));
        let backend = identity("svc", Role::Writer, Json::Null);
        assert_eq!(set.grant(&backend, "lists/u42", Action::Write), Some(Grant::All));
        for name in ["lists/", "lists/a/b", "list/a", "lists"] {
            assert_eq!(set.grant(&backend, name, Action::Write), None, "{name}");
        }
        assert_eq!(set.grant(&backend, "t/x-y-svc", Action::Read), Some(Grant::All));
        assert_eq!(set.grant(&backend, "t/x-y-sv", Action::Read), None);
    }

    #[test]
    fn a_predicate_binds_claims_and_a_missing_claim_grants_nothing() {
        let set = rules(serde_json::json!({"rules":[
            {"collection":"rooms","roles":["reader"],"read":{"filter":{"all":[
                {"field":"owner","op":"eq","value":"$sub"},{"field":"team","op":"eq","value":"$team"},
                {"field":"tag","op":"eq","value":"$$literal"}]}}}]}));
        let with_team = identity("u1", Role::Reader, serde_json::json!({"team": 7}));
        let Some(Grant::Where(filters)) = set.grant(&with_team, "rooms", Action::Read) else { panic!() };
        assert_eq!(filters[0]["all"][0]["value"], "u1");
        assert_eq!(filters[0]["all"][1]["value"], 7);
        assert_eq!(filters[0]["all"][2]["value"], "$literal");
        let without = identity("u1", Role::Reader, Json::Null);
        assert_eq!(set.grant(&without, "rooms", Action::Read), None);
    }

    #[test]
    fn a_relationship_grants_reads_only_where_no_filter_rule_grants_rows() {
        let set = rules(serde_json::json!({"rules":[
            {"collection":"messages","roles":["reader"],"read":{"related":{"field":"room","to":"members.room"}}},
            {"collection":"messages","roles":["writer"],"read":true},
            {"collection":"notes","roles":["reader"],"read":{"related":{"field":"doc","to":"docs/v1.id"}}},
            {"collection":"notes","roles":["reader"],"read":{"filter":{"field":"owner","op":"eq","value":"$sub"}}}]}));
        let reader = identity("u1", Role::Reader, Json::Null);
        let relation = Relation { field: "room".into(), to_collection: "members".into(), to_field: "room".into() };
        assert_eq!(set.grant(&reader, "messages", Action::Read), Some(Grant::Related(relation)));
        assert_eq!(set.grant(&reader, "messages", Action::Write), None);
        let writer = identity("svc", Role::Writer, Json::Null);
        assert_eq!(set.grant(&writer, "messages", Action::Read), Some(Grant::All));
        assert!(matches!(set.grant(&reader, "notes", Action::Read), Some(Grant::Where(_))));
        let doc = serde_json::to_value(set.doc()).unwrap();
        assert_eq!(doc["rules"][0]["read"], serde_json::json!({"related":{"field":"room","to":"members.room"}}));
    }

    #[test]
    fn malformed_relationships_are_refused() {
        for read in [
            serde_json::json!({"related": "members.room"}),
            serde_json::json!({"related": {"field": "room"}}),
            serde_json::json!({"related": {"to": "members.room"}}),
            serde_json::json!({"related": {"field": "room", "to": "members"}}),
            serde_json::json!({"related": {"field": "room", "to": ".room"}}),
            serde_json::json!({"related": {"field": "room", "to": "members."}}),
            serde_json::json!({"related": {"field": "", "to": "members.room"}}),
            serde_json::json!({"related": {"field": "room.id", "to": "members.room"}}),
            serde_json::json!({"related": {"field": "room", "to": "members.room", "via": 1}}),
            serde_json::json!({"related": {"field": "room", "to": "m/{sub}.room"}}),
            serde_json::json!({"related": {"field": "room", "to": "m/*.room"}}),
            serde_json::json!({"related": {"field": "room", "to": "_ordo/rules.room"}}),
            serde_json::json!({"related": {"field": "room", "to": "messages.room"}}),
        ] {
            let doc = serde_json::json!({"rules":[{"collection":"messages","roles":["reader"],"read": read}]});
            let doc: RulesDoc = serde_json::from_value(doc).unwrap();
            let error = RuleSet::compile(doc).unwrap_err();
            assert_eq!(error.code, ErrorCode::InvalidRules, "{read}: {error}");
            assert!(error.message.starts_with("rule 0: `read`"), "{read}: {error}");
        }
        // Beside a `filter` it matches no form at all: refused when the document is read.
        let both = serde_json::json!({"rules":[{"collection":"messages","roles":["reader"],"read":
            {"related": {"field": "room", "to": "members.room"}, "filter": {"field": "a", "op": "eq", "value": 1}}}]});
        assert!(serde_json::from_value::<RulesDoc>(both).is_err());
        let write = serde_json::json!({"rules":[{"collection":"messages","roles":["writer"],
            "write":{"related":{"field":"room","to":"members.room"}}}]});
        let error = RuleSet::compile(serde_json::from_value(write).unwrap()).unwrap_err();
        assert_eq!(error.code, ErrorCode::InvalidRules, "{error}");
    }

    #[test]
    fn bad_rules_are_refused_with_their_index() {
        for bad in [
            serde_json::json!({"rules":[{"collection":"a{sub","roles":["reader"]}]}),
            serde_json::json!({"rules":[{"collection":"a","roles":["admin"]}]}),
            serde_json::json!({"rules":[{"collection":"a","roles":[]}]}),
            serde_json::json!({"rules":[{"collection":"a/{sub}{x}","roles":["reader"]}]}),
            serde_json::json!({"rules":[{"collection":"a","roles":["writer"],"write":{"filter":{"field":"x","op":"ne","value":1}}}]}),
            serde_json::json!({"rules":[{"collection":"a","roles":["writer"],"write":{"fields":["x"],"filter":{"field":"x","op":"ne","value":1}}}]}),
            serde_json::json!({"rules":[{"collection":"a","roles":["writer"],"write":{"feilds":["x"]}}]}),
            serde_json::json!({"rules":[{"collection":"a","roles":["writer"],"write":{"atomics":["multiply"]}}]}),
        ] {
            let doc: RulesDoc = serde_json::from_value(bad.clone()).unwrap();
            let error = RuleSet::compile(doc).unwrap_err();
            assert!(error.message.starts_with("rule 0"), "{bad}: {error}");
        }
    }

    /// A rule's filter never compares two fields: not at the top, not under
    /// `all`, `any` or `not`, not in a write rule (whose `eq` check alone would
    /// take any value).
    #[test]
    fn a_rule_comparing_two_fields_is_refused() {
        let unread = serde_json::json!({"field":"room.last_seq","op":"gt","value":{"field":"read_upto"}});
        let own = serde_json::json!({"field":"owner","op":"eq","value":"$sub"});
        for (access, filter) in [
            ("read", unread.clone()),
            ("read", serde_json::json!({"all":[own.clone(), {"not":{"any":[unread.clone()]}}]})),
            ("write", serde_json::json!({"field":"owner","op":"eq","value":{"field":"author"}})),
            ("write", serde_json::json!({"all":[own.clone(), {"field":"owner","op":"eq","value":{"field":"author"}}]})),
        ] {
            let doc =
                serde_json::json!({"rules":[{"collection":"members","roles":["reader"],access:{"filter":filter}}]});
            let error = RuleSet::compile(serde_json::from_value(doc.clone()).unwrap()).unwrap_err();
            assert_eq!(error.code, ErrorCode::InvalidRules, "{doc}");
            assert!(error.message.contains("may not compare two fields"), "{doc}: {error}");
        }
        // The same filters with literal values are rules like any other.
        let doc = serde_json::json!({"rules":[{"collection":"members","roles":["reader"],
            "read":{"filter":{"all":[own, {"field":"room.last_seq","op":"gt","value":3}]}}}]});
        assert!(RuleSet::compile(serde_json::from_value(doc).unwrap()).is_ok());
    }

    /// Should a rule comparing two fields be in force anyway (rules written before
    /// the refusal existed), its predicate fails closed instead of comparing.
    #[test]
    fn a_grant_comparing_two_fields_fails_closed() {
        let schema = Schema::new()
            .with_field("last_seq", ordo_core::FieldType::U64)
            .with_field("read_upto", ordo_core::FieldType::U64);
        let grant = Grant::Where(vec![serde_json::json!({"field":"last_seq","op":"gt","value":{"field":"read_upto"}})]);
        let error = grant.predicate(&schema).unwrap_err();
        assert_eq!(error.code, ErrorCode::Forbidden, "{error}");
        let literal = Grant::Where(vec![serde_json::json!({"field":"last_seq","op":"gt","value":3})]);
        assert!(literal.predicate(&schema).unwrap().is_some());
    }

    /// The flagship's rules on memberships: a reader sets two fields of its own.
    fn flagship() -> RuleSet {
        rules(serde_json::json!({"rules":[
            {"collection":"members","roles":["reader"],
             "write":{"filter":{"field":"owner","op":"eq","value":"$sub"},
                      "fields":["read_upto","favourite"],"atomics":["set_max"],"payload":false,
                      "create":false,"remove":false}},
            {"collection":"*","roles":["writer"],"read":true,"write":true}]}))
    }

    #[test]
    fn field_limits_are_told_per_role_and_collection() {
        let set = flagship();
        assert!(set.may_set_field(Role::Reader, "members", "read_upto"));
        assert!(set.may_set_field(Role::Reader, "members", "favourite"));
        assert!(!set.may_set_field(Role::Reader, "members", "room"));
        assert!(!set.may_set_field(Role::Reader, "members", "owner"));
        assert!(!set.may_create_items(Role::Reader, "members"));
        assert!(!set.may_set_field(Role::Reader, "rooms", "name"), "no write rule on rooms");
        assert!(set.may_set_field(Role::Writer, "members", "room"));
        assert!(set.may_create_items(Role::Writer, "members"));
        assert!(set.may_set_field(Role::Admin, "members", "room") && set.may_create_items(Role::Admin, "members"));
        // A filter does not make a field unsettable: the caller sets it on its own items.
        let filtered = rules(serde_json::json!({"rules":[{"collection":"members","roles":["reader"],
            "write":{"filter":{"field":"owner","op":"eq","value":"$sub"}}}]}));
        assert!(filtered.may_set_field(Role::Reader, "members", "room"));
        assert!(filtered.may_create_items(Role::Reader, "members"));
    }

    #[test]
    fn a_pattern_counts_when_some_claims_make_it_match() {
        let set = rules(serde_json::json!({"rules":[
            {"collection":"lists/{sub}","roles":["reader"],"write":{"fields":["a"],"create":false}},
            {"collection":"t/*-x","roles":["reader"],"write":{"fields":[]}}]}));
        assert!(set.may_set_field(Role::Reader, "lists/u42", "a"));
        assert!(!set.may_set_field(Role::Reader, "lists/u42", "b"));
        for name in ["lists/", "lists/a/b", "list/u42", "lists/ü"] {
            assert!(!set.may_set_field(Role::Reader, name, "a"), "{name}");
        }
        // Many placeholders against a long name: decided at once, without backtracking.
        let pattern = parse_pattern(&"{a}-".repeat(30)).unwrap();
        assert!(pattern_can_match(&pattern, &"x-".repeat(60)));
        assert!(!pattern_can_match(&pattern, &format!("{}/", "x-".repeat(60))));
        assert!(!set.may_create_items(Role::Reader, "lists/u42"));
        assert!(set.may_create_items(Role::Reader, "t/a-b-x"));
        assert!(!set.may_create_items(Role::Reader, "t/a/b-x"));
        assert!(!set.may_create_items(Role::Writer, "t/a-x"), "another role's rule");
        assert!(!set.may_set_field(Role::Reader, "t/a-x", "a"), "an empty `fields` sets none");
    }

    #[test]
    fn a_write_grant_keeps_rules_of_other_limits_apart() {
        let set = rules(serde_json::json!({"rules":[
            {"collection":"members","roles":["reader"],"write":{"filter":{"field":"owner","op":"eq","value":"$sub"},"fields":["a"]}},
            {"collection":"members","roles":["reader"],"write":{"filter":{"field":"team","op":"eq","value":"$team"}}},
            {"collection":"members","roles":["reader"],"write":{"filter":{"field":"editor","op":"eq","value":"$sub"}}}]}));
        let reader = identity("u1", Role::Reader, serde_json::json!({"team": 7}));
        let grant = set.write_grant(&reader, "members").unwrap();
        assert_eq!(grant.groups().len(), 2, "{grant:?}");
        let Grant::Where(unlimited) = &grant.groups()[1].1 else { panic!("{grant:?}") };
        assert_eq!(unlimited.len(), 2, "rules of equal limits act as one");
        assert!(!grant.is_unrestricted());
        assert_eq!(set.write_grant(&reader, "rooms"), None);
        let admin = identity("ops", Role::Admin, Json::Null);
        assert!(set.write_grant(&admin, "rooms").unwrap().is_unrestricted());
    }
}
