//! `ordo serve --pg-table ...`: follows PostgreSQL tables by logical
//! replication (through `ordo-pgsource`) and serves each as a collection.
//!
//! At start ([`start`]; in cluster mode each term of the lease holder,
//! `takeover`): the tables are described and checked, their collections
//! created; on a first start (no position stored for the slot) the collections
//! are emptied and the tables copied at the slot's snapshot, and at a restart
//! a table newly in `--pg-table` is copied at a temporary slot's snapshot
//! (`tables` records which tables the position covers). Then a task of its own
//! ([`follow::Follower::run`]) applies the stream: one PostgreSQL transaction
//! is one writer command, so one group commit (one log append, one sync)
//! holding a batch per collection it touched and, last, the upsert of the
//! position item — the transaction's end LSN — in the reserved collection
//! [`POSITION_COLLECTION`]. The position is confirmed to PostgreSQL only once
//! the writer acknowledged the group durable; a restart resumes from the
//! stored position (docs/POSTGRES.md, docs/STORAGE.md). In cluster mode the
//! same writes go to the stream as follower entries (`sink`, `stream_entry`).

pub mod apply;
pub mod config;
mod copy;
mod follow;
pub mod lease;
pub mod mapping;
pub mod refs;
mod sink;
pub mod status;
pub mod stream_entry;
pub mod tables;
mod takeover;
mod watcher;
mod wire_decode;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use ordo_core::{Batch, CollectionId, OwnedValue, Schema};
use ordo_pgsource::catalog::{create_publication, publication_exists};
use ordo_pgsource::{Connection, Error, Lsn, Table, TableName};
use ordo_store::Database;
use tokio::sync::{oneshot, watch};

use crate::routing::{CollectionEntry, Routes};
use crate::writer::{Command, FieldChange, WriteReply, WriterSender};
use config::PostgresOptions;
use mapping::{FieldChanges, TableMap};
use sink::{Sink, SinkError};
pub use status::FollowStatus;
use tables::StoredTable;
pub use takeover::start_clustered;

/// The reserved collection that holds each slot's position: item `<slot>`,
/// its payload the end LSN of the last transaction applied (`X/Y` text).
pub const POSITION_COLLECTION: &str = "_ordo/postgres";

/// The collections that follow a table: writes through the API are refused
/// with `read_only_source`.
pub type ReadOnlyCollections = Arc<HashSet<String>>;

/// A followed table with its collection, as the follower writes it.
#[derive(Clone, Debug)]
struct Followed {
    table: Table,
    map: TableMap,
    collection: CollectionId,
    /// For a table copied beside the running slot (newly followed at a
    /// restart): its copy's consistent point, before which the stream's changes
    /// of it are already in the copy.
    copied_at: Option<Lsn>,
}

/// What [`start`] hands back: the status the HTTP side reports, and the names
/// of the followed collections.
pub struct Started {
    pub status: Arc<FollowStatus>,
    pub read_only: ReadOnlyCollections,
}

/// What the data directory holds for the follower, read before the writer starts.
#[derive(Clone, Debug, Default)]
pub struct Stored {
    /// [`POSITION_COLLECTION`], if it exists (reserved collections are not routed by name).
    pub collection: Option<CollectionId>,
    /// The slot's position (none in a new data directory, or for a new slot).
    pub position: Option<Lsn>,
    /// The tables followed at that position (item `<slot>/tables`); `None`
    /// in a data directory written before it was kept.
    tables: Option<Vec<StoredTable>>,
}

/// The position stored for `slot`.
pub fn stored_position(database: &Database, slot: &str) -> Result<Stored, String> {
    let engine = database.engine();
    let Some(id) = engine.collection_id(POSITION_COLLECTION) else { return Ok(Stored::default()) };
    let collection = Some(id);
    let Some(item) = engine.collection(id).and_then(|items| items.get(slot)) else {
        return Ok(Stored { collection, position: None, tables: None });
    };
    let text = std::str::from_utf8(item.payload()).unwrap_or_default();
    let position = Lsn::parse(text)
        .ok_or_else(|| format!("the stored PostgreSQL position of slot `{slot}` does not parse: `{text}`"))?;
    let tables = engine.collection(id).and_then(|items| items.get(&tables::item_id(slot)));
    let tables = tables.map(|item| tables::parse(item.payload(), slot)).transpose()?;
    Ok(Stored { collection, position: Some(position), tables })
}

