//! The follower's task: streams the slot from the stored position and applies
//! each transaction, then confirms its end LSN. The transactions already
//! received behind the one it waited for are stored with it, in one group
//! commit (one sync of the log), each still its own batches: a busy source
//! would otherwise wait for one sync per transaction. A
//! `TRUNCATE` is the removal of every item its collections hold, in the same
//! group as the rest of its transaction. A lost connection (PostgreSQL
//! restarted, the walsender terminated) is retried with `Backoff`; anything
//! else stops the follower loudly, the server serving what it holds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ordo_core::limits::MAX_OPS_PER_BATCH;
use ordo_core::{Batch, CollectionId, OwnedValue};
use ordo_pgsource::catalog::{check_still_followed, describe_tables};
use ordo_pgsource::stream::{Backoff, Layout, StreamConfig, DEFAULT_STATUS_INTERVAL};
use ordo_pgsource::value::parse_value;
use ordo_pgsource::{Change, ChangeStream, Connection, Error, Lsn, Mode, Transaction, UnsupportedColumns};
use ordo_store::MAX_BATCHES_PER_COMMIT;
use tokio::sync::{oneshot, watch};

use super::config::{PostgresOptions, MAX_FOLLOWED_TABLES};
use super::mapping::{ordo_value, FieldChanges};
use super::sink::{Sink, SinkError, TransactionWrites};
use super::status::FollowStatus;
use super::watcher::Watcher;
use super::{send, shutting_down, Followed};
use crate::writer::{Command, WriterSender};
use std::sync::Arc;

/// Most changes of one PostgreSQL transaction: each becomes at most two ops
/// (a key change is a remove and an upsert) of one Ordo batch.
pub const MAX_TRANSACTION_CHANGES: usize = MAX_OPS_PER_BATCH / 2;

pub(super) async fn connect(options: &PostgresOptions) -> Result<Connection, Error> {
    Connection::connect(&options.connect, Mode::Replication).await
}

/// Why streaming stopped.
enum Stop {
    /// The server is stopping.
    Shutdown,
    /// From PostgreSQL: retried if transient.
    Source(Error),
    /// Ordo cannot apply a change: the follower stops.
    Refused(String),
    /// Cluster mode: this node's term is over (`SinkError::Lost`).
    Lost(String),
}

/// How following ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// The server is stopping (or, in cluster mode, the lease was lost).
    Stopped,
    /// Cluster mode: the term is over; another node (maybe this one) goes on.
    Lost(String),
    /// For good: `FollowStatus` says why.
    Failed,
}

impl From<SinkError> for Stop {
    fn from(error: SinkError) -> Stop {
        match error {
            SinkError::Refused(message) => Stop::Refused(message),
            SinkError::Lost(message) => Stop::Lost(message),
        }
    }
}

impl From<Error> for Stop {
    fn from(error: Error) -> Stop {
        Stop::Source(error)
    }
}

pub(super) struct Follower {
    options: PostgresOptions,
    followed: Vec<Followed>,
    position_collection: CollectionId,
    /// Each table's layout the fields were last brought in line with (by index).
    layouts: Vec<Option<Arc<Layout>>>,
    /// The end LSN of the last transaction stored (or the copy's consistent point).
    position: Lsn,
    sink: Sink,
    status: Arc<FollowStatus>,
}

impl Follower {
    pub(super) fn new(
        options: PostgresOptions,
        followed: Vec<Followed>,
        position_collection: CollectionId,
        position: Lsn,
        sink: Sink,
        status: Arc<FollowStatus>,
    ) -> Follower {
        let layouts = followed.iter().map(|_| None).collect();
        Follower { options, followed, position_collection, layouts, position, sink, status }
    }

