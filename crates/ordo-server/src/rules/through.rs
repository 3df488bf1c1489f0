//! The `through` read rule form: `{"collection":"rooms","read":{"through":"members.room"}}`
//! grants `rooms` to its roles only as `room.*` of the `members` items they may
//! read. Its two checks live here: the form itself (a literal collection name and
//! a field name, read rules only), and its safety condition against the rest of
//! the rule set.
//!
//! Why it needs no per-caller predicate on target rows (docs/SECURITY.md,
//! "Reading through a reference you may read"): the derived columns stay shared,
//! a caller sees a target's fields only in referencing items its own rule lets it
//! read, and — the condition checked here — it cannot point a reference where it
//! likes, because no rule lets its role set that ref field or create items of the
//! referencing collection. Whoever may (a backend) decides which targets each
//! caller reaches.

use crate::error::{ApiError, ErrorCode};

use super::{Access, Action, Rule};

/// The reference a `through` grant reads through: a ref field of a collection,
/// both named exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThroughRef {
    pub collection: String,
    pub ref_field: String,
}

impl ThroughRef {
    /// `collection.ref_field`, split at the last dot (collection names may hold
    /// dots; a field read through must not, since a view reads `ref.field` by
    /// its first dot). Only a read rule may have this form.
    pub(super) fn parse(text: &str, action: Action) -> Result<ThroughRef, String> {
        if action == Action::Write {
            return Err("`through` is a read rule form; a write rule is `true` or `{\"filter\": ...}`".to_owned());
        }
        let shape = || format!("`through` is `collection.ref_field` (e.g. `members.room`), not `{text}`");
        let (collection, ref_field) = text.rsplit_once('.').ok_or_else(shape)?;
        if collection.is_empty() || ref_field.is_empty() {
            return Err(shape());
        }
        if collection.len() > ordo_core::limits::MAX_COLLECTION_NAME_BYTES
            || ref_field.len() > ordo_core::limits::MAX_FIELD_NAME_BYTES
        {
            return Err(format!(
                "`through`: a collection name is at most {} bytes and a field name at most {}",
                ordo_core::limits::MAX_COLLECTION_NAME_BYTES,
                ordo_core::limits::MAX_FIELD_NAME_BYTES
            ));
        }
        if collection.contains(['{', '}', '*']) {
            return Err(format!(
                "`through`: `{collection}` must be a collection's exact name, without `{{claim}}` or `*`"
            ));
        }
        if crate::routing::is_reserved_name(collection) {
            return Err(format!("`through`: `{collection}` is reserved for the server"));
        }
        Ok(ThroughRef { collection: collection.to_owned(), ref_field: ref_field.to_owned() })
    }

    /// Whether this is the ref field `ref_field` of the collection named exactly `collection`.
    pub fn is(&self, collection: &str, ref_field: &str) -> bool {
        self.collection == collection && self.ref_field == ref_field
    }
}

