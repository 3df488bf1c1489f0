//! Where the follower's changes go, by mode (the follower's sibling of
//! `submit::Submitter`): single-node mode hands them to the writer thread as
//! commands; cluster mode publishes them as follower entries
//! (`stream_entry`) under the term of the lease this node holds, and waits for
//! the stream's quorum and its own apply of each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ordo_core::{Batch, CollectionId, OwnedValue, Schema};
use ordo_pgsource::Lsn;

use super::mapping::{FieldChanges, TableMap};
use super::stream_entry::{ops_of, split_ops, type_name, Applied, PgChange, PgEntry, WireValue};
use super::tables::{self, StoredTable};
use crate::cluster::entry::{Caller, Entry, Kind};
use crate::cluster::{Cluster, Outcome};
use crate::routing::Routes;
use crate::writer::WriterSender;

/// Room left in a stream message for the entry around a `rows` entry's ops.
const ENTRY_ENVELOPE_BYTES: usize = 4 * 1024;

/// Why a change did not go through.
#[derive(Debug)]
pub(super) enum SinkError {
    /// Ordo refused it (the same on every node): the follower stops.
    Refused(String),
    /// Cluster mode: the term is over (a newer one claimed the slot, or the
    /// stream did not take the entry): this node stops following and the
    /// lease goes to whichever node takes it next.
    Lost(String),
}

impl SinkError {
    pub(super) fn message(self) -> String {
        match self {
            SinkError::Refused(message) | SinkError::Lost(message) => message,
        }
    }
}

impl From<String> for SinkError {
    fn from(message: String) -> SinkError {
        SinkError::Refused(message)
    }
}

/// One transaction's batches, in table order, and its end LSN.
pub(super) struct TransactionWrites {
    pub(super) batches: Vec<(CollectionId, Batch)>,
    pub(super) end_lsn: Lsn,
}

#[derive(Clone)]
pub(super) enum Sink {
    Writer(WriterSender),
    Stream(Arc<StreamSink>),
}

/// Cluster mode's sink: one term of this node's lease.
pub(super) struct StreamSink {
    pub(super) cluster: Arc<Cluster>,
    pub(super) writer: WriterSender,
    pub(super) routes: Routes,
    pub(super) slot: String,
    pub(super) term: u64,
    /// Numbers the message ids of the entries that are not a transaction's.
    next_entry: AtomicU64,
}

impl Sink {
    pub(super) fn stream(cluster: Arc<Cluster>, writer: WriterSender, routes: Routes, slot: &str, term: u64) -> Sink {
        let slot = slot.to_owned();
        Sink::Stream(Arc::new(StreamSink { cluster, writer, routes, slot, term, next_entry: AtomicU64::new(0) }))
    }

    /// The writer thread, for what the follower reads of this node's state.
    pub(super) fn writer(&self) -> &WriterSender {
        match self {
            Sink::Writer(writer) => writer,
            Sink::Stream(stream) => &stream.writer,
        }
    }

    /// Writes a part of the copy (no position: the copy's end writes it):
    /// one group commit, or `copy_rows` entries in one submission.
    pub(super) async fn write_copy_part(&self, batches: Vec<(CollectionId, Batch)>) -> Result<(), SinkError> {
        match self {
            Sink::Writer(writer) => Ok(super::write_group(writer, batches, None).await?),
            Sink::Stream(stream) => stream.write_copy_part(&batches).await,
        }
    }

    /// Writes the batches of transactions received together, in order: one
    /// group commit with the last one's position, or each transaction's
    /// entries (its rows, then its position) in one submission to the stream.
    pub(super) async fn write_transactions(
        &self,
        transactions: Vec<TransactionWrites>,
        position_collection: CollectionId,
        slot: &str,
    ) -> Result<(), SinkError> {
        let Some(end) = transactions.last().map(|transaction| transaction.end_lsn) else { return Ok(()) };
        match self {
            Sink::Writer(writer) => {
                let batches = transactions.into_iter().flat_map(|transaction| transaction.batches).collect();
                Ok(super::write_group(writer, batches, Some((position_collection, slot, end))).await?)
            }
            Sink::Stream(stream) => stream.write_transactions(&transactions).await,
        }
    }

    /// Writes a copy's last batches, then the record of the followed tables
    /// (item `<slot>/tables` of `position_collection`) and, on a first copy,
    /// the position: one group commit, or entries in that order.
    pub(super) async fn write_record(
        &self,
        mut batches: Vec<(CollectionId, Batch)>,
        slot: &str,
        position_collection: CollectionId,
        record: Vec<StoredTable>,
        position: Option<Lsn>,
    ) -> Result<(), SinkError> {
        match self {
            Sink::Writer(writer) => {
                let mut batch = Batch::new();
                batch.upsert(&tables::item_id(slot)).payload(tables::render(&record).as_bytes());
                batches.push((position_collection, batch));
                let position = position.map(|lsn| (position_collection, slot, lsn));
                Ok(super::write_group(writer, batches, position).await?)
            }
            Sink::Stream(stream) => stream.write_copy_end(&batches, record, position).await,
        }
    }