    /// Follows until the server stops (in cluster mode: or the lease is lost)
    /// or a change cannot be applied.
    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Ended {
        let mut backoff = Backoff::new(self.options.backoff_first, self.options.backoff_max);
        let tables = self.followed.iter().map(|table| table.table.clone()).collect();
        let mut watcher = Watcher::new(self.options.clone(), tables, self.status.clone());
        loop {
            let stop = tokio::select! {
                stop = self.stream(&mut backoff) => stop,
                error = watcher.next_failure() => Stop::Source(error),
                _ = shutdown.wait_for(|stopping| *stopping) => Stop::Shutdown,
            };
            match stop {
                Stop::Shutdown => return Ended::Stopped,
                Stop::Lost(message) => return Ended::Lost(message),
                Stop::Source(error) if error.is_transient() => {
                    let wait = backoff.next_wait();
                    tracing::warn!(%error, wait_ms = wait.as_millis() as u64, "PostgreSQL: connection lost; reconnecting");
                    self.status.reconnecting(&error.to_string());
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.wait_for(|stopping| *stopping) => return Ended::Stopped,
                    }
                }
                Stop::Source(error @ Error::UnsupportedType { .. }) => {
                    let error = self.as_at_start(error).await;
                    return self.fail(&format!("PostgreSQL: {error}"));
                }
                Stop::Source(error) => return self.fail(&format!("PostgreSQL: {error}")),
                Stop::Refused(message) => return self.fail(&message),
            }
        }
    }

    /// A column of a type that is not followed, met in the stream: pgoutput
    /// names the type only by its oid, so the start's check of the tables runs
    /// again for the error in the start's words, with the type's name. The
    /// stream's own error when the catalog has moved on or cannot be read.
    async fn as_at_start(&self, error: Error) -> Error {
        let Ok(mut connection) = Connection::connect(&self.options.connect, Mode::Sql).await else { return error };
        let names: Vec<_> = self.options.tables.iter().map(|mapping| mapping.table.clone()).collect();
        let publication = &self.options.publication;
        let checked = describe_tables(&mut connection, publication, &names, UnsupportedColumns::Refuse).await;
        let _ = connection.terminate().await;
        match checked {
            Err(named @ Error::UnsupportedType { .. }) => named,
            _ => error,
        }
    }

    fn fail(&self, message: &str) -> Ended {
        eprintln!("ordo: ERROR: stopped following PostgreSQL: {message}");
        tracing::error!(error = message, "stopped following PostgreSQL");
        self.status.failed(message);
        Ended::Failed
    }

    /// One connection's stream: returns why it ended.
    async fn stream(&mut self, backoff: &mut Backoff) -> Stop {
        let mut connection = match connect(&self.options).await {
            Ok(connection) => connection,
            Err(error) => return Stop::Source(error),
        };
        let tables: Vec<_> = self.followed.iter().map(|table| table.table.clone()).collect();
        // A table removed from the publication (or dropped) while the
        // connection was down: the stream would say nothing of it.
        if let Err(error) = check_still_followed(&mut connection, &self.options.publication, &tables).await {
            return Stop::Source(error);
        }
        let config = StreamConfig {
            slot: self.options.slot.clone(),
            publication: self.options.publication.clone(),
            max_transaction_changes: MAX_TRANSACTION_CHANGES,
            status_interval: DEFAULT_STATUS_INTERVAL,
            unsupported_columns: self.options.unsupported_columns,
        };
        let mut stream = match ChangeStream::start(connection, tables, config, self.position).await {
            Ok(stream) => stream,
            Err(error) => return Stop::Source(error),
        };
        backoff.reset();
        self.status.watch_positions(stream.positions());
        self.status.streaming();
        loop {
            if let Err(stop) = self.next(&mut stream).await {
                return stop;
            }
        }
    }

    /// Applies the next transaction, and those received behind it, durably
    /// with the last one's end LSN, then confirms it.
    async fn next(&mut self, stream: &mut ChangeStream) -> Result<(), Stop> {
        let mut gathered = Gathered::default();
        let first = stream.next_transaction().await?;
        self.gather(first, &mut gathered, stream).await?;
        while gathered.has_room() {
            let Some(transaction) = stream.next_transaction_now().await? else { break };
            self.gather(transaction, &mut gathered, stream).await?;
        }
        self.store(&mut gathered, stream).await
    }

    /// Adds one transaction's batches to `gathered`. One that changes a
    /// collection's fields or truncates one reads and changes the writer's
    /// state first, so what was gathered before it is stored before.
    async fn gather(
        &mut self,
        mut transaction: Transaction,
        gathered: &mut Gathered,
        stream: &mut ChangeStream,
    ) -> Result<(), Stop> {
        if !self.drop_changes_before_copies(&mut transaction) {
            // Only changes already in a table's copy: nothing to store, and
            // confirming skips only what the copy holds.
            gathered.confirm_end = Some(transaction.end_lsn);
            return Ok(());
        }
        if self.needs_the_writer_first(&transaction) {
            self.store(gathered, stream).await?;
            self.follow_layouts(&transaction).await?;
        }
        let truncated = self.ids_of_truncated(&transaction).await.map_err(Stop::Refused)?;
        let batches = self.batches_of(&transaction, &truncated).map_err(Stop::Refused)?;
        gathered.changes += transaction.changes.len();
        gathered.batches += batches.len();
        gathered.confirm_end = Some(transaction.end_lsn);
        gathered.last_commit_time_unix_micros = transaction.commit_time_unix_micros;
        gathered.transactions.push(TransactionWrites { batches, end_lsn: transaction.end_lsn });
        Ok(())
    }

    /// Whether the transaction truncates a table or brings a new layout (its
    /// fields change before its rows are written).
    fn needs_the_writer_first(&self, transaction: &Transaction) -> bool {
        transaction.changes.iter().any(|change| match change {
            Change::Insert { layout, .. } | Change::Update { layout, .. } | Change::Delete { layout, .. } => {
                !self.layouts[layout.table].as_ref().is_some_and(|seen| Arc::ptr_eq(seen, layout))
            }
            Change::Truncate { .. } => true,
        })
    }

    /// Stores what was gathered (one group commit), then confirms the last end
    /// LSN gathered; empties `gathered`.
    async fn store(&mut self, gathered: &mut Gathered, stream: &mut ChangeStream) -> Result<(), Stop> {
        let Some(confirm_end) = gathered.confirm_end.take() else { return Ok(()) };
        let transactions = std::mem::take(&mut gathered.transactions);
        gathered.changes = 0;
        gathered.batches = 0;
        if let Some(last) = transactions.last() {
            let (end_lsn, count) = (last.end_lsn, transactions.len() as u64);
            self.sink.write_transactions(transactions, self.position_collection, &self.options.slot).await?;
            self.position = end_lsn;
            let lag_micros = unix_micros().saturating_sub(gathered.last_commit_time_unix_micros).max(0) as u64;
            self.status.applied(end_lsn.0, lag_micros, count);
        }
        stream.confirm(confirm_end).await?;
        Ok(())
    }

    /// Drops the changes of each table copied at a later snapshot than the
    /// transaction's commit (a table newly followed at a restart: its copy's
    /// consistent point is past the stored position). The copy already holds
    /// them: a transaction that commits before a snapshot's consistent point
    /// is in that snapshot, and one that commits after it is not. Returns
    /// whether any change is left.
    fn drop_changes_before_copies(&self, transaction: &mut Transaction) -> bool {
        let in_copy =
            |table: usize| self.followed[table].copied_at.is_some_and(|copied_at| transaction.end_lsn <= copied_at);
        transaction.changes.retain_mut(|change| match change {
            Change::Insert { layout, .. } | Change::Update { layout, .. } | Change::Delete { layout, .. } => {
                !in_copy(layout.table)
            }
            Change::Truncate { tables } => {
                tables.retain(|table| !in_copy(*table));
                !tables.is_empty()
            }
        });
        !transaction.changes.is_empty()
    }

    /// Brings each collection's fields in line with the layouts the
    /// transaction's changes carry (pgoutput describes a table again before its
    /// first change after an `ALTER TABLE`), before its rows are written: rows
    /// of the older layout set the fields that are left.
    async fn follow_layouts(&mut self, transaction: &Transaction) -> Result<(), Stop> {
        for change in &transaction.changes {
            let (Change::Insert { layout, .. } | Change::Update { layout, .. } | Change::Delete { layout, .. }) =
                change
            else {
                continue;
            };
            if self.layouts[layout.table].as_ref().is_some_and(|seen| Arc::ptr_eq(seen, layout)) {
                continue;
            }
            let followed = &self.followed[layout.table];
            let changes = followed.map.field_changes(&followed.table.name, &layout.columns).map_err(Stop::Refused)?;
            if !changes.is_empty() {
                let defaults = self.missing_values(layout, &changes).await?;
                self.sink.change_fields(followed.collection, &followed.map, &changes, defaults).await?;
                self.followed[layout.table].map.apply(&changes);
            }
            self.layouts[layout.table] = Some(layout.clone());
        }
        Ok(())
    }

    /// The value each added column has in the rows that were there before it
    /// (see `catalog::missing_values`), for the items of those rows; null where
    /// PostgreSQL has none.
    async fn missing_values(&self, layout: &Layout, changes: &FieldChanges) -> Result<Vec<OwnedValue>, Stop> {
        if changes.added.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<String> = changes.added.iter().map(|(name, _)| name.clone()).collect();
        // A plain connection: a replication one would take a second walsender.
        let mut connection = Connection::connect(&self.options.connect, Mode::Sql).await?;
        let texts = ordo_pgsource::catalog::missing_values(&mut connection, layout.relation_oid, &names).await;
        let _ = connection.terminate().await;
        let table = &self.followed[layout.table].table.name;
        changes
            .added
            .iter()
            .zip(texts?)
            .map(|((name, column_type), text)| {
                let Some(text) = text else { return Ok(OwnedValue::Null) };
                let value = parse_value(*column_type, &text).map_err(|error| {
                    Stop::Refused(format!("the default of the column `{table}.{name}`, added in PostgreSQL: {error}"))
                })?;
                Ok(ordo_value(&value).to_owned_value())
            })
            .collect()
    }

    /// For each followed table the transaction truncates, the ids its
    /// collection holds before the transaction (by table index; `None`: not
    /// truncated).
    async fn ids_of_truncated(&self, transaction: &Transaction) -> Result<Vec<Option<Vec<String>>>, String> {
        let mut ids: Vec<Option<Vec<String>>> = self.followed.iter().map(|_| None).collect();
        for change in &transaction.changes {
            let Change::Truncate { tables } = change else { continue };
            for &index in tables {
                if ids[index].is_none() {
                    ids[index] = Some(item_ids(self.sink.writer(), self.followed[index].collection).await?);
                }
            }
        }
        Ok(ids)
    }

    /// The batches of the collections the transaction touched, in table order;
    /// `truncated` as [`Follower::ids_of_truncated`] gives it.
    fn batches_of(
        &self,
        transaction: &Transaction,
        truncated: &[Option<Vec<String>>],
    ) -> Result<Vec<(CollectionId, Batch)>, String> {
        let mut writes: Vec<CollectionWrites> = self.followed.iter().map(|_| CollectionWrites::default()).collect();
        for change in &transaction.changes {
            let layout = match change {
                Change::Insert { layout, .. } | Change::Update { layout, .. } | Change::Delete { layout, .. } => layout,
                Change::Truncate { tables } => {
                    for &index in tables {
                        // What the transaction did to the table before is gone with its rows.
                        writes[index] = CollectionWrites::truncated(truncated[index].as_deref().unwrap_or_default());
                    }
                    continue;
                }
            };
            let map = &self.followed[layout.table].map;
            let batch = writes[layout.table].batch();
            match change {
                Change::Insert { layout, row } => map.upsert_streamed(layout, row, batch)?,
                Change::Update { layout, old_key, row } => {
                    if let Some(old_key) = old_key {
                        map.remove(old_key, batch)?;
                    }
                    map.upsert_streamed(layout, row, batch)?;
                }
                Change::Delete { key, .. } => map.remove(key, batch)?,
                Change::Truncate { .. } => {}
            }
        }
        Ok(self
            .followed
            .iter()
            .zip(writes)
            .flat_map(|(table, writes)| writes.batches.into_iter().map(move |batch| (table.collection, batch)))
            .filter(|(_, batch)| !batch.is_empty())
            .collect())
    }
}

