//! One cluster run through trials: it starts the nodes and the clients, runs
//! the writers and clients while one fault strikes, then checks every node's
//! items and every client's lists, and reports what the trials saw.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::clients::FailoverClient;
use crate::common::cluster::{all_items, request, OrdoCluster, SeedGuard};
use crate::common::Rng;
use crate::writers::{run_writer, WriterLog};
use crate::{Fault, COLLECTION, CONVERGE_TIMEOUT, N_CLIENTS, N_WRITERS, SETUP_TIMEOUT, STREAM};

/// State the test shares with its writer threads and client tasks.
pub(crate) struct Shared {
    /// Each Ordo node's HTTP port, None while it is down.
    pub(crate) ports: Mutex<Vec<Option<u16>>>,
    pub(crate) stop: AtomicBool,
    /// The Ordo node last killed and when: a client that loses that node
    /// measures its failover gap from this instant.
    pub(crate) killed: Mutex<Option<(usize, Instant)>>,
    pub(crate) gaps: Mutex<Vec<Duration>>,
}

/// Sets the flag when dropped, unwinding included.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Shared {
    pub(crate) fn live_ports(&self) -> Vec<u16> {
        self.ports.lock().unwrap().iter().flatten().copied().collect()
    }
}

/// One fault and what was seen of it.
#[derive(Default, Debug)]
struct Observed {
    /// For `ordo_stop`: the largest `lag_entries` health showed after SIGCONT,
    /// and whether it said `lagging`.
    lag_entries_max: u64,
    lagging_seen: bool,
    /// For `nats_leader_kill`: whether the stream leader was the meta leader too.
    was_meta_leader: bool,
    /// For `nats_stop`: whether the frozen node led the stream.
    was_stream_leader: bool,
    /// What was done, for the log.
    what: String,
}

pub(crate) struct Bench {
    cluster: OrdoCluster,
    shared: Arc<Shared>,
    runtime: tokio::runtime::Runtime,
    logs: Vec<WriterLog>,
    clients: Vec<FailoverClient>,
    /// Per fault kind: trials run, and what they saw.
    tally: BTreeMap<Fault, (u64, Vec<Observed>)>,
    total_acked_before: usize,
}

