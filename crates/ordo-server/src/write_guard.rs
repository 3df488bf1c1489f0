//! What a write under a restricted write grant must respect, checked on the
//! writer thread. Each op must be admitted whole by one of the caller's rules
//! (rules with equal limits act as one, `WriteGrant`): the fields it sets, the
//! atomics it applies (kind and field), whether it sets the payload, removes
//! its item, or creates it (the id does not exist); and its item must be inside
//! the rule's filter before the op (if it exists then) and after it. "Before"
//! is the item as the batch's own earlier ops leave it, not as it is committed:
//! a batch that removes an item and then upserts it again without `owner` is
//! checked against the removal, so it cannot plant an item outside every
//! reader's rule, and under a rule without `create` it creates an item.
//!
//! What an op sets, applies and removes needs no state: `check_shape` decides
//! it on the network thread first, with the same words, so most refusals never
//! reach the writer. `check` decides everything again on the writer thread (and
//! on every node of a cluster, in its apply).

use std::collections::HashMap;

use ordo_core::{Batch, BatchOp, Collection, FieldId, Filter, OwnedValue, Schema};

use crate::error::{ApiError, ErrorCode};
use crate::write_rules::{Disallowed, WriteGrant, WriteLimits};

/// A grant's rules, compiled against one schema.
#[derive(Debug)]
pub struct WriteGuard {
    /// The fields any rule's filter pins, once each: a staged item is these values.
    pinned: Vec<FieldId>,
    rules: Vec<GuardRule>,
    /// The schema the field ids belong to: a guard is only checked against a
    /// collection that still has it (a schema change may come in between).
    schema: Schema,
}

/// Rules with equal limits: their filters as a list of alternatives, each a
/// conjunction of `field == value`; an item is inside when one alternative holds.
#[derive(Debug)]
struct GuardRule {
    limits: WriteLimits,
    /// Per alternative, `(index into pinned, value)`. `None`: every item.
    alternatives: Option<Vec<Vec<(usize, OwnedValue)>>>,
}

/// An item's pinned fields after an op, or `None` where the op set a value that
/// does not fit the field (the batch is refused later; the guard admits nothing).
type PinnedValues = Vec<Option<OwnedValue>>;

/// An op no rule admits: its index in the batch, and what the rule that
/// admitted most of it did not allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub op: usize,
    pub disallowed: Disallowed,
}

impl Refusal {
    /// `403 forbidden` naming the op, its id and what was not allowed. An item
    /// outside the rule reads as it always did; a missing item and a hidden one
    /// get the same words (`creating items` when the rule may not create).
    pub fn to_error(&self, batch: &Batch) -> ApiError {
        let (op, id) = (self.op, batch.ops().nth(self.op).map_or("", |op| op.id()));
        let message = match &self.disallowed {
            Disallowed::Item => {
                format!("op {op}: this identity may not write item `{id}` (its write rule does not allow it)")
            }
            other => format!("op {op}: this identity may not write item `{id}`: its write rule does not allow {other}"),
        };
        ApiError::new(ErrorCode::Forbidden, message)
    }
}

impl WriteGuard {
    /// `None` for a grant of every op on every item.
    pub fn new(grant: &WriteGrant, schema: &Schema) -> Result<Option<WriteGuard>, ApiError> {
        if grant.is_unrestricted() {
            return Ok(None);
        }
        let mut pinned = Vec::new();
        let mut rules = Vec::with_capacity(grant.groups().len());
        for (limits, grant) in grant.groups() {
            let alternatives = match grant.predicate(schema)? {
                None => None,
                Some(predicate) => Some(compile_alternatives(predicate, schema, &mut pinned)?),
            };
            rules.push(GuardRule { limits: limits.clone(), alternatives });
        }
        Ok(Some(WriteGuard { pinned, rules, schema: schema.clone() }))
    }

    /// The schema the guard was compiled against.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The first op that no rule admits by what it sets, applies and removes
    /// alone, if one is: a part of `check` that needs no state.
    pub fn check_shape(&self, batch: &Batch) -> Result<(), Refusal> {
        for (index, op) in batch.ops().enumerate() {
            if let Some(disallowed) = self.closest_refusal(|rule| self.shape_refusal(rule, &op)) {
                return Err(Refusal { op: index, disallowed });
            }
        }
        Ok(())
    }