/// Most changes of the transactions stored in one group commit past the
/// first one's: a bound on the memory and the writer's time one group takes.
/// Its batches are bounded too: another transaction is taken only while all
/// the batches it may add (one per followed table, and the position) still
/// fit in the writer's group bound.
const MAX_GATHERED_CHANGES: usize = 64 * 1024;

/// Transactions received together, waiting for their one group commit.
#[derive(Default)]
struct Gathered {
    transactions: Vec<TransactionWrites>,
    batches: usize,
    changes: usize,
    /// The end LSN to confirm once they are stored: the last transaction's,
    /// stored or not (one with nothing to store is confirmed with the rest).
    confirm_end: Option<Lsn>,
    last_commit_time_unix_micros: i64,
}

impl Gathered {
    fn has_room(&self) -> bool {
        self.batches + MAX_FOLLOWED_TABLES < MAX_BATCHES_PER_COMMIT && self.changes < MAX_GATHERED_CHANGES
    }
}

/// Removes per batch of a TRUNCATE: half the engine's bound, so that the ids
/// (at most 255 bytes each) take at most half of a batch's bytes and the
/// changes after the TRUNCATE in its transaction fit beside them.
pub const TRUNCATE_BATCH_OPS: usize = MAX_OPS_PER_BATCH / 2;

