//! The change stream: `START_REPLICATION` with `pgoutput`, decoded into whole
//! committed transactions of typed changes, and the standby status updates that
//! tell PostgreSQL which position the caller holds durably.
//!
//! pgoutput (without `streaming`) sends a transaction only once it committed,
//! from `Begin` to `Commit`; [`ChangeStream::next_transaction`] gathers one
//! whole, up to [`StreamConfig::max_transaction_changes`] changes, so the caller
//! applies it as one batch.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes};
use postgres_protocol::escape::escape_literal;

use crate::catalog::{quote_identifier, Table, UnsupportedColumns};
use crate::error::{Error, ServerError, SQLSTATE_OBJECT_NOT_IN_PREREQUISITE_STATE, SQLSTATE_UNDEFINED_OBJECT};
use crate::lsn::Lsn;
use crate::pgoutput::{self, Cell, Message, Relation, POSTGRES_EPOCH_UNIX_MICROS};
use crate::value::{parse_value, ColumnType, Value};
use crate::wire::Connection;

/// The default bound on one transaction's changes, past which the transaction
/// is refused rather than held whole in memory.
pub const DEFAULT_MAX_TRANSACTION_CHANGES: usize = 1_000_000;

/// How often a status update goes to the server while nothing else does
/// (PostgreSQL's `wal_sender_timeout` is a minute by default).
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct StreamConfig {
    pub slot: String,
    pub publication: String,
    pub max_transaction_changes: usize,
    pub status_interval: Duration,
    pub unsupported_columns: UnsupportedColumns,
}

/// A column's value in a change.
#[derive(Clone, Debug, PartialEq)]
pub enum Field {
    Value(Value),
    /// An update left this TOASTed value as it was: keep the value held.
    UnchangedToast,
}

/// How the rows of a followed table are laid out, as its latest Relation
/// message says (a column added or dropped in PostgreSQL changes it).
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// The table's index in the followed tables.
    pub table: usize,
    pub relation_oid: u32,
    /// Each column's name and type (`None`: not followed, its values are null).
    pub columns: Vec<(String, Option<ColumnType>)>,
    /// The index in `columns` of each primary key column, in key order.
    pub key_indices: Vec<usize>,
}

impl Layout {
    /// The primary key values of a row or old-key tuple of this layout.
    pub fn key_of(&self, row: &[Field]) -> Result<Vec<Value>, Error> {
        self.key_indices
            .iter()
            .map(|index| match row.get(*index) {
                Some(Field::Value(value)) if *value != Value::Null => Ok(value.clone()),
                _ => Err(Error::Protocol(format!("a change without its key column `{}`", self.columns[*index].0))),
            })
            .collect()
    }
}

/// One row change of a followed table.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Insert {
        layout: Arc<Layout>,
        row: Vec<Field>,
    },
    /// `old_key` is there when the update changed the primary key.
    Update {
        layout: Arc<Layout>,
        old_key: Option<Vec<Value>>,
        row: Vec<Field>,
    },
    Delete {
        layout: Arc<Layout>,
        key: Vec<Value>,
    },
    /// Every row of these followed tables (by index) is removed.
    Truncate {
        tables: Vec<usize>,
    },
}

/// A committed transaction: apply it whole, then record `end_lsn` with the data.
#[derive(Clone, Debug, PartialEq)]
pub struct Transaction {
    pub xid: u32,
    pub commit_lsn: Lsn,
    /// The position just past the commit: what the caller stores and confirms.
    pub end_lsn: Lsn,
    pub commit_time_unix_micros: i64,
    pub changes: Vec<Change>,
}

/// The waits between reconnection attempts: doubling from `first` up to `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max, next: first }
    }

    /// The wait before the next attempt (each one twice the last, up to `max`).
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// After a success: the next failure waits `first` again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

/// A stream's positions, shared with whoever reports its lag (the caller's
/// status, read at any time) and with whoever learns the WAL end elsewhere.
///
/// The server's data messages carry, for logical replication, each record's
/// own position as their "WAL end", so while PostgreSQL streams without a pause
/// the stream learns how far the WAL goes only from keepalives, which it sends
/// only while it waits for WAL. A caller that reads `pg_current_wal_flush_lsn()`
/// meanwhile hands it over with [`WalPositions::raise_wal_end`].
#[derive(Debug, Default)]
pub struct WalPositions {
    wal_end: AtomicU64,
    confirmed: AtomicU64,
    transactions_handed_over: AtomicU64,
}