    /// The first op that no rule admits whole, if one is. Each op is checked
    /// against the item as the committed state changed by the batch's earlier
    /// ops leaves it.
    pub fn check(&self, collection: &Collection, batch: &Batch) -> Result<(), Refusal> {
        // Items the batch already touched: `None` once removed.
        let mut staged: HashMap<&str, Option<PinnedValues>> = HashMap::new();
        for (index, op) in batch.ops().enumerate() {
            let before = match staged.get(op.id()) {
                Some(staged) => staged.clone(),
                None => collection
                    .get(op.id())
                    .map(|item| self.pinned.iter().map(|field| Some(item.field(*field).to_owned_value())).collect()),
            };
            let after = (!op.is_remove()).then(|| self.after(collection.schema(), &op, before.clone()));
            let refusal = self.closest_refusal(|rule| {
                self.shape_refusal(rule, &op).or_else(|| state_refusal(rule, &op, before.as_deref(), after.as_deref()))
            });
            if let Some(disallowed) = refusal {
                return Err(Refusal { op: index, disallowed });
            }
            staged.insert(op.id(), after);
        }
        Ok(())
    }

    /// `None` when some rule admits the op; else what the rule that got
    /// furthest through the checks lacked (the first such rule on a tie).
    fn closest_refusal(&self, refusal_of: impl Fn(&GuardRule) -> Option<Disallowed>) -> Option<Disallowed> {
        let mut closest: Option<Disallowed> = None;
        for rule in &self.rules {
            // A rule that admits the op ends the search: nothing is refused.
            let disallowed = refusal_of(rule)?;
            if closest.as_ref().is_none_or(|held| disallowed.stage() > held.stage()) {
                closest = Some(disallowed);
            }
        }
        closest
    }

    /// What `rule` does not allow of what `op` removes, sets and applies.
    fn shape_refusal(&self, rule: &GuardRule, op: &BatchOp<'_>) -> Option<Disallowed> {
        let limits = &rule.limits;
        if op.is_remove() {
            return (!limits.may_remove()).then_some(Disallowed::Removing);
        }
        if let Some((name, _)) = op.fields().find(|(name, _)| !limits.may_set(name)) {
            return Some(Disallowed::Field(name.to_owned()));
        }
        // An atomic on a field the rule's filter pins (`owner == $sub`) would
        // change it to a value only known once applied: refused outright, so
        // that no increment or `set_max` can move an item out of the rule.
        let refused_atomic =
            op.atomics().find(|(kind, name, _)| !limits.may_apply(*kind, name) || self.pins(rule, name));
        if let Some((kind, name, _)) = refused_atomic {
            return Some(Disallowed::Atomic(kind, name.to_owned()));
        }
        (op.payload().is_some() && !limits.may_set_payload()).then_some(Disallowed::Payload)
    }

    /// Whether `rule`'s filter names the field `name`.
    fn pins(&self, rule: &GuardRule, name: &str) -> bool {
        let Some(alternatives) = &rule.alternatives else { return false };
        let Some(index) = self.pinned_index(&self.schema, name) else { return false };
        alternatives.iter().flatten().any(|(pinned, _)| *pinned == index)
    }

    /// The item's pinned values once the upsert `op` set its fields; a new
    /// item starts with every field null. A field an atomic changed (under a
    /// rule that does not pin it) has a value only known once applied: `None`,
    /// so no later op of the batch relies on it.
    fn after(&self, schema: &Schema, op: &BatchOp<'_>, before: Option<PinnedValues>) -> PinnedValues {
        let mut after = before.unwrap_or_else(|| vec![Some(OwnedValue::Null); self.pinned.len()]);
        for (name, value) in op.fields() {
            if let Some(pinned) = self.pinned_index(schema, name) {
                let field_type = schema.field(self.pinned[pinned]).field_type;
                after[pinned] = value.coerce_to(field_type).map(|value| value.to_owned_value());
            }
        }
        for (_, name, _) in op.atomics() {
            if let Some(pinned) = self.pinned_index(schema, name) {
                after[pinned] = None;
            }
        }
        after
    }

