//! A full disk answers `507 store_full` (never `500 internal`) and needs no
//! restart: on a small tmpfs (mounted here when the test runs as root; skipped
//! with a message otherwise), writes fill the disk, are refused with 507 while
//! it is full, succeed again once space is freed, and after a restart every
//! acknowledged batch is there and no refused one. Also: the log's disk space
//! (none preallocated by an empty server; `--log-segment-size` and its limits).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Server;
use serde_json::json;

#[path = "../../ordo-store/tests/support/tmpfs.rs"]
mod tmpfs;
use tmpfs::Tmpfs;

/// Writes one marker item; its status and error code (if any).
fn write(server: &Server, id: &str, payload_bytes: usize) -> (u16, Option<String>) {
    let op = json!({"op": "upsert", "id": id, "fields": {"n": 1}, "payload": "x".repeat(payload_bytes)});
    let (status, answer) = server.http("POST", "/v1/collections/marks/batch", Some(&json!({"ops": [op]})));
    if status == 500 {
        eprintln!("500: {answer}"); // `internal` is a bug: say which
    }
    (status, answer["error"]["code"].as_str().map(str::to_owned))
}

#[test]
fn a_full_disk_answers_507_and_writes_resume_without_a_restart() {
    let Some(tmpfs) = Tmpfs::mount("8m") else { return };
    let data = tmpfs.path().join("data");
    let ballast = tmpfs.path().join("ballast");
    std::fs::write(&ballast, vec![1u8; 5 << 20]).unwrap();
    let args = ["--log-segment-size", "1M", "--checkpoint-interval", "1"];
    let server = Server::start(&data, &args);
    server.ok("PUT", "/v1/collections/marks", json!({"fields": [{"name": "n", "type": "u64"}]}));
    let (mut acked, mut refused) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    // Fill the disk.
    loop {
        assert!(Instant::now() < deadline, "the disk never filled");
        let id = format!("m{}", acked.len() + refused.len());
        match write(&server, &id, 16 << 10) {
            (200, _) => acked.push(id),
            (507, Some(code)) if code == "store_full" => {
                refused.push(id);
                break;
            }
            other => panic!("a full disk must answer 507 store_full, not {other:?}"),
        }
    }
    // Still full: refused again, always with 507 (never 500 internal).
    for _ in 0..5 {
        let id = format!("m{}", acked.len() + refused.len());
        assert_eq!(write(&server, &id, 16 << 10), (507, Some("store_full".to_owned())));
        refused.push(id);
        std::thread::sleep(Duration::from_millis(100));
    }
    // Room again: writes resume with the same server (a refused checkpoint is retried within a second or two).
    std::fs::remove_file(&ballast).unwrap();
    let resumed = Instant::now();
    let mut n_ok = 0;
    while n_ok < 20 {
        assert!(resumed.elapsed() < Duration::from_secs(20), "writes did not resume after space was freed");
        let id = format!("m{}", acked.len() + refused.len());
        match write(&server, &id, 1 << 10) {
            (200, _) => {
                acked.push(id);
                n_ok += 1;
            }
            (507, Some(code)) if code == "store_full" => {
                refused.push(id);
                std::thread::sleep(Duration::from_millis(50));
            }
            other => panic!("while recovering: {other:?}"),
        }
    }
    let health = server.ok("GET", "/v1/health", json!(null));
    assert_eq!(health["last_seq"].as_u64(), Some(acked.len() as u64), "refused batches took no sequence number");
    server.stop();

    let server = Server::start(&data, &args);
    let health = server.ok("GET", "/v1/health", json!(null));
    assert_eq!(health["last_seq"].as_u64(), Some(acked.len() as u64));
    assert_eq!(health["items"].as_u64(), Some(acked.len() as u64), "exactly the acknowledged batches");
    for id in &acked {
        let (status, _) = server.http("GET", &format!("/v1/collections/marks/items/{id}"), None);
        assert_eq!(status, 200, "acknowledged {id} is missing after the restart");
    }
    for id in &refused {
        let (status, _) = server.http("GET", &format!("/v1/collections/marks/items/{id}"), None);
        assert_eq!(status, 404, "refused {id} is present after the restart");
    }
    server.stop();
    drop(tmpfs);
}

/// Bytes of write-ahead log files (segments and spares) in `dir`.
fn log_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("wal-"))
        .map(|entry| entry.metadata().unwrap().len())
        .sum()
}

#[test]
fn an_empty_server_preallocates_no_log_and_the_segment_size_is_a_checked_flag() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let server = Server::start(&data, &[]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(log_bytes(&data), 0, "an empty server holds no preallocated log");
    server.stop();
    // Written to, with 2 MiB segments: one spare, never more than two segments of log.
    let server = Server::start(&data, &["--log-segment-size", "2M"]);
    server.ok("PUT", "/v1/collections/marks", json!({"fields": [{"name": "n", "type": "u64"}]}));
    server.ok("POST", "/v1/collections/marks/batch", json!({"ops": [{"op": "upsert", "id": "a"}]}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !data.join("wal-spare").exists() {
        assert!(Instant::now() < deadline, "no spare after the first write");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(std::fs::metadata(data.join("wal-spare")).unwrap().len(), 2 << 20, "the spare is one segment");
    assert!(log_bytes(&data) <= 4 << 20, "{} bytes of log", log_bytes(&data));
    server.stop();
    // The flag's limits, at their edges (a data directory that cannot be
    // created, so an accepted size stops the server there instead).
    let not_a_dir = root.path().join("file");
    std::fs::write(&not_a_dir, "x").unwrap();
    let unusable = not_a_dir.join("data");
    for (size, ok) in [("1048575", false), ("1M", true), ("1G", true), ("1073741825", false), ("16X", false)] {
        let output = Command::new(env!("CARGO_BIN_EXE_ordo"))
            .args(["serve", "--listen", "127.0.0.1:0", "--log-segment-size", size, "--data-dir"])
            .arg(&unusable)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(!stderr.contains("--log-segment-size"), ok, "{size}: {stderr}");
        assert!(!output.status.success(), "{size}: the data directory cannot be opened");
    }
}
