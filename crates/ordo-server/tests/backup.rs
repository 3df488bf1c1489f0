//! Hot backup and restore (`POST /v1/backup`, `ordo backup`): a backup taken
//! while several writers write holds exactly the acknowledged batches up to its
//! seq, and a server started on it serves exactly those; admins only; bad
//! destinations refused; an offline backup of a directory no server holds.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{mint, write_secret, Server};
use serde_json::{json, Value};

fn marks_schema() -> Value {
    json!({"fields": [{"name": "writer", "type": "u64"}, {"name": "n", "type": "u64"}]})
}

/// Every item id of `marks` on `server`, by paging a one-shot query.
fn all_ids(server: &Server) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        let page = server.ok(
            "POST",
            "/v1/collections/marks/query",
            json!({"offset": ids.len(), "limit": 1000, "payload": false}),
        );
        let items = page["items"].as_array().unwrap();
        if items.is_empty() {
            return ids;
        }
        ids.extend(items.iter().map(|item| item["id"].as_str().unwrap().to_owned()));
    }
}

/// One `POST` on a fresh connection (a writer thread's client).
fn post(port: u16, path: &str, body: &Value) -> (u16, Value) {
    use std::io::{Read, Write};
    let body = body.to_string();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).unwrap().parse().unwrap();
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Runs `ordo backup ARGS` and returns the seq it printed.
fn ordo_backup(args: &[&str], token: Option<&str>) -> Result<u64, String> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ordo"));
    command.arg("backup").args(args).env_remove("ORDO_TOKEN");
    if let Some(token) = token {
        command.env("ORDO_TOKEN", token);
    }
    let output = command.output().expect("running ordo backup");
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let seq = stdout.strip_prefix("seq ").and_then(|rest| rest.split(':').next()).and_then(|n| n.parse().ok());
    Ok(seq.unwrap_or_else(|| panic!("ordo backup printed no seq: {stdout}")))
}

#[test]
fn a_backup_under_concurrent_writes_restores_exactly_the_batches_up_to_its_seq() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    // Checkpoints every second and 1 MiB segments: during the test LMDB moves
    // on, segments rotate and checkpointed ones are deleted, so the backup's
    // copy and its log tail both hold batches, and the pin on the log matters.
    let server = Server::start(&data, &["--checkpoint-interval", "1", "--log-segment-size", "1M"]);
    server.ok("PUT", "/v1/collections/marks", marks_schema());
    let port = server.port;
    let stop = Arc::new(AtomicBool::new(false));
    // Each acknowledged batch: its seq and the one marker item it wrote.
    let acked: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let writers: Vec<_> = (0..4u64)
        .map(|writer| {
            let (stop, acked) = (Arc::clone(&stop), Arc::clone(&acked));
            std::thread::spawn(move || {
                let padding = "p".repeat(2000);
                let mut n = 0u64;
                let deadline = Instant::now() + Duration::from_secs(60);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let id = format!("w{writer}-{n}");
                    let op =
                        json!({"op": "upsert", "id": id, "fields": {"writer": writer, "n": n}, "payload": padding});
                    let (status, answer) = post(port, "/v1/collections/marks/batch", &json!({"ops": [op]}));
                    assert_eq!(status, 200, "{answer}");
                    acked.lock().unwrap().push((answer["seq"].as_u64().unwrap(), id));
                    n += 1;
                }
            })
        })
        .collect();
    // Let the writers get going (and a checkpoint or two pass) before the backup.
    let started = Instant::now();
    while acked.lock().unwrap().len() < 400 || started.elapsed() < Duration::from_millis(1500) {
        assert!(started.elapsed() < Duration::from_secs(30), "the writers are too slow");
        std::thread::sleep(Duration::from_millis(20));
    }
    let backup_dir = root.path().join("backup");
    let n_before = acked.lock().unwrap().len();
    let seq = ordo_backup(&["--to", backup_dir.to_str().unwrap(), "--url", &format!("127.0.0.1:{port}")], None)
        .unwrap_or_else(|error| panic!("ordo backup: {error}"));
    // Writes went on during the backup and after it.
    let n_at_backup = acked.lock().unwrap().len();
    let resume_from = Instant::now();
    while acked.lock().unwrap().len() < n_at_backup + 100 {
        assert!(resume_from.elapsed() < Duration::from_secs(30), "writes stalled after the backup");
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        seq as usize >= n_before,
        "the backup's seq {seq} is older than the {n_before} batches acknowledged before it"
    );
    assert!((seq as usize) < acked.len(), "the backup must not wait for the writes after it");
    let health = server.ok("GET", "/v1/health", json!(null));
    assert_eq!(health["last_seq"].as_u64().unwrap(), acked.len() as u64, "every batch was acknowledged to a writer");
    server.stop();

    // The data directory's files: an LMDB copy and at most one log segment.
    let files: Vec<String> = std::fs::read_dir(&backup_dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(files.contains(&"data.mdb".to_owned()), "{files:?}");
    assert!(files.iter().all(|name| name == "data.mdb" || name.starts_with("wal-0")), "{files:?}");

    let restored = Server::start(&backup_dir, &[]);
    let health = restored.ok("GET", "/v1/health", json!(null));
    assert_eq!(health["last_seq"].as_u64(), Some(seq), "the restored server is at the backup's seq");
    let present: std::collections::BTreeSet<String> = all_ids(&restored).into_iter().collect();
    let by_seq: BTreeMap<u64, String> = acked.into_iter().collect();
    for (batch_seq, id) in &by_seq {
        if *batch_seq <= seq {
            assert!(present.contains(id), "batch {batch_seq} ({id}) was acknowledged before the backup's seq {seq}");
        } else {
            assert!(!present.contains(id), "batch {batch_seq} ({id}) came after the backup's seq {seq}");
        }
    }
    assert_eq!(present.len() as u64, seq, "exactly the batches 1..={seq}");
    // The restored directory is an ordinary one: it takes writes and goes on from the seq.
    let answer = restored.ok(
        "POST",
        "/v1/collections/marks/batch",
        json!({"ops": [{"op": "upsert", "id": "after-restore", "fields": {"n": 1}}]}),
    );
    assert_eq!(answer["seq"].as_u64(), Some(seq + 1));
    restored.stop();
}

