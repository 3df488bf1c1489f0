//! The language-neutral protocol corpus (`protocol/vectors/*.json`, format in
//! `protocol/README.md`): frames recorded from a real server on loopback, each
//! with the lists a client must hold after it, checked here against one-shot
//! queries; plus a few hand-built cases (diff kinds the server does not emit
//! today, broken sequences). Every client library runs the corpus.
//!
//! `ORDO_WRITE_VECTORS=1` writes the files; without it the corpus is
//! regenerated in memory and compared with the files, so it cannot drift from
//! what the server sends.
//!
//! This file runs the cases and compares (or writes) the files; `case` is a
//! vector's shape, `recorder` the client that records one, `rooms` the
//! collection the cases write to, `recorded`, `unread` and `synthetic` the cases.

mod case;
#[path = "../common/mod.rs"]
mod common;
mod recorded;
mod recorder;
mod rooms;
mod synthetic;
mod unread;

use std::path::PathBuf;

use common::Server;
use recorded::{
    ended, errors_and_unsubscribe, key_windows, live_diffs, random_session, reference_views, requests_and_acks, resume,
    window_changes,
};
use rooms::schema;
use serde_json::Value;
use synthetic::synthetic_cases;
use unread::unread_views;

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../protocol/vectors")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_protocol_corpus_matches_what_the_server_sends() {
    let dir = tempfile::tempdir().unwrap();
    // The welcome frame lists the limits: the connection cap, whose default
    // follows the machine's descriptor limit, is fixed so the corpus is the
    // same on every machine.
    let server = Server::start(dir.path(), &["--max-connections", "10000"]);
    server.ok("PUT", "/v1/collections/rooms", schema());
    let mut cases = vec![
        live_diffs(&server).await,
        window_changes(&server).await,
        key_windows(&server).await,
        random_session(&server, "random_session_1", 1).await,
        random_session(&server, "random_session_2", 2).await,
        errors_and_unsubscribe(&server).await,
        requests_and_acks(&server).await,
        resume(&server, true).await,
        resume(&server, false).await,
        // Last: it changes the collection's fields and drops it.
        ended(&server).await,
        reference_views(&server).await,
        unread_views(&server).await,
    ];
    cases.extend(synthetic_cases());

    let dir = vectors_dir();
    if std::env::var_os("ORDO_WRITE_VECTORS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "json") {
                std::fs::remove_file(path).unwrap();
            }
        }
        for case in &cases {
            let text = serde_json::to_string_pretty(&case.to_json()).unwrap() + "\n";
            std::fs::write(dir.join(format!("{}.json", case.name)), text).unwrap();
        }
        eprintln!("wrote {} vectors to {}", cases.len(), dir.display());
        return;
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}; write it with ORDO_WRITE_VECTORS=1", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json"))
        .collect();
    on_disk.sort();
    let mut expected: Vec<String> = cases.iter().map(|case| format!("{}.json", case.name)).collect();
    expected.sort();
    assert_eq!(
        on_disk,
        expected,
        "the files in {} are not the corpus; regenerate with ORDO_WRITE_VECTORS=1",
        dir.display()
    );
    for case in &cases {
        let path = dir.join(format!("{}.json", case.name));
        let stored: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(
            stored == case.to_json(),
            "{} differs from what the server sends now; regenerate with ORDO_WRITE_VECTORS=1 and review the diff",
            path.display()
        );
    }
}
