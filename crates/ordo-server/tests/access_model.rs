//! The access rules against a naive model, on a real server: seeded users with
//! random rules try to reach other users' collections and rows (by filter, by
//! sort, by windows past the end, by projection, by changing the view of a live
//! subscription, by one-shot queries and item reads, by resuming someone else's
//! session) while a writer changes the data. After every step, every frame any
//! user received holds only items that user may see, every window equals the
//! reference computed over the items the user may see (filter, sort, slice,
//! projection), and every forbidden attempt got `forbidden`. Readers may also
//! write their own documents (`owner == $sub`): their batches repeat ids,
//! remove and upsert again, increment, try to plant or take items, and
//! sometimes give a key twice; the model decides each batch op by op against
//! the state the earlier ops leave.
//!
//! `ORDO_ACCESS_MODEL_SEEDS` and `ORDO_ACCESS_MODEL_STEPS` run it longer.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{mint, write_secret, Client, LocalList, Rng, Server};
use serde_json::{json, Value};

const SETTLE: Duration = Duration::from_secs(5);
const USERS: [&str; 4] = ["u0", "u1", "u2", "u3"];
const TEAMS: [&str; 2] = ["red", "blue"];
const TITLES: [&str; 6] = ["alpha", "Beta", "gamma", "alps", "delta", "beta"];

/// How readers may read `docs` in this seed.
#[derive(Clone, Copy, Debug)]
enum DocsRule {
    Owner,
    Team,
    OwnerOrTeam,
}

/// One document: `owner` and `team` never change for an id (so what a user may
/// see of an id never changes either, and a frame can be checked on its own).
#[derive(Clone, Debug)]
struct Doc {
    owner: &'static str,
    team: &'static str,
    score: i64,
    title: &'static str,
}

struct World {
    rule: DocsRule,
    teams: BTreeMap<&'static str, &'static str>,
    docs: BTreeMap<String, Doc>,
    /// `lists/{user}`: id → (score, title).
    lists: BTreeMap<&'static str, BTreeMap<String, (i64, &'static str)>>,
}

impl World {
    fn may_see_doc(&self, user: &str, doc: &Doc) -> bool {
        let own = doc.owner == user;
        let team = doc.team == self.teams[user];
        match self.rule {
            DocsRule::Owner => own,
            DocsRule::Team => team,
            DocsRule::OwnerOrTeam => own || team,
        }
    }

    /// Whether `user` may ever see item `id` of `collection` (ids keep their owner and team).
    fn may_see(
        &self,
        user: &str,
        collection: &str,
        id: &str,
        doc_owner_team: &BTreeMap<String, (&'static str, &'static str)>,
    ) -> bool {
        match collection.strip_prefix("lists/") {
            Some(owner) => owner == user,
            None => doc_owner_team.get(id).is_some_and(|(owner, team)| {
                let doc = Doc { owner, team, score: 0, title: "" };
                self.may_see_doc(user, &doc)
            }),
        }
    }

    /// The rows of `collection` that `user` may read, as (id, fields) with every field.
    fn readable(&self, user: &str, collection: &str) -> Vec<(String, Value)> {
        match collection.strip_prefix("lists/") {
            Some(owner) if owner == user => self.lists[owner]
                .iter()
                .map(|(id, (score, title))| (id.clone(), json!({"score": score, "title": title})))
                .collect(),
            Some(_) => Vec::new(),
            None => self
                .docs
                .iter()
                .filter(|(_, doc)| self.may_see_doc(user, doc))
                .map(|(id, doc)| {
                    (id.clone(), json!({"owner": doc.owner, "team": doc.team, "score": doc.score, "title": doc.title}))
                })
                .collect(),
        }
    }

