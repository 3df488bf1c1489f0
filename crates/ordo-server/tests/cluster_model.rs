//! The cluster model test: three NATS nodes (an R3 stream) and three
//! `ordo serve --cluster` nodes. Random writes (upserts, removes, increments,
//! `set_max`, conditional writes, multi-op batches, item deletes, and now and
//! then a schema change) go to random nodes over HTTP, some steps several at
//! once; random subscriptions (filters, sorts, windows, `set_range`) live on
//! random nodes. After every step:
//!
//! - every node's one-shot queries (the whole collection, and every view a
//!   client holds), asked with `min_seq` = the last acknowledged `seq`, equal a
//!   naive single-node model applied to the acknowledged writes in `seq` order
//!   — item versions included, which are the global `seq`s;
//! - every write a node acknowledged held its preconditions at its place in
//!   that order, and a lone write's outcome (applied or `conflict` naming the
//!   op) is the one the model predicts;
//! - every client's list, built by applying every frame (whose `seq` must step
//!   by one), equals a one-shot query of its view on its node.
//!
//! The three nodes group their publishes differently (`--coalesce-*`): one
//! entry per message, atomic batches of what is waiting, and batches that wait
//! for more, so steps whose writes go out at once share batches.
//!
//! `ORDO_CLUSTER_MODEL_SEEDS` and `ORDO_CLUSTER_MODEL_STEPS` run it longer;
//! `ORDO_CLUSTER_MODEL_SEED=n` replays seed `n` (printed when a run fails).

mod common;

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::{env_number, request, OrdoCluster, SeedGuard};
use common::{query_items, Client, Rng};
use serde_json::{json, Value};

/// The fields every seed's collection starts with; views read only these, so a
/// schema change (of the extra fields) never ends a subscription.
const BASE_FIELDS: [(&str, &str); 4] = [("name", "string"), ("recency", "u64"), ("unread", "u64"), ("dm", "bool")];
const NAMES: [&str; 5] = ["ann", "Bob", "cy", "dee", "éd"];
const N_IDS: u64 = 24;
const N_CLIENTS: usize = 4;
const MAX_SUBS_PER_CLIENT: usize = 4;
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
enum Write {
    Batch(Vec<Value>),
    DeleteItem(String),
    AddField { name: String, default: u64 },
    RemoveField(String),
}

#[derive(Clone, Debug)]
struct Item {
    version: u64,
    fields: BTreeMap<String, Value>,
    payload: Value,
}

/// The naive single-node reference: the schema's field names and every item.
#[derive(Clone, Default)]
struct Model {
    fields: Vec<String>,
    items: BTreeMap<String, Item>,
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Applied { removed: bool },
    Conflict { op: usize },
}

impl Model {
    /// Applies `write` as the write with global `seq`: whole or not at all.
    fn apply(&mut self, write: &Write, seq: u64) -> Outcome {
        match write {
            Write::Batch(ops) => {
                let mut items = self.items.clone();
                for (index, op) in ops.iter().enumerate() {
                    let id = op["id"].as_str().unwrap();
                    if let Some(condition) = op.get("if") {
                        let current = items.get(id);
                        let holds = if let Some(exists) = condition.get("exists") {
                            exists.as_bool().unwrap() == current.is_some()
                        } else {
                            let version = condition["version"].as_u64().unwrap();
                            current.is_some_and(|item| item.version == version)
                        };
                        if !holds {
                            return Outcome::Conflict { op: index };
                        }
                    }
                    if op["op"] == "remove" {
                        items.remove(id);
                        continue;
                    }
                    let fields = &self.fields;
                    let item = items.entry(id.to_owned()).or_insert_with(|| Item {
                        version: 0,
                        fields: fields.iter().map(|name| (name.clone(), Value::Null)).collect(),
                        payload: Value::Null,
                    });
                    item.version = seq;
                    for (name, value) in op.get("fields").and_then(Value::as_object).into_iter().flatten() {
                        item.fields.insert(name.clone(), value.clone());
                    }
                    if let Some(payload) = op.get("payload") {
                        item.payload = payload.clone();
                    }
                    for (name, operand) in op.get("increment").and_then(Value::as_object).into_iter().flatten() {
                        let old = item.fields[name].as_u64().unwrap_or(0);
                        item.fields.insert(name.clone(), json!(old + operand.as_u64().unwrap()));
                    }
                    for (name, operand) in op.get("set_max").and_then(Value::as_object).into_iter().flatten() {
                        let old = &item.fields[name];
                        if old.is_null() || operand.as_u64() > old.as_u64() {
                            item.fields.insert(name.clone(), operand.clone());
                        }
                    }
                }
                self.items = items;
                Outcome::Applied { removed: false }
            }
            Write::DeleteItem(id) => Outcome::Applied { removed: self.items.remove(id).is_some() },
            Write::AddField { name, default } => {
                self.fields.push(name.clone());
                for item in self.items.values_mut() {
                    item.fields.insert(name.clone(), json!(default));
                }
                Outcome::Applied { removed: false }
            }
            Write::RemoveField(name) => {
                self.fields.retain(|field| field != name);
                for item in self.items.values_mut() {
                    item.fields.remove(name);
                }
                Outcome::Applied { removed: false }
            }
        }
    }