    fn pinned_index(&self, schema: &Schema, name: &str) -> Option<usize> {
        self.pinned.iter().position(|field| schema.field(*field).name == name)
    }
}

/// What `rule` does not allow of the op's item, before (`None`: it does not
/// exist) and after it (`None` for a remove). An existing item outside the
/// rule is, to a rule that may not create, what a missing one is: the words
/// must not tell them apart.
fn state_refusal(
    rule: &GuardRule,
    op: &BatchOp<'_>,
    before: Option<&[Option<OwnedValue>]>,
    after: Option<&[Option<OwnedValue>]>,
) -> Option<Disallowed> {
    let before_inside = before.map(|values| rule.admits(values));
    if !op.is_remove() && !rule.limits.may_create() && before_inside != Some(true) {
        return Some(Disallowed::Creating);
    }
    if before_inside == Some(false) || after.is_some_and(|values| !rule.admits(values)) {
        return Some(Disallowed::Item);
    }
    None
}

impl GuardRule {
    fn admits(&self, values: &[Option<OwnedValue>]) -> bool {
        let Some(alternatives) = &self.alternatives else { return true };
        alternatives.iter().any(|equalities| {
            equalities
                .iter()
                .all(|(pinned, value)| values[*pinned].as_ref().is_some_and(|held| held.as_value() == value.as_value()))
        })
    }
}

/// A rule's predicate as alternatives of equalities, their fields added to `pinned`.
fn compile_alternatives(
    predicate: Filter,
    schema: &Schema,
    pinned: &mut Vec<FieldId>,
) -> Result<Vec<Vec<(usize, OwnedValue)>>, ApiError> {
    let alternatives = match predicate {
        Filter::Any(list) => list,
        single => vec![single],
    };
    let mut compiled = Vec::with_capacity(alternatives.len());
    for alternative in alternatives {
        let mut equalities = Vec::new();
        collect_equalities(&alternative, schema, &mut equalities)?;
        let indexed = equalities
            .into_iter()
            .map(|(field, value)| {
                let index = pinned.iter().position(|pinned| *pinned == field).unwrap_or_else(|| {
                    pinned.push(field);
                    pinned.len() - 1
                });
                (index, value)
            })
            .collect();
        compiled.push(indexed);
    }
    Ok(compiled)
}

fn collect_equalities(filter: &Filter, schema: &Schema, out: &mut Vec<(FieldId, OwnedValue)>) -> Result<(), ApiError> {
    match filter {
        Filter::All(list) => list.iter().try_for_each(|child| collect_equalities(child, schema, out)),
        Filter::Compare { field, op: ordo_core::CompareOp::Eq, value } => {
            let field_id = schema
                .field_id(field)
                .ok_or_else(|| ApiError::new(ErrorCode::Forbidden, "the write rule names a field the schema lacks"))?;
            out.push((field_id, value.clone()));
            Ok(())
        }
        _ => Err(ApiError::new(ErrorCode::Forbidden, "a write rule's filter is `eq` comparisons only")),
    }
}

#[cfg(test)]
mod tests {
    //! The guard against a naive model of the rules: random rules (a filter
    //! or none, random limits, sometimes two rules), random batches over a few
    //! items of two owners, checked by both; an admitted batch is applied, so
    //! the state moves on. The model keeps whole items and decides each op
    //! rule by rule from the rules' words in docs/PROTOCOL.md.

    use std::collections::HashMap;
    use std::sync::Arc;

    use ordo_core::{AtomicOp, Batch, Engine, FieldType, NullSink, Schema, Value};
    use serde_json::{json, Value as Json};

    use super::*;
    use crate::auth::{Identity, Role};
    use crate::rng::Rng;
    use crate::rules::{RuleSet, RulesDoc};

