//! `server-micro`: micro-benchmarks of three `ordo-server` building blocks,
//! each against the obvious alternative measured in the same run:
//!
//! a. `SubTable` (sorted keys in a ring buffer, scan or binary search) against
//!    `HashMap<u32, _>` for a connection's subscription lookups and churn;
//! b. `NameRoutes` (ASCII case folding on the fly) against `to_lowercase`
//!    then `HashMap<String, _>`;
//! c. `write_diffs_frame` into a reused `Vec` against a fresh `Vec` per frame
//!    and against a frame built with `format!` and `serde_json`;
//!
//! d., the sweep behind `SubTable`'s scan/binary-search threshold:
//! binary search against two linear scans, on keys laid out as `SubTable`
//! lays them out;
//!
//! and e., `auth::Verifier::verify` per token (what a connection's `auth`
//! message or an HTTP request's bearer token costs) for HS256 and for EdDSA,
//! RS256 and ES256 keys from a JWKS file, next to their goals (`SCENARIOS.md`).
//! Tokens are timed one by one (each takes microseconds).
//!
//! Each sample times a batch of operations (one clock read per batch, not per
//! operation: these operations take nanoseconds), so ns/op is the batch time
//! divided by its length. Tables show the median over the runs; `ratio` is
//! the alternative's median over ours (above 1: ours is faster).

use std::collections::{HashMap, VecDeque};
use std::hint::black_box;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ordo_bench::cli::count;
use ordo_bench::data::Rng;
use ordo_bench::harness::{time_ops, OpPlan};
use ordo_server::auth::{self, AuthOptions, Role, Verifier};
use ordo_server::frame::{write_diffs_frame, DiffsHeader};
use ordo_server::name_routes::NameRoutes;
use ordo_server::sub_table::{SubTable, LINEAR_SCAN_MAX_LEN};

/// Micro-benchmarks of the server's building blocks, each against the obvious
/// alternative measured in the same run.
#[derive(Parser)]
#[command(name = "server-micro")]
struct Args {
    /// A short run (well under a second) for CI: 3 runs, small batches; figures are
    /// rougher (short batches let the branch predictor learn them)
    #[arg(long)]
    quick: bool,
    /// Timed runs per case; medians are reported [default: 7]
    #[arg(long, value_name = "R", value_parser = count)]
    runs: Option<usize>,
    /// Only one benchmark: `tokens` (e., the token verification benchmark)
    #[arg(long, value_parser = ["tokens"])]
    only: Option<String>,
}

const SEED: u64 = 0x5eed_0bd0;

struct Config {
    runs: usize,
    /// Operations per timed sample, for operations of a few nanoseconds.
    batch_len: usize,
    /// Tokens verified (each timed on its own) per algorithm...
    tokens: usize,
    /// ...cycling through this many distinct ones (RSA signing takes
    /// milliseconds, more in a debug build).
    distinct_tokens: usize,
    only_tokens: bool,
}

fn parse() -> Config {
    let Args { quick, runs, only } = Args::parse();
    let only_tokens = only.is_some();
    if quick {
        Config { runs: runs.unwrap_or(3), batch_len: 4 * 1024, tokens: 64, distinct_tokens: 8, only_tokens }
    } else {
        Config { runs: runs.unwrap_or(7), batch_len: 256 * 1024, tokens: 2_000, distinct_tokens: 64, only_tokens }
    }
}

/// Median ns and mean allocations per operation of `op`, which runs
/// `ops_per_call` operations per call; call `i` gets index `i` (2 warm-up
/// calls, then `runs` timed ones).
fn measure(config: &Config, ops_per_call: usize, mut op: impl FnMut(usize)) -> (f64, f64) {
    let plan = OpPlan { warmup: 2, min_ops: config.runs, max_ops: config.runs, budget: Duration::from_secs(600) };
    let samples = time_ops(&plan, |i| {
        op(i);
        (0, ())
    });
    let m = samples.measurement(false);
    (m.ns_median as f64 / ops_per_call as f64, m.allocs_per_op / ops_per_call as f64)
}

/// Calls `measure` will make: size inputs to this.
fn calls(config: &Config) -> usize {
    config.runs + 2
}

