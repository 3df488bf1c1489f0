//! Cluster mode: every node's apply of a follower entry (`stream_entry`), on
//! the writer thread, at the entry's seq. Its outcome depends only on the state
//! before it (the same on every node), which is what fences a node that lost
//! the lease without knowing it (a pause, a partition) whatever the lease did:
//!
//! - the slot's *term* (item `<slot>/term` of [`POSITION_COLLECTION`]) is the
//!   highest claimed; an entry of another term than the stored one writes
//!   nothing (`Fenced`), and a claim of a lower one neither;
//! - a `rows` or `position` entry at or before the stored position (item
//!   `<slot>`, as in single-node mode) writes nothing (`AlreadyApplied`): a
//!   transaction is applied once, however often it was published. A
//!   `copy_rows` entry (a copy's rows, at no LSN) and a `tables` entry (item
//!   `<slot>/tables`, `pg_follow::tables`) are fenced by the term only: what
//!   they write is the same however often it is written.
//!
//! Either way the entry's seq is used by a seq marker (`cluster::apply::finish`).
//!
//! The batches of `rows`, `copy_rows` and `position` entries are not written
//! here but handed to the group commit of `cluster::apply` ([`group`]), as
//! write entries' are: a transaction's `rows` entries and its `position` are
//! one log append and one published seq on every node, as its batches are one
//! group commit in single-node mode. Their fencing reads the term and position
//! as committed, which is the state just before their transaction: the group
//! ends with each `position` it takes (so the next transaction's entries read
//! it), and the entries that change the term or the record are applied alone
//! ([`apply`]), after the group before them is written.

use ordo_core::{Batch, CollectionId, Schema};
use ordo_pgsource::Lsn;
use ordo_store::PendingWrite;
use serde_json::value::RawValue;

use super::stream_entry::{fill_batch, parse_type, Applied, PgChange, PgEntry};
use super::tables::{self, StoredTable};
use super::{FollowStatus, POSITION_COLLECTION};
use crate::error::{ApiError, ErrorCode};
use crate::routing::is_reserved_name;
use crate::writer::{FieldChange, Writer};

/// The item of [`POSITION_COLLECTION`] that holds `slot`'s term.
pub fn term_item_id(slot: &str) -> String {
    format!("{slot}/term")
}

/// The slot's term and position as this node holds them.
struct SlotState {
    collection: Option<CollectionId>,
    term: u64,
    position: Option<Lsn>,
}

fn slot_state(writer: &Writer, slot: &str) -> Result<SlotState, ApiError> {
    let engine = writer.database().engine();
    let Some(id) = engine.collection_id(POSITION_COLLECTION) else {
        return Ok(SlotState { collection: None, term: 0, position: None });
    };
    let items = engine.collection(id);
    let text_of = |item_id: &str| {
        items.and_then(|items| items.get(item_id)).map(|item| String::from_utf8_lossy(item.payload()).into_owned())
    };
    let corrupt = |what: &str, text: &str| {
        ApiError::new(ErrorCode::Internal, format!("the stored {what} of slot `{slot}` does not parse: `{text}`"))
    };
    let term = match text_of(&term_item_id(slot)) {
        Some(text) => text.parse().map_err(|_| corrupt("term", &text))?,
        None => 0,
    };
    let position = match text_of(slot) {
        Some(text) => Some(Lsn::parse(&text).ok_or_else(|| corrupt("position", &text))?),
        None => None,
    };
    Ok(SlotState { collection: Some(id), term, position })
}

/// Decodes a follower entry (the entry's `postgres` object).
pub fn decode(raw: Result<&RawValue, ApiError>) -> Result<PgEntry, ApiError> {
    serde_json::from_str(raw?.get())
        .map_err(|error| ApiError::bad_request(format!("a PostgreSQL follower entry does not decode: {error}")))
}

/// A follower entry as the group commit of `cluster::apply` takes it.
pub enum Grouped {
    /// A batch that joins the group: a `rows` or `copy_rows` batch of a
    /// followed collection, or the slot's position item (`ends_transaction`:
    /// the end LSN it stores).
    Write { collection: CollectionId, batch: Batch, ends_transaction: Option<u64> },
    /// Decided without a write (fenced, applied already, refused before the
    /// store): a seq marker uses the entry's seq.
    Decided(Result<Applied, ApiError>),
    /// Applied alone by [`apply`], once the group before it is written: a
    /// claim, the record of the followed tables, a collection or a field change.
    Alone(PgEntry),
}

