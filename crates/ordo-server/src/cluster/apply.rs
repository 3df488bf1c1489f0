//! The writer thread's side of cluster mode: applies one stream entry at
//! exactly its sequence number, through the same code paths as the commands of
//! single-node mode (writes with their rules and guards, collection creation,
//! field changes, drops, rules), and hands the outcome to the request waiting
//! for it on this node.
//!
//! Which refusals are *outcomes* (the same on every node, so the entry is done
//! and its seq used, by a seq marker if nothing was written) and which are
//! *local failures* (a full disk, an I/O error: this node could not apply it,
//! another could): a local failure stops applying, and the consumer starts
//! again from the last entry applied (`Shared::restart`).

use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::entry::{Entry, Kind};
use super::{Outcome, Shared};
use crate::access::Gate;
use crate::auth::{Identity, Role};
use crate::core::{is_reserved_name, Core, FieldChange};
use crate::error::{ApiError, ErrorCode};
use crate::rules::{self, Action, RuleSet, RulesDoc, WriteGuard};
use crate::wire::{self, AddFieldRequest, OpRequest, SchemaRequest};

/// The writer thread's cluster state (owned by `Core`).
pub struct Applier {
    pub shared: Arc<Shared>,
    pub gate: Arc<Gate>,
    /// Entries of this consumer generation or an older one are ignored: the
    /// writer gave up on them after a local failure.
    halted_generation: u64,
}

impl Applier {
    pub fn new(shared: Arc<Shared>, gate: Arc<Gate>) -> Applier {
        Applier { shared, gate, halted_generation: 0 }
    }
}

/// One entry as the consumer delivered it.
pub struct Delivered {
    pub seq: u64,
    pub generation: u64,
    pub msg_id: Option<String>,
    pub published_ns: u64,
    pub payload: Bytes,
}

/// Errors that say this node failed, not that the entry is refused.
fn is_local_failure(error: &ApiError) -> bool {
    matches!(
        error.code,
        ErrorCode::StoreFull | ErrorCode::Internal | ErrorCode::ShuttingDown | ErrorCode::BackupRunning
    )
}

/// Applies `delivered` at its seq, if it is the next one (see the module doc).
pub fn apply_entry(core: &mut Core, applier: &mut Applier, delivered: Delivered) {
    let Delivered { seq, generation, msg_id, published_ns, payload } = delivered;
    if generation <= applier.halted_generation {
        return;
    }
    let last_seq = core.database().last_seq();
    if seq <= last_seq {
        // Applied already: a new consumer generation delivers again what an
        // older one had queued.
        return;
    }
    // The stream holds no message between (deleted from it): their seqs are
    // used by markers, so every node's seqs stay the stream's.
    for missing in last_seq + 1..seq {
        tracing::warn!(seq = missing, "the stream has no entry at this seq; recording it as empty");
        if let Err(error) = core.database_mut().advance_seq(missing) {
            return halt(core, applier, generation, seq, &ApiError::from(error));
        }
    }
    let outcome = match Entry::decode(&payload) {
        Ok(entry) => apply_decoded(core, applier, &entry),
        Err(error) => Outcome::Malformed(ApiError::bad_request(format!("entry at seq {seq} does not decode: {error}"))),
    };
    if let Some(error) = outcome.error().filter(|error| is_local_failure(error)) {
        return halt(core, applier, generation, seq, error);
    }
    if core.database().last_seq() < seq {
        // Nothing written (refused, or a collection created): a marker uses the seq.
        if let Err(error) = core.database_mut().advance_seq(seq) {
            return halt(core, applier, generation, seq, &ApiError::from(error));
        }
    }
    assert_eq!(core.database().last_seq(), seq, "an entry uses exactly its seq");
    applier.shared.status.set_applied(seq, published_ns);
    // Before the answer: a client that got this seq never waits for it here.
    core.publish_seq();
    applier.shared.deliver(msg_id.as_deref(), outcome);
}

fn halt(core: &mut Core, applier: &mut Applier, generation: u64, seq: u64, error: &ApiError) {
    tracing::error!(seq, code = error.code.as_str(), "cannot apply the stream's entry here: {}", error.message);
    applier.halted_generation = generation;
    core.publish_seq();
    applier.shared.restart.notify_one();
}

fn apply_decoded(core: &mut Core, applier: &Applier, entry: &Entry<'_>) -> Outcome {
    let identity = entry.caller.identity();
    match entry.kind {
        Kind::Write => Outcome::Write(write(core, applier, entry, &identity)),
        Kind::CreateCollection => Outcome::Create(create_collection(core, applier, entry, &identity)),
        Kind::AddField => Outcome::Fields(add_field(core, entry, &identity)),
        Kind::RemoveField => Outcome::Fields(remove_field(core, entry, &identity)),
        Kind::DropCollection => Outcome::Drop(drop_collection(core, entry, &identity)),
        Kind::SetRules => Outcome::Rules(set_rules(core, applier, entry, &identity)),
    }
}

