//! What `conn-hold` measured, and its printout with the goals beside it.

use std::time::Instant;

use crate::options::Options;

/// Goals for one node (the figures a deployment sizes by).
const GOAL_RSS_BYTES: u64 = 2 << 30;
const GOAL_BYTES_PER_CONNECTION: f64 = 20.0 * 1024.0;
const GOAL_HEALTH_P99_US: u64 = 10_000;

/// The server's resident memory at each stage, and the kernel's socket buffers.
#[derive(Default)]
pub struct Memory {
    /// After the collection is loaded, before any connection.
    pub before: u64,
    /// Every connection open (upgraded, `welcome` read), none subscribed.
    pub connected: u64,
    /// Every connection subscribed.
    pub subscribed: u64,
    /// The highest seen while holding.
    pub peak: u64,
    /// TCP buffers of the whole machine (both ends of every connection), from /proc/net/sockstat.
    pub kernel_sockets: Option<u64>,
}

pub struct HealthLatency {
    pub samples: usize,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl HealthLatency {
    /// The samples sent from `from` to `to`.
    pub fn between(samples: &[(Instant, u64)], from: Instant, to: Instant) -> HealthLatency {
        HealthLatency::of(samples.iter().filter(|(sent, _)| (from..=to).contains(sent)).map(|&(_, us)| us).collect())
    }

    pub fn of(mut latencies_us: Vec<u64>) -> HealthLatency {
        latencies_us.sort_unstable();
        let at = |share: f64| -> u64 {
            let index = ((latencies_us.len() as f64 * share).ceil() as usize).saturating_sub(1);
            latencies_us.get(index).copied().unwrap_or(0)
        };
        HealthLatency {
            samples: latencies_us.len(),
            p50_us: at(0.5),
            p99_us: at(0.99),
            max_us: latencies_us.last().copied().unwrap_or(0),
        }
    }
}

/// The sweep's outcome: every connection must get its group's last update.
pub struct Delivery {
    pub missed: usize,
    /// From the sweep's request to the last connection's frame (NaN: some never got it).
    pub seconds: f64,
}

pub struct Report {
    pub connections: usize,
    pub groups: usize,
    pub failed: u64,
    pub errors: Vec<String>,
    pub connect_seconds: f64,
    pub subscribe_seconds: f64,
    pub memory: Memory,
    pub trickle_updates: u64,
    pub health_trickle: HealthLatency,
    pub health_sweep: HealthLatency,
    pub delivery: Delivery,
}

impl Report {
    /// Every connection held and every one got its last update.
    pub fn is_whole(&self) -> bool {
        self.failed == 0 && self.delivery.missed == 0
    }

    pub fn print(&self, options: &Options) {
        println!(
            "conn-hold: {} WebSockets on one `ordo serve`, each on the top {} of one of {} groups",
            self.connections, options.window, self.groups
        );
        println!(
            "  opened in {:.1} s ({:.0}/s), subscribed in {:.1} s; failed: {}{}",
            self.connect_seconds,
            self.connections as f64 / self.connect_seconds,
            self.subscribe_seconds,
            self.failed,
            if self.errors.is_empty() { String::new() } else { format!(" ({})", self.errors.join("; ")) }
        );
        self.print_memory();
        print_health(
            &format!("during the trickle ({} updates in {:.0} s)", self.trickle_updates, options.seconds),
            &self.health_trickle,
        );
        print_health("during the sweep (every window gets a frame)", &self.health_sweep);
        let delivery = &self.delivery;
        match delivery.missed {
            0 => println!("  the sweep reached every connection in {:.2} s", delivery.seconds),
            missed => println!("  {missed} connections never got their group's last update"),
        }
    }

    fn print_memory(&self) {
        let n = self.connections as f64;
        let memory = &self.memory;
        let per_connection = memory.peak.saturating_sub(memory.before) as f64 / n;
        let connection_part = memory.connected.saturating_sub(memory.before) as f64 / n;
        let subscription_part = memory.subscribed.saturating_sub(memory.connected) as f64 / n;
        println!(
            "  server RSS: {} before, {} open, {} subscribed, {} at peak (goal ≤ {})",
            mib(memory.before),
            mib(memory.connected),
            mib(memory.subscribed),
            mib(memory.peak),
            mib(GOAL_RSS_BYTES)
        );
        println!(
            "  per connection: {:.1} KiB at peak (goal ≤ {:.0} KiB): {:.1} KiB to hold it open, {:.1} KiB for its subscription",
            per_connection / 1024.0,
            GOAL_BYTES_PER_CONNECTION / 1024.0,
            connection_part / 1024.0,
            subscription_part / 1024.0
        );
        if let Some(kernel) = memory.kernel_sockets {
            println!("  kernel TCP buffers (both ends, outside RSS): {}", mib(kernel));
        }
    }
}

fn print_health(when: &str, health: &HealthLatency) {
    println!(
        "  /v1/health {when}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} requests (goal p99 ≤ {} ms)",
        ms(health.p50_us),
        ms(health.p99_us),
        ms(health.max_us),
        health.samples,
        GOAL_HEALTH_P99_US / 1000
    );
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// The `mem` pages of the `TCP:` line of /proc/net/sockstat, in bytes.
pub fn kernel_socket_bytes() -> Option<u64> {
    let sockstat = std::fs::read_to_string("/proc/net/sockstat").ok()?;
    let line = sockstat.lines().find(|line| line.starts_with("TCP:"))?;
    let mut words = line.split_whitespace();
    words.find(|word| *word == "mem")?;
    let pages: u64 = words.next()?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * page_size.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let health = HealthLatency::of((1..=200).rev().collect());
        assert_eq!((health.samples, health.p50_us, health.p99_us, health.max_us), (200, 100, 198, 200));
        assert_eq!(HealthLatency::of(Vec::new()).p99_us, 0);
    }
}
