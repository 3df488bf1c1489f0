//! `--phase latency`: write acknowledgement latency, single node against a cluster node.

use std::time::{Duration, Instant};

use super::procs::{create_collection, write_body, Http, Nats, Ordo, Sync};
use super::{median, quantile_ms, Options};
use crate::live::Result;

/// `connections` threads write at `rate` in all for `seconds`; each write's
/// latency (send to answer) in microseconds, sorted.
pub fn measure_writes(port: u16, connections: usize, rate: f64, seconds: f64) -> Result<Vec<u64>> {
    let interval = Duration::from_secs_f64(connections as f64 / rate);
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let threads: Vec<_> = (0..connections)
        .map(|thread| {
            std::thread::spawn(move || -> Result<Vec<u64>> {
                let mut http = Http::connect(port)?;
                let mut latencies = Vec::new();
                // Staggered, so the connections do not all send at once.
                let mut next = started + interval.mul_f64(thread as f64 / connections as f64);
                let mut n = thread as u64;
                while next < end {
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let sent = Instant::now();
                    let (status, body) = http.request("POST", "/v1/collections/rooms/batch", &write_body(n))?;
                    if status != 200 {
                        return Err(format!("a write answered {status}: {body}").into());
                    }
                    latencies.push(sent.elapsed().as_micros() as u64);
                    n += connections as u64;
                    next += interval;
                }
                Ok(latencies)
            })
        })
        .collect();
    let mut all = Vec::new();
    for thread in threads {
        all.extend(thread.join().map_err(|_| "a writer thread panicked")??);
    }
    all.sort_unstable();
    Ok(all)
}

pub fn latency_phase(options: &Options) -> Result<()> {
    println!(
        "\n== write acknowledgement latency: {} writes/s over {} connections, {} s per run, {} runs ==",
        options.rate, options.connections, options.seconds, options.runs
    );
    println!(
        "single node: --durability full (fdatasync per group commit); cluster: {} NATS servers, R{} stream, \
              default sync_interval, the node's own log relaxed",
        options.nats_nodes, options.nats_nodes
    );
    let (mut single_p50, mut single_p99, mut cluster_p50, mut cluster_p99, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..options.runs {
        let single = Ordo::start(&options.ordo_bin, "single", None, &[])?;
        create_collection(single.port)?;
        let single_latencies = measure_writes(single.port, options.connections, options.rate, options.seconds)?;
        drop(single);
        let nats = Nats::start(&options.nats_bin, options.nats_nodes, Sync::Default)?;
        let node = Ordo::start(&options.ordo_bin, "node-a", Some((&nats, options.nats_nodes)), &options.node_args)?;
        create_collection(node.port)?;
        let cluster_latencies = measure_writes(node.port, options.connections, options.rate, options.seconds)?;
        drop(node);
        drop(nats);
        let (s50, s99) = (quantile_ms(&single_latencies, 0.5), quantile_ms(&single_latencies, 0.99));
        let (c50, c99) = (quantile_ms(&cluster_latencies, 0.5), quantile_ms(&cluster_latencies, 0.99));
        println!(
            "run {}: single p50 {s50:.2} ms p99 {s99:.2} ms ({} writes) | cluster p50 {c50:.2} ms p99 {c99:.2} ms \
             ({} writes) | cluster/single p99 {:.2}x",
            run + 1,
            single_latencies.len(),
            cluster_latencies.len(),
            c99 / s99
        );
        single_p50.push(s50);
        single_p99.push(s99);
        cluster_p50.push(c50);
        cluster_p99.push(c99);
        ratios.push(c99 / s99);
    }
    println!(
        "median: single p50 {:.2} ms p99 {:.2} ms | cluster p50 {:.2} ms p99 {:.2} ms | cluster/single p99 {:.2}x \
         (goal: at most 2x)",
        median(&mut single_p50),
        median(&mut single_p99),
        median(&mut cluster_p50),
        median(&mut cluster_p99),
        median(&mut ratios)
    );
    Ok(())
}
