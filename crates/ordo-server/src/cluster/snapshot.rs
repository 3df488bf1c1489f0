//! Snapshots for new nodes (docs/SCALING.md, "New and lagging nodes; retention and snapshots").
//!
//! A snapshot is the existing hot backup (`ordo_store::Backup`: a data
//! directory holding exactly the entries `1..=seq`, docs/STORAGE.md "Backup")
//! published in a directory every node can read (`--snapshot-dir`) as
//! `snapshot-<seq>/`. In cluster mode the store's seq is the stream's seq, so a
//! node that copies `snapshot-<seq>` and then consumes the stream from `seq + 1`
//! has applied every entry exactly once.
//!
//! Three parts, each usable on its own:
//! - [`SnapshotScheduler`] (writer thread): every `--snapshot-every` entries it
//!   starts a backup (the writer only pins the log) and hands the copy to a
//!   thread of its own; at most one runs at a time.
//! - [`write_snapshot`] / [`prune`] / [`list_snapshots`]: the directory. A
//!   snapshot is written under a staging name and renamed to `snapshot-<seq>`
//!   when whole, so a reader never sees a partial one; the newest
//!   [`DEFAULT_SNAPSHOTS_KEPT`] are kept.
//! - [`plan_start`] / [`prepare_data_dir`] (start-up, before the store opens):
//!   which snapshot to restore, if any, and from which seq to consume. When
//!   the stream's retention dropped an entry that neither the local state nor
//!   any snapshot covers, the node refuses to start ([`SnapshotError::Gap`]):
//!   never a silent gap.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_store::{Database, StoreError};

/// The name of a published snapshot: `snapshot-<seq>` (decimal, no padding).
pub const SNAPSHOT_PREFIX: &str = "snapshot-";
/// Staging names start with a dot, so [`list_snapshots`] never lists them.
const STAGING_PREFIX: &str = ".snapshot-staging-";
const DELETING_PREFIX: &str = ".snapshot-deleting-";
/// Snapshots kept in the directory: a node copying the newest while a newer one
/// is published and the oldest pruned still finds its copy's source.
pub const DEFAULT_SNAPSHOTS_KEPT: usize = 3;

/// A published snapshot: holds exactly the stream's entries `1..=seq`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub seq: u64,
    pub path: PathBuf,
}

/// The stream's bounds as JetStream reports them (`StreamState::first_sequence`,
/// `last_sequence`): the entries `first_seq..=last_seq` are in the stream. An
/// empty stream whose entries were all dropped has `first_seq = last_seq + 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamBounds {
    pub first_seq: u64,
    pub last_seq: u64,
}

/// How a node reaches the stream's head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartPlan {
    /// Open the data directory as it is and consume from `from_seq` (its
    /// last applied seq + 1; 1 for an empty directory).
    Replay { from_seq: u64 },
    /// Copy `snapshot` into the (empty) data directory, then consume from
    /// `snapshot.seq + 1`.
    Restore { snapshot: SnapshotInfo },
}

impl StartPlan {
    /// The first stream seq the node consumes.
    pub fn from_seq(&self) -> u64 {
        match self {
            StartPlan::Replay { from_seq } => *from_seq,
            StartPlan::Restore { snapshot } => snapshot.seq + 1,
        }
    }
}

