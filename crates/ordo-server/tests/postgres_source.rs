//! `ordo serve --pg-table`: tables of a real PostgreSQL (`PostgresServer`,
//! a throw-away server on a Unix socket) followed and served as collections.
//! PostgreSQL is the reference: after each transaction, once Ordo reports it
//! applied, Ordo's windows equal the same `SELECT ... ORDER BY ... LIMIT`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::postgres::{
    follow_args, follower_health, model_seed, ordo_json_rows, postgres, postgres_json_rows, refused_start,
    restart_resumed, start_following, wait_applied, wait_failed, wait_failed_within, LiveWindows, OrdoWindow,
    APPLY_TIMEOUT, PUBLICATION, SLOT,
};
use common::{ordo_binary, Server, StartOptions};
use ordo_pgsource::Lsn;
use ordo_test_kit::postgres::{PostgresServer, ServerOptions, TestCertificates};
use ordo_test_kit::rng::Rng;
use serde_json::{json, Value};

fn create_items_table(pg: &PostgresServer) {
    pg.psql(&format!(
        "CREATE TABLE items (id text PRIMARY KEY, score int8 NOT NULL, title text);
         CREATE PUBLICATION {PUBLICATION} FOR TABLE items;"
    ))
    .unwrap();
}

/// PostgreSQL's window: `(id, score, title)` by score, then id in byte order (Ordo's tie-break).
fn postgres_window(pg: &PostgresServer, limit: usize) -> Vec<Value> {
    postgres_json_rows(
        pg,
        &format!(
            "SELECT json_build_object('id', id, 'score', score, 'title', title)
             FROM items ORDER BY score, id COLLATE \"C\" LIMIT {limit}"
        ),
    )
}

/// Ordo's window of `items` in the same shape.
fn ordo_window(server: &Server, limit: usize) -> Vec<Value> {
    let answer =
        server.ok("POST", "/v1/collections/items/query", json!({"sort": [{"field": "score"}], "limit": limit}));
    answer["items"].as_array().unwrap().iter().map(row_of).collect()
}

fn row_of(item: &Value) -> Value {
    let fields = &item["fields"];
    json!({"id": item["id"], "score": fields["score"], "title": fields["title"]})
}

/// A client with one subscription, `all`, over every item of `items` by score,
/// its first frame read.
async fn subscribed_to_every_item(server: &Server) -> common::Client {
    let mut client = server.connect().await;
    client
        .send(json!({"op": "subscribe", "sub": "all", "collection": "items", "sort": [{"field": "score"}], "limit": 1000}))
        .await;
    assert!(client.read_until(APPLY_TIMEOUT, |client| client.lists.contains_key("all")).await, "no first frame");
    client
}

