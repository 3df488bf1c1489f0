//! The server a scenario runs against: an `ordo serve` loadgen starts (and stops,
//! removing its data) or one already running at `--server-url`.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ordo_bench::live::serve_process::stop_gracefully;
use ordo_bench::live::Result;
use ordo_server::auth::Role;

use crate::auth::Auth;
use crate::options::Options;

const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// `ordo serve` started by us: killed (SIGINT, then SIGKILL) and its data
/// directory removed when dropped, whatever path the scenario took.
pub struct ServerProcess {
    child: Child,
    data_dir: PathBuf,
    /// The secret file loadgen wrote for `--auth` (removed with the data directory).
    secret_file: Option<PathBuf>,
}

impl ServerProcess {
    fn start(binary: &Path, options: &Options, scenario: &str, auth: Option<&Auth>) -> Result<(ServerProcess, String)> {
        let data_dir = std::env::temp_dir().join(format!(
            "ordo-loadgen-{}-{scenario}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos())
        ));
        if data_dir.exists() {
            std::fs::remove_dir_all(&data_dir)?;
        }
        std::fs::create_dir_all(&data_dir)?;
        let mut command = Command::new(binary);
        command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(&data_dir);
        if let Some(durability) = &options.durability {
            command.args(["--durability", durability]);
        }
        let mut secret_file = None;
        if let Some(auth) = auth {
            let path = match &options.auth_secret_file {
                Some(path) => path.clone(),
                None => {
                    // Next to the data directory, readable by us only.
                    let path = PathBuf::from(format!("{}.secret", data_dir.display()));
                    let mut file = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&path)
                        .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
                    file.write_all(&auth.secret)?;
                    secret_file = Some(path.clone());
                    path
                }
            };
            command.arg("--auth-secret-file").arg(path);
        }
        command.args(&options.server_args);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let child = command.spawn().map_err(|error| format!("cannot start {}: {error}", binary.display()))?;
        let mut server = ServerProcess { child, data_dir, secret_file };
        // The server's stdout is read for the whole run: the listening line, then
        // whatever the server says, shown marked as its.
        let authority = ordo_test_kit::server::wait_for_address(&mut server.child, SERVER_START_TIMEOUT, |line| {
            eprintln!("  [ordo serve] {line}")
        })
        .map_err(|error| format!("`{} serve`: {error}", binary.display()))?;
        Ok((server, authority))
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// SIGINT (a graceful shutdown), then SIGKILL if it is not gone in time.
    fn stop(&mut self) {
        stop_gracefully(&mut self.child, SERVER_STOP_TIMEOUT);
        let _ = std::fs::remove_dir_all(&self.data_dir);
        if let Some(secret_file) = &self.secret_file {
            let _ = std::fs::remove_file(secret_file);
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `http://host:port[/]` → `host:port`.
fn url_authority(url: &str) -> Result<String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("--server-url `{url}` must start with http://"))?;
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        return Err(format!("--server-url `{url}` must be http://host:port").into());
    }
    Ok(authority.to_string())
}

/// The `ordo` binary to start: `--server-bin`, or one built now with cargo.
pub fn resolve_server_binary(options: &Options) -> Result<Option<PathBuf>> {
    if options.server_url.is_some() {
        return Ok(None);
    }
    if let Some(binary) = &options.server_bin {
        return Ok(Some(binary.clone()));
    }
    // Built in the same target directory as this executable; a debug loadgen
    // still starts a release server, since the server is what is measured.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    eprintln!("loadgen: cargo build --release -p ordo-server --bin ordo (skip with --server-bin PATH)");
    let status = Command::new(&cargo)
        .args(["build", "--release", "-p", "ordo-server", "--bin", "ordo"])
        .current_dir(&workspace)
        .status()
        .map_err(|error| format!("cannot run `{cargo}` in {}: {error}; pass --server-bin", workspace.display()))?;
    if !status.success() {
        return Err(format!("`cargo build --release -p ordo-server` failed ({status})").into());
    }
    let own_dir = std::env::current_exe()?.parent().ok_or("this executable has no directory")?.to_path_buf();
    let release_dir = if own_dir.file_name().is_some_and(|name| name == "release") {
        own_dir
    } else {
        own_dir.parent().ok_or("this executable's directory has no parent")?.join("release")
    };
    let binary = release_dir.join("ordo");
    if !binary.exists() {
        return Err(format!("{} does not exist after the build; pass --server-bin", binary.display()).into());
    }
    Ok(Some(binary))
}

/// Where the scenario's server is: started by us (with its pid) or given.
pub struct Target {
    pub authority: String,
    server: Option<ServerProcess>,
    /// With `--auth`: the secret the server verifies tokens with.
    pub auth: Option<Arc<Auth>>,
}

impl Target {
    pub fn open(options: &Options, server_binary: Option<&Path>, scenario: &str) -> Result<Target> {
        let auth = Auth::new(options)?;
        match (server_binary, &options.server_url) {
            (_, Some(url)) => Ok(Target { authority: url_authority(url)?, server: None, auth }),
            (Some(binary), None) => {
                let (server, authority) = ServerProcess::start(binary, options, scenario, auth.as_deref())?;
                Ok(Target { authority, server: Some(server), auth })
            }
            (None, None) => Err("no server binary and no --server-url".into()),
        }
    }

    /// A token of `sub` in `role`, when the run has auth.
    pub fn token(&self, sub: &str, role: Role) -> Option<Arc<str>> {
        self.auth.as_ref().map(|auth| auth.token(sub, role))
    }

    pub fn pid(&self) -> Option<String> {
        self.server.as_ref().map(ServerProcess::pid)
    }
}
