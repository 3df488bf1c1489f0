//! The first start's copy: every followed table read at the slot's snapshot
//! (`ordo_pgsource::copy::create_slot_and_copy`), written in batches of
//! [`COPY_BATCH_ROWS`] rows; the last write also stores the slot's consistent
//! point as the position, so a copy cut short leaves no position and the next
//! start copies again from scratch.

use std::time::Instant;

use ordo_core::{Batch, CollectionId};
use ordo_pgsource::{Connection, Error, Lsn};

use super::config::PostgresOptions;
use super::sink::{Sink, SinkError};
use super::Followed;

/// Rows per batch written during the copy: large enough to amortise a group
/// commit, small enough to keep the copy's memory bounded.
pub const COPY_BATCH_ROWS: usize = 10_000;

/// How often the copy prints its progress line.
const PROGRESS_EVERY_ROWS: u64 = 100_000;

/// Copies every table; returns the position the stream continues from.
pub(super) async fn copy_tables(
    options: &PostgresOptions,
    mut connection: Connection,
    followed: &[Followed],
    position_collection: CollectionId,
    sink: &Sink,
) -> Result<Lsn, SinkError> {
    let tables: Vec<_> = followed.iter().map(|table| table.table.clone()).collect();
    let mut batches: Vec<Batch> = followed.iter().map(|_| Batch::new()).collect();
    let mut rows: Vec<u64> = vec![0; followed.len()];
    let started = Instant::now();
    // Why a write inside the copy failed, kept whole (a lost term is not a refusal).
    let mut sink_error: Option<SinkError> = None;
    let consistent_point =
        ordo_pgsource::copy::create_slot_and_copy(&mut connection, &options.slot, &tables, |index, row| {
            let table = &followed[index];
            table.map.upsert_copied(&table.table, &row, &mut batches[index]).map_err(Error::Protocol)?;
            rows[index] += 1;
            if rows[index].is_multiple_of(PROGRESS_EVERY_ROWS) {
                crate::logging::say!(
                    "ordo: {}",
                    ordo_pgsource::copy::progress_line(&table.table, rows[index], started.elapsed())
                );
            }
            if batches[index].len() >= COPY_BATCH_ROWS {
                let full = std::mem::take(&mut batches[index]);
                write_blocking(sink, vec![(table.collection, full)], &mut sink_error)
                    .map_err(|error| Error::Protocol(error.message()))?;
            }
            Ok(())
        })
        .await;
    if let Some(error) = sink_error {
        return Err(error);
    }
    let consistent_point = consistent_point.map_err(|error| format!("PostgreSQL: the initial copy failed: {error}"))?;
    let _ = connection.terminate().await;
    let rest: Vec<_> = followed.iter().zip(batches).map(|(table, batch)| (table.collection, batch)).collect();
    sink.write_group(rest, Some((position_collection, &options.slot, consistent_point))).await?;
    for (table, n_rows) in followed.iter().zip(&rows) {
        crate::logging::say!("ordo: copied {n_rows} rows of {} into `{}`", table.table.name, table.map.collection);
    }
    Ok(consistent_point)
}

/// Writes from inside the copy's row callback, which cannot await: the
/// runtime moves its other tasks off this thread while it waits, so the copy's
/// memory stays at one batch per table.
fn write_blocking(
    sink: &Sink,
    batches: Vec<(CollectionId, Batch)>,
    kept: &mut Option<SinkError>,
) -> Result<(), SinkError> {
    let written =
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(sink.write_group(batches, None)));
    match written {
        Err(SinkError::Lost(message)) => {
            *kept = Some(SinkError::Lost(message.clone()));
            Err(SinkError::Lost(message))
        }
        other => other,
    }
}