    const FIELDS: [&str; 4] = ["owner", "room", "read_upto", "favourite"];
    const KINDS: [(AtomicOp, &str); 4] = [
        (AtomicOp::Increment, "increment"),
        (AtomicOp::Decrement, "decrement"),
        (AtomicOp::SetMax, "set_max"),
        (AtomicOp::SetMin, "set_min"),
    ];
    const IDS: [&str; 5] = ["u1/a", "u1/b", "u2/a", "u2/b", "x"];
    const OWNERS: [&str; 2] = ["u1", "u2"];
    const ROOMS: [&str; 2] = ["a", "b"];
    const ATOMIC_OPERANDS: [&str; 3] = ["u1", "a", "zz"];

    /// One rule as the model reads it.
    #[derive(Clone, Debug, PartialEq)]
    struct ModelRule {
        /// `field == value` equalities, all required; `None`: every item.
        filter: Option<Vec<(&'static str, &'static str)>>,
        fields: Option<Vec<&'static str>>,
        atomics: Vec<AtomicOp>,
        payload: bool,
        create: bool,
        remove: bool,
    }

    /// An item's filterable fields as the model knows them: `None` once an
    /// atomic changed it within the batch (known only once applied).
    type ModelItem = HashMap<&'static str, Option<Json>>;

    fn random_rule(rng: &mut Rng) -> ModelRule {
        let filter = match rng.below(3) {
            0 => None,
            1 => Some(vec![("owner", "u1")]),
            _ => Some(vec![("owner", "u1"), ("room", "a")]),
        };
        let fields = rng.chance(70).then(|| FIELDS.into_iter().filter(|_| rng.chance(50)).collect());
        let atomics = KINDS.iter().map(|(op, _)| *op).filter(|_| rng.chance(60)).collect();
        let mut rule = ModelRule {
            filter,
            fields,
            atomics,
            payload: rng.chance(50),
            create: rng.chance(50),
            remove: rng.chance(50),
        };
        // A rule allowing every op on every item needs no guard: not what is tested here.
        if rule.filter.is_none() && rule.fields.is_none() && rule.atomics.len() == 4 && rule.payload && rule.remove {
            rule.create = false;
        }
        rule
    }

    fn rule_json(rule: &ModelRule) -> Json {
        let mut write = serde_json::Map::new();
        if let Some(filter) = &rule.filter {
            let all: Vec<Json> =
                filter.iter().map(|(field, value)| json!({"field": field, "op": "eq", "value": value})).collect();
            write.insert("filter".into(), json!({ "all": all }));
        }
        if let Some(fields) = &rule.fields {
            write.insert("fields".into(), json!(fields));
        }
        let kinds: Vec<&str> =
            KINDS.iter().filter(|(op, _)| rule.atomics.contains(op)).map(|(_, name)| *name).collect();
        write.insert("atomics".into(), json!(kinds));
        for (key, value) in [("payload", rule.payload), ("create", rule.create), ("remove", rule.remove)] {
            write.insert(key.into(), json!(value));
        }
        json!({"collection": "members", "roles": ["reader"], "write": write})
    }

    /// A random upsert (setting fields, applying atomics, the payload) or remove, added to `batch`.
    fn random_op(rng: &mut Rng, batch: &mut Batch) {
        let id = *rng.pick(&IDS);
        if rng.chance(20) {
            batch.remove(id);
            return;
        }
        let mut upsert = batch.upsert(id);
        for field in FIELDS {
            if rng.chance(25) {
                upsert = match field {
                    "owner" => upsert.set(field, Value::Str(rng.pick::<&str>(&OWNERS))),
                    "room" => upsert.set(field, Value::Str(rng.pick::<&str>(&ROOMS))),
                    "read_upto" => upsert.set(field, Value::U64(rng.below(5))),
                    _ => upsert.set(field, Value::Bool(rng.chance(50))),
                };
            } else if rng.chance(15) {
                let (op, _) = *rng.pick(&KINDS);
                upsert = match field {
                    "read_upto" => upsert.atomic(op, field, Value::U64(1)),
                    "owner" | "room" if matches!(op, AtomicOp::SetMax | AtomicOp::SetMin) => {
                        upsert.atomic(op, field, Value::Str(rng.pick::<&str>(&ATOMIC_OPERANDS)))
                    }
                    _ => upsert,
                };
            }
        }
        if rng.chance(15) {
            upsert.payload(b"{}");
        }
    }