/// One random transaction of 1..=4 statements over the ids in `ids` (kept in step).
fn random_transaction(rng: &mut Rng, ids: &mut Vec<String>, next_id: &mut u64) -> String {
    let mut sql = String::from("BEGIN;\n");
    for _ in 0..1 + rng.below(4) {
        let score = rng.below(20) as i64 - 5;
        match rng.below(3) {
            0 if !ids.is_empty() => {
                let id = ids.swap_remove(rng.below(ids.len()));
                sql.push_str(&format!("DELETE FROM items WHERE id = '{id}';\n"));
            }
            1 if !ids.is_empty() => {
                let id = rng.pick(ids);
                let step = 1 + rng.below(5);
                sql.push_str(&format!(
                    "UPDATE items SET score = score + {step}, title = 't{score}' WHERE id = '{id}';\n"
                ));
            }
            _ => {
                *next_id += 1;
                let id = format!("i{next_id}");
                sql.push_str(&format!("INSERT INTO items VALUES ('{id}', {score}, 'x/{score}');\n"));
                ids.push(id);
            }
        }
    }
    sql.push_str("COMMIT;");
    sql
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_table_equals_postgres_after_random_transactions_one_frame_each() {
    let seed = model_seed();
    let mut rng = Rng::new(seed);
    let pg = postgres();
    create_items_table(&pg);
    let mut ids: Vec<String> = (0..40).map(|n| format!("c{n}")).collect();
    pg.psql("INSERT INTO items SELECT 'c' || n, n % 7, NULL FROM generate_series(0, 39) n;").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start_following(&pg, dir.path(), &["items"]);
    assert_eq!(ordo_window(&server, 1000), postgres_window(&pg, 1000), "after the copy (seed {seed})");
    // One subscription over every row: each transaction changes it, so each is one frame.
    let mut client = subscribed_to_every_item(&server).await;
    let n_frames_before = client.diffs_seen.len();
    let mut next_id = 0;
    let n_transactions = 25;
    for n in 1..=n_transactions {
        let sql = random_transaction(&mut rng, &mut ids, &mut next_id);
        pg.psql(&sql).unwrap();
        wait_applied(&server, n);
        let limit = 1 + rng.below(15);
        assert_eq!(ordo_window(&server, limit), postgres_window(&pg, limit), "after {sql} (seed {seed})");
    }
    let expected = postgres_window(&pg, 1000);
    let caught_up = client
        .read_until(APPLY_TIMEOUT, |client| {
            client.lists["all"].items.iter().map(row_of).collect::<Vec<_>>() == expected
        })
        .await;
    assert!(caught_up, "the subscription does not equal PostgreSQL (seed {seed})");
    assert_eq!(
        client.diffs_seen.len() - n_frames_before,
        n_transactions as usize,
        "one frame per transaction (seed {seed})"
    );
    let health = follower_health(&server);
    assert_eq!(health["state"], "streaming", "{health}");
    assert!(server.metric("ordo_postgres_transactions_applied_total") >= n_transactions as f64);
    // The lag is reported in both places, and the position is the one PostgreSQL confirmed for the slot.
    assert!(health["lag_bytes"].is_u64() && health["lag_seconds"].is_f64(), "{health}");
    assert_eq!(server.metric("ordo_postgres_lag_bytes"), health["lag_bytes"].as_u64().unwrap() as f64);
    assert_eq!(server.metric("ordo_postgres_streaming"), 1.0);
    // PostgreSQL reads the confirmation on its own time: wait for it, bounded.
    // The slot may go further than Ordo's last transaction: between
    // transactions, a keepalive's position is confirmed too (no followed
    // commit lies between).
    let slot_query = format!("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{SLOT}'");
    let applied = Lsn::parse(health["applied_lsn"].as_str().unwrap()).unwrap();
    let deadline = Instant::now() + APPLY_TIMEOUT;
    while Lsn::parse(&pg.psql(&slot_query).unwrap()).unwrap() < applied {
        assert!(Instant::now() < deadline, "the slot never confirmed Ordo's position {health}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Transactions that reach Ordo together (here: committed while it was
/// stopped) are stored in fewer group commits than there are transactions,
/// and each is still its own batch: its own frame, its own `write_seq`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_received_together_share_a_group_commit_and_keep_a_frame_each() {
    let pg = postgres();
    create_items_table(&pg);
    let dir = tempfile::tempdir().unwrap();
    let server = start_following(&pg, dir.path(), &["items"]);
    let mut client = subscribed_to_every_item(&server).await;
    let n_frames_before = client.diffs_seen.len();
    let stores_before = server.metric("ordo_postgres_transaction_stores_total");
    let n_transactions = 40;
    // The walsender is there to send while Ordo is stopped.
    wait_true(&pg, &slot_walsender("true"), "the follower's walsender streams");
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGSTOP) };
    for n in 0..n_transactions {
        pg.psql(&format!("INSERT INTO items VALUES ('i{n}', {n}, 'title {n}');")).unwrap();
    }
    wait_sent(&pg);
    // SAFETY: as above.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGCONT) };
    wait_applied(&server, n_transactions);
    let expected = postgres_window(&pg, 1000);
    assert_eq!(ordo_window(&server, 1000), expected);
    let caught_up = client
        .read_until(APPLY_TIMEOUT, |client| {
            client.lists["all"].items.iter().map(row_of).collect::<Vec<_>>() == expected
        })
        .await;
    assert!(caught_up, "the subscription does not equal PostgreSQL");
    let frames = &client.diffs_seen[n_frames_before..];
    assert_eq!(frames.len(), n_transactions as usize, "one frame per transaction");
    let seqs: Vec<u64> = frames.iter().map(|frame| frame["write_seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "a write_seq per transaction: {seqs:?}");
    let stores = server.metric("ordo_postgres_transaction_stores_total") - stores_before;
    assert!(
        stores >= 1.0 && stores < (n_transactions / 2) as f64,
        "{stores} stores for {n_transactions} transactions received together"
    );
}

/// The query over the walsender that streams the slot to Ordo (none before
/// the follower starts streaming): `what` of `pg_stat_replication`, as `r`.
fn slot_walsender(what: &str) -> String {
    format!(
        "SELECT {what} FROM pg_stat_replication r \
         JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = '{SLOT}'"
    )
}

/// Waits (bounded) until `sql` answers `t`.
fn wait_true(pg: &PostgresServer, sql: &str, what: &str) {
    let deadline = Instant::now() + APPLY_TIMEOUT;
    while pg.psql(sql).unwrap() != "t" {
        assert!(Instant::now() < deadline, "{what}: never");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the slot's walsender has sent everything committed so far
/// (its `sent_lsn`, as PostgreSQL reports it), so that it sits in Ordo's
/// socket even while Ordo is stopped.
fn wait_sent(pg: &PostgresServer) {
    let committed = pg.psql("SELECT pg_current_wal_lsn()").unwrap();
    let sent = slot_walsender(&format!("r.sent_lsn >= '{committed}'"));
    wait_true(pg, &sent, &format!("the walsender sent up to {committed}"));
}

fn create_counters_table(pg: &PostgresServer) {
    pg.psql(&format!(
        "CREATE TABLE counters (room int4, n int4, hits int8 NOT NULL, PRIMARY KEY (room, n));
         CREATE PUBLICATION {PUBLICATION} FOR TABLE counters;"
    ))
    .unwrap();
}

/// The `k`th transaction on `counters`: it inserts a row and increments every
/// row of its room, so a transaction applied twice or skipped leaves a row or
/// a count wrong.
fn counters_transaction(k: usize) -> String {
    format!(
        "BEGIN; INSERT INTO counters VALUES ({room}, {k}, 0); UPDATE counters SET hits = hits + 1 WHERE room = {room}; COMMIT;",
        room = k % 3
    )
}

/// Waits (bounded) until Ordo's `counters` equal PostgreSQL's, row for row and
/// count for count.
fn wait_counters_equal(server: &Server, pg: &PostgresServer) {
    let expected =
        pg.psql("SELECT string_agg(room || '/' || n || '=' || hits, ',' ORDER BY room, n) FROM counters").unwrap();
    let deadline = Instant::now() + APPLY_TIMEOUT;
    loop {
        let answer = server.ok("POST", "/v1/collections/counters/query", json!({"limit": 1000}));
        let mut rows: Vec<(i64, i64, String)> = answer["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| {
                let fields = &item["fields"];
                let (room, n) = (fields["room"].as_i64().unwrap(), fields["n"].as_i64().unwrap());
                assert_eq!(item["id"], format!("{room}/{n}"), "a composite key's id");
                (room, n, format!("{room}/{n}={}", fields["hits"]))
            })
            .collect();
        rows.sort();
        let got = rows.into_iter().map(|row| row.2).collect::<Vec<_>>().join(",");
        if got == expected {
            return;
        }
        assert!(Instant::now() < deadline, "Ordo holds {got}\nPostgreSQL holds {expected}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kill_9_mid_stream_and_a_postgres_restart_then_every_row_exactly_once() {
    let pg = postgres();
    create_counters_table(&pg);
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_following(&pg, dir.path(), &["counters"]);
    for k in 0..30 {
        pg.psql(&counters_transaction(k)).unwrap();
    }
    wait_applied(&server, 10);
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGKILL) };
    server.wait();
    for k in 30..45 {
        pg.psql(&counters_transaction(k)).unwrap();
    }
    let server = restart_resumed(&pg, dir.path(), &["counters"]);
    pg.stop().unwrap();
    pg.start_again().unwrap();
    for k in 45..60 {
        pg.psql(&counters_transaction(k)).unwrap();
    }
    wait_counters_equal(&server, &pg);
    let health = follower_health(&server);
    assert_eq!(health["state"], "streaming", "{health}");
    assert!(health["reconnects"].as_u64().unwrap() >= 1, "the PostgreSQL restart was lived through: {health}");
}

/// The process id of the walsender that streams the slot to Ordo, once there is one.
fn wait_walsender(pg: &PostgresServer) -> String {
    let holder = format!("SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{SLOT}' AND active");
    let deadline = Instant::now() + APPLY_TIMEOUT;
    loop {
        let pid = pg.psql(&holder).unwrap();
        if !pid.is_empty() {
            return pid;
        }
        assert!(Instant::now() < deadline, "no walsender holds the slot");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `pg_terminate_backend` of the walsender while transactions are committed:
/// the follower reconnects (a new walsender holds the slot) and resumes from
/// its stored position, every transaction applied once. The transactions
/// committed after the termination reach Ordo only through a new connection.
#[test]
fn the_walsender_terminated_mid_stream_then_a_reconnection_and_every_row_exactly_once() {
    let pg = postgres();
    create_counters_table(&pg);
    let dir = tempfile::tempdir().unwrap();
    let server = start_following(&pg, dir.path(), &["counters"]);
    let terminated_pid = wait_walsender(&pg);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            for k in 0..40 {
                pg.psql(&counters_transaction(k)).unwrap();
            }
        });
        wait_applied(&server, 10);
        let terminate = format!("SELECT pg_terminate_backend({terminated_pid})");
        assert_eq!(pg.psql(&terminate).unwrap(), "t", "the walsender was there to terminate");
        writer.join().unwrap();
    });
    for k in 40..60 {
        pg.psql(&counters_transaction(k)).unwrap();
    }
    wait_counters_equal(&server, &pg);
    let health = follower_health(&server);
    assert_eq!(health["state"], "streaming", "{health}");
    assert!(health["reconnects"].as_u64().unwrap() >= 1, "{health}");
    assert!(server.metric("ordo_postgres_reconnects_total") >= 1.0);
    assert_ne!(wait_walsender(&pg), terminated_pid, "another walsender streams the slot");
}

/// Drops the slot, retried (bounded) while the walsender of a connection that
/// just ended still holds it.
fn drop_slot(pg: &PostgresServer) {
    let deadline = Instant::now() + APPLY_TIMEOUT;
    while let Err(error) = pg.psql(&format!("SELECT pg_drop_replication_slot('{SLOT}')")) {
        assert!(Instant::now() < deadline, "the slot could not be dropped: {error}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The slot dropped while `ordo serve` was down: at the restart the follower
/// fails naming the recovery, the collection serving what it holds; that
/// recovery (a new `--pg-slot`) copies the table anew and follows it.
#[test]
fn a_dropped_slot_fails_the_follower_naming_the_recovery_which_copies_anew() {
    let pg = postgres();
    create_items_table(&pg);
    let dir = tempfile::tempdir().unwrap();
    killed_after_streaming_one_row(&pg, dir.path());
    drop_slot(&pg);
    pg.psql("INSERT INTO items VALUES ('b', 2, 'lost with the slot'); UPDATE items SET score = 5 WHERE id = 'a';")
        .unwrap();
    let server = start_following(&pg, dir.path(), &["items"]);
    let error = wait_failed_with(&server, &format!("the replication slot `{SLOT}` is lost"));
    assert!(error.contains("restart with a new --pg-slot name"), "{error}");
    assert_holds_the_streamed_row_alone(&server);
    drop(server);

    let mut args = follow_args(&pg, dir.path(), &["items"]);
    args[11] = format!("{SLOT}_2");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&dir.path().join("data"), &args);
    wait_equal(&server, &pg, "after the new slot's copy");
    pg.psql("INSERT INTO items VALUES ('c', 3, 'streamed again');").unwrap();
    wait_equal(&server, &pg, "after a transaction on the new slot");
    assert_eq!(follower_health(&server)["state"], "streaming");
}

/// A slot PostgreSQL invalidated while Ordo was down (`max_slot_wal_keep_size`
/// passed) fails the follower at the restart with the documented recovery,
/// and the collection serves what it held.
#[test]
fn a_slot_invalidated_while_ordo_was_down_fails_the_follower_naming_the_recovery() {
    let pg = postgres();
    create_items_table(&pg);
    let dir = tempfile::tempdir().unwrap();
    killed_after_streaming_one_row(&pg, dir.path());
    pg.invalidate_slot(SLOT).unwrap();
    let server = start_following(&pg, dir.path(), &["items"]);
    let error = wait_failed_with(&server, &format!("the replication slot `{SLOT}` is lost"));
    assert!(error.contains("invalidated"), "{error}");
    assert!(error.contains("restart with a new --pg-slot name"), "{error}");
    assert_holds_the_streamed_row_alone(&server);
}

/// Follows `items` into `dir`, streams the row `a`, then kills Ordo (-9).
fn killed_after_streaming_one_row(pg: &PostgresServer, dir: &std::path::Path) {
    let mut server = start_following(pg, dir, &["items"]);
    pg.psql("INSERT INTO items VALUES ('a', 1, 'streamed');").unwrap();
    wait_applied(&server, 1);
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGKILL) };
    server.wait();
}

/// The collection serves the row `killed_after_streaming_one_row` streamed, and nothing else.
fn assert_holds_the_streamed_row_alone(server: &Server) {
    let held = ordo_window(server, 10);
    assert_eq!(held, vec![json!({"id": "a", "score": 1, "title": "streamed"})], "the collection serves what it held");
}

/// How long the transaction past the bound may take to fail the follower.
const BOUND_REACHED_TIMEOUT: Duration = Duration::from_secs(300);

/// The most changes of one transaction the follower applies (`follow::MAX_TRANSACTION_CHANGES`).
const MAX_TRANSACTION_CHANGES: u64 = 524_288;

/// One transaction past the bound fails the follower with the documented
/// recovery, applying none of it (the recovery itself, a new slot and so a new
/// copy, is `a_dropped_slot_fails_the_follower_naming_the_recovery_which_copies_anew`).
#[test]
fn a_transaction_past_the_bound_fails_the_follower_naming_the_recovery_and_applies_none_of_it() {
    let pg = postgres();
    create_items_table(&pg);
    let dir = tempfile::tempdir().unwrap();
    let server = start_following(&pg, dir.path(), &["items"]);
    pg.psql("INSERT INTO items VALUES ('a', 1, 'streamed');").unwrap();
    wait_applied(&server, 1);
    let n_rows = MAX_TRANSACTION_CHANGES + 1;
    pg.psql(&format!("INSERT INTO items SELECT 'big' || n, n % 100, NULL FROM generate_series(1, {n_rows}) n;"))
        .unwrap();
    // Over half a million changes decoded by PostgreSQL and read by a debug
    // build before the bound is met: tens of seconds on a loaded 2-core machine.
    let error = wait_failed_within(&server, BOUND_REACHED_TIMEOUT);
    assert!(error.contains(&format!("more than {MAX_TRANSACTION_CHANGES} changes")), "{error}");
    assert!(error.contains("restart with a new --pg-slot name"), "{error}");
    assert_holds_the_streamed_row_alone(&server);
}

/// Ordo's `items` equal PostgreSQL's, waiting (bounded) for the last transaction to show.
fn wait_equal(server: &Server, pg: &PostgresServer, context: &str) {
    let deadline = Instant::now() + APPLY_TIMEOUT;
    loop {
        let (ordo, postgres) = (ordo_window(server, 1000), postgres_window(pg, 1000));
        if ordo == postgres {
            return;
        }
        assert!(Instant::now() < deadline, "{context}: Ordo holds {ordo:?}\nPostgreSQL holds {postgres:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncate_empties_the_collection_in_one_frame_and_stays_applied_after_a_restart() {
    let pg = postgres();
    create_items_table(&pg);
    pg.psql("INSERT INTO items SELECT 'c' || n, n, 'copied' FROM generate_series(1, 30) n;").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_following(&pg, dir.path(), &["items"]);
    pg.psql("INSERT INTO items SELECT 's' || n, n, 'streamed' FROM generate_series(1, 20) n;").unwrap();
    wait_applied(&server, 1);
    let mut client = server.connect().await;
    client
        .send(json!({"op": "subscribe", "sub": "all", "collection": "items", "sort": [{"field": "score"}], "limit": 1000}))
        .await;
    let has_every_row = |client: &common::Client| client.lists.get("all").is_some_and(|list| list.items.len() == 50);
    assert!(client.read_until(APPLY_TIMEOUT, has_every_row).await, "no first frame of the 50 rows");
    let n_frames_before = client.diffs_seen.len();

    pg.psql("TRUNCATE items;").unwrap();
    wait_applied(&server, 2);
    assert_eq!(ordo_window(&server, 1000), Vec::<Value>::new(), "emptied by the TRUNCATE");
    let is_empty = |client: &common::Client| client.lists["all"].items.is_empty();
    assert!(client.read_until(APPLY_TIMEOUT, is_empty).await, "the subscription was not emptied");
    assert_eq!(client.diffs_seen.len() - n_frames_before, 1, "the removal of every row is one frame");

    // One transaction: the row inserted before the TRUNCATE goes with it, the
    // changes after it apply after it, in order.
    pg.psql(
        "BEGIN; INSERT INTO items VALUES ('gone', 1, 'x'); TRUNCATE items;
         INSERT INTO items VALUES ('a', 1, 'kept'), ('b', 2, 'kept'); UPDATE items SET score = 5 WHERE id = 'a'; COMMIT;",
    )
    .unwrap();
    wait_applied(&server, 3);
    let expected = postgres_window(&pg, 1000);
    assert_eq!(expected.len(), 2, "{expected:?}");
    assert_eq!(ordo_window(&server, 1000), expected, "TRUNCATE then INSERT in one transaction");
    let is_expected =
        |client: &common::Client| client.lists["all"].items.iter().map(row_of).collect::<Vec<_>>() == expected;
    assert!(client.read_until(APPLY_TIMEOUT, is_expected).await, "the subscription does not equal PostgreSQL");
    assert_eq!(client.diffs_seen.len() - n_frames_before, 2, "one frame per transaction");

    // A restart resumes past the TRUNCATEs (their position was stored with
    // them): nothing truncated comes back, and later truncates still apply.
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGKILL) };
    server.wait();
    pg.psql("BEGIN; TRUNCATE items; INSERT INTO items VALUES ('after', 3, 'restart'); COMMIT;").unwrap();
    let server = restart_resumed(&pg, dir.path(), &["items"]);
    wait_applied(&server, 1);
    wait_equal(&server, &pg, "after the restart");
    assert_eq!(ordo_window(&server, 1000).len(), 1);
    assert_eq!(follower_health(&server)["state"], "streaming");
}

/// A server with a published table `big` of `n_rows` rows `(n, n)`.
fn postgres_with_big_table(n_rows: u64) -> PostgresServer {
    let pg = postgres();
    pg.psql(&format!(
        "CREATE TABLE big (id int8 PRIMARY KEY, v int8 NOT NULL);
         INSERT INTO big SELECT n, n FROM generate_series(1, {n_rows}) n;
         CREATE PUBLICATION {PUBLICATION} FOR TABLE big;"
    ))
    .unwrap();
    pg
}

/// Rows past what one batch of a TRUNCATE's removes holds (`follow::TRUNCATE_BATCH_OPS`).
const TRUNCATE_ROWS: u64 = (1 << 19) + 1000;

#[test]
fn a_truncate_of_more_items_than_one_batch_holds_empties_the_collection() {
    let pg = postgres_with_big_table(TRUNCATE_ROWS);
    let dir = tempfile::tempdir().unwrap();
    let server = start_following(&pg, dir.path(), &["big"]);
    let total = |server: &Server| server.ok("POST", "/v1/collections/big/query", json!({"limit": 1}))["total"].clone();
    assert_eq!(total(&server), TRUNCATE_ROWS, "copied");
    pg.psql("BEGIN; TRUNCATE big; INSERT INTO big VALUES (7, -7); COMMIT;").unwrap();
    wait_applied(&server, 1);
    let answer = server.ok("POST", "/v1/collections/big/query", json!({"limit": 10}));
    assert_eq!(answer["total"], 1, "{answer}");
    assert_eq!(answer["items"][0]["id"], "7");
    assert_eq!(answer["items"][0]["fields"]["v"], -7);
    assert_eq!(follower_health(&server)["state"], "streaming");
}

/// The fields of `collection` as `GET /v1/collections/NAME` lists them, `name:type`.
fn ordo_fields(server: &Server, collection: &str) -> Vec<String> {
    let answer = server.ok("GET", &format!("/v1/collections/{collection}"), Value::Null);
    let fields = answer["fields"].as_array().unwrap().iter();
    fields.map(|field| format!("{}:{}", field["name"].as_str().unwrap(), field["type"].as_str().unwrap())).collect()
}

/// Every row of `items` as `{"id", COLUMN...}`, by id.
fn postgres_rows(pg: &PostgresServer, columns: &[&str]) -> Vec<Value> {
    let pairs: Vec<String> = columns.iter().map(|column| format!("'{column}', {column}")).collect();
    postgres_json_rows(
        pg,
        &format!("SELECT json_build_object('id', id, {}) FROM items ORDER BY id COLLATE \"C\"", pairs.join(", ")),
    )
}

/// Every item of `items` in the same shape (a field Ordo does not have reads as null).
fn ordo_rows(server: &Server, columns: &[&str]) -> Vec<Value> {
    let mut rows = ordo_json_rows(server, "items", json!({"limit": 1000}), columns);
    rows.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    rows
}

#[test]
fn a_column_added_in_postgres_becomes_a_field_and_a_dropped_one_is_removed() {
    let pg = postgres();
    create_items_table(&pg);
    pg.psql("INSERT INTO items VALUES ('a', 1, 'first'), ('b', 2, 'second');").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_following(&pg, dir.path(), &["items"]);
    assert_eq!(ordo_fields(&server, "items"), ["id:string", "score:i64", "title:string"]);

    // The new layout comes inside the transaction, after a row of the old one.
    // PostgreSQL gives the rows that were there the default without writing
    // them (nothing streamed): the items take it too.
    pg.psql(
        "BEGIN; UPDATE items SET score = 10 WHERE id = 'b'; ALTER TABLE items ADD COLUMN rank int4;
         ALTER TABLE items ADD COLUMN flag bool NOT NULL DEFAULT true;
         UPDATE items SET rank = 7 WHERE id = 'a'; INSERT INTO items VALUES ('c', 3, 'third', 9, false); COMMIT;",
    )
    .unwrap();
    wait_applied(&server, 1);
    let fields = ordo_fields(&server, "items");
    assert_eq!(fields, ["id:string", "score:i64", "title:string", "rank:i64", "flag:bool"]);
    let columns = ["score", "title", "rank", "flag"];
    assert_eq!(ordo_rows(&server, &columns), postgres_rows(&pg, &columns), "after ADD COLUMN");

    pg.psql("ALTER TABLE items DROP COLUMN title; INSERT INTO items VALUES ('d', 4, 2);").unwrap();
    wait_applied(&server, 2);
    assert_eq!(ordo_fields(&server, "items"), ["id:string", "score:i64", "rank:i64", "flag:bool"]);
    let columns = ["score", "rank", "flag"];
    assert_eq!(ordo_rows(&server, &columns), postgres_rows(&pg, &columns), "after DROP COLUMN");

    // A type of the same values (int4 to int8) is followed as it was.
    pg.psql("ALTER TABLE items ALTER COLUMN rank TYPE int8; UPDATE items SET rank = 5000000000 WHERE id = 'b';")
        .unwrap();
    wait_applied(&server, 3);
    assert_eq!(ordo_rows(&server, &columns), postgres_rows(&pg, &columns), "after int4 to int8");

    // Columns added and dropped while Ordo is down: the restart resumes with
    // the fields as they were, and the stream brings them up to the table's.
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGKILL) };
    server.wait();
    pg.psql(
        "ALTER TABLE items ADD COLUMN note text; INSERT INTO items VALUES ('e', 5, 6, true, 'while down');
         ALTER TABLE items DROP COLUMN rank; UPDATE items SET note = 'later' WHERE id = 'a';",
    )
    .unwrap();
    let server = start_following(&pg, dir.path(), &["items"]);
    wait_applied(&server, 2);
    assert_eq!(ordo_fields(&server, "items"), ["id:string", "score:i64", "flag:bool", "note:string"]);
    let columns = ["score", "flag", "note"];
    assert_eq!(ordo_rows(&server, &columns), postgres_rows(&pg, &columns), "after the restart");
    assert_eq!(follower_health(&server)["state"], "streaming");
}