    fn extra_field(&self) -> Option<&String> {
        self.fields.get(BASE_FIELDS.len())
    }

    /// A view's window as the single-node server answers it: `total` and the items.
    fn query(&self, view: &Value) -> (usize, Vec<Value>) {
        let mut rows: Vec<(&String, &Item)> =
            self.items.iter().filter(|(_, item)| matches(&view["filter"], &item.fields)).collect();
        let total = rows.len();
        let sort = view["sort"].as_array().cloned().unwrap_or_default();
        rows.sort_by(|(id_a, a), (id_b, b)| {
            for key in &sort {
                let field = key["field"].as_str().unwrap();
                let order = compare_for_sort(&a.fields[field], &b.fields[field], key["dir"] == "desc");
                if order != Ordering::Equal {
                    return order;
                }
            }
            id_a.as_bytes().cmp(id_b.as_bytes())
        });
        let offset = view["offset"].as_u64().unwrap_or(0) as usize;
        let limit = view["limit"].as_u64().unwrap() as usize;
        let items = rows
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(
                |(id, item)| json!({"id": id, "version": item.version, "fields": item.fields, "payload": item.payload}),
            )
            .collect();
        (total, items)
    }
}

/// Nulls last in both directions; numbers by value, strings by bytes, false < true.
fn compare_for_sort(a: &Value, b: &Value, descending: bool) -> Ordering {
    match (a.is_null(), b.is_null()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => {
            let order = compare_values(a, b);
            if descending {
                order.reverse()
            } else {
                order
            }
        }
    }
}

fn compare_values(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => a.as_u64().unwrap().cmp(&b.as_u64().unwrap()),
        (Value::String(a), Value::String(b)) => a.as_bytes().cmp(b.as_bytes()),
        (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
        _ => panic!("comparing {a} with {b}"),
    }
}

/// The filter language's meaning, naively (a comparison with null is false).
fn matches(filter: &Value, fields: &BTreeMap<String, Value>) -> bool {
    if filter.is_null() {
        return true;
    }
    if let Some(all) = filter.get("all") {
        return all.as_array().unwrap().iter().all(|inner| matches(inner, fields));
    }
    if let Some(any) = filter.get("any") {
        return any.as_array().unwrap().iter().any(|inner| matches(inner, fields));
    }
    if let Some(inner) = filter.get("not") {
        return !matches(inner, fields);
    }
    let value = &fields[filter["field"].as_str().unwrap()];
    if value.is_null() {
        return false;
    }
    let order = compare_values(value, &filter["value"]);
    match filter["op"].as_str().unwrap() {
        "eq" => order == Ordering::Equal,
        "ne" => order != Ordering::Equal,
        "lt" => order == Ordering::Less,
        "le" => order != Ordering::Greater,
        "gt" => order == Ordering::Greater,
        "ge" => order != Ordering::Less,
        op => panic!("op {op}"),
    }
}

fn random_filter(rng: &mut Rng) -> Value {
    match rng.below(7) {
        0 | 1 => Value::Null,
        2 => json!({"field": "unread", "op": "gt", "value": rng.below(4)}),
        3 => json!({"field": "dm", "op": "eq", "value": true}),
        4 => json!({"field": "recency", "op": "ge", "value": rng.below(1000)}),
        5 => json!({"any": [{"field": "unread", "op": "ge", "value": 2}, {"field": "dm", "op": "eq", "value": false}]}),
        _ => json!({"not": {"field": "name", "op": "eq", "value": *rng.pick(&NAMES)}}),
    }
}