/// Single-node mode: describes the tables, creates the collections, copies the
/// tables on a first start (and, at a restart, the tables newly followed), and
/// spawns the task that follows the stream.
pub async fn start(
    options: &PostgresOptions,
    stored: Stored,
    writer: &WriterSender,
    routes: &Routes,
    shutdown: watch::Receiver<bool>,
) -> Result<Started, String> {
    let status = Arc::new(FollowStatus::default());
    let sink = Sink::Writer(writer.clone());
    match prepare(options, stored, sink, routes, &status).await.map_err(SinkError::message)? {
        Prepared::Follow(follower) => {
            tokio::spawn(follower.run(shutdown));
        }
        Prepared::Gone(message) => not_following(&status, &message),
    }
    Ok(Started { status, read_only: read_only_collections(options) })
}

/// Cluster mode: the follower's status, shared with every apply of the
/// follower's entries on this node. It knows this node's `--pg-table`, and
/// compares it at once with the record of the followed tables that the data
/// directory holds (then with each one the stream brings).
pub fn clustered_status(options: &PostgresOptions, stored: &Stored) -> Arc<FollowStatus> {
    let status = FollowStatus::default();
    status.set_own_tables(tables::keys_of(&options.tables));
    status.check_record(stored.tables.as_deref());
    Arc::new(status)
}

/// The followed collections, which the API refuses to write: those of this
/// node's `--pg-table` (in cluster mode every node must get the same list:
/// `tables::differences` reports a node whose list differs from the record).
pub fn read_only_collections(options: &PostgresOptions) -> ReadOnlyCollections {
    Arc::new(options.tables.iter().map(|mapping| mapping.collection.clone()).collect())
}

/// What [`prepare`] found.
enum Prepared {
    /// Ready to stream from the position.
    Follow(Box<follow::Follower>),
    /// A table followed at the stored position is gone from the publication
    /// (or dropped) since: the collections serve what they hold, the follower
    /// is `failed`, naming it.
    Gone(String),
}

/// Reports a follower that does not start (`Prepared::Gone`).
fn not_following(status: &FollowStatus, message: &str) {
    eprintln!("ordo: ERROR: not following PostgreSQL: {message}");
    tracing::error!(error = message, "not following PostgreSQL");
    status.failed(message);
}

/// Describes and checks the tables, brings the collections in line (empty and
/// copied again when `stored` has no position; a table newly followed copied
/// at a temporary slot), and returns the follower ready to stream from the
/// position.
async fn prepare(
    options: &PostgresOptions,
    stored: Stored,
    sink: Sink,
    routes: &Routes,
    status: &Arc<FollowStatus>,
) -> Result<Prepared, SinkError> {
    let mut connection = follow::connect(options).await.map_err(|error| format!("PostgreSQL: {error}"))?;
    let names: Vec<_> = options.tables.iter().map(|mapping| mapping.table.clone()).collect();
    // Only before the slot exists: a publication created after the slot's
    // position is unknown to pgoutput's view of the catalog at that position.
    if options.create_publication && stored.position.is_none() {
        create_missing_publication(&mut connection, &options.publication, &names)
            .await
            .map_err(|error| format!("PostgreSQL: {error}"))?;
    }
    let described = ordo_pgsource::catalog::describe_tables(
        &mut connection,
        &options.publication,
        &names,
        options.unsupported_columns,
    )
    .await;
    let was_followed = |mapping: &config::TableMapping| tables::was_followed(&stored, mapping, routes);
    let tables = match described {
        Ok(tables) => tables,
        Err(error) if stored.position.is_some() && gone_since_last_run(&error, options, &was_followed) => {
            let _ = connection.terminate().await;
            return Ok(Prepared::Gone(format!("PostgreSQL: {error}")));
        }
        Err(error) => return Err(format!("PostgreSQL: {error}").into()),
    };
    let order = refs::check_and_order(&options.tables, &tables)?;
    refs::warn_without_foreign_key(&mut connection, &options.tables, &tables).await?;
    let maps = options
        .tables
        .iter()
        .zip(&tables)
        .map(|(mapping, table)| mapping::map_table(mapping, table, &options.tables))
        .collect::<Result<Vec<_>, _>>()?;
    let is_new: Vec<bool> =
        options.tables.iter().map(|mapping| stored.position.is_none() || !was_followed(mapping)).collect();
    let new_maps: Vec<TableMap> =
        maps.iter().zip(&is_new).filter(|(_, new)| **new).map(|(map, _)| map.clone()).collect();
    empty_collections(&sink, routes, &new_maps).await?;
    let mut followed = collections_in_order(&sink, routes, tables, maps, &order, &is_new).await?;
    for ((table, mapping), new) in followed.iter_mut().zip(&options.tables).zip(&is_new) {
        table.copied_at = if *new { None } else { tables::copied_at(&stored, mapping) };
    }
    let position_collection = match stored.collection {
        Some(collection) => collection,
        None => {
            let collection = create_collection(sink.writer(), POSITION_COLLECTION, Schema::new()).await?;
            // Reserved collections are not routed by name (as after a restart):
            // the API neither lists nor reaches them.
            routes.write().expect("routes lock").remove(POSITION_COLLECTION);
            collection
        }
    };
    let copies = Copies { options, sink: &sink, position_collection };
    let position = match stored.position {
        Some(position) => {
            let _ = connection.terminate().await;
            copies.copy_new_tables(&mut followed, &is_new, stored.tables.as_deref()).await?;
            position
        }
        None => {
            status.set_state(status::State::Copying);
            copies.copy_all(connection, &followed).await?
        }
    };
    crate::logging::say!(
        "ordo: following PostgreSQL ({} tables, slot `{}`) from {position}",
        followed.len(),
        options.slot
    );
    tracing::info!(
        slot = %options.slot,
        position = %position,
        resumed = stored.position.is_some(),
        "following PostgreSQL"
    );
    status.start_at(position.0);
    let follower =
        follow::Follower::new(options.clone(), followed, position_collection, position, sink, status.clone());
    Ok(Prepared::Follow(Box::new(follower)))
}