#[test]
fn a_column_retyped_renamed_or_of_an_unsupported_type_stops_the_follower_naming_it() {
    let cases = [
        (
            "ALTER TABLE items ALTER COLUMN score TYPE text",
            "`public.items.score` changed type in PostgreSQL from `int2/int4/int8` to `text/varchar/char/name`",
        ),
        (
            "ALTER TABLE items ADD COLUMN place point",
            "the column `public.items.place` has the type `point`, which is not followed",
        ),
        ("ALTER TABLE items RENAME COLUMN title TO headline", "`title` gone, `headline` new"),
    ];
    for (alter, expected) in cases {
        let pg = postgres();
        create_items_table(&pg);
        pg.psql("INSERT INTO items VALUES ('a', 1, 'first');").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let server = start_following(&pg, dir.path(), &["items"]);
        pg.psql(&format!("{alter}; INSERT INTO items (id, score) VALUES ('x', '5');")).unwrap();
        let error = wait_failed(&server);
        assert!(error.contains(expected), "{alter}: expected `{expected}` in {error}");
        assert!(error.contains("not followed") || error.contains("copy the table anew"), "{error}");
        let ids: Vec<Value> = ordo_rows(&server, &[]).iter().map(|row| row["id"].clone()).collect();
        assert_eq!(ids, [json!("a")], "{alter}: the transaction was not applied");
    }
}