impl WalPositions {
    fn starting_at(lsn: Lsn) -> WalPositions {
        WalPositions {
            wal_end: AtomicU64::new(lsn.0),
            confirmed: AtomicU64::new(lsn.0),
            transactions_handed_over: AtomicU64::new(0),
        }
    }

    /// The furthest WAL end known: from the server's messages, or raised.
    pub fn wal_end(&self) -> Lsn {
        Lsn(self.wal_end.load(Ordering::Relaxed))
    }

    /// What the caller last confirmed (or a keepalive moved it to).
    pub fn confirmed(&self) -> Lsn {
        Lsn(self.confirmed.load(Ordering::Relaxed))
    }

    /// The WAL bytes past what is confirmed.
    pub fn lag_bytes(&self) -> u64 {
        self.wal_end().0.saturating_sub(self.confirmed().0)
    }

    /// Records that the server's WAL reaches at least `lsn` (flushed WAL: the
    /// server sends what is flushed, so the stream will get that far).
    pub fn raise_wal_end(&self, lsn: Lsn) {
        self.wal_end.fetch_max(lsn.0, Ordering::Relaxed);
    }

    /// How many transactions the stream handed over: a count that moves while
    /// it is busy.
    pub fn transactions_handed_over(&self) -> u64 {
        self.transactions_handed_over.load(Ordering::Relaxed)
    }

    fn set_confirmed(&self, lsn: Lsn) {
        self.confirmed.store(lsn.0, Ordering::Relaxed);
    }
}

/// Whether reading the stream waits for data to come.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    ForData,
    No,
}

/// A running stream of the slot's changes.
pub struct ChangeStream {
    /// Transactions that end at or before it were applied before this start.
    start_lsn: Lsn,
    connection: Connection,
    tables: Vec<Table>,
    config: StreamConfig,
    layouts: HashMap<u32, Arc<Layout>>,
    not_followed: HashSet<u32>,
    confirmed: Lsn,
    /// The end of the last transaction handed over (the start position before
    /// the first): keepalives may move `confirmed` only once the caller has
    /// confirmed up to it.
    handed_over_end: Lsn,
    positions: Arc<WalPositions>,
    last_status: Instant,
    last_commit_time_unix_micros: Option<i64>,
    /// The transaction being gathered: kept here, not in a call's locals, so
    /// that [`ChangeStream::next_transaction_now`] can stop in the middle of
    /// one and the next call go on with it.
    current: Option<Transaction>,
}

impl ChangeStream {
    /// Starts streaming the slot from `start_lsn` (the position stored with the
    /// data, or the consistent point of the initial copy). A slot that is gone
    /// or invalidated is [`Error::SlotLost`].
    pub async fn start(
        mut connection: Connection,
        tables: Vec<Table>,
        config: StreamConfig,
        start_lsn: Lsn,
    ) -> Result<ChangeStream, Error> {
        let command = format!(
            "START_REPLICATION SLOT {} LOGICAL {start_lsn} (proto_version '1', publication_names {})",
            quote_identifier(&config.slot),
            escape_literal(&quote_identifier(&config.publication))
        );
        if let Err(error) = connection.start_copy_both(&command).await {
            return Err(slot_lost_or(error, &config.slot));
        }
        Ok(ChangeStream {
            start_lsn,
            connection,
            tables,
            config,
            layouts: HashMap::new(),
            not_followed: HashSet::new(),
            confirmed: start_lsn,
            handed_over_end: start_lsn,
            positions: Arc::new(WalPositions::starting_at(start_lsn)),
            last_status: Instant::now(),
            last_commit_time_unix_micros: None,
            current: None,
        })
    }

    /// The position the caller last confirmed as durable.
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// The furthest WAL end known (see [`WalPositions`]): `server_wal_end -
    /// confirmed` is the lag in bytes.
    pub fn server_wal_end(&self) -> Lsn {
        self.positions.wal_end()
    }

    /// The positions, to read the lag from elsewhere and raise the WAL end.
    pub fn positions(&self) -> Arc<WalPositions> {
        self.positions.clone()
    }

