//! TLS against a real PostgreSQL with `ssl = on` (a CA and a certificate made
//! by the test): the source follows over it with the server's CA, and refuses
//! — naming why — a certificate of another CA or for another name, a server
//! without TLS when TLS is required, and it surfaces PostgreSQL's own refusal
//! of a connection without TLS where pg_hba allows only `hostssl`.

use ordo_pgsource::catalog::{describe_tables, TableName, UnsupportedColumns};
use ordo_pgsource::copy::create_slot_and_copy;
use ordo_pgsource::{Change, ChangeStream, ConnectConfig, Connection, Error, Host, Mode, Tls};
use ordo_test_kit::postgres::{PostgresServer, ServerOptions, TestCertificates};

use crate::harness::{stream_config, PUBLICATION, SLOT};

/// Only TLS connections over TCP (and the kit's `psql` over the socket).
const HOSTSSL_ONLY: &str = "local all all scram-sha-256\nhostssl all all 127.0.0.1/32 scram-sha-256\n";

fn tls_server(certificates: &TestCertificates, hba: Option<&str>) -> PostgresServer {
    let options = ServerOptions { tcp: true, tls: Some(certificates.server.clone()), hba: hba.map(str::to_owned) };
    PostgresServer::start_with(&options).unwrap_or_else(|error| panic!("starting PostgreSQL with TLS: {error}"))
}

/// A CA file holding `ca_pem`, in a directory that lives as long as the result.
fn ca_file(ca_pem: &str) -> (tempfile::TempDir, Tls) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, ca_pem).unwrap();
    let tls = Tls::new(Some(&path)).unwrap();
    (dir, tls)
}

fn tcp_config(server: &PostgresServer, host: &str, tls: Option<Tls>) -> ConnectConfig {
    ConnectConfig {
        host: Host::Tcp(host.to_owned()),
        port: server.port(),
        user: server.user.clone(),
        password: Some(server.password.clone()),
        database: "postgres".into(),
        application_name: "ordo-pgsource-tls-test".into(),
        tls,
    }
}

async fn is_encrypted(connection: &mut Connection) -> bool {
    let rows = connection.query_rows("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").await.unwrap();
    rows == [[Some("t".to_owned())]]
}

#[tokio::test(flavor = "current_thread")]
async fn the_source_follows_over_tls_verified_with_the_servers_ca() {
    let certificates = TestCertificates::new("Ordo test CA").unwrap();
    let server = tls_server(&certificates, Some(HOSTSSL_ONLY));
    server
        .psql(&format!(
            "CREATE TABLE items (id int4 PRIMARY KEY, title text);
             INSERT INTO items VALUES (1, 'copied');
             CREATE PUBLICATION {PUBLICATION} FOR TABLE items;"
        ))
        .unwrap();
    let (_dir, tls) = ca_file(&certificates.ca_pem);
    for host in ["localhost", "127.0.0.1"] {
        let mut plain = Connection::connect(&tcp_config(&server, host, Some(tls.clone())), Mode::Sql).await.unwrap();
        assert!(is_encrypted(&mut plain).await, "{host}: a plain connection without TLS");
    }
    let config = tcp_config(&server, "localhost", Some(tls));
    let mut connection = Connection::connect(&config, Mode::Replication).await.unwrap();
    assert!(is_encrypted(&mut connection).await, "the replication connection without TLS");
    let names = [TableName::parse("items")];
    let tables = describe_tables(&mut connection, PUBLICATION, &names, UnsupportedColumns::Refuse).await.unwrap();
    let mut copied = 0;
    let consistent_point = create_slot_and_copy(&mut connection, SLOT, &tables, |_, _| {
        copied += 1;
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(copied, 1);
    let mut stream = ChangeStream::start(connection, tables, stream_config(1000), consistent_point).await.unwrap();
    server.psql("INSERT INTO items VALUES (2, 'streamed');").unwrap();
    let transaction = stream.next_transaction().await.unwrap();
    assert!(matches!(transaction.changes.as_slice(), [Change::Insert { .. }]), "{transaction:?}");
    stream.confirm(transaction.end_lsn).await.unwrap();
}

/// Connects expecting a refusal; returns it.
async fn refused(config: &ConnectConfig) -> Error {
    match Connection::connect(config, Mode::Replication).await {
        Ok(_) => panic!("connected: {config:?}"),
        Err(error) => error,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_certificate_of_another_ca_or_for_another_name_is_refused_naming_why() {
    let certificates = TestCertificates::new("Ordo test CA").unwrap();
    let server = tls_server(&certificates, None);
    let other = TestCertificates::new("Another CA").unwrap();
    let (_dir, other_tls) = ca_file(&other.ca_pem);
    let error = refused(&tcp_config(&server, "localhost", Some(other_tls))).await;
    assert!(matches!(&error, Error::Tls(_)), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("invalid peer certificate") && message.contains("UnknownIssuer"), "{message}");
    assert!(!error.is_transient(), "a certificate to fix is not retried");
    drop(server);

    let named_elsewhere = TestCertificates::for_names("Ordo test CA", &["db.example.com"]).unwrap();
    let server = tls_server(&named_elsewhere, None);
    let (_dir, tls) = ca_file(&named_elsewhere.ca_pem);
    let message = refused(&tcp_config(&server, "127.0.0.1", Some(tls))).await.to_string();
    assert!(message.contains("certificate not valid for name \"127.0.0.1\""), "{message}");
}

#[tokio::test(flavor = "current_thread")]
async fn tls_required_of_a_server_with_ssl_off_is_refused_never_downgraded() {
    let server = PostgresServer::start_with(&ServerOptions { tcp: true, ..ServerOptions::default() }).unwrap();
    let certificates = TestCertificates::new("Ordo test CA").unwrap();
    let (_dir, tls) = ca_file(&certificates.ca_pem);
    let error = refused(&tcp_config(&server, "127.0.0.1", Some(tls))).await;
    assert!(matches!(&error, Error::Tls(_)), "{error:?}");
    assert!(error.to_string().contains("does not accept TLS"), "{error}");
    // The same server without TLS is reachable: the refusal was TLS's.
    let mut plain = Connection::connect(&tcp_config(&server, "127.0.0.1", None), Mode::Sql).await.unwrap();
    assert!(!is_encrypted(&mut plain).await);
}

#[tokio::test(flavor = "current_thread")]
async fn a_hostssl_only_server_refuses_a_connection_without_tls_in_its_own_words() {
    let certificates = TestCertificates::new("Ordo test CA").unwrap();
    let server = tls_server(&certificates, Some(HOSTSSL_ONLY));
    let error = refused(&tcp_config(&server, "127.0.0.1", None)).await;
    let Error::Server(refusal) = &error else { panic!("{error:?}") };
    assert_eq!(refusal.code, "28000", "{error}");
    assert!(
        error.to_string().contains("no pg_hba.conf entry") && error.to_string().contains("no encryption"),
        "{error}"
    );
}
