//! The writer thread's side of cluster mode: applies each entry of the stream's
//! messages at exactly its seq (`pack::SeqScheme`: derived from the message's
//! stream seq and the entry's place in it), through the same code paths as the
//! commands of single-node mode (writes with their rules and guards, collection
//! creation, field changes, drops, rules), and hands the outcome to the request
//! waiting for it on this node. The consumer hands it runs of consecutive
//! messages; consecutive writes of a run share one group commit (see
//! `apply_run`), and so do the batches of the PostgreSQL follower's entries:
//! a transaction's `rows` entries and its `position` entry are one group
//! commit with one published seq on every node, as the transaction is one
//! group commit in single-node mode, whenever its entries come in one run
//! (always when they are in one stream message: `coalesce` cuts packs between
//! transactions, and only a transaction larger than a pack is cut).
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

use super::entry::{Decoded, Kind};
use super::pack::{MsgId, Pack};
use super::{Outcome, Shared};
use crate::access::Gate;
use crate::auth::{Identity, Role};
use crate::error::{ApiError, ErrorCode};
use crate::routing::is_reserved_name;
use crate::rules::{self, RuleSet, RulesDoc};
use crate::wire::{self, AddFieldRequest, SchemaRequest};
use crate::write_guard::WriteGuard;
use crate::writer::{FieldChange, Writer};
use ordo_core::CollectionId;
use ordo_store::PendingWrite;

/// The writer thread's cluster state (owned by `Writer`).
pub struct Applier {
    pub shared: Arc<Shared>,
    pub gate: Arc<Gate>,
    /// Entries of this consumer generation or an older one are ignored: the
    /// writer gave up on them after a local failure.
    halted_generation: u64,
    /// `--snapshot-every`: starts a snapshot when due (cluster::snapshot).
    snapshots: Option<super::snapshot::SnapshotScheduler>,
    /// Batches of entries already written, emptied, filled again by the next
    /// write entries: a catching-up node would otherwise allocate every
    /// entry's buffers afresh (docs/bench-history/2026-11-24-cluster-mode.md, "Catch-up, third pass").
    spare_batches: Vec<ordo_core::Batch>,
    /// The group of the run being applied, empty between runs and kept for its
    /// capacity: a node following the live log gets runs of one entry, and a
    /// group made afresh for each would allocate twice per entry.
    group: Group,
    /// The identity the last write entry applied for, reused by the next ones
    /// while their caller is the same (`DecodedCaller::is`).
    last_identity: Option<Identity>,
    /// The claims `last_identity` was built from, as their entry wrote them.
    last_claims: String,
    /// `--pg-table`: the follower's status, which every node's apply of a
    /// position entry moves on (a node that does not hold the lease reports
    /// the position it applied from the stream).
    postgres: Option<Arc<crate::pg_follow::FollowStatus>>,
}

impl Applier {
    pub fn new(shared: Arc<Shared>, gate: Arc<Gate>) -> Applier {
        Applier {
            shared,
            gate,
            halted_generation: 0,
            snapshots: None,
            spare_batches: Vec::new(),
            group: Group::default(),
            last_identity: None,
            last_claims: String::new(),
            postgres: None,
        }
    }

    pub fn with_postgres(mut self, status: Arc<crate::pg_follow::FollowStatus>) -> Applier {
        self.postgres = Some(status);
        self
    }

    pub fn with_snapshots(mut self, scheduler: super::snapshot::SnapshotScheduler) -> Applier {
        self.snapshots = Some(scheduler);
        self
    }

    /// Lets the snapshot thread tell the writer when a copy ends.
    pub fn wake_writer_with(&mut self, writer: tokio::sync::mpsc::WeakSender<crate::writer::Command>) {
        if let Some(snapshots) = &mut self.snapshots {
            snapshots.wake_writer_with(writer);
        }
    }

    /// A snapshot's copy ended: start the next one if it came due meanwhile.
    pub fn after_snapshot(&mut self, writer: &Writer) {
        let scheme = self.shared.status.scheme();
        if let Some(snapshots) = &mut self.snapshots {
            snapshots.after_apply(writer.database(), scheme);
        }
    }

