//! PostgreSQL is the reference: random SQL transactions (inserts, updates of
//! sort keys and of primary keys, updates that leave a TOASTed value of more
//! than 2 KiB unchanged, deletes, truncates, columns added and dropped) run
//! against the real server while
//! a mirror follows the stream. After each, once the mirror applied the
//! transaction (a marker row carries the step's number), the mirror equals the
//! table. Meanwhile the follower "crashes" (its unconfirmed work is lost and it
//! resumes from the last position it made durable), its walsender is
//! terminated, and PostgreSQL restarts: every transaction is applied exactly
//! once (the marker's step moves by one each time, positions only grow), and
//! the slot never passes the commit of a transaction the follower did not
//! make durable.

use std::collections::BTreeMap;

use ordo_pgsource::{ChangeStream, Lsn, Table, Value};
use ordo_test_kit::postgres::PostgresServer;
use ordo_test_kit::rng::Rng;

use crate::harness::{follow, mirror_lines, postgres_lines, resume, Mirror, PUBLICATION};

const ITEMS: usize = 0;
const MARKER: usize = 1;
/// The size of the values kept out of line: above PostgreSQL's 2 KiB TOAST threshold.
const BIG_BYTES: usize = 3000;

/// The columns `items` starts with.
const ITEMS_COLUMNS: [&str; 8] = ["id", "part", "score", "name", "big", "ts", "amount", "ok"];

/// The columns of `items` now, as the model changes them.
struct ItemsSchema {
    columns: Vec<String>,
    /// The added column, while there is one.
    extra: Option<String>,
}

impl ItemsSchema {
    /// The query whose rows the mirror's must equal (timestamps as µs since the epoch).
    fn query(&self) -> String {
        let expressions: Vec<String> = self
            .columns
            .iter()
            .map(|column| match column.as_str() {
                "ts" => "(extract(epoch FROM ts) * 1000000)::int8".to_owned(),
                other => other.to_owned(),
            })
            .collect();
        format!("SELECT {} FROM items", expressions.join(", "))
    }

    fn column_names(&self) -> Vec<&str> {
        self.columns.iter().map(String::as_str).collect()
    }

    /// Every 20 steps (so that every run has some) and now and then, a column
    /// added or the added one dropped: the DDL of the step.
    fn random_change(&mut self, rng: &mut Rng, step: u64) -> Option<String> {
        if step % 20 != 10 && !rng.chance(5) {
            return None;
        }
        match self.extra.take() {
            None => {
                let name = format!("extra_{step}");
                self.columns.push(name.clone());
                self.extra = Some(name.clone());
                Some(format!("ALTER TABLE items ADD COLUMN {name} int8"))
            }
            Some(name) => {
                self.columns.retain(|column| *column != name);
                Some(format!("ALTER TABLE items DROP COLUMN {name}"))
            }
        }
    }
}

fn set_up(server: &PostgresServer) {
    server
        .psql(&format!(
            "CREATE TABLE items (id int8, part text, score int4, name text, big text, ts timestamptz, amount numeric, \
               ok bool, PRIMARY KEY (part, id));
             ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL;
             CREATE TABLE marker (id int PRIMARY KEY, step int8);
             INSERT INTO marker VALUES (1, 0);
             INSERT INTO items SELECT g, 'a', g % 7, 'n' || g, repeat(chr(65 + g % 26), {BIG_BYTES}),
               '2024-01-01'::timestamptz + g * interval '1.5 second', g * 10, g % 2 = 0 FROM generate_series(1, 20) g;
             CREATE PUBLICATION {PUBLICATION} FOR TABLE items, marker;"
        ))
        .unwrap();
}

