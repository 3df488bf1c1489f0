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
    let password_file = dir.join("pg-password");
    std::fs::write(&password_file, format!("{}\n", pg.password)).unwrap();
    [
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
    let deadline = Instant::now() + timeout;
    loop {
        let healths: Vec<Option<Value>> = (0..cluster.len()).map(|i| pg_health(cluster, i)).collect();
        let holders: Vec<usize> = (0..cluster.len())
            .filter(|&i| healths[i].as_ref().is_some_and(|h| h["lease"]["held_here"] == true))
            .collect();
        if let [holder] = holders[..] {
            let name = format!("o{holder}");
            let named = (0..cluster.len())
                .filter(|&i| cluster.is_up(i))
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
    let expected: Vec<(&str, Vec<Value>)> = tables.iter().map(|table| (*table, postgres_rows(pg, table))).collect();
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    for port in cluster.ports().into_iter().flatten() {
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
    let counter = format!("c{}", n % n_counters);
    pg.psql(&format!(
        "BEGIN; UPDATE counters SET n = n + 1 WHERE id = '{counter}';
         INSERT INTO events VALUES ('e{n:06}', '{counter}'); COMMIT;"
    ))
    .unwrap();
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
    let committed = AtomicU64::new(0);
    let writing = AtomicBool::new(true);
    let wait_committed = |n: u64| {
        while committed.load(Ordering::SeqCst) < n {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let new_holder = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut n = 0;
            while writing.load(Ordering::SeqCst) {
                increment(&pg, n, N_COUNTERS);
                n += 1;
                committed.store(n, Ordering::SeqCst);
            }
        });
        wait_committed(N_BEFORE_KILL);
        cluster.kill(holder);
        let new_holder = wait_for_holder(&cluster, CONVERGE_TIMEOUT);
        wait_committed(committed.load(Ordering::SeqCst) + N_BEFORE_KILL);
        writing.store(false, Ordering::SeqCst);
        new_holder
    });
    let n_transactions = committed.load(Ordering::SeqCst);
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