#[test]
fn only_an_admin_may_back_up_and_bad_destinations_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let secret = write_secret(root.path());
    let data = root.path().join("data");
    let mut server = Server::start(&data, &["--auth-secret-file", secret.to_str().unwrap()]);
    let admin = mint(&secret, "ops", "admin", &[]);
    let writer = mint(&secret, "app", "writer", &[]);
    let reader = mint(&secret, "u1", "reader", &[]);
    server.token = Some(admin.clone());
    server.ok("PUT", "/v1/collections/marks", marks_schema());
    server.ok("POST", "/v1/collections/marks/batch", json!({"ops": [{"op": "upsert", "id": "a", "fields": {"n": 1}}]}));

    let to = root.path().join("b1");
    let body = json!({"to": to.to_str().unwrap()});
    for (token, status) in [(Some(&writer), 403), (Some(&reader), 403), (None, 401)] {
        let (got, answer) = server.http_as(token.map(String::as_str), "POST", "/v1/backup", Some(&body));
        assert_eq!(got, status, "{answer}");
        assert!(!to.exists(), "a refused backup wrote {}", to.display());
    }
    let (status, answer) = server.http_as(Some(&admin), "POST", "/v1/backup", Some(&body));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["seq"].as_u64(), Some(1));
    // The command line takes the admin's token from ORDO_TOKEN; a writer's is refused.
    let url = format!("127.0.0.1:{}", server.port);
    let b2 = root.path().join("b2");
    let refused = ordo_backup(&["--to", b2.to_str().unwrap(), "--url", &url], Some(&writer)).unwrap_err();
    assert!(refused.contains("403") && refused.contains("forbidden"), "{refused}");
    assert_eq!(ordo_backup(&["--to", b2.to_str().unwrap(), "--url", &url], Some(&admin)), Ok(1));

    // Destinations: relative, existing and not empty, inside the data directory, no parent.
    let not_empty = root.path().join("full");
    std::fs::create_dir(&not_empty).unwrap();
    std::fs::write(not_empty.join("x"), "x").unwrap();
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for (to, why) in [
        ("relative/dir".to_owned(), "absolute"),
        (not_empty.to_str().unwrap().to_owned(), "not an empty directory"),
        (data.join("inside").to_str().unwrap().to_owned(), "outside the data directory"),
        (root.path().join("no/such/parent").to_str().unwrap().to_owned(), "parent"),
        ("/".repeat(5000), "at most"),
        // A name the file system refuses (over 255 bytes) is the caller's to fix, not a bug.
        (root.path().join("n".repeat(300)).to_str().unwrap().to_owned(), "cannot create"),
    ] {
        let (status, answer) = server.http_as(Some(&admin), "POST", "/v1/backup", Some(&json!({"to": to})));
        assert_eq!(status, 400, "{to}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(why), "{to}: {answer}");
    }
    assert_eq!(std::fs::read_dir(&not_empty).unwrap().count(), 1, "the refused destination was left as it was");
    // The path's limit, at its edge: 4 096 bytes is a path (refused only as not existing), 4 097 is too long.
    let (_, limits) = server.http_as(None, "GET", "/v1/limits", None);
    assert_eq!(limits["max_backup_path_bytes"].as_u64(), Some(4096));
    let mut at_limit = String::new();
    while at_limit.len() < 4096 {
        at_limit.push('/');
        at_limit.extend(std::iter::repeat_n('d', (4096 - at_limit.len()).min(100)));
    }
    let at_limit = at_limit.trim_end_matches('/').to_owned() + &"d".repeat(4096 - at_limit.trim_end_matches('/').len());
    assert_eq!(at_limit.len(), 4096);
    let (status, answer) = server.http_as(Some(&admin), "POST", "/v1/backup", Some(&json!({"to": at_limit})));
    assert_eq!(status, 400, "{answer}");
    assert!(!answer["error"]["message"].as_str().unwrap().contains("at most"), "{answer}");
    let (status, answer) = server.http_as(Some(&admin), "POST", "/v1/backup", Some(&json!({"to": at_limit + "d"})));
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("at most"), "{answer}");
    // An empty directory is fine; unknown fields are not.
    let (status, answer) =
        server.http_as(Some(&admin), "POST", "/v1/backup", Some(&json!({"to": empty.to_str().unwrap()})));
    assert_eq!(status, 200, "{answer}");
    let (status, _) = server.http_as(Some(&admin), "POST", "/v1/backup", Some(&json!({"to": "/x", "extra": 1})));
    assert_eq!(status, 400);
    let (status, _) = server.http_as(Some(&admin), "GET", "/v1/backup", None);
    assert_eq!(status, 405);
    // No staging directories are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.contains(".partial-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // SAFETY: `kill` with the pid of our own child and a valid signal number.
    unsafe { libc::kill(server.pid() as i32, libc::SIGINT) };
    assert!(server.wait().success());
}

