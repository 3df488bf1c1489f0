//! `ordo serve`: opens the data directory (rebuilding everything in it), starts
//! the writer thread and the network runtime, and stops cleanly on SIGINT or
//! SIGTERM: no new requests, the writes in flight finish, the store is closed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use ordo_store::{print_load_progress, Database, Durability, StoreOptions};

use crate::access::Gate;
use crate::auth::{AuthOptions, Verifier};
use crate::demo;
use crate::http;
use crate::http_state::HttpState;
use crate::limits;
use crate::metrics::{self, ThreadKind};
use crate::min_seq::SeqWatch;
use crate::name_routes::NameRoutes;
use crate::routing::Routes;
use crate::rules::{RuleSet, RulesDoc};
use crate::submit::Submitter;
use crate::writer::{Command, Writer, WriterSender, RULES_COLLECTION, RULES_ITEM};
use crate::ws::{ConnectionConfig, Registry};

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub durability: Durability,
    pub outbound_budget: usize,
    pub slow_close_after: Duration,
    pub ws_messages_per_second: u32,
    pub http_requests_per_second: u32,
    pub network_threads: usize,
    pub session_retention: Duration,
    pub checkpoint_interval: Duration,
    /// `--log-segment-size`: the write-ahead log's segment (and spare) size.
    pub log_segment_bytes: u64,
    /// `--header-timeout`: how long a connection may take to send a request head
    /// (or sit idle between HTTP/1.1 requests) before it is closed.
    pub header_timeout: Duration,
    /// `--max-connections`; None: all the descriptor limit leaves room for (`limits::connection_cap`).
    pub max_connections: Option<usize>,
    /// `--demo`: write the demo chat if `rooms` is empty and run the traffic simulator.
    pub demo: bool,
    /// `--demo-rate`: the simulator's messages per second at start.
    pub demo_rate: u32,
    /// How tokens are verified; no secret and no JWKS: auth is off.
    pub auth: AuthOptions,
    /// `--allow-origin`: browser origins allowed besides the server's own.
    pub allow_origins: Vec<String>,
    /// `--allow-host`: host names the server answers to besides IP literals and `localhost`.
    pub allow_hosts: Vec<String>,
    /// `--insecure`: run without auth on a non-loopback address.
    pub insecure: bool,
    /// `--metrics-public`: `/metrics` without an admin token.
    pub metrics_public: bool,
    /// `--auth-timeout`: how long a WebSocket may go without a token.
    pub auth_timeout: Duration,
    /// `--auth-grace`: how long a WebSocket may keep going after its token expired.
    pub auth_grace: Duration,
    /// `--cluster` and its companions: `None` is single-node mode.
    pub cluster: Option<crate::cluster::ClusterOptions>,
    /// `--pg-table` and its companions: the PostgreSQL tables followed (`None`: none).
    pub postgres: Option<crate::pg_follow::config::PostgresOptions>,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            data_dir: PathBuf::from("ordo-data"),
            durability: Durability::Full,
            outbound_budget: limits::DEFAULT_OUTBOUND_BUFFER_BYTES,
            slow_close_after: Duration::from_secs(limits::DEFAULT_SLOW_CLOSE_AFTER_SECS),
            ws_messages_per_second: limits::DEFAULT_WS_MESSAGES_PER_SECOND,
            http_requests_per_second: limits::DEFAULT_HTTP_REQUESTS_PER_SECOND,
            network_threads: default_network_threads(),
            session_retention: Duration::from_secs(limits::DEFAULT_SESSION_RETENTION_SECS),
            checkpoint_interval: StoreOptions::default().checkpoint_interval,
            log_segment_bytes: StoreOptions::default().log_segment_bytes,
            header_timeout: Duration::from_secs(limits::DEFAULT_HEADER_TIMEOUT_SECS),
            max_connections: None,
            demo: false,
            demo_rate: limits::DEFAULT_DEMO_MESSAGES_PER_SECOND,
            auth: AuthOptions::default(),
            allow_origins: Vec::new(),
            allow_hosts: Vec::new(),
            insecure: false,
            metrics_public: false,
            auth_timeout: Duration::from_secs(limits::AUTH_TIMEOUT_SECS),
            auth_grace: Duration::from_secs(limits::AUTH_EXPIRY_GRACE_SECS),
            cluster: None,
            postgres: None,
        }
    }
}

