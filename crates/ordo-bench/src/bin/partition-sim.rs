//! `partition-sim`: the plan past one log (docs/SCALING.md), simulated. Runs the
//! partition model (`ordo_bench::partition`) over seeds and prints what its
//! schedules did (writes acknowledged, refused by a fence and retried, moves,
//! views pinned and gathered) — any broken rule stops it with the seed. Then the
//! capacity side: with a collection partitioned by owner over K streams and
//! owners whose activity is uniform or Zipf(1), the share of writes the busiest
//! stream takes, and the entries/s K streams sustain given one stream's ceiling
//! (`--stream-ceiling`, entries/s; measured by `nats-sync`, docs/BENCHMARKS.md).

use std::process::ExitCode;

use clap::Parser;
use ordo_bench::cli::count;
use ordo_bench::partition::{busiest_stream_share, check, Config, Rules};

/// The partition model over seeds, then the capacity of K streams.
#[derive(Parser)]
#[command(name = "partition-sim")]
struct Args {
    /// Seeds per configuration
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// One stream's ceiling, in entries/s (measured by `nats-sync`)
    #[arg(long, value_name = "ENTRIES_PER_S")]
    stream_ceiling: Option<f64>,
    /// Owners the partitioned collection's rows belong to
    #[arg(long, default_value_t = 100_000, value_parser = count)]
    owners: usize,
}

fn main() -> ExitCode {
    let Args { seeds, stream_ceiling: ceiling, owners } = Args::parse();
    println!("model: {seeds} seeds per configuration, each {} steps", Config::default().steps);
    println!("streams  routers  acked   moved+retried  waited-for-move  moves  views pinned/gathered");
    for streams in [2usize, 4, 8] {
        for routers in [1usize, 4] {
            let config = Config { streams, routers, ..Config::default() };
            let mut total = ordo_bench::partition::Stats::default();
            for seed in 0..seeds {
                match check(seed, config, Rules::default()) {
                    Ok(s) => {
                        total.writes_acked += s.writes_acked;
                        total.writes_moved_retried += s.writes_moved_retried;
                        total.writes_waited_for_move += s.writes_waited_for_move;
                        total.moves += s.moves;
                        total.views_pinned += s.views_pinned;
                        total.views_gathered += s.views_gathered;
                    }
                    Err(e) => {
                        eprintln!("BROKEN: {streams} streams, {routers} routers, seed {seed}: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            println!(
                "{streams:>7}  {routers:>7}  {:>6}  {:>13}  {:>15}  {:>5}  {}/{}",
                total.writes_acked,
                total.writes_moved_retried,
                total.writes_waited_for_move,
                total.moves,
                total.views_pinned,
                total.views_gathered
            );
        }
    }
    println!("every rule held: each acknowledged write in exactly one stream's group, the one owning its slot, with its last value; every view equal to the reference");

    println!("\ncapacity: {owners} owners partitioned by owner hash over K streams");
    println!("K  busiest share (uniform)  busiest share (Zipf 1)  sustained entries/s (uniform / Zipf 1)");
    for k in [1usize, 2, 4, 8, 16] {
        let uniform = busiest_stream_share(k, owners, 0.0);
        let zipf = busiest_stream_share(k, owners, 1.0);
        let sustained = match ceiling {
            Some(c) => format!("{:.0} / {:.0}", c / uniform, c / zipf),
            None => "(pass --stream-ceiling)".to_owned(),
        };
        println!("{k:<2} {uniform:>24.3} {zipf:>23.3}  {sustained}");
    }
    ExitCode::SUCCESS
}
