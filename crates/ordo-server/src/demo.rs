//! The web demo: the page's static files (embedded in the binary, so `ordo serve`
//! needs nothing else at run time) and, with `ordo serve --demo`, a room list
//! filled at start and a traffic simulator that keeps it moving.
//!
//! The simulator behaves like an outside chat server: it reads a room with
//! `GetItem` and writes with `Write`, through the writer thread's queue like
//! every HTTP request, so subscribers see ordinary diffs. Which room gets a
//! message follows a Zipf law (a few rooms are very busy, most are quiet), which
//! is what makes a room list interesting to watch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::{oneshot, watch};

use ordo_core::{Batch, FieldType, Value};

use crate::access::Gate;
use crate::auth::Identity;
use crate::cluster::{self, Cluster};
use crate::demo_data::{self, ROOMS_COLLECTION, ROOMS_PER_BATCH, ROOM_FIELDS};
use crate::error::ApiError;
use crate::limits;
use crate::rng::Rng;
use crate::routing::{CollectionEntry, Routes};
use crate::rules::{AccessDoc, RuleDoc, RuleSet};
use crate::wire;
use crate::write_rules::WriteDoc;
use crate::writer::{Command, WriterSender};

const INDEX_HTML: &str = include_str!("../demo/index.html");
const APP_JS: &str = include_str!("../demo/app.js");
const STYLE_CSS: &str = include_str!("../demo/style.css");
/// The TypeScript client's browser bundle (`clients/typescript`, `dist/ordo-client.js`).
const CLIENT_JS: &str = include_str!("../demo/ordo-client.js");

/// The demo page's files by name under `/demo/`: (content type, body). `""` is the page.
pub fn asset(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        "" | "index.html" => ("text/html; charset=utf-8", INDEX_HTML),
        "app.js" => ("text/javascript; charset=utf-8", APP_JS),
        "style.css" => ("text/css; charset=utf-8", STYLE_CSS),
        "ordo-client.js" => ("text/javascript; charset=utf-8", CLIENT_JS),
        _ => return None,
    })
}

/// Zipf's exponent: rank 1 gets about 2.1 times the messages of rank 2.
pub const ZIPF_EXPONENT: f64 = 1.1;
/// How often the simulator writes; each tick's messages go in one batch.
const TICK: Duration = Duration::from_millis(50);
/// Of the messages, the share sent by the user (they reset the room's unread count).
const OWN_MESSAGE_PERCENT: u64 = 20;
const SIMULATOR_SEED: u64 = 0x0dd5_eed5;

/// A Zipf(s) sampler over ranks `0..n`: rank `k` has weight `1 / (k + 1)^s`.
/// The cumulative table is computed once; a sample is one binary search.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// `n` is at least 1.
    pub fn new(n: usize, exponent: f64) -> Zipf {
        assert!(n >= 1, "a Zipf law needs at least one rank");
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (0..n)
            .map(|rank| {
                total += ((rank + 1) as f64).powf(-exponent);
                total
            })
            .collect();
        for value in &mut cdf {
            *value /= total;
        }
        Zipf { cdf }
    }

    pub fn len(&self) -> usize {
        self.cdf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cdf.is_empty()
    }

    /// The rank for `unit`, a uniform number in [0, 1).
    pub fn sample(&self, unit: f64) -> usize {
        // Rounding can leave the last entry a hair under 1.0: clamp to the last rank.
        self.cdf.partition_point(|&cumulative| cumulative <= unit).min(self.cdf.len() - 1)
    }
}

/// The simulator's controls, shared with the HTTP handlers.
#[derive(Debug)]
pub struct Simulator {
    rate: AtomicU32,
    sent: AtomicU64,
}

impl Simulator {
    pub fn new(rate: u32) -> Result<Simulator, ApiError> {
        check_rate(rate.into())?;
        Ok(Simulator { rate: AtomicU32::new(rate), sent: AtomicU64::new(0) })
    }