    /// A follower batch's outcome once its group is written; the position of
    /// a transaction moves this node's follower status on.
    fn follower_outcome(&self, result: Result<ordo_store::Ack, ApiError>, ends_transaction: Option<u64>) -> Outcome {
        let applied = result.map(|_| crate::pg_follow::stream_entry::Applied::Done);
        if let (Ok(_), Some(end_lsn), Some(status)) = (&applied, ends_transaction, &self.postgres) {
            status.applied_from_stream(end_lsn);
        }
        Outcome::Postgres(applied)
    }

    /// An empty batch, with the buffers of an earlier entry's if one is spare.
    fn take_batch(&mut self) -> ordo_core::Batch {
        self.spare_batches.pop().unwrap_or_default()
    }

    /// Keeps `batch`'s buffers for a later entry, unless they are large (one
    /// big entry must not keep its memory) or enough are kept already.
    fn recycle(&mut self, mut batch: ordo_core::Batch) {
        if self.spare_batches.len() < MAX_RUN_ENTRIES && batch.n_bytes() <= MAX_SPARE_BATCH_BYTES {
            batch.clear();
            self.spare_batches.push(batch);
        }
    }
}

/// A batch holding more bytes than this is dropped after its write, not kept
/// for reuse: at most `MAX_RUN_ENTRIES` of them are kept, a few MiB at most.
const MAX_SPARE_BATCH_BYTES: usize = 16 * 1024;

/// One stream message as the consumer delivered it: one entry, or a pack of them.
pub struct Delivered {
    pub stream_seq: u64,
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

/// Most entries the consumer hands the writer in one command (what the stream
/// had already delivered; it never waits to fill a run), and their most bytes.
pub const MAX_RUN_ENTRIES: usize = 256;
pub const MAX_RUN_BYTES: usize = 1 << 20;

/// Write entries of a run waiting for their group commit, in seq order; the
/// first one's seq is `last_seq() + 1`.
#[derive(Default)]
struct Group {
    writes: Vec<PendingWrite>,
    entries: Vec<Waiting>,
}

/// One entry of a delivered message, at its seq.
struct Entry {
    seq: u64,
    generation: u64,
    msg_id: Option<MsgId>,
    published_ns: u64,
    payload: Bytes,
}

/// What an entry's answer needs once it is applied.
struct Waiting {
    seq: u64,
    generation: u64,
    msg_id: Option<MsgId>,
    published_ns: u64,
    outcome_of: OutcomeOf,
}

/// Which outcome a written entry of a group is told.
#[derive(Clone, Copy)]
enum OutcomeOf {
    /// A write entry: its write's result.
    Write,
    /// A PostgreSQL follower's batch (`pg_follow::apply::group`); the
    /// position item of a transaction carries its end LSN.
    Follower { ends_transaction: Option<u64> },
}

/// Applies a run of consecutive messages, each entry at its seq (see the module doc).
///
/// Consecutive write entries share one group commit (`Database::write_run`:
/// each still at its own seq, a refused one with a seq marker there, and the
/// seqs a message leaves unused one marker). Anything that must see the group
/// written first ends it: a schema change, a creation, a drop, rules, an entry
/// refused before the store (a marker of its own), a write under a filtered
/// write rule (its guard checks the committed items). So every entry gets the
/// seq and the outcome it gets applied one by one.
///
/// A follower entry's batch joins the group too (`apply_follower`), and a
/// transaction's `position` entry ends it: the transaction's batches are one
/// log append, and the requests waiting for a seq are told one, its end. Its
/// fencing (the term, and whether its end LSN is past the stored position)
/// reads the state as committed, which is the state just before the
/// transaction, since the group before it ended with the previous
/// transaction's position and a claim is applied alone. A group never
/// outlives its run, so that no entry waits on a message still to come: a
/// transaction whose entries are in messages of two runs (one larger than a
/// pack, `coalesce::pack_len`) is two group commits, the second with its
/// position, and may be seen in those two parts.
pub fn apply_run(writer: &mut Writer, applier: &mut Applier, run: Vec<Delivered>) {
    let scheme = applier.shared.status.scheme();
    let mut group = std::mem::take(&mut applier.group);
    'messages: for mut delivered in run {
        if delivered.generation <= applier.halted_generation {
            break;
        }
        let pack = match super::pack::is_pack(&delivered.payload) {
            true => super::pack::decode(&delivered.payload, scheme.max_entries()).ok(),
            false => None,
        };
        // A message that is not a pack, or a pack that does not decode, is one
        // entry (refused as malformed where it applies).
        let single = match &pack {
            None => Some((delivered.msg_id.take().map(MsgId::from), std::mem::take(&mut delivered.payload))),
            Some(_) => None,
        };
        let n_entries = pack.as_ref().map_or(1, Pack::n_entries);
        let packed = pack.iter().flat_map(Pack::entries).map(|(msg_id, payload)| (Some(msg_id), payload));
        for (index, (msg_id, payload)) in single.into_iter().chain(packed).enumerate() {
            let entry = Entry {
                seq: scheme.entry_seq(delivered.stream_seq, n_entries, index),
                generation: delivered.generation,
                msg_id,
                published_ns: delivered.published_ns,
                payload,
            };
            if !apply_next(writer, applier, &mut group, entry) {
                break 'messages;
            }
        }
    }
    flush(writer, applier, &mut group);
    debug_assert!(group.writes.is_empty() && group.entries.is_empty(), "a flush empties its group");
    applier.group = group;
}

