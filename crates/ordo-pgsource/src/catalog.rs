//! What the source checks in PostgreSQL's catalog before it follows anything:
//! the publication exists, every followed table exists, is in it, has a primary
//! key and only columns of followed types. Each failure is a typed error naming
//! the table and column, raised at start rather than at the first change.

use postgres_protocol::escape::escape_literal;

use crate::error::{Error, SQLSTATE_DUPLICATE_OBJECT};
use crate::value::ColumnType;
use crate::wire::Connection;

/// A table to follow, by schema and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

impl TableName {
    /// `schema.name`, or `name` in schema `public`.
    pub fn parse(text: &str) -> TableName {
        match text.split_once('.') {
            Some((schema, name)) => TableName { schema: schema.into(), name: name.into() },
            None => TableName { schema: "public".into(), name: text.into() },
        }
    }

    /// The name as SQL, each part quoted (`"public"."rooms"`).
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_identifier(&self.schema), quote_identifier(&self.name))
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// A column of a followed table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    /// `None` for a column of a type that is not followed (kept only when the
    /// configuration skips such columns).
    pub column_type: Option<ColumnType>,
    /// Its place in the primary key (0 for the first key column), if it is in it.
    pub key_position: Option<usize>,
}

/// A followed table as the catalog describes it at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub name: TableName,
    pub oid: u32,
    pub columns: Vec<Column>,
    /// The primary key's column names, in key order.
    pub key_columns: Vec<String>,
    /// PostgreSQL's estimate of the row count (`pg_class.reltuples`), for the
    /// copy's progress line; `None` before the table was first analyzed.
    pub estimated_rows: Option<u64>,
}

/// Whether a column of an unsupported type stops the start (the default) or is
/// left out of the followed fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnsupportedColumns {
    #[default]
    Refuse,
    Skip,
}

/// Quotes an SQL identifier (`"a""b"`).
pub fn quote_identifier(name: &str) -> String {
    postgres_protocol::escape::escape_identifier(name)
}

/// Checks the publication and every table, and describes each table.
pub async fn describe_tables(
    connection: &mut Connection,
    publication: &str,
    tables: &[TableName],
    unsupported: UnsupportedColumns,
) -> Result<Vec<Table>, Error> {
    if !publication_exists(connection, publication).await? {
        return Err(Error::MissingPublication { publication: publication.into() });
    }
    let mut described = Vec::with_capacity(tables.len());
    for table in tables {
        described.push(describe_table(connection, publication, table, unsupported).await?);
    }
    Ok(described)
}

/// Whether a publication of that name exists in the connection's database.
pub async fn publication_exists(connection: &mut Connection, publication: &str) -> Result<bool, Error> {
    let rows = connection
        .query_rows(&format!("SELECT 1 FROM pg_publication WHERE pubname = {}", escape_literal(publication)))
        .await?;
    Ok(!rows.is_empty())
}

/// `CREATE PUBLICATION <publication> FOR TABLE <tables>`, every name quoted.
/// PostgreSQL allows it to a role with CREATE on the database that owns every
/// table; its refusal is [`Error::CannotCreatePublication`]. A publication of
/// that name created meanwhile by someone else counts as created: the tables
/// it covers are checked afterwards as for any existing publication.
pub async fn create_publication(
    connection: &mut Connection,
    publication: &str,
    tables: &[TableName],
) -> Result<(), Error> {
    let table_list = tables.iter().map(TableName::quoted).collect::<Vec<_>>().join(", ");
    let sql = format!("CREATE PUBLICATION {} FOR TABLE {table_list}", quote_identifier(publication));
    match connection.execute(&sql).await {
        Err(Error::Server(error)) if error.code == SQLSTATE_DUPLICATE_OBJECT => Ok(()),
        Err(Error::Server(error)) => {
            Err(Error::CannotCreatePublication { publication: publication.into(), cause: error })
        }
        other => other,
    }
}

