//! Beside the stream, on a short plain connection at a bounded rate:
//!
//! - **the lag probe**: while the stream is busy (it handed over a transaction
//!   since the last look), `pg_current_wal_flush_lsn()` once per
//!   [`LAG_PROBE_INTERVAL`], raising the stream's known WAL end. pgoutput's
//!   data messages carry each record's own position, and keepalives come only
//!   while the walsender waits for WAL, so without it `lag_bytes` reads 0
//!   while Ordo is far behind. When the stream is idle no probe is made:
//!   keepalives then say where the WAL ends.
//! - **the publication check**: every [`PUBLICATION_CHECK_INTERVAL`], that each
//!   followed table still exists as described and is still in the publication
//!   (`catalog::check_still_followed`): PostgreSQL sends nothing when a table
//!   leaves a publication or is dropped, its changes just stop coming.
//!
//! A connection that fails is left to the stream to notice (it reconnects);
//! only a table that is no longer followed stops the follower.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_pgsource::catalog::{check_still_followed, wal_flush_end};
use ordo_pgsource::stream::WalPositions;
use ordo_pgsource::{Connection, Error, Mode, Table};
use tokio::time::{Interval, MissedTickBehavior};

use super::config::PostgresOptions;
use super::status::FollowStatus;

/// The lag probe's period while the stream is busy: at most one short
/// connection and one query a second.
pub const LAG_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How often the followed tables are checked against the publication (and on
/// every (re)connection of the stream).
pub const PUBLICATION_CHECK_INTERVAL: Duration = Duration::from_secs(10);

pub(super) struct Watcher {
    options: PostgresOptions,
    tables: Vec<Table>,
    status: Arc<FollowStatus>,
    ticks: Interval,
    last_check: Instant,
    /// The stream's transaction count at the last look, to tell busy from idle.
    transactions_seen: Option<u64>,
}

impl Watcher {
    pub(super) fn new(options: PostgresOptions, tables: Vec<Table>, status: Arc<FollowStatus>) -> Watcher {
        let mut ticks = tokio::time::interval(LAG_PROBE_INTERVAL);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Watcher { options, tables, status, ticks, last_check: Instant::now(), transactions_seen: None }
    }

    /// Watches until a followed table is no longer followed: returns why.
    /// Cancel-safe (the caller selects on it beside the stream).
    pub(super) async fn next_failure(&mut self) -> Error {
        loop {
            self.ticks.tick().await;
            let positions = self.status.positions();
            let count = positions.as_ref().map(|positions| positions.transactions_handed_over());
            let busy = count.is_some() && count != self.transactions_seen && self.transactions_seen.is_some();
            self.transactions_seen = count;
            let check_due = self.last_check.elapsed() >= PUBLICATION_CHECK_INTERVAL;
            if !busy && !check_due {
                continue;
            }
            if check_due {
                self.last_check = Instant::now();
            }
            match self.look(positions.as_deref().filter(|_| busy), check_due).await {
                Err(error @ Error::NoLongerFollowed { .. }) => return error,
                Err(error) => tracing::debug!(%error, "PostgreSQL: the lag probe or publication check could not run"),
                Ok(()) => {}
            }
        }
    }

    /// One short connection: the WAL end into `positions` (if given), and the
    /// publication check (if `check`).
    async fn look(&self, positions: Option<&WalPositions>, check: bool) -> Result<(), Error> {
        let mut connection = Connection::connect(&self.options.connect, Mode::Sql).await?;
        let result = async {
            if let Some(positions) = positions {
                positions.raise_wal_end(wal_flush_end(&mut connection).await?);
            }
            if check {
                check_still_followed(&mut connection, &self.options.publication, &self.tables).await?;
            }
            Ok(())
        }
        .await;
        let _ = connection.terminate().await;
        result
    }
}
