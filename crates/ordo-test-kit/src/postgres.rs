//! A throw-away PostgreSQL server for the tests that follow one: `initdb` into a
//! temporary directory, listening only on a Unix socket in that directory (no
//! TCP port to collide with), `wal_level=logical`, password login by
//! SCRAM-SHA-256. A TLS test's server ([`ServerOptions`]) also listens on
//! `127.0.0.1`: PostgreSQL cannot take port 0, so the kit names a port and,
//! when the server's log says it is in use, starts again on another. PostgreSQL refuses to run as root, so under root (as in CI)
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

/// How a server differs from the default (a Unix socket only, initdb's pg_hba).
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// Listen on 127.0.0.1 as well, on a port the kit picks.
    pub tcp: bool,
    /// `ssl = on` with this certificate and key (PEM); needs `tcp`.
    pub tls: Option<ServerCertificate>,
    /// The whole of `pg_hba.conf` instead of initdb's (which admits every
    /// database and user by SCRAM over the socket and 127.0.0.1).
    pub hba: Option<String>,
}

/// A server's certificate (its chain, PEM) and private key (PEM).
#[derive(Clone, Debug)]
pub struct ServerCertificate {
    pub certificate_pem: String,
    pub key_pem: String,
}

/// Ports tried for a TCP server before giving up: each taken one is a retry.
const PORT_ATTEMPTS: u64 = 20;

/// A running server; stopped (immediately) and its directory removed on drop.
pub struct PostgresServer {
    root_dir: PathBuf,
    bin_dir: PathBuf,
    run_as: Option<String>,
    /// The TCP port (with `tcp`), else [`SOCKET_PORT`]; it names the socket file too.
    port: u16,
    /// The superuser's name and password.
    pub user: String,
    pub password: String,
}

static NEXT_SERVER: AtomicU64 = AtomicU64::new(0);

impl PostgresServer {
    /// Creates a cluster in a fresh temporary directory and starts it.
    pub fn start() -> Result<PostgresServer, String> {
        PostgresServer::start_with(&ServerOptions::default())
    }

    /// [`Self::start`] with TCP, TLS or a pg_hba of the test's.
    pub fn start_with(options: &ServerOptions) -> Result<PostgresServer, String> {
        let bin_dir = find_bin_dir()?;
        let root_dir = std::env::temp_dir().join(format!(
            "ordo-pg-{}-{}",
            std::process::id(),
            NEXT_SERVER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&root_dir).map_err(|error| format!("cannot create {}: {error}", root_dir.display()))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let run_as = (unsafe { libc::geteuid() } == 0).then(|| "postgres".to_owned());
        let serial = NEXT_SERVER.load(Ordering::Relaxed);
        let mut server = PostgresServer {
            root_dir,
            bin_dir,
            run_as,
            port: SOCKET_PORT,
            user: "ordo_admin".into(),
            password: format!("pw-{}-{serial}", std::process::id()),
        };
        server.init()?;
        server.configure(options)?;
        if !options.tcp {
            server.start_again()?;
            return Ok(server);
        }
        for attempt in 0..PORT_ATTEMPTS {
            server.port = candidate_port(serial, attempt);
            server.append_settings(&format!("port = {}\n", server.port))?;
            let log_before = server.log().len();
            match server.start_again() {
                Ok(()) => return Ok(server),
                Err(_) if server.log().get(log_before..).is_some_and(|log| log.contains("already in use")) => {}
                Err(error) => return Err(error),
            }
        }
        Err(format!("no free TCP port for PostgreSQL in {PORT_ATTEMPTS} attempts"))
    }

    /// The port to give clients (TCP, or the number in the socket's name).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// TCP, TLS and pg_hba as `options` says, before the first start.
    fn configure(&self, options: &ServerOptions) -> Result<(), String> {
        if options.tcp {
            self.append_settings("listen_addresses = '127.0.0.1'\n")?;
        }
        if let Some(certificate) = &options.tls {
            let (cert_file, key_file) = (self.root_dir.join("server.crt"), self.root_dir.join("server.key"));
            self.write_owned(&cert_file, &certificate.certificate_pem, 0o644)?;
            // PostgreSQL refuses a key others may read, or one it does not own.
            self.write_owned(&key_file, &certificate.key_pem, 0o600)?;
            self.append_settings(&format!(
                "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                cert_file.display(),
                key_file.display()
            ))?;
        }
        if let Some(hba) = &options.hba {
            self.write_owned(&self.data_dir().join("pg_hba.conf"), hba, 0o600)?;
        }
        Ok(())
    }

    /// Writes `path` with `mode`, owned by the server's user.
    fn write_owned(&self, path: &Path, text: &str, mode: u32) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).map_err(|error| format!("cannot write {}: {error}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|error| error.to_string())?;
        if let Some(user) = &self.run_as {
            run(Command::new("chown").arg(user).arg(path))?;
        }
        Ok(())
    }

    fn append_settings(&self, settings: &str) -> Result<(), String> {
        let conf = self.data_dir().join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new().append(true).open(&conf).map_err(|error| error.to_string())?;
        file.write_all(settings.as_bytes()).map_err(|error| error.to_string())
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
        self.append_settings(&settings)
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
            .args(["--port", &self.port.to_string(), "--username", &self.user, "--dbname", "postgres"])
            .args(["--no-psqlrc", "--quiet", "--no-align", "--tuples-only", "--set", "ON_ERROR_STOP=1"])
            .env("PGPASSWORD", &self.password)
            .stdin(Stdio::piped());
        let mut child =
            psql.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|error| error.to_string())?;
        child.stdin.take().expect("piped").write_all(sql.as_bytes()).map_err(|error| error.to_string())?;
        let output = child.wait_with_output().map_err(|error| error.to_string())?;
        checked(output).map(|stdout| stdout.trim_end().to_owned())
    }