    pub fn rate(&self) -> u32 {
        self.rate.load(Ordering::Relaxed)
    }

    /// Messages written (acknowledged) since start.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn set_rate(&self, rate: u32) {
        self.rate.store(rate, Ordering::Relaxed);
    }

    /// `GET /demo/simulator`
    pub fn status_json(&self) -> serde_json::Value {
        serde_json::json!({"rate": self.rate(), "sent": self.sent()})
    }
}

fn check_rate(rate: u64) -> Result<u32, ApiError> {
    if rate > u64::from(limits::MAX_DEMO_MESSAGES_PER_SECOND) {
        return Err(ApiError::bad_request(format!(
            "the simulator's rate is {rate} messages/s; it is 0..={}",
            limits::MAX_DEMO_MESSAGES_PER_SECOND
        )));
    }
    Ok(rate as u32)
}

/// The body of `POST /demo/simulator`: `{"rate": N}`, N in 0..=MAX_DEMO_MESSAGES_PER_SECOND.
pub fn parse_rate_request(body: &[u8]) -> Result<u32, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RateRequest {
        rate: u64,
    }
    let request: RateRequest = crate::strict_json::parse(body, "the body")?;
    check_rate(request.rate)
}

/// What `start` found or wrote.
pub struct DemoStart {
    pub simulator: Arc<Simulator>,
    pub n_rooms_written: usize,
    pub n_rooms: usize,
}

/// Makes sure `rooms` exists and holds rooms (writing `DEMO_ROOMS` of them into an
/// empty one), then starts the simulator. Runs on the network runtime, after the
/// writer thread started.
///
/// In cluster mode (`cluster`), the node first applies the stream as it stood at
/// start, then creates, seeds and installs only what is still missing, through
/// the stream: the rooms are written once across nodes (two nodes seeding at the
/// same instant write the same generated rooms, so the second changes nothing
/// but versions). Every node runs its own simulator (`--demo-rate` each; `make
/// cluster` runs one, on the first node); their writes add up (`cluster_op`).
pub async fn start(
    writer: &WriterSender,
    routes: &Routes,
    gate: &Gate,
    rate: u32,
    shutdown: watch::Receiver<bool>,
    cluster: Option<Arc<Cluster>>,
) -> Result<DemoStart, String> {
    let simulator = Arc::new(Simulator::new(rate).map_err(|error| format!("--demo-rate: {}", error.message))?);
    if let Some(cluster) = &cluster {
        catch_up(cluster).await?;
    }
    let existing = routes.read().expect("routes lock").get(ROOMS_COLLECTION).cloned();
    let entry = match (existing, &cluster) {
        (Some(entry), _) => entry,
        (None, Some(cluster)) => {
            let fields =
                wire::schema_json(ROOMS_COLLECTION, &demo_data::rooms_schema(), None, |_| None)["fields"].clone();
            let schema = serde_json::json!({ "fields": fields }).to_string();
            let created = cluster::routes::create_collection(
                cluster,
                &Identity::anonymous_admin(),
                ROOMS_COLLECTION,
                schema.as_bytes(),
            )
            .await;
            created.map_err(|error| error.to_string())?.1
        }
        (None, None) => {
            let (reply, answer) = oneshot::channel();
            let command = Command::CreateCollection {
                name: ROOMS_COLLECTION.to_owned(),
                schema: demo_data::rooms_schema(),
                reply,
            };
            let (_, entry) = ask(writer, command, answer).await?.map_err(|error| error.to_string())?;
            entry
        }
    };
    check_schema(&entry)?;
    let (reply, answer) = oneshot::channel();
    let mut n_rooms = ask(writer, Command::CollectionLen { collection: entry.id, reply }, answer).await?;
    let mut n_rooms_written = 0;
    if n_rooms == 0 {
        write_rooms(writer, &entry, limits::DEMO_ROOMS, cluster.as_deref()).await?;
        n_rooms_written = limits::DEMO_ROOMS;
        n_rooms = limits::DEMO_ROOMS;
    }
    install_rule(writer, gate, cluster.as_deref()).await?;
    let room_ids = room_ids(writer, &entry).await?;
    if !room_ids.is_empty() {
        tokio::spawn(run_simulator(simulator.clone(), writer.clone(), entry, room_ids, shutdown, cluster));
    }
    Ok(DemoStart { simulator, n_rooms_written, n_rooms })
}