    /// The window `sub` as `user` must see it: the naive join of rule, filter, sort, slice, projection.
    fn reference(&self, user: &str, sub: &Value) -> (Vec<Value>, usize) {
        let collection = sub["collection"].as_str().unwrap();
        let mut rows: Vec<(String, Value)> =
            self.readable(user, collection).into_iter().filter(|(_, fields)| matches(&sub["filter"], fields)).collect();
        rows.sort_by(|(a_id, a), (b_id, b)| {
            for key in sub["sort"].as_array().unwrap() {
                let field = key["field"].as_str().unwrap();
                let ordering = compare(&a[field], &b[field]);
                let ordering = if key["dir"] == "desc" { ordering.reverse() } else { ordering };
                if ordering.is_ne() {
                    return ordering;
                }
            }
            a_id.as_bytes().cmp(b_id.as_bytes())
        });
        let total = rows.len();
        let offset = sub["offset"].as_u64().unwrap() as usize;
        let limit = sub["limit"].as_u64().unwrap() as usize;
        let items = rows
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|(id, fields)| {
                let order: Vec<&str> = match sub["fields"].as_array() {
                    Some(names) => names.iter().map(|name| name.as_str().unwrap()).collect(),
                    None if collection.starts_with("lists/") => vec!["score", "title"],
                    None => vec!["owner", "team", "score", "title"],
                };
                let projected: serde_json::Map<String, Value> =
                    order.iter().map(|name| (name.to_string(), fields[*name].clone())).collect();
                json!({"id": id, "fields": projected, "payload": null})
            })
            .collect();
        (items, total)
    }
}

/// Items without their `version`, which every item the server sends carries.
fn unversioned(items: &[Value]) -> Vec<Value> {
    let mut items = items.to_vec();
    for item in &mut items {
        assert!(item.as_object_mut().unwrap().remove("version").is_some_and(|v| v.is_u64()), "{item}");
    }
    items
}

fn compare(a: &Value, b: &Value) -> std::cmp::Ordering {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => a.as_i64().cmp(&b.as_i64()),
        (Value::String(a), Value::String(b)) => a.as_bytes().cmp(b.as_bytes()),
        _ => panic!("no nulls in this model: {a} {b}"),
    }
}

fn matches(filter: &Value, fields: &Value) -> bool {
    if filter.is_null() {
        return true;
    }
    if let Some(list) = filter.get("any") {
        return list.as_array().unwrap().iter().any(|child| matches(child, fields));
    }
    let value = &fields[filter["field"].as_str().unwrap()];
    if value.is_null() {
        return false; // a filter on a field the collection lacks is refused before this
    }
    if let Some(prefix) = filter.get("prefix") {
        return value.as_str().unwrap().to_lowercase().starts_with(&prefix.as_str().unwrap().to_lowercase());
    }
    let ordering = compare(value, &filter["value"]);
    match filter["op"].as_str().unwrap() {
        "eq" => ordering.is_eq(),
        "gt" => ordering.is_gt(),
        "le" => ordering.is_le(),
        other => panic!("op {other}"),
    }
}

fn random_filter(rng: &mut Rng, collection: &str) -> Value {
    let lists = collection.starts_with("lists/");
    match rng.below(if lists { 4 } else { 7 }) {
        0 => Value::Null,
        1 => json!({"field": "score", "op": "gt", "value": rng.below(15) as i64 - 2}),
        2 => json!({"field": "title", "prefix": *rng.pick(&["al", "b", "g", "x"])}),
        3 => {
            json!({"any": [{"field": "score", "op": "le", "value": 3}, {"field": "title", "op": "eq", "value": *rng.pick(&TITLES)}]})
        }
        // Trying to reach other users' rows by naming them.
        4 => json!({"field": "owner", "op": "eq", "value": *rng.pick(&USERS)}),
        5 => json!({"field": "team", "op": "eq", "value": *rng.pick(&TEAMS)}),
        _ => {
            json!({"any": [{"field": "owner", "op": "eq", "value": *rng.pick(&USERS)}, {"field": "score", "op": "gt", "value": 100}]})
        }
    }
}

fn random_sort(rng: &mut Rng, collection: &str) -> Value {
    let lists = collection.starts_with("lists/");
    match rng.below(if lists { 3 } else { 5 }) {
        0 => json!([]),
        1 => json!([{"field": "score", "dir": "desc"}]),
        2 => json!([{"field": "title", "dir": "asc"}, {"field": "score", "dir": "desc"}]),
        // Sorting by who owns a row must not bring other users' rows in.
        3 => json!([{"field": "owner", "dir": "asc"}]),
        _ => json!([{"field": "team", "dir": "desc"}, {"field": "score", "dir": "asc"}]),
    }
}

struct User {
    name: &'static str,
    token: String,
    client: Client,
    /// Live subscriptions: id → definition (as in `subscribe`, without `op`).
    subs: BTreeMap<String, Value>,
}