/// One collection's writes in one transaction, in order. Without a TRUNCATE
/// that is one batch (a transaction's changes make at most `MAX_OPS_PER_BATCH`
/// ops). After one: the removes of every item first, then the changes after
/// it — one batch, so one frame per subscription, unless the collection holds
/// more than `TRUNCATE_BATCH_OPS` items; then several, all in the
/// transaction's one group commit.
#[derive(Default)]
struct CollectionWrites {
    batches: Vec<Batch>,
}

impl CollectionWrites {
    /// The removes of every item of `ids`.
    fn truncated(ids: &[String]) -> CollectionWrites {
        let batches = ids
            .chunks(TRUNCATE_BATCH_OPS)
            .map(|chunk| {
                let mut batch = Batch::new();
                for id in chunk {
                    batch.remove(id);
                }
                batch
            })
            .collect();
        CollectionWrites { batches }
    }

    /// The batch the next change goes to: the last one while it has room for
    /// the two ops a change makes at most.
    fn batch(&mut self) -> &mut Batch {
        if self.batches.last().is_none_or(|batch| batch.len() + 2 > MAX_OPS_PER_BATCH) {
            self.batches.push(Batch::new());
        }
        self.batches.last_mut().expect("a batch was just pushed if there was none")
    }
}

/// The ids of every item of `collection`, from the writer.
async fn item_ids(writer: &WriterSender, collection: CollectionId) -> Result<Vec<String>, String> {
    let (reply, answer) = oneshot::channel();
    send(writer, Command::ItemIds { collection, reply }).await?;
    answer.await.map_err(|_| shutting_down())
}

fn unix_micros() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_micros() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncate_past_the_batch_bound_is_several_batches_and_the_changes_after_it_join_the_last() {
        let ids: Vec<String> = (0..TRUNCATE_BATCH_OPS + 3).map(|n| n.to_string()).collect();
        let mut writes = CollectionWrites::truncated(&ids);
        assert_eq!(writes.batches.iter().map(Batch::len).collect::<Vec<_>>(), [TRUNCATE_BATCH_OPS, 3]);
        writes.batch().upsert("new");
        assert_eq!(writes.batches.len(), 2, "a change after the removes joins their last batch");
        assert_eq!(writes.batches[1].len(), 4);

        let mut small = CollectionWrites::truncated(&ids[..2]);
        small.batch().remove("0");
        assert_eq!(small.batches.len(), 1, "a small collection's TRUNCATE is one batch with what follows");
        assert!(CollectionWrites::truncated(&[]).batches.is_empty(), "an empty collection: nothing to write");
    }
}