#[derive(Debug)]
pub enum SnapshotError {
    /// The stream no longer holds the entries after the node's state (or after
    /// every snapshot's): starting would skip entries.
    Gap {
        stream: StreamBounds,
        local_seq: Option<u64>,
        newest_snapshot_seq: Option<u64>,
        snapshot_dir: Option<PathBuf>,
    },
    /// A state (local or a snapshot) past the stream's last entry: it was
    /// written from another stream (a stream deleted and created again).
    AheadOfStream {
        what: String,
        seq: u64,
        stream: StreamBounds,
    },
    Io {
        path: PathBuf,
        doing: &'static str,
        source: std::io::Error,
    },
    Store(StoreError),
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::Gap { stream, local_seq, newest_snapshot_seq, snapshot_dir } => {
                write!(
                    f,
                    "cannot start without a gap: the stream holds entries {}..={} (its retention dropped the ones \
                     before {}), ",
                    stream.first_seq, stream.last_seq, stream.first_seq
                )?;
                match local_seq {
                    Some(seq) => write!(f, "this node's data directory is at seq {seq}, ")?,
                    None => write!(f, "this node's data directory is empty, ")?,
                }
                match (newest_snapshot_seq, snapshot_dir) {
                    (Some(seq), Some(dir)) => {
                        write!(f, "and the newest snapshot in {} is at seq {seq}", dir.display())?
                    }
                    (None, Some(dir)) => write!(f, "and {} holds no snapshot", dir.display())?,
                    // A directory with state is never replaced (check_resume).
                    (_, None) if local_seq.is_some_and(|seq| seq > 0) => {
                        write!(f, "and a data directory with state is never replaced by a snapshot")?
                    }
                    (_, None) => write!(f, "and no --snapshot-dir was given")?,
                }
                write!(
                    f,
                    ". It needs a snapshot at seq {} or later: let an up-to-date node write one (--snapshot-dir \
                     with --snapshot-every), start this node with an empty data directory, and size the stream's \
                     retention to cover at least two snapshot intervals plus the time to copy one (docs/SCALING.md)",
                    stream.first_seq.saturating_sub(1)
                )
            }
            SnapshotError::AheadOfStream { what, seq, stream } => write!(
                f,
                "{what} is at seq {seq} but the stream ends at seq {}: it was written from another stream (was the \
                 stream deleted and created again?); start this node with an empty data directory and remove \
                 snapshots of the old stream",
                stream.last_seq
            ),
            SnapshotError::Io { path, doing, source } => write!(f, "{doing} {}: {source}", path.display()),
            SnapshotError::Store(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for SnapshotError {}

impl From<StoreError> for SnapshotError {
    fn from(error: StoreError) -> SnapshotError {
        SnapshotError::Store(error)
    }
}

fn io_error<'a>(path: &'a Path, doing: &'static str) -> impl FnOnce(std::io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io { path: path.to_owned(), doing, source }
}

/// The published snapshots in `dir`, oldest first. Staging and half-deleted
/// directories (dot names) and anything not named `snapshot-<decimal>` are
/// ignored; an absent directory holds none.
pub fn list_snapshots(dir: &Path) -> Result<Vec<SnapshotInfo>, SnapshotError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(SnapshotError::Io { path: dir.to_owned(), doing: "listing snapshots in", source }),
    };
    let mut snapshots = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_error(dir, "listing snapshots in"))?;
        let name = entry.file_name();
        let Some(seq) = name.to_str().and_then(parse_snapshot_name) else { continue };
        if entry.file_type().map(|kind| kind.is_dir()).unwrap_or(false) {
            snapshots.push(SnapshotInfo { seq, path: entry.path() });
        }
    }
    snapshots.sort_by_key(|snapshot| snapshot.seq);
    Ok(snapshots)
}