#[test]
fn an_offline_backup_copies_a_directory_no_server_holds() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let server = Server::start(&data, &[]);
    server.ok("PUT", "/v1/collections/marks", marks_schema());
    for n in 0..30 {
        let op = json!({"op": "upsert", "id": format!("m{n}"), "fields": {"n": n}});
        server.ok("POST", "/v1/collections/marks/batch", json!({"ops": [op]}));
    }
    // While the server holds the directory, the offline backup says to ask the server.
    let to = root.path().join("offline");
    let refused = ordo_backup(&["--to", to.to_str().unwrap(), "--data-dir", data.to_str().unwrap()], None).unwrap_err();
    assert!(refused.contains("--url"), "{refused}");
    assert!(!to.exists());
    server.stop();
    assert_eq!(ordo_backup(&["--to", to.to_str().unwrap(), "--data-dir", data.to_str().unwrap()], None), Ok(30));
    let restored = Server::start(&to, &[]);
    assert_eq!(all_ids(&restored).len(), 30);
    restored.stop();
    assert_ordinary_directory(&to);
}

/// Nothing but Ordo's usual files (`ordo serve` made its own lock files).
fn assert_ordinary_directory(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            ["data.mdb", "lock.mdb", "LOCK", "wal-spare"].contains(&name.as_str()) || name.starts_with("wal-0"),
            "{name}"
        );
    }
}
