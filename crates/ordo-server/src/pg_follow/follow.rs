//! The follower's task: streams the slot from the stored position and applies
//! each transaction as one group commit, then confirms its end LSN. A lost
//! connection (PostgreSQL restarted, the walsender terminated) is retried with
//! `Backoff`; anything else stops the follower loudly, the server serving what
//! it holds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ordo_core::{Batch, CollectionId};
use ordo_pgsource::stream::{Backoff, StreamConfig, DEFAULT_STATUS_INTERVAL};
use ordo_pgsource::{Change, ChangeStream, Connection, Error, Lsn, Mode, Transaction, UnsupportedColumns};
use tokio::sync::watch;

use super::config::PostgresOptions;
use super::status::FollowStatus;
use super::{write_group, Followed};
use crate::writer::WriterSender;
use std::sync::Arc;

/// Most changes of one PostgreSQL transaction: each becomes at most two ops
/// (a key change is a remove and an upsert) of one Ordo batch.
pub const MAX_TRANSACTION_CHANGES: usize = ordo_core::limits::MAX_OPS_PER_BATCH / 2;

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
    /// The end LSN of the last transaction stored (or the copy's consistent point).
    position: Lsn,
    writer: WriterSender,
    status: Arc<FollowStatus>,
}

impl Follower {
    pub(super) fn new(
        options: PostgresOptions,
        followed: Vec<Followed>,
        position_collection: CollectionId,
        position: Lsn,
        writer: WriterSender,
        status: Arc<FollowStatus>,
    ) -> Follower {
        Follower { options, followed, position_collection, position, writer, status }
    }

    /// Follows until the server stops or a change cannot be applied.
    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = Backoff::new(self.options.backoff_first, self.options.backoff_max);
        loop {
            let stop = tokio::select! {
                stop = self.stream(&mut backoff) => stop,
                _ = shutdown.wait_for(|stopping| *stopping) => Stop::Shutdown,
            };
            match stop {
                Stop::Shutdown => return,
                Stop::Source(error) if error.is_transient() => {
                    let wait = backoff.next_wait();
                    tracing::warn!(%error, wait_ms = wait.as_millis() as u64, "PostgreSQL: connection lost; reconnecting");
                    self.status.reconnecting(&error.to_string());
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.wait_for(|stopping| *stopping) => return,
                    }
                }
                Stop::Source(error) => return self.fail(&format!("PostgreSQL: {error}")),
                Stop::Refused(message) => return self.fail(&message),
            }
        }
    }

    fn fail(&self, message: &str) {
        eprintln!("ordo: ERROR: stopped following PostgreSQL: {message}");
        tracing::error!(error = message, "stopped following PostgreSQL");
        self.status.failed(message);
    }

    /// One connection's stream: returns why it ended.
    async fn stream(&mut self, backoff: &mut Backoff) -> Stop {
        let connection = match connect(&self.options).await {
            Ok(connection) => connection,
            Err(error) => return Stop::Source(error),
        };
        let tables = self.followed.iter().map(|table| table.table.clone()).collect();
        let config = StreamConfig {
            slot: self.options.slot.clone(),
            publication: self.options.publication.clone(),
            max_transaction_changes: MAX_TRANSACTION_CHANGES,
            status_interval: DEFAULT_STATUS_INTERVAL,
            unsupported_columns: UnsupportedColumns::Refuse,
        };
        let mut stream = match ChangeStream::start(connection, tables, config, self.position).await {
            Ok(stream) => stream,
            Err(error) => return Stop::Source(error),
        };
        backoff.reset();
        self.status.streaming();
        loop {
            if let Err(stop) = self.next(&mut stream).await {
                return stop;
            }
        }
    }

    /// Applies the next transaction, durably with its end LSN, then confirms it.
    async fn next(&mut self, stream: &mut ChangeStream) -> Result<(), Stop> {
        let transaction = stream.next_transaction().await?;
        let batches = self.batches_of(&transaction).map_err(Stop::Refused)?;
        let position = Some((self.position_collection, self.options.slot.as_str(), transaction.end_lsn));
        write_group(&self.writer, batches, position).await.map_err(Stop::Refused)?;
        self.position = transaction.end_lsn;
        stream.confirm(transaction.end_lsn).await?;
        let lag_micros = unix_micros().saturating_sub(transaction.commit_time_unix_micros).max(0) as u64;
        self.status.applied(transaction.end_lsn.0, stream.lag_bytes(), lag_micros);
        Ok(())
    }

    /// A batch per followed collection the transaction touched, in table order.
    fn batches_of(&self, transaction: &Transaction) -> Result<Vec<(CollectionId, Batch)>, String> {
        let mut batches: Vec<Option<Batch>> = self.followed.iter().map(|_| None).collect();
        for change in &transaction.changes {
            let index = match change {
                Change::Insert { layout, .. } | Change::Update { layout, .. } | Change::Delete { layout, .. } => {
                    layout.table
                }
                Change::Truncate { tables } => {
                    let names: Vec<String> =
                        tables.iter().map(|index| self.followed[*index].table.name.to_string()).collect();
                    return Err(format!(
                        "TRUNCATE of {} is not followed yet: copy the tables anew (docs/POSTGRES.md, \"Failures\")",
                        names.join(", ")
                    ));
                }
            };
            let followed = &self.followed[index];
            let batch = batches[index].get_or_insert_with(Batch::new);
            match change {
                Change::Insert { layout, row } => followed.map.upsert_streamed(layout, row, batch)?,
                Change::Update { layout, old_key, row } => {
                    if let Some(old_key) = old_key {
                        followed.map.remove(old_key, batch)?;
                    }
                    followed.map.upsert_streamed(layout, row, batch)?;
                }
                Change::Delete { key, .. } => followed.map.remove(key, batch)?,
                Change::Truncate { .. } => unreachable!("handled above"),
            }
        }
        Ok(self
            .followed
            .iter()
            .zip(batches)
            .filter_map(|(table, batch)| batch.map(|batch| (table.collection, batch)))
            .collect())
    }
}

fn unix_micros() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_micros() as i64
}