/// Refuses a `through` rule while a rule lets one of its roles point that
/// reference (set the ref field, or create items of its collection): with that,
/// a caller could aim its own referencing item at any target item and read it.
/// The error names both rules.
pub(super) fn check_unpointable(rules: &[Rule]) -> Result<(), ApiError> {
    for (through_index, rule) in rules.iter().enumerate() {
        let Access::Through(via) = &rule.read else { continue };
        for &role in &rule.roles {
            let pointing =
                rules.iter().position(|other| other.may_point_reference(role, &via.collection, &via.ref_field));
            if let Some(write_index) = pointing {
                return Err(ApiError::new(
                    ErrorCode::InvalidRules,
                    format!(
                        "rule {through_index}: `read`: `through` `{}.{}` is refused while rule {write_index} lets `{}` set `{}` of `{}` items or create them: the caller could point its reference at any item",
                        via.collection,
                        via.ref_field,
                        role.as_str(),
                        via.ref_field,
                        via.collection
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{json, Value as Json};

    use super::super::{parse_pattern, Grant, RuleSet, RulesDoc};
    use super::*;
    use crate::auth::{Identity, Role};

    fn identity(sub: &str, role: Role) -> Identity {
        Identity { sub: sub.to_owned(), role, claims: Default::default(), expires_at: u64::MAX, key: Arc::from(sub) }
    }

    fn compile(json: Json) -> Result<RuleSet, ApiError> {
        RuleSet::compile(serde_json::from_value::<RulesDoc>(json).unwrap())
    }

    const MEMBERS: &str =
        r#"{"collection":"members","roles":["reader"],"read":{"filter":{"field":"owner","op":"eq","value":"$sub"}}}"#;
    const ROOMS_THROUGH: &str = r#"{"collection":"rooms","roles":["reader"],"read":{"through":"members.room"}}"#;

    fn rules_with(extra: &[&str]) -> Json {
        let mut rules: Vec<Json> = [MEMBERS, ROOMS_THROUGH].iter().map(|r| serde_json::from_str(r).unwrap()).collect();
        rules.extend(extra.iter().map(|r| serde_json::from_str::<Json>(r).unwrap()));
        json!({ "rules": rules })
    }

    #[test]
    fn a_through_grant_reads_only_through_its_own_reference() {
        let set = compile(rules_with(&[r#"{"collection":"*","roles":["writer"],"read":true,"write":true}"#])).unwrap();
        let alice = identity("alice", Role::Reader);
        let via = ThroughRef { collection: "members".into(), ref_field: "room".into() };
        assert_eq!(set.grant(&alice, "rooms", Action::Read), Some(Grant::Through(vec![via])));
        // Nothing directly: no view, no item, not listed.
        assert_eq!(set.direct_grant(&alice, "rooms", Action::Read), None);
        assert!(!set.may_read(&alice, "rooms"));
        assert_eq!(set.grant(&alice, "rooms", Action::Write), None);
        // Through exactly that reference, and no other.
        assert!(set.may_read_through(&alice, "rooms", "members", "room"));
        assert!(!set.may_read_through(&alice, "rooms", "members", "other"));
        assert!(!set.may_read_through(&alice, "rooms", "members2", "room"));
        assert!(!set.may_read_through(&alice, "rooms", "Members", "room"));
        assert!(!set.may_read_through(&alice, "secrets", "members", "room"));
        // A writer reads rooms whole, through any reference.
        let backend = identity("svc", Role::Writer);
        assert!(set.may_read_through(&backend, "rooms", "anything", "room"));
        assert_eq!(set.direct_grant(&backend, "rooms", Action::Read), Some(Grant::All));
    }

    #[test]
    fn a_direct_grant_beside_a_through_grant_keeps_both() {
        let own_rooms =
            r#"{"collection":"rooms","roles":["reader"],"read":{"filter":{"field":"owner","op":"eq","value":"$sub"}}}"#;
        let set = compile(rules_with(&[own_rooms])).unwrap();
        let alice = identity("alice", Role::Reader);
        assert!(matches!(set.direct_grant(&alice, "rooms", Action::Read), Some(Grant::Where(_))));
        assert!(set.may_read_through(&alice, "rooms", "members", "room"));
    }

    #[test]
    fn malformed_through_rules_are_refused_with_their_index() {
        for (through, why) in [
            ("members", "collection.ref_field"),
            (".room", "collection.ref_field"),
            ("members.", "collection.ref_field"),
            ("members/{sub}.room", "exact name"),
            ("lists/*.room", "exact name"),
            ("_ordo_rules.room", "reserved"),
        ] {
            let doc = json!({"rules":[{"collection":"rooms","roles":["reader"],"read":{"through": through}}]});
            let error = compile(doc).err().unwrap_or_else(|| panic!("{through} was accepted"));
            assert_eq!(error.code, ErrorCode::InvalidRules, "{through}");
            assert!(error.message.starts_with("rule 0: `read`: `through`"), "{through}: {error}");
            assert!(error.message.contains(why), "{through}: {error}");
        }
        // A second key never turns one form into another: unknown keys are refused.
        for read in [
            json!({"filter": {"field": "x", "op": "eq", "value": 1}, "through": "members.room"}),
            json!({"through": "members.room", "filter": {"field": "x", "op": "eq", "value": 1}}),
            json!({"through": "members.room", "trough": true}),
        ] {
            let doc = json!({"rules":[{"collection":"rooms","roles":["reader"],"read": read}]});
            assert!(serde_json::from_value::<RulesDoc>(doc).is_err(), "{read}");
        }
        // Dots in a collection name: split at the last one.
        let set = compile(json!({"rules":[{"collection":"rooms","roles":["reader"],"read":{"through":"a.b.room"}}]}));
        let alice = identity("alice", Role::Reader);
        assert!(set.unwrap().may_read_through(&alice, "rooms", "a.b", "room"));
        // A write rule has no `through` form.
        let doc = json!({"rules":[{"collection":"rooms","roles":["reader"],"write":{"through":"members.room"}}]});
        let error = compile(doc).err().unwrap();
        assert!(error.message.starts_with("rule 0: `write`: unknown key `through`"), "{error}");
    }

    #[test]
    fn through_is_refused_while_its_role_may_point_the_reference() {
        for (writes, refused) in [
            // The readers may write their memberships: they could aim `room` anywhere.
            (
                r#"{"collection":"members","roles":["reader"],"write":{"filter":{"field":"owner","op":"eq","value":"$sub"}}}"#,
                true,
            ),
            (r#"{"collection":"*","roles":["reader","writer"],"write":true}"#, true),
            (r#"{"collection":"mem{sub}","roles":["reader"],"write":true}"#, true),
            // Another role, or a pattern that cannot match `members`.
            (r#"{"collection":"members","roles":["writer"],"write":true}"#, false),
            (r#"{"collection":"members/{sub}","roles":["reader"],"write":true}"#, false),
            (r#"{"collection":"*/x","roles":["reader"],"write":true}"#, false),
            // Creating collections points nothing (a reader's new collection may
            // reference only what it reads whole), nor does reading.
            (r#"{"collection":"*","roles":["reader"],"create":true,"read":true}"#, false),
        ] {
            let result = compile(rules_with(&[writes]));
            match (refused, result) {
                (true, Err(error)) => {
                    assert_eq!(error.code, ErrorCode::InvalidRules, "{writes}");
                    assert!(error.message.starts_with("rule 1:"), "{writes}: {error}");
                    assert!(
                        error.message.contains("rule 2 lets `reader` set `room` of `members`"),
                        "{writes}: {error}"
                    );
                }
                (false, Ok(_)) => {}
                (refused, result) => panic!("{writes}: expected refused = {refused}, got {:?}", result.err()),
            }
        }
    }

    #[test]
    fn a_pattern_can_match_a_name_for_some_claims() {
        let can = |pattern: &str, name: &str| super::super::pattern_can_match(&parse_pattern(pattern).unwrap(), name);
        assert!(can("members", "members"));
        assert!(!can("members", "member"));
        assert!(!can("members", "membersx"));
        assert!(can("{sub}", "members"));
        assert!(can("m{sub}s", "members"));
        assert!(can("*", "members"));
        assert!(!can("*", "a/b"));
        assert!(!can("{sub}", "a/b"), "a claim's value never holds a slash (the claim alphabet)");
        assert!(can("a/*/{x}c", "a/bb/cc"));
        assert!(!can("a/*/{x}c", "a/bb/c"));
        // Many placeholders against a long name: no blow-up.
        let pattern = "{a}x".repeat(30);
        assert!(!can(&pattern, &"x".repeat(59)));
        assert!(can(&pattern, &"x".repeat(60)));
    }
}
