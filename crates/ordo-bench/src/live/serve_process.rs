//! An `ordo serve` a benchmark starts for itself: on a fresh data directory,
//! listening on port 0 (its address read from its own output, so there is no
//! "find a free port" race), stopped with SIGINT (then SIGKILL) and its data
//! directory removed when dropped, whatever path the run took.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Result;

const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

pub struct ServeProcess {
    child: Child,
    data_dir: PathBuf,
    /// `HOST:PORT` it listens on.
    pub authority: String,
}

impl ServeProcess {
    /// Starts `binary serve` with `args` after the listen address and data
    /// directory; `label` names the directory (`ordo-<label>-<pid>`).
    pub fn start(binary: &Path, label: &str, args: &[String]) -> Result<ServeProcess> {
        if !binary.is_file() {
            return Err(format!(
                "no `ordo` binary at {}: build it with `cargo build --release -p ordo-server --bin ordo`, or name it",
                binary.display()
            )
            .into());
        }
        let data_dir = std::env::temp_dir().join(format!("ordo-{label}-{}", std::process::id()));
        if data_dir.exists() {
            std::fs::remove_dir_all(&data_dir)?;
        }
        std::fs::create_dir_all(&data_dir)?;
        let mut command = Command::new(binary);
        command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(&data_dir).args(args);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let child = command.spawn().map_err(|error| format!("cannot start {}: {error}", binary.display()))?;
        let mut server = ServeProcess { child, data_dir, authority: String::new() };
        server.authority = ordo_test_kit::server::wait_for_address(&mut server.child, START_TIMEOUT, |line| {
            eprintln!("  [ordo serve] {line}")
        })
        .map_err(|error| format!("`{} serve`: {error}", binary.display()))?;
        Ok(server)
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        stop_gracefully(&mut self.child, STOP_TIMEOUT);
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// Stops a server child as an operator would: SIGINT (a graceful shutdown),
/// then SIGKILL if it is still there after `patience`; reaps it either way.
pub fn stop_gracefully(child: &mut Child, patience: Duration) {
    if matches!(child.try_wait(), Ok(None)) {
        // SAFETY: kill only sends a signal to our own child's pid.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGINT);
        }
        let deadline = Instant::now() + patience;
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(child.try_wait(), Ok(None)) {
            eprintln!("`ordo serve` ignored SIGINT for {patience:?}; killing it");
            let _ = child.kill();
        }
    }
    let _ = child.wait();
}
