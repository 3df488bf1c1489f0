//! The consistent start: the replication slot is created inside a repeatable-read
//! transaction of the replication connection with `(SNAPSHOT 'use')`, so that
//! transaction sees exactly the data up to the slot's consistent point. Every
//! followed table is read in it, and the stream then continues from that point:
//! each change is either in the copy or in the stream, never both, never neither.

use postgres_protocol::escape::escape_literal;

use crate::catalog::{quote_identifier, Table};
use crate::error::{Error, SQLSTATE_UNDEFINED_OBJECT};
use crate::lsn::Lsn;
use crate::value::{parse_value, Value};
use crate::wire::Connection;

/// Creates the slot `slot` (dropping a leftover one of that name first: a slot
/// whose copy did not finish cannot be resumed, its snapshot died with the
/// connection) and reads every table at its snapshot. `on_row(table_index, row)`
/// gets each row, its values in the order of `tables[table_index].columns`
/// (`Value::Null` for a column not followed). Returns the slot's consistent
/// point: where [`crate::stream::ChangeStream::start`] continues.
pub async fn create_slot_and_copy<F>(
    connection: &mut Connection,
    slot: &str,
    tables: &[Table],
    on_row: F,
) -> Result<Lsn, Error>
where
    F: FnMut(usize, Vec<Value>) -> Result<(), Error>,
{
    drop_slot_if_present(connection, slot).await?;
    let create = format!("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'use')", quote_identifier(slot));
    copy_at_new_slot(connection, &create, tables, on_row).await
}

/// Copies `tables` at the snapshot of a *temporary* slot made for it (named
/// after the connection's backend, dropped by PostgreSQL when the connection
/// ends): a table newly followed beside a running slot. Returns the temporary
/// slot's consistent point: transactions that commit before it are in the
/// copy, those that commit after it are not — whatever slot streams them.
pub async fn copy_at_temporary_slot<F>(connection: &mut Connection, tables: &[Table], on_row: F) -> Result<Lsn, Error>
where
    F: FnMut(usize, Vec<Value>) -> Result<(), Error>,
{
    let slot = format!("ordo_copy_{}", connection.backend_pid);
    let create =
        format!("CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput (SNAPSHOT 'use')", quote_identifier(&slot));
    copy_at_new_slot(connection, &create, tables, on_row).await
}

/// Runs `create` (a `CREATE_REPLICATION_SLOT ... (SNAPSHOT 'use')`) in a
/// repeatable-read transaction and reads every table at its snapshot.
async fn copy_at_new_slot<F>(
    connection: &mut Connection,
    create: &str,
    tables: &[Table],
    mut on_row: F,
) -> Result<Lsn, Error>
where
    F: FnMut(usize, Vec<Value>) -> Result<(), Error>,
{
    connection.execute("BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ").await?;
    let created = connection.query_rows(create).await?;
    let consistent_point = created
        .first()
        .and_then(|row| row.get(1))
        .and_then(|point| Lsn::parse(point.as_deref()?))
        .ok_or_else(|| Error::Protocol("CREATE_REPLICATION_SLOT gave no consistent point".into()))?;
    for (table_index, table) in tables.iter().enumerate() {
        copy_table(connection, table, |row| on_row(table_index, row)).await?;
    }
    connection.execute("COMMIT").await?;
    Ok(consistent_point)
}

/// Drops the slot `slot` if it exists (waiting while another connection still
/// uses it would hide a second follower: that is an error instead).
pub async fn drop_slot_if_present(connection: &mut Connection, slot: &str) -> Result<(), Error> {
    let present = connection
        .query_rows(&format!("SELECT 1 FROM pg_replication_slots WHERE slot_name = {}", escape_literal(slot)))
        .await?;
    if present.is_empty() {
        return Ok(());
    }
    match connection.execute(&format!("DROP_REPLICATION_SLOT {}", quote_identifier(slot))).await {
        Err(Error::Server(error)) if error.code == SQLSTATE_UNDEFINED_OBJECT => Ok(()),
        other => other,
    }
}

/// Reads one table, row by row, parsing each followed column.
async fn copy_table<F>(connection: &mut Connection, table: &Table, mut on_row: F) -> Result<(), Error>
where
    F: FnMut(Vec<Value>) -> Result<(), Error>,
{
    let select_list: Vec<String> = table
        .columns
        .iter()
        .map(|column| match column.column_type {
            Some(_) => quote_identifier(&column.name),
            None => "NULL".to_owned(),
        })
        .collect();
    let sql = format!("SELECT {} FROM {}", select_list.join(", "), table.name.quoted());
    connection
        .simple_query(&sql, |row| {
            if row.len() != table.columns.len() {
                return Err(Error::Protocol(format!("a row of {} columns from {}", row.len(), table.name)));
            }
            let values =
                table
                    .columns
                    .iter()
                    .zip(row)
                    .map(|(column, text)| match (column.column_type, text) {
                        (Some(column_type), Some(text)) => parse_value(column_type, text).map_err(|error| {
                            Error::Value { table: table.name.to_string(), column: column.name.clone(), error }
                        }),
                        _ => Ok(Value::Null),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
            on_row(values)
        })
        .await
}

/// The progress line of a table's copy: rows so far, the rate, and an ETA
/// when PostgreSQL has an estimate of the table's size.
pub fn progress_line(table: &Table, rows_copied: u64, elapsed: std::time::Duration) -> String {
    let seconds = elapsed.as_secs_f64();
    let rate = if seconds > 0.0 { rows_copied as f64 / seconds } else { 0.0 };
    let mut line = format!("copying {}: {rows_copied} rows", table.name);
    if let Some(estimate) = table.estimated_rows.filter(|estimate| *estimate > 0) {
        line.push_str(&format!(" of about {estimate}"));
        if rate > 0.0 && estimate > rows_copied {
            line.push_str(&format!(", {rate:.0} rows/s, about {:.0} s left", (estimate - rows_copied) as f64 / rate));
            return line;
        }
    }
    line.push_str(&format!(", {rate:.0} rows/s"));
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::TableName;
    use std::time::Duration;

    fn table(estimated_rows: Option<u64>) -> Table {
        Table { name: TableName::parse("rooms"), oid: 1, columns: Vec::new(), key_columns: Vec::new(), estimated_rows }
    }

    #[test]
    fn the_progress_line_gives_the_rate_and_what_is_left() {
        assert_eq!(
            progress_line(&table(Some(1000)), 250, Duration::from_secs(5)),
            "copying public.rooms: 250 rows of about 1000, 50 rows/s, about 15 s left"
        );
        assert_eq!(
            progress_line(&table(None), 250, Duration::from_secs(5)),
            "copying public.rooms: 250 rows, 50 rows/s"
        );
        assert_eq!(
            progress_line(&table(Some(100)), 250, Duration::from_secs(5)),
            "copying public.rooms: 250 rows of about 100, 50 rows/s"
        );
        assert_eq!(
            progress_line(&table(Some(100)), 0, Duration::ZERO),
            "copying public.rooms: 0 rows of about 100, 0 rows/s"
        );
    }
}