    /// The replication lag in bytes of WAL: how far the server's WAL end is past
    /// what the caller confirmed.
    pub fn lag_bytes(&self) -> u64 {
        self.positions.lag_bytes()
    }

    /// When the last transaction handed over committed in PostgreSQL (µs since
    /// the Unix epoch), for the lag in seconds; `None` before the first.
    pub fn last_commit_time_unix_micros(&self) -> Option<i64> {
        self.last_commit_time_unix_micros
    }

    /// The replication connection's backend process id.
    pub fn backend_pid(&self) -> i32 {
        self.connection.backend_pid
    }

    /// Tells the server that everything up to `lsn` is durable on the caller's
    /// side, so the slot may advance and the WAL before it be recycled. Never
    /// call it before the transaction ending at `lsn` is stored.
    pub async fn confirm(&mut self, lsn: Lsn) -> Result<(), Error> {
        self.confirmed = self.confirmed.max(lsn);
        self.positions.set_confirmed(self.confirmed);
        self.send_status().await
    }

    /// The next committed transaction that touched a followed table. Not
    /// cancel-safe: a status update being written when the future is dropped
    /// may be cut short (the caller then restarts the stream from its stored
    /// position).
    ///
    /// While it waits between transactions, with every transaction handed over
    /// confirmed, a keepalive's WAL position is confirmed too: nothing before
    /// it touched a followed table, and without this the slot would hold all
    /// the WAL written since the last followed commit while only other tables
    /// change. The caller's stored position may then be behind the slot's;
    /// PostgreSQL starts a stream asked for an older position at the slot's.
    pub async fn next_transaction(&mut self) -> Result<Transaction, Error> {
        Ok(self.gather_transaction(Wait::ForData).await?.expect("a wait for data ends with a transaction"))
    }

    /// The next transaction if all of it is already received (buffered, or
    /// readable from the socket at once); `None` otherwise, the part received
    /// kept for the next call. A caller that just got a transaction takes
    /// those that came behind it with this, to store them together.
    pub async fn next_transaction_now(&mut self) -> Result<Option<Transaction>, Error> {
        self.gather_transaction(Wait::No).await
    }

    async fn gather_transaction(&mut self, wait: Wait) -> Result<Option<Transaction>, Error> {
        loop {
            let Some(payload) = self.next_change_payload(self.current.is_none(), wait).await? else {
                return Ok(None);
            };
            let message = pgoutput::decode(&payload)?;
            match message {
                Message::Begin { xid, commit_time_unix_micros, final_lsn } => {
                    self.current = Some(Transaction {
                        xid,
                        commit_lsn: final_lsn,
                        end_lsn: final_lsn,
                        commit_time_unix_micros,
                        changes: Vec::new(),
                    });
                }
                Message::Commit { commit_lsn, end_lsn, commit_time_unix_micros } => {
                    let mut transaction =
                        self.current.take().ok_or_else(|| Error::Protocol("a commit without a begin".into()))?;
                    transaction.commit_lsn = commit_lsn;
                    transaction.end_lsn = end_lsn;
                    transaction.commit_time_unix_micros = commit_time_unix_micros;
                    // PostgreSQL skips what committed before the start position
                    // itself; this keeps a replay out even if it did not.
                    if !transaction.changes.is_empty() && transaction.end_lsn > self.start_lsn {
                        self.last_commit_time_unix_micros = Some(commit_time_unix_micros);
                        self.handed_over_end = self.handed_over_end.max(transaction.end_lsn);
                        self.positions.transactions_handed_over.fetch_add(1, Ordering::Relaxed);
                        return Ok(Some(transaction));
                    }
                }
                Message::Relation(relation) => self.learn_relation(relation)?,
                Message::Insert { .. } | Message::Update { .. } | Message::Delete { .. } | Message::Truncate { .. } => {
                    if self.current.is_none() {
                        return Err(Error::Protocol("a change outside a transaction".into()));
                    }
                    let Some(change) = self.change_of(message)? else { continue };
                    let limit = self.config.max_transaction_changes;
                    let transaction = self.current.as_mut().expect("checked above");
                    if transaction.changes.len() >= limit {
                        return Err(Error::TransactionTooLarge { limit });
                    }
                    transaction.changes.push(change);
                }
                Message::Origin { .. } | Message::Type { .. } | Message::LogicalMessage => {}
            }
        }
    }