/// One network thread per core, at most [`limits::DEFAULT_MAX_NETWORK_THREADS`].
/// A second thread keeps frames moving while the first is descheduled or busy
/// with a burst (docs/bench-history/2026-11-23-server-under-load.md, "2026-11-23, fourth pass").
pub fn default_network_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, limits::DEFAULT_MAX_NETWORK_THREADS)
}

/// Runs the server until a signal stops it.
pub fn serve(mut options: ServeOptions) -> Result<(), String> {
    let nofile = raise_open_file_limit();
    let max_connections = limits::connection_cap(nofile, options.max_connections)?;
    let demo = configure_auth(&mut options)?;
    prepare_cluster(&mut options)?;
    let verifier = if options.auth.is_configured() { Some(Verifier::new(&options.auth)?) } else { None };
    let (database, data_dir) = open_database(&options)?;
    let rules = load_rules(&database)?;
    let pg_position = match &options.postgres {
        Some(postgres) => crate::pg_follow::stored_position(&database, &postgres.slot)?,
        None => crate::pg_follow::Stored::default(),
    };
    let gate = Arc::new(Gate::new(verifier, rules, options.allow_hosts.clone(), options.allow_origins.clone()));
    gate.set_max_unauthenticated(limits::unauthenticated_cap(max_connections));
    let routes = Arc::new(RwLock::new(NameRoutes::new()));
    let cluster_shared = options
        .cluster
        .as_ref()
        .map(|cluster| crate::cluster::Shared::new(&cluster.node_name, cluster.max_lag, database.last_seq()));
    // Cluster mode: every node's apply of the follower's entries reports to it.
    let pg_status = match (&options.postgres, &options.cluster) {
        (Some(postgres), Some(_)) => Some(crate::pg_follow::clustered_status(postgres, &pg_position)),
        (Some(_), None) => Some(Arc::new(crate::pg_follow::FollowStatus::default())),
        (None, _) => None,
    };
    let mut writer = writer(database, &options, &routes, &gate, cluster_shared.as_ref(), pg_status.as_ref());
    let seq = writer.seq_watch();
    let (writer_tx, writer_rx) = mpsc::channel(limits::WRITER_QUEUE_CAPACITY);
    writer.wake_with(&writer_tx);
    let writer_thread = std::thread::Builder::new()
        .name("ordo-writer".to_owned())
        .spawn(move || writer.run(writer_rx))
        .map_err(|error| format!("cannot start the writer thread: {error}"))?;
    let runtime = network_runtime(options.network_threads)?;
    let network = Network {
        options,
        data_dir,
        max_connections,
        nofile,
        demo,
        gate,
        routes,
        writer: writer_tx,
        seq,
        cluster_shared,
        pg_position,
        pg_status,
    };
    let result = runtime.block_on(network.run());
    // Every sender is gone once the runtime is: the writer finishes what is queued and returns.
    runtime.shutdown_timeout(Duration::from_secs(5));
    let database = writer_thread.join().map_err(|_| "the writer thread panicked".to_owned())?;
    let last_seq = database.last_seq();
    drop(database);
    crate::logging::say!("ordo: stopped; last seq {last_seq}");
    tracing::info!(last_seq, "stopped");
    result
}

/// `--demo`'s token secret: the one the demo's users' tokens are signed with.
struct DemoAuth {
    secret: Arc<Vec<u8>>,
    /// Whether the demo made the secret: the admin-token hint printed at start
    /// must name the secret the server really uses.
    made_secret: bool,
}