/// Applies one entry, or adds it to `group`; false when this node halted.
fn apply_next(writer: &mut Writer, applier: &mut Applier, group: &mut Group, entry: Entry) -> bool {
    let Entry { seq, generation, msg_id, published_ns, payload } = entry;
    let last_seq = group.entries.last().map_or_else(|| writer.database().last_seq(), |last| last.seq);
    if seq <= last_seq {
        // Applied already: a new consumer generation delivers again what an
        // older one had queued, or the message this node stopped inside.
        return true;
    }
    let waiting = Waiting { seq, generation, msg_id, published_ns, outcome_of: OutcomeOf::Write };
    let entry = match Decoded::decode(&payload) {
        Ok(entry) => entry,
        Err(error) => return flush(writer, applier, group) && finish(writer, applier, waiting, malformed(seq, &error)),
    };
    match entry.kind {
        Kind::Write => add_write(writer, applier, group, waiting, &entry),
        Kind::Postgres => apply_follower(writer, applier, group, waiting, &entry),
        _ => apply_alone(writer, applier, group, waiting, &entry),
    }
}

/// Applies an entry that is no batch of a group (a schema change, a
/// creation, a drop, rules) once the group before it is written.
fn apply_alone(
    writer: &mut Writer,
    applier: &mut Applier,
    group: &mut Group,
    waiting: Waiting,
    entry: &Decoded<'_>,
) -> bool {
    if !flush(writer, applier, group) || !use_seqs_before(writer, applier, &waiting) {
        return false;
    }
    let outcome = match entry.caller.identity() {
        Ok(identity) => apply_decoded(writer, applier, entry, &identity),
        Err(error) => malformed(waiting.seq, &error),
    };
    finish(writer, applier, waiting, outcome)
}

/// Adds a write entry to `group`, or refuses it (after the group before it).
fn add_write(
    writer: &mut Writer,
    applier: &mut Applier,
    group: &mut Group,
    waiting: Waiting,
    entry: &Decoded<'_>,
) -> bool {
    if !applier.last_identity.as_ref().is_some_and(|identity| entry.caller.is(identity, &applier.last_claims)) {
        match entry.caller.identity() {
            Ok(identity) => {
                applier.last_identity = Some(identity);
                applier.last_claims.clear();
                applier.last_claims.push_str(entry.caller.claims_text());
            }
            Err(error) => {
                let outcome = malformed(waiting.seq, &error);
                return flush(writer, applier, group) && finish(writer, applier, waiting, outcome);
            }
        }
    }
    let mut batch = applier.take_batch();
    let identity = applier.last_identity.as_ref().expect("set just above");
    let (collection, guard) = match prepare_write(writer, &applier.gate, entry, identity, &mut batch) {
        Ok(prepared) => prepared,
        Err(error) => {
            applier.recycle(batch);
            return flush(writer, applier, group) && finish(writer, applier, waiting, Outcome::Write(Err(error)));
        }
    };
    if let Some(guard) = guard {
        // Checked against the items as committed, so after the group before it.
        if !flush(writer, applier, group) {
            return false;
        }
        if let Some(refusal) = writer.guard_refusal(collection, &batch, &guard) {
            applier.recycle(batch);
            return finish(writer, applier, waiting, Outcome::Write(Err(refusal)));
        }
    }
    group.writes.push(PendingWrite::at(collection, batch, waiting.seq));
    group.entries.push(waiting);
    true
}

