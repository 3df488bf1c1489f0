//! `ordo-bench`: runs the engine scenarios of `SCENARIOS.md` and prints a
//! table per scenario, or JSON lines with `--json`. See `--help`.

use std::io::Write;
use std::process::ExitCode;

use clap::builder::PossibleValuesParser;
use clap::Parser;
use ordo_bench::cli::in_range;
use ordo_bench::harness::timer_overhead_ns;
use ordo_bench::report::{json_lines, table, Group};
use ordo_bench::scenarios::{Config, Runner, SCENARIOS, SYSTEMS};

/// Ordo's engine benchmark: every scenario of SCENARIOS.md, with the peers measured
/// in the same run on the same seeded data.
///
/// Each operation is timed individually (Instant::now() before and after; the
/// clock's own cost is included); median and p99 are per operation.
#[derive(Parser)]
#[command(name = "ordo-bench")]
struct Args {
    /// Small N (1000, 10000), 1000 many-lists collections, small time budgets: the
    /// whole run takes well under a minute
    #[arg(long)]
    quick: bool,
    /// One JSON object per line on stdout (progress goes to stderr)
    #[arg(long)]
    json: bool,
    /// Scenarios to run, comma-separated or repeated (default: all)
    #[arg(long, value_name = "NAME", value_delimiter = ',', value_parser = PossibleValuesParser::new(SCENARIOS))]
    scenario: Vec<String>,
    /// Restrict N (default 1000,10000,100000,1000000; many-lists is sized in
    /// collections and ignores it); at least 50
    #[arg(long, value_name = "N", value_delimiter = ',', value_parser = in_range(50, usize::MAX))]
    n: Vec<usize>,
    /// Systems to run (default: all); in shared-predicate, ordo runs against
    /// ordo-unkeyed (the same engine with view keying off) instead of the peers; in
    /// shared-rooms, ordo (reference fields) runs with ordo-fan-out (one collection
    /// per user, every copy updated) and eyeball
    #[arg(long, value_name = "NAME", value_delimiter = ',', value_parser = PossibleValuesParser::new(SYSTEMS))]
    system: Vec<String>,
    /// Seed of the data set and update streams
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// The names in `known` that `chosen` holds, in `known`'s order, once each.
fn in_canonical_order(known: &[&'static str], chosen: &[String]) -> Vec<&'static str> {
    known.iter().copied().filter(|name| chosen.iter().any(|chosen| chosen == name)).collect()
}

fn parse(args: impl IntoIterator<Item = String>) -> Result<(Config, bool), clap::Error> {
    let args = Args::try_parse_from(std::iter::once("ordo-bench".to_owned()).chain(args))?;
    let mut cfg = Config { quick: args.quick, seed: args.seed, ..Config::default() };
    if !args.scenario.is_empty() {
        cfg.scenarios = in_canonical_order(&SCENARIOS, &args.scenario);
    }
    if !args.system.is_empty() {
        cfg.systems = in_canonical_order(&SYSTEMS, &args.system);
    }
    if !args.n.is_empty() {
        let mut sizes = args.n;
        sizes.sort_unstable();
        sizes.dedup();
        cfg.sizes = Some(sizes);
    }
    Ok((cfg, args.json))
}

fn main() -> ExitCode {
    let (cfg, json) = parse(std::env::args().skip(1)).unwrap_or_else(|error| error.exit());
    let start = std::time::Instant::now();
    let header = format!(
        "ordo-bench: seed {}, {} mode, N {:?}, systems {}; each op timed individually \
         (clock overhead ≈ {} ns, included)",
        cfg.seed,
        if cfg.quick { "quick" } else { "full" },
        cfg.sizes(),
        cfg.systems.join(","),
        timer_overhead_ns()
    );
    if json {
        eprintln!("{header}");
    } else {
        println!("{header}\n");
    }
    let scenarios = cfg.scenarios.clone();
    let mut runner = Runner::new(cfg);
    let stdout = std::io::stdout();
    for scenario in scenarios {
        let mut groups: Vec<Group> = Vec::new();
        runner.run_scenario(scenario, &mut |g| {
            if json {
                let mut out = stdout.lock();
                for l in json_lines(&g) {
                    let _ = writeln!(out, "{l}");
                }
                let _ = out.flush();
            } else {
                groups.push(g);
            }
        });
        if !json {
            println!("{}", table(scenario, &groups));
        }
    }
    eprintln!("ordo-bench: done in {:.1} s", start.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_flags() {
        let (cfg, json) =
            parse(args("--quick --json --scenario create,fan-out --scenario create --n 1000 --n 10_000,1000 --seed 9"))
                .unwrap();
        assert!(cfg.quick && json);
        assert_eq!(cfg.scenarios, vec!["create", "fan-out"]);
        assert_eq!(cfg.sizes, Some(vec![1000, 10_000]));
        assert_eq!(cfg.seed, 9);
        assert!(parse(args("--scenario nope")).is_err());
        assert!(parse(args("--bogus")).is_err());
        assert_eq!(parse(args("--help")).err().map(|error| error.kind()), Some(clap::error::ErrorKind::DisplayHelp));
    }
}