fn print_row(case: &str, ours: (f64, f64), alternatives: &[(f64, f64)]) {
    let mut line = format!("{case:<32} {:>9.1} {:>7.2}", ours.0, ours.1);
    for alternative in alternatives {
        line += &format!(" | {:>9.1} {:>7.2} {:>6.2}x", alternative.0, alternative.1, alternative.0 / ours.0);
    }
    println!("{line}");
}

fn print_header(title: &str, ours: &str, alternatives: &[&str]) {
    println!();
    println!("{title}");
    let mut line = format!("{:<32} {:>17}", "case", ours);
    let mut units = format!("{:<32} {:>9} {:>7}", "", "ns/op", "alloc");
    for alternative in alternatives {
        line += &format!(" | {alternative:>25}");
        units += &format!(" | {:>9} {:>7} {:>7}", "ns/op", "alloc", "ratio");
    }
    println!("{line}");
    println!("{units}");
}

// ---------------------------------------------------------------------------
// a. SubTable against HashMap<u32, _>

/// What a connection keeps per subscription: about the size of the real one.
#[derive(Debug, Clone, Copy, Default)]
#[allow(dead_code)] // Only carried, and read through `seq`.
struct Subscription {
    window_id: u64,
    seq: u64,
    bytes_queued: u64,
    frames_queued: u32,
    offset: u32,
    limit: u32,
    flags: u32,
    view_id: u32,
}

const _: () = assert!(std::mem::size_of::<Subscription>() == 48);

/// The two tables under test, behind one interface for the benchmark.
trait Table {
    fn insert(&mut self, key: u32, value: Subscription);
    fn get(&self, key: u32) -> Option<&Subscription>;
    fn remove(&mut self, key: u32) -> Option<Subscription>;
}

impl Table for SubTable<Subscription> {
    #[inline]
    fn insert(&mut self, key: u32, value: Subscription) {
        SubTable::insert(self, key, value).expect("increasing keys");
    }
    #[inline]
    fn get(&self, key: u32) -> Option<&Subscription> {
        SubTable::get(self, key)
    }
    #[inline]
    fn remove(&mut self, key: u32) -> Option<Subscription> {
        SubTable::remove(self, key)
    }
}

impl Table for HashMap<u32, Subscription> {
    #[inline]
    fn insert(&mut self, key: u32, value: Subscription) {
        HashMap::insert(self, key, value);
    }
    #[inline]
    fn get(&self, key: u32) -> Option<&Subscription> {
        HashMap::get(self, &key)
    }
    #[inline]
    fn remove(&mut self, key: u32) -> Option<Subscription> {
        HashMap::remove(self, &key)
    }
}

/// `n` handles as a server hands them out to one connection: increasing, with
/// gaps where earlier subscriptions closed.
fn handles(rng: &mut Rng, n: usize, first: u32) -> Vec<u32> {
    let mut next = first;
    (0..n)
        .map(|_| {
            next += 1 + rng.below(3) as u32;
            next
        })
        .collect()
}

/// A churn step: close `remove`, open `insert`.
#[derive(Clone, Copy)]
struct ChurnStep {
    remove: u32,
    insert: u32,
}

/// `steps` churn steps from the live handles `live`, closing the oldest or a
/// random subscription; the table keeps its size.
fn churn_steps(rng: &mut Rng, live: &[u32], steps: usize, oldest_first: bool) -> Vec<ChurnStep> {
    let mut live: VecDeque<u32> = live.iter().copied().collect();
    let mut next = *live.back().unwrap();
    (0..steps)
        .map(|_| {
            let remove = if oldest_first {
                live.pop_front().unwrap()
            } else {
                live.remove(rng.below(live.len() as u64) as usize).unwrap()
            };
            next += 1 + rng.below(3) as u32;
            live.push_back(next);
            ChurnStep { remove, insert: next }
        })
        .collect()
}

fn lookups<T: Table>(table: &T, queries: &[u32]) -> u64 {
    let mut total = 0u64;
    for &key in queries {
        total = total.wrapping_add(table.get(key).map_or(0, |s| s.seq));
    }
    total
}

fn churn<T: Table>(table: &mut T, steps: &[ChurnStep]) {
    for step in steps {
        let closed = table.remove(step.remove).expect("live handle");
        table.insert(step.insert, Subscription { seq: closed.seq + 1, ..closed });
    }
}

