//! `ordo serve --pg-table ...`: follows PostgreSQL tables by logical
//! replication (through `ordo-pgsource`) and serves each as a collection.
//!
//! At start ([`start`]): the tables are described and checked, their
//! collections created; on a first start (no position stored for the slot) the
//! collections are emptied and the tables copied at the slot's snapshot. Then a
//! task of its own ([`follow::Follower::run`]) applies the stream: one
//! PostgreSQL transaction is one writer command, so one group commit (one log
//! append, one sync) holding a batch per collection it touched and, last, the
//! upsert of the position item — the transaction's end LSN — in the reserved
//! collection [`POSITION_COLLECTION`]. The position is confirmed to PostgreSQL
//! only once the writer acknowledged the group durable; a restart resumes from
//! the stored position (docs/POSTGRES.md, docs/STORAGE.md).

pub mod config;
mod copy;
mod follow;
pub mod mapping;
pub mod refs;
pub mod status;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use ordo_core::{Batch, CollectionId, OwnedValue, Schema};
use ordo_pgsource::{Lsn, Table};
use ordo_store::Database;
use tokio::sync::{oneshot, watch};

use crate::routing::{CollectionEntry, Routes};
use crate::writer::{Command, FieldChange, WriteReply, WriterSender};
use config::PostgresOptions;
use mapping::{FieldChanges, TableMap};
pub use status::FollowStatus;

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
}

/// What [`start`] hands back: the status the HTTP side reports, and the names
/// of the followed collections.
pub struct Started {
    pub status: Arc<FollowStatus>,
    pub read_only: ReadOnlyCollections,
}

/// What the data directory holds for the follower, read before the writer starts.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stored {
    /// [`POSITION_COLLECTION`], if it exists (reserved collections are not routed by name).
    pub collection: Option<CollectionId>,
    /// The slot's position (none in a new data directory, or for a new slot).
    pub position: Option<Lsn>,
}

/// The position stored for `slot`.
pub fn stored_position(database: &Database, slot: &str) -> Result<Stored, String> {
    let engine = database.engine();
    let Some(id) = engine.collection_id(POSITION_COLLECTION) else { return Ok(Stored::default()) };
    let collection = Some(id);
    let Some(item) = engine.collection(id).and_then(|items| items.get(slot)) else {
        return Ok(Stored { collection, position: None });
    };
    let text = std::str::from_utf8(item.payload()).unwrap_or_default();
    let position = Lsn::parse(text)
        .ok_or_else(|| format!("the stored PostgreSQL position of slot `{slot}` does not parse: `{text}`"))?;
    Ok(Stored { collection, position: Some(position) })
}

/// Describes the tables, creates the collections, copies the tables on a first
/// start, and spawns the task that follows the stream.
pub async fn start(
    options: &PostgresOptions,
    stored: Stored,
    writer: &WriterSender,
    routes: &Routes,
    shutdown: watch::Receiver<bool>,
) -> Result<Started, String> {
    let status = Arc::new(FollowStatus::default());
    let mut connection = follow::connect(options).await.map_err(|error| format!("PostgreSQL: {error}"))?;
    let names: Vec<_> = options.tables.iter().map(|mapping| mapping.table.clone()).collect();
    let tables = ordo_pgsource::catalog::describe_tables(
        &mut connection,
        &options.publication,
        &names,
        options.unsupported_columns,
    )
    .await
    .map_err(|error| format!("PostgreSQL: {error}"))?;
    let order = refs::check_and_order(&options.tables, &tables)?;
    refs::warn_without_foreign_key(&mut connection, &options.tables, &tables).await?;
    let maps = options
        .tables
        .iter()
        .zip(&tables)
        .map(|(mapping, table)| mapping::map_table(mapping, table, &options.tables))
        .collect::<Result<Vec<_>, _>>()?;
    if stored.position.is_none() {
        empty_collections(writer, routes, &maps).await?;
    }
    let followed = collections_in_order(writer, routes, tables, maps, &order, stored.position.is_some()).await?;
    let position_collection = match stored.collection {
        Some(collection) => collection,
        None => {
            let collection = create_collection(writer, POSITION_COLLECTION, Schema::new()).await?;
            // Reserved collections are not routed by name (as after a restart):
            // the API neither lists nor reaches them.
            routes.write().expect("routes lock").remove(POSITION_COLLECTION);
            collection
        }
    };
    let position = match stored.position {
        Some(position) => {
            let _ = connection.terminate().await;
            position
        }
        None => {
            status.set_state(status::State::Copying);
            copy::copy_tables(options, connection, &followed, position_collection, writer).await?
        }
    };
    println!("ordo: following PostgreSQL ({} tables, slot `{}`) from {position}", followed.len(), options.slot);
    tracing::info!(
        slot = %options.slot,
        position = %position,
        resumed = stored.position.is_some(),
        "following PostgreSQL"
    );
    status.start_at(position.0);
    let read_only: HashSet<String> = followed.iter().map(|table| table.map.collection.clone()).collect();
    let follower =
        follow::Follower::new(options.clone(), followed, position_collection, position, writer.clone(), status.clone());
    tokio::spawn(follower.run(shutdown));
    Ok(Started { status, read_only: Arc::new(read_only) })
}

