//! A terminal room list over the demo server (`make run`): signs in as `alice` through
//! the demo's `POST /demo/token`, shows her 10 most recent rooms, and grows the window
//! by a page every 5 seconds ("load more"), printing each batch of diffs as it comes.
//!
//!     cargo run -p ordo-client --example room_list -- http://127.0.0.1:7070

use std::time::Duration;

use futures_util::StreamExt;
use ordo_client::{Auth, Client, Item, Method, VectorDiff, View};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Debug, Clone, Deserialize)]
struct Room {
    name: String,
    unread: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "http://127.0.0.1:7070".to_owned());
    // The demo hands out reader tokens; a real app asks its own backend.
    let signer = Client::builder(url.clone()).build();
    let provider_signer = signer.http().clone();
    let auth = Auth::provider(move || {
        let http = provider_signer.clone();
        async move {
            let answer: Value = http
                .call(Method::POST, "/demo/token", Some(json!({"user": "alice"})))
                .await
                .map_err(|e| e.to_string())?;
            answer["token"].as_str().map(str::to_owned).ok_or_else(|| "no token in the answer".to_owned())
        }
    });
    let client = Client::builder(url).auth(auth).build();
    let view = View::new().sort(json!([{"field": "recency", "dir": "desc"}])).range(0, 10);
    let rooms = client.subscribe::<Item<Room>>("rooms", view)?;
    let (mut shown, mut entries, pages) = rooms.entries_with_dynamic_adapters(10)?;
    let mut load_more = tokio::time::interval(Duration::from_secs(5));
    load_more.tick().await;
    loop {
        tokio::select! {
            batch = entries.next() => {
                let Some(batch) = batch else { break };
                for diff in batch {
                    match &diff {
                        VectorDiff::Reset { values } => println!("reset: {} rooms", values.len()),
                        VectorDiff::Set { index, value } => println!("set {index}: {} ({} unread)", value.fields.name, value.fields.unread),
                        VectorDiff::Insert { index, value } => println!("insert {index}: {}", value.fields.name),
                        VectorDiff::Remove { index } => println!("remove {index}"),
                        VectorDiff::Append { values } => println!("append {} rooms", values.len()),
                        other => println!("{other:?}"),
                    }
                    diff.apply(&mut shown);
                }
                let top: Vec<&str> = shown.iter().take(3).map(|room| room.fields.name.as_str()).collect();
                println!("  {} rooms shown of {:?}; top: {top:?}", shown.len(), rooms.total());
            }
            _ = load_more.tick() => {
                if rooms.total().is_none_or(|total| total > pages.limit()) {
                    pages.add_one_page()?;
                    println!("load more: window 0..{}", pages.limit());
                }
            }
        }
    }
    Ok(())
}