/// `--pg-unsupported-columns skip`: a column of a type Ordo does not follow is
/// left out, at start and when one is added later, and the rest is followed;
/// with the default, the same table is refused at start naming the column.
#[test]
fn unsupported_columns_are_skipped_when_asked_and_refused_by_default() {
    let pg = postgres();
    pg.psql(&format!(
        "CREATE TABLE items (id text PRIMARY KEY, score int8 NOT NULL, shape point);
         CREATE PUBLICATION {PUBLICATION} FOR TABLE items;
         INSERT INTO items VALUES ('a', 1, '(1,2)');"
    ))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let refused = refused_start(dir.path(), &follow_args(&pg, dir.path(), &["items"]));
    assert!(refused.contains("public.items") && refused.contains("shape") && refused.contains("point"), "{refused}");

    let mut args = follow_args(&pg, dir.path(), &["items"]);
    args.extend(["--pg-unsupported-columns".to_owned(), "skip".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&dir.path().join("data"), &args);
    assert_eq!(ordo_fields(&server, "items"), ["id:string", "score:i64"]);
    pg.psql("ALTER TABLE items ADD COLUMN area box; INSERT INTO items VALUES ('b', 2, '(0,0)', '((0,0),(1,1))');")
        .unwrap();
    wait_applied(&server, 1);
    assert_eq!(ordo_fields(&server, "items"), ["id:string", "score:i64"]);
    assert_eq!(ordo_rows(&server, &["score"]), postgres_rows(&pg, &["score"]));
    assert_eq!(follower_health(&server)["state"], "streaming");
}

/// Rows in the copy test: more than one progress line's worth (every 100 000 rows).
const COPY_ROWS: u64 = 150_000;

#[test]
fn kill_9_mid_copy_then_restart_copies_every_row_once() {
    let pg = postgres_with_big_table(COPY_ROWS);
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(ordo_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(follow_args(&pg, dir.path(), &["big"]))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The progress line at 100 000 rows: 90 000 are written, the next batch is on its way.
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mid_copy = std::io::BufRead::lines(stdout)
        .map_while(Result::ok)
        .find(|line| line.contains("copying public.big: 100000 rows"));
    assert!(mid_copy.is_some(), "no progress line");
    child.kill().unwrap();
    child.wait().unwrap();
    // Changes while Ordo is down, to rows the cut copy had written: a restart
    // that kept them would show the old values or rows deleted since.
    pg.psql("DELETE FROM big WHERE id <= 1000; UPDATE big SET v = -v WHERE id BETWEEN 1001 AND 2000;").unwrap();
    let server = start_following(&pg, dir.path(), &["big"]);
    let answer = server.ok("POST", "/v1/collections/big/query", json!({"sort": [{"field": "v"}], "limit": 3}));
    assert_eq!(answer["total"], COPY_ROWS - 1000, "{}", answer["total"]);
    let lowest: Vec<&Value> = answer["items"].as_array().unwrap().iter().map(|item| &item["fields"]["v"]).collect();
    assert_eq!(lowest, [&json!(-2000), &json!(-1999), &json!(-1998)]);
    let highest =
        server.ok("POST", "/v1/collections/big/query", json!({"sort": [{"field": "v", "dir": "desc"}], "limit": 1}));
    assert_eq!(highest["items"][0]["id"], COPY_ROWS.to_string());
}

#[test]
fn writes_to_a_followed_collection_are_refused_with_read_only_source() {
    let pg = postgres();
    create_items_table(&pg);
    pg.psql("INSERT INTO items VALUES ('a', 1, 'first');").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start_following(&pg, dir.path(), &["items"]);
    let upsert = json!({"ops": [{"op": "upsert", "id": "b", "fields": {"score": 2}}]});
    let attempts = [
        ("POST", "/v1/collections/items/batch", Some(upsert.clone())),
        ("POST", "/v1/batch", Some(json!({"writes": [{"collection": "items", "ops": upsert["ops"]}]}))),
        ("DELETE", "/v1/collections/items/items/a", None),
        ("POST", "/v1/collections/items/fields", Some(json!({"name": "extra", "type": "i64", "default": 0}))),
        ("DELETE", "/v1/collections/items/fields/title", None),
        ("DELETE", "/v1/collections/items", None),
    ];
    for (method, path, body) in attempts {
        let (status, answer) = server.http(method, path, body.as_ref());
        let refused = |answer: &Value| answer["error"]["code"] == "read_only_source";
        // `POST /v1/batch` answers per part.
        let part_refused = answer["results"][0]["error"]["code"] == "read_only_source";
        assert!((status == 409 && refused(&answer)) || part_refused, "{method} {path}: {status} {answer}");
    }
    assert_eq!(ordo_window(&server, 10), postgres_window(&pg, 10), "nothing written through Ordo");
    // The position's reserved collection is neither listed nor reachable.
    let listed = server.ok("GET", "/v1/collections", Value::Null);
    let names: Vec<&str> =
        listed["collections"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["items"], "{listed}");
    let (status, _) = server.http("POST", "/v1/collections/_ordo%2Fpostgres/query", Some(&json!({"limit": 1})));
    assert!(status == 403 || status == 404, "{status}");
    // Another collection is writable as ever.
    server.ok("PUT", "/v1/collections/notes", json!({"fields": [{"name": "score", "type": "i64"}]}));
    server.ok("POST", "/v1/collections/notes/batch", upsert);
}

#[test]
fn bad_configs_are_refused_at_start_with_the_reason() {
    let pg = postgres();
    create_items_table(&pg);
    pg.psql("CREATE TABLE no_key (a int4); ALTER PUBLICATION ordo_pub ADD TABLE no_key; CREATE TABLE other (id int4 PRIMARY KEY);")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str, &str); 6] = [
        (&["no_key"], "", "no primary key"),
        (&["other"], "", "not in the publication"),
        (&["missing"], "", "does not exist"),
        (&["items:items:nope"], "", "no column `nope`"),
        (&["items:_ordo/x"], "", "_ordo"),
        (&["items"], "wrong-password", "password"),
    ];
    for (tables, password, expected) in cases {
        let mut args = follow_args(&pg, dir.path(), tables);
        if !password.is_empty() {
            std::fs::write(dir.path().join("pg-password"), password).unwrap();
        }
        let output = refused_start(dir.path(), &args);
        assert!(output.contains(expected), "{tables:?}: expected `{expected}` in {output}");
        assert!(!output.contains(&pg.password), "the password is never printed: {output}");
        args.clear();
    }
    let mut relaxed = follow_args(&pg, dir.path(), &["items"]);
    relaxed.extend(["--durability".to_owned(), "relaxed".to_owned()]);
    assert!(refused_start(dir.path(), &relaxed).contains("--pg-table needs --durability full"));
    let mut args = follow_args(&pg, dir.path(), &["items"]);
    args[9] = "no_such_pub".to_owned();
    assert!(refused_start(dir.path(), &args).contains("publication `no_such_pub` does not exist"));
}

