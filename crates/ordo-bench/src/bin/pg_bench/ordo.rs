//! The `ordo serve --pg-table` process: started on a fresh data directory (a
//! first start: it creates the slot and copies the table), its copy timed from
//! its own log line, its follower read from `/v1/health`.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hyper::Method;
use ordo_bench::live::http::HttpConnection;
use ordo_bench::live::serve_process::stop_gracefully;
use ordo_bench::live::Result;
use ordo_test_kit::postgres::{PostgresServer, SOCKET_PORT};

use crate::postgres::{DATABASE, PUBLICATION, SLOT};
use crate::updates::TABLE;

/// What `ordo serve` prints once the copy is done, before it listens (docs/POSTGRES.md, "Start").
const FOLLOWING_MARKER: &str = "ordo: following PostgreSQL";
/// The copy's progress lines (one per 100 000 rows), shown as they come.
const COPY_PROGRESS_MARKER: &str = "ordo: copying";
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// When the server's stdout reader saw the following line. The reader is a
/// plain `fn` (`wait_for_address` takes no closure), hence a static; one
/// server per run.
static FOLLOWING_AT: OnceLock<Instant> = OnceLock::new();

fn on_server_line(line: &str) {
    if line.starts_with(FOLLOWING_MARKER) {
        let _ = FOLLOWING_AT.set(Instant::now());
    }
    if line.starts_with(FOLLOWING_MARKER) || line.starts_with(COPY_PROGRESS_MARKER) || line.contains("ERROR") {
        println!("  [ordo serve] {line}");
    }
}

/// Checked before anything is started, so a missing binary fails at once.
pub fn check_binary(binary: &Path) -> Result<()> {
    if binary.is_file() {
        return Ok(());
    }
    Err(format!(
        "no `ordo` binary at {}: build it with `cargo build --release -p ordo-server --bin ordo`, or pass --ordo-bin PATH",
        binary.display()
    )
    .into())
}

/// `ordo serve` started by us: stopped (SIGINT, then SIGKILL) and its data
/// directory removed when dropped.
pub struct OrdoProcess {
    child: Child,
    dir: PathBuf,
    pub authority: String,
    /// From the start of the process to the following line: the first start's
    /// copy (in cluster mode, to the follower streaming: `Health::wait_streaming`).
    pub copy_seconds: f64,
    pub started: Instant,
}

impl OrdoProcess {
    /// Starts `binary` following the room table of `pg` and waits until it
    /// listens (after the copy); `rows` sizes the wait.
    pub fn start(binary: &Path, pg: &PostgresServer, rows: u64, cluster: Option<&str>) -> Result<OrdoProcess> {
        check_binary(binary)?;
        let dir = std::env::temp_dir().join(format!("ordo-pg-bench-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        let password_file = dir.join("pg-password");
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&password_file)?;
        file.write_all(pg.password.as_bytes())?;
        let mut command = Command::new(binary);
        command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(dir.join("data"));
        command.arg("--pg-host").arg(pg.socket_dir()).args(["--pg-port", &SOCKET_PORT.to_string()]);
        command.args(["--pg-user", &pg.user, "--pg-database", DATABASE, "--pg-publication", PUBLICATION]);
        command.args(["--pg-slot", SLOT, "--pg-table", TABLE]).arg("--pg-password-file").arg(&password_file);
        if let Some(url) = cluster {
            // A stream of its own per run, so that no earlier run's entries are applied.
            let stream = format!("PG_BENCH_{}", std::process::id());
            command.args(["--cluster", url, "--stream", &stream, "--stream-replicas", "1", "--node-name", "pg-bench"]);
        }
        command.stdin(Stdio::null()).stderr(Stdio::inherit());
        let started = Instant::now();
        let spawned = command.stdout(Stdio::piped()).spawn();
        let child = spawned.map_err(|error| format!("cannot start {}: {error}", binary.display()))?;
        let mut server = OrdoProcess { child, dir, authority: String::new(), copy_seconds: 0.0, started };
        // A copy below 10 000 rows/s on the slowest machine is a failure worth seeing.
        let timeout = Duration::from_secs(60 + rows / 10_000);
        server.authority = ordo_test_kit::server::wait_for_address(&mut server.child, timeout, on_server_line)
            .map_err(|error| format!("`{} serve`: {error}", binary.display()))?;
        if cluster.is_none() {
            // In cluster mode the node listens first, then takes the follower lease and copies.
            let following_at =
                FOLLOWING_AT.get().ok_or("`ordo serve` listens without a `following PostgreSQL` line")?;
            server.copy_seconds = following_at.duration_since(started).as_secs_f64();
        }
        Ok(server)
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }
}

impl Drop for OrdoProcess {
    fn drop(&mut self) {
        stop_gracefully(&mut self.child, STOP_TIMEOUT);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The follower's figures at one moment (`/v1/health`'s `postgres` object).
#[derive(Clone, Copy, Debug)]
pub struct FollowerSample {
    pub at: Instant,
    pub transactions_applied: u64,
    pub lag_bytes: u64,
    pub lag_seconds: f64,
}

/// Reads `/v1/health` over one keep-alive connection.
pub struct Health {
    connection: HttpConnection,
}

impl Health {
    pub async fn connect(authority: &str) -> Result<Health> {
        Ok(Health { connection: HttpConnection::connect(authority).await? })
    }

    /// The follower's figures; an error if it stopped (`failed`, with its reason).
    pub async fn sample(&mut self) -> Result<FollowerSample> {
        let reply = self.connection.request(Method::GET, "/v1/health", Vec::new(), None).await?;
        let at = Instant::now();
        if reply.status != 200 {
            return Err(format!("GET /v1/health: HTTP {}: {}", reply.status, reply.text()).into());
        }
        let health: serde_json::Value = serde_json::from_slice(&reply.body)?;
        let postgres = &health["postgres"];
        if postgres["state"] == "failed" {
            return Err(format!("the follower stopped: {}", postgres["error"]).into());
        }
        let number =
            |key: &str| postgres[key].as_u64().ok_or_else(|| format!("/v1/health without postgres.{key}: {health}"));
        Ok(FollowerSample {
            at,
            transactions_applied: number("transactions_applied")?,
            lag_bytes: number("lag_bytes")?,
            lag_seconds: postgres["lag_seconds"].as_f64().unwrap_or(0.0),
        })
    }

    /// Polls until the follower streams (its copy done), at most `timeout`;
    /// returns when it saw it.
    pub async fn wait_streaming(&mut self, timeout: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            let reply = self.connection.request(Method::GET, "/v1/health", Vec::new(), None).await?;
            let at = Instant::now();
            let health: serde_json::Value = serde_json::from_slice(&reply.body)?;
            match health["postgres"]["state"].as_str() {
                Some("streaming") => return Ok(at),
                Some("failed") => return Err(format!("the follower stopped: {}", health["postgres"]["error"]).into()),
                _ if at > deadline => {
                    return Err(format!("the follower does not stream after {timeout:?}: {health}").into())
                }
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    /// Polls until the follower has applied `transactions` in all, at most `timeout`.
    pub async fn wait_applied(&mut self, transactions: u64, timeout: Duration) -> Result<FollowerSample> {
        let deadline = Instant::now() + timeout;
        loop {
            let sample = self.sample().await?;
            if sample.transactions_applied >= transactions {
                return Ok(sample);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "Ordo applied {} of {transactions} transactions within {timeout:?}",
                    sample.transactions_applied
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
