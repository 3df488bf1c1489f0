//! Loopback ports that no other process can take while a test needs them, and
//! a bound on how many NATS clusters one test binary runs at once.
//!
//! Picking a free port (bind port 0, close, hand the number on) leaves a window
//! in which any other process binding port 0 may get the same number, and a
//! cluster test whose nats-server then cannot bind fails for nothing it tests. A
//! `ReservedPort` closes that window: a socket bound to the port with
//! `SO_REUSEADDR` that never listens. On Linux the kernel never hands such a
//! port to another bind of port 0 (nor to an outgoing connection), and another
//! program binds it with `SO_REUSEADDR` (as every Go listener, nats-server's
//! included, does) only while no socket listens there. So the server started on
//! it binds it, and after the server is killed the port stays reserved, so a
//! restart comes back on the same port.

#![allow(dead_code)]

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Condvar, Mutex};

/// A loopback TCP port held (bound, never listening) for as long as this lives.
pub struct ReservedPort {
    socket: OwnedFd,
    port: u16,
}

impl ReservedPort {
    /// A port the kernel picks among those no socket is bound to.
    pub fn new() -> ReservedPort {
        // SAFETY: plain socket calls on a descriptor this function owns; the
        // address structures live on this stack for the duration of each call.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let socket = OwnedFd::from_raw_fd(fd);
            let on: libc::c_int = 1;
            let set = libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
            assert_eq!(set, 0, "SO_REUSEADDR: {}", std::io::Error::last_os_error());
            let mut address: libc::sockaddr_in = std::mem::zeroed();
            address.sin_family = libc::AF_INET as libc::sa_family_t;
            address.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let mut length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let bound = libc::bind(fd, (&address as *const libc::sockaddr_in).cast(), length);
            assert_eq!(bound, 0, "binding 127.0.0.1:0: {}", std::io::Error::last_os_error());
            let named = libc::getsockname(fd, (&mut address as *mut libc::sockaddr_in).cast(), &mut length);
            assert_eq!(named, 0, "getsockname: {}", std::io::Error::last_os_error());
            ReservedPort { port: u16::from_be(address.sin_port), socket }
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

/// How many NATS servers the tests of one binary run at once. A three-node
/// cluster and its Ordo nodes are six processes that must elect leaders within
/// timeouts; several of them started together on a small machine (CI has two
/// cores, shared with builds) starve each other past those timeouts. Three lets
/// one three-node cluster run, or up to three single-node ones.
const NATS_SERVERS_AT_ONCE: usize = 3;

/// The servers running now, against `NATS_SERVERS_AT_ONCE`.
static SERVERS_RUNNING: Mutex<usize> = Mutex::new(0);
static SERVER_FREED: Condvar = Condvar::new();

/// The right to run `servers` NATS servers, held for a cluster's life.
pub struct ClusterSlot {
    servers: usize,
}

impl ClusterSlot {
    /// Waits until `servers` more may run (a cluster larger than the bound
    /// waits until it runs alone).
    pub fn acquire(servers: usize) -> ClusterSlot {
        let servers = servers.min(NATS_SERVERS_AT_ONCE);
        // A test that panicked while holding the lock leaves a count that is still right.
        let mut running = SERVERS_RUNNING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        while *running + servers > NATS_SERVERS_AT_ONCE {
            running = SERVER_FREED.wait(running).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        *running += servers;
        ClusterSlot { servers }
    }
}

impl Drop for ClusterSlot {
    fn drop(&mut self) {
        let mut running = SERVERS_RUNNING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *running -= self.servers;
        SERVER_FREED.notify_all();
    }
}
