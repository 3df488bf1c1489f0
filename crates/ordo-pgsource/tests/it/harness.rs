//! What the tests share: a server with a publication, connections to it, and a
//! mirror that applies the stream as a follower would.

use std::collections::BTreeMap;

use ordo_pgsource::catalog::{describe_tables, Table, TableName, UnsupportedColumns};
use ordo_pgsource::copy::create_slot_and_copy;
use std::time::Duration;

use ordo_pgsource::stream::{Backoff, Layout, StreamConfig, DEFAULT_STATUS_INTERVAL};
use ordo_pgsource::{
    Change, ChangeStream, ConnectConfig, Connection, Error, Field, Host, Lsn, Mode, Transaction, Value,
};
use ordo_test_kit::postgres::{PostgresServer, SOCKET_PORT};

pub const SLOT: &str = "ordo_slot";
pub const PUBLICATION: &str = "ordo_pub";

pub fn connect_config(server: &PostgresServer) -> ConnectConfig {
    ConnectConfig {
        host: Host::UnixSocketDir(server.socket_dir().to_path_buf()),
        port: SOCKET_PORT,
        user: server.user.clone(),
        password: Some(server.password.clone()),
        database: "postgres".into(),
        application_name: "ordo-pgsource-test".into(),
        tls: None,
    }
}

pub async fn replication_connection(server: &PostgresServer) -> Result<Connection, Error> {
    Connection::connect(&connect_config(server), Mode::Replication).await
}

pub fn stream_config(max_transaction_changes: usize) -> StreamConfig {
    StreamConfig {
        slot: SLOT.into(),
        publication: PUBLICATION.into(),
        max_transaction_changes,
        status_interval: DEFAULT_STATUS_INTERVAL,
        unsupported_columns: UnsupportedColumns::Refuse,
    }
}

pub async fn describe(connection: &mut Connection, names: &[&str]) -> Result<Vec<Table>, Error> {
    let names: Vec<TableName> = names.iter().map(|name| TableName::parse(name)).collect();
    describe_tables(connection, PUBLICATION, &names, UnsupportedColumns::Refuse).await
}

/// A row by column name: a column added in PostgreSQL is missing (null) in
/// the rows written before it, and a dropped one is removed from every row.
pub type Row = BTreeMap<String, Value>;

/// Rows by primary key, per followed table: what a follower holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mirror {
    /// Rows by their rendered primary key (values have no total order: floats).
    pub tables: Vec<BTreeMap<String, Row>>,
    /// The end of the last transaction applied (the position stored with the data).
    pub applied: Lsn,
}

impl Mirror {
    pub fn new(n_tables: usize) -> Mirror {
        Mirror { tables: vec![BTreeMap::new(); n_tables], applied: Lsn(0) }
    }

    pub fn copy_row(&mut self, tables: &[Table], table: usize, values: Vec<Value>) {
        let mut key: Vec<(usize, Value)> = tables[table]
            .columns
            .iter()
            .zip(&values)
            .filter_map(|(column, value)| Some((column.key_position?, value.clone())))
            .collect();
        key.sort_by_key(|(position, _)| *position);
        let key: Vec<Value> = key.into_iter().map(|(_, value)| value).collect();
        let row = tables[table].columns.iter().map(|column| column.name.clone()).zip(values).collect();
        assert!(self.tables[table].insert(render_row(&key), row).is_none(), "a row copied twice");
    }

    /// Applies one transaction whole, as one batch would be.
    pub fn apply(&mut self, transaction: &Transaction) {
        assert!(transaction.end_lsn > self.applied, "a transaction applied twice: {transaction:?}");
        for change in &transaction.changes {
            self.apply_change(change);
        }
        self.applied = transaction.end_lsn;
    }

