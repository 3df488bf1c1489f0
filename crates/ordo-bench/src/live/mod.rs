//! Driving a live `ordo serve` over its wire protocol (docs/PROTOCOL.md): the
//! parts `loadgen` (one server) and `cluster-bench`'s chat phase (a cluster's
//! nodes) share, so that both measure the same scenario with the same checks.
//!
//! - [`stats`]: the process clock, the seeded random numbers, the latency histogram.
//! - [`procfs`]: CPU seconds and memory of processes, from /proc.
//! - [`http`]: a keep-alive HTTP/1.1 client pool.
//! - [`serve_process`]: an `ordo serve` a benchmark starts and stops itself.
//! - [`wire`]: the server's frames and replies, as far as the load generator reads them.
//! - [`subscriber`]: one WebSocket subscription: its copy of the window, its checks.
//! - [`writer`]: the paced write loop and its counters.
//! - [`chat`]: the chat scenario's data, set-up and update stream.
//! - [`flagship`]: the flagship chat's data (shared rooms of Zipf sizes), its two layouts and update streams.
//! - [`phase`]: the live phase (subscribe, write while measuring, settle).
//! - [`verify`]: every client's list against a one-shot query of its window.

pub mod chat;
pub mod flagship;
pub mod http;
pub mod phase;
pub mod procfs;
pub mod serve_process;
pub mod stats;
pub mod subscriber;
pub mod verify;
pub mod wire;
pub mod writer;

use std::time::Duration;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, BoxError>;

/// PROTOCOL.md: at most 10 000 ops in one write request (all parts together).
pub const MAX_OPS_PER_REQUEST: usize = 10_000;
/// WebSocket handshakes in flight at once: a burst of 1 000 SYNs could overflow
/// the listen backlog and turn into one-second retransmit stalls.
pub const CONNECT_CONCURRENCY: usize = 64;
/// Largest server frame a subscriber accepts (a `Reset` of 1 000 items is far smaller).
pub const MAX_SERVER_FRAME_BYTES: usize = 16 * 1024 * 1024;
pub const WELCOME_TIMEOUT: Duration = Duration::from_secs(10);
pub const CLOSE_TIMEOUT: Duration = Duration::from_millis(500);
pub const FIRST_FRAMES_TIMEOUT: Duration = Duration::from_secs(60);
/// Frames have settled once no subscriber received one for this long...
pub const SETTLE_QUIET: Duration = Duration::from_millis(500);
/// ...or, at the latest, this long after the writer stopped.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
