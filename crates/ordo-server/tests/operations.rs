//! Running `ordo` as an operator does: options from flags, `ORDO_*` variables
//! and a TOML file (in that order of precedence), `--help` and `--version`,
//! and the structured log on stderr.

mod common;

use std::process::{Command, Output, Stdio};

use common::{room_schema, Server, StartOptions};
use serde_json::{json, Value};

fn ordo(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ordo")).args(args).envs(env.iter().copied()).output().expect("running ordo")
}

#[test]
fn help_and_version_exit_zero() {
    for args in [&["--help"][..], &["serve", "--help"], &["token", "--help"], &["load-demo", "--help"], &["help"]] {
        let output = ordo(args, &[]);
        assert!(output.status.success(), "ordo {args:?}: {output:?}");
        assert!(String::from_utf8_lossy(&output.stdout).contains("Usage"), "ordo {args:?}: {output:?}");
    }
    let help = String::from_utf8(ordo(&["serve", "--help"], &[]).stdout).unwrap();
    // Every option names its variable, and the defaults are shown.
    for text in ["--data-dir", "ORDO_DATA_DIR", "ORDO_LISTEN", "--config", "[default: 127.0.0.1:7070]", "--log-format"]
    {
        assert!(help.contains(text), "`{text}` missing from:\n{help}");
    }
    let version = ordo(&["--version"], &[]);
    assert!(version.status.success());
    assert_eq!(String::from_utf8(version.stdout).unwrap().trim(), format!("ordo {}", env!("CARGO_PKG_VERSION")));
    // A mistake is not a success.
    let unknown = ordo(&["serve", "--no-such-option"], &[]);
    assert_eq!(unknown.status.code(), Some(2));
    assert_eq!(ordo(&[], &[]).status.code(), Some(2));
}

/// Each source wins over the ones after it: flag, variable, file, default.
/// `/v1/limits` shows what the server runs with.
#[test]
fn a_flag_wins_over_its_variable_which_wins_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ordo.toml");
    std::fs::write(
        &config,
        "# every key is a flag's name\n\
         ws-messages-per-second = 11\n\
         http-requests-per-second = 22\n\
         header-timeout = 33\n\
         slow-close-after = 44\n",
    )
    .unwrap();
    // The file's path goes in ORDO_CONFIG: a variable naming the file works as the flag would.
    let config_path: &'static str = Box::leak(config.to_str().unwrap().to_owned().into_boxed_str());
    let env: &'static [(&'static str, &'static str)] = Box::leak(Box::new([
        ("ORDO_CONFIG", config_path),
        ("ORDO_HTTP_REQUESTS_PER_SECOND", "222"),
        ("ORDO_HEADER_TIMEOUT", "333"),
    ]));
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--header-timeout", "3333"],
        StartOptions { env, ..StartOptions::default() },
    );
    let (status, limits) = server.http("GET", "/v1/limits", None);
    assert_eq!(status, 200);
    assert_eq!(limits["ws_messages_per_second"], 11, "from the file: {limits}");
    assert_eq!(limits["http_requests_per_second"], 222, "the variable over the file: {limits}");
    assert_eq!(limits["header_timeout_secs"], 3333, "the flag over both: {limits}");
    assert_eq!(limits["slow_close_after_secs"], 44, "from the file: {limits}");
    assert_eq!(limits["session_retention_secs"], 60, "the default: {limits}");
    server.stop();
}