/// One random statement on `items`.
fn random_statement(rng: &mut Rng, step: u64, schema: &ItemsSchema) -> String {
    let id = rng.below(30);
    let part = rng.pick(&["a", "b"]);
    if let Some(extra) = &schema.extra {
        if rng.chance(15) {
            return format!("UPDATE items SET {extra} = {step} WHERE id <= {id}");
        }
    }
    match rng.below(100) {
        0..=29 => format!(
            "INSERT INTO items (id, part, score, name, big, ts, amount, ok) VALUES ({id}, '{part}', {}, 'i{step}', repeat('{}', {BIG_BYTES}), \
               '2024-06-01 12:00:00.123456+00'::timestamptz + {step} * interval '1 minute', {}, {}) ON CONFLICT DO NOTHING",
            rng.below(50),
            rng.pick(&["p", "q", "r"]),
            rng.below(1000) as i64 - 500,
            rng.chance(50)
        ),
        30..=49 => format!("UPDATE items SET score = {}, name = 'u{step}' WHERE id = {id}", rng.below(50)),
        // A new key no row has: two key changes in one step must not meet.
        50..=59 => format!("UPDATE items SET id = (SELECT max(id) + 1 FROM items) WHERE id = {id} AND part = '{part}'"),
        60..=69 => format!("UPDATE items SET big = repeat('z{step}', {}) WHERE id = {id}", BIG_BYTES / 2),
        70..=79 => format!("UPDATE items SET ok = NOT ok, name = NULL WHERE part = '{part}' AND id < {id}"),
        80..=95 => format!("DELETE FROM items WHERE id = {id}"),
        _ => "TRUNCATE items".to_owned(),
    }
}

/// The marker's step in the mirror.
fn marker_step(mirror: &Mirror) -> i64 {
    match mirror.tables[MARKER].values().next().and_then(|row| row.get("step")) {
        Some(Value::Int(step)) => *step,
        other => panic!("the marker row holds {other:?}"),
    }
}

struct Follower {
    /// `None` only while the follower is down.
    stream: Option<ChangeStream>,
    mirror: Mirror,
    durable: Mirror,
    /// Where each step's commit record starts, as the stream handed it over:
    /// the slot must never pass the commit of a step that is not durable.
    commit_lsns: BTreeMap<i64, Lsn>,
}

impl Follower {
    /// Applies transactions until the mirror holds step `step`; each moves the
    /// marker by exactly one, and a step handed over again (after a resume)
    /// is the same commit.
    async fn catch_up(&mut self, step: i64) -> Result<(), ordo_pgsource::Error> {
        while marker_step(&self.mirror) < step {
            let transaction = self.stream().next_transaction().await?;
            let before = marker_step(&self.mirror);
            self.mirror.apply(&transaction);
            let after = marker_step(&self.mirror);
            assert_eq!(after, before + 1, "a transaction skipped or applied twice");
            let first_seen = *self.commit_lsns.entry(after).or_insert(transaction.commit_lsn);
            assert_eq!(first_seen, transaction.commit_lsn, "step {after} handed over again as another commit");
        }
        Ok(())
    }

    /// Loses what was not made durable and resumes from the durable position.
    async fn crash_and_resume(&mut self, server: &PostgresServer, tables: &[Table]) {
        self.mirror = self.durable.clone();
        // The old connection closes first, as a dead process's would.
        self.stream = None;
        self.stream = Some(resume(server, tables, self.durable.applied).await.unwrap());
    }

    /// Stores the mirror (the data and its position together), then confirms;
    /// a connection lost meanwhile is resumed from what is now durable.
    async fn make_durable(&mut self, server: &PostgresServer, tables: &[Table]) {
        self.durable = self.mirror.clone();
        let applied = self.durable.applied;
        if let Err(error) = self.stream().confirm(applied).await {
            assert!(error.is_transient(), "{error}");
            self.crash_and_resume(server, tables).await;
        }
    }

    /// [`Follower::catch_up`], resuming once if the connection is lost.
    async fn catch_up_resuming_once(&mut self, server: &PostgresServer, tables: &[Table], step: i64, seed: u64) {
        if let Err(error) = self.catch_up(step).await {
            assert!(error.is_transient(), "seed {seed} step {step}: {error}");
            self.crash_and_resume(server, tables).await;
            self.catch_up(step).await.unwrap();
        }
    }

    fn stream(&mut self) -> &mut ChangeStream {
        self.stream.as_mut().expect("a running follower")
    }
}