/// How `entry` joins the group commit, fenced against the slot's term and
/// position as committed. So the group must hold no change of either, which
/// holds because a claim and a record are applied alone and the group ends
/// with each position it takes.
pub fn group(writer: &Writer, entry: PgEntry) -> Grouped {
    let (collection, ops, end_lsn) = match &entry.change {
        PgChange::Rows { collection, end_lsn, ops } => (collection, ops, Some(*end_lsn)),
        PgChange::CopyRows { collection, ops } => (collection, ops, None),
        PgChange::Position { end_lsn } => return group_position(writer, &entry, *end_lsn),
        _ => return Grouped::Alone(entry),
    };
    let state = match slot_state(writer, &entry.slot) {
        Ok(state) => state,
        Err(error) => return Grouped::Decided(Err(error)),
    };
    if let Some(decided) = fencing(&entry, &state, end_lsn) {
        return Grouped::Decided(Ok(decided));
    }
    let written = followed(writer, collection).and_then(|id| {
        let mut batch = Batch::new();
        fill_batch(&mut batch, ops).map_err(ApiError::bad_request)?;
        Ok((id, batch))
    });
    match written {
        Ok((collection, batch)) => Grouped::Write { collection, batch, ends_transaction: None },
        Err(error) => Grouped::Decided(Err(error)),
    }
}

/// A `position` entry: the upsert of the slot's item with its end LSN.
fn group_position(writer: &Writer, entry: &PgEntry, end_lsn: u64) -> Grouped {
    let state = match slot_state(writer, &entry.slot) {
        Ok(state) => state,
        Err(error) => return Grouped::Decided(Err(error)),
    };
    if let Some(decided) = fencing(entry, &state, Some(end_lsn)) {
        return Grouped::Decided(Ok(decided));
    }
    let collection = state.collection.expect("a term is stored, so is its collection");
    let mut batch = Batch::new();
    batch.upsert(&entry.slot).payload(Lsn(end_lsn).to_string().as_bytes());
    Grouped::Write { collection, batch, ends_transaction: Some(end_lsn) }
}

/// What an entry of another term than the stored one, or of a transaction at
/// or before the stored position (`end_lsn`: none for a copy's rows), decides
/// instead of writing.
fn fencing(entry: &PgEntry, state: &SlotState, end_lsn: Option<u64>) -> Option<Applied> {
    if entry.term != state.term {
        return Some(Applied::Fenced { current_term: state.term });
    }
    let applied = state.position.zip(end_lsn).is_some_and(|(position, end_lsn)| end_lsn <= position.0);
    applied.then_some(Applied::AlreadyApplied)
}

/// Applies one follower entry that is not a batch of the group commit (see
/// the module doc and [`group`]).
pub fn apply(writer: &mut Writer, status: Option<&FollowStatus>, entry: PgEntry) -> Result<Applied, ApiError> {
    let state = slot_state(writer, &entry.slot)?;
    if entry.change == (PgChange::Claim {}) {
        return claim(writer, status, &entry, state);
    }
    if entry.term != state.term {
        return Ok(Applied::Fenced { current_term: state.term });
    }
    match entry.change {
        PgChange::Claim {} => unreachable!("applied above"),
        PgChange::Rows { .. } | PgChange::CopyRows { .. } | PgChange::Position { .. } => {
            unreachable!("a follower batch is written by the group commit (`group`)")
        }
        PgChange::Tables { tables: record } => {
            let collection = state.collection.expect("a term is stored, so is its collection");
            write_item(writer, collection, &tables::item_id(&entry.slot), &tables::render(&record))?;
            if let Some(status) = status {
                status.check_record(Some(&record));
            }
            Ok(Applied::Done)
        }
        PgChange::CreateCollection { collection, fields } => create_collection(writer, &collection, &fields),
        PgChange::AddField { collection, field, field_type, default } => {
            let id = followed(writer, &collection)?;
            let field_type =
                parse_type(&field_type, |target| route_id(writer, target)).map_err(ApiError::bad_request)?;
            let default = default.to_owned_value().map_err(ApiError::bad_request)?;
            writer.change_fields(id, FieldChange::Add { name: field, field_type, default })?;
            Ok(Applied::Done)
        }
        PgChange::RemoveField { collection, field } => {
            let id = followed(writer, &collection)?;
            writer.change_fields(id, FieldChange::Remove { name: field })?;
            Ok(Applied::Done)
        }
        PgChange::DropCollection { collection } => {
            check_followed_name(&collection)?;
            // Dropping one that is not there is done already (a copy started again twice).
            if let Some(id) = route_id(writer, &collection) {
                writer.drop_collection(id)?;
            }
            Ok(Applied::Done)
        }
    }
}