    /// Makes PostgreSQL invalidate replication slot `slot`, as it does with a
    /// follower down too long: `max_slot_wal_keep_size` set to 1 MB, then rounds
    /// of WAL (a segment each, in a table of its own) each ended by a
    /// checkpoint, which is where slots past the bound are invalidated, until
    /// the slot's `wal_status` is `lost` (two or three rounds suffice).
    pub fn invalidate_slot(&self, slot: &str) -> Result<(), String> {
        const MAX_WAL_ROUNDS: usize = 20;
        // Each a statement of its own: `ALTER SYSTEM` runs outside a transaction.
        self.psql("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")?;
        self.psql("SELECT pg_reload_conf()")?;
        self.psql("CREATE TABLE IF NOT EXISTS wal_filler (id int PRIMARY KEY, v text)")?;
        let wal_status = format!("SELECT wal_status FROM pg_replication_slots WHERE slot_name = '{slot}'");
        for round in 0..MAX_WAL_ROUNDS {
            if self.psql(&wal_status)? == "lost" {
                return Ok(());
            }
            self.psql(&format!(
                "INSERT INTO wal_filler SELECT g, repeat('{round}', 1000) FROM generate_series(1, 3000) g \
                 ON CONFLICT (id) DO UPDATE SET v = excluded.v"
            ))?;
            self.psql("SELECT pg_switch_wal()")?;
            self.psql("CHECKPOINT")?;
        }
        Err(format!("the slot `{slot}` was not invalidated after {MAX_WAL_ROUNDS} rounds of WAL"))
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

/// A port for the `attempt`th try of the `serial`th server of this process,
/// spread over 20000..60000 by the process id so that parallel test processes
/// rarely meet (when they do, the server's log says so and the next is tried).
fn candidate_port(serial: u64, attempt: u64) -> u16 {
    let spread = u64::from(std::process::id()) * 7919 + serial * 104_729 + attempt * 15_485_863;
    20_000 + (spread % 40_000) as u16
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

/// A CA and a certificate it signed for `localhost` and `127.0.0.1` (or other
/// names), made afresh for a test (ECDSA P-256, signed with SHA-256).
#[cfg(feature = "tls")]
#[derive(Clone, Debug)]
pub struct TestCertificates {
    /// The CA's certificate: what a client trusts.
    pub ca_pem: String,
    pub server: ServerCertificate,
}

#[cfg(feature = "tls")]
impl TestCertificates {
    pub fn new(ca_name: &str) -> Result<TestCertificates, String> {
        TestCertificates::for_names(ca_name, &["localhost", "127.0.0.1"])
    }

    /// A server certificate for `names` (host names or addresses) only.
    pub fn for_names(ca_name: &str, names: &[&str]) -> Result<TestCertificates, String> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let error = |error: rcgen::Error| format!("making a test certificate: {error}");
        let ca_key = KeyPair::generate().map_err(error)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(error)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, ca_name);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = ca_params.self_signed(&ca_key).map_err(error)?;
        let server_key = KeyPair::generate().map_err(error)?;
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).map_err(error)?;
        params.distinguished_name.push(DnType::CommonName, names.first().map_or("server", String::as_str));
        let certificate = params.signed_by(&server_key, &ca, &ca_key).map_err(error)?;
        Ok(TestCertificates {
            ca_pem: ca.pem(),
            server: ServerCertificate { certificate_pem: certificate.pem(), key_pem: server_key.serialize_pem() },
        })
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