async fn run_model(seed: u64, steps: u64) {
    let server = PostgresServer::start().unwrap();
    set_up(&server);
    let (stream, mirror, tables) = follow(&server, &["items", "marker"], 1_000_000).await;
    let mut schema = ItemsSchema { columns: ITEMS_COLUMNS.map(str::to_owned).to_vec(), extra: None };
    let difference = first_difference(
        &mirror_lines(&mirror, ITEMS, &schema.column_names()),
        &postgres_lines(&server, &schema.query()),
    );
    assert!(difference.is_none(), "the initial copy: {}", difference.unwrap());
    let mut follower = Follower { stream: Some(stream), durable: mirror.clone(), mirror, commit_lsns: BTreeMap::new() };
    let mut rng = Rng::new(seed);
    for step in 1..=steps {
        let mut statements: Vec<String> = schema.random_change(&mut rng, step).into_iter().collect();
        statements.extend((0..1 + rng.below(4)).map(|_| random_statement(&mut rng, step, &schema)));
        let sql = format!("BEGIN; {}; UPDATE marker SET step = {step}; COMMIT;", statements.join("; "));
        server.psql(&sql).unwrap_or_else(|error| panic!("seed {seed} step {step}: {sql}: {error}"));
        inject_fault(&mut rng, &server, &mut follower, &tables).await;
        follower.catch_up_resuming_once(&server, &tables, step as i64, seed).await;
        let difference = first_difference(
            &mirror_lines(&follower.mirror, ITEMS, &schema.column_names()),
            &postgres_lines(&server, &schema.query()),
        );
        assert!(difference.is_none(), "seed {seed} step {step}: after {sql}: {}", difference.unwrap());
        if rng.chance(40) {
            follower.make_durable(&server, &tables).await;
        }
    }
    // A last step, applied but never made durable, so that there is always
    // a first step that is not durable.
    let last = steps as i64 + 1;
    server.psql(&format!("UPDATE marker SET step = {last}")).unwrap();
    follower.catch_up_resuming_once(&server, &tables, last, seed).await;
    // The stream may confirm a keepalive's position past the durable one (no
    // followed commit lies between), never the next step's commit: PostgreSQL
    // would skip that step on the next resume.
    let first_not_durable = marker_step(&follower.durable) + 1;
    let its_commit = follower.commit_lsns[&first_not_durable];
    let slot_position = server.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots").unwrap();
    let slot_position = Lsn::parse(&slot_position).unwrap();
    assert!(
        slot_position <= its_commit,
        "seed {seed}: the slot is at {slot_position}, past the commit of step {first_not_durable} ({its_commit}), which the \
         follower never made durable"
    );
}

/// The first row where the mirror and PostgreSQL differ, shortened to be read.
fn first_difference(mirror: &[String], postgres: &[String]) -> Option<String> {
    let short = |line: Option<&String>| line.map_or("(none)".to_owned(), |line| line.chars().take(120).collect());
    (0..mirror.len().max(postgres.len())).find(|row| mirror.get(*row) != postgres.get(*row)).map(|row| {
        format!(
            "{} rows in the mirror, {} in PostgreSQL; row {row}: mirror {}, PostgreSQL {}",
            mirror.len(),
            postgres.len(),
            short(mirror.get(row)),
            short(postgres.get(row))
        )
    })
}

/// A crash of the follower, its walsender terminated, or PostgreSQL restarted.
async fn inject_fault(rng: &mut Rng, server: &PostgresServer, follower: &mut Follower, tables: &[Table]) {
    match rng.below(100) {
        0..=7 => follower.crash_and_resume(server, tables).await,
        8..=13 => {
            let pid = follower.stream().backend_pid();
            server.psql(&format!("SELECT pg_terminate_backend({pid})")).unwrap();
        }
        14..=16 => {
            server.stop().unwrap();
            server.start_again().unwrap();
        }
        _ => {}
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_followed_table_equals_postgres_after_every_transaction() {
    let seed = std::env::var("ORDO_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (ORDO_SEED={seed} replays it)");
    run_model(seed, 60).await;
}