/// Creates a followed collection with `fields` (name and type), or finds it
/// with the same schema.
fn create_collection(writer: &mut Writer, collection: &str, fields: &[(String, String)]) -> Result<Applied, ApiError> {
    check_followed_name(collection)?;
    let mut schema = Schema::new();
    for (name, type_text) in fields {
        let field_type = parse_type(type_text, |target| route_id(writer, target)).map_err(ApiError::bad_request)?;
        schema = schema.try_with_field(name, field_type).map_err(|error| ApiError::bad_request(error.to_string()))?;
    }
    let (_, entry) = writer.create_collection(collection, schema)?;
    Ok(Applied::Created(entry.id))
}

/// A claim of a higher term than the stored one stores it (creating the
/// reserved collection the first time); a claim of the stored term again (a
/// publish sent again) changes nothing; either answers the stored position
/// and the record of the tables it covers.
fn claim(
    writer: &mut Writer,
    status: Option<&FollowStatus>,
    entry: &PgEntry,
    state: SlotState,
) -> Result<Applied, ApiError> {
    if entry.term < state.term {
        return Ok(Applied::Fenced { current_term: state.term });
    }
    let collection = match state.collection {
        Some(collection) => collection,
        None => writer.database_mut().create_collection(POSITION_COLLECTION, Schema::new())?,
    };
    if entry.term > state.term {
        write_item(writer, collection, &term_item_id(&entry.slot), &entry.term.to_string())?;
    }
    // As in single-node mode, the record counts only with a position.
    let record = match state.position {
        Some(_) => stored_record(writer, collection, &entry.slot)?,
        None => None,
    };
    if let Some(status) = status {
        status.check_record(record.as_deref());
    }
    Ok(Applied::Claimed { position: state.position, tables: record, collection })
}

/// The record of the tables `slot` follows, as this node holds it.
fn stored_record(writer: &Writer, collection: CollectionId, slot: &str) -> Result<Option<Vec<StoredTable>>, ApiError> {
    let engine = writer.database().engine();
    let Some(item) = engine.collection(collection).and_then(|items| items.get(&tables::item_id(slot))) else {
        return Ok(None);
    };
    let record = tables::parse(item.payload(), slot).map_err(|error| ApiError::new(ErrorCode::Internal, error))?;
    Ok(Some(record))
}

/// Followed collections are never the server's reserved ones.
fn check_followed_name(name: &str) -> Result<(), ApiError> {
    if is_reserved_name(name) {
        return Err(ApiError::new(ErrorCode::Forbidden, format!("`{name}` is reserved for the server")));
    }
    Ok(())
}

fn followed(writer: &Writer, name: &str) -> Result<CollectionId, ApiError> {
    check_followed_name(name)?;
    route_id(writer, name).ok_or_else(|| ApiError::unknown_collection(name))
}

fn route_id(writer: &Writer, name: &str) -> Option<CollectionId> {
    let routes = writer.routes().read().expect("routes lock");
    routes.get(name).filter(|entry| entry.name == name).map(|entry| entry.id)
}

fn write_item(writer: &mut Writer, collection: CollectionId, id: &str, payload: &str) -> Result<(), ApiError> {
    let mut batch = Batch::new();
    batch.upsert(id).payload(payload.as_bytes());
    write_one(writer, collection, batch)
}

/// Writes one batch at the next seq (a refused one leaves a seq marker there).
fn write_one(writer: &mut Writer, collection: CollectionId, batch: Batch) -> Result<(), ApiError> {
    let mut run = [PendingWrite::new(collection, batch)];
    writer.write_run(&mut run);
    writer.publish_seq();
    match run[0].result.take() {
        Some(Ok(_)) => Ok(()),
        Some(Err(error)) => Err(ApiError::from(error)),
        None => Err(ApiError::new(ErrorCode::Internal, "a follower write got no result")),
    }
}
