//! Reporting: the human table and the `--json` lines of
//! `SCENARIOS.md`.
//!
//! JSON: one object per measured system and (scenario, n, dist):
//! `{"scenario": "new-message", "n": 100000, "dist": "uniform", "system":
//! "ordo", "ns_median": 412, "ns_p99": 900, "allocs_per_op": 0,
//! "diffs_per_op": 2.0}` (`diffs_per_op` is `null` for the naive peers, which
//! produce no diffs; `many-lists` lines add `rss_bytes_per_collection` and
//! `heap_bytes_per_collection`), then for each measured peer, when Ordo is
//! measured too, `{"scenario": …, "n": …, "dist": …, "system": "ratio", "vs":
//! "eyeball", "ratio": 31.5}` with `ratio = peer ns_median / ordo ns_median`.
//! Systems that were not measured get no line.
//!
//! `dist` is the scenario's variant: the update distribution (`uniform`,
//! `zipf`), the `create` view (`window`, `full`), the `load-more` step
//! (`20->40`), the `filter-switch` switch (`not-left->unread`).

use std::fmt::Write as _;

use crate::harness::Measurement;

/// The system every ratio is relative to.
pub const ORDO: &str = "ordo";

/// What one system gave for one (scenario, n, dist).
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Measured.
    Measured(Measurement),
    /// Not measured, with the reason shown in the table.
    NotMeasured(String),
}

/// One system's row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `ordo`, `eyeball`, `naive`, `naive-full`.
    pub system: &'static str,
    /// Its outcome.
    pub outcome: Outcome,
}

/// All systems for one (scenario, n, dist).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Scenario name.
    pub scenario: &'static str,
    /// Collection size (number of collections for `many-lists`).
    pub n: usize,
    /// Variant label.
    pub dist: String,
    /// One row per system.
    pub rows: Vec<Row>,
}

impl Group {
    fn measured(&self, system: &str) -> Option<&Measurement> {
        self.rows.iter().find_map(|r| match &r.outcome {
            Outcome::Measured(m) if r.system == system => Some(m),
            _ => None,
        })
    }

    /// `peer median / ordo median`, when both are measured.
    pub fn ratio_vs_ordo(&self, peer: &str) -> Option<f64> {
        let o = self.measured(ORDO)?;
        let p = self.measured(peer)?;
        (o.ns_median > 0).then(|| p.ns_median as f64 / o.ns_median as f64)
    }
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A number with up to 3 decimals, trailing zeros trimmed (`0`, `37.5`).
pub fn fmt_num(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_owned()
    } else {
        s.to_owned()
    }
}

/// Like [`fmt_num`] but always with a decimal point (`2.0`, `1.25`).
pub fn fmt_float(x: f64) -> String {
    let s = fmt_num(x);
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// The JSON lines of a group.
pub fn json_lines(g: &Group) -> Vec<String> {
    let head = format!("{{\"scenario\": {}, \"n\": {}, \"dist\": {}", json_str(g.scenario), g.n, json_str(&g.dist));
    let mut lines = Vec::new();
    for r in &g.rows {
        let Outcome::Measured(m) = &r.outcome else {
            continue;
        };
        let mut l = format!(
            "{head}, \"system\": {}, \"ns_median\": {}, \"ns_p99\": {}, \"allocs_per_op\": {}, \"diffs_per_op\": {}",
            json_str(r.system),
            m.ns_median,
            m.ns_p99,
            fmt_num(m.allocs_per_op),
            m.diffs_per_op.map_or_else(|| "null".to_owned(), fmt_float),
        );
        for (k, v) in &m.extra {
            let _ = write!(l, ", {}: {}", json_str(k), fmt_num(v.round()));
        }
        l.push('}');
        lines.push(l);
    }
    for r in &g.rows {
        if r.system == ORDO {
            continue;
        }
        if let Some(ratio) = g.ratio_vs_ordo(r.system) {
            lines.push(format!(
                "{head}, \"system\": \"ratio\", \"vs\": {}, \"ratio\": {}}}",
                json_str(r.system),
                fmt_float(ratio)
            ));
        }
    }
    lines
}

/// Nanoseconds for humans: `412 ns`, `12.3 µs`, `4.56 ms`, `2.01 s`.
pub fn fmt_ns(ns: u64) -> String {
    let x = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", x / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", x / 1e6)
    } else {
        format!("{:.2} s", x / 1e9)
    }
}

