//! `ordo load-demo`: fills a running server with a chat app's room list, through
//! the public HTTP API, so that a newcomer has something to subscribe to.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use serde_json::{json, Value};

/// Rooms per request: well inside `MAX_OPS_PER_REQUEST`.
const ROOMS_PER_BATCH: usize = 2_000;

pub fn load_demo(address: &str, n_rooms: usize) -> Result<(), String> {
    let started = Instant::now();
    let schema = json!({"fields": [
        {"name": "name", "type": "string"},
        {"name": "recency", "type": "u64"},
        {"name": "unread", "type": "u64"},
        {"name": "dm", "type": "bool"},
        {"name": "favourite", "type": "bool"},
    ]});
    let (status, answer) = request(address, "PUT", "/v1/collections/rooms", &schema)?;
    if status >= 300 {
        return Err(format!("creating `rooms` failed: {status} {answer}"));
    }
    let first_names =
        ["Alice", "Bob", "Chloé", "Dmitri", "Émile", "Fatima", "Günther", "Hana", "Ivan", "Józef", "Kenji", "Łucja"];
    let topics = [
        "general", "random", "design", "rust", "ops", "music", "books", "hiking", "café", "release", "bugs", "München",
    ];
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut loaded = 0;
    while loaded < n_rooms {
        let n = ROOMS_PER_BATCH.min(n_rooms - loaded);
        let ops: Vec<Value> = (loaded..loaded + n)
            .map(|index| {
                let dm = next() % 3 == 0;
                let name = if dm {
                    first_names[(next() % first_names.len() as u64) as usize].to_owned()
                } else {
                    format!("{} {index}", topics[(next() % topics.len() as u64) as usize])
                };
                json!({"op": "upsert", "id": format!("!room{index:06}:example.org"), "fields": {
                    "name": name, "recency": next() % 1_000_000, "unread": if next() % 4 == 0 { next() % 9 } else { 0 },
                    "dm": dm, "favourite": next() % 10 == 0,
                }, "payload": {"last_message": format!("message {} in {index}", next() % 1000)}})
            })
            .collect();
        let (status, answer) = request(address, "POST", "/v1/collections/rooms/batch", &json!({"ops": ops}))?;
        if status >= 300 {
            return Err(format!("writing rooms failed: {status} {answer}"));
        }
        loaded += n;
        eprintln!("ordo load-demo: {loaded} of {n_rooms} rooms");
    }
    println!(
        "ordo load-demo: {n_rooms} rooms in collection `rooms` on {address} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One HTTP/1.1 request on a fresh connection (the demo loader needs nothing more).
fn request(address: &str, method: &str, path: &str, body: &Value) -> Result<(u16, String), String> {
    let body = body.to_string();
    let mut stream = TcpStream::connect(address).map_err(|error| format!("cannot reach {address}: {error}"))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| e.to_string())?;
    let status = response.split(' ').nth(1).and_then(|code| code.parse().ok()).ok_or("a malformed HTTP response")?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body).to_owned();
    Ok((status, body))
}
