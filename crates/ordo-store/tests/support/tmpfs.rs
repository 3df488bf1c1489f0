//! A tmpfs mounted for a disk-full test (shared by the store's and the server's
//! tests through `#[path]`): root only; elsewhere the test says it was skipped.

use std::path::Path;
use std::process::Command;

/// A tmpfs mounted for the test, unmounted when dropped.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (with a message) where the test cannot mount one.
    pub fn mount(size: &str) -> Option<Tmpfs> {
        // SAFETY: `geteuid` reads the process's credentials and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: mounting a tmpfs needs root; the disk-full test did not run");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("running mount");
        if !status.success() {
            eprintln!("SKIPPED: `mount -t tmpfs` failed ({status}); the disk-full test did not run");
            return None;
        }
        Some(Tmpfs { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Unmounts `dir`, waiting for a process that still holds a file there (a
/// server being stopped) for a while, then lazily: a test never leaves a mount.
fn unmount(dir: &Path) {
    for _ in 0..50 {
        if Command::new("umount").arg(dir).status().is_ok_and(|status| status.success()) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = Command::new("umount").arg("-l").arg(dir).status();
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        unmount(self.dir.path());
    }
}
