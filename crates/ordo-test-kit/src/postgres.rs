//! A throw-away PostgreSQL server for the tests that follow one: `initdb` into a
//! temporary directory, listening only on a Unix socket in that directory (no
//! TCP port to collide with), `wal_level=logical`, password login by
//! SCRAM-SHA-256. PostgreSQL refuses to run as root, so under root (as in CI)
//! the server runs as the `postgres` user, which owns the directory. Readiness
//! comes from the server (`pg_ctl start --wait` watches its status), never from a
//! sleep.
//!
//! The binaries are found in `ORDO_POSTGRES_BIN_DIR`, else the newest
//! `/usr/lib/postgresql/*/bin`, else on `PATH`; `scripts/install-postgres.sh`
//! installs them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

/// The port number only names the socket file (`.s.PGSQL.5432`): nothing listens on TCP.
pub const SOCKET_PORT: u16 = 5432;

/// A running server; stopped (immediately) and its directory removed on drop.
pub struct PostgresServer {
    root_dir: PathBuf,
    bin_dir: PathBuf,
    run_as: Option<String>,
    /// The superuser's name and password.
    pub user: String,
    pub password: String,
}

static NEXT_SERVER: AtomicU64 = AtomicU64::new(0);

impl PostgresServer {
    /// Creates a cluster in a fresh temporary directory and starts it.
    pub fn start() -> Result<PostgresServer, String> {
        let bin_dir = find_bin_dir()?;
        let root_dir = std::env::temp_dir().join(format!(
            "ordo-pg-{}-{}",
            std::process::id(),
            NEXT_SERVER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&root_dir).map_err(|error| format!("cannot create {}: {error}", root_dir.display()))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let run_as = (unsafe { libc::geteuid() } == 0).then(|| "postgres".to_owned());
        let server = PostgresServer {
            root_dir,
            bin_dir,
            run_as,
            user: "ordo_admin".into(),
            password: format!("pw-{}-{}", std::process::id(), NEXT_SERVER.load(Ordering::Relaxed)),
        };
        server.init()?;
        server.start_again()?;
        Ok(server)
    }

    /// The directory of the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.root_dir
    }

    fn data_dir(&self) -> PathBuf {
        self.root_dir.join("data")
    }

    fn init(&self) -> Result<(), String> {
        let password_file = self.root_dir.join("password");
        std::fs::write(&password_file, &self.password).map_err(|error| error.to_string())?;
        if let Some(user) = &self.run_as {
            run(Command::new("chown").arg("-R").arg(user).arg(&self.root_dir))?;
        }
        let mut initdb = self.command("initdb");
        initdb
            .arg("--pgdata")
            .arg(self.data_dir())
            .args(["--username", &self.user, "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8"])
            .arg(format!("--pwfile={}", password_file.display()));
        run(&mut initdb)?;
        let settings = format!(
            "\nlisten_addresses = ''\nunix_socket_directories = '{}'\nport = {SOCKET_PORT}\nwal_level = logical\n\
             max_wal_senders = 10\nmax_replication_slots = 10\nfsync = off\nlog_min_messages = warning\n",
            self.root_dir.display()
        );
        let conf = self.data_dir().join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new().append(true).open(&conf).map_err(|error| error.to_string())?;
        file.write_all(settings.as_bytes()).map_err(|error| error.to_string())
    }

    /// Starts the server (again, after [`Self::stop`]) and waits until it accepts connections.
    pub fn start_again(&self) -> Result<(), String> {
        let mut pg_ctl = self.command("pg_ctl");
        pg_ctl.arg("--pgdata").arg(self.data_dir()).arg("--log").arg(self.root_dir.join("server.log"));
        pg_ctl.args(["--wait", "--timeout=120", "start"]);
        run(&mut pg_ctl).map_err(|error| format!("{error}\nserver log:\n{}", self.log()))
    }

    /// Stops the server at once, as a crash would (`immediate` mode: no checkpoint).
    pub fn stop(&self) -> Result<(), String> {
        let mut pg_ctl = self.command("pg_ctl");
        pg_ctl.arg("--pgdata").arg(self.data_dir()).args(["--mode=immediate", "--wait", "stop"]);
        run(&mut pg_ctl)
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root_dir.join("server.log")).unwrap_or_default()
    }

    /// Runs SQL through `psql` as the superuser on database `postgres`, stopping at
    /// the first error; returns its unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> Result<String, String> {
        let mut psql = Command::new(self.bin_dir.join("psql"));
        psql.arg("--host")
            .arg(&self.root_dir)
            .args(["--port", &SOCKET_PORT.to_string(), "--username", &self.user, "--dbname", "postgres"])
            .args(["--no-psqlrc", "--quiet", "--no-align", "--tuples-only", "--set", "ON_ERROR_STOP=1"])
            .env("PGPASSWORD", &self.password)
            .stdin(Stdio::piped());
        let mut child =
            psql.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|error| error.to_string())?;
        child.stdin.take().expect("piped").write_all(sql.as_bytes()).map_err(|error| error.to_string())?;
        let output = child.wait_with_output().map_err(|error| error.to_string())?;
        checked(output).map(|stdout| stdout.trim_end().to_owned())
    }

    /// A command for one of the server's binaries, run as the server's user.
    fn command(&self, binary: &str) -> Command {
        let program = self.bin_dir.join(binary);
        match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = self.stop();
        let _ = std::fs::remove_dir_all(&self.root_dir);
    }
}

fn find_bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("ORDO_POSTGRES_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse().ok()?, entry.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    let on_path =
        std::env::var_os("PATH").into_iter().flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>());
    on_path.into_iter().find(|dir| dir.join("initdb").exists()).ok_or_else(|| {
        "no PostgreSQL binaries (initdb): run scripts/install-postgres.sh or set ORDO_POSTGRES_BIN_DIR".to_owned()
    })
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command.stdin(Stdio::null()).output().map_err(|error| format!("cannot run {command:?}: {error}"))?;
    checked(output).map(drop)
}

fn checked(output: Output) -> Result<String, String> {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{} {stdout}{}", output.status, String::from_utf8_lossy(&output.stderr)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_starts_answers_and_restarts() {
        let server = PostgresServer::start().unwrap();
        assert_eq!(server.psql("SHOW wal_level").unwrap(), "logical");
        assert_eq!(server.psql("SHOW listen_addresses").unwrap(), "");
        server.psql("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)").unwrap();
        server.stop().unwrap();
        assert!(server.psql("SELECT 1").is_err(), "a stopped server answered");
        server.start_again().unwrap();
        assert_eq!(server.psql("SELECT count(*) FROM t").unwrap(), "1");
    }

    #[test]
    fn a_wrong_password_is_refused() {
        let mut server = PostgresServer::start().unwrap();
        server.password.push('x');
        let error = server.psql("SELECT 1").unwrap_err();
        assert!(error.contains("password authentication failed"), "{error}");
    }
}
