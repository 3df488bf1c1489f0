//! The copies: on a first start every followed table read at the slot's
//! snapshot (`ordo_pgsource::copy::create_slot_and_copy`); at a restart, the
//! tables newly followed read at a temporary slot's snapshot
//! (`copy_at_temporary_slot`). Rows are written in batches of
//! [`COPY_BATCH_ROWS`] through the sink (the writer, or in cluster mode the
//! stream); the caller writes the last batches together with what records the
//! copy as done (the position, the followed tables), so a copy cut short is
//! done again from scratch at the next start (or the next term).

use std::time::Instant;

use ordo_core::{Batch, CollectionId};
use ordo_pgsource::{Connection, Error, Lsn};

use super::sink::{Sink, SinkError};
use super::Followed;

/// Rows per batch written during the copy: large enough to amortise a group
/// commit, small enough to keep the copy's memory bounded.
pub const COPY_BATCH_ROWS: usize = 10_000;

/// How often the copy prints its progress line.
const PROGRESS_EVERY_ROWS: u64 = 100_000;

/// Where a copy's snapshot comes from.
#[derive(Clone, Copy)]
pub(super) enum CopySlot<'a> {
    /// The follower's slot, created now (a first start).
    Main(&'a str),
    /// A temporary slot beside it (tables newly followed at a restart).
    Temporary,
}

/// The last batches of a copy, one per table, which the caller writes with
/// the record of the copy.
pub(super) type LastBatches = Vec<(CollectionId, Batch)>;

/// Copies `followed`; returns the copy's consistent point and the last batches.
pub(super) async fn copy_tables(
    slot: CopySlot<'_>,
    mut connection: Connection,
    followed: &[&Followed],
    sink: &Sink,
) -> Result<(Lsn, LastBatches), SinkError> {
    let tables: Vec<_> = followed.iter().map(|table| table.table.clone()).collect();
    let mut batches: Vec<Batch> = followed.iter().map(|_| Batch::new()).collect();
    let mut rows: Vec<u64> = vec![0; followed.len()];
    let started = Instant::now();
    // Why a write inside the copy failed, kept whole (a lost term is not a refusal).
    let mut sink_error: Option<SinkError> = None;
    let on_row = |index: usize, row: Vec<ordo_pgsource::Value>| {
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
    };
    let copied = match slot {
        CopySlot::Main(slot) => ordo_pgsource::copy::create_slot_and_copy(&mut connection, slot, &tables, on_row).await,
        CopySlot::Temporary => ordo_pgsource::copy::copy_at_temporary_slot(&mut connection, &tables, on_row).await,
    };
    if let Some(error) = sink_error {
        return Err(error);
    }
    let consistent_point = copied.map_err(|error| format!("PostgreSQL: the copy failed: {error}"))?;
    // Ends the connection, so a temporary slot is dropped with it.
    let _ = connection.terminate().await;
    let rest: Vec<_> = followed.iter().zip(batches).map(|(table, batch)| (table.collection, batch)).collect();
    for (table, n_rows) in followed.iter().zip(&rows) {
        crate::logging::say!("ordo: copied {n_rows} rows of {} into `{}`", table.table.name, table.map.collection);
        tracing::info!(table = %table.table.name, collection = %table.map.collection, rows = n_rows, "copied a table");
    }
    Ok((consistent_point, rest))
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
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(sink.write_copy_part(batches)));
    match written {
        Err(SinkError::Lost(message)) => {
            *kept = Some(SinkError::Lost(message.clone()));
            Err(SinkError::Lost(message))
        }
        other => other,
    }
}