/// Creates the publication of `tables` if it does not exist, and says so.
async fn create_missing_publication(
    connection: &mut Connection,
    publication: &str,
    tables: &[TableName],
) -> Result<(), Error> {
    if publication_exists(connection, publication).await? {
        return Ok(());
    }
    create_publication(connection, publication, tables).await?;
    let table_list = tables.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    crate::logging::say!("ordo: created the PostgreSQL publication `{publication}` for {table_list}");
    tracing::info!(publication, tables = %table_list, "created the PostgreSQL publication");
    Ok(())
}

/// Whether a start's refusal is of a table followed at the stored position
/// that is gone from the publication (or dropped) since: the follower then
/// fails, the server serving what it holds. Of a table newly followed, or any
/// other error, the start is refused.
fn gone_since_last_run(
    error: &Error,
    options: &PostgresOptions,
    was_followed: &dyn Fn(&config::TableMapping) -> bool,
) -> bool {
    let table = match error {
        Error::TableNotFound { table } | Error::TableNotPublished { table, .. } => table,
        Error::MissingPublication { .. } => return true,
        _ => return false,
    };
    options.tables.iter().any(|mapping| mapping.table.to_string() == *table && was_followed(mapping))
}

/// The copies of a start, and the record of what is followed written with
/// their last rows.
struct Copies<'a> {
    options: &'a PostgresOptions,
    sink: &'a Sink,
    position_collection: CollectionId,
}