    /// Records the layout of a followed table, or that the relation is not followed.
    fn learn_relation(&mut self, relation: Relation) -> Result<(), Error> {
        let Some(table_index) = self
            .tables
            .iter()
            .position(|table| table.name.schema == relation.schema && table.name.name == relation.name)
        else {
            self.not_followed.insert(relation.oid);
            return Ok(());
        };
        let table = &self.tables[table_index];
        let mut columns = Vec::with_capacity(relation.columns.len());
        for column in &relation.columns {
            let column_type = ColumnType::from_oid(column.type_oid);
            let is_key = table.key_columns.contains(&column.name);
            if column_type.is_none() && (is_key || self.config.unsupported_columns == UnsupportedColumns::Refuse) {
                return Err(Error::UnsupportedType {
                    table: table.name.to_string(),
                    column: column.name.clone(),
                    type_name: format!("oid {}", column.type_oid),
                });
            }
            columns.push((column.name.clone(), column_type));
        }
        let key_indices = table
            .key_columns
            .iter()
            .map(|key| columns.iter().position(|(name, _)| name == key))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::NoPrimaryKey { table: table.name.to_string() })?;
        let layout = Layout { table: table_index, relation_oid: relation.oid, columns, key_indices };
        self.layouts.insert(relation.oid, Arc::new(layout));
        Ok(())
    }

    /// The typed change of a row message; `None` for a table not followed.
    fn change_of(&self, message: Message) -> Result<Option<Change>, Error> {
        let layout_of = |oid: u32| -> Result<Option<Arc<Layout>>, Error> {
            if self.not_followed.contains(&oid) {
                return Ok(None);
            }
            self.layouts
                .get(&oid)
                .cloned()
                .map(Some)
                .ok_or_else(|| Error::Protocol(format!("a change of relation {oid} before its description")))
        };
        Ok(match message {
            Message::Insert { relation_oid, new } => layout_of(relation_oid)?
                .map(|layout| {
                    let row = self.fields(&layout, new)?;
                    Ok::<_, Error>(Change::Insert { layout, row })
                })
                .transpose()?,
            Message::Update { relation_oid, old, new } => match layout_of(relation_oid)? {
                None => None,
                Some(layout) => {
                    let row = self.fields(&layout, new)?;
                    let old_key =
                        old.map(|old| self.fields(&layout, old).and_then(|old| layout.key_of(&old))).transpose()?;
                    Some(Change::Update { layout, old_key, row })
                }
            },
            Message::Delete { relation_oid, old } => match layout_of(relation_oid)? {
                None => None,
                Some(layout) => {
                    let key = layout.key_of(&self.fields(&layout, old)?)?;
                    Some(Change::Delete { layout, key })
                }
            },
            Message::Truncate { relation_oids, .. } => {
                let tables: Vec<usize> =
                    relation_oids.iter().filter_map(|oid| self.layouts.get(oid).map(|layout| layout.table)).collect();
                (!tables.is_empty()).then_some(Change::Truncate { tables })
            }
            _ => None,
        })
    }

    /// Parses a tuple's cells by the layout's column types.
    fn fields(&self, layout: &Layout, cells: Vec<Cell>) -> Result<Vec<Field>, Error> {
        if cells.len() != layout.columns.len() {
            return Err(Error::Protocol(format!(
                "a tuple of {} columns for a relation of {}",
                cells.len(),
                layout.columns.len()
            )));
        }
        cells
            .into_iter()
            .zip(&layout.columns)
            .map(|(cell, (name, column_type))| match (cell, column_type) {
                (Cell::Null, _) | (Cell::Text(_), None) => Ok(Field::Value(Value::Null)),
                (Cell::UnchangedToast, _) => Ok(Field::UnchangedToast),
                (Cell::Text(text), Some(column_type)) => {
                    parse_value(*column_type, &text).map(Field::Value).map_err(|error| Error::Value {
                        table: self.tables[layout.table].name.to_string(),
                        column: name.clone(),
                        error,
                    })
                }
            })
            .collect()
    }

    /// The payload of the next `XLogData` frame, answering keepalives and
    /// sending a status update every `status_interval` meanwhile;
    /// `between_transactions`: no transaction is being gathered (see
    /// [`ChangeStream::next_transaction`] for what a keepalive confirms then).
    async fn next_change_payload(&mut self, between_transactions: bool, wait: Wait) -> Result<Option<Bytes>, Error> {
        loop {
            let until_status = self.config.status_interval.saturating_sub(self.last_status.elapsed());
            if until_status.is_zero() {
                self.send_status().await?;
                continue;
            }
            let read = match wait {
                Wait::ForData => match tokio::time::timeout(until_status, self.connection.read_copy_data()).await {
                    Ok(read) => read,
                    Err(_) => continue,
                },
                Wait::No => match self.connection.read_copy_data_now() {
                    Some(read) => read,
                    None => return Ok(None),
                },
            };
            let Some(mut frame) = read.map_err(|error| slot_lost_or(error, &self.config.slot))? else {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server ended the replication stream",
                )));
            };
            match frame.first() {
                Some(b'w') if frame.len() >= 25 => {
                    frame.advance(1);
                    let _start = frame.get_u64();
                    // The record's own position for logical replication: see `WalPositions`.
                    self.positions.raise_wal_end(Lsn(frame.get_u64()));
                    let _send_time = frame.get_i64();
                    return Ok(Some(frame));
                }
                Some(b'k') if frame.len() >= 18 => {
                    frame.advance(1);
                    let wal_end = Lsn(frame.get_u64());
                    self.positions.raise_wal_end(wal_end);
                    let moved =
                        between_transactions && self.confirmed >= self.handed_over_end && wal_end > self.confirmed;
                    if moved {
                        self.confirmed = wal_end;
                        self.positions.set_confirmed(wal_end);
                    }
                    let _send_time = frame.get_i64();
                    // A move is said at once: the server keeps sending keepalives
                    // while the position it last heard is behind the WAL it sent.
                    if frame.get_u8() == 1 || moved {
                        self.send_status().await?;
                    }
                }
                _ => {
                    return Err(Error::Protocol("a replication frame that is neither XLogData nor a keepalive".into()))
                }
            }
        }
    }

    /// A standby status update: written, flushed and applied are all the
    /// caller's confirmed position, never more.
    async fn send_status(&mut self) -> Result<(), Error> {
        let now_unix_micros = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_micros() as i64);
        let mut update = Vec::with_capacity(34);
        update.push(b'r');
        for _ in 0..3 {
            update.extend_from_slice(&self.confirmed.0.to_be_bytes());
        }
        update.extend_from_slice(&(now_unix_micros - POSTGRES_EPOCH_UNIX_MICROS).to_be_bytes());
        update.push(0);
        self.connection.write_copy_data(&update).await?;
        self.last_status = Instant::now();
        Ok(())
    }
}

