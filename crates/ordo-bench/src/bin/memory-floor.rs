//! `memory-floor`: what this machine's memory gives a loop over cold, scattered
//! state, the bound under `shared-rooms`' cost per member list.
//!
//! One buffer of `--mib` MiB (default 1 400, about what `shared-rooms` holds at
//! 100 000 users) is filled, then read at random cache lines, in groups of `k`
//! independent reads whose sum decides where the next group reads: `k = 1` is a
//! chain of dependent misses (the latency), larger `k` keeps up to `k` misses in
//! flight (what prefetching a chunk of items can reach at best). Each `k` is run
//! on 4 KiB pages and on transparent huge pages (`madvise(MADV_HUGEPAGE)`, which
//! the kernel may grant in part: the share granted is printed), since a miss in
//! the TLB costs a page walk on top of the line.
//!
//! A line per member list costs at least the figure of the largest `k`; a member
//! list touching `L` distinct cold lines costs at least `L` times that.

use std::time::Instant;

use clap::Parser;
use memmap2::{Advice, MmapMut, MmapOptions};

/// Random cache-line reads over a large buffer: ns per read by reads in flight.
#[derive(Parser)]
#[command(name = "memory-floor")]
struct Args {
    /// Size of the buffer read, in MiB (1..=65 536).
    #[arg(long, default_value_t = 1_400, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    mib: u64,
    /// Reads per measurement (1..=100 000 000).
    #[arg(long, default_value_t = 4_000_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    reads: u64,
}

const LINE_BYTES: usize = 64;
/// Independent reads per group measured: 1 is a dependent chain.
const READS_IN_FLIGHT: [usize; 5] = [1, 4, 8, 16, 32];

/// The buffer: an anonymous mapping, so that `madvise` may back it with huge pages.
struct Buffer {
    bytes: MmapMut,
}

impl Buffer {
    fn new(n_bytes: usize, huge_pages: bool) -> std::io::Result<Buffer> {
        let mut bytes = MmapOptions::new().len(n_bytes).map_anon()?;
        // A refused advice changes only the page size, which the caller reports.
        let _ = bytes.advise(if huge_pages { Advice::HugePage } else { Advice::NoHugePage });
        for (index, word) in bytes.chunks_exact_mut(8).enumerate() {
            word.copy_from_slice(&(index as u64).to_ne_bytes());
        }
        Ok(Buffer { bytes })
    }

    fn word_at_line(&self, line: usize) -> u64 {
        let start = line * LINE_BYTES;
        u64::from_ne_bytes(self.bytes[start..start + 8].try_into().expect("8 bytes"))
    }

    /// Mean ns per read with `in_flight` independent reads per group.
    fn ns_per_read(&self, in_flight: usize, n_reads: u64) -> f64 {
        let n_lines = (self.bytes.len() / LINE_BYTES) as u64;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut carry = 0u64;
        let n_groups = n_reads / in_flight as u64;
        let start = Instant::now();
        for _ in 0..n_groups {
            let mut sum = 0u64;
            for _ in 0..in_flight {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let line = (state ^ carry) % n_lines;
                sum = sum.wrapping_add(self.word_at_line(line as usize));
            }
            // The next group's addresses depend on this one's reads.
            carry = sum & 1;
        }
        std::hint::black_box(carry);
        start.elapsed().as_nanos() as f64 / (n_groups * in_flight as u64) as f64
    }
}

/// Kilobytes of this process's memory on huge pages (`AnonHugePages`), if known.
fn huge_page_kib() -> Option<u64> {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = rollup.lines().find(|line| line.starts_with("AnonHugePages:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let bytes = (args.mib as usize) << 20;
    println!("memory-floor: {} MiB, {} reads per figure; ns per read by reads in flight", args.mib, args.reads);
    for huge_pages in [false, true] {
        let huge_before = huge_page_kib().unwrap_or(0);
        let buffer = Buffer::new(bytes, huge_pages)?;
        let granted = huge_page_kib().unwrap_or(0).saturating_sub(huge_before) as f64 * 1024.0 / bytes as f64;
        let pages = if huge_pages { "huge pages" } else { "4 KiB pages" };
        print!("{pages} ({:.0} % on huge pages):", granted * 100.0);
        for in_flight in READS_IN_FLIGHT {
            print!("  k={in_flight}: {:.1}", buffer.ns_per_read(in_flight, args.reads));
        }
        println!();
    }
    Ok(())
}