/// Checks how callers are authenticated, refusing to start open to the network
/// (docs/SECURITY.md). With `--demo` and no secret, the demo signs its users'
/// tokens with a secret of its own, kept with the data so that
/// `ordo token --secret-file DATA_DIR/demo-secret` can mint an admin's.
fn configure_auth(options: &mut ServeOptions) -> Result<Option<DemoAuth>, String> {
    let mut demo_made_secret = false;
    let demo_secret = if options.demo {
        if options.auth.secret.is_none() {
            options.auth.secret = Some(demo_secret(&options.data_dir)?);
            demo_made_secret = true;
        }
        options.auth.secret.clone().map(Arc::new)
    } else {
        None
    };
    if !options.auth.is_configured() {
        if !options.listen.ip().is_loopback() && !options.insecure {
            return Err(format!(
                "refusing to listen on {} without auth: anyone who can reach it could read and write everything. \
                 Configure --auth-secret-file or --auth-jwks (docs/SECURITY.md), or pass --insecure if a proxy in front does the checking",
                options.listen
            ));
        }
        tracing::warn!(
            "WARNING: auth is off: every caller is an admin{}",
            if options.insecure { " (--insecure), on a non-loopback address" } else { " (loopback only)" }
        );
    }
    Ok(demo_secret.map(|secret| DemoAuth { secret, made_secret: demo_made_secret }))
}

/// Cluster mode's store settings, and a new node's data from the newest snapshot.
fn prepare_cluster(options: &mut ServeOptions) -> Result<(), String> {
    let Some(cluster) = &options.cluster else { return Ok(()) };
    // The stream is the durable copy of every entry: a node that loses the
    // tail of its own log (a power loss) replays it from the stream, so its
    // log is written but not synced (docs/STORAGE.md, "Cluster mode").
    options.durability = Durability::Relaxed;
    // A new node (empty data directory) starts from the newest snapshot when
    // the stream no longer holds seq 1, or refuses to start (never a gap).
    crate::cluster::snapshot::bootstrap(cluster, &options.data_dir)?;
    Ok(())
}

/// Opens the data directory and says what it loaded; returns the database and
/// the directory's canonical path.
fn open_database(options: &ServeOptions) -> Result<(Database, PathBuf), String> {
    let started = Instant::now();
    let store_options = StoreOptions {
        durability: options.durability,
        checkpoint_interval: options.checkpoint_interval,
        log_segment_bytes: options.log_segment_bytes,
        ..StoreOptions::default()
    };
    let (database, report) = Database::open(&options.data_dir, store_options, &mut print_load_progress)
        .map_err(|error| format!("cannot open the data directory {}: {error}", options.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&options.data_dir).unwrap_or_else(|_| options.data_dir.clone());
    crate::logging::say!(
        "ordo {}: data in {} ({} collections, {} items, last seq {}; loaded in {:.2} s)",
        env!("CARGO_PKG_VERSION"),
        data_dir.display(),
        report.n_collections,
        report.n_items,
        report.last_seq,
        started.elapsed().as_secs_f64()
    );
    tracing::info!(
        data_dir = %data_dir.display(),
        collections = report.n_collections,
        items = report.n_items,
        last_seq = report.last_seq,
        replayed = report.n_log_records_replayed,
        cut_off_bytes = report.n_log_bytes_cut_off,
        millis = started.elapsed().as_millis() as u64,
        "data loaded"
    );
    if report.n_log_records_replayed > 0 || report.n_log_bytes_cut_off > 0 {
        crate::logging::say!(
            "ordo: replayed {} batches from the write-ahead log (not yet checkpointed when the last run stopped){}",
            report.n_log_records_replayed,
            if report.n_log_bytes_cut_off > 0 {
                format!(
                    "; cut off {} bytes of a write the crash interrupted (never acknowledged)",
                    report.n_log_bytes_cut_off
                )
            } else {
                String::new()
            }
        );
    }
    Ok((database, data_dir))
}

/// The writer, with cluster mode's applier (and its snapshots) when clustered,
/// and the routing table filled from the collections loaded.
fn writer(
    database: Database,
    options: &ServeOptions,
    routes: &Routes,
    gate: &Arc<Gate>,
    cluster_shared: Option<&Arc<crate::cluster::Shared>>,
    pg_status: Option<&Arc<crate::pg_follow::FollowStatus>>,
) -> Writer {
    let mut writer = Writer::new(database, routes.clone(), options.outbound_budget);
    if let (Some(shared), Some(cluster)) = (cluster_shared, &options.cluster) {
        let mut applier = crate::cluster::apply::Applier::new(shared.clone(), gate.clone());
        if let (Some(dir), every @ 1..) = (&cluster.snapshot_dir, cluster.snapshot_every) {
            let config = crate::cluster::snapshot::SnapshotConfig {
                dir: dir.clone(),
                every,
                keep: crate::cluster::snapshot::DEFAULT_SNAPSHOTS_KEPT,
                node: cluster.node_name.clone(),
            };
            applier = applier
                .with_snapshots(crate::cluster::snapshot::SnapshotScheduler::new(config, writer.database().last_seq()));
        }
        if let Some(status) = pg_status {
            applier = applier.with_postgres(status.clone());
        }
        writer = writer.with_cluster(applier);
    }
    writer.publish_routes();
    writer
}

fn network_runtime(network_threads: usize) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(network_threads.max(1))
        .thread_name("ordo-network")
        .on_thread_start(|| metrics::set_thread_kind(ThreadKind::Network))
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the network runtime: {error}"))
}