fn required<'e, T: ?Sized>(value: Option<&'e T>, what: &str) -> Result<&'e T, ApiError> {
    value.ok_or_else(|| ApiError::bad_request(format!("the entry has no `{what}`")))
}

fn parse<'a, T: Deserialize<'a>>(raw: &'a RawValue) -> Result<T, ApiError> {
    serde_json::from_str(raw.get()).map_err(|error| ApiError::from_json(&error))
}

fn require_admin(identity: &Identity, what: &str) -> Result<(), ApiError> {
    if identity.role == Role::Admin {
        Ok(())
    } else {
        Err(ApiError::new(ErrorCode::Forbidden, format!("{what} needs an admin token")))
    }
}

fn write(
    core: &mut Core,
    applier: &Applier,
    entry: &Entry<'_>,
    identity: &Identity,
) -> Result<ordo_store::Ack, ApiError> {
    let name = required(entry.collection.as_deref(), "collection")?;
    let ops: Vec<OpRequest<'_>> = parse(required(entry.ops, "ops")?)?;
    let (target, grant) = applier.gate.granted_collection(core.routes(), identity, name, Action::Write)?;
    let guard = WriteGuard::new(&grant, &target.schema)?.map(Arc::new);
    let mut batch = ordo_core::Batch::new();
    wire::fill_batch(&mut batch, &target.schema, &ops, 0)?;
    core.write_one(target.id, batch, guard)
}

fn create_collection(
    core: &mut Core,
    applier: &Applier,
    entry: &Entry<'_>,
    identity: &Identity,
) -> Result<(bool, Arc<crate::core::CollectionEntry>), ApiError> {
    let name = required(entry.collection.as_deref(), "collection")?;
    if is_reserved_name(name) {
        return Err(ApiError::new(ErrorCode::Forbidden, format!("`{name}` is reserved for the server")));
    }
    if !applier.gate.rules().may_create(identity, name) {
        return Err(rules::forbidden(name, "create"));
    }
    let request: SchemaRequest = parse(required(entry.schema, "schema")?)?;
    let schema = request.to_schema(|target| route_id(core, target))?;
    core.create_collection(name, schema)
}

/// A `ref` field's target, by name, as the routing table has it when the entry applies.
fn route_id(core: &Core, name: &str) -> Option<ordo_core::CollectionId> {
    let routes = core.routes().read().expect("routes lock");
    routes.get(name).filter(|entry| entry.name == name).map(|entry| entry.id)
}

/// The collection a schema change or drop names, as the routing table has it now.
fn schema_target(core: &Core, entry: &Entry<'_>) -> Result<Arc<crate::core::CollectionEntry>, ApiError> {
    let name = required(entry.collection.as_deref(), "collection")?;
    if is_reserved_name(name) {
        return Err(ApiError::new(ErrorCode::Forbidden, format!("`{name}` is reserved for the server")));
    }
    core.routes().read().expect("routes lock").get(name).cloned().ok_or_else(|| ApiError::unknown_collection(name))
}

fn add_field(
    core: &mut Core,
    entry: &Entry<'_>,
    identity: &Identity,
) -> Result<(u64, Arc<crate::core::CollectionEntry>), ApiError> {
    require_admin(identity, "adding a field")?;
    let target = schema_target(core, entry)?;
    let add: AddFieldRequest = parse(required(entry.field, "field")?)?;
    let (field_type, default) = add.typed(|target| route_id(core, target))?;
    core.change_fields(target.id, FieldChange::Add { name: add.name, field_type, default })
}

fn remove_field(
    core: &mut Core,
    entry: &Entry<'_>,
    identity: &Identity,
) -> Result<(u64, Arc<crate::core::CollectionEntry>), ApiError> {
    require_admin(identity, "removing a field")?;
    let target = schema_target(core, entry)?;
    let name: String = parse(required(entry.field, "field")?)?;
    core.change_fields(target.id, FieldChange::Remove { name })
}

fn drop_collection(core: &mut Core, entry: &Entry<'_>, identity: &Identity) -> Result<u64, ApiError> {
    require_admin(identity, "dropping a collection")?;
    let target = schema_target(core, entry)?;
    core.drop_collection(target.id)
}

fn set_rules(core: &mut Core, applier: &Applier, entry: &Entry<'_>, identity: &Identity) -> Result<u64, ApiError> {
    require_admin(identity, "changing the rules")?;
    let doc: RulesDoc = parse(required(entry.rules, "rules")?)?;
    let rules = RuleSet::compile(doc.clone())?;
    let text = serde_json::to_string(&doc).expect("rules serialise");
    let seq = core.set_rules(&text)?;
    // Every later entry is checked against these, on every node.
    applier.gate.set_rules(rules);
    Ok(seq)
}
