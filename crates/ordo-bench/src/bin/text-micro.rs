//! `text-micro`: what a locale-aware sort costs per update, next to the byte and
//! case-insensitive sorts measured in the same run, on one collection of N
//! people whose names look like names ("Émile Zola", "Åsa Öberg"; 5 % of the
//! accented ones decomposed, as some clients send them).
//!
//! For each sort, one view and one window (top 20) are opened, then:
//! - *build*: the view opened from scratch (every item's prefix encoded, sorted);
//! - *rename*: one batch renaming a random person (the item moves in the index:
//!   its prefix is encoded again, and ties are compared in full), diffs drained;
//! - *bump*: the room-list shape (`recency` desc, then `name`): one batch setting a
//!   random item's `recency` to a new maximum, so the name key is re-encoded but
//!   the item's place is decided by `recency`.
//!
//! Operations are timed one by one (see `ordo_bench::harness`); allocations are
//! counted around each.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ordo_bench::cli::count;
use ordo_bench::data::Rng;
use ordo_bench::harness::{time_ops, OpPlan};
use ordo_core::{Batch, CollectionId, Engine, FieldType, Filter, NullSink, Schema, SortKey, Value, ViewDef};

/// Sorting on text (byte order, case-insensitive, locale collation): building a
/// view and updating the sort key, median and p99 per operation.
#[derive(Parser)]
#[command(name = "text-micro")]
struct Args {
    /// N = 10 000 (unless --n says otherwise) and short time budgets (a few seconds in all)
    #[arg(long)]
    quick: bool,
    /// People in the collection [default: 100 000]
    #[arg(long, value_parser = count)]
    n: Option<usize>,
}

const FIRST_NAMES: [&str; 24] = [
    "Émile", "Eva", "Åsa", "Zoë", "Jürgen", "Anaïs", "Björn", "Chloé", "Denis", "Élodie", "Fanny", "Gaëlle", "Hélène",
    "Ida", "Jérôme", "Karl", "Léa", "Mårten", "Noé", "Olof", "Pär", "Renée", "Søren", "Ulrich",
];
const LAST_NAMES: [&str; 24] = [
    "Zola",
    "Öberg",
    "Müller",
    "Mueller",
    "Durand",
    "Lefèvre",
    "Åkesson",
    "Ødegaard",
    "Martin",
    "Bernard",
    "Çelik",
    "Schröder",
    "Lindström",
    "Ångström",
    "Petit",
    "Roux",
    "Ström",
    "Weiß",
    "Weiss",
    "Nilsson",
    "Dubois",
    "Garçon",
    "Jönsson",
    "Zimmermann",
];

fn random_name(rng: &mut Rng) -> String {
    let first = FIRST_NAMES[rng.below(FIRST_NAMES.len() as u64) as usize];
    let last = LAST_NAMES[rng.below(LAST_NAMES.len() as u64) as usize];
    let name = format!("{first} {last} {}", rng.below(1000));
    if rng.chance(0.05) {
        decompose_some(&name)
    } else {
        name
    }
}

/// The common precomposed letters of the pools, decomposed (base + combining mark).
fn decompose_some(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    for character in name.chars() {
        match character {
            'É' => out.push_str("E\u{301}"),
            'é' => out.push_str("e\u{301}"),
            'è' => out.push_str("e\u{300}"),
            'ë' => out.push_str("e\u{308}"),
            'ö' => out.push_str("o\u{308}"),
            'Ö' => out.push_str("O\u{308}"),
            'å' => out.push_str("a\u{30A}"),
            'Å' => out.push_str("A\u{30A}"),
            'ü' => out.push_str("u\u{308}"),
            'ä' => out.push_str("a\u{308}"),
            other => out.push(other),
        }
    }
    out
}

fn schema() -> Schema {
    Schema::new().with_field("name", FieldType::String).with_field("recency", FieldType::U64)
}

struct Case {
    label: &'static str,
    key: fn() -> SortKey,
}

