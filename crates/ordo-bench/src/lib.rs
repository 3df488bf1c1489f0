//! Ordo's benchmark: every scenario of `SCENARIOS.md`, with the peers
//! (eyeball-im-util, naive, naive-full) measured in the same run on the same
//! seeded data.
//!
//! - [`data`]: the deterministic room collection, update streams, filters,
//!   window offsets and `many-lists` collections.
//! - [`harness`]: per-operation timing, allocation counting, memory probes.
//! - [`peers`]: the peers, one function per scenario each.
//! - [`ordo_system`]: the Ordo side, one function per scenario.
//! - [`cluster_bench`]: the `cluster-bench` binary's phases (cluster mode's figures).
//! - [`live`]: drives a live `ordo serve` (loadgen, cluster-bench's chat phase).
//! - [`shared_rooms`]: the `shared-rooms` scenario (its data, its three systems).
//! - [`cli`]: value parsers of the binaries' command lines.
//! - [`scenarios`]: the runner; [`report`]: the table and JSON lines.

pub mod cli;
pub mod cluster_bench;
pub mod data;
pub mod harness;
pub mod live;
pub mod ordo_system;
pub mod partition;
pub mod peers;
pub mod report;
pub mod scenarios;
pub mod shared_rooms;

/// Every allocation of the benchmark (and of its tests) goes through the
/// counting allocator: the harness reads its count around each timed operation
/// and its live bytes for the memory figures. An allocation on a hot path is a
/// number in the report, not an error.
#[global_allocator]
static GLOBAL: ordo_test_kit::alloc::CountingAllocator = ordo_test_kit::alloc::CountingAllocator;