    pub(super) async fn change_fields(
        &self,
        collection: CollectionId,
        map: &TableMap,
        changes: &FieldChanges,
        defaults: Vec<OwnedValue>,
    ) -> Result<(), SinkError> {
        let name = map.collection.as_str();
        let stream = match self {
            Sink::Writer(writer) => return Ok(super::change_fields(writer, collection, map, changes, defaults).await?),
            Sink::Stream(stream) => stream,
        };
        for field in &changes.removed {
            let change = PgChange::RemoveField { collection: name.to_owned(), field: field.clone() };
            stream.publish(change).await?;
            tracing::info!(collection = name, field = field.as_str(), "a column dropped in PostgreSQL: field removed");
        }
        for ((field, column_type), default) in changes.added.iter().zip(defaults) {
            let field_type = type_name(map.added_field_type(field, *column_type), |target| stream.name_of(target));
            let default = WireValue::of(default.as_value());
            let change = PgChange::AddField { collection: name.to_owned(), field: field.clone(), field_type, default };
            stream.publish(change).await?;
            tracing::info!(collection = name, field = field.as_str(), "a column added in PostgreSQL: field added");
        }
        Ok(())
    }

    /// Creates a followed collection, or finds it with the same schema.
    pub(super) async fn create_collection(&self, name: &str, schema: Schema) -> Result<CollectionId, SinkError> {
        let stream = match self {
            Sink::Writer(writer) => return Ok(super::create_collection(writer, name, schema).await?),
            Sink::Stream(stream) => stream,
        };
        let fields = schema
            .fields()
            .iter()
            .map(|field| (field.name.clone(), type_name(field.field_type, |target| stream.name_of(target))))
            .collect();
        match stream.publish(PgChange::CreateCollection { collection: name.to_owned(), fields }).await? {
            Applied::Created(id) => Ok(id),
            other => Err(SinkError::Refused(format!("creating `{name}` came back as {other:?}"))),
        }
    }

    /// Drops a followed collection (a first copy starts from nothing).
    pub(super) async fn drop_collection(&self, collection: CollectionId, name: &str) -> Result<(), SinkError> {
        match self {
            Sink::Writer(writer) => Ok(super::drop_collection(writer, collection, name).await?),
            Sink::Stream(stream) => {
                stream.publish(PgChange::DropCollection { collection: name.to_owned() }).await.map(|_| ())
            }
        }
    }
}

impl StreamSink {
    /// Claims the slot for this term: every entry published before it (the
    /// previous holders') is applied here once it answers, with the position
    /// they left.
    pub(super) async fn claim(&self) -> Result<Applied, SinkError> {
        self.publish(PgChange::Claim {}).await
    }

    /// A part of a copy: its batches' ops (split under the stream's message
    /// size) as `copy_rows` entries.
    async fn write_copy_part(&self, batches: &[(CollectionId, Batch)]) -> Result<(), SinkError> {
        let changes = self.rows_of(batches, None)?;
        self.publish_group(changes, None).await
    }

    /// Each transaction's `rows` entries and its `position`, all in one
    /// submission (so in order, in one group), each entry named by its own
    /// transaction's end LSN. Each transaction is a unit of the submission:
    /// it goes whole into one stream message unless it alone is larger than
    /// one, so every node applies it as one group commit (`cluster::apply`).
    async fn write_transactions(&self, transactions: &[TransactionWrites]) -> Result<(), SinkError> {
        let mut entries = Vec::new();
        let mut units = Vec::with_capacity(transactions.len());
        for transaction in transactions {
            let end = transaction.end_lsn;
            let mut changes = self.rows_of(&transaction.batches, Some(end))?;
            changes.push(PgChange::Position { end_lsn: end.0 });
            units.push(changes.len());
            entries.extend(self.named_entries(changes, Some(end)));
        }
        for result in self.cluster.submit_units_as(entries, units).await {
            applied(result)?;
        }
        Ok(())
    }

    /// A copy's end: its last rows (`rows` at the consistent point on a first
    /// copy, `copy_rows` for a table newly followed), the record of the
    /// followed tables, and on a first copy the position.
    async fn write_copy_end(
        &self,
        batches: &[(CollectionId, Batch)],
        record: Vec<StoredTable>,
        end: Option<Lsn>,
    ) -> Result<(), SinkError> {
        let mut changes = self.rows_of(batches, end)?;
        changes.push(PgChange::Tables { tables: record });
        if let Some(lsn) = end {
            changes.push(PgChange::Position { end_lsn: lsn.0 });
        }
        self.publish_group(changes, end).await
    }

