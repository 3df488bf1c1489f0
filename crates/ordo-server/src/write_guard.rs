//! What a write under a filtered write rule must respect (`owner == $sub`),
//! checked on the writer thread: every item a batch touches must be inside the
//! grant before each op (if it exists then) and after it. "Before" is the item
//! as the batch's own earlier ops leave it, not as it is committed: a batch that
//! removes an item and then upserts it again without `owner` is checked against
//! the removal, so it cannot plant an item outside every reader's rule.

use std::collections::HashMap;

use ordo_core::{Batch, Collection, FieldId, Filter, OwnedValue, Schema};

use crate::error::{ApiError, ErrorCode};
use crate::rules::Grant;

/// A grant's predicate as a list of alternatives, each a conjunction of
/// `field == value`; an item is inside when one alternative holds.
#[derive(Debug)]
pub struct WriteGuard {
    /// The fields any alternative pins, once each: a staged item is these values.
    pinned: Vec<FieldId>,
    /// Per alternative, `(index into pinned, value)`.
    alternatives: Vec<Vec<(usize, OwnedValue)>>,
    /// The schema the field ids belong to: a guard is only checked against a
    /// collection that still has it (a schema change may come in between).
    schema: Schema,
}

/// An item's pinned fields after an op, or `None` where the op set a value that
/// does not fit the field (the batch is refused later; the guard admits nothing).
type PinnedValues = Vec<Option<OwnedValue>>;

impl WriteGuard {
    /// `None` for a grant of every item.
    pub fn new(grant: &Grant, schema: &Schema) -> Result<Option<WriteGuard>, ApiError> {
        let Some(predicate) = grant.predicate(schema)? else { return Ok(None) };
        let alternatives = match predicate {
            Filter::Any(list) => list,
            single => vec![single],
        };
        let mut pinned = Vec::new();
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
        Ok(Some(WriteGuard { pinned, alternatives: compiled, schema: schema.clone() }))
    }

    /// The schema the guard was compiled against.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The index of the first op that touches an item outside the grant, or
    /// leaves one outside it, if one does. Each op is checked against the item
    /// as the committed state changed by the batch's earlier ops leaves it.
    pub fn check(&self, collection: &Collection, batch: &Batch) -> Result<(), usize> {
        // Items the batch already touched: `None` once removed.
        let mut staged: HashMap<&str, Option<PinnedValues>> = HashMap::new();
        for (index, op) in batch.ops().enumerate() {
            let before = match staged.get(op.id()) {
                Some(staged) => staged.clone(),
                None => collection
                    .get(op.id())
                    .map(|item| self.pinned.iter().map(|field| Some(item.field(*field).to_owned_value())).collect()),
            };
            if before.as_ref().is_some_and(|values| !self.admits(values)) {
                return Err(index);
            }
            if op.is_remove() {
                staged.insert(op.id(), None);
                continue;
            }
            // An atomic operation on a pinned field (`owner == $user`) would change
            // it to a value only known once applied: refused outright, so that no
            // increment or `set_max` can move an item out of the grant.
            let schema = collection.schema();
            let pins = |name: &str| self.pinned_index(schema, name).is_some();
            if op.atomics().any(|(_, name, _)| pins(name)) {
                return Err(index);
            }
            // A new item starts with every field null.
            let mut after = before.unwrap_or_else(|| vec![Some(OwnedValue::Null); self.pinned.len()]);
            for (name, value) in op.fields() {
                if let Some(pinned) = self.pinned_index(schema, name) {
                    let field_type = schema.field(self.pinned[pinned]).field_type;
                    after[pinned] = value.coerce_to(field_type).map(|value| value.to_owned_value());
                }
            }
            if !self.admits(&after) {
                return Err(index);
            }
            staged.insert(op.id(), Some(after));
        }
        Ok(())
    }

    fn pinned_index(&self, schema: &Schema, name: &str) -> Option<usize> {
        self.pinned.iter().position(|field| schema.field(*field).name == name)
    }

    fn admits(&self, values: &[Option<OwnedValue>]) -> bool {
        self.alternatives.iter().any(|equalities| {
            equalities
                .iter()
                .all(|(pinned, value)| values[*pinned].as_ref().is_some_and(|held| held.as_value() == value.as_value()))
        })
    }
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
