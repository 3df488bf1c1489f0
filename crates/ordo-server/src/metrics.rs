//! Counters for `/metrics`. Plain relaxed atomics: each is bumped by one kind of
//! thread, read rarely, and nothing is ordered by them. Each single-valued
//! metric is declared once, in `metrics!` below, in the order `/metrics` shows
//! it; the labelled families (errors by code, refused tokens by reason, stage
//! histograms, allocations by thread kind) follow them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::auth::AuthFailure;
use crate::error::ErrorCode;

/// Declares the single-valued metrics, each once, in the order `/metrics`
/// shows them. An entry is either kept here, `field: kind "name" "help";` (an
/// `AtomicU64` field of `Metrics`, bumped with `add`), or read when `/metrics`
/// is scraped, `kind "name" "help" = |gauges, writer_queue_depth| value;`.
/// Generates `Metrics` (with the labelled families' fields), its initialiser
/// `METRICS`, and `render_single_valued`, which writes each entry's `HELP`,
/// `TYPE` and value lines.
macro_rules! metrics {
    (@munch $names:tt [$($fields:tt)*] [$($lines:tt)*]
        $(#[$attr:meta])* $field:ident: $kind:ident $name:literal $help:literal; $($rest:tt)*) => {
        metrics!(@munch $names [$($fields)* $(#[$attr])* $field] [$($lines)* ($kind $name $help (METRICS.$field.load(Relaxed)))] $($rest)*);
    };
    (@munch ($out:ident, $gauges:ident, $depth:ident) $fields:tt [$($lines:tt)*]
        $kind:ident $name:literal $help:literal = $value:expr; $($rest:tt)*) => {
        metrics!(@munch ($out, $gauges, $depth) $fields [$($lines)* ($kind $name $help (read($gauges, $depth, $value)))] $($rest)*);
    };
    (@munch ($out:ident, $gauges:ident, $depth:ident) [$($(#[$attr:meta])* $field:ident)*] [$(($kind:ident $name:literal $help:literal $value:tt))*]) => {
        pub struct Metrics {
            $($(#[$attr])* pub $field: AtomicU64,)*
            errors: [AtomicU64; ErrorCode::ALL.len()],
            auth_failures: [AtomicU64; AuthFailure::ALL.len()],
            stages: [StageHistogram; Stage::ALL.len()],
        }

        pub static METRICS: Metrics = Metrics {
            $($field: AtomicU64::new(0),)*
            errors: [const { AtomicU64::new(0) }; ErrorCode::ALL.len()],
            auth_failures: [const { AtomicU64::new(0) }; AuthFailure::ALL.len()],
            stages: [const { StageHistogram::new() }; Stage::ALL.len()],
        };

        fn render_single_valued($out: &mut String, $gauges: &WriterGauges, $depth: usize) {
            $(write_metric($out, $name, stringify!($kind), $help, $value);)*
        }
    };
    // The entry point (last: every `@munch` call would match it too).
    ($($entries:tt)*) => {
        metrics!(@munch (out, gauges, writer_queue_depth) [] [] $($entries)*);
    };
}

metrics! {
    batches: counter "ordo_batches_total" "Batches acknowledged.";
    batches_refused: counter "ordo_batches_refused_total" "Batches refused.";
    gauge "ordo_last_seq" "Sequence number of the last committed batch." = |gauges, _| gauges.last_seq;
    counter "ordo_log_bytes_total" "Bytes of records appended to the write-ahead log since the server started."
        = |gauges, _| gauges.log_bytes;
    gauge "ordo_checkpoint_lag_batches"
        "Committed batches not yet checkpointed into LMDB (replayed from the log at the next start)."
        = |gauges, _| gauges.last_seq.saturating_sub(gauges.checkpointed_seq);
    gauge "ordo_items" "Items in all collections." = |gauges, _| gauges.n_items as u64;
    gauge "ordo_collections" "Collections." = |gauges, _| gauges.n_collections as u64;
    gauge "ordo_views" "Live views (shared sorted indexes)." = |gauges, _| gauges.n_views as u64;
    gauge "ordo_windows" "Engine windows." = |gauges, _| gauges.n_windows as u64;
    gauge "ordo_subscriptions" "Live subscriptions, attached or held for resume."
        = |gauges, _| gauges.n_subscriptions as u64;
    gauge "ordo_sessions" "Sessions, attached or held for resume." = |gauges, _| gauges.n_sessions as u64;
    gauge "ordo_identity_view_bytes_max"
        "Estimated bytes of the views held by the identity holding the most (budgeted identities only)."
        = |gauges, _| gauges.largest_identity_view_bytes as u64;
    gauge "ordo_identities_holding_views" "Budgeted identities holding views (live or parked)."
        = |gauges, _| gauges.n_budgeted_identities as u64;
    view_budget_refusals: counter "ordo_identity_view_budget_refusals_total"
        "Subscriptions and view changes refused for an identity's view budget.";
    connections: gauge "ordo_connections" "Open WebSocket connections.";
    unauthenticated_evicted: counter "ordo_unauthenticated_connections_closed_total"
        "WebSockets without a token closed to make room within the unauthenticated share of the cap.";
    tcp_connections: gauge "ordo_tcp_connections"
        "Open TCP connections (HTTP and WebSocket), counted against max_connections.";
    connections_refused: counter "ordo_connections_refused_total"
        "TCP connections refused (503) because max_connections were open.";
    http_requests: counter "ordo_http_requests_total" "HTTP requests answered.";
    gauge "ordo_core_queue_depth" "Requests waiting for the writer thread."
        = |_, writer_queue_depth| writer_queue_depth as u64;
    outbound_queued_bytes: gauge "ordo_outbound_queued_bytes" "Bytes of frames waiting in outbound queues.";
    frames_sent: counter "ordo_frames_sent_total" "WebSocket frames written.";
    bytes_sent: counter "ordo_bytes_sent_total" "WebSocket bytes written.";
    diffs_sent: counter "ordo_diffs_sent_total" "Diffs in the frames written.";
    frames_encoded: counter "ordo_frames_encoded_total" "Frame bodies encoded (once per window change).";
    frame_body_pool_misses: counter "ordo_frame_body_pool_misses_total"
        "Frame bodies allocated because no recycled one of their size was idle (warm-up, bursts, bodies over 64 KiB).";
    resets_slow: counter "ordo_resets_slow_total" "Resets sent because a connection fell behind.";
    resume_replayed: counter "ordo_resume_replayed_total" "Subscriptions resumed by replay.";
    resume_reset: counter "ordo_resume_reset_total" "Subscriptions resumed by a reset.";
    closed_slow: counter "ordo_closed_slow_total" "Connections closed for being slow (4001).";
    parked_for_min_seq: counter "ordo_parked_for_min_seq_total"
        "WebSocket requests (subscribe, set_view, set_range, resume) held until the store reached their min_seq.";
    silent_sockets_closed: counter "ordo_silent_sockets_closed_total"
        "TCP connections closed before their first request to keep the sockets that sent nothing within their share of the cap.";
    claims_outside_alphabet: counter "ordo_claims_outside_alphabet_total"
        "Claims a collection pattern did not bind because they hold characters outside the claim alphabet.";
}

/// One single-valued metric's lines.
fn write_metric(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

/// A value read at scrape time (gives the entry's closure its parameter types).
fn read(gauges: &WriterGauges, writer_queue_depth: usize, value: impl Fn(&WriterGauges, usize) -> u64) -> u64 {
    value(gauges, writer_queue_depth)
}

pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

pub fn count_error(code: ErrorCode) {
    let index = ErrorCode::ALL.iter().position(|&c| c == code).expect("every code is listed");
    METRICS.errors[index].fetch_add(1, Relaxed);
}

/// A refused token, by reason (`ordo_auth_failures_total`).
pub fn count_auth_failure(failure: AuthFailure) {
    let index = AuthFailure::ALL.iter().position(|&f| f == failure).expect("every reason is listed");
    METRICS.auth_failures[index].fetch_add(1, Relaxed);
}

/// The steps between a write arriving and its diffs reaching the sockets, timed
/// so that an operator (and `loadgen`) can see where latency goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// A write request handed to the writer thread → the writer takes it.
    WriteQueue,
    /// One group commit's log write and `fdatasync`.
    LogAppend,
    /// One group's engine updates and diff encoding, after its log append.
    Apply,
    /// A frame queued by the writer thread → its connection task takes it.
    FrameQueue,
    /// One socket write of a connection's ready frames.
    SocketWrite,
}

impl Stage {
    pub const ALL: [Stage; 5] =
        [Stage::WriteQueue, Stage::LogAppend, Stage::Apply, Stage::FrameQueue, Stage::SocketWrite];

    fn name(self) -> &'static str {
        match self {
            Stage::WriteQueue => "write_queue",
            Stage::LogAppend => "log_append",
            Stage::Apply => "apply",
            Stage::FrameQueue => "frame_queue",
            Stage::SocketWrite => "socket_write",
        }
    }
}

/// Upper bounds of the histogram buckets, in microseconds (a last bucket takes
/// the rest). Fine below 10 ms, where the latency goal is.
const STAGE_BUCKET_BOUNDS_US: [u64; 22] = [
    10, 25, 50, 100, 250, 500, 750, 1_000, 1_500, 2_000, 3_000, 4_000, 5_000, 7_500, 10_000, 15_000, 20_000, 30_000,
    50_000, 100_000, 250_000, 1_000_000,
];

pub struct StageHistogram {
    buckets: [AtomicU64; STAGE_BUCKET_BOUNDS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Default for StageHistogram {
    fn default() -> StageHistogram {
        StageHistogram::new()
    }
}

impl StageHistogram {
    const fn new() -> StageHistogram {
        StageHistogram {
            buckets: [const { AtomicU64::new(0) }; STAGE_BUCKET_BOUNDS_US.len() + 1],
            sum_us: AtomicU64::new(0),
        }
    }

    fn record(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        // 22 bounds: a scan is as fast as a search, and branch-predictable.
        let bucket =
            STAGE_BUCKET_BOUNDS_US.iter().position(|&bound| us <= bound).unwrap_or(STAGE_BUCKET_BOUNDS_US.len());
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }
}

pub fn record_stage(stage: Stage, elapsed: Duration) {
    METRICS.stages[stage as usize].record(elapsed);
}

/// Gauges only the writer thread knows, fetched when `/metrics` is scraped.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriterGauges {
    pub n_collections: usize,
    pub n_items: usize,
    pub n_views: usize,
    pub n_windows: usize,
    pub n_subscriptions: usize,
    pub n_sessions: usize,
    /// The estimated view bytes (`limits::view_cost_bytes`) of the identity holding the most.
    pub largest_identity_view_bytes: usize,
    /// Identities holding views under a budget.
    pub n_budgeted_identities: usize,
    pub last_seq: u64,
    pub checkpointed_seq: u64,
    pub log_bytes: u64,
}

pub fn render(gauges: &WriterGauges, writer_queue_depth: usize) -> String {
    let mut out = String::with_capacity(4096);
    render_single_valued(&mut out, gauges, writer_queue_depth);
    let m = &METRICS;
    let _ = writeln!(out, "# HELP ordo_errors_total Errors answered, by code.\n# TYPE ordo_errors_total counter");
    for (code, counter) in ErrorCode::ALL.iter().zip(&m.errors) {
        let _ = writeln!(out, "ordo_errors_total{{code=\"{}\"}} {}", code.as_str(), counter.load(Relaxed));
    }
    let _ = writeln!(
        out,
        "# HELP ordo_auth_failures_total Tokens refused, by reason.\n# TYPE ordo_auth_failures_total counter"
    );
    for (failure, counter) in AuthFailure::ALL.iter().zip(&m.auth_failures) {
        let _ = writeln!(out, "ordo_auth_failures_total{{reason=\"{}\"}} {}", failure.reason(), counter.load(Relaxed));
    }
    let _ = writeln!(
        out,
        "# HELP ordo_stage_seconds Time spent in each step from a write's arrival to its frames' socket write.\n# TYPE ordo_stage_seconds histogram"
    );
    for stage in Stage::ALL {
        let histogram = &m.stages[stage as usize];
        let mut cumulative = 0;
        for (index, bucket) in histogram.buckets.iter().enumerate() {
            cumulative += bucket.load(Relaxed);
            let bound = match STAGE_BUCKET_BOUNDS_US.get(index) {
                Some(&us) => format!("{}", us as f64 / 1e6),
                None => "+Inf".to_owned(),
            };
            let _ =
                writeln!(out, "ordo_stage_seconds_bucket{{stage=\"{}\",le=\"{bound}\"}} {cumulative}", stage.name());
        }
        let sum = histogram.sum_us.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "ordo_stage_seconds_sum{{stage=\"{}\"}} {sum}", stage.name());
        let _ = writeln!(out, "ordo_stage_seconds_count{{stage=\"{}\"}} {cumulative}", stage.name());
    }
    let _ = writeln!(
        out,
        "# HELP ordo_thread_allocated_bytes_total Heap bytes allocated, by thread kind.\n# TYPE ordo_thread_allocated_bytes_total counter"
    );
    for kind in ThreadKind::ALL {
        let _ = writeln!(
            out,
            "ordo_thread_allocated_bytes_total{{thread=\"{}\"}} {}",
            kind.name(),
            ALLOCATED_BYTES[kind as usize].load(Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP ordo_thread_allocations_total Heap allocations, by thread kind.\n# TYPE ordo_thread_allocations_total counter"
    );
    for kind in ThreadKind::ALL {
        let _ = writeln!(
            out,
            "ordo_thread_allocations_total{{thread=\"{}\"}} {}",
            kind.name(),
            ALLOCATIONS[kind as usize].load(Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP ordo_frame_delivery_allocations_total Heap allocations of network threads while delivering frames to connections (from the writer's queue to the socket).\n# TYPE ordo_frame_delivery_allocations_total counter\nordo_frame_delivery_allocations_total {}",
        FRAME_DELIVERY_ALLOCATIONS.load(Relaxed)
    );
    out
}

/// Which kind of thread an allocation happened on (RavenDB's per-thread memory
/// accounting, coarsened to the three kinds this server has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadKind {
    Other = 0,
    Writer = 1,
    Network = 2,
}

impl ThreadKind {
    const ALL: [ThreadKind; 3] = [ThreadKind::Writer, ThreadKind::Network, ThreadKind::Other];

    fn name(self) -> &'static str {
        match self {
            ThreadKind::Other => "other",
            ThreadKind::Writer => "writer",
            ThreadKind::Network => "network",
        }
    }
}

static ALLOCATED_BYTES: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
static ALLOCATIONS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
/// Allocations made while a network thread delivered frames (see `delivering_frames`).
static FRAME_DELIVERY_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    // A const-initialised `Cell` has no destructor, so the allocator may read it
    // at any point of a thread's life, even while thread-locals are torn down.
    static THREAD_KIND: Cell<ThreadKind> = const { Cell::new(ThreadKind::Other) };
    /// Set while this thread polls a connection's delivery of frames.
    static DELIVERING_FRAMES: Cell<bool> = const { Cell::new(false) };
}

/// Runs `delivery` (a connection's handling of what the writer thread queued for
/// it, up to the socket write) counting the allocations made while it is polled
/// in `ordo_frame_delivery_allocations_total`. Only its own polls count: other
/// tasks the thread runs between them do not. This separates the frames' cost
/// on the network threads from the HTTP requests' that share them.
///
/// It takes the future pinned where the caller keeps it: taken by value, it
/// would be stored twice in the caller's state (the argument and the pinned
/// copy), and a connection's task is as large as its largest state.
pub async fn delivering_frames<F: std::future::Future>(mut delivery: std::pin::Pin<&mut F>) -> F::Output {
    std::future::poll_fn(|context| {
        let was_delivering = DELIVERING_FRAMES.with(|flag| flag.replace(true));
        let poll = delivery.as_mut().poll(context);
        DELIVERING_FRAMES.with(|flag| flag.set(was_delivering));
        poll
    })
    .await
}

/// Marks the calling thread's allocations as `kind`'s.
pub fn set_thread_kind(kind: ThreadKind) {
    THREAD_KIND.with(|cell| cell.set(kind));
}

/// The system allocator, counting bytes and calls per thread kind. The `ordo`
/// binary installs it with `#[global_allocator]`.
pub struct CountingAllocator;

fn count_allocation(size: usize) {
    let kind = THREAD_KIND.try_with(Cell::get).unwrap_or(ThreadKind::Other) as usize;
    ALLOCATED_BYTES[kind].fetch_add(size as u64, Relaxed);
    ALLOCATIONS[kind].fetch_add(1, Relaxed);
    if DELIVERING_FRAMES.try_with(Cell::get).unwrap_or(false) {
        FRAME_DELIVERY_ALLOCATIONS.fetch_add(1, Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; the counting touches only atomics and a const thread-local, which
// never allocate, so the allocator cannot recurse into itself.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_allocation(layout.size());
        // SAFETY: same contract as ours, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_allocation(layout.size());
        // SAFETY: same contract as ours, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_allocation(new_size);
        // SAFETY: same contract as ours, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

pub fn sub_queued(n: usize) {
    METRICS.outbound_queued_bytes.fetch_sub(n as u64, Relaxed);
}