impl Copies<'_> {
    /// A first start: every table at the new slot's snapshot; the last rows,
    /// the followed tables and the position in one group. Returns the position.
    async fn copy_all(&self, connection: ordo_pgsource::Connection, followed: &[Followed]) -> Result<Lsn, SinkError> {
        let all: Vec<&Followed> = followed.iter().collect();
        let (consistent_point, rest) =
            copy::copy_tables(copy::CopySlot::Main(&self.options.slot), connection, &all, self.sink).await?;
        let record = tables::record(followed);
        self.write_record(rest, record, Some(consistent_point)).await?;
        Ok(consistent_point)
    }

    /// A restart: the tables newly followed (`is_new`) copied at a temporary
    /// slot's snapshot, their `copied_at` set to its consistent point, and the
    /// followed tables recorded with their last rows. Only the record when the
    /// followed tables changed otherwise (some no longer followed).
    async fn copy_new_tables(
        &self,
        followed: &mut [Followed],
        is_new: &[bool],
        stored: Option<&[StoredTable]>,
    ) -> Result<(), SinkError> {
        let mut rest = Vec::new();
        if stored.is_none() && is_new.iter().any(|new| *new) {
            // A data directory from before the record: it is written first,
            // without the new tables, so that a copy cut short is not taken
            // for a followed table (by its collection existing) at the next start.
            let resumed: Vec<StoredTable> = tables::record(followed)
                .into_iter()
                .zip(is_new)
                .filter(|(_, new)| !**new)
                .map(|(table, _)| table)
                .collect();
            self.write_record(Vec::new(), resumed, None).await?;
        }
        if is_new.iter().any(|new| *new) {
            let new: Vec<&Followed> =
                followed.iter().zip(is_new).filter(|(_, new)| **new).map(|(table, _)| table).collect();
            let connection = follow::connect(self.options).await.map_err(|error| format!("PostgreSQL: {error}"))?;
            let (consistent_point, last_rows) =
                copy::copy_tables(copy::CopySlot::Temporary, connection, &new, self.sink).await?;
            rest = last_rows;
            for (table, _) in followed.iter_mut().zip(is_new).filter(|(_, new)| **new) {
                table.copied_at = Some(consistent_point);
                crate::logging::say!(
                    "ordo: {} newly followed: copied at {consistent_point}; the stream's older changes of it are skipped",
                    table.table.name
                );
            }
        }
        let record = tables::record(followed);
        if stored == Some(record.as_slice()) {
            return Ok(());
        }
        self.write_record(rest, record, None).await
    }

    /// Writes `batches`, then the record of the followed tables and (on a
    /// first start) the position: one group commit, or in cluster mode the
    /// entries of one group. A copy cut short leaves neither, and is done again.
    async fn write_record(
        &self,
        batches: Vec<(CollectionId, Batch)>,
        record: Vec<StoredTable>,
        position: Option<Lsn>,
    ) -> Result<(), SinkError> {
        let (slot, collection) = (self.options.slot.as_str(), self.position_collection);
        self.sink.write_record(batches, slot, collection, record, position).await
    }
}

/// A first start: whatever the followed collections hold (a copy cut short)
/// is dropped, so that the copy is every row once. The engine refuses to drop
/// a collection a `ref` field targets, so a collection goes once none of those
/// left refers to it (by the references they have, whatever the configuration
/// now says).
async fn empty_collections(sink: &Sink, routes: &Routes, maps: &[TableMap]) -> Result<(), SinkError> {
    let mut existing: Vec<Arc<CollectionEntry>> = {
        let routes = routes.read().expect("routes lock");
        maps.iter().filter_map(|map| routes.get(&map.collection).cloned()).collect()
    };
    while !existing.is_empty() {
        let is_target = |name: &str, entries: &[Arc<CollectionEntry>]| {
            entries.iter().any(|entry| entry.ref_targets.iter().any(|(_, target)| target == name))
        };
        // With none free (references outside the followed ones), the engine's refusal says which.
        let next = existing.iter().position(|entry| !is_target(&entry.name, &existing)).unwrap_or(0);
        let entry = existing.remove(next);
        sink.drop_collection(entry.id, &entry.name).await?;
    }
    Ok(())
}

async fn drop_collection(writer: &WriterSender, collection: CollectionId, name: &str) -> Result<(), String> {
    let (reply, answer) = oneshot::channel();
    send(writer, Command::DropCollection { collection, reply }).await?;
    answer
        .await
        .map_err(|_| shutting_down())?
        .map_err(|error| format!("cannot empty the collection `{name}` for the first copy: {}", error.message))?;
    Ok(())
}

/// The followed tables' collections (in the tables' order), created or found
/// in `order`: a `ref` field's target first, so that its id is known. A table
/// `is_new` gets a new collection; the others keep theirs.
async fn collections_in_order(
    sink: &Sink,
    routes: &Routes,
    tables: Vec<Table>,
    maps: Vec<TableMap>,
    order: &[usize],
    is_new: &[bool],
) -> Result<Vec<Followed>, SinkError> {
    let mut waiting: Vec<Option<(Table, TableMap)>> = tables.into_iter().zip(maps).map(Some).collect();
    let mut created: Vec<Option<Followed>> = waiting.iter().map(|_| None).collect();
    let mut ids: HashMap<String, CollectionId> = HashMap::new();
    for &index in order {
        let (table, mut map) = waiting[index].take().expect("the order names each table once");
        map.resolve_refs(&ids)?;
        let (map, collection) = collection_of(sink, routes, map, !is_new[index]).await?;
        ids.insert(map.collection.clone(), collection);
        created[index] = Some(Followed { table, map, collection, copied_at: None });
    }
    Ok(created.into_iter().map(|followed| followed.expect("the order names every table")).collect())
}