/// The demo's access rule: a reader reads the rooms it owns (`owner == $sub`).
/// Added to the stored rules when they have none for `rooms`, so an operator's
/// own rules are kept.
async fn install_rule(writer: &WriterSender, gate: &Gate, cluster: Option<&Cluster>) -> Result<(), String> {
    let rules = gate.rules();
    if rules.doc().rules.iter().any(|rule| rule.collection == ROOMS_COLLECTION) {
        return Ok(());
    }
    let mut doc = rules.doc().clone();
    let filter = serde_json::json!({"field": "owner", "op": "eq", "value": "$sub"});
    doc.rules.push(RuleDoc {
        collection: ROOMS_COLLECTION.to_owned(),
        roles: vec!["reader".to_owned()],
        read: AccessDoc::Where { filter },
        write: WriteDoc::None,
        create: false,
    });
    let compiled = RuleSet::compile(doc.clone()).map_err(|error| format!("the demo's access rule: {error}"))?;
    let text = serde_json::to_string(&doc).expect("rules serialise");
    if let Some(cluster) = cluster {
        // Applied (and installed in the gate) by every node, in stream order.
        cluster::routes::set_rules(cluster, &Identity::anonymous_admin(), &text)
            .await
            .map_err(|error| error.to_string())?;
        return Ok(());
    }
    let (reply, answer) = oneshot::channel();
    ask(writer, Command::SetRules { doc: text, reply }, answer).await?.map_err(|error| error.to_string())?;
    gate.set_rules(compiled);
    Ok(())
}

