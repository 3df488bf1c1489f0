//! `ordo serve --cluster --pg-table`: three Ordo nodes over a NATS JetStream
//! cluster, all started with the same `--pg-*` options, follow one real
//! PostgreSQL (`PostgresServer`): one node holds the follower lease and
//! publishes each transaction to the stream, every node applies it. PostgreSQL
//! is the reference: once the nodes converge, every node's collections equal
//! the tables, row for row.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{all_items, request, OrdoCluster};
use ordo_test_kit::postgres::{PostgresServer, SOCKET_PORT};
use serde_json::{json, Value};

const PUBLICATION: &str = "ordo_pub";
const SLOT: &str = "ordo_slot";
/// How long the nodes may take to agree with PostgreSQL on a loaded machine
/// (a takeover waits for the dead holder's lease to lapse: 10 s); the waits
/// end as soon as they do.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(120);

fn postgres() -> PostgresServer {
    PostgresServer::start().unwrap_or_else(|error| panic!("starting PostgreSQL: {error}"))
}

/// `counters (id, n)`, updated in place, and `events (id, counter)`, insert
/// only, both published; `n_counters` counters at 0.
fn create_tables(pg: &PostgresServer, n_counters: usize) {
    pg.psql(&format!(
        "CREATE TABLE counters (id text PRIMARY KEY, n int8 NOT NULL);
         CREATE TABLE events (id text PRIMARY KEY, counter text NOT NULL);
         INSERT INTO counters SELECT 'c' || i, 0 FROM generate_series(0, {}) AS i;
         CREATE PUBLICATION {PUBLICATION} FOR TABLE counters, events;",
        n_counters - 1
    ))
    .unwrap();
}

/// The tables the nodes follow unless a test says otherwise.
const TABLES: [&str; 2] = ["counters", "events"];

/// The `--pg-*` arguments every node gets (the password in `dir/pg-password`).
fn follow_args(pg: &PostgresServer, dir: &Path) -> Vec<String> {
    follow_tables_args(pg, dir, &TABLES)
}

/// `follow_args` with `tables` as the `--pg-table`s.
fn follow_tables_args(pg: &PostgresServer, dir: &Path, tables: &[&str]) -> Vec<String> {
    follow_args_as(pg, dir, (&pg.user, &pg.password), tables)
}