    fn model_after(before: Option<&ModelItem>, op: &BatchOp<'_>) -> ModelItem {
        let mut after =
            before.cloned().unwrap_or_else(|| FIELDS.iter().map(|field| (*field, Some(Json::Null))).collect());
        for (name, value) in op.fields() {
            let field = FIELDS.into_iter().find(|field| *field == name).unwrap();
            let value = match value {
                Value::Str(text) => json!(text),
                Value::U64(n) => json!(n),
                Value::Bool(flag) => json!(flag),
                _ => unreachable!(),
            };
            after.insert(field, Some(value));
        }
        for (_, name, _) in op.atomics() {
            let field = FIELDS.into_iter().find(|field| *field == name).unwrap();
            after.insert(field, None);
        }
        after
    }

    /// The model's verdict on a batch: rules with equal limits act as one.
    fn model_check(rules: &[ModelRule], committed: &HashMap<String, ModelItem>, batch: &Batch) -> Result<(), Refusal> {
        let mut staged: HashMap<&str, Option<ModelItem>> = HashMap::new();
        for (index, op) in batch.ops().enumerate() {
            let before = staged.get(op.id()).cloned().unwrap_or_else(|| committed.get(op.id()).cloned());
            let mut closest: Option<Disallowed> = None;
            let mut admitted = false;
            for group in merged(rules) {
                match group_refusal(&group, &op, before.as_ref()) {
                    None => admitted = true,
                    Some(disallowed) => {
                        if closest.as_ref().is_none_or(|held| disallowed.stage() > held.stage()) {
                            closest = Some(disallowed);
                        }
                    }
                }
            }
            if !admitted {
                return Err(Refusal { op: index, disallowed: closest.unwrap() });
            }
            let after = (!op.is_remove()).then(|| model_after(before.as_ref(), &op));
            staged.insert(op.id(), after);
        }
        Ok(())
    }

    /// Rules with equal limits, together.
    fn merged(rules: &[ModelRule]) -> Vec<Vec<ModelRule>> {
        let mut groups: Vec<Vec<ModelRule>> = Vec::new();
        for rule in rules {
            let limits_of = |rule: &ModelRule| ModelRule { filter: None, ..rule.clone() };
            let same_limits = |other: &ModelRule| limits_of(other) == limits_of(rule);
            match groups.iter_mut().find(|group| same_limits(&group[0])) {
                Some(group) => group.push(rule.clone()),
                None => groups.push(vec![rule.clone()]),
            }
        }
        groups
    }

    /// What a group of rules with equal limits does not allow of `op` on an
    /// item `before` (`None`: missing): the item must be inside any of the
    /// group's filters before and any after (a rule without one: every item).
    fn group_refusal(group: &[ModelRule], op: &BatchOp<'_>, before: Option<&ModelItem>) -> Option<Disallowed> {
        let limits = &group[0];
        let every_item = group.iter().any(|rule| rule.filter.is_none());
        let filters = || group.iter().filter_map(|rule| rule.filter.as_ref());
        let pins = |name: &str| !every_item && filters().flatten().any(|(field, _)| *field == name);
        let may_set = |name: &str| limits.fields.as_ref().is_none_or(|fields| fields.contains(&name));
        if op.is_remove() && !limits.remove {
            return Some(Disallowed::Removing);
        }
        if let Some((name, _)) = op.fields().find(|(name, _)| !may_set(name)) {
            return Some(Disallowed::Field(name.to_owned()));
        }
        if let Some((kind, name, _)) =
            op.atomics().find(|(kind, name, _)| !limits.atomics.contains(kind) || !may_set(name) || pins(name))
        {
            return Some(Disallowed::Atomic(kind, name.to_owned()));
        }
        if op.payload().is_some() && !limits.payload {
            return Some(Disallowed::Payload);
        }
        let inside = |item: &ModelItem| {
            every_item
                || filters().any(|filter| {
                    filter.iter().all(|(field, value)| item.get(field).cloned().flatten() == Some(json!(value)))
                })
        };
        let before_inside = before.map(inside);
        if !op.is_remove() && !limits.create && before_inside != Some(true) {
            return Some(Disallowed::Creating);
        }
        let after = (!op.is_remove()).then(|| model_after(before, op));
        (before_inside == Some(false) || after.as_ref().is_some_and(|after| !inside(after))).then_some(Disallowed::Item)
    }

