//! A real `ordo serve` on loopback for the end-to-end tests.
//!
//! The binary: `$ORDO_BIN`, else `ordo` beside this test's target directory (built by
//! `cargo test --workspace`, which builds ordo-server's binary for its own tests), else
//! built here with `cargo build -p ordo-server --bin ordo`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

pub fn ordo_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(path) = std::env::var_os("ORDO_BIN") {
            return PathBuf::from(path);
        }
        // target/debug/deps/it-<hash> → target/debug/ordo
        let exe = std::env::current_exe().expect("the test's path");
        let beside = exe.parent().and_then(Path::parent).expect("a target directory").join("ordo");
        if !beside.exists() {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let status = Command::new(cargo)
                .args(["build", "-p", "ordo-server", "--bin", "ordo"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("running cargo build");
            assert!(status.success(), "cargo build -p ordo-server --bin ordo failed");
        }
        assert!(beside.exists(), "no ordo binary at {} (set ORDO_BIN)", beside.display());
        beside
    })
}

pub struct Server {
    child: Child,
    pub port: u16,
    pub secret: PathBuf,
}

impl Server {
    /// Starts a server with auth on (HS256, the secret in `dir/secret`) on `port` (0: any).
    pub fn start(dir: &Path, port: u16) -> Server {
        let secret = dir.join("secret");
        if !secret.exists() {
            std::fs::write(&secret, "client-test-secret-0123456789abcdef0123\n").unwrap();
        }
        let mut command = Command::new(ordo_bin());
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(dir.join("data"))
            .arg("--auth-secret-file")
            .arg(&secret)
            .stderr(Stdio::inherit());
        let (child, authority) =
            ordo_test_kit::server::spawn_server(&mut command, Duration::from_secs(60), |_| {}).expect("starting ordo");
        let port = ordo_test_kit::server::port_of(&authority);
        Server { child, port, secret }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A token minted by `ordo token`.
    pub fn mint(&self, sub: &str, role: &str, ttl_secs: u64) -> String {
        mint(&self.secret, sub, role, ttl_secs)
    }

    /// SIGKILL: the harshest restart (what was acknowledged is on disk; sessions are lost).
    pub fn kill(mut self) {
        self.child.kill().expect("killing ordo");
        self.child.wait().expect("waiting for ordo");
    }
}

pub fn mint(secret: &Path, sub: &str, role: &str, ttl_secs: u64) -> String {
    let output = Command::new(ordo_bin())
        .args(["token", "--sub", sub, "--role", role, "--ttl", &ttl_secs.to_string(), "--secret-file"])
        .arg(secret)
        .output()
        .expect("running ordo token");
    assert!(output.status.success(), "ordo token: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

impl Server {
    /// SIGINT: the graceful stop (WebSockets are closed with 1001).
    pub fn interrupt(mut self) {
        let status = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status().expect("running kill");
        assert!(status.success());
        let exit = self.child.wait().expect("waiting for ordo");
        assert!(exit.success(), "ordo exited with {exit}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