struct Model {
    server: Server,
    world: World,
    users: Vec<User>,
    writer: String,
    rng: Rng,
    next_sub: usize,
    next_doc: usize,
    /// Every doc id ever written, with its fixed owner and team.
    doc_owner_team: BTreeMap<String, (&'static str, &'static str)>,
    seed: u64,
}

impl Model {
    /// Reads frames until every list of `user` equals its reference; every item
    /// in every diff read on the way must be one the user may see.
    async fn settle(&mut self, index: usize, step: usize) {
        let context = format!("seed {} step {step} user {}", self.seed, self.users[index].name);
        let expected: BTreeMap<String, Vec<Value>> = self.users[index]
            .subs
            .iter()
            .map(|(id, sub)| (id.clone(), self.world.reference(self.users[index].name, sub).0))
            .collect();
        let user = &mut self.users[index];
        let deadline = std::time::Instant::now() + SETTLE;
        loop {
            // The model keeps no versions: items are compared without them (the test
            // client checks each frame's digest, versions included, against its list).
            let done = expected
                .iter()
                .all(|(id, items)| user.client.lists.get(id).is_some_and(|list| &unversioned(&list.items) == items));
            if done {
                return;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let frame = match user.client.next_json(left.max(Duration::from_millis(1))).await {
                Some(frame) if !left.is_zero() => frame,
                _ => {
                    let got: BTreeMap<&String, Option<&Vec<Value>>> =
                        expected.keys().map(|id| (id, user.client.lists.get(id).map(|list| &list.items))).collect();
                    panic!(
                        "{context}: lists never matched\n got      {got:?}\n expected {expected:?}\n subs {:?}",
                        user.subs
                    );
                }
            };
            if frame["type"] == "error" {
                panic!("{context}: unexpected error {frame}");
            }
            for frame in std::mem::take(&mut user.client.diffs_seen) {
                let sub = frame["sub"].as_str().unwrap();
                let collection = user.subs.get(sub).map(|def| def["collection"].as_str().unwrap().to_owned());
                let Some(collection) = collection else { continue };
                for diff in frame["diffs"].as_array().unwrap() {
                    let body = diff.as_object().unwrap().values().next().unwrap();
                    let values: Vec<&Value> = match (body.get("value"), body.get("values")) {
                        (Some(value), _) => vec![value],
                        (_, Some(Value::Array(values))) => values.iter().collect(),
                        _ => vec![],
                    };
                    for item in values {
                        let id = item["id"].as_str().unwrap();
                        assert!(
                            self.world.may_see(user.name, &collection, id, &self.doc_owner_team),
                            "{context}: received {item} of {collection}, which it may not see"
                        );
                    }
                }
            }
        }
    }

    async fn settle_all(&mut self, step: usize) {
        for index in 0..self.users.len() {
            self.settle(index, step).await;
        }
    }

    fn random_collection(&mut self, user: &str) -> String {
        match self.rng.below(10) {
            0..=4 => "docs".to_owned(),
            5..=6 => format!("lists/{user}"),
            7..=8 => format!("lists/{}", self.rng.pick(&USERS)),
            _ => "_ordo/rules".to_owned(),
        }
    }

    fn allowed(&self, user: &str, collection: &str) -> bool {
        collection == "docs" || collection == format!("lists/{user}")
    }

    async fn write(&mut self) {
        let n_ops = 1 + self.rng.below(5);
        let (collection, ops) = if self.rng.chance(70) {
            let mut ops = Vec::new();
            for _ in 0..n_ops {
                let id = if self.next_doc == 0 || self.rng.chance(35) {
                    self.next_doc += 1;
                    format!("d{:03}", self.next_doc)
                } else {
                    format!("d{:03}", 1 + self.rng.below(self.next_doc as u64))
                };
                let (owner, team) = *self
                    .doc_owner_team
                    .entry(id.clone())
                    .or_insert_with(|| (*self.rng.pick(&USERS), *self.rng.pick(&TEAMS)));
                if self.world.docs.contains_key(&id) && self.rng.chance(20) {
                    self.world.docs.remove(&id);
                    ops.push(json!({"op": "remove", "id": id}));
                } else if self.world.docs.contains_key(&id) && self.rng.chance(50) {
                    let score = self.rng.below(20) as i64 - 3;
                    self.world.docs.get_mut(&id).unwrap().score = score;
                    ops.push(json!({"op": "upsert", "id": id, "fields": {"score": score}}));
                } else {
                    let doc = Doc {
                        owner,
                        team,
                        score: self.rng.below(20) as i64 - 3,
                        title: TITLES[self.rng.index(TITLES.len())],
                    };
                    ops.push(json!({"op": "upsert", "id": id, "fields": {"owner": owner, "team": team, "score": doc.score, "title": doc.title}}));
                    self.world.docs.insert(id, doc);
                }
            }
            ("docs".to_owned(), ops)
        } else {
            let owner = *self.rng.pick(&USERS);
            let mut ops = Vec::new();
            for _ in 0..n_ops {
                let id = format!("l{}", self.rng.below(12));
                let list = self.world.lists.get_mut(owner).unwrap();
                if list.contains_key(&id) && self.rng.chance(25) {
                    list.remove(&id);
                    ops.push(json!({"op": "remove", "id": id}));
                } else {
                    let entry = (self.rng.below(10) as i64, *self.rng.pick(&TITLES));
                    list.insert(id.clone(), entry);
                    ops.push(json!({"op": "upsert", "id": id, "fields": {"score": entry.0, "title": entry.1}}));
                }
            }
            (format!("lists/{owner}"), ops)
        };
        let path = format!("/v1/collections/{}/batch", collection.replace('/', "%2F"));
        let (status, answer) = self.server.http_as(Some(&self.writer), "POST", &path, Some(&json!({"ops": ops})));
        assert_eq!(status, 200, "seed {}: the writer's batch: {answer}", self.seed);
    }

    /// A reader's batch on `docs` under its write rule (`owner == $sub`): ops
    /// on its own, other users' and new ids, often the same id several times.
    /// The model applies the ops one by one; the server must accept the batch
    /// exactly when no op touches or leaves an item outside the rule, and then
    /// hold what the model holds.
    async fn reader_write(&mut self, index: usize, step: usize) {
        let name = self.users[index].name;
        let mut ids: Vec<String> = Vec::new();
        for _ in 0..1 + self.rng.below(2) {
            let id = if self.next_doc == 0 || self.rng.chance(30) {
                self.next_doc += 1;
                let id = format!("d{:03}", self.next_doc);
                self.doc_owner_team.insert(id.clone(), (name, *self.rng.pick(&TEAMS)));
                id
            } else {
                format!("d{:03}", 1 + self.rng.below(self.next_doc as u64))
            };
            ids.push(id);
        }
        let mut staged = self.world.docs.clone();
        let mut accepted = true;
        let mut ops = Vec::new();
        for _ in 0..1 + self.rng.below(4) {
            let id = self.rng.pick(&ids).clone();
            let (owner, team) = self.doc_owner_team[&id];
            if staged.get(&id).is_some_and(|doc| doc.owner != name) {
                accepted = false;
            }
            let score = self.rng.below(20) as i64 - 3;
            let title = *self.rng.pick(&TITLES);
            match self.rng.below(5) {
                0 => {
                    staged.remove(&id);
                    ops.push(json!({"op": "remove", "id": id}));
                }
                1 => {
                    // No owner: only an item that exists (as the batch left it) keeps one.
                    match staged.get_mut(&id) {
                        Some(doc) => (doc.score, doc.title) = (score, title),
                        None => accepted = false,
                    }
                    ops.push(json!({"op": "upsert", "id": id, "fields": {"score": score, "title": title}}));
                }
                2 => {
                    match staged.get_mut(&id) {
                        Some(doc) => doc.score += 1,
                        None => accepted = false,
                    }
                    ops.push(json!({"op": "upsert", "id": id, "increment": {"score": 1}}));
                }
                3 => {
                    // Planting an item for someone else, or giving one away.
                    let other = *self.rng.pick(&USERS);
                    accepted &= other == name && owner == name;
                    staged.insert(id.clone(), Doc { owner: other, team, score, title });
                    ops.push(json!({"op": "upsert", "id": id, "fields": {"owner": other, "team": team, "score": score, "title": title}}));
                }
                _ => {
                    accepted &= owner == name;
                    staged.insert(id.clone(), Doc { owner, team, score, title });
                    ops.push(json!({"op": "upsert", "id": id, "fields": {"owner": owner, "team": team, "score": score, "title": title}}));
                }
            }
        }
        let token = self.users[index].token.clone();
        let body = json!({"ops": ops});
        let context = format!("seed {} step {step} user {name} batch {body}", self.seed);
        let text = body.to_string();
        if let Some(at) = text.find("\"fields\":{").filter(|_| self.rng.chance(25)) {
            // A key given twice (the rule's `owner` when the op sets it): one
            // parse, one meaning, so the whole batch is refused, whatever the copies say.
            let at = at + "\"fields\":{".len();
            let repeated = if text[at..].split('}').next().is_some_and(|fields| fields.contains("\"owner\"")) {
                format!("\"owner\":\"{}\",", self.rng.pick(&USERS))
            } else {
                "\"score\":0,".to_owned()
            };
            let text = format!("{}{repeated}{}", &text[..at], &text[at..]);
            let auth = format!("Authorization: Bearer {token}\r\n");
            let (status, answer) =
                self.server.http_with("POST", "/v1/collections/docs/batch", &auth, Some(text.as_bytes()));
            let answer: Value = serde_json::from_slice(&answer).unwrap();
            assert_eq!(
                (status, answer["error"]["code"].as_str()),
                (400, Some("bad_json")),
                "{context} {text}: {answer}"
            );
            return;
        }
        let (status, answer) = self.server.http_as(Some(&token), "POST", "/v1/collections/docs/batch", Some(&body));
        if accepted {
            assert_eq!(status, 200, "{context}: {answer}");
            self.world.docs = staged;
        } else {
            assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{context}: {answer}");
        }
    }

    async fn subscribe(&mut self, index: usize) {
        let name = self.users[index].name;
        let collection = self.random_collection(name);
        self.next_sub += 1;
        let id = format!("s{}", self.next_sub);
        let mut sub = json!({
            "sub": id, "collection": collection, "filter": random_filter(&mut self.rng, &collection),
            "sort": random_sort(&mut self.rng, &collection),
            "offset": if self.rng.chance(15) { 50 } else { self.rng.below(4) }, "limit": 1 + self.rng.below(7),
        });
        if self.rng.chance(30) {
            sub["fields"] = json!(["score"]);
        }
        let mut message = sub.clone();
        message["op"] = json!("subscribe");
        let allowed = self.allowed(name, &collection);
        let user = &mut self.users[index];
        user.client.send(message).await;
        if allowed {
            user.subs.insert(id, sub);
        } else {
            let error = user.client.expect_error().await;
            assert_eq!(
                (error["code"].as_str(), error["sub"].as_str()),
                (Some("forbidden"), Some(id.as_str())),
                "{error}"
            );
        }
    }

    async fn set_view(&mut self, index: usize) {
        let Some(id) = self.pick_sub(index) else { return };
        let collection = self.users[index].subs[&id]["collection"].as_str().unwrap().to_owned();
        let filter = random_filter(&mut self.rng, &collection);
        let sort = random_sort(&mut self.rng, &collection);
        let user = &mut self.users[index];
        user.client.send(json!({"op": "set_view", "sub": id, "filter": filter, "sort": sort})).await;
        let sub = user.subs.get_mut(&id).unwrap();
        sub["filter"] = filter;
        sub["sort"] = sort;
    }

    async fn set_range(&mut self, index: usize) {
        let Some(id) = self.pick_sub(index) else { return };
        let offset = if self.rng.chance(20) { 40 } else { self.rng.below(5) };
        let limit = 1 + self.rng.below(8);
        let user = &mut self.users[index];
        user.client.send(json!({"op": "set_range", "sub": id, "offset": offset, "limit": limit})).await;
        let sub = user.subs.get_mut(&id).unwrap();
        sub["offset"] = json!(offset);
        sub["limit"] = json!(limit);
    }

    fn pick_sub(&mut self, index: usize) -> Option<String> {
        let ids: Vec<String> = self.users[index].subs.keys().cloned().collect();
        (!ids.is_empty()).then(|| self.rng.pick(&ids).clone())
    }

    /// A one-shot query and an item read, compared with the model.
    fn query(&mut self, index: usize, step: usize) {
        let name = self.users[index].name;
        let collection = self.random_collection(name);
        let sub = json!({
            "collection": collection, "filter": random_filter(&mut self.rng, &collection),
            "sort": random_sort(&mut self.rng, &collection), "offset": self.rng.below(3), "limit": 1 + self.rng.below(9),
        });
        let path = format!("/v1/collections/{}/query", collection.replace('/', "%2F"));
        let body =
            json!({"filter": sub["filter"], "sort": sub["sort"], "offset": sub["offset"], "limit": sub["limit"]});
        let token = self.users[index].token.clone();
        let (status, answer) = self.server.http_as(Some(&token), "POST", &path, Some(&body));
        let context = format!("seed {} step {step} user {name} query {sub}", self.seed);
        if !self.allowed(name, &collection) {
            assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{context}: {answer}");
            return;
        }
        assert_eq!(status, 200, "{context}: {answer}");
        let (items, total) = self.world.reference(name, &sub);
        // Query items carry their version (the model keeps none; `tests/writes.rs` checks versions).
        let mut answered = answer["items"].clone();
        for item in answered.as_array_mut().into_iter().flatten() {
            assert!(item.as_object_mut().unwrap().remove("version").is_some_and(|v| v.is_u64()), "{context}: {item}");
        }
        assert_eq!(answered, json!(items), "{context}");
        assert_eq!(answer["total"], total, "{context}: the total counts only what the user may see");

        // An item by id: visible ones read, others are "not found", whoever owns them.
        if let Some(id) = (self.next_doc > 0).then(|| format!("d{:03}", 1 + self.rng.below(self.next_doc as u64))) {
            let (status, answer) =
                self.server.http_as(Some(&token), "GET", &format!("/v1/collections/docs/items/{id}"), None);
            let visible = self.world.docs.get(&id).is_some_and(|doc| self.world.may_see_doc(name, doc));
            assert_eq!(status, if visible { 200 } else { 404 }, "{context}: item {id}: {answer}");
        }
        // The collection's size would tell how many rows the rule hides.
        let (status, answer) = self.server.http_as(Some(&token), "GET", "/v1/collections/docs", None);
        assert_eq!((status, answer.get("items")), (200, None), "{context}: {answer}");
    }

    /// Drops the connection; another user may then present its session (refused
    /// as unknown: a reset under the thief's own rules); then the owner resumes.
    async fn reconnect(&mut self, index: usize, step: usize) {
        let token = self.users[index].token.clone();
        let fresh = self.server.connect_as(Some(&token)).await;
        let old = std::mem::replace(&mut self.users[index].client, fresh);
        let session = old.session.clone();
        let lists = old.lists.clone();
        drop(old);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let subs = self.users[index].subs.clone();
        if self.rng.chance(40) && !subs.is_empty() {
            let thief = (index + 1 + self.rng.index(USERS.len() - 1)) % USERS.len();
            let entries = resume_entries(&subs, &lists);
            let thief_token = self.users[thief].token.clone();
            let mut client = self.server.connect_as(Some(&thief_token)).await;
            client.lists = lists.clone();
            client.send(json!({"op": "resume", "session": session, "subs": entries})).await;
            assert!(client.read_until(SETTLE, |c| c.frames.iter().any(|f| f["type"] == "resumed")).await);
            let resumed = client.frames.iter().find(|f| f["type"] == "resumed").unwrap().clone();
            let thief_name = self.users[thief].name;
            for outcome in resumed["subs"].as_array().unwrap() {
                let id = outcome["sub"].as_str().unwrap();
                let collection = subs[id]["collection"].as_str().unwrap();
                if self.allowed(thief_name, collection) {
                    assert_eq!(
                        outcome["reset"], true,
                        "seed {} step {step}: another identity's session replayed: {resumed}",
                        self.seed
                    );
                } else {
                    assert_eq!(outcome["error"]["code"], "forbidden", "seed {} step {step}: {resumed}", self.seed);
                }
            }
            // What the thief holds now is its own view of those definitions.
            let mut thief_user = User { name: thief_name, token: thief_token, client, subs: BTreeMap::new() };
            for (id, sub) in &subs {
                if self.allowed(thief_name, sub["collection"].as_str().unwrap()) {
                    thief_user.subs.insert(id.clone(), sub.clone());
                }
            }
            let real = std::mem::replace(&mut self.users[thief], thief_user);
            self.settle(thief, step).await;
            let stolen = std::mem::replace(&mut self.users[thief], real);
            drop(stolen);
        }
        let entries = resume_entries(&subs, &lists);
        let user = &mut self.users[index];
        user.client.lists = lists;
        user.client.send(json!({"op": "resume", "session": session, "subs": entries})).await;
        assert!(user.client.read_until(SETTLE, |c| c.frames.iter().any(|f| f["type"] == "resumed")).await);
        let resumed = user.client.frames.iter().rev().find(|f| f["type"] == "resumed").unwrap().clone();
        assert_ne!(resumed["session"], json!(session), "a resume issues a new session token");
        user.client.session = resumed["session"].as_str().unwrap().to_owned();
    }
}

fn resume_entries(subs: &BTreeMap<String, Value>, lists: &BTreeMap<String, LocalList>) -> Vec<Value> {
    subs.iter()
        .map(|(id, sub)| {
            let mut entry = sub.clone();
            entry["last_seq"] = json!(lists.get(id).map_or(0, |list| list.seq));
            entry
        })
        .collect()
}

async fn run_seed(seed: u64, n_steps: usize) {
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let secret = write_secret(dir.path());
    let mut server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret.to_str().unwrap()]);
    server.token = Some(mint(&secret, "ops", "admin", &[]));
    let rule = *rng.pick(&[DocsRule::Owner, DocsRule::Team, DocsRule::OwnerOrTeam]);
    let owner = json!({"field": "owner", "op": "eq", "value": "$sub"});
    let team = json!({"field": "team", "op": "eq", "value": "$team"});
    let mut rules = vec![
        json!({"collection": "lists/{sub}", "roles": ["reader"], "read": true}),
        json!({"collection": "docs", "roles": ["writer"], "write": true}),
        json!({"collection": "docs", "roles": ["reader"], "write": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}}),
        json!({"collection": "lists/*", "roles": ["writer"], "write": true}),
    ];
    match rule {
        DocsRule::Owner => rules.push(json!({"collection": "docs", "roles": ["reader"], "read": {"filter": owner}})),
        DocsRule::Team => rules.push(json!({"collection": "docs", "roles": ["reader"], "read": {"filter": team}})),
        DocsRule::OwnerOrTeam => {
            rules.push(json!({"collection": "docs", "roles": ["reader"], "read": {"filter": owner}}));
            rules.push(json!({"collection": "docs", "roles": ["reader"], "read": {"filter": team}}));
        }
    }
    server.ok("PUT", "/v1/rules", json!({"rules": rules}));
    server.ok(
        "PUT",
        "/v1/collections/docs",
        json!({"fields": [{"name": "owner", "type": "string"}, {"name": "team", "type": "string"},
                          {"name": "score", "type": "i64"}, {"name": "title", "type": "string"}]}),
    );
    for user in USERS {
        server.ok(
            "PUT",
            &format!("/v1/collections/lists%2F{user}"),
            json!({"fields": [{"name": "score", "type": "i64"}, {"name": "title", "type": "string"}]}),
        );
    }
    let teams: BTreeMap<&'static str, &'static str> = USERS.iter().map(|user| (*user, *rng.pick(&TEAMS))).collect();
    let mut users = Vec::new();
    for name in USERS {
        let token = mint(&secret, name, "reader", &["--claim", &format!("team={}", teams[name])]);
        let client = server.connect_as(Some(&token)).await;
        users.push(User { name, token, client, subs: BTreeMap::new() });
    }
    let writer = mint(&secret, "svc", "writer", &[]);
    let world = World {
        rule,
        teams,
        docs: BTreeMap::new(),
        lists: USERS.iter().map(|user| (*user, BTreeMap::new())).collect(),
    };
    let mut model =
        Model { server, world, users, writer, rng, next_sub: 0, next_doc: 0, doc_owner_team: BTreeMap::new(), seed };
    for step in 0..n_steps {
        let index = model.rng.index(USERS.len());
        match model.rng.below(100) {
            0..=29 => model.write().await,
            30..=39 => model.reader_write(index, step).await,
            40..=54 => model.subscribe(index).await,
            55..=64 => model.set_view(index).await,
            65..=74 => model.set_range(index).await,
            75..=89 => model.query(index, step),
            _ => model.reconnect(index, step).await,
        }
        model.settle_all(step).await;
    }
    let users = std::mem::take(&mut model.users);
    drop(users);
    model.server.stop();
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_see_only_what_their_rules_allow_whatever_they_try() {
    let n_seeds = env_number("ORDO_ACCESS_MODEL_SEEDS", 3);
    let n_steps = env_number("ORDO_ACCESS_MODEL_STEPS", 80);
    for seed in 0..n_seeds as u64 {
        run_seed(seed + 1, n_steps).await;
    }
}