fn parse_snapshot_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(SNAPSHOT_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Writes `backup` into `dir` as `snapshot-<N>`, N the last stream message it
/// holds whole (`scheme`; it may hold entries of the next one too, which the
/// node that restores it skips), and prunes to the newest `keep`. Runs on the caller's thread (never the writer's): the copy takes as
/// long as the data directory takes to read. `node` names the staging
/// directory, so nodes sharing `dir` never write into each other's.
pub fn write_snapshot(
    backup: ordo_store::Backup,
    dir: &Path,
    node: &str,
    keep: usize,
    scheme: super::pack::SeqScheme,
) -> Result<SnapshotInfo, SnapshotError> {
    std::fs::create_dir_all(dir).map_err(io_error(dir, "creating the snapshot directory"))?;
    let dir = std::fs::canonicalize(dir).map_err(io_error(dir, "resolving the snapshot directory"))?;
    let node: String =
        node.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    let staging = dir.join(format!("{STAGING_PREFIX}{node}-{}", std::process::id()));
    // A staging directory of this node and process is a snapshot that failed half way.
    let _ = std::fs::remove_dir_all(&staging);
    let report = backup.write_to(&staging)?;
    let message = scheme.applied_stream_seq(report.seq);
    let published = dir.join(format!("{SNAPSHOT_PREFIX}{message}"));
    if let Err(source) = std::fs::rename(&staging, &published) {
        let _ = std::fs::remove_dir_all(&staging);
        // Another node published the same message first: the same entries (or
        // some of the next message's more or less, which a restore skips or
        // applies), so a state as good; theirs stands.
        if !published.is_dir() {
            return Err(SnapshotError::Io { path: published, doing: "publishing the snapshot", source });
        }
    }
    sync_dir(&dir).map_err(io_error(&dir, "syncing the snapshot directory"))?;
    prune(&dir, keep)?;
    Ok(SnapshotInfo { seq: message, path: published })
}

/// Removes all but the newest `keep` snapshots (at least one is always kept).
/// Each is renamed to a dot name first, so no listing shows a half-deleted one.
pub fn prune(dir: &Path, keep: usize) -> Result<usize, SnapshotError> {
    let snapshots = list_snapshots(dir)?;
    let n_remove = snapshots.len().saturating_sub(keep.max(1));
    let mut n_removed = 0;
    for snapshot in &snapshots[..n_remove] {
        let doomed = dir.join(format!("{DELETING_PREFIX}{}-{}", snapshot.seq, std::process::id()));
        // Another node may be pruning the same one: whoever renames it deletes it.
        if std::fs::rename(&snapshot.path, &doomed).is_ok() {
            std::fs::remove_dir_all(&doomed).map_err(io_error(&doomed, "removing an old snapshot"))?;
            n_removed += 1;
        }
    }
    Ok(n_removed)
}

/// Decides how a node reaches the stream's head. `local_seq` is the data
/// directory's last applied seq, `None` when the directory is empty (a new
/// node). `snapshots` oldest first, as [`list_snapshots`] gives them.
///
/// - An empty directory restores the newest snapshot when one exists (it is
///   newer than nothing, and the stream need not hold seq 1 then); without one
///   it replays from seq 1, which the stream must still hold.
/// - A directory with state resumes from its own seq + 1, which the stream
///   must still hold (a directory is never replaced under a node: emptying it
///   is the operator's decision, and the error says so).
/// - A state past the stream's end belongs to another stream and is refused.
pub fn plan_start(
    local_seq: Option<u64>,
    stream: StreamBounds,
    snapshots: &[SnapshotInfo],
    snapshot_dir: Option<&Path>,
) -> Result<StartPlan, SnapshotError> {
    let gap = |newest: Option<u64>| SnapshotError::Gap {
        stream,
        local_seq,
        newest_snapshot_seq: newest,
        snapshot_dir: snapshot_dir.map(Path::to_owned),
    };
    // The stream holds `from_seq` onwards, or `from_seq` is the next entry to come.
    let covered = |from_seq: u64| from_seq >= stream.first_seq && from_seq <= stream.last_seq + 1;
    match local_seq {
        Some(seq) => {
            if seq > stream.last_seq {
                return Err(SnapshotError::AheadOfStream { what: "this node's data directory".into(), seq, stream });
            }
            if covered(seq + 1) {
                Ok(StartPlan::Replay { from_seq: seq + 1 })
            } else {
                Err(gap(snapshots.last().map(|snapshot| snapshot.seq)))
            }
        }
        None => match snapshots.last() {
            Some(newest) => {
                if newest.seq > stream.last_seq {
                    return Err(SnapshotError::AheadOfStream {
                        what: format!("the snapshot {}", newest.path.display()),
                        seq: newest.seq,
                        stream,
                    });
                }
                if covered(newest.seq + 1) {
                    Ok(StartPlan::Restore { snapshot: newest.clone() })
                } else {
                    Err(gap(Some(newest.seq)))
                }
            }
            None if covered(1) => Ok(StartPlan::Replay { from_seq: 1 }),
            None => Err(gap(None)),
        },
    }
}

/// Whether `data_dir` holds no state: absent, or without an LMDB file and a
/// log segment (an empty directory made by hand, say).
pub fn data_dir_is_empty(data_dir: &Path) -> Result<bool, SnapshotError> {
    let entries = match std::fs::read_dir(data_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(source) => return Err(SnapshotError::Io { path: data_dir.to_owned(), doing: "reading", source }),
    };
    for entry in entries {
        let entry = entry.map_err(io_error(data_dir, "reading"))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == "data.mdb" || (name.starts_with("wal-") && name.ends_with(".log")) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What [`prepare_data_dir`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    pub plan: StartPlan,
    /// Bytes copied from the snapshot and how long the copy took (0 without one).
    pub n_bytes_copied: u64,
    pub copy_time: Duration,
}

/// Start-up of a cluster node, before its store opens. For an empty data
/// directory, plans against the stream and the snapshots and copies the
/// chosen snapshot in (then `Database::open` finds `last_seq` = the snapshot's
/// seq and replays its log tail); a directory with state is left alone and
/// checked after it opens with [`check_resume`]. `stream` must have been read
/// before the snapshots were listed: a snapshot published meanwhile is only newer.
pub fn prepare_data_dir(
    data_dir: &Path,
    snapshot_dir: Option<&Path>,
    stream: StreamBounds,
) -> Result<Option<Prepared>, SnapshotError> {
    if !data_dir_is_empty(data_dir)? {
        return Ok(None);
    }
    // A node pruning the chosen snapshot while it is copied: the next newest is
    // then gone too or newer, so list again and retry a few times.
    let mut attempts = 0;
    loop {
        let snapshots = match snapshot_dir {
            Some(dir) => list_snapshots(dir)?,
            None => Vec::new(),
        };
        let plan = plan_start(None, stream, &snapshots, snapshot_dir)?;
        let StartPlan::Restore { snapshot } = &plan else {
            return Ok(Some(Prepared { plan, n_bytes_copied: 0, copy_time: Duration::ZERO }));
        };
        let started = Instant::now();
        match restore(snapshot, data_dir) {
            Ok(n_bytes_copied) => {
                return Ok(Some(Prepared { n_bytes_copied, copy_time: started.elapsed(), plan }));
            }
            Err(error) if attempts < 3 && !snapshot.path.is_dir() => {
                tracing::warn!("snapshot {} was pruned while copied ({error}); trying the newest again", snapshot.seq);
                attempts += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// `ordo serve --cluster` before its store opens: reads the stream's bounds
/// (creating the stream if absent, with the node's retention flags) and, for an
/// empty data directory, restores the newest snapshot or refuses a gap
/// ([`prepare_data_dir`]). A directory with state is checked once open, in
/// `server::start_cluster` ([`check_resume`]).
pub fn bootstrap(options: &super::ClusterOptions, data_dir: &Path) -> Result<Option<Prepared>, String> {
    if !data_dir_is_empty(data_dir).map_err(|error| error.to_string())? {
        return Ok(None);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start a runtime to read the stream: {error}"))?;
    let state = runtime.block_on(async {
        let shared = super::Shared::new(&options.node_name, options.max_lag, 0);
        let cluster = super::Cluster::connect(options.clone(), shared).await?;
        cluster.stream_state().await
    })?;
    let stream = StreamBounds { first_seq: state.first_seq, last_seq: state.last_seq };
    let prepared = prepare_data_dir(data_dir, options.snapshot_dir.as_deref(), stream)
        .map_err(|error| format!("stream `{}`: {error}", options.stream))?;
    if let Some(Prepared { plan: StartPlan::Restore { snapshot }, n_bytes_copied, copy_time }) = &prepared {
        crate::logging::say!(
            "ordo: restored snapshot {} ({} bytes in {:.2} s) into {}; replaying the stream from seq {}",
            snapshot.path.display(),
            n_bytes_copied,
            copy_time.as_secs_f64(),
            data_dir.display(),
            snapshot.seq + 1
        );
    }
    Ok(prepared)
}

/// After the store opened: whether the stream still holds the message after
/// `local_seq`, the last stream message the store holds whole (the next one to
/// apply).
pub fn check_resume(local_seq: u64, stream: StreamBounds) -> Result<u64, SnapshotError> {
    plan_start(Some(local_seq), stream, &[], None).map(|plan| plan.from_seq())
}

/// Copies a snapshot's files into `data_dir` (absent or empty): into a staging
/// directory beside it, synced, then renamed into place, so a stop half way
/// leaves no partial data directory. Returns the bytes copied.
pub fn restore(snapshot: &SnapshotInfo, data_dir: &Path) -> Result<u64, SnapshotError> {
    let parent = match data_dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(io_error(&parent, "creating"))?;
    let name = data_dir.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let staging = parent.join(format!(".{name}.restore-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir(&staging).map_err(io_error(&staging, "creating"))?;
    let copied = copy_files(&snapshot.path, &staging).and_then(|n_bytes| {
        sync_dir(&staging).map_err(io_error(&staging, "syncing"))?;
        // An empty directory made by hand (a mount point, say) stays: its files come in one by one.
        if data_dir.is_dir() {
            for entry in std::fs::read_dir(&staging).map_err(io_error(&staging, "reading"))? {
                let entry = entry.map_err(io_error(&staging, "reading"))?;
                std::fs::rename(entry.path(), data_dir.join(entry.file_name()))
                    .map_err(io_error(data_dir, "moving the snapshot's files into"))?;
            }
            sync_dir(data_dir).map_err(io_error(data_dir, "syncing"))?;
            let _ = std::fs::remove_dir(&staging);
        } else {
            std::fs::rename(&staging, data_dir).map_err(io_error(data_dir, "moving the snapshot to"))?;
        }
        sync_dir(&parent).map_err(io_error(&parent, "syncing"))?;
        Ok(n_bytes)
    });
    if copied.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    copied
}

/// Copies the regular files of `from` (a snapshot holds `data.mdb` and at most
/// one log segment) into `to`, each synced.
fn copy_files(from: &Path, to: &Path) -> Result<u64, SnapshotError> {
    let mut n_bytes = 0;
    for entry in std::fs::read_dir(from).map_err(io_error(from, "reading the snapshot"))? {
        let entry = entry.map_err(io_error(from, "reading the snapshot"))?;
        if !entry.file_type().map_err(io_error(from, "reading the snapshot"))?.is_file() {
            continue;
        }
        let target = to.join(entry.file_name());
        n_bytes += std::fs::copy(entry.path(), &target).map_err(io_error(&entry.path(), "copying"))?;
        File::open(&target).and_then(|file| file.sync_all()).map_err(io_error(&target, "syncing"))?;
    }
    Ok(n_bytes)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What the snapshot thread has done, for `/metrics` and the logs.
#[derive(Debug, Default)]
pub struct SnapshotStats {
    /// The seq of the newest snapshot this node published (0: none yet).
    pub last_seq: AtomicU64,
    pub n_written: AtomicU64,
    pub n_failed: AtomicU64,
}

/// `--snapshot-dir` and `--snapshot-every`.
#[derive(Clone, Debug)]
pub struct SnapshotConfig {
    pub dir: PathBuf,
    /// Stream messages between two snapshots.
    pub every: u64,
    pub keep: usize,
    pub node: String,
}

/// Lives on the writer thread: [`SnapshotScheduler::after_apply`] is called after
/// each applied group and costs one comparison unless a snapshot is due.
pub struct SnapshotScheduler {
    config: SnapshotConfig,
    /// The seq the last snapshot started at (or the seq at start).
    last_started_seq: u64,
    running: Arc<AtomicBool>,
    stats: Arc<SnapshotStats>,
    /// The writer's queue, told when a copy ends: a snapshot that came due
    /// while another was running is started then, not only after the next
    /// entry (which may never come). Weak, so that it never keeps the writer's
    /// queue open at shutdown.
    wake_writer: Option<tokio::sync::mpsc::WeakSender<crate::writer::Command>>,
}

impl SnapshotScheduler {
    /// `current_seq`: the store's seq at start; the first snapshot is due
    /// `every` entries later.
    pub fn new(config: SnapshotConfig, current_seq: u64) -> SnapshotScheduler {
        SnapshotScheduler {
            last_started_seq: current_seq,
            config,
            running: Arc::new(AtomicBool::new(false)),
            stats: Arc::new(SnapshotStats::default()),
            wake_writer: None,
        }
    }

    /// Where to send `Command::SnapshotFinished` when a copy ends.
    pub fn wake_writer_with(&mut self, writer: tokio::sync::mpsc::WeakSender<crate::writer::Command>) {
        self.wake_writer = Some(writer);
    }

    pub fn stats(&self) -> Arc<SnapshotStats> {
        Arc::clone(&self.stats)
    }

    /// Whether a snapshot's copy is running now.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Starts a snapshot when `every` stream messages were applied since the
    /// last one started and none runs (`scheme` numbers the messages' entries).
    /// The writer only pins the log (`start_backup`); the copy runs on a thread
    /// of its own. Returns whether one started.
    pub fn after_apply(&mut self, database: &Database, scheme: super::pack::SeqScheme) -> bool {
        let seq = database.last_seq();
        let due_at = scheme.applied_stream_seq(self.last_started_seq).saturating_add(self.config.every);
        if scheme.applied_stream_seq(seq) < due_at || self.running.load(Ordering::Acquire) {
            return false;
        }
        let backup = match database.start_backup() {
            Ok(backup) => backup,
            // An admin's `POST /v1/backup` runs: try again after the next group.
            Err(StoreError::BackupRunning { .. }) => return false,
            Err(error) => {
                tracing::warn!("snapshot not started: {error}");
                self.stats.n_failed.fetch_add(1, Ordering::Relaxed);
                self.last_started_seq = seq;
                return false;
            }
        };
        self.last_started_seq = seq;
        self.running.store(true, Ordering::Release);
        let running = Arc::clone(&self.running);
        let stats = Arc::clone(&self.stats);
        let config = self.config.clone();
        let wake_writer = self.wake_writer.clone();
        let spawned = std::thread::Builder::new().name("ordo-snapshot".into()).spawn(move || {
            let started = Instant::now();
            match write_snapshot(backup, &config.dir, &config.node, config.keep, scheme) {
                Ok(snapshot) => {
                    stats.last_seq.fetch_max(snapshot.seq, Ordering::Relaxed);
                    stats.n_written.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        "snapshot {} published in {:.1} s",
                        snapshot.path.display(),
                        started.elapsed().as_secs_f64()
                    );
                }
                Err(error) => {
                    stats.n_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("snapshot into {} failed: {error}", config.dir.display());
                }
            }
            running.store(false, Ordering::Release);
            if let Some(writer) = wake_writer.and_then(|writer| writer.upgrade()) {
                // Not on a runtime thread: blocking until the queue has room is fine.
                let _ = writer.blocking_send(crate::writer::Command::SnapshotFinished);
            }
        });
        if let Err(error) = spawned {
            // The closure (and the backup's pin) was dropped with the failed spawn.
            tracing::warn!("snapshot thread not started: {error}");
            self.running.store(false, Ordering::Release);
            self.stats.n_failed.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshots(seqs: &[u64]) -> Vec<SnapshotInfo> {
        seqs.iter().map(|&seq| SnapshotInfo { seq, path: PathBuf::from(format!("/s/snapshot-{seq}")) }).collect()
    }

    /// The naive reference: every way to start (the local state, each
    /// snapshot, or nothing) whose entries plus the stream's give exactly
    /// 1..=last, with no entry skipped; the plan must pick the allowed one
    /// that needs the fewest entries from the stream, or refuse when none exists.
    #[test]
    fn plan_start_agrees_with_the_reference_on_every_small_case() {
        let mut n_cases = 0;
        for last in 0..7u64 {
            for first in 1..=last + 1 {
                let stream = StreamBounds { first_seq: first, last_seq: last };
                for mask in 0..(1u32 << 9) {
                    let seqs: Vec<u64> = (0..9u64).filter(|bit| mask & (1 << bit) != 0).collect();
                    let snaps = snapshots(&seqs);
                    for local in std::iter::once(None).chain((0..9).map(Some)) {
                        n_cases += 1;
                        let got = plan_start(local, stream, &snaps, Some(Path::new("/s")));
                        // Reference: the state the node starts from (seq `base`) must be
                        // within the stream's reach: base + 1 in first..=last+1 (base 0
                        // with no state is "nothing", which needs seq 1).
                        let reachable = |base: u64| base <= last && base + 1 >= first;
                        let expected: Result<u64, bool> = match local {
                            Some(seq) if seq > last => Err(true),
                            Some(seq) => {
                                if reachable(seq) {
                                    Ok(seq + 1)
                                } else {
                                    Err(false)
                                }
                            }
                            None => match seqs.iter().max() {
                                Some(&newest) if newest > last => Err(true),
                                Some(&newest) => {
                                    // Any snapshot reachable? The newest is the best if any is.
                                    let best = seqs.iter().copied().filter(|&s| reachable(s)).max();
                                    match best {
                                        Some(s) => {
                                            assert_eq!(s, newest);
                                            Ok(s + 1)
                                        }
                                        None => Err(false),
                                    }
                                }
                                None if reachable(0) => Ok(1),
                                None => Err(false),
                            },
                        };
                        match (&got, expected) {
                            (Ok(plan), Ok(from)) => {
                                assert_eq!(plan.from_seq(), from, "{local:?} {stream:?} {seqs:?}");
                                let restores = matches!(plan, StartPlan::Restore { .. });
                                assert_eq!(restores, local.is_none() && !seqs.is_empty());
                            }
                            (Err(SnapshotError::AheadOfStream { .. }), Err(true)) => {}
                            (Err(SnapshotError::Gap { .. }), Err(false)) => {}
                            _ => panic!("{local:?} {stream:?} {seqs:?}: got {got:?}, expected {expected:?}"),
                        }
                    }
                }
            }
        }
        assert!(n_cases > 100_000);
    }

    #[test]
    fn the_gap_error_says_what_is_missing_and_what_to_do() {
        let stream = StreamBounds { first_seq: 501, last_seq: 900 };
        let error = plan_start(None, stream, &snapshots(&[100, 300]), Some(Path::new("/shared/snaps"))).unwrap_err();
        let text = error.to_string();
        for part in ["501..=900", "empty", "/shared/snaps is at seq 300", "seq 500 or later", "retention"] {
            assert!(text.contains(part), "{text}");
        }
        let error = plan_start(Some(7), stream, &[], None).unwrap_err().to_string();
        assert!(error.contains("at seq 7") && error.contains("never replaced"), "{error}");
        let error = plan_start(None, stream, &[], None).unwrap_err().to_string();
        assert!(error.contains("is empty") && error.contains("no --snapshot-dir"), "{error}");
    }

    #[test]
    fn snapshot_names_parse_strictly() {
        assert_eq!(parse_snapshot_name("snapshot-0"), Some(0));
        assert_eq!(parse_snapshot_name("snapshot-18446744073709551615"), Some(u64::MAX));
        for bad in ["snapshot-", "snapshot-1a", "snapshot--1", "snapshot-+1", ".snapshot-staging-a-1", "snap-1"] {
            assert_eq!(parse_snapshot_name(bad), None, "{bad}");
        }
    }
}