/// A PostgreSQL follower entry: its batch (a transaction's rows, a copy's, the
/// position) joins `group` as a write entry's does, and the position of a
/// transaction ends the group, so that on every node a transaction whose
/// entries came in one run is one group commit and one published seq, and the
/// next transaction's fencing reads the position it stored. The other follower
/// entries are applied alone (`pg_follow::apply`).
fn apply_follower(
    writer: &mut Writer,
    applier: &mut Applier,
    group: &mut Group,
    mut waiting: Waiting,
    entry: &Decoded<'_>,
) -> bool {
    use crate::pg_follow::apply::{self as follower, Grouped};
    // The follower's caller is not checked against rules, but a malformed one
    // makes the entry malformed, as any entry's.
    if let Err(error) = entry.caller.identity() {
        let outcome = malformed(waiting.seq, &error);
        return flush(writer, applier, group) && finish(writer, applier, waiting, outcome);
    }
    let grouped = match follower::decode(required(entry.postgres, "postgres")) {
        Ok(decoded) => follower::group(writer, decoded),
        Err(error) => Grouped::Decided(Err(error)),
    };
    match grouped {
        Grouped::Write { collection, batch, ends_transaction } => {
            waiting.outcome_of = OutcomeOf::Follower { ends_transaction };
            group.writes.push(PendingWrite::at(collection, batch, waiting.seq));
            group.entries.push(waiting);
            ends_transaction.is_none() || flush(writer, applier, group)
        }
        Grouped::Decided(outcome) => {
            flush(writer, applier, group) && finish(writer, applier, waiting, Outcome::Postgres(outcome))
        }
        Grouped::Alone(decoded) => {
            if !flush(writer, applier, group) || !use_seqs_before(writer, applier, &waiting) {
                return false;
            }
            let outcome = follower::apply(writer, applier.postgres.as_deref(), decoded);
            finish(writer, applier, waiting, Outcome::Postgres(outcome))
        }
    }
}

/// Uses the seqs before `waiting`'s with a marker, so that a change the store
/// numbers itself (a schema change, rules: `last_seq() + 1`) takes exactly
/// the entry's seq; false when this node halted.
fn use_seqs_before(writer: &mut Writer, applier: &mut Applier, waiting: &Waiting) -> bool {
    if writer.database().last_seq() + 1 >= waiting.seq {
        return true;
    }
    match writer.database_mut().advance_seq(waiting.seq - 1) {
        Ok(()) => true,
        Err(error) => {
            halt(writer, applier, waiting.generation, waiting.seq, &ApiError::from(error));
            false
        }
    }
}

/// Commits `group` (one log append), then answers each entry; false when this
/// node halted (the append failed: nothing of the group was written).
fn flush(writer: &mut Writer, applier: &mut Applier, group: &mut Group) -> bool {
    let (Some(first), Some(last)) = (group.entries.first(), group.entries.last()) else { return true };
    let (first_seq, last_seq, generation) = (first.seq, last.seq, first.generation);
    assert!(writer.database().last_seq() < first_seq, "a group starts after the last seq");
    writer.write_run(&mut group.writes);
    if writer.database().last_seq() != last_seq {
        // The append's error (the refusals of single writes are outcomes).
        let error = group
            .writes
            .iter_mut()
            .filter_map(|write| write.result.take()?.err().map(ApiError::from))
            .find(is_local_failure)
            .unwrap_or_else(|| ApiError::new(ErrorCode::Internal, "a group of entries was not written"));
        group.writes.clear();
        group.entries.clear();
        halt(writer, applier, generation, first_seq, &error);
        return false;
    }
    // Before the answers: a client that got one of these seqs never waits for it here.
    writer.publish_seq();
    for (write, waiting) in group.writes.drain(..).zip(group.entries.drain(..)) {
        let PendingWrite { batch, result, .. } = write;
        let result = result.expect("every write of a run gets a result").map_err(ApiError::from);
        debug_assert!(result.as_ref().map_or(true, |ack| ack.seq == waiting.seq), "an entry uses exactly its seq");
        applier.recycle(batch);
        applier.shared.status.set_applied(waiting.seq, waiting.published_ns);
        let outcome = match waiting.outcome_of {
            OutcomeOf::Write => Outcome::Write(result),
            OutcomeOf::Follower { ends_transaction } => applier.follower_outcome(result, ends_transaction),
        };
        applier.shared.deliver(waiting.msg_id.as_ref().map(MsgId::as_str), outcome);
    }
    if let Some(snapshots) = &mut applier.snapshots {
        snapshots.after_apply(writer.database(), applier.shared.status.scheme());
    }
    true
}