fn random_sort(rng: &mut Rng) -> Value {
    match rng.below(5) {
        0 => Value::Null,
        1 => json!([{"field": "recency", "dir": "desc"}]),
        2 => json!([{"field": "name", "dir": "asc"}, {"field": "unread", "dir": "desc"}]),
        3 => json!([{"field": "unread", "dir": "asc"}, {"field": "recency", "dir": "desc"}]),
        _ => json!([{"field": "dm", "dir": "desc"}, {"field": "name", "dir": "desc"}]),
    }
}

fn random_view(rng: &mut Rng) -> Value {
    json!({"filter": random_filter(rng), "sort": random_sort(rng), "offset": rng.below(4), "limit": 1 + rng.below(8)})
}

fn random_id(rng: &mut Rng) -> String {
    format!("r{}", rng.below(N_IDS))
}

/// Fields named by an upsert: a random subset, leaving out those an atomic
/// operation of the same op names (a field may be named once per op).
fn random_fields(rng: &mut Rng, model: &Model, taken: &[&str]) -> Value {
    let mut fields = serde_json::Map::new();
    for (name, _) in BASE_FIELDS {
        if taken.contains(&name) || !rng.chance(50) {
            continue;
        }
        let value = match name {
            "name" => json!(*rng.pick(&NAMES)),
            "recency" => json!(rng.below(1000)),
            "unread" => json!(rng.below(5)),
            _ if rng.chance(20) => Value::Null,
            _ => json!(rng.chance(50)),
        };
        fields.insert(name.to_owned(), value);
    }
    if let Some(extra) = model.extra_field() {
        if rng.chance(30) {
            fields.insert(extra.clone(), json!(rng.below(100)));
        }
    }
    Value::Object(fields)
}

fn random_op(rng: &mut Rng, model: &Model) -> Value {
    let id = random_id(rng);
    let mut op = match rng.below(10) {
        0..=3 => json!({"op": "upsert", "id": id, "fields": random_fields(rng, model, &[])}),
        4 => json!({"op": "remove", "id": id}),
        5 | 6 => json!({"op": "upsert", "id": id, "fields": random_fields(rng, model, &["unread"]),
                        "increment": {"unread": 1 + rng.below(3)}}),
        _ => json!({"op": "upsert", "id": id, "fields": random_fields(rng, model, &["recency"]),
                    "set_max": {"recency": rng.below(1000)}}),
    };
    if op["op"] == "upsert" && rng.chance(30) {
        op["payload"] = if rng.chance(20) { Value::Null } else { json!({"n": rng.below(100), "text": "héllo"}) };
    }
    // A precondition on one op in four: mostly ones that hold as far as this
    // client knows (concurrent writes of the same step may still break them).
    if rng.chance(25) {
        let current = model.items.get(&id).map(|item| item.version);
        op["if"] = match (rng.below(3), current) {
            (0, _) => json!({"exists": current.is_some() != rng.chance(20)}),
            (_, Some(version)) if rng.chance(80) => json!({"version": version}),
            (_, Some(version)) => json!({"version": version + 1}),
            (_, None) => json!({"version": 1 + rng.below(5)}),
        };
    }
    op
}

fn random_write(rng: &mut Rng, model: &Model) -> Write {
    if rng.chance(10) {
        return Write::DeleteItem(random_id(rng));
    }
    let n_ops = 1 + rng.below(3);
    Write::Batch((0..n_ops).map(|_| random_op(rng, model)).collect())
}

/// Sends `write` to the node at `port`: the status and the answer.
fn send(port: u16, collection: &str, write: &Write) -> (u16, Value) {
    let (method, path, body) = match write {
        Write::Batch(ops) => ("POST", format!("/v1/collections/{collection}/batch"), Some(json!({"ops": ops}))),
        Write::DeleteItem(id) => ("DELETE", format!("/v1/collections/{collection}/items/{id}"), None),
        Write::AddField { name, default } => (
            "POST",
            format!("/v1/collections/{collection}/fields"),
            Some(json!({"name": name, "type": "u64", "default": default})),
        ),
        Write::RemoveField(name) => ("DELETE", format!("/v1/collections/{collection}/fields/{name}"), None),
    };
    request(port, method, &path, body.as_ref(), TIMEOUT).unwrap_or_else(|error| panic!("{write:?}: {error}"))
}

