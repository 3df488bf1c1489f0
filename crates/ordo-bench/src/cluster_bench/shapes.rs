//! `--phase shapes`: what the stream costs per entry when a node sends its
//! entries in three shapes, on `sync_interval: always` servers (Ordo's
//! setting), the NATS servers' CPU read from `/proc` around each measurement:
//!
//! - **one per message**: each entry its own publish with its own PubAck, at
//!   most `--in-flight` outstanding (what a node sent before coalescing);
//! - **atomic batch of K**: K publishes, each entry its own message and stream
//!   seq, committed together (JetStream's atomic batch publish, `allow_atomic`,
//!   nats-server 2.12+): one Raft proposal and one PubAck per K;
//! - **K per message**: K entries in one message's payload, one stream seq.
//!
//! Batches are sent by `--in-flight / K` tasks at once (at least one), so the
//! entries outstanding are about the same in every shape.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::Publish};
use async_nats::HeaderMap;
use bytes::Bytes;

use super::procs::{Nats, Sync};
use super::{load_average, median, Options};
use crate::live::procfs::CpuSample;
use crate::live::Result;

const STREAM: &str = "SHAPES";
const SUBJECT: &str = "shapes.log";

#[derive(Clone, Copy)]
enum Shape {
    OnePerMessage,
    Atomic(usize),
    Packed(usize),
}

impl Shape {
    fn name(self) -> String {
        match self {
            Shape::OnePerMessage => "one per message".to_owned(),
            Shape::Atomic(k) => format!("atomic batch of {k}"),
            Shape::Packed(k) => format!("{k} per message"),
        }
    }

    fn entries_per_send(self) -> usize {
        match self {
            Shape::OnePerMessage => 1,
            Shape::Atomic(k) | Shape::Packed(k) => k,
        }
    }
}