/// Ends one entry applied alone at `waiting.seq`; false when this node halted.
fn finish(writer: &mut Writer, applier: &mut Applier, waiting: Waiting, outcome: Outcome) -> bool {
    let Waiting { seq, generation, msg_id, published_ns, .. } = waiting;
    if let Some(error) = outcome.error().filter(|error| is_local_failure(error)) {
        halt(writer, applier, generation, seq, error);
        return false;
    }
    if writer.database().last_seq() < seq {
        // Nothing written (refused, or a collection created): a marker uses the
        // seq (and those before it the message left unused).
        if let Err(error) = writer.database_mut().advance_seq(seq) {
            halt(writer, applier, generation, seq, &ApiError::from(error));
            return false;
        }
    }
    assert_eq!(writer.database().last_seq(), seq, "an entry uses exactly its seq");
    applier.shared.status.set_applied(seq, published_ns);
    // Before the answer: a client that got this seq never waits for it here.
    writer.publish_seq();
    applier.shared.deliver(msg_id.as_ref().map(MsgId::as_str), outcome);
    if let Some(snapshots) = &mut applier.snapshots {
        // One comparison unless a snapshot is due; the copy runs on its own thread.
        snapshots.after_apply(writer.database(), applier.shared.status.scheme());
    }
    true
}

fn halt(writer: &mut Writer, applier: &mut Applier, generation: u64, seq: u64, error: &ApiError) {
    tracing::error!(seq, code = error.code.as_str(), "cannot apply the stream's entry here: {}", error.message);
    applier.halted_generation = generation;
    writer.publish_seq();
    applier.shared.restart.notify_one();
}

/// The outcome of an entry that does not decode, or whose caller's claims do not.
fn malformed(seq: u64, error: &serde_json::Error) -> Outcome {
    Outcome::Malformed(ApiError::bad_request(format!("entry at seq {seq} does not decode: {error}")))
}

fn apply_decoded(writer: &mut Writer, applier: &Applier, entry: &Decoded<'_>, identity: &Identity) -> Outcome {
    match entry.kind {
        Kind::Write => unreachable!("write entries are applied by `add_write`"),
        Kind::CreateCollection => Outcome::Create(create_collection(writer, applier, entry, identity)),
        Kind::AddField => Outcome::Fields(add_field(writer, entry, identity)),
        Kind::RemoveField => Outcome::Fields(remove_field(writer, entry, identity)),
        Kind::DropCollection => Outcome::Drop(drop_collection(writer, entry, identity)),
        Kind::SetRules => Outcome::Rules(set_rules(writer, applier, entry, identity)),
        Kind::Postgres => unreachable!("follower entries are applied by `apply_follower`"),
    }
}

fn required<'e, T: ?Sized>(value: Option<&'e T>, what: &str) -> Result<&'e T, ApiError> {
    value.ok_or_else(|| ApiError::bad_request(format!("the entry has no `{what}`")))
}

/// A schema, field or rules document kept raw in the entry: read with one
/// meaning (`strict_json`), as the node that took the request read it.
fn parse<'a, T: Deserialize<'a>>(raw: &'a RawValue) -> Result<T, ApiError> {
    crate::strict_json::parse(raw.get().as_bytes(), "the entry")
}

fn require_admin(identity: &Identity, what: &str) -> Result<(), ApiError> {
    if identity.role == Role::Admin {
        Ok(())
    } else {
        Err(ApiError::new(ErrorCode::Forbidden, format!("{what} needs an admin token")))
    }
}