/// The collection of a followed table. On a restart, the one that exists, its
/// fields as they are: those of the table at the stored position, which the
/// stream brings up to the table's (a column added or dropped meanwhile).
/// Else a new one (a first start dropped the old one).
async fn collection_of(
    sink: &Sink,
    routes: &Routes,
    map: TableMap,
    resumed: bool,
) -> Result<(TableMap, CollectionId), SinkError> {
    let existing = routes.read().expect("routes lock").get(&map.collection).cloned();
    match existing.filter(|_| resumed) {
        Some(entry) => {
            map.check_kept(&entry.schema)?;
            Ok((map.adopt(&entry.schema), entry.id))
        }
        None => {
            let collection = sink.create_collection(&map.collection, map.schema()?).await?;
            Ok((map, collection))
        }
    }
}

/// Adds and removes the collection's fields as `changes` says, each a schema
/// change of its own, durable before the rows that use it are written; the
/// added fields' values in the existing items are `defaults` (one each).
async fn change_fields(
    writer: &WriterSender,
    collection: CollectionId,
    map: &TableMap,
    changes: &FieldChanges,
    defaults: Vec<OwnedValue>,
) -> Result<(), String> {
    let name = map.collection.as_str();
    for field in &changes.removed {
        let change = FieldChange::Remove { name: field.clone() };
        ask_change_fields(writer, collection, change).await.map_err(|error| {
            format!("cannot remove the field `{field}` of `{name}` (its column was dropped, or is no longer followed): {error}")
        })?;
        tracing::info!(
            collection = name,
            field = field.as_str(),
            "a column dropped in PostgreSQL (or no longer followed): field removed"
        );
    }
    for ((field, column_type), default) in changes.added.iter().zip(defaults) {
        let field_type = map.added_field_type(field, *column_type);
        let change = FieldChange::Add { name: field.clone(), field_type, default };
        ask_change_fields(writer, collection, change).await.map_err(|error| {
            format!("cannot add the field `{field}` to `{name}` (a column added in PostgreSQL): {error}")
        })?;
        tracing::info!(collection = name, field = field.as_str(), "a column added in PostgreSQL: field added");
    }
    Ok(())
}

async fn ask_change_fields(writer: &WriterSender, collection: CollectionId, change: FieldChange) -> Result<(), String> {
    let (reply, answer) = oneshot::channel();
    send(writer, Command::ChangeFields { collection, change, reply }).await?;
    answer.await.map_err(|_| shutting_down())?.map(|_| ()).map_err(|error| error.message)
}

/// Creates a collection, or finds it with the same schema.
async fn create_collection(writer: &WriterSender, name: &str, schema: Schema) -> Result<CollectionId, String> {
    let (reply, answer) = oneshot::channel();
    send(writer, Command::CreateCollection { name: name.to_owned(), schema, reply }).await?;
    let (_, entry) = answer.await.map_err(|_| shutting_down())?.map_err(|error| {
        format!(
            "the collection `{name}` cannot serve its PostgreSQL table: {} (a collection of another schema has that name)",
            error.message
        )
    })?;
    Ok(entry.id)
}

/// Writes `batches` as one writer command (one group commit), the position
/// upsert last; every batch must be accepted.
async fn write_group(
    writer: &WriterSender,
    mut batches: Vec<(CollectionId, Batch)>,
    position: Option<(CollectionId, &str, Lsn)>,
) -> Result<(), String> {
    if let Some((collection, slot, lsn)) = position {
        let mut batch = Batch::new();
        batch.upsert(slot).payload(lsn.to_string().as_bytes());
        batches.push((collection, batch));
    }
    let (reply, answer) = oneshot::channel();
    let results = Vec::with_capacity(batches.len());
    let command = Command::Write { batches, reply, queued_at: Instant::now(), guards: Vec::new(), results };
    send(writer, command).await?;
    let WriteReply { results, .. } = answer.await.map_err(|_| shutting_down())?;
    for result in results {
        result.map_err(|error| format!("Ordo refused a PostgreSQL change: {}", error.message))?;
    }
    Ok(())
}

async fn send(writer: &WriterSender, command: Command) -> Result<(), String> {
    writer.send(command).await.map_err(|_| shutting_down())
}

fn shutting_down() -> String {
    "the server is shutting down".to_owned()
}