const CASES: [Case; 5] = [
    Case { label: "bytes", key: || SortKey::asc("name") },
    Case { label: "case-insensitive", key: || SortKey::asc("name").case_insensitive() },
    Case { label: "collation root", key: || SortKey::asc("name").collated("root") },
    Case { label: "collation sv", key: || SortKey::asc("name").collated("sv") },
    Case { label: "collation fr, case-insensitive", key: || SortKey::asc("name").collated("fr").case_insensitive() },
];

fn load(n: usize, names: &[String]) -> (Engine, CollectionId) {
    let mut engine = Engine::new();
    let people = engine.create_collection("people", schema()).expect("a fresh engine");
    let mut batch = Batch::new();
    for (index, name) in names.iter().enumerate().take(n) {
        batch
            .upsert(&format!("person-{index:08}"))
            .set("name", Value::Str(name))
            .set("recency", Value::U64(index as u64));
    }
    engine.apply_batch(people, &batch, &mut NullSink).expect("valid items");
    (engine, people)
}

fn format_ns(ns: u64) -> String {
    if ns >= 1_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else {
        format!("{:.2} µs", ns as f64 / 1e3)
    }
}

fn main() -> ExitCode {
    let Args { quick, n } = Args::parse();
    let n = n.unwrap_or(if quick { 10_000 } else { 100_000 });
    let budget = Duration::from_secs(if quick { 1 } else { 4 });
    let update_plan = OpPlan { warmup: 5_000, min_ops: 2_000, max_ops: 50_000, budget };
    let build_plan = OpPlan { warmup: 1, min_ops: 3, max_ops: if quick { 5 } else { 15 }, budget };
    let mut rng = Rng::new(1);
    let names: Vec<String> = (0..n).map(|_| random_name(&mut rng)).collect();
    let renames: Vec<String> = (0..update_plan.inputs()).map(|_| random_name(&mut rng)).collect();
    let targets: Vec<usize> = (0..update_plan.inputs()).map(|_| rng.below(n as u64) as usize).collect();
    let ids: Vec<String> = (0..n).map(|index| format!("person-{index:08}")).collect();

    println!("text-micro, N = {n} people; median (p99) per operation, allocations per operation");
    println!("| sort on `name` | build view + window | rename (name first) | bump (recency, then name) |");
    println!("|---|---|---|---|");
    for case in &CASES {
        let (mut engine, people) = load(n, &names);
        let by_name = ViewDef::new(Filter::True, vec![(case.key)()]);
        let room_list = ViewDef::new(Filter::True, vec![SortKey::desc("recency"), (case.key)()]);
        let build = time_ops(&build_plan, |_| {
            let window = engine.open_window(people, &by_name, 0, 20, &mut NullSink).expect("a valid view");
            engine.close_window(window).expect("the window just opened");
            (0, ())
        })
        .measurement(false);

        let window = engine.open_window(people, &by_name, 0, 20, &mut NullSink).expect("a valid view");
        let mut batch = Batch::new();
        let rename = time_ops(&update_plan, |op| {
            batch.clear();
            batch.upsert(&ids[targets[op]]).set("name", Value::Str(&renames[op]));
            engine.apply_batch(people, &batch, &mut NullSink).expect("a valid rename");
            (0, ())
        })
        .measurement(false);
        engine.close_window(window).expect("the window just opened");

        let window = engine.open_window(people, &room_list, 0, 20, &mut NullSink).expect("a valid view");
        let mut recency = n as u64;
        let bump = time_ops(&update_plan, |op| {
            recency += 1;
            batch.clear();
            batch.upsert(&ids[targets[op]]).set("recency", Value::U64(recency));
            engine.apply_batch(people, &batch, &mut NullSink).expect("a valid update");
            (0, ())
        })
        .measurement(false);
        engine.close_window(window).expect("the window just opened");

        let cell = |m: &ordo_bench::harness::Measurement| {
            format!("{} ({}), {:.2} allocs", format_ns(m.ns_median), format_ns(m.ns_p99), m.allocs_per_op)
        };
        println!("| {} | {} | {} | {} |", case.label, cell(&build), cell(&rename), cell(&bump));
    }
    ExitCode::SUCCESS
}