/// Everything the network side starts with, once the writer runs.
struct Network {
    options: ServeOptions,
    data_dir: PathBuf,
    max_connections: usize,
    /// The descriptor limit in force (told when it caps the connections).
    nofile: u64,
    demo: Option<DemoAuth>,
    gate: Arc<Gate>,
    routes: Routes,
    writer: WriterSender,
    seq: SeqWatch,
    cluster_shared: Option<Arc<crate::cluster::Shared>>,
    /// `--pg-table`: the position stored for the slot (`None`: a first start).
    pg_position: crate::pg_follow::Stored,
    /// `--pg-table`: the follower's status (cluster mode: shared with the apply).
    pg_status: Option<Arc<crate::pg_follow::FollowStatus>>,
}

impl Network {
    /// Listens, serves until a signal (or, in cluster mode, a gap this node
    /// cannot apply past) stops it, and waits for the requests in flight.
    async fn run(self) -> Result<(), String> {
        let listener = tokio::net::TcpListener::bind(self.options.listen)
            .await
            .map_err(|error| format!("cannot listen on {}: {error}", self.options.listen))?;
        let address = listener.local_addr().map_err(|error| error.to_string())?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let stop_signal = signal_listener()?;
        let cluster = self.start_cluster(shutdown_rx.clone()).await?;
        let postgres = self.start_postgres(cluster.as_ref(), shutdown_rx.clone()).await?;
        // The demo's rooms are written before the address is printed, so whoever
        // waits for that line finds them there.
        let followed = postgres.as_ref().map(|started| started.read_only.clone()).unwrap_or_default();
        let demo = self.start_demo(cluster.as_ref(), shutdown_rx.clone(), &followed).await?;
        self.announce(address, demo.as_deref());
        let state = Arc::new(self.http_state(shutdown_rx.clone(), demo, cluster, postgres));
        tokio::spawn(expire_sessions(state.registry.clone(), state.writer.clone(), shutdown_rx.clone()));
        let fatal = state.cluster.as_ref().map(|cluster| cluster.shared.clone());
        tokio::spawn(stop_on_signal(stop_signal, fatal.clone(), shutdown_tx));
        http::serve(listener, state, shutdown_rx, Duration::from_secs(10)).await;
        // Exit status 1 with the reason, like a refusal at start.
        match fatal.and_then(|shared| shared.status.fatal()) {
            Some(message) => Err(message),
            None => Ok(()),
        }
    }