/// A boolean from the file, and a variable that turns it off again.
#[test]
fn a_boolean_from_the_file_is_overridden_by_its_variable() {
    let dir = tempfile::tempdir().unwrap();
    let secret = common::write_secret(dir.path());
    let config = dir.path().join("ordo.toml");
    std::fs::write(&config, format!("metrics-public = true\nauth-secret-file = {:?}\n", secret.to_str().unwrap()))
        .unwrap();
    let config: &'static str = Box::leak(config.to_str().unwrap().to_owned().into_boxed_str());
    let data = dir.path().join("data");
    let server = Server::start(&data, &["--config", config]);
    // Auth is on (the secret file came from the file), yet /metrics is public.
    assert_eq!(server.http("GET", "/v1/rules", None).0, 401);
    assert_eq!(server.http("GET", "/metrics", None).0, 200);
    server.stop();
    let env: &'static [(&'static str, &'static str)] =
        Box::leak(Box::new([("ORDO_CONFIG", config), ("ORDO_METRICS_PUBLIC", "false")]));
    let server = Server::start_with(&data, &[], StartOptions { env, ..StartOptions::default() });
    assert_eq!(server.http("GET", "/metrics", None).0, 401);
    server.stop();
}

#[test]
fn the_config_file_refuses_unknown_keys_and_bad_values_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ordo.toml");
    let run = |text: &str| {
        std::fs::write(&file, text).unwrap();
        let output = ordo(&["serve", "--config", file.to_str().unwrap(), "--data-dir", "unused"], &[]);
        assert_eq!(output.status.code(), Some(2), "{text}: {output:?}");
        String::from_utf8(output.stderr).unwrap()
    };
    let stderr = run("data_dir = \"x\"\n");
    assert!(stderr.contains("unknown key `data_dir` (did you mean `data-dir`?)"), "{stderr}");
    let stderr = run("colour = \"blue\"\n");
    assert!(stderr.contains("unknown key `colour`") && stderr.contains("listen, data-dir"), "{stderr}");
    // `config` itself is no key of the file (no file includes another).
    assert!(run("config = \"other.toml\"\n").contains("unknown key `config`"));
    // Values go through the flags' own parsers and checks.
    let stderr = run("listen = \"nowhere\"\n");
    assert!(stderr.contains("ordo.toml: invalid value 'nowhere' for '--listen <ADDR>'"), "{stderr}");
    assert!(run("network-threads = 0\n").contains("--network-threads is 1..=64"));
    assert!(run("durability = \"sometimes\"\n").contains("--durability"));
    assert!(run("listen = [\"a\", \"b\"]\n").contains("listen"));
    assert!(run("listen = 1.5\n").contains("`listen` takes a string, a number or a boolean"));
    assert!(run("listen = \n").contains("not valid TOML"));
    let missing = ordo(&["serve", "--config", "/no/such/ordo.toml"], &[]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read the config file /no/such/ordo.toml"));
    // A variable is checked as the flag is.
    let bad_env = ordo(&["serve", "--data-dir", "unused"], &[("ORDO_NETWORK_THREADS", "100")]);
    assert!(String::from_utf8_lossy(&bad_env.stderr).contains("--network-threads is 1..=64"), "{bad_env:?}");
}

/// Repeatable options take a list in the file and a comma-separated variable.
#[test]
fn repeatable_options_take_lists() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ordo.toml");
    std::fs::write(&config, "allow-origin = [\"https://a.example\", \"https://b.example\"]\n").unwrap();
    let server = Server::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    for (origin, allowed) in [("https://a.example", true), ("https://b.example", true), ("https://c.example", false)] {
        let (status, _) = server.http_with("GET", "/v1/health", &format!("Origin: {origin}\r\n"), None);
        assert_eq!(status == 200, allowed, "{origin}: {status}");
    }
    server.stop();
    let server = Server::start_with(
        &dir.path().join("data"),
        &[],
        StartOptions {
            env: &[("ORDO_ALLOW_ORIGIN", "https://c.example,https://d.example")],
            ..StartOptions::default()
        },
    );
    for (origin, allowed) in [("https://a.example", false), ("https://c.example", true), ("https://d.example", true)] {
        let (status, _) = server.http_with("GET", "/v1/health", &format!("Origin: {origin}\r\n"), None);
        assert_eq!(status == 200, allowed, "{origin}: {status}");
    }
    server.stop();
}