/// `follow_args` logging in as `role` with `password` instead of the superuser.
fn follow_args_as(pg: &PostgresServer, dir: &Path, (role, password): (&str, &str), tables: &[&str]) -> Vec<String> {
    let mut args = follow_args(pg, dir, tables);
    args[5] = role.to_owned();
    std::fs::write(dir.join("pg-password"), password).unwrap();
    args
}

/// A first start with `--pg-create-publication` and no publication creates it
/// for the followed tables, quoting its name (this one holds a quote, a
/// semicolon and a space), says so, and follows what is written afterwards.
#[test]
fn a_missing_publication_is_created_when_allowed_and_its_table_followed() {
    let pg = postgres();
    pg.psql(
        "CREATE TABLE items (id text PRIMARY KEY, score int8 NOT NULL, title text);
         INSERT INTO items VALUES ('a', 1, 'copied');",
    )
    .unwrap();
    let publication = "new \"pub\"; DROP TABLE items";
    let dir = tempfile::tempdir().unwrap();
    let mut args = follow_args(&pg, dir.path(), &["items"]);
    args[9] = publication.to_owned();
    args.push("--pg-create-publication".to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let options = StartOptions { capture_stderr: true, ..StartOptions::default() };
    let server = Server::start_with(&dir.path().join("data"), &args, options);
    let lines = server.wait_for_stderr_line(|line| line.contains("following PostgreSQL"));
    assert!(lines.iter().any(|line| line.contains("created the PostgreSQL publication")), "{lines:#?}");
    let published =
        pg.psql("SELECT pubname || '=' || schemaname || '.' || tablename FROM pg_publication_tables").unwrap();
    assert_eq!(published, format!("{publication}=public.items"));
    assert_eq!(ordo_window(&server, 10), postgres_window(&pg, 10), "after the copy");
    pg.psql("INSERT INTO items VALUES ('b', 2, 'streamed'); UPDATE items SET score = 3 WHERE id = 'a';").unwrap();
    wait_applied(&server, 1);
    assert_eq!(ordo_window(&server, 10), postgres_window(&pg, 10), "after a transaction");
    assert_eq!(ordo_window(&server, 10).len(), 2);
}

/// `--pg-create-publication` with a role PostgreSQL does not let create it:
/// refused at start, naming the publication and the privileges it takes. An
/// existing publication is used as it is, never altered: a followed table it
/// lacks is refused as without the option.
#[test]
fn creating_the_publication_without_the_privilege_is_refused_naming_it_and_an_existing_one_is_not_altered() {
    let pg = postgres();
    pg.psql(
        "CREATE TABLE items (id text PRIMARY KEY, score int8 NOT NULL, title text);
         CREATE ROLE ordo_follower LOGIN REPLICATION PASSWORD 'follower-password';
         GRANT SELECT ON items TO ordo_follower;",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut args = follow_args_as(&pg, dir.path(), ("ordo_follower", "follower-password"), &["items"]);
    args.push("--pg-create-publication".to_owned());
    let needs = "needs the CREATE privilege on the database and ownership of every followed table";
    // PostgreSQL checks the database privilege first, then each table's owner.
    let refused = refused_start(dir.path(), &args);
    assert!(refused.contains("cannot create the publication `ordo_pub`: permission denied for database"), "{refused}");
    assert!(refused.contains(needs), "{refused}");
    pg.psql("GRANT CREATE ON DATABASE postgres TO ordo_follower;").unwrap();
    let refused = refused_start(dir.path(), &args);
    assert!(refused.contains("cannot create the publication `ordo_pub`: must be owner of table items"), "{refused}");
    assert!(refused.contains(needs), "{refused}");
    assert_eq!(pg.psql("SELECT count(*) FROM pg_publication").unwrap(), "0");

    pg.psql("CREATE TABLE other (id int4 PRIMARY KEY); CREATE PUBLICATION ordo_pub FOR TABLE other;").unwrap();
    let mut args = follow_args(&pg, dir.path(), &["items"]);
    args.push("--pg-create-publication".to_owned());
    let refused = refused_start(dir.path(), &args);
    assert!(refused.contains("the table `public.items` is not in the publication `ordo_pub`"), "{refused}");
    assert_eq!(pg.psql("SELECT tablename FROM pg_publication_tables").unwrap(), "other");
}

/// `follow_args` over TCP to `host` on `pg`'s port, TLS verified with `ca_pem`.
fn follow_args_tls(pg: &PostgresServer, dir: &Path, tables: &[&str], host: &str, ca_pem: &str) -> Vec<String> {
    let mut args = follow_args(pg, dir, tables);
    args[1] = host.to_owned();
    args[3] = pg.port().to_string();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    args.extend(["--pg-tls-ca-file".to_owned(), ca_file.to_str().unwrap().to_owned()]);
    args
}

#[test]
fn ordo_serve_follows_over_tls_on_the_replication_and_the_plain_connections() {
    let certificates = TestCertificates::new("Ordo test CA").unwrap();
    // Only TLS connections over TCP: a connection of Ordo's without it would be refused.
    let hba = "local all all scram-sha-256\nhostssl all all 127.0.0.1/32 scram-sha-256\n".to_owned();
    let options = ServerOptions { tcp: true, tls: Some(certificates.server.clone()), hba: Some(hba) };
    let pg = PostgresServer::start_with(&options).unwrap();
    create_items_table(&pg);
    pg.psql("INSERT INTO items VALUES ('a', 1, 'copied');").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args = follow_args_tls(&pg, dir.path(), &["items"], "localhost", &certificates.ca_pem);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&dir.path().join("data"), &args);
    assert_eq!(ordo_window(&server, 10), postgres_window(&pg, 10), "copied over TLS");
    // The walsender's connection, once the follower streams (pg_hba admits nothing else over TCP).
    let deadline = Instant::now() + APPLY_TIMEOUT;
    let encrypted = "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
                     WHERE application_name = 'ordo' AND backend_type = 'walsender' AND ssl";
    while pg.psql(encrypted).unwrap() != "1" {
        assert!(Instant::now() < deadline, "no walsender of Ordo's over TLS");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A column added with a default: the follower reads it on a short plain connection.
    pg.psql("ALTER TABLE items ADD COLUMN flag bool NOT NULL DEFAULT true; INSERT INTO items VALUES ('b', 2, 'streamed', false);")
        .unwrap();
    wait_applied(&server, 1);
    assert_eq!(ordo_rows(&server, &["score", "flag"]), postgres_rows(&pg, &["score", "flag"]));
    assert_eq!(follower_health(&server)["state"], "streaming");

    // The CA of another: refused at start, naming the verification failure.
    let other = TestCertificates::new("Another CA").unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let refused = refused_start(
        other_dir.path(),
        &follow_args_tls(&pg, other_dir.path(), &["items"], "127.0.0.1", &other.ca_pem),
    );
    assert!(refused.contains("invalid peer certificate") && refused.contains("UnknownIssuer"), "{refused}");
}

fn wait_streaming(server: &Server) {
    let deadline = Instant::now() + APPLY_TIMEOUT;
    while follower_health(server)["state"] != "streaming" {
        assert!(Instant::now() < deadline, "not streaming: {}", follower_health(server));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `/v1/health` names `expected` in the follower's error; returns it.
fn wait_failed_with(server: &Server, expected: &str) -> String {
    let error = wait_failed(server);
    assert!(error.contains(expected), "expected `{expected}` in {error}");
    error
}

#[test]
fn a_followed_table_leaving_the_publication_stops_the_follower_naming_it_now_and_at_a_restart() {
    let pg = postgres();
    create_items_table(&pg);
    pg.psql("CREATE TABLE other (id int4 PRIMARY KEY); ALTER PUBLICATION ordo_pub ADD TABLE other;").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_following(&pg, dir.path(), &["items", "other"]);
    pg.psql("INSERT INTO items VALUES ('a', 1, 'x');").unwrap();
    wait_applied(&server, 1);
    // PostgreSQL sends nothing for this: the periodic check finds it.
    pg.psql("ALTER PUBLICATION ordo_pub DROP TABLE items; INSERT INTO items VALUES ('b', 2, 'lost');").unwrap();
    wait_failed_with(&server, "`public.items` is no longer in the publication `ordo_pub`");
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGKILL) };
    server.wait();
    // At a restart the server serves what it holds, the follower failed.
    let server = start_following(&pg, dir.path(), &["items", "other"]);
    wait_failed_with(&server, "the table `public.items` is not in the publication `ordo_pub`");
    assert_eq!(ordo_rows(&server, &["score"]).len(), 1, "the collection is served as it was");
    // A dropped table, found by the check too.
    pg.psql("ALTER PUBLICATION ordo_pub ADD TABLE items;").unwrap();
    drop(server);
    let server = start_following(&pg, dir.path(), &["items", "other"]);
    wait_streaming(&server);
    pg.psql("DROP TABLE other;").unwrap();
    wait_failed_with(&server, "`public.other` was dropped");
}

/// The rows of table `extra` (id, v) in PostgreSQL and in Ordo's collection `extra`.
fn extra_rows(pg: &PostgresServer, server: &Server) -> (Vec<String>, Vec<String>) {
    let postgres = pg.psql("SELECT id || '=' || v FROM extra ORDER BY id").unwrap();
    let postgres: Vec<String> = postgres.lines().map(str::to_owned).collect();
    let answer = server.ok("POST", "/v1/collections/extra/query", json!({"limit": 1000}));
    let mut ordo: Vec<(i64, String)> = answer["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            let id = item["fields"]["id"].as_i64().unwrap();
            (id, format!("{id}={}", item["fields"]["v"]))
        })
        .collect();
    ordo.sort();
    (postgres, ordo.into_iter().map(|(_, row)| row).collect())
}

fn transactions_applied(server: &Server) -> u64 {
    follower_health(server)["transactions_applied"].as_u64().unwrap()
}

#[test]
fn a_table_newly_followed_at_a_restart_is_copied_and_one_no_longer_followed_keeps_its_collection() {
    let pg = postgres();
    create_items_table(&pg);
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_following(&pg, dir.path(), &["items"]);
    // A table added to the publication but not followed: ignored.
    pg.psql(
        "CREATE TABLE extra (id int4 PRIMARY KEY, v int8 NOT NULL);
         INSERT INTO extra SELECT n, n FROM generate_series(1, 5) n;
         ALTER PUBLICATION ordo_pub ADD TABLE extra;
         UPDATE extra SET v = v + 100;
         INSERT INTO items VALUES ('a', 1, 'x');",
    )
    .unwrap();
    wait_applied(&server, 1);
    assert_eq!(transactions_applied(&server), 1, "the unfollowed table's transaction was not applied");
    let listed = server.ok("GET", "/v1/collections", Value::Null);
    assert_eq!(listed["collections"].as_array().unwrap().len(), 1, "{listed}");
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGKILL) };
    server.wait();
    // Changes between the stored position and the new table's copy: in the copy, and skipped in the stream.
    pg.psql("UPDATE extra SET v = -v WHERE id <= 2; DELETE FROM extra WHERE id = 3; INSERT INTO extra VALUES (6, 6);")
        .unwrap();
    let mut server = restart_resumed(&pg, dir.path(), &["items", "extra"]);
    let (postgres, ordo) = extra_rows(&pg, &server);
    assert_eq!(ordo, postgres, "copied at the restart");
    pg.psql("UPDATE extra SET v = 0 WHERE id = 6;").unwrap();
    wait_applied(&server, 1);
    let (postgres, ordo) = extra_rows(&pg, &server);
    assert_eq!(ordo, postgres, "streamed after its copy");
    assert_eq!(transactions_applied(&server), 1, "the changes in the copy were not applied again");
    assert_eq!(follower_health(&server)["state"], "streaming");

    // `items` no longer followed: its collection stays as it was, writable.
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGKILL) };
    server.wait();
    let server = restart_resumed(&pg, dir.path(), &["extra"]);
    pg.psql("INSERT INTO items VALUES ('b', 2, 'not followed'); INSERT INTO extra VALUES (7, 7);").unwrap();
    wait_applied(&server, 1);
    assert_eq!(extra_rows(&pg, &server).1.len(), 6);
    let ids: Vec<Value> = ordo_rows(&server, &[]).iter().map(|row| row["id"].clone()).collect();
    assert_eq!(ids, [json!("a")], "items keeps what it held");
    server.ok(
        "POST",
        "/v1/collections/items/batch",
        json!({"ops": [{"op": "upsert", "id": "c", "fields": {"score": 3}}]}),
    );
}

