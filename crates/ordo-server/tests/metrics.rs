//! `/metrics` figures that are not counters of traffic: the checkpoint lag and
//! the stage histograms, on a real server.

mod common;

use common::{room_schema, Server};
use serde_json::json;

#[test]
fn checkpoint_lag_counts_the_batches_only_the_log_holds() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    // Creating a collection checkpoints first, so the lag starts at 0.
    server.ok("PUT", "/v1/collections/rooms", room_schema());
    assert_eq!(server.metric("ordo_checkpoint_lag_batches"), 0.0);
    for n in 0..3 {
        let op = json!({"op": "upsert", "id": format!("!r{n}"), "fields": {"recency": n}});
        server.ok("POST", "/v1/collections/rooms/batch", json!({"ops": [op]}));
    }
    // The default interval is 60 s: all three are in the log only.
    assert_eq!(server.metric("ordo_checkpoint_lag_batches"), 3.0);
    // Each write went through every stage once.
    assert_eq!(server.metric("ordo_stage_seconds_count{stage=\"log_append\"}"), 3.0);
    assert_eq!(server.metric("ordo_stage_seconds_count{stage=\"write_queue\"}"), 3.0);
    // A graceful stop checkpoints: the next start replays nothing.
    server.stop();
    let server = Server::start(dir.path(), &[]);
    assert_eq!(server.metric("ordo_checkpoint_lag_batches"), 0.0);
    assert_eq!(server.metric("ordo_last_seq"), 3.0);
    server.stop();
}

/// The signal handlers are in place before the address is printed: a SIGINT
/// or SIGTERM that comes at once still stops the server gracefully (it used to
/// kill it when it won the race with the handler's installation).
#[test]
fn a_signal_right_after_the_address_is_printed_stops_the_server_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..10 {
        Server::start(dir.path(), &[]).stop();
    }
    let mut server = Server::start(dir.path(), &[]);
    // SAFETY: `kill` with the pid of a child we own and a valid signal number.
    unsafe { libc::kill(server.pid() as i32, libc::SIGTERM) };
    let status = server.wait();
    assert!(status.success(), "ordo exited with {status}");
}