/// `--log-format json`: one JSON object per line, each with a timestamp and a
/// level; the start says where and how, refusals carry their code, the stop is there.
#[test]
fn the_json_log_has_the_start_refusals_and_the_stop() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        dir.path(),
        &["--log-format", "json"],
        StartOptions { capture_stderr: true, ..StartOptions::default() },
    );
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    let (status, _) = server.http(
        "POST",
        "/v1/collections/rooms/batch",
        Some(&json!({"ops": [{"op": "upsert", "id": "r1", "fields": {"recency": -1}}]})),
    );
    assert_eq!(status, 422);
    let lines = |server: &Server| -> Vec<Value> {
        server
            .stderr_lines()
            .iter()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not a JSON line: {line}")))
            .collect()
    };
    let find = |events: &[Value], message: &str| events.iter().find(|event| event["message"] == message).cloned();
    // The refusal is logged (the test's reader thread may take a moment to see the line).
    let events = wait_for(&|| lines(&server), "request refused");
    for event in &events {
        assert!(event["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{event}");
        assert!(["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&event["level"].as_str().unwrap()), "{event}");
    }
    let started = find(&events, "started").expect("a start event");
    assert_eq!(started["address"], format!("127.0.0.1:{}", server.port), "{started}");
    assert_eq!(started["auth"], "off (loopback only)");
    assert!(started["data_dir"].as_str().unwrap().ends_with(dir.path().file_name().unwrap().to_str().unwrap()));
    let refused = events
        .iter()
        .find(|event| event["message"].as_str().is_some_and(|m| m.starts_with("request refused")))
        .expect("the refusal is logged");
    assert_eq!(refused["code"], "invalid_batch", "{refused}");
    assert_eq!(refused["status"], 422);
    assert_eq!(refused["path"], "/v1/collections/rooms/batch");
    assert_eq!(refused["level"], "INFO");
    // A successful write writes no line.
    let n_lines = events.len();
    server.ok(
        "POST",
        "/v1/collections/rooms/batch",
        json!({"ops": [{"op": "upsert", "id": "r1", "fields": {"recency": 1}}]}),
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(lines(&server).len(), n_lines, "{:#?}", lines(&server));
    let port = server.port;
    let mut server = server;
    // SAFETY: `kill` with the pid of a child we own and a valid signal number.
    unsafe { libc::kill(server.pid() as i32, libc::SIGINT) };
    assert!(server.wait().success());
    let events = wait_for(&|| lines(&server), "stopped");
    assert!(find(&events, "stopped").is_some_and(|event| event["last_seq"] == 1), "{events:#?} (port {port})");
    // The stop checkpointed the write.
    assert!(find(&events, "checkpoint committed").is_some(), "{events:#?}");
}

/// `--log-level warn` hides the `info` lines; `RUST_LOG` is used when no level is set.
#[test]
fn the_log_level_filters() {
    let dir = tempfile::tempdir().unwrap();
    let quiet = Server::start_with(
        dir.path(),
        &["--log-level", "warn"],
        StartOptions { capture_stderr: true, ..StartOptions::default() },
    );
    let _ = quiet.http("GET", "/no/such/path", None);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let lines = wait_for_line(&quiet, "auth is off");
    quiet.stop();
    assert!(lines.iter().all(|line| !line.contains(" INFO ")), "{lines:#?}");
    assert!(lines.iter().any(|line| line.contains(" WARN ") && line.contains("auth is off")), "{lines:#?}");

    let from_env = Server::start_with(
        dir.path(),
        &[],
        StartOptions { capture_stderr: true, env: &[("RUST_LOG", "debug")], ..StartOptions::default() },
    );
    let _ = from_env.http("GET", "/v1/health", None);
    let lines = wait_for_line(&from_env, "connection closed");
    from_env.stop();
    assert!(lines.iter().any(|line| line.contains(" DEBUG ") && line.contains("connection")), "{lines:#?}");
    // Human lines carry a timestamp and a level, and no colour codes when not on a terminal.
    let started = lines.iter().find(|line| line.contains("started")).expect("a start line");
    assert!(started.starts_with("20") && started.contains(" INFO ") && !started.contains('\u{1b}'), "{started}");
}

/// The log's events once one whose message starts with `message` is among them.
fn wait_for(events: &dyn Fn() -> Vec<Value>, message: &str) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let found = events();
        if found.iter().any(|event| event["message"].as_str().is_some_and(|m| m.starts_with(message))) {
            return found;
        }
        assert!(std::time::Instant::now() < deadline, "no `{message}` in the log: {found:#?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The server's stderr lines once one contains `text`.
fn wait_for_line(server: &Server, text: &str) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let lines = server.stderr_lines();
        if lines.iter().any(|line| line.contains(text)) {
            return lines;
        }
        assert!(std::time::Instant::now() < deadline, "no `{text}` in the log: {lines:#?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `--max-connections`: from the flag, `ORDO_MAX_CONNECTIONS` or the file; by
/// default all the descriptor limit leaves room for (less 128 for the server's
/// own files), and refused above that.
#[test]
fn max_connections_defaults_to_the_descriptor_limit_and_is_refused_above_it() {
    let dir = tempfile::tempdir().unwrap();
    let nofile = Some(1000);
    let server = Server::start_with(&dir.path().join("a"), &[], StartOptions { nofile, ..StartOptions::default() });
    let (_, limits) = server.http("GET", "/v1/limits", None);
    assert_eq!(limits["max_connections"], 1000 - 128, "the default: {limits}");
    server.stop();

    let config = dir.path().join("ordo.toml");
    std::fs::write(&config, "max-connections = 300\n").unwrap();
    let config: &'static str = Box::leak(config.to_str().unwrap().to_owned().into_boxed_str());
    let server = Server::start_with(
        &dir.path().join("b"),
        &["--config", config],
        StartOptions { nofile, ..StartOptions::default() },
    );
    let (_, limits) = server.http("GET", "/v1/limits", None);
    assert_eq!(
        (limits["max_connections"].as_u64(), limits["max_unauthenticated_connections"].as_u64()),
        (Some(300), Some(37))
    );
    server.stop();
    let env: &'static [(&'static str, &'static str)] = Box::leak(Box::new([("ORDO_MAX_CONNECTIONS", "200")]));
    let server = Server::start_with(
        &dir.path().join("c"),
        &["--config", config],
        StartOptions { nofile, env, ..StartOptions::default() },
    );
    assert_eq!(server.http("GET", "/v1/limits", None).1["max_connections"], 200, "the variable over the file");
    server.stop();

    // Above what the descriptor limit leaves room for: the server refuses to start.
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(env!("CARGO_BIN_EXE_ordo"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--max-connections", "873", "--data-dir"])
        .arg(dir.path().join("d"));
    // SAFETY: `setrlimit` only, between fork and exec, on a struct on the child's stack.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 1000, rlim_max: 1000 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("running ordo");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server started with more connections than its descriptors leave room for");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("--max-connections 873 is more than the descriptor limit leaves room for: 872"),
        "{stderr}"
    );
}

/// A server whose stdout reader went away (a supervisor restarted, a pipe
/// closed) still stops gracefully on a signal: its lines for the operator are
/// lost, nothing else (no panic on the way out, exit status 0).
#[test]
fn a_closed_stdout_does_not_stop_a_graceful_stop() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let stderr_path = dir.path().join("stderr.log");
    let mut server = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("starting ordo");
    let mut stdout = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening on http://") {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "ordo ended before listening");
    }
    drop(stdout);
    // SAFETY: `kill` with the pid of a child we own and a valid signal number.
    unsafe { libc::kill(server.id() as i32, libc::SIGINT) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "ordo did not stop within 30 s of SIGINT");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("stopped"), "the stop is still logged: {stderr}");
}