    fn committed_items(engine: &Engine, collection: ordo_core::CollectionId) -> HashMap<String, ModelItem> {
        let collection = engine.collection(collection).unwrap();
        let mut items = HashMap::new();
        for id in IDS {
            if let Some(item) = collection.get(id) {
                let fields = FIELDS
                    .iter()
                    .map(|field| {
                        let value = match item.field_by_name(field).unwrap() {
                            Value::Null => Json::Null,
                            Value::Str(text) => json!(text),
                            Value::U64(n) => json!(n),
                            Value::Bool(flag) => json!(flag),
                            _ => unreachable!(),
                        };
                        (*field, Some(value))
                    })
                    .collect();
                items.insert(id.to_owned(), fields);
            }
        }
        items
    }

    fn u1() -> Identity {
        Identity {
            sub: "u1".into(),
            role: Role::Reader,
            claims: Default::default(),
            expires_at: u64::MAX,
            key: Arc::from("u1"),
        }
    }

    #[test]
    fn the_guard_decides_as_the_model_of_the_rules() {
        let schema = Schema::new()
            .with_field("owner", FieldType::String)
            .with_field("room", FieldType::String)
            .with_field("read_upto", FieldType::U64)
            .with_field("favourite", FieldType::Bool);
        let mut n_admitted = 0;
        let mut refused_stages = [0usize; 6];
        for seed in 0..300u64 {
            let mut rng = Rng::new(seed);
            let rules: Vec<ModelRule> = (0..1 + rng.below(2)).map(|_| random_rule(&mut rng)).collect();
            let doc: RulesDoc =
                serde_json::from_value(json!({"rules": rules.iter().map(rule_json).collect::<Vec<_>>()})).unwrap();
            let grant = RuleSet::compile(doc).unwrap().write_grant(&u1(), "members").unwrap();
            let guard = WriteGuard::new(&grant, &schema).unwrap().expect("no random rule allows everything");
            let mut engine = Engine::new();
            let collection = engine.create_collection("members", schema.clone()).unwrap();
            let mut seed_batch = Batch::new();
            for id in IDS.into_iter().filter(|_| rng.chance(60)) {
                let owner = if id.starts_with("u1") { "u1" } else { "u2" };
                let room = if id.ends_with('a') { "a" } else { "b" };
                seed_batch.upsert(id).set("owner", Value::Str(owner)).set("room", Value::Str(room));
            }
            engine.apply_batch(collection, &seed_batch, &mut NullSink).unwrap();
            for _ in 0..40 {
                let mut batch = Batch::new();
                for _ in 0..1 + rng.below(4) {
                    random_op(&mut rng, &mut batch);
                }
                let expected = model_check(&rules, &committed_items(&engine, collection), &batch);
                let checked = guard.check(engine.collection(collection).unwrap(), &batch);
                assert_eq!(checked, expected, "seed {seed}: {rules:?}");
                if let Err(shape) = guard.check_shape(&batch) {
                    // Refused on the network thread: the writer would refuse
                    // this op or an earlier one, and this one with the same words.
                    let writer = expected.as_ref().expect_err("the shape check refuses only what the writer refuses");
                    assert!(writer.op < shape.op || *writer == shape, "seed {seed}: {writer:?} {shape:?}");
                }
                match expected {
                    Ok(()) => {
                        n_admitted += 1;
                        // The engine may still refuse it (a type): the state then stays.
                        let _ = engine.apply_batch(collection, &batch, &mut NullSink);
                    }
                    Err(refusal) => refused_stages[refusal.disallowed.stage() as usize] += 1,
                }
            }
        }
        assert!(n_admitted > 100, "{n_admitted} batches admitted");
        assert!(refused_stages.iter().all(|n| *n > 20), "every kind of refusal is seen: {refused_stages:?}");
    }
}
