//! `pg-bench`'s command line: every size has a limit, and `--quick` changes the
//! defaults of the sizes, not their meaning.

use std::path::PathBuf;

use clap::Parser;
use ordo_bench::cli::in_range;

/// Room ids are `r` and the row's number: ten million keeps the fill and the
/// copy within minutes on a small machine.
const MAX_ROWS: u64 = 10_000_000;
const MAX_SECONDS: f64 = 3_600.0;
const MAX_RATE_PER_SECOND: f64 = 1_000_000.0;
/// One WebSocket per subscriber; the server accepts at most 10 000 connections.
pub const MAX_SUBSCRIBERS: usize = 10_000;
/// Far below the follower's 524 288 changes per transaction, and one statement
/// of this many ids stays a few hundred kilobytes.
const MAX_BATCH_ROWS: usize = 10_000;
const MAX_WRITERS: usize = 64;
/// PROTOCOL.md: a window holds at most 1 000 items.
const MAX_WINDOW_LIMIT: usize = 1_000;
const MAX_SUBSCRIBER_THREADS: usize = 64;

/// Measures `ordo serve --pg-table` following a throw-away PostgreSQL: the
/// initial copy's rate, the sustained streaming rate, and the latency from a
/// transaction sent to PostgreSQL to the frame on subscribers' WebSockets.
#[derive(Parser, Debug)]
#[command(name = "pg-bench")]
struct Args {
    /// Small sizes (20 000 rows, 2 s phases, 100 subscribers, 1 000 rows/s): a CI smoke run
    #[arg(long)]
    quick: bool,
    /// Rows of the table copied at the first start [default: 1000000]
    #[arg(long, value_parser = in_range(1, MAX_ROWS))]
    rows: Option<u64>,
    /// Length of each write phase (streaming, then latency) [default: 10]
    #[arg(long, value_parser = in_range(0.1, MAX_SECONDS))]
    seconds: Option<f64>,
    /// Rows updated per second in the latency phase [default: 5000]
    #[arg(long, value_parser = in_range(1.0, MAX_RATE_PER_SECOND))]
    rate: Option<f64>,
    /// WebSocket subscribers in the latency phase [default: 1000]
    #[arg(long, value_parser = in_range(1, MAX_SUBSCRIBERS))]
    subscribers: Option<usize>,
    /// Rows updated by each transaction (one UPDATE statement)
    #[arg(long, default_value_t = 100, value_parser = in_range(1, MAX_BATCH_ROWS))]
    batch: usize,
    /// Connections sending transactions at once in the streaming phase, each on its own rows
    #[arg(long, default_value_t = 4, value_parser = in_range(1, MAX_WRITERS))]
    writers: usize,
    /// Window length of every subscription (top N by recency, descending)
    #[arg(long, default_value_t = 20, value_parser = in_range(1, MAX_WINDOW_LIMIT))]
    window: usize,
    /// Only these fields in every subscription's items (comma-separated; all by default):
    /// smaller frames for the server to encode and the subscribers to parse
    #[arg(long, value_delimiter = ',', value_parser = ["id", "name", "recency", "last_seq", "preview"])]
    fields: Vec<String>,
    /// Tokio workers for the subscribers
    #[arg(long, default_value_t = 1, value_parser = in_range(1, MAX_SUBSCRIBER_THREADS))]
    subscriber_threads: usize,
    /// Whose lists the latency phase's subscribers watch: `shared`, all the
    /// same top rooms (every transaction changes every window); `own`, each
    /// its own rooms (`owner` = its index), as each user of an app watches
    /// their own list (a row changes one window)
    #[arg(long, value_enum, default_value_t = Lists::Shared)]
    lists: Lists,
    /// Seed of the rows each transaction updates
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The `ordo` binary to start
    #[arg(long, value_name = "PATH", default_value = "target/release/ordo")]
    ordo_bin: PathBuf,
    /// Runs `ordo serve` in cluster mode on the NATS server at this URL (one
    /// running JetStream server, e.g. `.tools/bin/nats-server -js`), on a
    /// stream of one replica made for this run: the follower then publishes
    /// every transaction to the stream and applies it from there
    #[arg(long, value_name = "NATS_URL")]
    cluster: Option<String>,
}

/// Whose lists the subscribers watch (`--lists`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lists {
    Shared,
    Own,
}

