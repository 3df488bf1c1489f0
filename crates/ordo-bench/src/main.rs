//! `ordo-bench`: runs the engine scenarios of `SCENARIOS.md` and prints a
//! table per scenario, or JSON lines with `--json`. See `--help`.

use std::io::Write;
use std::process::ExitCode;

use ordo_bench::harness::timer_overhead_ns;
use ordo_bench::report::{json_lines, table, Group};
use ordo_bench::scenarios::{Config, Runner, SCENARIOS, SYSTEMS};

const USAGE: &str = "\
usage: ordo-bench [--quick] [--json] [--scenario NAME[,NAME…]]… [--n N[,N…]]…
                  [--system NAME[,NAME…]]… [--seed S]

  --quick       small N (1000, 10000), 1000 many-lists collections, small
                time budgets: the whole run takes well under a minute
  --json        one JSON object per line on stdout (progress goes to stderr)
  --scenario    create, new-message, load-more, filter-switch, fan-out,
                many-lists, shared-predicate, shared-rooms (default: all)
  --n           restrict N (default 1000,10000,100000,1000000; many-lists is
                sized in collections and ignores it)
  --system      ordo, eyeball, naive, naive-full (default: all); in
                shared-predicate, ordo runs against ordo-unkeyed (the same
                engine with view keying off) instead of the peers; in
                shared-rooms, ordo (reference fields) runs with ordo-fan-out
                (one collection per user, every copy updated) and eyeball
  --seed        seed of the data set and update streams (default 1)

Each operation is timed individually (Instant::now() before and after; the
clock's own cost is included); median and p99 are per operation.";

fn list_arg<'a>(
    args: &mut impl Iterator<Item = String>,
    flag: &str,
    known: &[&'a str],
) -> Result<Vec<&'a str>, String> {
    let v = args.next().ok_or(format!("{flag} needs a value"))?;
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            known
                .iter()
                .find(|k| **k == s)
                .copied()
                .ok_or(format!("unknown {flag} value '{s}' (known: {})", known.join(", ")))
        })
        .collect()
}

fn parse(args: impl IntoIterator<Item = String>) -> Result<(Config, bool), String> {
    let mut cfg = Config::default();
    let mut json = false;
    let mut scenarios: Vec<&'static str> = Vec::new();
    let mut systems: Vec<&'static str> = Vec::new();
    let mut sizes: Vec<usize> = Vec::new();
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => cfg.quick = true,
            "--json" => json = true,
            "--scenario" => scenarios.extend(list_arg(&mut args, "--scenario", &SCENARIOS)?),
            "--system" => systems.extend(list_arg(&mut args, "--system", &SYSTEMS)?),
            "--n" => {
                let v = args.next().ok_or("--n needs a value")?;
                for s in v.split(',').filter(|s| !s.is_empty()) {
                    let n: usize = s.replace('_', "").parse().map_err(|_| format!("bad --n value '{s}'"))?;
                    if n < 50 {
                        return Err(format!("--n {n}: N must be at least 50"));
                    }
                    sizes.push(n);
                }
            }
            "--seed" => {
                let v = args.next().ok_or("--seed needs a value")?;
                cfg.seed = v.parse().map_err(|_| format!("bad --seed value '{v}'"))?;
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    if !scenarios.is_empty() {
        // Keep the canonical order, drop duplicates.
        cfg.scenarios = SCENARIOS.iter().copied().filter(|s| scenarios.contains(s)).collect();
    }
    if !systems.is_empty() {
        cfg.systems = SYSTEMS.iter().copied().filter(|s| systems.contains(s)).collect();
    }
    if !sizes.is_empty() {
        sizes.sort_unstable();
        sizes.dedup();
        cfg.sizes = Some(sizes);
    }
    Ok((cfg, json))
}

fn main() -> ExitCode {
    let (cfg, json) = match parse(std::env::args().skip(1)) {
        Ok(x) => x,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("ordo-bench: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
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
        assert_eq!(parse(args("--help")).unwrap_err(), "");
    }
}