/// Whether PostgreSQL refused the slot because it invalidated it.
fn is_invalidated_slot(server: &ServerError) -> bool {
    let detail = server.detail.as_deref().unwrap_or("");
    server.message.contains("can no longer get changes")
        || (server.code == SQLSTATE_OBJECT_NOT_IN_PREREQUISITE_STATE
            && server.message.contains("replication slot")
            && detail.contains("invalidated"))
}

/// A missing or invalidated slot as [`Error::SlotLost`]; other errors as they are.
fn slot_lost_or(error: Error, slot: &str) -> Error {
    match &error {
        Error::Server(server)
            if server.code == SQLSTATE_UNDEFINED_OBJECT && server.message.contains("replication slot") =>
        {
            Error::SlotLost { slot: slot.into(), reason: server.message.clone() }
        }
        // A slot PostgreSQL invalidated (it held more WAL than max_slot_wal_keep_size):
        // PostgreSQL 15 refuses it with `cannot read from logical replication slot`
        // and says why in the detail; other versions say `can no longer get changes`.
        Error::Server(server) if is_invalidated_slot(server) => {
            Error::SlotLost { slot: slot.into(), reason: server.explained() }
        }
        _ => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_bound_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(300));
        let waits: Vec<u128> = (0..5).map(|_| backoff.next_wait().as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 300, 300]);
        backoff.reset();
        assert_eq!(backoff.next_wait(), Duration::from_millis(50));
    }
}
