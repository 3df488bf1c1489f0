//! Bad configurations and data are refused with an error naming what to fix;
//! a copy cut short starts over; a lost slot is a loud error; the lag is what
//! the caller has not confirmed; keepalives move the slot between transactions.

use std::time::Duration;

use ordo_pgsource::catalog::{describe_tables, TableName, UnsupportedColumns};
use ordo_pgsource::copy::create_slot_and_copy;
use ordo_pgsource::error::SQLSTATE_INVALID_PASSWORD;
use ordo_pgsource::stream::Backoff;
use ordo_pgsource::{ChangeStream, Connection, Error, Mode};
use ordo_test_kit::postgres::PostgresServer;

use crate::harness::{
    connect_config, describe, follow, mirror_lines, postgres_lines, replication_connection, resume, stream_config,
    Mirror, PUBLICATION, SLOT,
};

/// Retries of a transient refusal: enough for a loaded machine (about a minute).
const RETRIES: usize = 130;

fn retry_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(10), Duration::from_millis(500))
}

fn server_with(sql: &str) -> PostgresServer {
    let server = PostgresServer::start().unwrap();
    server.psql(sql).unwrap();
    server
}

#[tokio::test(flavor = "current_thread")]
async fn a_wrong_password_is_refused_and_never_printed() {
    let server = PostgresServer::start().unwrap();
    let mut config = connect_config(&server);
    config.password = Some("not-the-password".into());
    let Err(Error::Server(error)) = Connection::connect(&config, Mode::Replication).await else {
        panic!("a wrong password was accepted")
    };
    assert_eq!(error.code, SQLSTATE_INVALID_PASSWORD, "{error:?}");
    let printed = format!("{config:?}");
    assert!(!printed.contains("not-the-password"), "the password is printed: {printed}");
    assert!(Connection::connect(&connect_config(&server), Mode::Replication).await.is_ok());
}

#[tokio::test(flavor = "current_thread")]
async fn tables_the_source_cannot_follow_are_refused_by_name() {
    let server = server_with(&format!(
        "CREATE TABLE keyless (a int); CREATE TABLE blobs (id int PRIMARY KEY, data bytea);
         CREATE TABLE good (id int PRIMARY KEY); CREATE TABLE unpublished (id int PRIMARY KEY);
         CREATE PUBLICATION {PUBLICATION} FOR TABLE keyless, blobs, good;"
    ));
    let mut connection = replication_connection(&server).await.unwrap();
    let error = describe(&mut connection, &["keyless"]).await.unwrap_err();
    assert!(matches!(&error, Error::NoPrimaryKey { table } if table == "public.keyless"), "{error}");
    let error = describe(&mut connection, &["blobs"]).await.unwrap_err();
    assert!(
        matches!(&error, Error::UnsupportedType { table, column, type_name }
            if table == "public.blobs" && column == "data" && type_name == "bytea"),
        "{error}"
    );
    let error = describe(&mut connection, &["unpublished"]).await.unwrap_err();
    assert!(matches!(error, Error::TableNotPublished { .. }), "{error}");
    let error = describe(&mut connection, &["missing"]).await.unwrap_err();
    assert!(matches!(error, Error::TableNotFound { .. }), "{error}");
    let error =
        describe_tables(&mut connection, "no_such_pub", &[TableName::parse("good")], UnsupportedColumns::Refuse)
            .await
            .unwrap_err();
    assert!(matches!(&error, Error::MissingPublication { publication } if publication == "no_such_pub"), "{error}");
    assert!(error.to_string().contains("CREATE PUBLICATION"), "{error}");

    let skipped = describe_tables(&mut connection, PUBLICATION, &[TableName::parse("blobs")], UnsupportedColumns::Skip)
        .await
        .unwrap();
    assert_eq!(skipped[0].columns[1].column_type, None, "the bytea column is left out when skipping");
}