fn bench_sub_table(config: &Config) {
    print_header(
        &format!(
            "a. subscription table: SubTable (scan up to {LINEAR_SCAN_MAX_LEN} keys) vs HashMap<u32, 48-byte value>"
        ),
        "SubTable",
        &["HashMap<u32,_> (SipHash)"],
    );
    let mut rng = Rng::derived(SEED, "sub-table");
    for n in [1usize, 4, 16, 128, 1024] {
        let keys = handles(&mut rng, n, 0);
        let value =
            |key: u32| Subscription { seq: u64::from(key), window_id: u64::from(key) * 3, ..Default::default() };
        let mut sub_table = SubTable::with_capacity(n);
        let mut hash_map = HashMap::with_capacity(n);
        for &key in &keys {
            Table::insert(&mut sub_table, key, value(key));
            Table::insert(&mut hash_map, key, value(key));
        }
        let queries: Vec<u32> = (0..config.batch_len).map(|_| keys[rng.below(n as u64) as usize]).collect();
        let ours = measure(config, queries.len(), |_| {
            black_box(lookups(black_box(&sub_table), &queries));
        });
        let theirs = measure(config, queries.len(), |_| {
            black_box(lookups(black_box(&hash_map), &queries));
        });
        print_row(&format!("lookup, n={n}"), ours, &[theirs]);

        // Churn: remove moves entries in the SubTable, so its batches are
        // shorter at large n to keep the run short.
        let churn_batch = (config.batch_len / 4).max(64);
        for oldest_first in [true, false] {
            let steps = churn_steps(&mut rng, &keys, churn_batch * calls(config), oldest_first);
            let mut ours_table = sub_table.clone();
            let mut their_table = hash_map.clone();
            let ours = measure(config, churn_batch, |i| {
                churn(&mut ours_table, &steps[i * churn_batch..(i + 1) * churn_batch]);
            });
            let theirs = measure(config, churn_batch, |i| {
                churn(&mut their_table, &steps[i * churn_batch..(i + 1) * churn_batch]);
            });
            let which = if oldest_first { "oldest" } else { "random" };
            print_row(&format!("churn ({which} closes), n={n}"), ours, &[theirs]);
        }
    }
}

// ---------------------------------------------------------------------------
// b. NameRoutes against to_lowercase + HashMap<String, _>

/// `name` with each letter's case flipped at random.
fn random_case(rng: &mut Rng, name: &str) -> String {
    name.chars()
        .map(|c| if rng.chance(0.5) { c.to_uppercase().next().unwrap() } else { c.to_lowercase().next().unwrap() })
        .collect()
}

fn bench_name_routes(config: &Config) {
    print_header(
        "b. collection routing ignoring case, 1 000 collections (ns and allocations per lookup)",
        "NameRoutes",
        &["to_lowercase+HashMap", "reused buffer+HashMap"],
    );
    let mut rng = Rng::derived(SEED, "name-routes");
    for (case, pattern) in
        [("ASCII, User-000123-Rooms", "User-{}-Rooms"), ("non-ASCII, Müller-000123-Räume", "Müller-{}-Räume")]
    {
        let names: Vec<String> = (0..1_000).map(|i| pattern.replace("{}", &format!("{i:06}"))).collect();
        let mut routes = NameRoutes::new();
        let mut naive: HashMap<String, usize> = HashMap::new();
        for (i, name) in names.iter().enumerate() {
            routes.insert(name, i).expect("distinct names");
            naive.insert(name.to_lowercase(), i);
        }
        let queries: Vec<String> = (0..config.batch_len / 4)
            .map(|_| {
                let name = &names[rng.below(1_000) as usize];
                random_case(&mut rng, name)
            })
            .collect();
        let ours = measure(config, queries.len(), |_| {
            let mut total = 0usize;
            for query in &queries {
                total += routes.get(black_box(query)).copied().unwrap_or(0);
            }
            black_box(total);
        });
        let lowercase_each = measure(config, queries.len(), |_| {
            let mut total = 0usize;
            for query in &queries {
                total += naive.get(&black_box(query).to_lowercase()).copied().unwrap_or(0);
            }
            black_box(total);
        });
        // The allocation-free way with std alone: lowercase into one reused
        // buffer (ASCII rules only, so only right for ASCII names).
        let reused_buffer = if case.starts_with("ASCII") {
            let mut folded = String::new();
            Some(measure(config, queries.len(), |_| {
                let mut total = 0usize;
                for query in &queries {
                    folded.clear();
                    folded.push_str(black_box(query));
                    folded.make_ascii_lowercase();
                    total += naive.get(&folded).copied().unwrap_or(0);
                }
                black_box(total);
            }))
        } else {
            None
        };
        let mut alternatives = vec![lowercase_each];
        alternatives.extend(reused_buffer);
        print_row(case, ours, &alternatives);
    }
}