/// A one-shot query. A query that waits for its `min_seq` across a schema
/// change of its collection is refused with `invalid_view` ("send it again",
/// `docs/PROTOCOL.md`): it is sent again.
fn query(port: u16, path: &str, body: &Value) -> (u16, Value) {
    loop {
        let (status, answer) = request(port, "POST", path, Some(body), TIMEOUT).unwrap();
        let message = answer["error"]["message"].as_str().unwrap_or("");
        if !(status == 400 && message.contains("changed while this request was on its way")) {
            return (status, answer);
        }
    }
}

/// One subscription a client holds: its view (as sent) and its node.
struct Sub {
    id: String,
    view: Value,
}

struct ClientState {
    client: Client,
    node: usize,
    subs: Vec<Sub>,
}

struct Run<'a> {
    cluster: &'a OrdoCluster,
    rng: Rng,
    seed: u64,
    collection: String,
    model: Model,
    last_seq: u64,
    clients: Vec<ClientState>,
    next_sub: usize,
    n_acked: usize,
    n_conflicts: usize,
}

impl Run<'_> {
    fn port(&self, node: usize) -> u16 {
        self.cluster.node(node).port
    }

    /// One step's writes, sent at once from their own threads (each to a random
    /// node), then applied to the model in `seq` order.
    fn write_step(&mut self, writes: Vec<Write>, step: usize) {
        let n_nodes = self.cluster.len();
        let targets: Vec<u16> = writes.iter().map(|_| self.cluster.node(self.rng.index(n_nodes)).port).collect();
        let collection = self.collection.clone();
        let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
            let handles: Vec<_> = writes
                .iter()
                .zip(&targets)
                .map(|(write, &port)| {
                    let collection = &collection;
                    scope.spawn(move || send(port, collection, write))
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().unwrap()).collect()
        });
        let context = format!("seed {} step {step}", self.seed);
        let mut acked: Vec<(u64, usize)> = Vec::new();
        for (index, ((status, answer), write)) in answers.iter().zip(&writes).enumerate() {
            match status {
                200 | 201 => {
                    let seq = answer["seq"].as_u64().unwrap_or_else(|| panic!("{context}: no seq in {answer}"));
                    acked.push((seq, index));
                }
                409 => {
                    assert_eq!(answer["error"]["code"], "conflict", "{context}: {write:?}: {answer}");
                    self.n_conflicts += 1;
                }
                _ => panic!("{context}: {write:?} answered {status} {answer}"),
            }
        }
        acked.sort();
        let mut seqs: Vec<u64> = acked.iter().map(|(seq, _)| *seq).collect();
        seqs.dedup();
        assert_eq!(seqs.len(), acked.len(), "{context}: two writes acknowledged with one seq: {acked:?}");
        if let Some(first) = seqs.first() {
            assert!(*first > self.last_seq, "{context}: seq {first} after {}", self.last_seq);
        }
        for &(seq, index) in &acked {
            let outcome = self.model.apply(&writes[index], seq);
            let (_, answer) = &answers[index];
            match outcome {
                Outcome::Applied { removed } => {
                    if let Write::DeleteItem(_) = writes[index] {
                        assert_eq!(answer["removed"], removed, "{context}: {:?}: {answer}", writes[index]);
                    }
                }
                Outcome::Conflict { op } => panic!(
                    "{context}: {:?} acknowledged as seq {seq}, but its op {op}'s precondition fails there",
                    writes[index]
                ),
            }
            self.last_seq = seq;
            self.n_acked += 1;
        }
        // A lone write has one possible order: its outcome is known.
        if let [write] = writes.as_slice() {
            let (status, answer) = &answers[0];
            if *status == 409 {
                let mut model = self.model.clone();
                assert_eq!(
                    model.apply(write, u64::MAX),
                    Outcome::Conflict { op: answer["error"]["op"].as_u64().unwrap() as usize },
                    "{context}: {write:?} answered {answer}"
                );
            }
        }
    }

    /// Every node's whole collection, and every view a client holds, against the model.
    fn check_nodes(&self, step: usize) {
        let mut views = vec![json!({"limit": 1000})];
        views.extend(self.clients.iter().flat_map(|state| state.subs.iter().map(|sub| sub.view.clone())));
        for node in 0..self.cluster.len() {
            for view in &views {
                let mut body = view.clone();
                body["min_seq"] = json!(self.last_seq);
                let path = format!("/v1/collections/{}/query", self.collection);
                let (status, answer) = query(self.port(node), &path, &body);
                assert_eq!(status, 200, "seed {} step {step} node o{node}: {answer}", self.seed);
                let (total, items) = self.model.query(view);
                assert_eq!(
                    (answer["total"].as_u64(), answer["items"].as_array().unwrap()),
                    (Some(total as u64), &items),
                    "seed {} step {step}: node o{node} differs from the model for view {view} at seq {}",
                    self.seed,
                    self.last_seq
                );
            }
        }
    }

    /// Every client's lists against one-shot queries of their views on their nodes.
    async fn check_clients(&mut self, step: usize) {
        for state in &mut self.clients {
            let port = self.cluster.node(state.node).port;
            let mut expected = BTreeMap::new();
            for sub in &state.subs {
                let mut body = sub.view.clone();
                body["min_seq"] = json!(self.last_seq);
                let path = format!("/v1/collections/{}/query", self.collection);
                let (status, answer) = query(port, &path, &body);
                assert_eq!(status, 200, "{answer}");
                expected.insert(sub.id.clone(), query_items(&answer["items"]));
            }
            let equal = |client: &Client| {
                expected.iter().all(|(sub, items)| client.lists.get(sub).is_some_and(|list| &list.items == items))
            };
            let converged = state.client.read_until(TIMEOUT, equal).await;
            for frame in &state.client.frames {
                assert!(frame["type"] != "error" && frame["type"] != "ended", "seed {}: {frame}", self.seed);
            }
            if !converged {
                for (sub, items) in &expected {
                    let list = state.client.lists.get(sub).map(|list| &list.items);
                    assert_eq!(
                        list,
                        Some(items),
                        "seed {} step {step}: client on o{} sub {sub}: its list is not the query's",
                        self.seed,
                        state.node
                    );
                }
            }
            state.client.diffs_seen.clear();
        }
    }

    /// Opens, moves or closes a subscription of a random client.
    async fn change_subscriptions(&mut self) {
        let index = self.rng.index(self.clients.len());
        let choice = self.rng.below(3);
        let last_seq = self.last_seq;
        let state = &mut self.clients[index];
        if choice == 0 && state.subs.len() < MAX_SUBS_PER_CLIENT || state.subs.is_empty() {
            let id = format!("s{}", self.next_sub);
            self.next_sub += 1;
            let view = random_view(&mut self.rng);
            let mut message = view.clone();
            let extra = json!({"op": "subscribe", "sub": id, "collection": self.collection,
                               "min_seq": last_seq, "req": id});
            message.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            state.client.send(message).await;
            let got = state.client.read_until(TIMEOUT, |client| client.lists.contains_key(&id)).await;
            assert!(got, "seed {}: no first frame for {id}: {:?}", self.seed, state.client.frames);
            state.subs.push(Sub { id, view });
        } else if choice == 1 {
            let pick = self.rng.index(state.subs.len());
            let sub = &mut state.subs[pick];
            let (offset, limit) = (self.rng.below(4), 1 + self.rng.below(8));
            sub.view["offset"] = json!(offset);
            sub.view["limit"] = json!(limit);
            let req = format!("range-{}", self.next_sub);
            self.next_sub += 1;
            state
                .client
                .send(json!({"op": "set_range", "sub": sub.id, "offset": offset, "limit": limit, "req": req}))
                .await;
            let answered = state
                .client
                .read_until(TIMEOUT, |client| {
                    client.frames.iter().chain(&client.diffs_seen).any(|frame| frame["req"] == req.as_str())
                })
                .await;
            assert!(answered, "seed {}: set_range not answered", self.seed);
        } else {
            let pick = self.rng.index(state.subs.len());
            let sub = state.subs.remove(pick);
            state.client.send(json!({"op": "unsubscribe", "sub": sub.id})).await;
            let done = state
                .client
                .read_until(TIMEOUT, |client| {
                    client.frames.iter().any(|frame| frame["type"] == "unsubscribed" && frame["sub"] == sub.id.as_str())
                })
                .await;
            assert!(done, "seed {}: unsubscribe not answered", self.seed);
            state.client.lists.remove(&sub.id);
        }
    }
}

