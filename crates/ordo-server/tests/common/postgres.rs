//! The tests' side of following PostgreSQL: a throw-away server, the
//! `--pg-*` arguments that follow its tables, and waits on the follower's
//! state as `/v1/health` reports it.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ordo_test_kit::postgres::{PostgresServer, SOCKET_PORT};
use serde_json::{json, Value};

use super::{ordo_binary, Server, StartOptions};

pub const PUBLICATION: &str = "ordo_pub";
pub const SLOT: &str = "ordo_slot";
/// How long a transaction may take to show in Ordo on a loaded machine; the
/// waits end as soon as it shows.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(60);

pub fn postgres() -> PostgresServer {
    PostgresServer::start().unwrap_or_else(|error| panic!("starting PostgreSQL: {error}"))
}

/// The `--pg-*` arguments that follow `tables` of `pg`, its password in `dir/pg-password`.
pub fn follow_args(pg: &PostgresServer, dir: &Path, tables: &[&str]) -> Vec<String> {
    let password_file = dir.join("pg-password");
    std::fs::write(&password_file, format!("{}\n", pg.password)).unwrap();
    let mut args: Vec<String> = [
        "--pg-host",
        pg.socket_dir().to_str().unwrap(),
        "--pg-port",
        &SOCKET_PORT.to_string(),
        "--pg-user",
        &pg.user,
        "--pg-database",
        "postgres",
        "--pg-publication",
        PUBLICATION,
        "--pg-slot",
        SLOT,
        "--pg-password-file",
        password_file.to_str().unwrap(),
    ]
    .iter()
    .map(|arg| arg.to_string())
    .collect();
    for table in tables {
        args.extend(["--pg-table".to_owned(), table.to_string()]);
    }
    args
}

/// Starts the follower again on `dir`'s data and checks that it resumed from
/// the position stored with the data, not from a new copy.
pub fn restart_resumed(pg: &PostgresServer, dir: &Path, tables: &[&str]) -> Server {
    let args = follow_args(pg, dir, tables);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let options = StartOptions { capture_stderr: true, ..StartOptions::default() };
    let server = Server::start_with(&dir.join("data"), &args, options);
    let lines = server.wait_for_stderr_line(|line| line.contains("following PostgreSQL"));
    let started = lines.iter().find(|line| line.contains("following PostgreSQL")).unwrap();
    assert!(started.contains("resumed=true"), "{started}");
    server
}

pub fn start_following(pg: &PostgresServer, dir: &Path, tables: &[&str]) -> Server {
    let args = follow_args(pg, dir, tables);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&dir.join("data"), &args)
}

/// The follower's `/v1/health` object.
pub fn follower_health(server: &Server) -> Value {
    server.ok("GET", "/v1/health", Value::Null)["postgres"].clone()
}

