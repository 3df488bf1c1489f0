//! Starting a server process and learning its address from the process itself:
//! it binds port 0 and prints `listening on http://HOST:PORT`, so there is no
//! "find a free port, then start" race and no sleep standing in for readiness.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const LISTENING_MARKER: &str = "listening on http://";

/// Spawns `command` with its stdout piped and waits for its address: the child
/// and `HOST:PORT` (see [`wait_for_address`]). An error if the process cannot
/// start, or exits or stays silent for `timeout` before saying where it listens.
pub fn spawn_server(command: &mut Command, timeout: Duration, on_line: fn(&str)) -> Result<(Child, String), String> {
    let mut child =
        command.stdout(Stdio::piped()).spawn().map_err(|error| format!("cannot start the server: {error}"))?;
    let authority = wait_for_address(&mut child, timeout, on_line)?;
    Ok((child, authority))
}

/// Waits, at most `timeout`, for the `listening on http://HOST:PORT` line of a
/// child spawned with its stdout piped, and returns `HOST:PORT`. A thread reads
/// stdout for the child's whole life, so the server never blocks on a full pipe,
/// and hands every line to `on_line` (to echo it, say). On an error the child is
/// killed. (A caller that pipes stderr too starts its reader before calling
/// this, for the same reason.)
pub fn wait_for_address(child: &mut Child, timeout: Duration, on_line: fn(&str)) -> Result<String, String> {
    let stdout = child.stdout.take().ok_or("the server's stdout is not piped")?;
    let (authority_tx, authority_rx) = std::sync::mpsc::channel();
    let reader = move || {
        let mut authority_tx = Some(authority_tx);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            on_line(&line);
            if let Some(authority) = listening_authority(&line) {
                if let Some(sender) = authority_tx.take() {
                    let _ = sender.send(authority);
                }
            }
        }
    };
    std::thread::Builder::new()
        .name("server-stdout".into())
        .spawn(reader)
        .map_err(|error| format!("cannot start the stdout reader: {error}"))?;
    match authority_rx.recv_timeout(timeout) {
        Ok(authority) => Ok(authority),
        Err(_) => {
            let status = child.try_wait().ok().flatten();
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "the server printed no `{LISTENING_MARKER}...` line within {timeout:?} (exit status: {})",
                status.map_or_else(|| "still running".to_owned(), |status| status.to_string())
            ))
        }
    }
}

/// The port of a `HOST:PORT` authority.
pub fn port_of(authority: &str) -> u16 {
    authority.rsplit(':').next().and_then(|port| port.parse().ok()).expect("an authority ending in :PORT")
}

/// `... listening on http://127.0.0.1:PORT ...` → `127.0.0.1:PORT`.
pub fn listening_authority(line: &str) -> Option<String> {
    let start = line.find(LISTENING_MARKER)? + LISTENING_MARKER.len();
    let authority: String =
        line[start..].chars().take_while(|c| !c.is_whitespace() && *c != '/' && *c != ',').collect();
    authority.contains(':').then_some(authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_line_gives_the_authority() {
        let line = "2026-01-01T00:00:00Z INFO ordo 0.1.0 listening on http://127.0.0.1:40123 (demo at /demo)";
        assert_eq!(listening_authority(line).as_deref(), Some("127.0.0.1:40123"));
        assert_eq!(listening_authority("listening on http://[::1]:7070/").as_deref(), Some("[::1]:7070"));
        assert_eq!(listening_authority("starting"), None);
        assert_eq!(port_of("127.0.0.1:40123"), 40123);
    }

    #[test]
    fn a_process_that_prints_its_address_is_waited_for() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo starting; sleep 0.2; echo 'listening on http://127.0.0.1:4242'; sleep 5"]);
        let (mut child, authority) = spawn_server(&mut command, Duration::from_secs(10), |_| {}).unwrap();
        assert_eq!(authority, "127.0.0.1:4242");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_process_that_exits_silently_is_an_error() {
        let mut command = Command::new("true");
        let error = spawn_server(&mut command, Duration::from_secs(10), |_| {}).unwrap_err();
        assert!(error.contains("printed no"), "{error}");
    }
}