#[tokio::test(flavor = "current_thread")]
async fn a_value_without_an_exact_image_stops_the_stream_naming_its_column() {
    let server = server_with(&format!(
        "CREATE TABLE prices (id int PRIMARY KEY, amount numeric); CREATE PUBLICATION {PUBLICATION} FOR TABLE prices;"
    ));
    let (mut stream, _, _) = follow(&server, &["prices"], 1000).await;
    server.psql("INSERT INTO prices VALUES (1, 12.5)").unwrap();
    let error = stream.next_transaction().await.unwrap_err();
    assert!(
        matches!(&error, Error::Value { table, column, .. } if table == "public.prices" && column == "amount"),
        "{error}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_transaction_past_the_bound_is_refused_and_one_at_the_bound_is_whole() {
    let server =
        server_with(&format!("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION {PUBLICATION} FOR TABLE t;"));
    let (mut stream, _, _) = follow(&server, &["t"], 5).await;
    server.psql("INSERT INTO t SELECT generate_series(1, 5)").unwrap();
    server.psql("INSERT INTO t SELECT generate_series(6, 11)").unwrap();
    assert_eq!(stream.next_transaction().await.unwrap().changes.len(), 5);
    let error = stream.next_transaction().await.unwrap_err();
    assert!(matches!(error, Error::TransactionTooLarge { limit: 5 }), "{error}");
    // The recovery docs/POSTGRES.md gives, as for a lost slot.
    assert!(error.to_string().contains("restart with a new --pg-slot name"), "{error}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_copy_cut_short_starts_over_with_every_row_once() {
    let server = server_with(&format!(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 500) g;
         ANALYZE t; CREATE PUBLICATION {PUBLICATION} FOR TABLE t;"
    ));
    let mut connection = replication_connection(&server).await.unwrap();
    let tables = describe(&mut connection, &["t"]).await.unwrap();
    assert_eq!(tables[0].estimated_rows, Some(500), "the size estimate of the progress line");
    let mut copied = 0;
    let cut = create_slot_and_copy(&mut connection, SLOT, &tables, |_, _| {
        copied += 1;
        if copied == 200 {
            return Err(Error::Protocol("the follower died mid-copy".into()));
        }
        Ok(())
    })
    .await;
    assert!(cut.is_err());
    drop(connection);
    server.psql("DELETE FROM t WHERE id <= 10; INSERT INTO t VALUES (501, 'late')").unwrap();

    let (mut stream, mut mirror, _) = follow_after_cut(&server).await;
    assert_eq!(mirror_lines(&mirror, 0, &["id", "v"]), postgres_lines(&server, "SELECT id, v FROM t"));
    assert_eq!(server.psql("SELECT count(*) FROM pg_replication_slots").unwrap(), "1");
    server.psql("UPDATE t SET v = 'changed' WHERE id = 11").unwrap();
    mirror.apply(&stream.next_transaction().await.unwrap());
    assert_eq!(mirror_lines(&mirror, 0, &["id", "v"]), postgres_lines(&server, "SELECT id, v FROM t"));
}

/// A new follower after a cut copy: the leftover slot may still be held by the
/// walsender of the connection that died, so a transient refusal is retried.
async fn follow_after_cut(server: &PostgresServer) -> (ChangeStream, Mirror, Vec<ordo_pgsource::Table>) {
    let mut backoff = retry_backoff();
    for _ in 0..RETRIES {
        let mut connection = replication_connection(server).await.unwrap();
        let tables = describe(&mut connection, &["t"]).await.unwrap();
        let mut mirror = Mirror::new(1);
        let copied = create_slot_and_copy(&mut connection, SLOT, &tables, |table, row| {
            mirror.copy_row(&tables, table, row);
            Ok(())
        })
        .await;
        match copied {
            Ok(point) => {
                mirror.applied = point;
                let stream = ChangeStream::start(connection, tables.clone(), stream_config(1000), point).await.unwrap();
                return (stream, mirror, tables);
            }
            Err(error) if error.is_transient() => tokio::time::sleep(backoff.next_wait()).await,
            Err(error) => panic!("{error}"),
        }
    }
    panic!("the slot stayed busy");
}

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_slot_is_a_loud_error() {
    let server =
        server_with(&format!("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION {PUBLICATION} FOR TABLE t;"));
    let (stream, mirror, tables) = follow(&server, &["t"], 1000).await;
    drop(stream);
    // The walsender of the closed connection may still hold the slot a moment.
    let mut dropped = Err(String::new());
    let mut backoff = retry_backoff();
    for _ in 0..RETRIES {
        dropped = server.psql(&format!("SELECT pg_drop_replication_slot('{SLOT}')"));
        if dropped.is_ok() {
            break;
        }
        tokio::time::sleep(backoff.next_wait()).await;
    }
    dropped.unwrap();
    let error = resume(&server, &tables, mirror.applied).await.err().expect("a stream from a dropped slot");
    assert!(matches!(&error, Error::SlotLost { slot, .. } if slot == SLOT), "{error}");
    assert!(
        error.to_string().contains("copy the tables anew: with `ordo serve`, restart with a new --pg-slot name"),
        "{error}"
    );
}

/// PostgreSQL gives up a slot that holds more WAL than `max_slot_wal_keep_size`
/// (a follower down too long): the stream is a loud `SlotLost` naming the
/// recovery, as for a dropped slot.
#[tokio::test(flavor = "current_thread")]
async fn a_slot_invalidated_by_max_slot_wal_keep_size_is_a_loud_error() {
    let server = server_with(&format!(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION {PUBLICATION} FOR TABLE t;"
    ));
    let (stream, mirror, tables) = follow(&server, &["t"], 1000).await;
    drop(stream);
    server.invalidate_slot(SLOT).unwrap();
    let error = resume(&server, &tables, mirror.applied).await.err().expect("a stream from an invalidated slot");
    assert!(
        matches!(&error, Error::SlotLost { slot, reason } if slot == SLOT && reason.contains("invalidated")),
        "{error}"
    );
    assert!(error.to_string().contains("restart with a new --pg-slot name"), "{error}");
}

#[tokio::test(flavor = "current_thread")]
async fn the_lag_is_what_the_caller_has_not_confirmed() {
    let server =
        server_with(&format!("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION {PUBLICATION} FOR TABLE t;"));
    let (mut stream, mirror, _) = follow(&server, &["t"], 1000).await;
    assert_eq!(stream.last_commit_time_unix_micros(), None);
    server.psql("INSERT INTO t VALUES (1)").unwrap();
    let transaction = stream.next_transaction().await.unwrap();
    assert_eq!(stream.confirmed(), mirror.applied, "nothing is confirmed before the caller says so");
    assert!(stream.lag_bytes() >= transaction.end_lsn.0 - mirror.applied.0, "{} bytes", stream.lag_bytes());
    stream.confirm(transaction.end_lsn).await.unwrap();
    assert_eq!(stream.lag_bytes(), stream.server_wal_end().0 - transaction.end_lsn.0);
    // 2020-01-01 in µs since the epoch: the commit time is PostgreSQL's clock, converted from its epoch.
    assert!(stream.last_commit_time_unix_micros().unwrap() > 1_577_836_800_000_000);
    assert_eq!(stream.last_commit_time_unix_micros(), Some(transaction.commit_time_unix_micros));
}

/// While only tables outside the publication change, the slot still moves:
/// between transactions, with every transaction handed over confirmed, the
/// server's keepalives are confirmed, so PostgreSQL may recycle that WAL. A
/// restart from the position stored with the data (behind the slot's) still
/// gets the next followed transaction, once.
#[tokio::test(flavor = "current_thread")]
async fn between_transactions_keepalives_past_other_tables_writes_are_confirmed() {
    let server = server_with(&format!(
        "CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE other (id int PRIMARY KEY);
         CREATE PUBLICATION {PUBLICATION} FOR TABLE t;"
    ));
    let (mut stream, mut mirror, tables) = follow(&server, &["t"], 1000).await;
    server.psql("INSERT INTO t VALUES (1)").unwrap();
    let first = stream.next_transaction().await.unwrap();
    mirror.apply(&first);
    stream.confirm(first.end_lsn).await.unwrap();
    server.psql("INSERT INTO other SELECT generate_series(1, 20000)").unwrap();
    let other_end = server.psql("SELECT pg_current_wal_lsn()").unwrap();
    let waiting = tokio::spawn(async move {
        let next = stream.next_transaction().await;
        (stream, next)
    });
    let slot_past =
        format!("SELECT confirmed_flush_lsn >= '{other_end}' FROM pg_replication_slots WHERE slot_name = '{SLOT}'");
    let mut polls = 0;
    while server.psql(&slot_past).unwrap() != "t" {
        polls += 1;
        assert!(polls < RETRIES * 4, "the slot stayed behind {other_end} while only `other` changed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.psql("INSERT INTO t VALUES (2)").unwrap();
    let (stream, second) = waiting.await.unwrap();
    let second = second.unwrap();
    assert!(second.end_lsn.0 > first.end_lsn.0);
    mirror.apply(&second);
    assert_eq!(mirror_lines(&mirror, 0, &["id"]), ["1", "2"]);
    // The second transaction is not confirmed: a restart from the first one's end gets it again.
    drop(stream);
    let mut resumed = resume(&server, &tables, first.end_lsn).await.unwrap();
    let again = resumed.next_transaction().await.unwrap();
    assert_eq!((again.end_lsn, again.changes.len()), (second.end_lsn, 1));
}

/// Names reach SQL quoted: a table whose name holds a quote, a semicolon and a
/// space is followed like any other, and runs nothing else.
#[tokio::test(flavor = "current_thread")]
async fn names_are_quoted_not_run() {
    let server = server_with(&format!(
        r#"CREATE SCHEMA "odd schema"; CREATE TABLE "odd schema"."t'; DROP TABLE keep; --""x" (id int PRIMARY KEY, "v'; x" text);
           CREATE TABLE keep (id int PRIMARY KEY); INSERT INTO "odd schema"."t'; DROP TABLE keep; --""x" VALUES (1, 'a');
           CREATE PUBLICATION {PUBLICATION} FOR TABLE "odd schema"."t'; DROP TABLE keep; --""x";"#
    ));
    let odd = "odd schema.t'; DROP TABLE keep; --\"x";
    let (mut stream, mut mirror, tables) = follow(&server, &[odd], 1000).await;
    assert_eq!(tables[0].name.to_string(), odd);
    assert_eq!(mirror_lines(&mirror, 0, &["id", "v'; x"]), ["1|a"]);
    server.psql(r#"INSERT INTO "odd schema"."t'; DROP TABLE keep; --""x" VALUES (2, 'b')"#).unwrap();
    mirror.apply(&stream.next_transaction().await.unwrap());
    assert_eq!(mirror_lines(&mirror, 0, &["id", "v'; x"]), ["1|a", "2|b"]);
    assert_eq!(server.psql("SELECT count(*) FROM keep").unwrap(), "0", "the table `keep` is still there");
}