async fn describe_table(
    connection: &mut Connection,
    publication: &str,
    table: &TableName,
    unsupported: UnsupportedColumns,
) -> Result<Table, Error> {
    let (oid, estimated_rows) = table_oid(connection, publication, table).await?;
    let key_columns = primary_key(connection, oid).await?;
    if key_columns.is_empty() {
        return Err(Error::NoPrimaryKey { table: table.to_string() });
    }
    let rows = connection
        .query_rows(&format!(
            "SELECT attname, atttypid, format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = {oid} AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ))
        .await?;
    let mut columns = Vec::with_capacity(rows.len());
    for row in rows {
        let [Some(name), Some(type_oid), Some(type_name)] = <[_; 3]>::try_from(row).map_err(|_| catalog_shape())?
        else {
            return Err(catalog_shape());
        };
        let column_type = ColumnType::from_oid(type_oid.parse().map_err(|_| catalog_shape())?);
        let key_position = key_columns.iter().position(|key| *key == name);
        if column_type.is_none() && (unsupported == UnsupportedColumns::Refuse || key_position.is_some()) {
            return Err(Error::UnsupportedType { table: table.to_string(), column: name, type_name });
        }
        columns.push(Column { name, column_type, key_position });
    }
    Ok(Table { name: table.clone(), oid, columns, key_columns, estimated_rows })
}

/// The table's oid and estimated row count, once it is known to exist, to be a
/// table, to be in the publication and to identify its rows by their primary
/// key (or whole).
async fn table_oid(
    connection: &mut Connection,
    publication: &str,
    table: &TableName,
) -> Result<(u32, Option<u64>), Error> {
    let rows = connection
        .query_rows(&format!(
            "SELECT c.oid, c.relreplident, c.reltuples::int8, EXISTS (SELECT 1 FROM pg_publication_tables p \
               WHERE p.pubname = {} AND p.schemaname = n.nspname AND p.tablename = c.relname) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = {} AND c.relname = {} AND c.relkind IN ('r', 'p')",
            escape_literal(publication),
            escape_literal(&table.schema),
            escape_literal(&table.name)
        ))
        .await?;
    let Some([Some(oid), Some(replica_identity), Some(estimated_rows), Some(published)]) =
        rows.into_iter().next().map(<[_; 4]>::try_from).transpose().map_err(|_| catalog_shape())?
    else {
        return Err(Error::TableNotFound { table: table.to_string() });
    };
    if published != "t" {
        return Err(Error::TableNotPublished { table: table.to_string(), publication: publication.into() });
    }
    // `n` (nothing) and `i` (another index) would send deletes without the primary key.
    if replica_identity != "d" && replica_identity != "f" {
        return Err(Error::NoPrimaryKey { table: format!("{table} (REPLICA IDENTITY is not DEFAULT or FULL)") });
    }
    // -1 until the table was first analyzed (vacuumed, or `ANALYZE`d).
    let estimated_rows = estimated_rows.parse::<i64>().ok().and_then(|rows| u64::try_from(rows).ok());
    Ok((oid.parse().map_err(|_| catalog_shape())?, estimated_rows))
}

/// Checks that every followed table is still the table described at start
/// (not dropped, not dropped and created again: the same oid) and still in the
/// publication. pgoutput says nothing of either: a table removed from the
/// publication simply stops having changes sent (from the position of the
/// `ALTER PUBLICATION` on), and a dropped one has none. So the follower asks:
/// on each (re)connection and every few seconds while streaming.
pub async fn check_still_followed(
    connection: &mut Connection,
    publication: &str,
    tables: &[Table],
) -> Result<(), Error> {
    let gone = |table: &Table, reason: String| Error::NoLongerFollowed {
        table: table.name.to_string(),
        publication: publication.into(),
        reason,
    };
    for table in tables {
        let rows = connection
            .query_rows(&format!(
                "SELECT c.oid, EXISTS (SELECT 1 FROM pg_publication_tables p \
                   WHERE p.pubname = {} AND p.schemaname = n.nspname AND p.tablename = c.relname) \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = {} AND c.relname = {} AND c.relkind IN ('r', 'p')",
                escape_literal(publication),
                escape_literal(&table.name.schema),
                escape_literal(&table.name.name)
            ))
            .await?;
        let Some([Some(oid), Some(published)]) =
            rows.into_iter().next().map(<[_; 2]>::try_from).transpose().map_err(|_| catalog_shape())?
        else {
            return Err(gone(table, "was dropped".into()));
        };
        if oid.parse::<u32>().map_err(|_| catalog_shape())? != table.oid {
            return Err(gone(table, "was dropped and created again".into()));
        }
        if published != "t" {
            return Err(gone(
                table,
                format!("is no longer in the publication `{publication}` (or the publication was dropped)"),
            ));
        }
    }
    Ok(())
}

/// The server's flushed WAL end (`pg_current_wal_flush_lsn()`): how far a
/// walsender will stream. Not on a standby (PostgreSQL refuses it there).
pub async fn wal_flush_end(connection: &mut Connection) -> Result<crate::lsn::Lsn, Error> {
    let rows = connection.query_rows("SELECT pg_current_wal_flush_lsn()").await?;
    rows.into_iter()
        .next()
        .and_then(|row| row.into_iter().next().flatten())
        .and_then(|text| crate::lsn::Lsn::parse(&text))
        .ok_or_else(catalog_shape)
}

/// The text of each column's *missing value*, in the order of `columns`:
/// what the rows that existed when the column was added read. `ADD COLUMN ...
/// DEFAULT` with a default that is not volatile keeps it in the catalog
/// (`pg_attribute.attmissingval`) instead of writing those rows, so the stream
/// carries nothing for them. `None` where there is none.
pub async fn missing_values(
    connection: &mut Connection,
    table_oid: u32,
    columns: &[String],
) -> Result<Vec<Option<String>>, Error> {
    let mut values = Vec::with_capacity(columns.len());
    for column in columns {
        // A one-element array of the column's type; its element as text.
        let rows = connection
            .query_rows(&format!(
                "SELECT (attmissingval::text::text[])[1] FROM pg_attribute \
                 WHERE attrelid = {table_oid} AND attname = {} AND atthasmissing AND NOT attisdropped",
                escape_literal(column)
            ))
            .await?;
        values.push(rows.into_iter().next().and_then(|row| row.into_iter().next().flatten()));
    }
    Ok(values)
}

/// Whether a foreign key of the table `table_oid` is exactly the one column
/// `column` and points at the table `target_oid` (any of its unique keys).
/// For `ordo serve`'s `ref` columns: a declared reference that PostgreSQL does
/// not enforce is worth a warning, since nothing then keeps the ids in step.
pub async fn has_foreign_key(
    connection: &mut Connection,
    table_oid: u32,
    column: &str,
    target_oid: u32,
) -> Result<bool, Error> {
    let rows = connection
        .query_rows(&format!(
            "SELECT 1 FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid \
             WHERE c.contype = 'f' AND c.conrelid = {table_oid} AND c.confrelid = {target_oid} \
               AND a.attname = {} AND c.conkey = ARRAY[a.attnum]::int2[]",
            escape_literal(column)
        ))
        .await?;
    Ok(!rows.is_empty())
}

/// The primary key's column names in key order; empty when there is none.
async fn primary_key(connection: &mut Connection, oid: u32) -> Result<Vec<String>, Error> {
    let rows = connection
        .query_rows(&format!(
            "SELECT a.attname FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, position) \
             JOIN pg_attribute a ON a.attrelid = {oid} AND a.attnum = k.attnum \
             WHERE i.indrelid = {oid} AND i.indisprimary ORDER BY k.position"
        ))
        .await?;
    rows.into_iter().map(|row| row.into_iter().next().flatten().ok_or_else(catalog_shape)).collect()
}

fn catalog_shape() -> Error {
    Error::Protocol("a catalog answer of an unexpected shape".into())
}