    /// Cluster mode: connects to the stream and starts applying it.
    async fn start_cluster(
        &self,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Option<Arc<crate::cluster::Cluster>>, String> {
        let (Some(options), Some(shared)) = (&self.options.cluster, &self.cluster_shared) else { return Ok(None) };
        let cluster = start_cluster(options.clone(), shared.clone()).await?;
        cluster.spawn(self.writer.clone(), shutdown);
        Ok(Some(cluster))
    }

    /// `--pg-table`: checks the tables, copies them on a first start, and starts
    /// following; in cluster mode, starts this node's candidacy for the lease.
    async fn start_postgres(
        &self,
        cluster: Option<&Arc<crate::cluster::Cluster>>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Option<crate::pg_follow::Started>, String> {
        let Some(options) = &self.options.postgres else { return Ok(None) };
        if let (Some(cluster), Some(status)) = (cluster, &self.pg_status) {
            let (writer, routes) = (&self.writer, &self.routes);
            let started =
                crate::pg_follow::start_clustered(options, cluster.clone(), status.clone(), writer, routes, shutdown);
            return Ok(Some(started));
        }
        let started =
            crate::pg_follow::start(options, self.pg_position.clone(), &self.writer, &self.routes, shutdown).await?;
        Ok(Some(started))
    }

    /// `--demo`: the chat, its rules and the traffic simulator.
    async fn start_demo(
        &self,
        cluster: Option<&Arc<crate::cluster::Cluster>>,
        shutdown: watch::Receiver<bool>,
        followed: &std::collections::HashSet<String>,
    ) -> Result<Option<Arc<demo::Demo>>, String> {
        if !self.options.demo {
            return Ok(None);
        }
        let rate = self.options.demo_rate;
        let source = demo::chat_source(followed)?;
        let cluster = cluster.cloned();
        let started = demo::start(&self.writer, &self.routes, &self.gate, rate, shutdown, cluster, source).await?;
        if source == demo::ChatSource::Postgres {
            crate::logging::say!(
                "ordo: demo: the chat is PostgreSQL's (`rooms`, `members`, `messages` followed); its rules installed"
            );
        } else if started.n_rooms_written > 0 {
            crate::logging::say!(
                "ordo: demo: wrote a chat of {} rooms into `rooms`, `members` and `messages`",
                started.n_rooms_written
            );
        } else {
            crate::logging::say!("ordo: demo: the chat is there already");
        }
        Ok(Some(started.demo))
    }

    /// The lines that say the server is up, where, and how.
    fn announce(&self, address: SocketAddr, demo: Option<&demo::Demo>) {
        let options = &self.options;
        crate::logging::say!("ordo: listening on http://{address} (WebSocket: ws://{address}/v1/ws); Ctrl-C stops");
        tracing::info!(
            %address,
            data_dir = %self.data_dir.display(),
            auth = auth_mode(options),
            durability = ?options.durability,
            network_threads = options.network_threads,
            max_connections = self.max_connections,
            version = env!("CARGO_PKG_VERSION"),
            "started"
        );
        if let Some(demo) = demo {
            let traffic = match demo.source {
                demo::ChatSource::Generated => format!("simulator: {} messages/s", demo.simulator.rate()),
                demo::ChatSource::Postgres => "messages: INSERTs in PostgreSQL".to_owned(),
            };
            crate::logging::say!("ordo: demo on http://{address}/demo ({traffic}); demo users sign in there");
            let secret_file = if self.demo.as_ref().is_some_and(|demo| demo.made_secret) {
                options.data_dir.join(DEMO_SECRET_FILE).display().to_string()
            } else {
                "<the secret given with --auth-secret-file>".to_owned()
            };
            let purpose = match demo.source {
                demo::ChatSource::Generated => "to change the simulator's rate: POST /demo/simulator {\"rate\":N}",
                demo::ChatSource::Postgres => "to read every collection",
            };
            crate::logging::say!(
                "ordo: an admin token ({purpose}): ordo token --secret-file {secret_file} --role admin --sub ops"
            );
        }
        crate::logging::say!(
            "ordo: at most {} connections at once (--max-connections; the descriptor limit is {})",
            self.max_connections,
            self.nofile
        );
    }

    fn http_state(
        self,
        shutdown: watch::Receiver<bool>,
        demo: Option<Arc<demo::Demo>>,
        cluster: Option<Arc<crate::cluster::Cluster>>,
        postgres: Option<crate::pg_follow::Started>,
    ) -> HttpState {
        let options = self.options;
        let (postgres, read_only) = match postgres {
            Some(started) => (Some(started.status), started.read_only),
            None => (None, Arc::default()),
        };
        HttpState {
            submit: match &cluster {
                Some(cluster) => Submitter::Stream(cluster.clone()),
                None => Submitter::Writer(self.writer.clone()),
            },
            writer: self.writer,
            routes: self.routes,
            registry: Arc::new(Registry::default()),
            connection: ConnectionConfig {
                outbound_budget: options.outbound_budget,
                slow_close_after: options.slow_close_after,
                messages_per_second: options.ws_messages_per_second,
                session_retention: options.session_retention,
                auth_timeout: options.auth_timeout,
                auth_grace: options.auth_grace,
            },
            http_requests_per_second: options.http_requests_per_second,
            max_connections: self.max_connections,
            header_timeout: options.header_timeout,
            shutdown,
            limits_json: Arc::new(limits_json(&options, self.max_connections)),
            demo,
            demo_enabled: options.demo,
            demo_secret: self.demo.map(|demo| demo.secret),
            gate: self.gate,
            metrics_public: options.metrics_public,
            seq: self.seq,
            cluster,
            idempotency: crate::idempotency::Idempotency::new(Default::default()),
            postgres,
            read_only,
            websockets: tokio_util::task::TaskTracker::new(),
        }
    }
}

/// Turns `shutdown` true on SIGINT or SIGTERM, or when a cluster node cannot
/// go on without a gap (`cluster::gap`).
async fn stop_on_signal(
    stop_signal: impl std::future::Future<Output = ()>,
    fatal: Option<Arc<crate::cluster::Shared>>,
    shutdown: watch::Sender<bool>,
) {
    let fatal = async {
        match &fatal {
            Some(shared) => shared.fatal.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = stop_signal => {
            crate::logging::say!("ordo: stopping (finishing the requests in flight)");
            tracing::info!("stopping: a signal came; finishing the requests in flight");
        }
        _ = fatal => {
            crate::logging::say!("ordo: stopping: this node cannot apply the stream without a gap (finishing the requests in flight)");
        }
    }
    let _ = shutdown.send(true);
}

/// Connects to the stream and checks that this data directory belongs to it:
/// its last applied seq is within the stream, and the stream still holds every
/// entry after it.
async fn start_cluster(
    options: crate::cluster::ClusterOptions,
    shared: Arc<crate::cluster::Shared>,
) -> Result<Arc<crate::cluster::Cluster>, String> {
    let applied = shared.status.applied_seq();
    let cluster = crate::cluster::Cluster::connect(options, shared).await?;
    // The stream must still hold the message after the last one applied whole
    // (an empty stream whose entries were all dropped included), and that one
    // must be within it.
    let applied_message = cluster.shared.status.applied_stream_seq();
    let state = read_stream_reaching(&cluster, applied_message).await?;
    let bounds = crate::cluster::snapshot::StreamBounds { first_seq: state.first_seq, last_seq: state.last_seq };
    crate::cluster::snapshot::check_resume(applied_message, bounds)
        .map_err(|error| format!("stream `{}`: {error}", cluster.options.stream))?;
    cluster.shared.status.stream_said_last_seq(state.last_seq);
    crate::logging::say!(
        "ordo: cluster node {} on stream `{}` ({} entries, applied through seq {applied})",
        cluster.options.node_name,
        cluster.options.stream,
        state.last_seq
    );
    tracing::info!(
        node = %cluster.options.node_name,
        stream = %cluster.options.stream,
        stream_last_seq = state.last_seq,
        applied_seq = applied,
        "cluster mode"
    );
    Ok(Arc::new(cluster))
}

/// The stream's state, read again a few times while it ends before
/// `applied_message`: a NATS server that was frozen while it led the stream
/// answers for a moment with the stream as it was then (see `cluster::gap`).
/// A stream that still ends there after the last reading is refused by the caller.
async fn read_stream_reaching(
    cluster: &crate::cluster::Cluster,
    applied_message: u64,
) -> Result<crate::cluster::log::StreamState, String> {
    const READINGS: u32 = 5;
    let mut reading = 1;
    loop {
        let state = cluster.stream_state().await?;
        if state.last_seq >= applied_message || reading == READINGS {
            return Ok(state);
        }
        tracing::warn!(
            stream_last_seq = state.last_seq,
            applied_message,
            "the stream's state as a NATS server answered ends before this node's data; reading again"
        );
        reading += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// How callers are checked, for the start line of the log.
fn auth_mode(options: &ServeOptions) -> &'static str {
    match (options.auth.secret.is_some(), options.auth.jwks_path.is_some()) {
        (true, true) => "hs256+jwks",
        (true, false) => "hs256",
        (false, true) => "jwks",
        (false, false) if options.insecure => "off (insecure)",
        (false, false) => "off (loopback only)",
    }
}

/// The demo's secret file, in the data directory.
pub const DEMO_SECRET_FILE: &str = "demo-secret";

/// Reads the demo's secret, or makes one (mode 0600) on the first `--demo` start.
fn demo_secret(data_dir: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join(DEMO_SECRET_FILE);
    if path.exists() {
        return crate::auth::read_secret_file(&path);
    }
    std::fs::create_dir_all(data_dir).map_err(|error| format!("cannot create {}: {error}", data_dir.display()))?;
    let secret = crate::auth::generate_secret();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|error| format!("cannot create {}: {error}", path.display()))?;
    file.write_all(&secret).map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    Ok(secret)
}

/// The access rules stored in the data directory (none in a new one).
fn load_rules(database: &Database) -> Result<RuleSet, String> {
    let engine = database.engine();
    let Some(collection) = engine.collection_id(RULES_COLLECTION).and_then(|id| engine.collection(id)) else {
        return Ok(RuleSet::default());
    };
    let Some(item) = collection.get(RULES_ITEM) else { return Ok(RuleSet::default()) };
    let doc: RulesDoc = crate::strict_json::parse(item.payload(), "the stored access rules")
        .map_err(|error| format!("the stored access rules do not parse: {}", error.message))?;
    RuleSet::compile(doc).map_err(|error| format!("the stored access rules are refused: {error}"))
}

fn limits_json(options: &ServeOptions, max_connections: usize) -> serde_json::Value {
    let mut json = limits::as_json();
    json["max_connections"] = max_connections.into();
    json["header_timeout_secs"] = options.header_timeout.as_secs().into();
    json["outbound_buffer_bytes"] = options.outbound_budget.into();
    json["slow_close_after_secs"] = options.slow_close_after.as_secs().into();
    json["ws_messages_per_second"] = options.ws_messages_per_second.into();
    json["http_requests_per_second"] = options.http_requests_per_second.into();
    json["session_retention_secs"] = options.session_retention.as_secs().into();
    json["auth_timeout_secs"] = options.auth_timeout.as_secs().into();
    json["max_unauthenticated_connections"] = limits::unauthenticated_cap(max_connections).into();
    json["auth_expiry_grace_secs"] = options.auth_grace.as_secs().into();
    json
}

async fn expire_sessions(registry: Arc<Registry>, writer: WriterSender, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
        for session in registry.expire(Instant::now()) {
            if writer.send(Command::DropSession { session }).await.is_err() {
                return;
            }
        }
    }
}

/// Installs the SIGINT and SIGTERM handlers now (so a signal that comes right
/// after the address is printed stops the server gracefully instead of killing
/// it) and returns what waits for either.
fn signal_listener() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|error| format!("cannot handle SIGINT: {error}"))?;
    let mut terminate = signal(SignalKind::terminate()).map_err(|error| format!("cannot handle SIGTERM: {error}"))?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

/// A server holds a socket per connection: lift the soft descriptor limit to
/// the hard one, which is often 1 024 against 500 000. Returns the soft limit
/// in force afterwards, which the connection cap stays below.
fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `getrlimit` and `setrlimit` read or write only the struct we pass,
    // which lives on our stack for the duration of each call.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            // Unknown: assume the common default, so the cap stays below it.
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}