/// Cluster mode: waits (at most a minute) until this node applied the stream
/// as it stood at start, so what the demo finds missing is missing everywhere.
async fn catch_up(cluster: &Cluster) -> Result<(), String> {
    let target = cluster.shared.status.stream_last_seq();
    let deadline = Instant::now() + Duration::from_secs(60);
    while cluster.shared.status.applied_seq() < target {
        if Instant::now() > deadline {
            return Err(format!("--demo: this node did not catch up with the stream (seq {target}) within a minute"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Cluster mode: publishes one batch's ops (HTTP op objects) as a write entry.
async fn publish_ops(cluster: &Cluster, ops: &[serde_json::Value]) -> Result<(), ApiError> {
    let ops = serde_json::value::RawValue::from_string(serde_json::Value::from(ops.to_vec()).to_string())
        .expect("valid JSON");
    let entry = cluster::routes::write_entry(&Identity::anonymous_admin(), ROOMS_COLLECTION, &ops);
    cluster::routes::write(cluster, vec![entry]).await.pop().expect("one result per entry").map(|_| ())
}

/// The body of `POST /demo/token`: `{"user": "alice"}`, one of the demo's users.
pub fn parse_token_request(body: &[u8]) -> Result<&'static str, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TokenRequest {
        user: String,
    }
    let request: TokenRequest = crate::strict_json::parse(body, "the body")?;
    demo_data::DEMO_USERS
        .iter()
        .copied()
        .find(|user| *user == request.user)
        .ok_or_else(|| ApiError::bad_request(format!("the demo's users are {}", demo_data::DEMO_USERS.join(" and "))))
}

/// Sends a command to the writer thread and waits for its answer.
async fn ask<T>(writer: &WriterSender, command: Command, answer: oneshot::Receiver<T>) -> Result<T, String> {
    const STOPPED: &str = "the writer thread stopped";
    writer.send(command).await.map_err(|_| STOPPED.to_owned())?;
    answer.await.map_err(|_| STOPPED.to_owned())
}

/// The demo page and the simulator need these fields; others may be there too.
fn check_schema(entry: &CollectionEntry) -> Result<(), String> {
    let has = |name: &str, field_type: FieldType| {
        entry.schema.field_id(name).is_some_and(|id| entry.schema.field(id).field_type == field_type)
    };
    if ROOM_FIELDS.iter().all(|&(name, field_type)| has(name, field_type)) {
        return Ok(());
    }
    let wanted: Vec<String> = ROOM_FIELDS.iter().map(|(name, field_type)| format!("{name}: {field_type}")).collect();
    Err(format!(
        "--demo needs collection `{}` with the fields {}; this data directory has one with another schema \
         (use another --data-dir)",
        entry.name,
        wanted.join(", ")
    ))
}

async fn write_rooms(
    writer: &WriterSender,
    entry: &CollectionEntry,
    n_rooms: usize,
    cluster: Option<&Cluster>,
) -> Result<(), String> {
    let mut rng = Rng::new(demo_data::ROOMS_SEED);
    let now_ms = demo_data::now_ms();
    let mut written = 0;
    while written < n_rooms {
        let n = ROOMS_PER_BATCH.min(n_rooms - written);
        if let Some(cluster) = cluster {
            let ops: Vec<serde_json::Value> = (written..written + n)
                .map(|index| {
                    let room = demo_data::demo_room(index, &mut rng, now_ms);
                    serde_json::json!({"op": "upsert", "id": room.id, "fields": {
                        "name": room.name, "recency": room.recency_ms, "unread": room.unread, "dm": room.dm,
                        "favourite": room.favourite, "owner": room.owner,
                    }, "payload": {"last_message": room.last_message}})
                })
                .collect();
            publish_ops(cluster, &ops).await.map_err(|error| format!("writing the demo rooms: {error}"))?;
            written += n;
            continue;
        }
        let mut batch = Batch::new();
        for index in written..written + n {
            let room = demo_data::demo_room(index, &mut rng, now_ms);
            batch
                .upsert(&room.id)
                .set("name", Value::Str(&room.name))
                .set("recency", Value::U64(room.recency_ms))
                .set("unread", Value::U64(room.unread))
                .set("dm", Value::Bool(room.dm))
                .set("favourite", Value::Bool(room.favourite))
                .set("owner", Value::Str(room.owner))
                .payload(&demo_data::room_payload(&room.last_message));
        }
        let (reply, answer) = oneshot::channel();
        let command = Command::Write {
            batches: vec![(entry.id, batch)],
            reply,
            queued_at: std::time::Instant::now(),
            guards: Vec::new(),
        };
        let mut results = ask(writer, command, answer).await?.results;
        results.pop().expect("one result per batch").map_err(|error| format!("writing the demo rooms: {error}"))?;
        written += n;
    }
    Ok(())
}

/// The ids of the rooms the simulator writes to: the first `MAX_SIMULATED_ROOMS`
/// by id, read with one-shot queries like a client would.
async fn room_ids(writer: &WriterSender, entry: &CollectionEntry) -> Result<Vec<String>, String> {
    let mut ids = Vec::new();
    while ids.len() < limits::MAX_SIMULATED_ROOMS {
        let limit = limits::MAX_WINDOW_LIMIT.min(limits::MAX_SIMULATED_ROOMS - ids.len());
        let spec = wire::window_spec(
            &entry.schema,
            &serde_json::Value::Null,
            &[],
            wire::PositionKeys { offset: Some(ids.len()), ..Default::default() },
            limit,
            Some(&[]),
            false,
        )
        .map_err(|error| error.to_string())?;
        let (reply, answer) = oneshot::channel();
        let body =
            ask(writer, Command::Query { collection: entry.id, schema: entry.schema.clone(), spec, reply }, answer)
                .await?
                .map_err(|error| error.to_string())?;
        let page: serde_json::Value = serde_json::from_slice(&body).map_err(|error| error.to_string())?;
        let items = page["items"].as_array().ok_or("a query answer without items")?;
        ids.extend(items.iter().filter_map(|item| item["id"].as_str().map(str::to_owned)));
        if items.len() < limit {
            break;
        }
    }
    Ok(ids)
}

/// What a tick does to one room's unread count: the user's own message resets it,
/// anyone else's adds one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnreadChange {
    Add(u64),
    Set(u64),
}

impl UnreadChange {
    pub fn after_message(self, own: bool) -> UnreadChange {
        match (own, self) {
            (true, _) => UnreadChange::Set(0),
            (false, UnreadChange::Add(n)) => UnreadChange::Add(n + 1),
            (false, UnreadChange::Set(n)) => UnreadChange::Set(n + 1),
        }
    }

    pub fn apply(self, current: u64) -> u64 {
        match self {
            UnreadChange::Add(n) => current.saturating_add(n),
            UnreadChange::Set(n) => n,
        }
    }
}

/// Cluster mode: one room's update as an op whose outcome does not depend on
/// what this node read. Several simulators (one per node, or a user marking
/// the room read on another node) write the same rooms, and the stream orders
/// their entries only after each node read the count: a read-then-write of
/// `unread` would lose the others' messages. So messages from others are an
/// `increment`, the user's own message sets the count (it is read then), and
/// `recency` only moves forward (`set_max`).
pub fn cluster_op(id: &str, unread: UnreadChange, now_ms: u64, last_message: &str) -> serde_json::Value {
    let mut op = serde_json::json!({"op": "upsert", "id": id, "set_max": {"recency": now_ms},
                                    "payload": {"last_message": last_message}});
    match unread {
        UnreadChange::Add(n) => op["increment"] = serde_json::json!({ "unread": n }),
        UnreadChange::Set(n) => op["fields"] = serde_json::json!({ "unread": n }),
    }
    op
}

/// One room's messages within a tick.
struct PlannedRoom {
    room: usize,
    unread: UnreadChange,
    last_message: String,
    n_messages: u64,
}

async fn run_simulator(
    simulator: Arc<Simulator>,
    writer: WriterSender,
    entry: Arc<CollectionEntry>,
    room_ids: Vec<String>,
    mut shutdown: watch::Receiver<bool>,
    cluster: Option<Arc<Cluster>>,
) {
    let mut ops: Vec<serde_json::Value> = Vec::new();
    let mut rng = Rng::new(SIMULATOR_SEED);
    let zipf = Zipf::new(room_ids.len(), ZIPF_EXPONENT);
    // Rank -> room: a seeded shuffle, so the busy rooms are spread over the list.
    let mut by_rank: Vec<usize> = (0..room_ids.len()).collect();
    for index in (1..by_rank.len()).rev() {
        by_rank.swap(index, rng.below(index as u64 + 1) as usize);
    }
    let mut planned: Vec<PlannedRoom> = Vec::new();
    let mut position: HashMap<usize, usize> = HashMap::new();
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_tick = Instant::now();
    let mut credit = 0.0f64;
    let mut last_error_printed: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
        let now = Instant::now();
        // A stall (a slow commit) must not turn into a burst afterwards.
        let elapsed = now.duration_since(last_tick).min(Duration::from_secs(1));
        last_tick = now;
        let rate = simulator.rate();
        if rate == 0 {
            credit = 0.0;
            continue;
        }
        credit = (credit + f64::from(rate) * elapsed.as_secs_f64()).min(limits::MAX_OPS_PER_REQUEST as f64);
        let n_messages = credit as usize;
        if n_messages == 0 {
            continue;
        }
        credit -= n_messages as f64;

        planned.clear();
        position.clear();
        for _ in 0..n_messages {
            let room = by_rank[zipf.sample(rng.unit())];
            let own = rng.chance(OWN_MESSAGE_PERCENT);
            let text = demo_data::demo_text(&mut rng);
            let last_message = if own { format!("You: {text}") } else { demo_data::demo_message(&mut rng) };
            let slot = *position.entry(room).or_insert_with(|| {
                planned.push(PlannedRoom {
                    room,
                    unread: UnreadChange::Add(0),
                    last_message: String::new(),
                    n_messages: 0,
                });
                planned.len() - 1
            });
            let plan = &mut planned[slot];
            plan.unread = plan.unread.after_message(own);
            plan.last_message = last_message;
            plan.n_messages += 1;
        }

        let mut batch = Batch::new();
        ops.clear();
        let mut n_written = 0;
        let now_ms = demo_data::now_ms();
        for plan in &planned {
            let id = &room_ids[plan.room];
            // Read the room's count as it is now: someone may have marked it read.
            let (reply, answer) = oneshot::channel();
            let Ok(item) =
                ask(&writer, Command::GetItem { collection: entry.id, id: id.clone(), predicate: None, reply }, answer)
                    .await
            else {
                return;
            };
            // A room removed since start stays removed.
            let Some(item) = item else { continue };
            let current = serde_json::from_slice::<serde_json::Value>(&item)
                .ok()
                .and_then(|item| item["fields"]["unread"].as_u64())
                .unwrap_or(0);
            if cluster.is_some() {
                ops.push(cluster_op(id, plan.unread, now_ms, &plan.last_message));
            } else {
                batch
                    .upsert(id)
                    .set("recency", Value::U64(now_ms))
                    .set("unread", Value::U64(plan.unread.apply(current)))
                    .payload(&demo_data::room_payload(&plan.last_message));
            }
            n_written += plan.n_messages;
        }
        if let Some(cluster) = &cluster {
            if ops.is_empty() {
                continue;
            }
            match publish_ops(cluster, &ops).await {
                Ok(()) => {
                    simulator.sent.fetch_add(n_written, Ordering::Relaxed);
                }
                Err(error) => {
                    crate::metrics::add(&crate::metrics::METRICS.batches_refused, 1);
                    if last_error_printed.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(code = error.code.as_str(), "the demo simulator's write was refused: {error}");
                        last_error_printed = Some(Instant::now());
                    }
                }
            }
            continue;
        }
        if batch.is_empty() {
            continue;
        }
        let (reply, answer) = oneshot::channel();
        let command = Command::Write {
            batches: vec![(entry.id, batch)],
            reply,
            queued_at: std::time::Instant::now(),
            guards: Vec::new(),
        };
        let Ok(reply) = ask(&writer, command, answer).await else {
            return;
        };
        let mut results = reply.results;
        match results.pop().expect("one result per batch") {
            Ok(_) => {
                simulator.sent.fetch_add(n_written, Ordering::Relaxed);
            }
            Err(error) => {
                // The simulator is the one writer not answered over HTTP: its refusals count here.
                crate::metrics::add(&crate::metrics::METRICS.batches_refused, 1);
                // A full store refuses every write: say so now and then, not 20 times a second.
                if last_error_printed.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(code = error.code.as_str(), "the demo simulator's write was refused: {error}");
                    last_error_printed = Some(Instant::now());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two simulators adding messages to one room through the stream must both
    /// count: the op adds, it never writes back a count read before.
    #[test]
    fn the_cluster_ops_of_two_simulators_never_lose_a_message() {
        let own_then_two = UnreadChange::Add(0).after_message(true).after_message(false).after_message(false);
        let others = UnreadChange::Add(0).after_message(false).after_message(false).after_message(false);
        let op = cluster_op("!r", others, 7, "hi");
        assert_eq!(op["increment"]["unread"], 3);
        assert!(op.get("fields").is_none(), "{op}");
        assert_eq!(op["set_max"]["recency"], 7);
        let op = cluster_op("!r", own_then_two, 8, "hi");
        assert_eq!(op["fields"]["unread"], 2);
        assert!(op.get("increment").is_none(), "{op}");
        // Applied in either order on a room at 5 unread, two simulators' "3 more" give 11.
        let apply = |current: u64, op: &serde_json::Value| match op["increment"]["unread"].as_u64() {
            Some(n) => current + n,
            None => op["fields"]["unread"].as_u64().unwrap(),
        };
        let op = cluster_op("!r", others, 7, "hi");
        assert_eq!(apply(apply(5, &op), &op), 11);
    }

    #[test]
    fn zipf_stays_in_range_and_favours_the_head() {
        let n = 10_000;
        let zipf = Zipf::new(n, ZIPF_EXPONENT);
        let mut rng = Rng::new(7);
        let mut counts = vec![0u32; n];
        for _ in 0..200_000 {
            let rank = zipf.sample(rng.unit());
            assert!(rank < n);
            counts[rank] += 1;
        }
        // The first 10 ranks together get far more than the last 1 000.
        let head: u32 = counts[..10].iter().sum();
        let tail: u32 = counts[n - 1_000..].iter().sum();
        assert!(head > 10 * tail, "head {head}, tail {tail}");
        assert!(counts[0] > counts[1] && counts[1] > counts[9], "{:?}", &counts[..10]);
        // Rank 1 over rank 2 should be near 2^1.1 ≈ 2.14.
        let ratio = f64::from(counts[0]) / f64::from(counts[1]);
        assert!((1.8..2.5).contains(&ratio), "ratio {ratio}");
    }

    #[test]
    fn zipf_edges() {
        let one = Zipf::new(1, ZIPF_EXPONENT);
        assert_eq!(one.sample(0.0), 0);
        assert_eq!(one.sample(0.999_999_999), 0);
        let zipf = Zipf::new(100, ZIPF_EXPONENT);
        assert_eq!(zipf.sample(0.0), 0);
        assert_eq!(zipf.sample(1.0 - f64::EPSILON), 99);
        assert_eq!(zipf.sample(1.0), 99, "clamped even past the table");
    }

    #[test]
    fn the_rate_is_checked_at_its_limit() {
        assert_eq!(parse_rate_request(br#"{"rate":0}"#), Ok(0));
        assert_eq!(parse_rate_request(br#"{"rate":5000}"#), Ok(limits::MAX_DEMO_MESSAGES_PER_SECOND));
        for bad in
            [r#"{"rate":5001}"#, r#"{"rate":-1}"#, r#"{"rate":1.5}"#, r#"{"rate":"5"}"#, r#"{}"#, r#"{"rate":1,"x":2}"#]
        {
            let error = parse_rate_request(bad.as_bytes()).unwrap_err();
            assert_eq!(error.code, crate::error::ErrorCode::BadRequest, "{bad}: {error}");
        }
        assert_eq!(parse_rate_request(b"{").unwrap_err().code, crate::error::ErrorCode::BadJson);
        assert!(Simulator::new(limits::MAX_DEMO_MESSAGES_PER_SECOND + 1).is_err());
    }

    #[test]
    fn own_messages_reset_the_unread_count() {
        let start = UnreadChange::Add(0);
        assert_eq!(start.after_message(false).after_message(false).apply(3), 5);
        assert_eq!(start.after_message(false).after_message(true).apply(3), 0);
        assert_eq!(start.after_message(true).after_message(false).apply(3), 1);
        assert_eq!(start.apply(3), 3);
    }

    #[test]
    fn every_asset_has_a_content_type() {
        for name in ["", "index.html", "app.js", "style.css", "ordo-client.js"] {
            let (content_type, body) = asset(name).unwrap();
            assert!(content_type.contains("charset=utf-8") && !body.is_empty(), "{name}");
        }
        assert!(asset("../Cargo.toml").is_none() && asset("simulator").is_none());
        assert!(asset("").unwrap().1.contains("/demo/app.js"), "the page loads its script by absolute path");
    }
}