/// A first start: whatever the followed collections hold (a copy cut short)
/// is dropped, so that the copy is every row once. The engine refuses to drop
/// a collection a `ref` field targets, so a collection goes once none of those
/// left refers to it (by the references they have, whatever the configuration
/// now says).
async fn empty_collections(writer: &WriterSender, routes: &Routes, maps: &[TableMap]) -> Result<(), String> {
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
        let (reply, answer) = oneshot::channel();
        send(writer, Command::DropCollection { collection: entry.id, reply }).await?;
        answer.await.map_err(|_| shutting_down())?.map_err(|error| {
            format!("cannot empty the collection `{}` for the first copy: {}", entry.name, error.message)
        })?;
    }
    Ok(())
}

/// The followed tables' collections (in the tables' order), created or found
/// in `order`: a `ref` field's target first, so that its id is known.
async fn collections_in_order(
    writer: &WriterSender,
    routes: &Routes,
    tables: Vec<Table>,
    maps: Vec<TableMap>,
    order: &[usize],
    resumed: bool,
) -> Result<Vec<Followed>, String> {
    let mut waiting: Vec<Option<(Table, TableMap)>> = tables.into_iter().zip(maps).map(Some).collect();
    let mut created: Vec<Option<Followed>> = waiting.iter().map(|_| None).collect();
    let mut ids: HashMap<String, CollectionId> = HashMap::new();
    for &index in order {
        let (table, mut map) = waiting[index].take().expect("the order names each table once");
        map.resolve_refs(&ids)?;
        let (map, collection) = collection_of(writer, routes, map, resumed).await?;
        ids.insert(map.collection.clone(), collection);
        created[index] = Some(Followed { table, map, collection });
    }
    Ok(created.into_iter().map(|followed| followed.expect("the order names every table")).collect())
}

/// The collection of a followed table. On a restart, the one that exists, its
/// fields as they are: those of the table at the stored position, which the
/// stream brings up to the table's (a column added or dropped meanwhile).
/// Else a new one (a first start dropped the old one).
async fn collection_of(
    writer: &WriterSender,
    routes: &Routes,
    map: TableMap,
    resumed: bool,
) -> Result<(TableMap, CollectionId), String> {
    let existing = routes.read().expect("routes lock").get(&map.collection).cloned();
    match existing.filter(|_| resumed) {
        Some(entry) => {
            map.check_kept(&entry.schema)?;
            Ok((map.adopt(&entry.schema), entry.id))
        }
        None => {
            let collection = create_collection(writer, &map.collection, map.schema()?).await?;
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
    send(writer, Command::Write { batches, reply, queued_at: Instant::now(), guards: Vec::new() }).await?;
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