/// A write entry's batch, checked as far as it can be before the store: its
/// collection, the caller's grant, the ops against the schema; with the guard
/// of a restricted write grant (a filter, or limits on fields, atomics, the
/// payload, creation, removal), if any: checked whole on the writer thread.
/// `batch` comes empty (`Applier::take_batch`) and is filled with the ops.
fn prepare_write(
    writer: &Writer,
    gate: &Gate,
    entry: &Decoded<'_>,
    identity: &Identity,
    batch: &mut ordo_core::Batch,
) -> Result<(CollectionId, Option<WriteGuard>), ApiError> {
    debug_assert!(batch.is_empty(), "a write entry's batch starts empty");
    let name = required(entry.collection.as_deref(), "collection")?;
    let ops = required(entry.ops.as_deref(), "ops")?;
    let (target, grant) = gate.granted_write(writer.routes(), identity, name)?;
    let guard = WriteGuard::new(&grant, &target.schema)?;
    wire::fill_batch(batch, &target.schema, ops, 0)?;
    Ok((target.id, guard))
}

fn create_collection(
    writer: &mut Writer,
    applier: &Applier,
    entry: &Decoded<'_>,
    identity: &Identity,
) -> Result<(bool, Arc<crate::routing::CollectionEntry>), ApiError> {
    let name = required(entry.collection.as_deref(), "collection")?;
    if is_reserved_name(name) {
        return Err(ApiError::new(ErrorCode::Forbidden, format!("`{name}` is reserved for the server")));
    }
    if !applier.gate.rules().may_create(identity, name) {
        return Err(rules::forbidden(name, "create"));
    }
    let request: SchemaRequest = parse(required(entry.schema, "schema")?)?;
    applier.gate.rules().check_ref_targets(identity, request.ref_targets())?;
    let schema = request.to_schema(|target| route_id(writer, target))?;
    writer.create_collection(name, schema)
}

/// A `ref` field's target, by name, as the routing table has it when the entry applies.
fn route_id(writer: &Writer, name: &str) -> Option<ordo_core::CollectionId> {
    let routes = writer.routes().read().expect("routes lock");
    routes.get(name).filter(|entry| entry.name == name).map(|entry| entry.id)
}

/// The collection a schema change or drop names, as the routing table has it now.
fn schema_target(writer: &Writer, entry: &Decoded<'_>) -> Result<Arc<crate::routing::CollectionEntry>, ApiError> {
    let name = required(entry.collection.as_deref(), "collection")?;
    if is_reserved_name(name) {
        return Err(ApiError::new(ErrorCode::Forbidden, format!("`{name}` is reserved for the server")));
    }
    writer.routes().read().expect("routes lock").get(name).cloned().ok_or_else(|| ApiError::unknown_collection(name))
}

fn add_field(
    writer: &mut Writer,
    entry: &Decoded<'_>,
    identity: &Identity,
) -> Result<(u64, Arc<crate::routing::CollectionEntry>), ApiError> {
    require_admin(identity, "adding a field")?;
    let target = schema_target(writer, entry)?;
    let add: AddFieldRequest = parse(required(entry.field, "field")?)?;
    let (field_type, default) = add.typed(|target| route_id(writer, target))?;
    writer.change_fields(target.id, FieldChange::Add { name: add.name, field_type, default })
}

fn remove_field(
    writer: &mut Writer,
    entry: &Decoded<'_>,
    identity: &Identity,
) -> Result<(u64, Arc<crate::routing::CollectionEntry>), ApiError> {
    require_admin(identity, "removing a field")?;
    let target = schema_target(writer, entry)?;
    let name: String = parse(required(entry.field, "field")?)?;
    writer.change_fields(target.id, FieldChange::Remove { name })
}

fn drop_collection(writer: &mut Writer, entry: &Decoded<'_>, identity: &Identity) -> Result<u64, ApiError> {
    require_admin(identity, "dropping a collection")?;
    let target = schema_target(writer, entry)?;
    writer.drop_collection(target.id)
}

fn set_rules(
    writer: &mut Writer,
    applier: &Applier,
    entry: &Decoded<'_>,
    identity: &Identity,
) -> Result<u64, ApiError> {
    require_admin(identity, "changing the rules")?;
    let doc: RulesDoc = parse(required(entry.rules, "rules")?)?;
    let rules = RuleSet::compile(doc.clone())?;
    let text = serde_json::to_string(&doc).expect("rules serialise");
    let seq = writer.set_rules(&text)?;
    // Every later entry is checked against these, on every node.
    applier.gate.set_rules(rules);
    Ok(seq)
}