async fn run_seed(cluster: &OrdoCluster, seed: u64, n_steps: usize) {
    let _guard = SeedGuard { what: "cluster model", seed, replay: "ORDO_CLUSTER_MODEL_SEED" };
    let mut rng = Rng::new(seed);
    let collection = format!("m{seed}");
    let fields: Vec<Value> = BASE_FIELDS.iter().map(|(name, kind)| json!({"name": name, "type": kind})).collect();
    let creator = rng.index(cluster.len());
    let (status, answer) = request(
        cluster.node(creator).port,
        "PUT",
        &format!("/v1/collections/{collection}"),
        Some(&json!({"fields": fields})),
        TIMEOUT,
    )
    .unwrap();
    assert_eq!(status, 201, "{answer}");
    let mut last_seq = answer["seq"].as_u64().unwrap_or(0);
    // Every node knows the collection before clients subscribe to it there.
    for node in 0..cluster.len() {
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            let path = format!("/v1/collections/{collection}/query");
            let answer = request(cluster.node(node).port, "POST", &path, Some(&json!({"limit": 1})), TIMEOUT).unwrap();
            if answer.0 == 200 {
                last_seq = last_seq.max(answer.1["write_seq"].as_u64().unwrap());
                break;
            }
            assert!(std::time::Instant::now() < deadline, "o{node} never saw {collection}: {answer:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut clients = Vec::new();
    for _ in 0..N_CLIENTS {
        let node = rng.index(cluster.len());
        clients.push(ClientState { client: cluster.node(node).connect().await, node, subs: Vec::new() });
    }
    let model =
        Model { fields: BASE_FIELDS.iter().map(|(name, _)| name.to_string()).collect(), items: BTreeMap::new() };
    let mut run =
        Run { cluster, rng, seed, collection, model, last_seq, clients, next_sub: 0, n_acked: 0, n_conflicts: 0 };
    for _ in 0..N_CLIENTS {
        run.change_subscriptions().await;
    }
    for step in 0..n_steps {
        if run.rng.chance(6) {
            // A schema change goes alone: writes naming the extra field are made
            // against the schema the model has.
            let write = match run.model.extra_field() {
                Some(name) => Write::RemoveField(name.clone()),
                None => Write::AddField { name: format!("x{step}"), default: run.rng.below(10) },
            };
            run.write_step(vec![write], step);
        } else {
            if run.rng.chance(25) {
                run.change_subscriptions().await;
            }
            let n_writes = if run.rng.chance(50) { 1 } else { 2 + run.rng.below(2) };
            let writes = (0..n_writes).map(|_| random_write(&mut run.rng, &run.model)).collect();
            run.write_step(writes, step);
        }
        run.check_nodes(step);
        run.check_clients(step).await;
    }
    assert!(run.n_acked > n_steps / 2, "seed {seed}: only {} writes acknowledged", run.n_acked);
    eprintln!(
        "cluster model seed {seed}: {n_steps} steps, {} writes acknowledged, {} conflicts, {} items",
        run.n_acked,
        run.n_conflicts,
        run.model.items.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_and_every_client_list_equal_the_single_node_model() {
    // The nodes publish differently: one entry per message; packs of whatever
    // is waiting; batches that wait 5 ms for more, one at a time.
    let cluster = OrdoCluster::start_each(
        3,
        &[&["--coalesce-entries", "1"], &[], &["--coalesce-wait-us", "5000", "--coalesce-in-flight", "1"]],
    );
    let n_steps = env_number("ORDO_CLUSTER_MODEL_STEPS", 40) as usize;
    if let Ok(seed) = std::env::var("ORDO_CLUSTER_MODEL_SEED") {
        run_seed(&cluster, seed.parse().unwrap(), n_steps).await;
        return;
    }
    for seed in 1..=env_number("ORDO_CLUSTER_MODEL_SEEDS", 2) {
        run_seed(&cluster, seed, n_steps).await;
    }
}