    fn apply_change(&mut self, change: &Change) {
        match change {
            Change::Insert { layout, row } => {
                self.drop_columns_not_in(layout);
                let key = render_row(&layout.key_of(row).unwrap());
                let values = layout.columns.iter().zip(row).map(|((name, _), field)| match field {
                    Field::Value(value) => (name.clone(), value.clone()),
                    Field::UnchangedToast => panic!("an insert with an unchanged TOAST value"),
                });
                self.tables[layout.table].insert(key, values.collect());
            }
            Change::Update { layout, old_key, row } => {
                self.drop_columns_not_in(layout);
                let key = render_row(&layout.key_of(row).unwrap());
                let rows = &mut self.tables[layout.table];
                let old_key = old_key.as_ref().map(|old_key| render_row(old_key));
                let mut merged =
                    rows.remove(old_key.as_ref().unwrap_or(&key)).expect("an update of a row the mirror lacks");
                for ((name, _), field) in layout.columns.iter().zip(row) {
                    match field {
                        Field::Value(value) => {
                            merged.insert(name.clone(), value.clone());
                        }
                        Field::UnchangedToast => {
                            assert!(merged.contains_key(name), "an unchanged value the mirror lacks")
                        }
                    }
                }
                rows.insert(key, merged);
            }
            Change::Delete { layout, key } => {
                assert!(
                    self.tables[layout.table].remove(&render_row(key)).is_some(),
                    "a delete of a row the mirror lacks"
                );
            }
            Change::Truncate { tables } => tables.iter().for_each(|table| self.tables[*table].clear()),
        }
    }

    /// A column dropped in PostgreSQL leaves every row.
    fn drop_columns_not_in(&mut self, layout: &Layout) {
        for row in self.tables[layout.table].values_mut() {
            row.retain(|name, _| layout.columns.iter().any(|(column, _)| column == name));
        }
    }
}

/// Creates the slot, copies `names` into a new mirror and starts the stream.
pub async fn follow(server: &PostgresServer, names: &[&str], max_changes: usize) -> (ChangeStream, Mirror, Vec<Table>) {
    let mut connection = replication_connection(server).await.unwrap();
    let tables = describe(&mut connection, names).await.unwrap();
    let mut mirror = Mirror::new(tables.len());
    let consistent_point = create_slot_and_copy(&mut connection, SLOT, &tables, |table, row| {
        mirror.copy_row(&tables, table, row);
        Ok(())
    })
    .await
    .unwrap();
    mirror.applied = consistent_point;
    let stream =
        ChangeStream::start(connection, tables.clone(), stream_config(max_changes), consistent_point).await.unwrap();
    (stream, mirror, tables)
}

/// Resumes the stream from what the mirror applied, as a restarted follower
/// does: transient refusals (the slot still held by the walsender of the
/// connection that just ended, a server still starting) are retried with backoff.
pub async fn resume(server: &PostgresServer, tables: &[Table], from: Lsn) -> Result<ChangeStream, Error> {
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
    for _ in 0..RESUME_ATTEMPTS {
        let started = match replication_connection(server).await {
            Ok(connection) => ChangeStream::start(connection, tables.to_vec(), stream_config(1_000_000), from).await,
            Err(error) => Err(error),
        };
        match started {
            Err(error) if error.is_transient() => tokio::time::sleep(backoff.next_wait()).await,
            other => return other,
        }
    }
    panic!("the stream did not resume in {RESUME_ATTEMPTS} attempts");
}

/// Enough for a loaded machine (about a minute).
const RESUME_ATTEMPTS: usize = 130;

/// A row as `psql --no-align` prints it: columns joined by `|`, NULL as nothing.
pub fn render_row(values: &[Value]) -> String {
    let columns: Vec<String> = values
        .iter()
        .map(|value| match value {
            Value::Null => String::new(),
            Value::Bool(value) => if *value { "t" } else { "f" }.to_owned(),
            Value::Int(value) => value.to_string(),
            Value::Float(value) => value.to_string(),
            Value::Text(text) | Value::Json(text) => text.clone(),
            Value::TimestampMicros(micros) => micros.to_string(),
            Value::DateDays(days) => days.to_string(),
        })
        .collect();
    columns.join("|")
}

/// The mirror's rows of one table, their `columns` rendered, sorted.
pub fn mirror_lines(mirror: &Mirror, table: usize, columns: &[&str]) -> Vec<String> {
    let render = |row: &Row| {
        let values: Vec<Value> =
            columns.iter().map(|column| row.get(*column).cloned().unwrap_or(Value::Null)).collect();
        render_row(&values)
    };
    let mut lines: Vec<String> = mirror.tables[table].values().map(render).collect();
    lines.sort();
    lines
}

/// PostgreSQL's answer to `sql`, one line a row, sorted.
pub fn postgres_lines(server: &PostgresServer, sql: &str) -> Vec<String> {
    let output = server.psql(sql).unwrap();
    let mut lines: Vec<String> = output.lines().map(str::to_owned).filter(|line| !line.is_empty()).collect();
    lines.sort();
    lines
}