/// Ordo's stream settings, plus `allow_atomic` (async-nats 0.42's `stream::Config`
/// has no field for it, so the stream is created through the JetStream API).
async fn create_stream(client: &async_nats::Client, replicas: usize) -> Result<()> {
    let config = serde_json::json!({
        "name": STREAM,
        "subjects": [SUBJECT],
        "num_replicas": replicas,
        "storage": "file",
        "retention": "limits",
        "discard": "old",
        "duplicate_window": Duration::from_secs(120).as_nanos() as u64,
        "allow_atomic": true,
    });
    let body = Bytes::from(serde_json::to_vec(&config)?);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = client.request(format!("$JS.API.STREAM.CREATE.{STREAM}"), body.clone()).await;
        let error = match answer {
            Ok(message) => {
                let reply: serde_json::Value = serde_json::from_slice(&message.payload)?;
                match reply.get("error") {
                    None => return Ok(()),
                    Some(error) => error.to_string(),
                }
            }
            Err(error) => error.to_string(),
        };
        if Instant::now() > deadline {
            return Err(format!("cannot create the stream: {error}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One task's share: `sends` sends of `shape`, each waited for before the
/// next; message ids start with `prefix`, unique to the task and the shape.
async fn send_all(client: async_nats::Client, shape: Shape, prefix: String, sends: usize, entry: Bytes) -> Result<()> {
    let js = jetstream::new(client.clone());
    for send in 0..sends {
        let id = format!("{prefix}/{send}");
        match shape {
            Shape::OnePerMessage => {
                let ack = js.send_publish(SUBJECT, Publish::build().payload(entry.clone()).message_id(id)).await?;
                ack.await?;
            }
            Shape::Packed(k) => {
                let payload = Bytes::from(entry.repeat(k));
                let ack = js.send_publish(SUBJECT, Publish::build().payload(payload).message_id(id)).await?;
                ack.await?;
            }
            Shape::Atomic(k) => atomic_batch(&client, &id, k, &entry).await?,
        }
    }
    Ok(())
}

/// K messages under one `Nats-Batch-Id`, the last with `Nats-Batch-Commit`;
/// only the commit asks for an answer (the batch's PubAck, or why it failed).
async fn atomic_batch(client: &async_nats::Client, id: &str, k: usize, entry: &Bytes) -> Result<()> {
    for n in 1..=k {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Batch-Id", id.replace('/', "-").as_str());
        headers.insert("Nats-Batch-Sequence", n.to_string().as_str());
        headers.insert("Nats-Msg-Id", format!("{id}/{n}").as_str());
        if n < k {
            client.publish_with_headers(SUBJECT, headers, entry.clone()).await?;
            continue;
        }
        headers.insert("Nats-Batch-Commit", "1");
        let answer = client.request_with_headers(SUBJECT, headers, entry.clone()).await?;
        let reply: serde_json::Value = serde_json::from_slice(&answer.payload)?;
        if let Some(error) = reply.get("error") {
            return Err(format!("atomic batch refused: {error}").into());
        }
    }
    Ok(())
}

struct Figure {
    entries_per_second: f64,
    nats_cpu_ms_per_entry: f64,
}

fn cpu_seconds(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|pid| CpuSample::read(&pid.to_string())).map(|sample| sample.total_seconds).sum()
}

async fn measure_shape(
    nats: &Nats,
    client: &async_nats::Client,
    index: usize,
    shape: Shape,
    options: &Options,
) -> Result<Figure> {
    let entry = Bytes::from(vec![b'x'; options.entry_bytes]);
    let per_send = shape.entries_per_send();
    let tasks = (options.in_flight[0] / per_send).max(1);
    let sends_per_task = (options.ceiling_entries as usize).div_ceil(per_send * tasks);
    let entries = (sends_per_task * per_send * tasks) as f64;
    let cpu_before = cpu_seconds(&nats.pids());
    let started = Instant::now();
    let mut running = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let prefix = format!("shape{index}/task{task}");
        running.push(tokio::spawn(send_all(client.clone(), shape, prefix, sends_per_task, entry.clone())));
    }
    for task in running {
        task.await.map_err(|error| error.to_string())??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(&nats.pids()) - cpu_before;
    Ok(Figure { entries_per_second: entries / seconds, nats_cpu_ms_per_entry: cpu * 1000.0 / entries })
}

/// Fresh servers, one stream, every shape measured once.
fn measure(options: &Options, shapes: &[Shape]) -> Result<Vec<Figure>> {
    let nats = Nats::start(&options.nats_bin, options.nats_nodes, Sync::Always)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    runtime.block_on(async {
        let client = async_nats::connect(nats.urls[0].as_str()).await?;
        create_stream(&client, options.nats_nodes).await?;
        // Warm-up: the stream's leader elected, its files open.
        send_all(client.clone(), Shape::OnePerMessage, "warm-up".to_owned(), 500, Bytes::from_static(b"warm-up"))
            .await?;
        let mut figures = Vec::with_capacity(shapes.len());
        for (index, &shape) in shapes.iter().enumerate() {
            let figure = measure_shape(&nats, &client, index, shape, options).await;
            figures.push(figure.map_err(|error| format!("{} (shape {index}): {error}", shape.name()))?);
        }
        Ok(figures)
    })
}

pub fn shapes_phase(options: &Options) -> Result<()> {
    let mut shapes = vec![Shape::OnePerMessage];
    for &k in &options.pack {
        shapes.push(Shape::Atomic(k));
        shapes.push(Shape::Packed(k));
    }
    println!(
        "\n== the stream's cost per entry by how entries are sent: {} entries of {} B per measurement, about {} \
         outstanding, {} NATS server(s), R{}, sync_interval always ==",
        options.ceiling_entries, options.entry_bytes, options.in_flight[0], options.nats_nodes, options.nats_nodes
    );
    let mut rates = vec![Vec::new(); shapes.len()];
    let mut costs = vec![Vec::new(); shapes.len()];
    for run in 0..options.runs {
        let figures = measure(options, &shapes)?;
        let mut line = format!("run {}", run + 1);
        for (i, figure) in figures.iter().enumerate() {
            line += &format!(
                " | {}: {:.0} entries/s, NATS {:.4} CPU-ms per entry",
                shapes[i].name(),
                figure.entries_per_second,
                figure.nats_cpu_ms_per_entry
            );
            rates[i].push(figure.entries_per_second);
            costs[i].push(figure.nats_cpu_ms_per_entry);
        }
        println!("{line} (load {})", load_average());
    }
    println!("medians of {} run(s):", options.runs);
    let base = median(&mut costs[0].clone());
    for (i, shape) in shapes.iter().enumerate() {
        let cost = median(&mut costs[i]);
        println!(
            "  {:<20} {:>8.0} entries/s, NATS {:.4} CPU-ms per entry ({:.1}x less than one per message)",
            shape.name(),
            median(&mut rates[i]),
            cost,
            base / cost
        );
    }
    Ok(())
}