/// `follow_tables_args` as the role `user` (its name and password).
fn follow_args_as(pg: &PostgresServer, dir: &Path, user: (&str, &str), tables: &[&str]) -> Vec<String> {
    let password_file = dir.join("pg-password");
    std::fs::write(&password_file, format!("{}\n", user.1)).unwrap();
    [
        "--pg-host",
        pg.socket_dir().to_str().unwrap(),
        "--pg-port",
        &SOCKET_PORT.to_string(),
        "--pg-user",
        user.0,
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
    .chain(tables.iter().flat_map(|table| ["--pg-table".to_owned(), table.to_string()]))
    .collect()
}

fn start_cluster(pg: &PostgresServer, dir: &Path) -> OrdoCluster {
    let args = follow_args(pg, dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    OrdoCluster::start_with(3, 3, &args)
}

/// Node `i`'s `/v1/health` `postgres` object (None when it does not answer).
fn pg_health(cluster: &OrdoCluster, i: usize) -> Option<Value> {
    let port = cluster.ports()[i]?;
    match request(port, "GET", "/v1/health", None, Duration::from_secs(2)) {
        Ok((200, health)) => Some(health["postgres"].clone()),
        _ => None,
    }
}

/// The node that holds the lease, once exactly one says it does and every
/// node that is up names it.
fn wait_for_holder(cluster: &OrdoCluster, timeout: Duration) -> usize {
    wait_for_holder_except(cluster, None, timeout)
}

/// `wait_for_holder` among the nodes that are up but `frozen` (`SIGSTOP`: it
/// answers nothing, and may still believe it holds the lease).
fn wait_for_holder_except(cluster: &OrdoCluster, frozen: Option<usize>, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    let answering = |i: usize| cluster.is_up(i) && Some(i) != frozen;
    loop {
        let healths: Vec<Option<Value>> =
            (0..cluster.len()).map(|i| if answering(i) { pg_health(cluster, i) } else { None }).collect();
        let holders: Vec<usize> = (0..cluster.len())
            .filter(|&i| healths[i].as_ref().is_some_and(|h| h["lease"]["held_here"] == true))
            .collect();
        if let [holder] = holders[..] {
            let name = format!("o{holder}");
            let named = (0..cluster.len())
                .filter(|&i| answering(i))
                .all(|i| healths[i].as_ref().is_some_and(|h| h["lease"]["holder"] == name.as_str()));
            if named && healths[holder].as_ref().is_some_and(|h| h["state"] == "streaming") {
                return holder;
            }
        }
        assert!(holders.len() <= 1, "two nodes say they hold the lease: {healths:?}");
        assert!(Instant::now() < deadline, "no single lease holder within {timeout:?}: {healths:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A table's rows as `{id: row}` objects sorted by id, from PostgreSQL.
fn postgres_rows(pg: &PostgresServer, table: &str) -> Vec<Value> {
    let text =
        pg.psql(&format!("SELECT row_to_json(t) FROM (SELECT * FROM {table} ORDER BY id COLLATE \"C\") AS t")).unwrap();
    text.lines().filter(|line| !line.is_empty()).map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// The same rows from node `port`'s collection (the id and the fields).
fn ordo_rows(port: u16, collection: &str) -> Vec<Value> {
    all_items(port, collection, 0)
        .into_iter()
        .map(|item| {
            let mut row = item["fields"].clone();
            row["id"] = item["id"].clone();
            row
        })
        .collect()
}

/// Waits until every node that is up holds exactly PostgreSQL's rows.
fn wait_equal_to_postgres(cluster: &OrdoCluster, pg: &PostgresServer) {
    wait_tables_equal_to_postgres(cluster, pg, &TABLES);
}

/// `wait_equal_to_postgres` for `tables`.
fn wait_tables_equal_to_postgres(cluster: &OrdoCluster, pg: &PostgresServer, tables: &[&str]) {
    let ports: Vec<u16> = cluster.ports().into_iter().flatten().collect();
    wait_equal_on(&ports, pg, tables);
}

/// Waits until the nodes on `ports` hold exactly PostgreSQL's rows of `tables`.
fn wait_equal_on(ports: &[u16], pg: &PostgresServer, tables: &[&str]) {
    let expected: Vec<(&str, Vec<Value>)> = tables.iter().map(|table| (*table, postgres_rows(pg, table))).collect();
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    for &port in ports {
        for (table, rows) in &expected {
            loop {
                let (status, _) =
                    request(port, "GET", &format!("/v1/collections/{table}"), None, Duration::from_secs(5))
                        .unwrap_or((0, Value::Null));
                let got = if status == 200 { ordo_rows(port, table) } else { Vec::new() };
                if &got == rows {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node on port {port}: `{table}` differs from PostgreSQL ({} rows, {} expected): {:?}",
                    got.len(),
                    rows.len(),
                    got.iter().zip(rows.iter()).find(|(a, b)| a != b)
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// One transaction in PostgreSQL: a counter incremented and an event
/// inserted (two collections, one transaction).
fn increment(pg: &PostgresServer, n: u64, n_counters: u64) {
    increment_and(pg, n, n_counters, "");
}

/// `increment`, with the statements `also` in the same transaction.
fn increment_and(pg: &PostgresServer, n: u64, n_counters: u64, also: &str) {
    let counter = format!("c{}", n % n_counters);
    pg.psql(&format!(
        "BEGIN; UPDATE counters SET n = n + 1 WHERE id = '{counter}';
         INSERT INTO events VALUES ('e{n:06}', '{counter}'); {also} COMMIT;"
    ))
    .unwrap();
}

/// How many transactions the writer thread of `while_committing` committed.
struct Commits(AtomicU64);

impl Commits {
    fn count(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Waits until `n` more are committed than when called.
    fn wait_more(&self, n: u64) {
        let target = self.count() + n;
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        while self.count() < target {
            assert!(Instant::now() < deadline, "the writer committed {} of {target} transactions", self.count());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Stops the writer thread when `body` returns or panics.
struct StopWriting<'a>(&'a AtomicBool);

impl Drop for StopWriting<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Runs `body` while a thread commits `increment`s one after another (each
/// with `also(n)` in its transaction); returns `body`'s result and how many
/// transactions were committed in all.
fn while_committing<T>(
    pg: &PostgresServer,
    n_counters: u64,
    also: impl Fn(u64) -> String + Sync,
    body: impl FnOnce(&Commits) -> T,
) -> (T, u64) {
    let commits = Commits(AtomicU64::new(0));
    let writing = AtomicBool::new(true);
    let result = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut n = 0;
            while writing.load(Ordering::SeqCst) {
                increment_and(pg, n, n_counters, &also(n));
                n += 1;
                commits.0.store(n, Ordering::SeqCst);
            }
        });
        let _stop = StopWriting(&writing);
        body(&commits)
    });
    (result, commits.count())
}

#[test]
fn three_nodes_follow_one_postgres_and_exactly_one_holds_the_lease() {
    let pg = postgres();
    create_tables(&pg, 5);
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(&pg, dir.path());
    let holder = wait_for_holder(&cluster, CONVERGE_TIMEOUT);
    wait_equal_to_postgres(&cluster, &pg);
    for n in 0..20 {
        increment(&pg, n, 5);
    }
    pg.psql("BEGIN; DELETE FROM events WHERE id = 'e000003'; UPDATE counters SET n = 100 WHERE id = 'c1'; COMMIT;")
        .unwrap();
    pg.psql("DELETE FROM counters WHERE id = 'c4'").unwrap();
    wait_equal_to_postgres(&cluster, &pg);
    assert_eq!(wait_for_holder(&cluster, CONVERGE_TIMEOUT), holder, "the lease stayed with one node");
    // Every node applied the same transactions up to the same position.
    let seq = cluster.wait_converged(CONVERGE_TIMEOUT);
    let healths: Vec<Value> = (0..3).map(|i| pg_health(&cluster, i).unwrap()).collect();
    for health in &healths {
        assert_eq!(health["applied_lsn"], healths[holder]["applied_lsn"], "{healths:?}");
        // The copy and 22 transactions, each applied once.
        assert_eq!(health["transactions_applied"], 23, "{healths:?}");
    }
    for (i, health) in healths.iter().enumerate() {
        assert_eq!(health["state"], if i == holder { "streaming" } else { "standby" }, "{health}");
    }
    // A followed collection is read-only on every node, holder or not.
    for port in cluster.ports().into_iter().flatten() {
        let body = json!({"ops": [{"op": "upsert", "id": "x", "fields": {"n": 1}}]});
        let (status, answer) =
            request(port, "POST", "/v1/collections/counters/batch", Some(&body), Duration::from_secs(10)).unwrap();
        assert_eq!((status, answer["error"]["code"].as_str()), (409, Some("read_only_source")), "{answer}");
    }
    assert_eq!(cluster.wait_converged(CONVERGE_TIMEOUT), seq, "refused writes take no seq");
}

/// Writers keep committing transactions to PostgreSQL while the node that
/// follows it is killed (`kill -9`): another node takes the lease over and
/// resumes from the position the stream holds. At the end every node (the
/// killed one restarted too) equals PostgreSQL, and the nodes that stayed up
/// applied each transaction exactly once.
#[test]
fn kill_9_of_the_lease_holder_mid_stream_loses_and_doubles_nothing() {
    const N_COUNTERS: u64 = 7;
    /// Transactions before the kill, and at least as many after the takeover.
    const N_BEFORE_KILL: u64 = 80;
    let pg = postgres();
    create_tables(&pg, N_COUNTERS as usize);
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start_cluster(&pg, dir.path());
    let holder = wait_for_holder(&cluster, CONVERGE_TIMEOUT);
    let (new_holder, n_transactions) = while_committing(
        &pg,
        N_COUNTERS,
        |_| String::new(),
        |commits| {
            commits.wait_more(N_BEFORE_KILL);
            cluster.kill(holder);
            let new_holder = wait_for_holder(&cluster, CONVERGE_TIMEOUT);
            commits.wait_more(N_BEFORE_KILL);
            new_holder
        },
    );
    assert_ne!(new_holder, holder);
    wait_equal_to_postgres(&cluster, &pg);
    let total: i64 = postgres_rows(&pg, "counters").iter().map(|row| row["n"].as_i64().unwrap()).sum();
    assert_eq!(total, n_transactions as i64);
    cluster.wait_converged(CONVERGE_TIMEOUT);
    for i in (0..3).filter(|&i| i != holder) {
        let health = pg_health(&cluster, i).unwrap();
        // Up all along: the copy and every transaction, each applied once.
        assert_eq!(health["transactions_applied"], 1 + n_transactions, "node o{i}: {health}");
    }
    cluster.restart(holder);
    wait_equal_to_postgres(&cluster, &pg);
    assert_eq!(wait_for_holder(&cluster, CONVERGE_TIMEOUT), new_holder, "the restarted node stands by");
}

/// Rows in `bulk`, the table whose copy a test cuts short: six batches of
/// the copy (`COPY_BATCH_ROWS`), so that the copy through the stream takes
/// seconds and is caught after its first batch.
const N_BULK_ROWS: u64 = 60_000;

fn bulk_id(n: u64) -> String {
    format!("b{n:07}")
}

/// `bulk (id, pad)`: `n_rows` small rows, published.
fn create_bulk_table(pg: &PostgresServer, n_rows: u64) {
    pg.psql(&format!(
        "CREATE TABLE bulk (id text PRIMARY KEY, pad text NOT NULL);
         INSERT INTO bulk SELECT 'b' || lpad(i::text, 7, '0'), repeat('x', 20) FROM generate_series(0, {}) AS i;
         ALTER PUBLICATION {PUBLICATION} ADD TABLE bulk;",
        n_rows - 1
    ))
    .unwrap();
}

/// The lease holder, once it says it is copying and some of `bulk`'s rows
/// are on another node (applied from the stream): the copy is under way.
fn wait_for_copy_under_way(cluster: &OrdoCluster) -> usize {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let copying = |i: &usize| {
            pg_health(cluster, *i).is_some_and(|h| h["lease"]["held_here"] == true && h["state"] == "copying")
        };
        if let Some(holder) = (0..cluster.len()).find(copying) {
            let port = cluster.ports()[(holder + 1) % cluster.len()].unwrap();
            let query = json!({"limit": 1});
            let answer = request(port, "POST", "/v1/collections/bulk/query", Some(&query), Duration::from_secs(5));
            if let Ok((200, answer)) = answer {
                if answer["items"].as_array().is_some_and(|items| !items.is_empty()) {
                    return holder;
                }
            }
        }
        assert!(Instant::now() < deadline, "no copy under way within {CONVERGE_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many rows of `table` (`schema.name`) node `i` copied in its last copy,
/// from its log's `copied a table` line.
fn rows_copied(cluster: &OrdoCluster, i: usize, table: &str) -> u64 {
    let marker = format!("table={table} ");
    let is_it = |line: &str| line.contains("copied a table") && line.contains(&marker);
    let lines = cluster.node(i).wait_for_stderr_line(is_it);
    let line = lines.iter().rev().find(|line| is_it(line)).unwrap();
    let rows = line.split("rows=").nth(1).unwrap();
    rows.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap()
}

/// The lease holder killed (`kill -9`) in the middle of the first copy, while
/// transactions keep committing (each also deleting a row of `bulk` the cut
/// copy may hold): the next holder finds no position, drops the collections,
/// creates the slot again and copies through the stream. Every node then
/// equals PostgreSQL (no row of the cut copy left over), and the nodes that
/// stayed up applied each transaction after the new copy's snapshot once.
#[test]
fn kill_9_of_the_lease_holder_mid_copy_copies_again_losing_and_doubling_nothing() {
    const N_COUNTERS: u64 = 7;
    const N_AFTER_TAKEOVER: u64 = 40;
    let pg = postgres();
    create_tables(&pg, N_COUNTERS as usize);
    create_bulk_table(&pg, N_BULK_ROWS);
    let dir = tempfile::tempdir().unwrap();
    let tables = ["counters", "events", "bulk"];
    let args = follow_tables_args(&pg, dir.path(), &tables);
    let mut cluster = OrdoCluster::start_with(3, 3, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let delete_bulk_row = |n: u64| format!("DELETE FROM bulk WHERE id = '{}';", bulk_id(n));
    let ((holder, new_holder), n_transactions) = while_committing(&pg, N_COUNTERS, delete_bulk_row, |commits| {
        let holder = wait_for_copy_under_way(&cluster);
        cluster.kill(holder);
        let new_holder = wait_for_holder(&cluster, CONVERGE_TIMEOUT);
        commits.wait_more(N_AFTER_TAKEOVER);
        (holder, new_holder)
    });
    assert_ne!(new_holder, holder);
    wait_tables_equal_to_postgres(&cluster, &pg, &tables);
    let total: i64 = postgres_rows(&pg, "counters").iter().map(|row| row["n"].as_i64().unwrap()).sum();
    assert_eq!(total, n_transactions as i64);
    // The new copy holds the transactions before its snapshot (an event each);
    // the stream, the others.
    let in_copy = rows_copied(&cluster, new_holder, "public.events");
    cluster.wait_converged(CONVERGE_TIMEOUT);
    for i in (0..3).filter(|&i| i != holder) {
        let health = pg_health(&cluster, i).unwrap();
        assert_eq!(health["transactions_applied"], 1 + n_transactions - in_copy, "node o{i}: {health}");
    }
    cluster.restart(holder);
    wait_tables_equal_to_postgres(&cluster, &pg, &tables);
    // One holder still (on a loaded machine a late renewal may hand the lease on).
    wait_for_holder(&cluster, CONVERGE_TIMEOUT);
}

/// How long a takeover from a frozen holder may take until the new holder
/// streams: its lease lapses 10 s after its last renewal, a node looks every
/// 3 s. PostgreSQL's `wal_sender_timeout` (60 s) would end the frozen holder's
/// walsender, and free the slot, only later.
const FROZEN_TAKEOVER_TIMEOUT: Duration = Duration::from_secs(40);

/// The lease holder frozen (`SIGSTOP`) while transactions keep committing:
/// its lease lapses and another node takes it; its walsender still holds the
/// slot, and the new holder ends it (as the same role, not a superuser)
/// instead of waiting for `wal_sender_timeout`. Once continued (`SIGCONT`) the
/// old holder gives up at its first renewal and follows no more; whatever it
/// published late is fenced. Every node equals PostgreSQL, every transaction
/// applied once on every node.
#[test]
fn sigstop_of_the_lease_holder_frees_the_slot_before_wal_sender_timeout_and_fences_it_after() {
    const N_COUNTERS: u64 = 7;
    const N_EACH_PHASE: u64 = 40;
    let pg = postgres();
    create_tables(&pg, N_COUNTERS as usize);
    pg.psql(
        "CREATE ROLE ordo_follower LOGIN REPLICATION PASSWORD 'follower-password';
         GRANT SELECT ON counters, events TO ordo_follower;",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args = follow_args_as(&pg, dir.path(), ("ordo_follower", "follower-password"), &TABLES);
    let cluster = OrdoCluster::start_with(3, 3, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let holder = wait_for_holder(&cluster, CONVERGE_TIMEOUT);
    let (new_holder, n_transactions) = while_committing(
        &pg,
        N_COUNTERS,
        |_| String::new(),
        |commits| {
            commits.wait_more(N_EACH_PHASE);
            cluster.signal(holder, libc::SIGSTOP);
            let stopped_at = Instant::now();
            let new_holder = wait_for_holder_except(&cluster, Some(holder), FROZEN_TAKEOVER_TIMEOUT);
            eprintln!("o{new_holder} streams {:?} after o{holder} was frozen", stopped_at.elapsed());
            commits.wait_more(N_EACH_PHASE);
            new_holder
        },
    );
    let ports = cluster.ports();
    let others: Vec<u16> = (0..3).filter(|&i| i != holder).filter_map(|i| ports[i]).collect();
    wait_equal_on(&others, &pg, &TABLES);
    let ended = cluster.node(new_holder).wait_for_stderr_line(|line| line.contains("still held the slot"));
    assert!(ended.iter().any(|line| line.contains("ended the PostgreSQL backend")), "{ended:#?}");
    cluster.signal(holder, libc::SIGCONT);
    // It stops following at its first renewal (on a loaded machine a late
    // renewal may hand the lease on again later: which node holds it is not checked).
    cluster.node(holder).wait_for_stderr_line(|line| line.contains("gave up the PostgreSQL follower lease"));
    wait_for_holder(&cluster, CONVERGE_TIMEOUT);
    wait_equal_to_postgres(&cluster, &pg);
    let total: i64 = postgres_rows(&pg, "counters").iter().map(|row| row["n"].as_i64().unwrap()).sum();
    assert_eq!(total, n_transactions as i64);
    cluster.wait_converged(CONVERGE_TIMEOUT);
    for i in 0..3 {
        // Up all along (one of them frozen a while): the copy and every transaction, each once.
        let health = pg_health(&cluster, i).unwrap();
        assert_eq!(health["transactions_applied"], 1 + n_transactions, "node o{i}: {health}");
    }
}

/// Waits until node `i`'s follower is `failed`; returns its health.
fn wait_node_failed(cluster: &OrdoCluster, i: usize) -> Value {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let health = pg_health(cluster, i).unwrap_or(Value::Null);
        if health["state"] == "failed" {
            return health;
        }
        assert!(Instant::now() < deadline, "node o{i} did not stop following: {health}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How many of node `i`'s log lines contain `text`.
fn log_lines_with(cluster: &OrdoCluster, i: usize, text: &str) -> usize {
    cluster.node(i).stderr_lines().iter().filter(|line| line.contains(text)).count()
}

/// A followed table removed from the publication in cluster mode: the holder's
/// check finds it, it stops following and gives the lease up; each other node
/// takes the lease once, finds the same at its start and stops too. Every node
/// ends `failed` naming the table, no node holds the lease, each took it once
/// (no loop of takeovers), and each serves what it holds. A node restarted
/// then takes the lease once more and stops the same way.
#[test]
fn a_followed_table_leaving_the_publication_stops_every_node_once_naming_it() {
    let pg = postgres();
    create_tables(&pg, 3);
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start_cluster(&pg, dir.path());
    wait_for_holder(&cluster, CONVERGE_TIMEOUT);
    increment(&pg, 0, 3);
    wait_equal_to_postgres(&cluster, &pg);
    pg.psql(&format!("ALTER PUBLICATION {PUBLICATION} DROP TABLE events;")).unwrap();
    for i in 0..3 {
        let health = wait_node_failed(&cluster, i);
        assert!(health["error"].as_str().is_some_and(|error| error.contains("public.events")), "o{i}: {health}");
    }
    for i in 0..3 {
        let health = pg_health(&cluster, i).unwrap();
        assert_eq!(health["lease"]["holder"], Value::Null, "o{i}: {health}");
        assert_eq!(log_lines_with(&cluster, i, "took the PostgreSQL follower lease"), 1, "o{i} took it once");
        let errors = cluster.node(i).stderr_lines();
        let named = errors.iter().filter(|line| line.contains("ERROR") && line.contains("public.events")).count();
        assert!(named >= 1, "o{i}'s log names the table: {errors:#?}");
    }
    wait_equal_to_postgres(&cluster, &pg);
    cluster.kill(0);
    cluster.restart(0);
    let health = wait_node_failed(&cluster, 0);
    assert!(health["error"].as_str().is_some_and(|error| error.contains("public.events")), "{health}");
    assert_eq!(log_lines_with(&cluster, 0, "took the PostgreSQL follower lease"), 1, "once since its restart");
}

/// `X/Y` (hexadecimal halves) as the LSN's number.
fn parse_lsn(text: &str) -> u64 {
    let (high, low) = text.split_once('/').unwrap();
    (u64::from_str_radix(high, 16).unwrap() << 32) | u64::from_str_radix(low, 16).unwrap()
}

/// A follower entry as the lease holder would publish it.
fn follower_entry(term: u64, change: Value) -> String {
    json!({
        "kind": "postgres",
        "postgres": {"slot": SLOT, "term": term, "change": change},
        "caller": {"sub": "test", "role": "admin"},
    })
    .to_string()
}

/// Publishes `entries` (message id, entry) to the cluster's stream; the
/// acknowledgements' `duplicate` flags.
fn publish(cluster: &OrdoCluster, entries: &[(&str, String)]) -> Vec<bool> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = async_nats::connect(cluster.nats.url(0)).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let mut duplicates = Vec::new();
        for (id, entry) in entries {
            let publish = async_nats::jetstream::context::Publish::build()
                .message_id(*id)
                .payload(entry.clone().into_bytes().into());
            let ack = js.send_publish("ordo.log", publish).await.unwrap().await.unwrap();
            duplicates.push(ack.duplicate);
        }
        duplicates
    })
}

/// The apply's fencing, on every node: an entry of a transaction at or before
/// the stored position (a publish sent again, by this holder or a dead one)
/// and any entry of an older term (a holder that lost the lease while paused)
/// change nothing — not the rows, not the position, not the term, not the
/// record of the followed tables — and the follower goes on. A publish sent
/// again with the same message id is dropped by the stream itself.
#[test]
fn stale_and_repeated_follower_entries_change_nothing_on_any_node() {
    let pg = postgres();
    create_tables(&pg, 2);
    let dir = tempfile::tempdir().unwrap();
    let cluster = start_cluster(&pg, dir.path());
    let holder = wait_for_holder(&cluster, CONVERGE_TIMEOUT);
    increment(&pg, 0, 2);
    wait_equal_to_postgres(&cluster, &pg);
    cluster.wait_converged(CONVERGE_TIMEOUT);
    let health = pg_health(&cluster, holder).unwrap();
    let term = health["lease"]["term"].as_u64().unwrap();
    let position = parse_lsn(health["applied_lsn"].as_str().unwrap());
    let overwrite = |id: &str| json!([{"op": "upsert", "id": id, "fields": [["id", id], ["n", 999]]}]);
    let at_position = follower_entry(
        term,
        json!({"op": "rows", "collection": "counters", "end_lsn": position, "ops": overwrite("c0")}),
    );
    let far_ahead = position + (1 << 32);
    let older_term = [
        json!({"op": "rows", "collection": "counters", "end_lsn": far_ahead, "ops": overwrite("c1")}),
        json!({"op": "position", "end_lsn": far_ahead}),
        json!({"op": "claim"}),
        json!({"op": "drop_collection", "collection": "events"}),
        json!({"op": "copy_rows", "collection": "counters", "ops": overwrite("c1")}),
        json!({"op": "tables", "tables": []}),
    ];
    let mut entries = vec![("test/again", at_position.clone()), ("test/again", at_position.clone())];
    entries.push(("test/again-later", at_position));
    let stale: Vec<String> = older_term.into_iter().map(|change| follower_entry(term - 1, change)).collect();
    let stale_ids = ["t/1", "t/2", "t/3", "t/4", "t/5", "t/6"];
    entries.extend(stale.iter().enumerate().map(|(i, entry)| (stale_ids[i], entry.clone())));
    let duplicates = publish(&cluster, &entries);
    assert_eq!(
        duplicates,
        [false, true, false, false, false, false, false, false, false],
        "the stream drops the same id"
    );
    cluster.wait_converged(CONVERGE_TIMEOUT);
    wait_equal_to_postgres(&cluster, &pg);
    // The term and the position are as they were: the follower goes on.
    increment(&pg, 1, 2);
    wait_equal_to_postgres(&cluster, &pg);
    cluster.wait_converged(CONVERGE_TIMEOUT);
    for i in 0..3 {
        let health = pg_health(&cluster, i).unwrap();
        assert_eq!(health["transactions_applied"], 3, "the copy and two transactions: {health}");
        assert_eq!(health["lease"]["holder"], format!("o{holder}").as_str(), "{health}");
        // The stale record of no tables was not stored either.
        assert_eq!(health["tables_differ"], Value::Null, "{health}");
    }
}

/// Sets every node's `--pg-table`s to `tables` and restarts the nodes that are down.
fn restart_all_following(cluster: &mut OrdoCluster, pg: &PostgresServer, dir: &Path, tables: &[&str]) {
    let args = follow_tables_args(pg, dir, tables);
    cluster.set_extra_args(&args.iter().map(String::as_str).collect::<Vec<_>>());
    for i in 0..cluster.len() {
        if !cluster.is_up(i) {
            cluster.restart(i);
        }
    }
}

fn kill_all(cluster: &mut OrdoCluster) {
    for i in 0..cluster.len() {
        if cluster.is_up(i) {
            cluster.kill(i);
        }
    }
}

/// Waits until node `i`'s `tables_differ` is `expected` (null, or a text); returns it.
fn wait_tables_differ(cluster: &OrdoCluster, i: usize, expected: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let health = pg_health(cluster, i).unwrap_or(Value::Null);
        if expected(&health["tables_differ"]) {
            return health["tables_differ"].clone();
        }
        assert!(Instant::now() < deadline, "node o{i}: `tables_differ` stays as it is: {health}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every node restarted with a table added to `--pg-table`: the lease holder
/// copies it at a temporary slot's snapshot, through the stream, and records
/// it with the copy's consistent point; every node holds the copy, and the
/// stream's changes of that table up to that point (in the copy already) are
/// applied by no node. A node restarted with the old list says its list
/// differs. Then every node without a table: its collection stays, and every
/// node takes writes to it.
#[test]
fn a_table_newly_followed_by_every_node_is_copied_through_the_stream_and_one_taken_out_is_writable_everywhere() {
    let pg = postgres();
    create_tables(&pg, 3);
    pg.psql(
        "CREATE TABLE extra (id text PRIMARY KEY, v int8 NOT NULL);
         INSERT INTO extra SELECT 'x' || n, n FROM generate_series(1, 5) AS n;
         ALTER PUBLICATION ordo_pub ADD TABLE extra;",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start_cluster(&pg, dir.path());
    wait_for_holder(&cluster, CONVERGE_TIMEOUT);
    increment(&pg, 0, 3);
    // In the publication, not followed: not applied, and the position stays before it.
    pg.psql("UPDATE extra SET v = v + 100;").unwrap();
    wait_equal_to_postgres(&cluster, &pg);
    cluster.wait_converged(CONVERGE_TIMEOUT);
    kill_all(&mut cluster);
    // Past the stored position, before the copy: in the copy, so dropped from the stream.
    pg.psql("BEGIN; UPDATE extra SET v = -v WHERE id IN ('x1', 'x2'); DELETE FROM extra WHERE id = 'x3'; COMMIT;")
        .unwrap();
    pg.psql("BEGIN; UPDATE counters SET n = n + 1 WHERE id = 'c1'; INSERT INTO extra VALUES ('x6', 6); COMMIT;")
        .unwrap();
    let all = ["counters", "events", "extra"];
    restart_all_following(&mut cluster, &pg, dir.path(), &all);
    let holder = wait_for_holder(&cluster, CONVERGE_TIMEOUT);
    wait_tables_equal_to_postgres(&cluster, &pg, &all);
    pg.psql("UPDATE extra SET v = 0 WHERE id = 'x6';").unwrap();
    wait_tables_equal_to_postgres(&cluster, &pg, &all);
    cluster.wait_converged(CONVERGE_TIMEOUT);
    for i in 0..3 {
        let health = pg_health(&cluster, i).unwrap();
        // Since the restart: the transaction with `counters` (its `extra` part
        // dropped) and the one after the copy; the two of `extra` alone, none.
        assert_eq!(health["transactions_applied"], 2, "node o{i}: {health}");
        assert_eq!(health["tables_differ"], Value::Null, "node o{i}: {health}");
    }

    // A standby restarted with the old list: the record it holds says otherwise.
    let standby = (holder + 1) % 3;
    cluster.kill(standby);
    restart_all_following(&mut cluster, &pg, dir.path(), &TABLES);
    let differ = wait_tables_differ(&cluster, standby, Value::is_string);
    assert!(differ.as_str().unwrap().contains("only there [public.extra into `extra`]"), "{differ}");
    assert_eq!(pg_health(&cluster, standby).unwrap()["state"], "standby");

    // `events` taken out on every node: kept as it was, writable on every node.
    kill_all(&mut cluster);
    let kept = ["counters", "extra"];
    restart_all_following(&mut cluster, &pg, dir.path(), &kept);
    wait_for_holder(&cluster, CONVERGE_TIMEOUT);
    pg.psql("INSERT INTO events VALUES ('e-late', 'c0'); UPDATE extra SET v = 1 WHERE id = 'x1';").unwrap();
    wait_tables_equal_to_postgres(&cluster, &pg, &kept);
    for i in 0..3 {
        wait_tables_differ(&cluster, i, Value::is_null);
        let port = cluster.ports()[i].unwrap();
        let body = json!({"ops": [{"op": "upsert", "id": format!("w{i}"), "fields": {"counter": "c0"}}]});
        let (status, answer) =
            request(port, "POST", "/v1/collections/events/batch", Some(&body), Duration::from_secs(10)).unwrap();
        assert_eq!(status, 200, "node o{i}: {answer}");
    }
    cluster.wait_converged(CONVERGE_TIMEOUT);
    for port in cluster.ports().into_iter().flatten() {
        let ids: Vec<Value> = ordo_rows(port, "events").iter().map(|row| row["id"].clone()).collect();
        assert_eq!(ids, [json!("e000000"), json!("w0"), json!("w1"), json!("w2")], "port {port}");
    }
}

/// `tallies (id, n)`, one row `t` at 0, and `marks (id, tally, n)`, each
/// mark referencing a tally (`tally_transactions`), both published.
fn create_tally_tables(pg: &PostgresServer) {
    pg.psql(&format!(
        "CREATE TABLE tallies (id text PRIMARY KEY, n int8 NOT NULL);
         CREATE TABLE marks (id text PRIMARY KEY, tally text NOT NULL REFERENCES tallies, n int8 NOT NULL);
         INSERT INTO tallies VALUES ('t', 0);
         CREATE PUBLICATION {PUBLICATION} FOR TABLE tallies, marks;"
    ))
    .unwrap();
}

/// The tally tables as followed: `marks.tally` a `ref` to `tallies`' items,
/// so a view of `marks` reads `tally.n`.
const TALLY_TABLES: [&str; 2] = ["marks:::ref.tally=tallies", "tallies"];

/// `n` transactions committed back to back in one session, each touching
/// both tables: the tally goes up by one and a mark holding its new value is
/// inserted. So in every state PostgreSQL had, the newest mark's `n` is the
/// tally's `n`.
fn tally_transactions(pg: &PostgresServer, n: usize) {
    let one = "BEGIN; UPDATE tallies SET n = n + 1 WHERE id = 't';
               INSERT INTO marks SELECT 'm' || lpad(n::text, 7, '0'), id, n FROM tallies WHERE id = 't'; COMMIT;\n";
    pg.psql(&one.repeat(n)).unwrap();
}

/// Asks node `port` for the newest mark with its tally's `n` read through the
/// reference, in one query (answered between two of the node's applies), until
/// `stop`: the number of answers, or the first that shows a state between two
/// transactions.
fn check_newest_mark_until(port: u16, stop: &AtomicBool) -> Result<u64, String> {
    let query = json!({"sort": [{"field": "n", "dir": "desc"}], "limit": 1, "fields": ["n", "tally.n"]});
    let mut n_answers = 0;
    while !stop.load(Ordering::SeqCst) {
        let answer = request(port, "POST", "/v1/collections/marks/query", Some(&query), Duration::from_secs(10));
        let (status, answer) = answer.map_err(|error| format!("port {port}: {error}"))?;
        if status != 200 {
            return Err(format!("port {port} answered {status}: {answer}"));
        }
        n_answers += 1;
        let Some(newest) = answer["items"].get(0) else { continue };
        let (mark, tally) = (&newest["fields"]["n"], &newest["fields"]["tally.n"]);
        if mark != tally {
            return Err(format!(
                "port {port} answered a state between two transactions (write_seq {}): the newest mark holds \
                 {mark} but its tally reads {tally}",
                answer["write_seq"]
            ));
        }
    }
    Ok(n_answers)
}

/// Bursts of PostgreSQL transactions, each touching two followed
/// collections; the holder takes those received together as one submission
/// (more entries than a stream message holds). Every node must apply each
/// transaction whole: queries on a node that does not hold the lease, and on
/// the holder, answered while the transactions stream, never show one in part
/// (the newest mark and its tally's value read through its `ref`, in one
/// answer, always agree). Queries, not a subscription's diff frames: frames
/// are per batch in both modes, so a view reading through the `ref` gets one
/// for each of a transaction's two batches (docs/POSTGRES.md, "Streaming").
#[test]
fn a_transaction_over_two_collections_is_never_seen_in_part_on_any_node() {
    const N_BURSTS: usize = 10;
    const N_PER_BURST: usize = 200;
    let pg = postgres();
    create_tally_tables(&pg);
    let dir = tempfile::tempdir().unwrap();
    let args = follow_tables_args(&pg, dir.path(), &TALLY_TABLES);
    let cluster = OrdoCluster::start_with(3, 3, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let holder = wait_for_holder(&cluster, CONVERGE_TIMEOUT);
    let tables = ["tallies", "marks"];
    wait_tables_equal_to_postgres(&cluster, &pg, &tables);
    let ports = cluster.ports();
    let (standby, holder_port) = (ports[(holder + 1) % 3].unwrap(), ports[holder].unwrap());
    let stop = AtomicBool::new(false);
    let answers: Vec<Result<u64, String>> = std::thread::scope(|scope| {
        let checkers: Vec<_> = [standby, standby, holder_port]
            .into_iter()
            .map(|port| {
                let stop = &stop;
                scope.spawn(move || check_newest_mark_until(port, stop))
            })
            .collect();
        for _ in 0..N_BURSTS {
            tally_transactions(&pg, N_PER_BURST);
            std::thread::sleep(Duration::from_millis(100));
        }
        wait_tables_equal_to_postgres(&cluster, &pg, &tables);
        stop.store(true, Ordering::SeqCst);
        checkers.into_iter().map(|checker| checker.join().unwrap()).collect()
    });
    for answered in answers {
        let n_answers = answered.unwrap_or_else(|error| panic!("{error}"));
        assert!(n_answers >= 100, "only {n_answers} answers while the transactions streamed");
    }
    let tally = &postgres_rows(&pg, "tallies")[0];
    assert_eq!(tally["n"], json!(N_BURSTS * N_PER_BURST), "{tally}");
}
