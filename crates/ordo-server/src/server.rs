//! `ordo serve`: opens the data directory (rebuilding everything in it), starts
//! the writer thread and the network runtime, and stops cleanly on SIGINT or
//! SIGTERM: no new requests, the writes in flight finish, the store is closed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use ordo_store::{print_load_progress, Database, Durability, StoreOptions};

use crate::core::{Command, Core};
use crate::demo;
use crate::http::{self, HttpState};
use crate::limits;
use crate::metrics::{self, ThreadKind};
use crate::name_routes::NameRoutes;
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
    /// `--header-timeout`: how long a connection may take to send a request head
    /// (or sit idle between HTTP/1.1 requests) before it is closed.
    pub header_timeout: Duration,
    /// `--demo`: fill `rooms` if it is empty and run the traffic simulator.
    pub demo: bool,
    /// `--demo-rate`: the simulator's messages per second at start.
    pub demo_rate: u32,
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
            header_timeout: Duration::from_secs(limits::DEFAULT_HEADER_TIMEOUT_SECS),
            demo: false,
            demo_rate: limits::DEFAULT_DEMO_MESSAGES_PER_SECOND,
        }
    }
}

/// One network thread per core, at most [`limits::DEFAULT_MAX_NETWORK_THREADS`].
/// A second thread keeps frames moving while the first is descheduled or busy
/// with a burst (docs/BENCHMARKS.md, the session-4 bullet on the server).
pub fn default_network_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, limits::DEFAULT_MAX_NETWORK_THREADS)
}

/// Runs the server until a signal stops it.
pub fn serve(options: ServeOptions) -> Result<(), String> {
    let nofile = raise_open_file_limit();
    let max_connections = limits::connection_cap(nofile);
    let started = Instant::now();
    let store_options = StoreOptions {
        durability: options.durability,
        checkpoint_interval: options.checkpoint_interval,
        ..StoreOptions::default()
    };
    let (database, report) = Database::open(&options.data_dir, store_options, &mut print_load_progress)
        .map_err(|error| format!("cannot open the data directory {}: {error}", options.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&options.data_dir).unwrap_or_else(|_| options.data_dir.clone());
    println!(
        "ordo {}: data in {} ({} collections, {} items, last seq {}; loaded in {:.2} s)",
        env!("CARGO_PKG_VERSION"),
        data_dir.display(),
        report.n_collections,
        report.n_items,
        report.last_seq,
        started.elapsed().as_secs_f64()
    );
    if report.n_log_records_replayed > 0 || report.n_log_bytes_cut_off > 0 {
        println!(
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

    let routes = Arc::new(RwLock::new(NameRoutes::new()));
    let core = Core::new(database, routes.clone(), options.outbound_budget);
    core.publish_routes();
    let (core_tx, core_rx) = mpsc::channel(limits::CORE_QUEUE_CAPACITY);
    let writer = std::thread::Builder::new()
        .name("ordo-writer".to_owned())
        .spawn(move || core.run(core_rx))
        .map_err(|error| format!("cannot start the writer thread: {error}"))?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.network_threads.max(1))
        .thread_name("ordo-network")
        .on_thread_start(|| metrics::set_thread_kind(ThreadKind::Network))
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the network runtime: {error}"))?;

    let result = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .map_err(|error| format!("cannot listen on {}: {error}", options.listen))?;
        let address = listener.local_addr().map_err(|error| error.to_string())?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let stop_signal = signal_listener()?;
        // The demo's rooms are written before the address is printed, so whoever
        // waits for that line finds them there.
        let demo = if options.demo {
            let started = demo::start(&core_tx, &routes, options.demo_rate, shutdown_rx.clone()).await?;
            if started.n_rooms_written > 0 {
                println!("ordo: demo: wrote {} rooms into `rooms`", started.n_rooms_written);
            } else {
                println!("ordo: demo: `rooms` holds {} rooms already", started.n_rooms);
            }
            Some(started.simulator)
        } else {
            None
        };
        println!("ordo: listening on http://{address} (WebSocket: ws://{address}/v1/ws); Ctrl-C stops");
        match &demo {
            Some(simulator) => println!(
                "ordo: demo on http://{address}/demo (simulator: {} messages/s; POST /demo/simulator {{\"rate\":N}} changes it)",
                simulator.rate()
            ),
            None => println!("ordo: demo page on http://{address}/demo (`--demo` adds rooms and live traffic)"),
        }
        if max_connections < limits::MAX_CONNECTIONS {
            println!(
                "ordo: at most {max_connections} connections at once (the descriptor limit is {nofile}; \
                 raise `ulimit -n` for more)"
            );
        }
        let limits_json = Arc::new(limits_json(&options, max_connections));
        let registry = Arc::new(Registry::default());
        let state = Arc::new(HttpState {
            core: core_tx.clone(),
            routes,
            registry: registry.clone(),
            connection: ConnectionConfig {
                outbound_budget: options.outbound_budget,
                slow_close_after: options.slow_close_after,
                messages_per_second: options.ws_messages_per_second,
                session_retention: options.session_retention,
            },
            http_requests_per_second: options.http_requests_per_second,
            max_connections,
            header_timeout: options.header_timeout,
            shutdown: shutdown_rx.clone(),
            limits_json,
            demo,
        });
        tokio::spawn(expire_sessions(registry, core_tx.clone(), shutdown_rx.clone()));
        tokio::spawn(async move {
            stop_signal.await;
            println!("ordo: stopping (finishing the requests in flight)");
            let _ = shutdown_tx.send(true);
        });
        http::serve(listener, state, shutdown_rx, Duration::from_secs(10)).await;
        Ok::<(), String>(())
    });
    // Every sender is gone once the runtime is: the writer finishes what is queued and returns.
    runtime.shutdown_timeout(Duration::from_secs(5));
    let database = writer.join().map_err(|_| "the writer thread panicked".to_owned())?;
    let last_seq = database.last_seq();
    drop(database);
    println!("ordo: stopped; last seq {last_seq}");
    result
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
    json
}

async fn expire_sessions(registry: Arc<Registry>, core: mpsc::Sender<Command>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
        for session in registry.expire(Instant::now()) {
            if core.send(Command::DropSession { session }).await.is_err() {
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