/// Waits until Ordo has applied `n` transactions since it started following.
pub fn wait_applied(server: &Server, n: u64) {
    let deadline = Instant::now() + APPLY_TIMEOUT;
    loop {
        let health = follower_health(server);
        if health["transactions_applied"].as_u64().unwrap() >= n {
            return;
        }
        assert!(Instant::now() < deadline, "transaction {n} not applied: {health}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the follower stopped for good; returns its error.
pub fn wait_failed(server: &Server) -> String {
    wait_failed_within(server, APPLY_TIMEOUT)
}

/// [`wait_failed`] with its own bound, for a failure that takes long work to reach.
pub fn wait_failed_within(server: &Server, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let health = follower_health(server);
        if health["state"] == "failed" {
            return health["error"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "the follower did not stop: {health}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ordo serve`'s output when it refuses to start; `started` when it prints
/// its listening line instead (then it is stopped).
pub fn refused_start_or_started(dir: &Path, args: &[String]) -> String {
    let mut child = Command::new(ordo_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let stderr_text = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut stdout = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok) {
        if line.contains("listening on") {
            child.kill().unwrap();
            child.wait().unwrap();
            return format!("started: {stdout}{line}");
        }
        stdout.push_str(&line);
        stdout.push('\n');
    }
    assert!(!child.wait().unwrap().success(), "exited 0: {stdout}");
    format!("{stdout}{}", stderr_text.join().unwrap())
}

/// `ordo serve`'s output when it refuses to start. One that starts instead
/// fails the test (it is stopped at its listening line, not waited for).
pub fn refused_start(dir: &Path, args: &[String]) -> String {
    let text = refused_start_or_started(dir, args);
    assert!(!text.starts_with("started: "), "{text}");
    text
}

/// The seed of a model test: `ORDO_SEED` when set (to replay a run), else the
/// clock's nanoseconds. Printed, so that a failing run can be replayed.
pub fn model_seed() -> u64 {
    let seed = std::env::var("ORDO_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (ORDO_SEED={seed} replays it)");
    seed
}

/// The rows of `sql`, a query that selects one JSON object per row
/// (`json_build_object(...)`), in PostgreSQL's order.
pub fn postgres_json_rows(pg: &PostgresServer, sql: &str) -> Vec<Value> {
    let rows = pg.psql(sql).unwrap_or_else(|error| panic!("{error}\nin {sql}"));
    rows.lines()
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line}")))
        .collect()
}

/// Ordo's answer to `query` on `collection` in the shape of
/// [`postgres_json_rows`]: each item's id and its `fields` (dotted names
/// included), a field the item does not carry read as null; in Ordo's order.
pub fn ordo_json_rows(server: &Server, collection: &str, query: Value, fields: &[&str]) -> Vec<Value> {
    let answer = server.ok("POST", &format!("/v1/collections/{collection}/query"), query);
    let items = answer["items"].as_array().unwrap_or_else(|| panic!("no items in {answer}"));
    item_rows(items, fields)
}

/// The rows of `items` (a query answer's or a subscription's, which show items
/// alike) in the shape of [`postgres_json_rows`]: each item's id and its
/// `fields` (dotted names included), a field the item does not carry read as
/// null.
pub fn item_rows(items: &[Value], fields: &[&str]) -> Vec<Value> {
    items
        .iter()
        .map(|item| {
            let mut row = json!({"id": item["id"]});
            for field in fields {
                row[*field] = item["fields"][*field].clone();
            }
            row
        })
        .collect()
}

/// A window as Ordo is asked for it: the collection, the query (`filter`,
/// `sort`, `offset`, `limit`, maybe `fields`) and the fields its rows show.
#[derive(Clone, Debug)]
pub struct OrdoWindow {
    pub collection: &'static str,
    pub query: Value,
    pub fields: &'static [&'static str],
}

impl OrdoWindow {
    /// Ordo's one-shot answer, as rows.
    pub fn query_rows(&self, server: &Server) -> Vec<Value> {
        ordo_json_rows(server, self.collection, self.query.clone(), self.fields)
    }
}

/// Windows subscribed over one WebSocket while a model test changes
/// PostgreSQL: each kept by its diffs alone (and its digest checked on every
/// frame), as a client application keeps its list.
pub struct LiveWindows {
    runtime: tokio::runtime::Runtime,
    client: super::Client,
    windows: Vec<OrdoWindow>,
    n_settled: u64,
}

impl LiveWindows {
    /// Subscribes every window (subscription `live<i>`) and reads each one's first frame.
    pub fn subscribe(server: &Server, windows: Vec<OrdoWindow>) -> LiveWindows {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut client = runtime.block_on(server.connect());
        for (index, window) in windows.iter().enumerate() {
            let mut subscribe = window.query.clone();
            subscribe["op"] = json!("subscribe");
            subscribe["sub"] = json!(format!("live{index}"));
            subscribe["collection"] = json!(window.collection);
            runtime.block_on(client.send(subscribe));
        }
        let n_windows = windows.len();
        let all_first =
            |client: &super::Client| (0..n_windows).all(|index| client.lists.contains_key(&format!("live{index}")));
        assert!(runtime.block_on(client.read_until(APPLY_TIMEOUT, all_first)), "first frames: {:?}", client.frames);
        LiveWindows { runtime, client, windows, n_settled: 0 }
    }

    /// Reads until every window has every frame of what the server applied
    /// so far: each is sent a `set_range` to its own range, which the writer
    /// thread answers (an `ack`, or a frame) after every frame it made before.
    pub fn settle(&mut self) {
        self.n_settled += 1;
        let reqs: Vec<String> =
            (0..self.windows.len()).map(|index| format!("settle{}-{index}", self.n_settled)).collect();
        for (index, window) in self.windows.iter().enumerate() {
            let set_range = json!({"op": "set_range", "sub": format!("live{index}"), "req": reqs[index],
                                   "offset": window.query["offset"], "limit": window.query["limit"]});
            self.runtime.block_on(self.client.send(set_range));
        }
        let answered = |client: &super::Client| {
            reqs.iter().all(|req| client.frames.iter().chain(&client.diffs_seen).any(|frame| frame["req"] == **req))
        };
        assert!(
            self.runtime.block_on(self.client.read_until(APPLY_TIMEOUT, answered)),
            "frames: {:?}",
            self.client.frames
        );
        let errors: Vec<&Value> = self.client.frames.iter().filter(|frame| frame["type"] == "error").collect();
        assert!(errors.is_empty(), "a live window was refused: {errors:?}");
        self.client.diffs_seen.clear();
        self.client.frames.clear();
    }

    /// The windows and each one's rows as its subscription holds them.
    pub fn rows(&self) -> impl Iterator<Item = (&OrdoWindow, Vec<Value>)> {
        self.windows.iter().enumerate().map(|(index, window)| {
            (window, item_rows(&self.client.lists[&format!("live{index}")].items, window.fields))
        })
    }
}
