//! The collection every window is on: `board`, items in groups, each group's
//! first item (`t<group>`) the one updates move; and the writes that move it.

use hyper::Method;
use ordo_bench::live::http::{HttpConnection, HttpReply};
use ordo_bench::live::{Result, MAX_OPS_PER_REQUEST};

const SCHEMA: &[u8] =
    br#"{"fields":[{"name":"group","type":"u64"},{"name":"score","type":"i64"},{"name":"trickle_n","type":"u64"}]}"#;
const BATCH_PATH: &str = "/v1/collections/board/batch";
/// A group's moving item scores above every other, so it is first in its window.
const TOP_SCORE: i64 = 1 << 60;
/// `"trickle_n":` in a frame: what a holder looks for.
pub const NUMBER_MARKER: &[u8] = b"\"trickle_n\":";

/// The `subscribe` message of a connection watching `group`.
pub fn subscribe_message(group: usize, window: usize) -> Vec<u8> {
    format!(
        r#"{{"op":"subscribe","sub":"s","collection":"board","filter":{{"field":"group","op":"eq","value":{group}}},"sort":[{{"field":"score","dir":"desc"}}],"offset":0,"limit":{window}}}"#
    )
    .into_bytes()
}

/// Creates `board` and writes `groups × items_per_group` items.
pub async fn load(http: &mut HttpConnection, groups: usize, items_per_group: usize) -> Result<()> {
    expect_ok(http.request(Method::PUT, "/v1/collections/board", SCHEMA.to_vec(), None).await?, "create `board`")?;
    let ops: Vec<String> =
        (0..groups).flat_map(|group| (0..items_per_group).map(move |item| item_op(group, item))).collect();
    for chunk in ops.chunks(MAX_OPS_PER_REQUEST) {
        let body = format!(r#"{{"ops":[{}]}}"#, chunk.join(","));
        expect_ok(http.request(Method::POST, BATCH_PATH, body.into_bytes(), None).await?, "load `board`")?;
    }
    Ok(())
}

fn item_op(group: usize, item: usize) -> String {
    if item == 0 {
        return move_op(group, 0);
    }
    format!(r#"{{"op":"upsert","id":"g{group}-{item}","fields":{{"group":{group},"score":{item},"trickle_n":0}}}}"#)
}

/// The upsert that gives `group`'s first item the update number `number`.
fn move_op(group: usize, number: u64) -> String {
    format!(
        r#"{{"op":"upsert","id":"t{group}","fields":{{"group":{group},"score":{TOP_SCORE},"trickle_n":{number}}}}}"#
    )
}

/// Writes each `(group, number)` in one request.
pub async fn move_items(http: &mut HttpConnection, moves: &[(usize, u64)]) -> Result<()> {
    for chunk in moves.chunks(MAX_OPS_PER_REQUEST) {
        let ops: Vec<String> = chunk.iter().map(|&(group, number)| move_op(group, number)).collect();
        let body = format!(r#"{{"ops":[{}]}}"#, ops.join(","));
        expect_ok(http.request(Method::POST, BATCH_PATH, body.into_bytes(), None).await?, "update")?;
    }
    Ok(())
}

pub fn expect_ok(reply: HttpReply, what: &str) -> Result<()> {
    if (200..300).contains(&reply.status) {
        return Ok(());
    }
    Err(format!("{what}: {} {}", reply.status, reply.text()).into())
}
