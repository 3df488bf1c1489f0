//! `--phase ceiling`: how many entries per second one replicated stream takes
//! here, whatever Ordo does around it. Every Ordo node applies every entry, so
//! this is the ceiling of a whole cluster's writes (docs/SCALING.md,
//! "Capacity per node").
//!
//! One async-nats client publishes entries of `--entry-bytes` (a one-update
//! chat entry of Ordo's is about 150 B) with a `Nats-Msg-Id` each, as Ordo's
//! writes carry, to a stream configured as Ordo's (one subject, file storage,
//! `--nats-nodes` replicas, 2 min dedupe window), keeping `--in-flight` PubAcks
//! outstanding; entries/s is acknowledged entries over the wall time from the
//! first publish to the last PubAck. `sync_interval: always` (Ordo's choice)
//! and the default alternate within each run, each on fresh servers.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::Publish, stream};
use bytes::Bytes;

use super::procs::{Nats, Sync};
use super::{load_average, median, Options};
use crate::live::procfs::CpuSample;
use crate::live::Result;

const SUBJECT: &str = "ceiling.log";
/// Entries published before each measurement (stream leader elected, files open).
const WARM_UP: u64 = 1_000;

/// One measurement: entries/s and the NATS servers' CPU per 1 000 entries.
struct Ceiling {
    entries_per_second: f64,
    nats_cpu_seconds_per_1000: f64,
}

async fn connect(url: &str) -> Result<jetstream::Context> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match async_nats::connect(url).await {
            Ok(client) => return Ok(jetstream::new(client)),
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(error) => return Err(format!("cannot connect to {url}: {error}").into()),
        }
    }
}

/// A stream set up as a cluster-mode Ordo sets up its own (one subject, file
/// storage, 2 min dedupe window), under a bench's name; retried while the meta
/// leader is not elected yet (just after the servers start).
pub async fn create_stream(js: &jetstream::Context, name: &str, subject: &str, replicas: usize) -> Result<()> {
    let config = stream::Config {
        name: name.to_owned(),
        subjects: vec![subject.to_owned()],
        num_replicas: replicas,
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match js.get_or_create_stream(config.clone()).await {
            Ok(_) => return Ok(()),
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(error) => return Err(format!("cannot create stream {name}: {error}").into()),
        }
    }
}

/// Publishes `n` entries from `first_id` on, at most `in_flight` PubAcks
/// outstanding (awaited oldest first: the stream acknowledges in order).
async fn publish(js: &jetstream::Context, first_id: u64, n: u64, in_flight: usize, payload: &Bytes) -> Result<()> {
    let mut waiting = VecDeque::with_capacity(in_flight);
    for id in first_id..first_id + n {
        if waiting.len() >= in_flight {
            let ack: jetstream::context::PublishAckFuture = waiting.pop_front().expect("not empty");
            ack.await.map_err(|error| format!("PubAck: {error}"))?;
        }
        let entry = Publish::build().payload(payload.clone()).message_id(format!("ceiling/{id}"));
        waiting.push_back(js.send_publish(SUBJECT, entry).await.map_err(|error| format!("publish: {error}"))?);
    }
    for ack in waiting {
        ack.await.map_err(|error| format!("PubAck: {error}"))?;
    }
    Ok(())
}

fn cpu_seconds(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|pid| CpuSample::read(&pid.to_string())).map(|sample| sample.total_seconds).sum()
}

/// Fresh servers with `sync`, one stream, a measurement per in-flight setting.
fn measure(options: &Options, sync: Sync) -> Result<Vec<Ceiling>> {
    let nats = Nats::start(&options.nats_bin, options.nats_nodes, sync)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let payload = Bytes::from(vec![b'x'; options.entry_bytes]);
    runtime.block_on(async {
        let js = connect(&nats.urls[0]).await?;
        create_stream(&js, "CEILING", SUBJECT, options.nats_nodes).await?;
        publish(&js, 0, WARM_UP, 64, &payload).await?;
        let mut next_id = WARM_UP;
        let mut figures = Vec::new();
        for &in_flight in &options.in_flight {
            let cpu_before = cpu_seconds(&nats.pids());
            let started = Instant::now();
            publish(&js, next_id, options.ceiling_entries, in_flight, &payload).await?;
            let seconds = started.elapsed().as_secs_f64();
            let cpu = cpu_seconds(&nats.pids()) - cpu_before;
            next_id += options.ceiling_entries;
            figures.push(Ceiling {
                entries_per_second: options.ceiling_entries as f64 / seconds,
                nats_cpu_seconds_per_1000: cpu / options.ceiling_entries as f64 * 1000.0,
            });
        }
        Ok(figures)
    })
}

pub fn ceiling_phase(options: &Options) -> Result<()> {
    println!(
        "\n== the stream's entries/s ceiling: {} entries of {} B per measurement, PubAcks in flight {:?}, {} NATS \
         server(s), R{} ==",
        options.ceiling_entries, options.entry_bytes, options.in_flight, options.nats_nodes, options.nats_nodes
    );
    let settings = [Sync::Always, Sync::Default];
    // [setting][in-flight] → one value per run.
    let mut rates = vec![vec![Vec::new(); options.in_flight.len()]; settings.len()];
    let mut costs = rates.clone();
    for run in 0..options.runs {
        for (s, &sync) in settings.iter().enumerate() {
            let figures = measure(options, sync)?;
            let mut line = format!("run {} sync_interval {:<15}", run + 1, sync.name());
            for (i, figure) in figures.iter().enumerate() {
                line += &format!(
                    " | {} in flight: {:.0} entries/s, NATS {:.3} CPU-s per 1 000",
                    options.in_flight[i], figure.entries_per_second, figure.nats_cpu_seconds_per_1000
                );
                rates[s][i].push(figure.entries_per_second);
                costs[s][i].push(figure.nats_cpu_seconds_per_1000);
            }
            println!("{line} (load {})", load_average());
        }
    }
    println!("medians of {} run(s):", options.runs);
    for (i, &in_flight) in options.in_flight.iter().enumerate() {
        let always = median(&mut rates[0][i]);
        let default = median(&mut rates[1][i]);
        println!(
            "  {in_flight} in flight: always {always:.0} entries/s (NATS {:.3} CPU-s per 1 000) | default {default:.0} \
             entries/s (NATS {:.3} CPU-s per 1 000) | always/default {:.2}x",
            median(&mut costs[0][i]),
            median(&mut costs[1][i]),
            always / default
        );
    }
    Ok(())
}
