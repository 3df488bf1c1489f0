//! `conn-hold`'s command line: every size has a limit, and `--quick` changes
//! the defaults of the sizes, not their meaning.

use std::path::PathBuf;

use clap::Parser;
use ordo_bench::cli::in_range;

/// Past this, one machine's loopback and this process's memory are the limit,
/// not the server.
const MAX_CONNECTIONS: usize = 250_000;
const MAX_SECONDS: f64 = 3_600.0;
/// PROTOCOL.md: a window holds at most 1 000 items.
const MAX_WINDOW: usize = 1_000;
const MAX_GROUPS: usize = 100_000;
const MAX_ITEMS_PER_GROUP: usize = 1_000;
const MAX_RATE: f64 = 100_000.0;
const MAX_CLIENT_THREADS: usize = 64;

/// Holds many subscribed WebSockets on one `ordo serve` and measures what each
/// costs the server (memory), whether the server stays responsive
/// (`/v1/health` latency) and whether every one still gets every update.
#[derive(Parser, Debug)]
#[command(name = "conn-hold")]
struct Args {
    /// Small sizes (2 000 connections in 100 groups, 3 s): a CI smoke run
    #[arg(long)]
    quick: bool,
    /// WebSockets held, each subscribed to its own window [default: 100000]
    #[arg(long, value_parser = in_range(1, MAX_CONNECTIONS))]
    connections: Option<usize>,
    /// How long all of them are held, once subscribed [default: 30]
    #[arg(long, value_parser = in_range(0.5, MAX_SECONDS))]
    seconds: Option<f64>,
    /// Updates per second while holding, each to one random group's first item
    #[arg(long, default_value_t = 50.0, value_parser = in_range(0.0, MAX_RATE))]
    rate: f64,
    /// Groups: connection i watches group i mod GROUPS, so an update reaches
    /// CONNECTIONS / GROUPS windows (1: every update reaches every window)
    #[arg(long, default_value_t = 1_000, value_parser = in_range(1, MAX_GROUPS))]
    groups: usize,
    /// Window length of every subscription (top N of its group by score)
    #[arg(long, default_value_t = 20, value_parser = in_range(1, MAX_WINDOW))]
    window: usize,
    /// Items of each group (the first is the one updates move)
    #[arg(long, default_value_t = 25, value_parser = in_range(1, MAX_ITEMS_PER_GROUP))]
    items_per_group: usize,
    /// Tokio workers of the holding client
    #[arg(long, default_value_t = 1, value_parser = in_range(1, MAX_CLIENT_THREADS))]
    client_threads: usize,
    /// The `ordo` binary to start (built with `cargo build --release -p ordo-server --bin ordo`)
    #[arg(long, default_value = "target/release/ordo")]
    server_bin: PathBuf,
    /// More arguments for `ordo serve` (repeatable)
    #[arg(long, allow_hyphen_values = true)]
    server_arg: Vec<String>,
}

#[derive(Debug)]
pub struct Options {
    pub connections: usize,
    pub seconds: f64,
    pub rate: f64,
    pub groups: usize,
    pub window: usize,
    pub items_per_group: usize,
    pub client_threads: usize,
    pub server_bin: PathBuf,
    pub server_args: Vec<String>,
}

impl Options {
    pub fn from_command_line() -> Options {
        Options::from_args(Args::parse())
    }

    fn from_args(args: Args) -> Options {
        let (connections, seconds, groups) = if args.quick { (2_000, 3.0, 100) } else { (100_000, 30.0, args.groups) };
        Options {
            connections: args.connections.unwrap_or(connections),
            seconds: args.seconds.unwrap_or(seconds),
            rate: args.rate,
            groups: groups.min(args.connections.unwrap_or(connections)),
            window: args.window,
            items_per_group: args.items_per_group,
            client_threads: args.client_threads,
            server_bin: args.server_bin,
            server_args: args.server_arg,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Options, clap::Error> {
        Args::try_parse_from(std::iter::once("conn-hold").chain(line.split_whitespace())).map(Options::from_args)
    }

    #[test]
    fn quick_changes_the_defaults_and_explicit_sizes_win() {
        let quick = parse("--quick").unwrap();
        assert_eq!((quick.connections, quick.groups), (2_000, 100));
        let full = parse("").unwrap();
        assert_eq!((full.connections, full.seconds, full.groups), (100_000, 30.0, 1_000));
        assert_eq!(parse("--connections 10").unwrap().groups, 10, "no group without a connection");
        assert_eq!(parse("--quick --connections 50").unwrap().connections, 50);
        assert!(parse("--connections 0").is_err());
        assert!(parse("--connections 250001").is_err());
        assert!(parse("--window 1001").is_err());
    }
}
