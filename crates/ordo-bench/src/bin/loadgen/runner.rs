//! The run every scenario shares: a server, the rules with `--auth`, the
//! scenario's data, one subscriber per view, the live phase, the lists checked
//! against the server's, and the report. A scenario supplies only what differs.

use std::path::Path;
use std::sync::atomic::Ordering;

use ordo_bench::live::http::HttpPool;
use ordo_bench::live::phase::{run_live_phase, LivePlan, LiveResult};
use ordo_bench::live::stats::Clock;
use ordo_bench::live::subscriber::SubscriberSpec;
use ordo_bench::live::writer::{max_update_number, UpdateSource};
use ordo_bench::live::Result;
use ordo_server::auth::Role;

use crate::auth::{install_rules, ADMIN_SUB, WRITER_SUB};
use crate::options::Options;
use crate::report::{
    print_auth, print_checks, print_common, print_costs, print_metric_deltas, print_stage_latencies,
    CORRECTNESS_FAILURES,
};
use crate::server::Target;

/// What a scenario brings to the shared run. Its report lines go around the
/// shared ones: `report_deliveries` after the common figures, `report_extra`
/// after the stage latencies.
pub trait Scenario {
    type Updates: UpdateSource;

    /// Names the server's data directory.
    fn name(&self) -> &'static str;
    /// The block's first line.
    fn header(&self, options: &Options) -> String;
    /// The updates per second the writer aims at.
    fn rate(&self, options: &Options) -> f64;
    fn n_subscribers(&self) -> usize;
    /// Collections the writer's updates are spread over.
    fn n_collections(&self) -> usize;
    /// With `--auth`: the access rules, and who holds which token.
    fn rules(&self) -> &'static str;
    fn auth_note(&self) -> String;
    /// Creates the collections and writes the initial items.
    async fn load(&mut self, pool: &mut HttpPool) -> Result<()>;
    /// With `--auth`: requests the rules must refuse, checked.
    async fn check_rules(&self, pool: &mut HttpPool, target: &Target) -> Result<()>;
    /// Subscriber `index`'s view and identity.
    fn subscriber(&self, index: usize, target: &Target, max_update_number: u64) -> SubscriberSpec;
    /// The live phase's update stream (after `load`).
    fn updates(&mut self) -> Self::Updates;
    /// Every subscriber's list against the server's window: mismatches and the first.
    async fn verify(&self, pool: &mut HttpPool, live: &LiveResult) -> Result<(usize, Option<String>)>;
    /// Deliveries and losses, counted as the scenario defines them.
    fn report_deliveries(&self, live: &LiveResult, updates: &Self::Updates);
    /// The server metrics whose change over the live phase is printed.
    fn metric_names(&self) -> &'static [&'static str];
    fn report_extra(&self, _live: &LiveResult) {}
    /// After the report: measurements of its own on the loaded server (the
    /// live phase's subscribers are gone by then).
    async fn probe(&mut self, _pool: &mut HttpPool, _updates: &mut Self::Updates) -> Result<()> {
        Ok(())
    }
    /// Printed last: the scenario's goals (`SCENARIOS.md`), when it has some.
    fn goal(&self) -> Option<&'static str> {
        None
    }
}

/// What a rate search needs of one run.
pub struct RunFigures {
    /// Updates sent (the writer waits when no connection is idle), against
    /// the rate aimed at for the planned seconds.
    pub sent: u64,
    pub target_rate: f64,
    pub seconds: f64,
    /// End-to-end latency over every subscriber's deliveries, in µs.
    pub p99_us: u64,
    /// Correctness failures this run added (losses, lists unequal to a query).
    pub failures: u64,
}

/// One scenario from start to report, against its own server.
pub async fn run_scenario<S: Scenario>(
    scenario: &mut S,
    options: &Options,
    server_binary: Option<&Path>,
    subscriber_runtime: &tokio::runtime::Handle,
    clock: Clock,
) -> Result<RunFigures> {
    let failures_before = CORRECTNESS_FAILURES.load(Ordering::Relaxed);
    println!("{}", scenario.header(options));
    let target = Target::open(options, server_binary, scenario.name())?;
    let mut pool =
        HttpPool::connect(&target.authority, options.http_connections, target.token(ADMIN_SUB, Role::Admin)).await?;
    if target.auth.is_some() {
        install_rules(&mut pool, scenario.rules()).await?;
        println!("  auth: on; rules {}", scenario.rules());
        println!("        {}", scenario.auth_note());
    }
    scenario.load(&mut pool).await?;
    if target.auth.is_some() {
        scenario.check_rules(&mut pool, &target).await?;
    }
    let rate = scenario.rate(options);
    let max_number = max_update_number(rate, options.seconds);
    let specs = (0..scenario.n_subscribers()).map(|index| scenario.subscriber(index, &target, max_number)).collect();
    let plan = LivePlan {
        specs,
        rate,
        seconds: options.seconds,
        n_collections: scenario.n_collections(),
        write_token: target.token(WRITER_SUB, Role::Writer),
        watched_pids: Vec::new(),
    };
    let mut updates = scenario.updates();
    let live =
        run_live_phase(plan, &mut updates, &mut pool, options.tick, target.pid(), subscriber_runtime, clock).await?;
    let (n_mismatches, first_mismatch) = scenario.verify(&mut pool, &live).await?;

    print_common(&live, rate, scenario.n_subscribers());
    if options.timeline {
        live.counters.timeline.print();
    }
    scenario.report_deliveries(&live, &updates);
    print_checks(&live, n_mismatches, first_mismatch);
    print_costs(&live);
    print_metric_deltas(&live, scenario.metric_names());
    print_stage_latencies(&live);
    scenario.report_extra(&live);
    print_auth(&live, target.auth.is_some());
    scenario.probe(&mut pool, &mut updates).await?;
    if let Some(goal) = scenario.goal() {
        println!("  {goal}");
    }
    println!();
    drop(pool);
    drop(target);
    Ok(RunFigures {
        sent: live.write.generated,
        target_rate: rate,
        seconds: options.seconds,
        p99_us: live.counters.latency_us.quantile(0.99),
        failures: CORRECTNESS_FAILURES.load(Ordering::Relaxed) - failures_before,
    })
}