impl Bench {
    pub(crate) fn start(seed: u64) -> Bench {
        // The nodes publish differently, so faults hit atomic batches too: one
        // entry per message; batches of what is waiting; batches that wait 2 ms
        // for more, one at a time.
        let cluster = OrdoCluster::start_each_with(
            3,
            &["--cluster-max-lag", "100"],
            &[&["--coalesce-entries", "1"], &[], &["--coalesce-wait-us", "2000", "--coalesce-in-flight", "1"]],
        );
        let fields = json!({"fields": [{"name": "writer", "type": "u64"}, {"name": "k", "type": "u64"},
                                       {"name": "count", "type": "u64"}]});
        let (status, answer) = request(
            cluster.node(0).port,
            "PUT",
            &format!("/v1/collections/{COLLECTION}"),
            Some(&fields),
            SETUP_TIMEOUT,
        )
        .unwrap();
        assert_eq!(status, 201, "{answer}");
        let seq = cluster.wait_converged(CONVERGE_TIMEOUT);
        let shared = Arc::new(Shared {
            ports: Mutex::new(cluster.ports()),
            stop: AtomicBool::new(false),
            killed: Mutex::new(None),
            gaps: Mutex::new(Vec::new()),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let mut rng = Rng::new(seed);
        let clients = (0..N_CLIENTS)
            .map(|i| {
                let node = rng.index(cluster.len());
                let port = cluster.node(node).port;
                runtime.block_on(FailoverClient::start(format!("client {i}"), node, port, seq))
            })
            .collect();
        let logs = (0..N_WRITERS).map(|_| WriterLog::default()).collect();
        Bench { cluster, shared, runtime, logs, clients, tally: BTreeMap::new(), total_acked_before: 0 }
    }

    /// One trial: writers and clients run, `fault` strikes, all stop; then the checks.
    pub(crate) fn trial(&mut self, fault: Fault, seed: u64) {
        let _guard = SeedGuard { what: "cluster fault trial", seed, replay: "ORDO_CLUSTER_FAULT_SEED" };
        let context = format!("seed {seed} fault {fault:?}");
        let mut rng = Rng::new(seed);
        self.shared.stop.store(false, Ordering::Relaxed);
        let tasks: Vec<_> = std::mem::take(&mut self.clients)
            .into_iter()
            .map(|client| self.runtime.spawn(client.run(self.shared.clone())))
            .collect();
        let shared = self.shared.clone();
        let mut logs = std::mem::take(&mut self.logs);
        let observed = std::thread::scope(|scope| {
            for (writer, log) in logs.iter_mut().enumerate() {
                let shared = &shared;
                scope.spawn(move || run_writer(writer as u64, seed, shared, log));
            }
            // A fault whose check panics must still stop the writers: the
            // scope waits for them, so the test would hang instead of failing.
            let stop_writers = StopOnDrop(&shared.stop);
            let started = Instant::now();
            std::thread::sleep(Duration::from_millis(500 + rng.below(500)));
            let observed = self.inject(fault, &mut rng);
            eprintln!("{context}: {} after {:?}", observed.what, started.elapsed());
            std::thread::sleep(Duration::from_millis(1000));
            drop(stop_writers);
            observed
        });
        let stopped = Instant::now();
        let healths: Vec<Option<Value>> = (0..self.cluster.len()).map(|node| self.cluster.health(node)).collect();
        // A node learns the stream's end from its deliveries and a poll once a
        // second: after that, "converged" covers every entry published so far.
        std::thread::sleep(Duration::from_millis(1100));
        self.logs = logs;
        self.clients = tasks.into_iter().map(|task| self.runtime.block_on(task).expect("a client task")).collect();

        // Every node applies the whole stream; then every node is checked.
        let acked_max = self.logs.iter().flat_map(|log| log.acked.values().copied()).max().unwrap_or(0);
        let seq = self.cluster.wait_converged(CONVERGE_TIMEOUT).max(acked_max);
        eprintln!("{context}: writers stopped; converged at seq {seq} {:?} later", stopped.elapsed());
        if stopped.elapsed() > Duration::from_secs(2) {
            eprintln!("{context}: the nodes' health when the writers stopped: {healths:?}");
        }
        self.check_items(seq, &context);
        for client in &mut self.clients {
            let port = self.cluster.node(client.node).port;
            self.runtime.block_on(client.settle(port, seq, &context));
        }
        *self.shared.killed.lock().unwrap() = None;
        let entry = self.tally.entry(fault).or_default();
        entry.0 += 1;
        entry.1.push(observed);
    }

    fn inject(&mut self, fault: Fault, rng: &mut Rng) -> Observed {
        let mut observed = Observed::default();
        match fault {
            Fault::NatsKill | Fault::NatsLeaderKill => {
                let (meta, leader) = self.cluster.nats.leaders(STREAM);
                let leader = leader.or(meta).expect("the stream has a leader");
                let victim = if fault == Fault::NatsLeaderKill {
                    observed.was_meta_leader = meta == Some(leader);
                    leader
                } else {
                    let others: Vec<usize> = (0..self.cluster.nats.len()).filter(|&i| i != leader).collect();
                    *rng.pick(&others)
                };
                observed.what = format!("killed nats node {victim} (stream leader {leader}, meta leader {meta:?})");
                self.cluster.nats.kill(victim);
                std::thread::sleep(Duration::from_millis(2000 + rng.below(1000)));
                self.cluster.nats.restart(victim);
                // The next fault must not take away a quorum the restarted node has not rejoined.
                assert!(
                    self.cluster.nats.wait_stream_settled(STREAM, CONVERGE_TIMEOUT),
                    "the stream did not settle after restarting n{victim}"
                );
            }
            Fault::NatsStop => {
                let (meta, leader) = self.cluster.nats.leaders(STREAM);
                let victim = rng.index(self.cluster.nats.len());
                observed.was_stream_leader = leader == Some(victim);
                observed.what = format!("froze nats node {victim} (stream leader {leader:?}, meta leader {meta:?})");
                self.cluster.nats.stop(victim);
                std::thread::sleep(Duration::from_millis(3000 + rng.below(1500)));
                self.cluster.nats.cont(victim);
                assert!(
                    self.cluster.nats.wait_stream_settled(STREAM, CONVERGE_TIMEOUT),
                    "the stream did not settle after n{victim} was thawed"
                );
            }
            Fault::OrdoKill => {
                let victim = rng.index(self.cluster.len());
                self.shared.ports.lock().unwrap()[victim] = None;
                *self.shared.killed.lock().unwrap() = Some((victim, Instant::now()));
                observed.what = format!("killed ordo node o{victim}");
                self.cluster.kill(victim);
                std::thread::sleep(Duration::from_millis(1500 + rng.below(1000)));
                self.cluster.restart(victim);
                self.shared.ports.lock().unwrap()[victim] = Some(self.cluster.node(victim).port);
            }
            Fault::OrdoStop => {
                let victim = rng.index(self.cluster.len());
                self.cluster.signal(victim, libc::SIGSTOP);
                observed.what = format!("froze ordo node o{victim}");
                std::thread::sleep(Duration::from_millis(2500 + rng.below(1000)));
                self.cluster.signal(victim, libc::SIGCONT);
                // It lags while it applies what it missed, then catches up.
                let deadline = Instant::now() + Duration::from_secs(2);
                while Instant::now() < deadline {
                    if let Some(health) = self.cluster.health(victim) {
                        observed.lag_entries_max =
                            observed.lag_entries_max.max(health["lag_entries"].as_u64().unwrap_or(0));
                        observed.lagging_seen |= health["lagging"] == true;
                        if health["lag_entries"] == 0 {
                            break;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        observed
    }

    /// The items every node holds against what the writers know.
    fn check_items(&self, seq: u64, context: &str) {
        for log in &self.logs {
            assert!(log.violations.is_empty(), "{context}: {:#?}", log.violations);
        }
        let mut reference: Option<(usize, Vec<Value>)> = None;
        for node in (0..self.cluster.len()).filter(|&node| self.cluster.is_up(node)) {
            let items = all_items(self.cluster.node(node).port, COLLECTION, seq);
            if let Some((first, first_items)) = &reference {
                assert!(
                    first_items == &items,
                    "{context}: o{node} and o{first} hold different items at seq {seq} ({} and {})",
                    items.len(),
                    first_items.len()
                );
                continue;
            }
            let by_id: BTreeMap<&str, &Value> = items.iter().map(|item| (item["id"].as_str().unwrap(), item)).collect();
            for (writer, log) in self.logs.iter().enumerate() {
                let present = |part: &str| -> BTreeSet<u64> {
                    by_id
                        .keys()
                        .filter_map(|id| id.strip_prefix(&format!("b{writer}-"))?.strip_suffix(part)?.parse().ok())
                        .collect()
                };
                let (with_a, with_b) = (present("-a"), present("-b"));
                assert_eq!(with_a, with_b, "{context}: o{node}: writer {writer}: a partial batch");
                for (k, acked_seq) in &log.acked {
                    for part in ["a", "b"] {
                        let item = by_id.get(format!("b{writer}-{k}-{part}").as_str()).copied();
                        assert_eq!(
                            item.map(|item| &item["version"]),
                            Some(&json!(acked_seq)),
                            "{context}: o{node}: acknowledged write {writer}/{k} (seq {acked_seq}) lost or changed"
                        );
                    }
                }
                for k in &log.applied_unacked {
                    assert!(
                        with_a.contains(k),
                        "{context}: o{node}: write {writer}/{k}, found applied by a retry, is gone"
                    );
                }
                for k in &with_a {
                    let known = log.acked.contains_key(k) || log.applied_unacked.contains(k) || log.gave_up.contains(k);
                    assert!(
                        known,
                        "{context}: o{node}: write {writer}/{k} applied, yet a retry succeeded or none was sent"
                    );
                }
                let count = |id: String| by_id.get(id.as_str()).and_then(|item| item["fields"]["count"].as_u64());
                assert_eq!(
                    count(format!("c{writer}")).unwrap_or(0),
                    with_a.len() as u64,
                    "{context}: o{node}: writer {writer}: the counter is not the number of writes applied (once each)"
                );
                let plain = count(format!("p{writer}")).unwrap_or(0);
                assert!(
                    (log.plain_acked..=log.plain_acked + log.plain_unknown).contains(&plain),
                    "{context}: o{node}: writer {writer}: plain counter {plain}, acknowledged {}, unknown {}",
                    log.plain_acked,
                    log.plain_unknown
                );
            }
            reference = Some((node, items));
        }
    }

    /// Each node's `ordo_cluster_publish_groups_total` and `..._group_entries_total`.
    fn groups(&self) -> String {
        let read = |port: u16| -> Option<String> {
            let text = crate::common::cluster::metrics_text(port)?;
            let value = |name: &str| {
                text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ').map(str::to_owned))
            };
            Some(format!(
                "{} / {}",
                value("ordo_cluster_publish_groups_total")?,
                value("ordo_cluster_publish_group_entries_total")?
            ))
        };
        let ports = self.cluster.ports();
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, port)| format!("o{i} {}", port.and_then(read).unwrap_or_else(|| "down".to_owned())));
        nodes.collect::<Vec<_>>().join(", ")
    }

    /// Prints what the run did: per fault kind, the trials and what was seen;
    /// the writes and their outcomes; the failover gaps.
    pub(crate) fn report(&self, what: &str) -> String {
        let mut out = format!("{what}:\n");
        for (fault, (n, observed)) in &self.tally {
            let detail = match fault {
                Fault::OrdoStop => format!(
                    ", lag seen after SIGCONT in {}/{n} (max {} entries), `lagging` in {}",
                    observed.iter().filter(|o| o.lag_entries_max > 0).count(),
                    observed.iter().map(|o| o.lag_entries_max).max().unwrap_or(0),
                    observed.iter().filter(|o| o.lagging_seen).count()
                ),
                Fault::NatsLeaderKill => {
                    format!(", also meta leader in {}", observed.iter().filter(|o| o.was_meta_leader).count())
                }
                Fault::NatsStop => {
                    format!(", the stream leader in {}", observed.iter().filter(|o| o.was_stream_leader).count())
                }
                _ => String::new(),
            };
            out += &format!("  {fault:?}: {n} trials, all checks passed{detail}\n");
        }
        let sum = |f: fn(&WriterLog) -> u64| self.logs.iter().map(f).sum::<u64>();
        out += &format!(
            "  writes: {} sent, {} acknowledged, {} found applied by a retry, {} never answered; plain increments {} acknowledged, {} unknown\n",
            sum(|log| log.next_k),
            sum(|log| log.acked.len() as u64),
            sum(|log| log.applied_unacked.len() as u64),
            sum(|log| log.gave_up.len() as u64),
            sum(|log| log.plain_acked),
            sum(|log| log.plain_unknown),
        );
        out += &format!("  publish groups since each node's last start (groups / entries): {}\n", self.groups());
        let mut failures: BTreeMap<&str, u64> = BTreeMap::new();
        for log in &self.logs {
            for (kind, n) in &log.failures {
                *failures.entry(kind).or_default() += n;
            }
        }
        out += &format!("  failed attempts (retried): {failures:?}\n");
        let mut latencies: Vec<Duration> = self.logs.iter().flat_map(|log| log.latencies.iter().copied()).collect();
        latencies.sort();
        if !latencies.is_empty() {
            let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
            out += &format!(
                "  write time to outcome, retries included: p50={:?} p99={:?} max={:?}\n",
                at(0.5),
                at(0.99),
                latencies.last().unwrap()
            );
        }
        let mut gaps = self.shared.gaps.lock().unwrap().clone();
        gaps.sort();
        if !gaps.is_empty() {
            let at = |q: f64| gaps[((gaps.len() - 1) as f64 * q).round() as usize];
            out += &format!(
                "  failover gap (kill to first frame from another node): n={} p50={:?} p99={:?} max={:?}\n",
                gaps.len(),
                at(0.5),
                at(0.99),
                gaps.last().unwrap()
            );
        }
        let (failovers, replayed, reset) =
            self.clients.iter().fold((0, 0, 0), |(f, p, r), c| (f + c.n_failovers, p + c.n_replayed, r + c.n_reset));
        out += &format!("  client failovers: {failovers} (subscriptions replayed {replayed}, reset {reset})\n");
        let _ = self.total_acked_before;
        out
    }
}