// ---------------------------------------------------------------------------
// c. Frame encoding

/// About 300 bytes of encoded diffs: a `Remove` and an `Insert` of one room.
const DIFFS_JSON: &str = concat!(
    r#"[{"Remove":{"index":4}},{"Insert":{"index":0,"value":{"id":"!PqHzBkWnMvRtLcXa:example.org","#,
    r#""fields":{"name":"Design review — Q3 roadmap","recency":1732262400123,"unread":3,"#,
    r#""mentions":1,"dm":false,"left":false,"low_priority":false,"favourite":true},"#,
    r#""payload":{"avatar":"mxc://example.org/OeRvPqZt","topic":"Weekly sync"}}}}]"#
);

/// A frame's `write_seq` in the benchmark: a typical store's size of number.
const WRITE_SEQ: u64 = 1_234_567;

fn header(sub: &str, seq: u64) -> DiffsHeader<'_> {
    DiffsHeader { sub, seq, write_seq: WRITE_SEQ, ..DiffsHeader::default() }
}

fn bench_frames(config: &Config) {
    print_header(
        &format!("c. diffs frame encoding, {}-byte diffs body (ns and allocations per frame)", DIFFS_JSON.len()),
        "reused Vec",
        &["fresh Vec per frame", "format!+serde_json"],
    );
    let frames = config.batch_len / 4;
    let sub = "rooms";
    let mut reused = Vec::new();
    let ours = measure(config, frames, |i| {
        for seq in 0..frames as u64 {
            reused.clear();
            write_diffs_frame(&mut reused, &header(black_box(sub), (i * frames) as u64 + seq), DIFFS_JSON.as_bytes());
            black_box(&reused);
        }
    });
    let fresh = measure(config, frames, |i| {
        for seq in 0..frames as u64 {
            let mut out = Vec::new();
            write_diffs_frame(&mut out, &header(black_box(sub), (i * frames) as u64 + seq), DIFFS_JSON.as_bytes());
            black_box(&out);
        }
    });
    let formatted = measure(config, frames, |i| {
        for seq in 0..frames as u64 {
            let sub_json = serde_json::to_string(black_box(sub)).expect("a string serialises");
            let frame = format!(
                r#"{{"type":"diffs","sub":{sub_json},"seq":{},"write_seq":{},"diffs":{DIFFS_JSON}}}"#,
                (i * frames) as u64 + seq,
                WRITE_SEQ
            );
            black_box(&frame);
        }
    });
    // The three write the same bytes.
    let mut check = Vec::new();
    write_diffs_frame(&mut check, &header(sub, 42), DIFFS_JSON.as_bytes());
    let expected = format!(r#"{{"type":"diffs","sub":"rooms","seq":42,"write_seq":{WRITE_SEQ},"diffs":{DIFFS_JSON}}}"#);
    assert_eq!(check, expected.as_bytes());
    print_row(&format!("frame, {} bytes", check.len()), ours, &[fresh, formatted]);
}

// ---------------------------------------------------------------------------
// d. Linear scan or binary search

/// The position of `key` in sorted `keys`, by counting the keys below it: no
/// branch per key, so the compiler vectorises it. The fastest scan we found,
/// and a copy of `SubTable`'s.
#[inline]
fn index_by_counting(keys: &VecDeque<u32>, key: u32) -> Option<usize> {
    let (front, back) = keys.as_slices();
    let count_below = |slice: &[u32]| slice.iter().fold(0u32, |count, &k| count + u32::from(k < key));
    let index = (count_below(front) + count_below(back)) as usize;
    (keys.get(index) == Some(&key)).then_some(index)
}

/// The position of `key`, by a scan that stops at the first match, as
/// SwiftNIO's `StreamMap` scans.
#[inline]
fn index_by_first_match(keys: &VecDeque<u32>, key: u32) -> Option<usize> {
    keys.iter().position(|&k| k == key)
}

/// Times `search` over `queries`; generic so that each search is inlined
/// into its own loop, as it is into `SubTable::get`.
fn time_search(
    config: &Config,
    keys: &VecDeque<u32>,
    queries: &[u32],
    search: impl Fn(&VecDeque<u32>, u32) -> Option<usize>,
) -> (f64, f64) {
    measure(config, queries.len(), |_| {
        let keys = black_box(keys);
        let mut total = 0usize;
        for &key in queries {
            total += search(keys, key).map_or(1, |index| index + 2);
        }
        black_box(total);
    })
}

fn bench_search(config: &Config) {
    print_header(
        &format!(
            "d. searching n sorted u32 keys wrapped around a VecDeque, random present keys \
             (SubTable scans up to {LINEAR_SCAN_MAX_LEN})"
        ),
        "binary search",
        &["scan, counting", "scan, first match"],
    );
    let mut rng = Rng::derived(SEED, "search");
    for n in [1usize, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256] {
        // Open n subscriptions, then close the oldest and open one more until
        // the live keys straddle the end of the ring buffer, as in a
        // long-lived connection.
        let mut keys: VecDeque<u32> = handles(&mut rng, n, 0).into();
        let mut next_key = *keys.back().expect("n > 0");
        while n > 1 && keys.as_slices().1.is_empty() {
            keys.pop_front();
            next_key += 1 + rng.below(3) as u32;
            keys.push_back(next_key);
        }
        let queries: Vec<u32> = (0..config.batch_len).map(|_| keys[rng.below(n as u64) as usize]).collect();
        let binary = time_search(config, &keys, &queries, |keys, key| keys.binary_search(&key).ok());
        let counting = time_search(config, &keys, &queries, index_by_counting);
        let first_match = time_search(config, &keys, &queries, index_by_first_match);
        print_row(&format!("n={n}"), binary, &[counting, first_match]);
    }
}

// ---------------------------------------------------------------------------
// e. Token verification

/// The test keys of ordo-server's `tests/auth.rs` (made with `openssl genpkey`;
/// they protect nothing): private halves to sign, the JWKS the server reads.
const ED25519_PEM: &str = include_str!("../../../ordo-server/tests/keys/ed25519.pem");
const RSA_PEM: &str = include_str!("../../../ordo-server/tests/keys/rsa.pem");
const P256_PEM: &str = include_str!("../../../ordo-server/tests/keys/p256.pem");
const JWKS_JSON: &str = include_str!("../../../ordo-server/tests/keys/jwks.json");

/// What one case of e. verifies with, and its goal (`SCENARIOS.md`).
struct TokenCase {
    name: &'static str,
    verifier: &'static str,
    goal_us: Option<f64>,
    tokens: Vec<String>,
}

/// The claims `ordo token` writes (`auth::mint`): sub, role, iat, exp.
fn claims(sub: &str, role: Role, ttl_secs: u64) -> serde_json::Map<String, serde_json::Value> {
    let now = auth::now_unix();
    let mut claims = serde_json::Map::new();
    claims.insert("sub".to_owned(), sub.into());
    claims.insert("role".to_owned(), role.as_str().into());
    claims.insert("iat".to_owned(), now.into());
    claims.insert("exp".to_owned(), (now + ttl_secs).into());
    claims
}

fn sign(algorithm: Algorithm, kid: &str, key: &EncodingKey, sub: &str) -> String {
    let mut header = Header::new(algorithm);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, &claims(sub, Role::Reader, 3600), key).expect("signing with a test key")
}