/// A lag that only a WAL end past the transaction being read can give: about
/// 300 single-row transactions.
const LAG_BEHIND_BYTES: u64 = 64 * 1024;

#[test]
fn lag_bytes_reads_above_zero_while_behind_and_zero_once_caught_up() {
    let pg = postgres();
    create_items_table(&pg);
    let dir = tempfile::tempdir().unwrap();
    let server = start_following(&pg, dir.path(), &["items"]);
    // Ordo held (SIGSTOP) while PostgreSQL commits a burst of single-row
    // transactions: once it runs again it has all of them to apply, and the
    // walsender, its socket full, sends no keepalive meanwhile.
    // Enough that applying them, many per group commit, takes longer than the
    // lag probe's period.
    let n_transactions: u64 = 200_000;
    let burst = format!(
        "DO $$ BEGIN FOR n IN 0..{} LOOP INSERT INTO items VALUES ('b' || n, n, NULL); COMMIT; END LOOP; END $$;",
        n_transactions - 1
    );
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGSTOP) };
    let committed = pg.psql(&burst);
    // SAFETY: as above.
    unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGCONT) };
    committed.unwrap();
    let mut seen_behind = None;
    let deadline = Instant::now() + APPLY_TIMEOUT;
    while seen_behind.is_none() && Instant::now() < deadline {
        let health = follower_health(&server);
        // More than a few transactions' WAL: while gathering one, the stream
        // alone knows the WAL up to the change it reads, no further.
        let behind = health["transactions_applied"].as_u64().unwrap() < n_transactions;
        if behind && health["lag_bytes"].as_u64().unwrap() > LAG_BEHIND_BYTES {
            seen_behind = Some(health);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(seen_behind.is_some(), "lag_bytes never read above {LAG_BEHIND_BYTES} while Ordo was behind");
    println!("behind: {}", seen_behind.unwrap());
    wait_applied(&server, n_transactions);
    let deadline = Instant::now() + APPLY_TIMEOUT;
    loop {
        let health = follower_health(&server);
        if health["lag_bytes"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "lag_bytes stays above 0 once caught up: {health}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.metric("ordo_postgres_lag_bytes"), 0.0);
}

/// A random window of `items`: its direction, a lowest score (or none), offset and limit.
#[derive(Debug)]
struct RandomWindow {
    descending: bool,
    min_score: Option<i64>,
    offset: usize,
    limit: usize,
}

impl RandomWindow {
    fn new(rng: &mut Rng) -> RandomWindow {
        RandomWindow {
            descending: rng.below(2) == 1,
            min_score: (rng.below(3) == 0).then(|| rng.below(20) as i64 - 5),
            offset: rng.below(6),
            limit: 1 + rng.below(15),
        }
    }

    /// PostgreSQL's answer: the same order (the id in byte order breaks ties, ascending in both directions).
    fn in_postgres(&self, pg: &PostgresServer) -> Vec<Value> {
        let filter = self.min_score.map_or(String::new(), |min| format!("WHERE score >= {min}"));
        let dir = if self.descending { "DESC" } else { "ASC" };
        postgres_json_rows(
            pg,
            &format!(
                "SELECT json_build_object('id', id, 'score', score, 'title', title) FROM items {filter}
                 ORDER BY score {dir}, id COLLATE \"C\" LIMIT {} OFFSET {}",
                self.limit, self.offset
            ),
        )
    }

    fn in_ordo(&self) -> OrdoWindow {
        let mut query = json!({
            "sort": [{"field": "score", "dir": if self.descending { "desc" } else { "asc" }}],
            "offset": self.offset,
            "limit": self.limit,
        });
        if let Some(min) = self.min_score {
            query["filter"] = json!({"field": "score", "op": "ge", "value": min});
        }
        OrdoWindow { collection: "items", query, fields: &["score", "title"] }
    }
}

/// A title PostgreSQL keeps out of line (the column's storage is `EXTERNAL`
/// and it is over 2 KiB): an update that does not touch it streams it as
/// "unchanged TOAST", which the follower must read as the old value.
fn big_title(n: u64) -> String {
    format!("{n}:{}", "t".repeat(3_000))
}

/// One random transaction of the richer mix: what `random_transaction` does,
/// plus, now and then, a TRUNCATE, a big TOASTed title, or an update of the
/// score alone of a row that has one.
fn rich_transaction(rng: &mut Rng, ids: &mut Vec<String>, next_id: &mut u64) -> String {
    let mut sql = String::from("BEGIN;\n");
    match rng.below(10) {
        0 => {
            sql.push_str("TRUNCATE items;\n");
            ids.clear();
        }
        1 | 2 => {
            *next_id += 1;
            let id = format!("b{next_id}");
            let score = rng.below(20) as i64 - 5;
            sql.push_str(&format!("INSERT INTO items VALUES ('{id}', {score}, '{}');\n", big_title(*next_id)));
            ids.push(id);
        }
        3 | 4 => {
            // The score alone: a big title stays as it was (sent as unchanged TOAST).
            sql.push_str(&format!(
                "UPDATE items SET score = score + {} WHERE id IN (SELECT id FROM items WHERE id LIKE 'b%' ORDER BY id LIMIT 3);\n",
                1 + rng.below(4)
            ));
        }
        _ => {}
    }
    // At least one row change, so that every transaction reaches Ordo.
    *next_id += 1;
    let id = format!("i{next_id}");
    sql.push_str(&format!("INSERT INTO items VALUES ('{id}', {}, 'x');\n", rng.below(20) as i64 - 5));
    ids.push(id);
    let rest = random_transaction(rng, ids, next_id);
    sql.push_str(rest.trim_start_matches("BEGIN;\n"));
    sql
}

/// PostgreSQL is the reference for random windows (direction, a filter, an
/// offset, a limit) through random transactions that include TRUNCATEs,
/// TOASTed values left unchanged by updates, and a column added midway: new
/// one-shot queries after each transaction, and windows subscribed after the
/// copy, kept by their diffs (and the Reset the added column brings).
#[test]
fn random_windows_equal_postgres_through_truncates_toasted_values_and_a_column_added() {
    let seed = model_seed();
    let mut rng = Rng::new(seed);
    let pg = postgres();
    create_items_table(&pg);
    pg.psql("ALTER TABLE items ALTER COLUMN title SET STORAGE EXTERNAL;").unwrap();
    pg.psql("INSERT INTO items SELECT 'c' || n, n % 7, NULL FROM generate_series(0, 29) n;").unwrap();
    let mut ids: Vec<String> = (0..30).map(|n| format!("c{n}")).collect();
    let dir = tempfile::tempdir().unwrap();
    let server = start_following(&pg, dir.path(), &["items"]);
    let live: Vec<RandomWindow> = (0..3).map(|_| RandomWindow::new(&mut rng)).collect();
    let mut subscribed = LiveWindows::subscribe(&server, live.iter().map(RandomWindow::in_ordo).collect());
    let mut next_id = 0;
    let n_transactions = 40;
    for n in 1..=n_transactions {
        let mut sql = rich_transaction(&mut rng, &mut ids, &mut next_id);
        if n == n_transactions / 2 {
            sql = sql.replacen("BEGIN;\n", "BEGIN;\nALTER TABLE items ADD COLUMN rank int8 NOT NULL DEFAULT 7;\n", 1);
        }
        pg.psql(&sql).unwrap();
        wait_applied(&server, n);
        subscribed.settle();
        for (window, (_, rows)) in live.iter().zip(subscribed.rows()) {
            assert_eq!(rows, window.in_postgres(&pg), "live {window:?} after {sql} (seed {seed})");
        }
        for _ in 0..3 {
            let window = RandomWindow::new(&mut rng);
            assert_eq!(
                window.in_ordo().query_rows(&server),
                window.in_postgres(&pg),
                "desc {} min {:?} offset {} limit {} after {sql} (seed {seed})",
                window.descending,
                window.min_score,
                window.offset,
                window.limit
            );
        }
    }
    assert_eq!(ordo_rows(&server, &["score", "rank"]), postgres_rows(&pg, &["score", "rank"]), "seed {seed}");
}
