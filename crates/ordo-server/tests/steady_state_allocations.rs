//! The hot path allocates nothing once the server runs steadily: every
//! subscription's resume retention is full and recycled frame bodies are idle.
//! Then a write allocates nothing on the writer thread (group commit, engine,
//! frame encoding, fan-out) and its frames allocate nothing on the network
//! threads (envelope, retention, socket write). Counted by the server's own
//! counting allocator, per thread kind, on a real `ordo serve`; the HTTP
//! handling of the writes, which shares the network threads, is counted apart
//! (`ordo_frame_delivery_allocations_total` covers the frames only).

mod common;

use std::time::Duration;

use common::{room_schema, Client, Server};
use serde_json::json;

use ordo_server::limits::RETAINED_FRAMES_PER_SUBSCRIPTION;

/// One collection, one subscription and one window per user, as in chat.
const N_USERS: usize = 4;
/// Rooms per user: more than the window holds, so that each write brings the
/// room written least recently into the window, and every frame has one shape.
const N_ROOMS: usize = 40;
const WINDOW_LIMIT: usize = 10;
/// Writes per user before measuring: every retention ring fills and recycles.
const WARM_UP_WRITES_PER_USER: usize = RETAINED_FRAMES_PER_SUBSCRIPTION + 2 * N_ROOMS;
const MEASURED_WRITES_PER_USER: usize = 100;
const FRAME_WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_stream_of_writes_allocates_nothing_per_batch_and_per_frame() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--durability", "relaxed"]);
    let mut client = server.connect().await;
    for user in 0..N_USERS {
        server.ok("PUT", &format!("/v1/collections/user-{user}"), room_schema());
        let rooms: Vec<_> = (0..N_ROOMS).map(|room| room_upsert(room, room as u64)).collect();
        server.ok("POST", &format!("/v1/collections/user-{user}/batch"), json!({"ops": rooms}));
        client
            .send(json!({"op": "subscribe", "sub": format!("u{user}"), "collection": format!("user-{user}"),
                "filter": null, "sort": [{"field": "recency", "dir": "desc"}], "offset": 0,
                "limit": WINDOW_LIMIT, "fields": null, "payload": false}))
            .await;
    }
    wait_for_frames(&mut client, N_USERS).await;
    let mut recency = N_ROOMS as u64;
    for _ in 0..WARM_UP_WRITES_PER_USER {
        write_round(&server, &mut client, &mut recency).await;
    }
    let before = Counts::read(&server);
    for _ in 0..MEASURED_WRITES_PER_USER {
        write_round(&server, &mut client, &mut recency).await;
    }
    let after = Counts::read(&server);
    let n_writes = (N_USERS * MEASURED_WRITES_PER_USER) as f64;
    assert_eq!(after.batches - before.batches, n_writes, "one batch per write");
    assert_eq!(after.frames_sent - before.frames_sent, n_writes, "one frame per write");
    let writer = after.writer - before.writer;
    let delivery = after.frame_delivery - before.frame_delivery;
    let network = after.network - before.network;
    let misses = after.pool_misses - before.pool_misses;
    println!(
        "over {n_writes} writes in steady state: writer {writer}, frame delivery {delivery}, frame-body pool misses \
         {misses}; network threads in all (the HTTP writes included) {network}, {:.1} per write",
        network / n_writes
    );
    assert_eq!(writer, 0.0, "the writer thread allocated {writer} times over {n_writes} batches");
    assert_eq!(misses, 0.0, "every frame body came from the pool");
    assert_eq!(delivery, 0.0, "the network threads allocated {delivery} times delivering {n_writes} frames");
    server.stop();
}

/// The same room shape every time: fixed-width ids, names and recencies.
fn room_upsert(room: usize, recency: u64) -> serde_json::Value {
    json!({"op": "upsert", "id": format!("!r{room:04}:example.org"),
        "fields": {"recency": 1_000_000 + recency, "name": format!("room {room:04}")}})
}

/// One write per user, each to the room its user wrote least recently, and
/// each one's frame received before the next write: no frame waits in a queue.
async fn write_round(server: &Server, client: &mut Client, recency: &mut u64) {
    for user in 0..N_USERS {
        let room = (*recency % N_ROOMS as u64) as usize;
        server.ok("POST", &format!("/v1/collections/user-{user}/batch"), json!({"ops": [room_upsert(room, *recency)]}));
        wait_for_frames(client, 1).await;
    }
    *recency += 1;
}

/// Reads diff frames until `n` came (the client applies them to its lists).
async fn wait_for_frames(client: &mut Client, n: usize) {
    let came = client.read_until(FRAME_WAIT, |client| client.diffs_seen.len() >= n).await;
    assert!(came, "{} of {n} frames came; other frames: {:?}", client.diffs_seen.len(), client.frames);
    client.diffs_seen.clear();
}

/// The server's counters the test compares.
struct Counts {
    writer: f64,
    network: f64,
    frame_delivery: f64,
    pool_misses: f64,
    batches: f64,
    frames_sent: f64,
}

impl Counts {
    fn read(server: &Server) -> Counts {
        Counts {
            writer: server.metric("ordo_thread_allocations_total{thread=\"writer\"}"),
            network: server.metric("ordo_thread_allocations_total{thread=\"network\"}"),
            frame_delivery: server.metric("ordo_frame_delivery_allocations_total"),
            pool_misses: server.metric("ordo_frame_body_pool_misses_total"),
            batches: server.metric("ordo_batches_total"),
            frames_sent: server.metric("ordo_frames_sent_total"),
        }
    }
}
