//! The PostgreSQL side: a throw-away server (`ordo_test_kit::postgres`, as the
//! follower's tests start theirs: a temporary directory, a Unix socket, no TCP
//! port), the room table filled in it, and connections for the writers.

use std::time::Instant;

use ordo_bench::live::Result;
use ordo_pgsource::{ConnectConfig, Connection, Host, Mode};
use ordo_test_kit::postgres::{PostgresServer, SOCKET_PORT};

use crate::updates::TABLE;

pub const PUBLICATION: &str = "ordo_bench";
pub const SLOT: &str = "ordo_bench";
pub const DATABASE: &str = "postgres";
/// Rows inserted per statement of the fill: a progress line each.
const FILL_CHUNK_ROWS: u64 = 100_000;

/// Starts the server; a missing installation says how to install one.
pub fn start() -> Result<PostgresServer> {
    let started = Instant::now();
    let server = PostgresServer::start().map_err(|error| {
        let error = error.trim_end();
        // No binaries found, or none where ORDO_POSTGRES_BIN_DIR points.
        if error.contains("initdb") {
            format!(
                "cannot start PostgreSQL: {error}\n(scripts/install-postgres.sh installs PostgreSQL 15 with apt-get)"
            )
        } else {
            format!("cannot start PostgreSQL: {error}")
        }
    })?;
    let version = server.psql("SHOW server_version")?;
    println!(
        "postgres: {version} in {} (Unix socket only, fsync off), up after {:.1} s",
        server.socket_dir().display(),
        started.elapsed().as_secs_f64()
    );
    Ok(server)
}

/// Creates the room table and its publication and fills it with `rows` rows
/// (ids `r0`, `r1`, ...; recency below 1 000, so that every update the
/// benchmark sends, stamped with the process clock, goes to the top; row `n`'s
/// `owner` is `n % owners`, one owner per subscriber).
pub fn create_and_fill(server: &PostgresServer, rows: u64, owners: usize) -> Result<()> {
    server.psql(&format!(
        "CREATE TABLE {TABLE} (id text PRIMARY KEY, name text, recency bigint, last_seq bigint, preview text, owner bigint);
         CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE};"
    ))?;
    let started = Instant::now();
    let mut filled = 0;
    while filled < rows {
        let end = (filled + FILL_CHUNK_ROWS).min(rows);
        server.psql(&format!(
            "INSERT INTO {TABLE}
             SELECT 'r' || n, 'room ' || n, n % 1000, 0, 'the last message of room ' || n || ', as a list shows it', n % {owners}
             FROM generate_series({filled}, {}) AS n",
            end - 1
        ))?;
        filled = end;
        println!("  fill: {filled} of {rows} rows in PostgreSQL, {:.1} s", started.elapsed().as_secs_f64());
    }
    // The copy's progress line gives an ETA from the planner's row estimate.
    server.psql(&format!("VACUUM ANALYZE {TABLE}"))?;
    Ok(())
}

/// How the writers (and `ordo serve`, through its flags) reach the server.
pub fn connect_config(server: &PostgresServer) -> ConnectConfig {
    ConnectConfig {
        host: Host::UnixSocketDir(server.socket_dir().to_path_buf()),
        port: SOCKET_PORT,
        user: server.user.clone(),
        password: Some(server.password.clone()),
        database: DATABASE.to_owned(),
        application_name: "pg-bench".to_owned(),
        tls: None,
    }
}

/// A plain SQL connection for a writer.
pub async fn connect(config: &ConnectConfig) -> Result<Connection> {
    Connection::connect(config, Mode::Sql).await.map_err(|error| format!("connecting to PostgreSQL: {error}").into())
}