    /// The `rows` entries at `end` (or `copy_rows` without one) of `batches`,
    /// each split under the stream's message size.
    fn rows_of(&self, batches: &[(CollectionId, Batch)], end: Option<Lsn>) -> Result<Vec<PgChange>, SinkError> {
        let max_ops_bytes = self.cluster.max_payload().saturating_sub(ENTRY_ENVELOPE_BYTES).max(1024);
        let mut changes = Vec::new();
        for (collection, batch) in batches {
            let name = self.name_of(*collection).ok_or_else(|| {
                SinkError::Refused(format!("a followed collection (id {}) has no name here", collection.index()))
            })?;
            for ops in split_ops(ops_of(batch)?, max_ops_bytes)? {
                let collection = name.clone();
                changes.push(match end {
                    Some(lsn) => PgChange::Rows { collection, end_lsn: lsn.0, ops },
                    None => PgChange::CopyRows { collection, ops },
                });
            }
        }
        Ok(changes)
    }

    /// Publishes `changes` back to back with message ids
    /// `pg/<slot>/<term>/<end LSN>/<index>`, or numbered ones when no LSN
    /// names them (a part of a copy).
    async fn publish_group(&self, changes: Vec<PgChange>, end: Option<Lsn>) -> Result<(), SinkError> {
        let entries = self.named_entries(changes, end);
        self.submit(entries).await
    }

    /// `changes` encoded, with the message ids `publish_group` names.
    fn named_entries(&self, changes: Vec<PgChange>, end: Option<Lsn>) -> Vec<(Option<String>, Vec<u8>)> {
        changes
            .into_iter()
            .enumerate()
            .map(|(index, change)| {
                let id = match end {
                    Some(lsn) => format!("pg/{}/{}/{:X}/{index}", self.slot, self.term, lsn.0),
                    None => self.numbered_id(),
                };
                (Some(id), self.encode(change))
            })
            .collect()
    }

    /// Publishes `entries` in order and waits for each one's apply here.
    async fn submit(&self, entries: Vec<(Option<String>, Vec<u8>)>) -> Result<(), SinkError> {
        for result in self.cluster.submit_all_as(entries).await {
            applied(result)?;
        }
        Ok(())
    }

    /// Publishes one change and answers its apply here.
    async fn publish(&self, change: PgChange) -> Result<Applied, SinkError> {
        let entry = (Some(self.numbered_id()), self.encode(change));
        let result = self.cluster.submit_all_as(vec![entry]).await.pop().expect("one result per entry");
        applied(result)
    }

    fn numbered_id(&self) -> String {
        let n = self.next_entry.fetch_add(1, Ordering::Relaxed);
        format!("pg/{}/{}/n{n}", self.slot, self.term)
    }

    fn encode(&self, change: PgChange) -> Vec<u8> {
        let postgres = PgEntry { slot: self.slot.clone(), term: self.term, change };
        let text = serde_json::to_string(&postgres).expect("a follower entry serialises");
        let raw = serde_json::value::RawValue::from_string(text).expect("valid JSON");
        let mut entry = Entry::new(Kind::Postgres, None, follower_caller());
        entry.postgres = Some(&raw);
        entry.encode()
    }

    /// A collection's name, by its id here.
    fn name_of(&self, collection: CollectionId) -> Option<String> {
        let routes = self.routes.read().expect("routes lock");
        let name = routes.iter().find(|(_, entry)| entry.id == collection).map(|(_, entry)| entry.name.clone());
        name
    }
}

/// The caller follower entries name (the apply does not check rules for them:
/// the follower is the server itself, as in single-node mode).
fn follower_caller() -> Caller<'static> {
    let borrowed = std::borrow::Cow::Borrowed;
    Caller { sub: borrowed("postgres-follower"), role: borrowed("admin"), claims: serde_json::Map::new() }
}

/// A follower entry's outcome here; a fenced entry or one the stream did not
/// take ends the term.
fn applied(result: Result<Outcome, crate::error::ApiError>) -> Result<Applied, SinkError> {
    match result {
        Err(error) => Err(SinkError::Lost(format!("the stream did not take a follower entry: {}", error.message))),
        Ok(Outcome::Postgres(Ok(Applied::Fenced { current_term }))) => {
            Err(SinkError::Lost(format!("the slot was claimed by a newer term ({current_term})")))
        }
        Ok(Outcome::Postgres(Ok(applied))) => Ok(applied),
        Ok(Outcome::Postgres(Err(error))) => {
            Err(SinkError::Refused(format!("Ordo refused a PostgreSQL change: {}", error.message)))
        }
        Ok(other) => Err(SinkError::Refused(format!("a follower entry came back as another kind: {other:?}"))),
    }
}