/// The run's settings, with `--quick`'s defaults applied.
#[derive(Debug)]
pub struct Options {
    pub quick: bool,
    pub rows: u64,
    pub seconds: f64,
    pub rate: f64,
    pub subscribers: usize,
    pub batch: usize,
    pub writers: usize,
    pub window: usize,
    /// The subscriptions' `fields` (a JSON array), `None` for all.
    pub fields: Option<&'static str>,
    pub subscriber_threads: usize,
    pub lists: Lists,
    pub seed: u64,
    pub ordo_bin: PathBuf,
    pub cluster: Option<String>,
}

impl Options {
    /// The command line's options; `Err` with the message for what clap cannot
    /// check alone (clap itself exits on `--help` and on a malformed flag).
    pub fn from_command_line() -> Result<Options, String> {
        Options::from_args(Args::parse())
    }

    fn from_args(args: Args) -> Result<Options, String> {
        let quick = args.quick;
        let options = Options {
            quick,
            rows: args.rows.unwrap_or(if quick { 20_000 } else { 1_000_000 }),
            seconds: args.seconds.unwrap_or(if quick { 2.0 } else { 10.0 }),
            rate: args.rate.unwrap_or(if quick { 1_000.0 } else { 5_000.0 }),
            subscribers: args.subscribers.unwrap_or(if quick { 100 } else { 1_000 }),
            batch: args.batch,
            writers: args.writers,
            window: args.window,
            fields: fields_json(&args.fields),
            subscriber_threads: args.subscriber_threads,
            lists: args.lists,
            seed: args.seed,
            ordo_bin: args.ordo_bin,
            cluster: args.cluster,
        };
        // Each writer updates only its own rows (no two transactions wait on
        // each other's row locks), and a transaction's rows are distinct.
        let rows_needed = (options.writers * options.batch) as u64;
        if options.rows < rows_needed {
            return Err(format!(
                "--rows {} is too few for --writers {} × --batch {}: at least {rows_needed}",
                options.rows, options.writers, options.batch
            ));
        }
        Ok(options)
    }

    /// Transactions per second of the latency phase.
    pub fn transactions_per_second(&self) -> f64 {
        self.rate / self.batch as f64
    }
}

/// `["recency","last_seq"]`; leaked once, as every subscriber's spec holds it for the whole run.
fn fields_json(fields: &[String]) -> Option<&'static str> {
    if fields.is_empty() {
        return None;
    }
    let quoted: Vec<String> = fields.iter().map(|field| format!("\"{field}\"")).collect();
    Some(Box::leak(format!("[{}]", quoted.join(",")).into_boxed_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Options, String> {
        let args = Args::try_parse_from(std::iter::once("pg-bench").chain(line.split_whitespace()))
            .map_err(|error| error.to_string())?;
        Options::from_args(args)
    }

    #[test]
    fn quick_changes_the_defaults_and_flags_override_them() {
        let full = parse("").unwrap();
        assert_eq!((full.rows, full.seconds, full.rate, full.subscribers), (1_000_000, 10.0, 5_000.0, 1_000));
        assert_eq!(full.ordo_bin, PathBuf::from("target/release/ordo"));
        let quick = parse("--quick --rows 50_000 --ordo-bin /x/ordo").unwrap();
        assert_eq!((quick.rows, quick.seconds, quick.rate, quick.subscribers), (50_000, 2.0, 1_000.0, 100));
        assert_eq!(quick.ordo_bin, PathBuf::from("/x/ordo"));
        assert_eq!(parse("--rate 2000 --batch 50").unwrap().transactions_per_second(), 40.0);
        assert_eq!(full.fields, None);
        assert_eq!(parse("--fields recency,last_seq").unwrap().fields, Some(r#"["recency","last_seq"]"#));
        assert_eq!((full.lists, parse("--lists own").unwrap().lists), (Lists::Shared, Lists::Own));
    }

    #[test]
    fn values_outside_their_limits_are_refused() {
        for line in [
            "--rows 0",
            "--rows 10_000_001",
            "--seconds 0",
            "--seconds 3601",
            "--rate 0",
            "--subscribers 10001",
            "--batch 0",
            "--batch 10001",
            "--writers 65",
            "--window 1001",
            "--subscriber-threads 0",
            "--fields recency,unknown",
            "--lists mine",
        ] {
            assert!(parse(line).is_err(), "{line} was accepted");
        }
    }

    #[test]
    fn every_writer_needs_a_transaction_of_its_own_rows() {
        assert!(parse("--rows 399 --writers 4 --batch 100").is_err());
        assert!(parse("--rows 400 --writers 4 --batch 100").is_ok());
    }
}