fn bench_tokens(config: &Config) -> Result<(), String> {
    println!();
    println!(
        "e. token verification: auth::Verifier::verify per token ({} tokens per case, {} distinct, each timed on its own)",
        config.tokens, config.distinct_tokens
    );
    println!("{:<34} {:>10} {:>10} {:>8}   goal (per connection)", "case", "p50 µs", "p99 µs", "alloc");

    let secret = auth::generate_secret();
    let hs256 = Verifier::new(&AuthOptions { secret: Some(secret.clone()), ..AuthOptions::default() })?;
    // Verifier reads the JWKS from a file, as `ordo serve --auth-jwks` does.
    let jwks_path = std::env::temp_dir().join(format!("ordo-server-micro-{}-jwks.json", std::process::id()));
    std::fs::write(&jwks_path, JWKS_JSON).map_err(|error| format!("{}: {error}", jwks_path.display()))?;
    let jwks = Verifier::new(&AuthOptions { jwks_path: Some(jwks_path.clone()), ..AuthOptions::default() });
    let _ = std::fs::remove_file(&jwks_path);
    let jwks = jwks?;

    let key = |result: Result<EncodingKey, jsonwebtoken::errors::Error>| result.map_err(|error| error.to_string());
    let ed25519 = key(EncodingKey::from_ed_pem(ED25519_PEM.as_bytes()))?;
    let rsa = key(EncodingKey::from_rsa_pem(RSA_PEM.as_bytes()))?;
    let p256 = key(EncodingKey::from_ec_pem(P256_PEM.as_bytes()))?;
    let subs: Vec<String> = (0..config.distinct_tokens).map(|i| format!("{i:04}")).collect();
    let cases = [
        TokenCase {
            name: "HS256 (shared secret)",
            verifier: "hs256",
            goal_us: Some(50.0),
            tokens: subs
                .iter()
                .map(|sub| auth::mint(&secret, "role", sub, Role::Reader, 3600, &Default::default()))
                .collect(),
        },
        TokenCase {
            name: "EdDSA (Ed25519, JWKS kid ed-1)",
            verifier: "jwks",
            goal_us: Some(200.0),
            tokens: subs.iter().map(|sub| sign(Algorithm::EdDSA, "ed-1", &ed25519, sub)).collect(),
        },
        TokenCase {
            name: "ES256 (P-256, JWKS kid ec-1)",
            verifier: "jwks",
            goal_us: None,
            tokens: subs.iter().map(|sub| sign(Algorithm::ES256, "ec-1", &p256, sub)).collect(),
        },
        TokenCase {
            name: "RS256 (RSA 2048, JWKS kid rsa-1)",
            verifier: "jwks",
            goal_us: None,
            tokens: subs.iter().map(|sub| sign(Algorithm::RS256, "rsa-1", &rsa, sub)).collect(),
        },
    ];
    for case in &cases {
        let verifier = if case.verifier == "hs256" { &hs256 } else { &jwks };
        // Every token verifies, and names the sub it was minted for.
        for (token, sub) in case.tokens.iter().zip(&subs) {
            let identity = verifier.verify(token).map_err(|failure| format!("{}: {}", case.name, failure.message()))?;
            assert_eq!(&identity.sub, sub);
        }
        let plan = OpPlan {
            warmup: config.distinct_tokens,
            min_ops: config.tokens,
            max_ops: config.tokens,
            budget: Duration::from_secs(60),
        };
        let samples = time_ops(&plan, |i| {
            let identity = verifier.verify(black_box(&case.tokens[i % case.tokens.len()]));
            // The identity is dropped after the clock is read, as a connection keeps it.
            (0, identity)
        });
        let m = samples.measurement(false);
        let (p50, p99) = (m.ns_median as f64 / 1e3, m.ns_p99 as f64 / 1e3);
        let goal = match case.goal_us {
            Some(goal) => format!("≤ {goal:.0} µs: {}", if p50 <= goal { "met" } else { "NOT met" }),
            None => "none".to_owned(),
        };
        println!("{:<34} {p50:>10.1} {p99:>10.1} {:>8.1}   {goal}", case.name, m.allocs_per_op);
    }
    Ok(())
}

fn main() -> ExitCode {
    let config = parse();
    println!("$ {}", std::env::args().collect::<Vec<_>>().join(" "));
    if config.only_tokens {
        return match bench_tokens(&config) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("server-micro: {message}");
                ExitCode::FAILURE
            }
        };
    }
    println!(
        "server-micro: ordo-server's SubTable, NameRoutes and frame writer against the obvious alternatives.\n\
         Each sample times a batch of {} operations (fewer for churn and frames); figures are the median\n\
         over {} runs of ns per operation, allocations per operation, and ratio = alternative / ours\n\
         (above 1: ours is faster).",
        config.batch_len, config.runs
    );
    if cfg!(debug_assertions) {
        println!("warning: a debug build; run with --release for meaningful figures");
    }
    bench_sub_table(&config);
    bench_name_routes(&config);
    bench_frames(&config);
    bench_search(&config);
    if let Err(message) = bench_tokens(&config) {
        eprintln!("server-micro: {message}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