fn fmt_bytes(b: f64) -> String {
    if b < 10_000.0 {
        format!("{b:.0} B")
    } else if b < 10_000_000.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    }
}

/// The human table of one scenario (all its groups).
pub fn table(scenario: &str, groups: &[Group]) -> String {
    let mut rows: Vec<Vec<String>> =
        vec![["system", "n", "dist", "median", "p99", "allocs/op", "diffs/op", "ratio vs ordo", "ops"]
            .iter()
            .map(|s| s.to_string())
            .collect()];
    let mut notes = Vec::new();
    for g in groups {
        for r in &g.rows {
            let mut cells = vec![r.system.to_owned(), g.n.to_string(), g.dist.clone()];
            match &r.outcome {
                Outcome::Measured(m) => {
                    cells.push(fmt_ns(m.ns_median));
                    cells.push(fmt_ns(m.ns_p99));
                    cells.push(fmt_num(m.allocs_per_op));
                    cells.push(m.diffs_per_op.map_or_else(|| "-".to_owned(), fmt_float));
                    cells.push(match (r.system, g.ratio_vs_ordo(r.system)) {
                        (ORDO, _) | (_, None) => "-".to_owned(),
                        (_, Some(x)) => format!("{x:.2}x"),
                    });
                    cells.push(m.ops.to_string());
                    let mem: Vec<String> = m
                        .extra
                        .iter()
                        .map(|(k, v)| format!("{k} {}", if k.contains("bytes") { fmt_bytes(*v) } else { fmt_num(*v) }))
                        .collect();
                    if !mem.is_empty() {
                        cells.push(mem.join(", "));
                    }
                }
                Outcome::NotMeasured(why) => {
                    if why.len() > 20 {
                        let k = notes.iter().position(|n| n == why).unwrap_or_else(|| {
                            notes.push(why.clone());
                            notes.len() - 1
                        });
                        cells.push(format!("n/a [{}]", k + 1));
                    } else {
                        cells.push(why.clone());
                    }
                }
            }
            rows.push(cells);
        }
    }
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().filter(|r| r.len() > c + 1).map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = format!("== {scenario} ==\n");
    for r in &rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                let pad = widths[c].saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    for (k, n) in notes.iter().enumerate() {
        let _ = writeln!(out, "  [{}] {n}", k + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(ns: u64, diffs: Option<f64>) -> Measurement {
        Measurement {
            ops: 10,
            ns_median: ns,
            ns_p99: ns * 2,
            allocs_per_op: 0.0,
            diffs_per_op: diffs,
            extra: Vec::new(),
        }
    }

    #[test]
    fn json_format() {
        let g = Group {
            scenario: "new-message",
            n: 100_000,
            dist: "uniform".into(),
            rows: vec![
                Row { system: "ordo", outcome: Outcome::Measured(m(412, Some(2.0))) },
                Row { system: "eyeball", outcome: Outcome::Measured(m(824, Some(2.5))) },
                Row { system: "naive", outcome: Outcome::Measured(m(1000, None)) },
                Row { system: "naive-full", outcome: Outcome::NotMeasured("x".into()) },
            ],
        };
        let l = json_lines(&g);
        assert_eq!(
            l[0],
            r#"{"scenario": "new-message", "n": 100000, "dist": "uniform", "system": "ordo", "ns_median": 412, "ns_p99": 824, "allocs_per_op": 0, "diffs_per_op": 2.0}"#
        );
        assert!(l[2].ends_with(r#""diffs_per_op": null}"#));
        assert_eq!(
            l[3],
            r#"{"scenario": "new-message", "n": 100000, "dist": "uniform", "system": "ratio", "vs": "eyeball", "ratio": 2.0}"#
        );
        assert_eq!(l.len(), 5);
        assert!(table("new-message", &[g]).contains("2.00x"));
    }

    #[test]
    fn numbers() {
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(37.5), "37.5");
        assert_eq!(fmt_float(2.0), "2.0");
        assert_eq!(fmt_float(1.0 / 3.0), "0.333");
        assert_eq!(fmt_ns(412), "412 ns");
        assert_eq!(fmt_ns(12_345), "12.3 µs");
    }
}
