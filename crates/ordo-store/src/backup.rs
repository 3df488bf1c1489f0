//! Hot backup: a consistent copy of a data directory while writes go on.
//!
//! A backup is two parts, each cut at a batch boundary (see `docs/STORAGE.md`):
//!
//! 1. LMDB's own compacting copy (`mdb_env_copyfd2` with `MDB_CP_COMPACT`,
//!    through heed's `Env::copy_to_path`) of one read transaction: a committed
//!    checkpoint, so whole batches up to its `last_seq` (C) and nothing after.
//!    The compacting copy takes no lock but its read transaction; the plain copy
//!    would take LMDB's writer mutex, which an open checkpoint holds for up to
//!    its interval.
//! 2. The log's records C+1..=S, S being the last batch acknowledged when the
//!    copy began (the backup's seq is the larger of C and S). Only acknowledged
//!    records are taken: a record still being synced may yet fail, and its
//!    sequence number be used again. And only those acknowledged before the
//!    copy began: their collections were created in LMDB before them, so the
//!    copy has every collection the tail writes to.
//!
//! Segments holding a record after the checkpoint published when the backup
//! started are pinned (never deleted) until the backup ends, and C is at least
//! that checkpoint (the copy began after it), so C+1..=S is always on disk.
//!
//! The copy runs on the caller's thread, never the writer's: [`Database::start_backup`]
//! is all the writer does (an atomic or two). Its read transaction pins LMDB's
//! pages for the copy's duration: the one long read transaction Ordo opens.
//!
//! [`Database::start_backup`]: crate::Database::start_backup

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use heed::{CompactionOption, Env};

use crate::error::StoreError;
use crate::store::{Store, StoreOptions};
use crate::wal::{self, LogShare, NO_PIN};

/// What a finished backup holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackupReport {
    /// The backup holds exactly the batches 1..=`seq`: a server started on it
    /// answers reads as of this batch.
    pub seq: u64,
    /// The checkpoint the LMDB copy holds; the log tail holds the batches after it.
    pub checkpointed_seq: u64,
    /// Bytes written: the LMDB copy plus the log tail.
    pub n_bytes: u64,
}

/// A backup started by [`crate::Database::start_backup`]: the log segments it
/// needs are pinned until it is dropped. Run it with [`Backup::write_to`] on
/// any thread; it keeps the LMDB environment open until it ends.
pub struct Backup {
    env: Env,
    dir: PathBuf,
    share: Arc<LogShare>,
}

impl Drop for Backup {
    fn drop(&mut self) {
        // Segments kept for this backup go at the next write's removal.
        self.share.pinned_from.store(NO_PIN, Ordering::Release);
    }
}

impl Backup {
    /// Pins the log from `first_needed_seq` (one after the checkpoint published
    /// now), unless another backup runs.
    pub(crate) fn start(
        env: Env,
        dir: &Path,
        share: &Arc<LogShare>,
        first_needed_seq: u64,
    ) -> Result<Backup, StoreError> {
        share
            .pinned_from
            .compare_exchange(NO_PIN, first_needed_seq, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|_| StoreError::BackupRunning { dir: dir.to_owned() })?;
        Ok(Backup { env, dir: dir.to_owned(), share: Arc::clone(share) })
    }

    /// Writes the backup to `to`, an absolute path that does not exist yet (or an
    /// empty directory), outside the data directory. It is written under a
    /// temporary name beside `to` and renamed when complete and synced, so `to`
    /// is either a whole backup or absent.
    pub fn write_to(self, to: &Path) -> Result<BackupReport, StoreError> {
        let staging = self.prepare_destination(to)?;
        let written = self.fill(&staging).and_then(|report| {
            // Fails if `to` was meanwhile made a non-empty directory: never overwrites.
            std::fs::rename(&staging, to).map_err(|source| backup_error(to, "publishing the backup", source))?;
            Ok(report)
        });
        match written {
            Ok(report) => {
                let parent = to.parent().expect("checked: `to` has a parent");
                sync_dir(parent).map_err(|source| backup_error(to, "syncing the backup's parent directory", source))?;
                Ok(report)
            }
            Err(error) => {
                let _ = std::fs::remove_dir_all(&staging);
                Err(error)
            }
        }
    }

    /// Checks `to` and creates the staging directory beside it.
    fn prepare_destination(&self, to: &Path) -> Result<PathBuf, StoreError> {
        let refuse = |reason: &str| StoreError::BackupDestination { to: to.to_owned(), reason: reason.to_owned() };
        if !to.is_absolute() {
            return Err(refuse("the destination must be an absolute path"));
        }
        let (Some(parent), Some(name)) = (to.parent(), to.file_name()) else {
            return Err(refuse("the destination must name a directory to create"));
        };
        let parent = std::fs::canonicalize(parent).map_err(|_| refuse("its parent directory does not exist"))?;
        if !parent.is_dir() {
            return Err(refuse("its parent is not a directory"));
        }
        if let Ok(mut entries) = std::fs::read_dir(to) {
            if entries.next().is_some() {
                return Err(refuse("it exists and is not an empty directory"));
            }
        } else if to.symlink_metadata().is_ok() {
            return Err(refuse("it exists and is not an empty directory"));
        }
        let data_dir = std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        if parent.join(name).starts_with(&data_dir) {
            return Err(refuse("the destination must be outside the data directory"));
        }
        let staging = parent.join(format!(".{}.partial-{}", name.to_string_lossy(), std::process::id()));
        // A staging directory of this process's name is a backup that died half way.
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir(&staging).map_err(|source| match backup_error(&staging, "", source) {
            StoreError::BackupIo { source, .. } => refuse(&format!("cannot create a directory beside it: {source}")),
            full => full,
        })?;
        Ok(staging)
    }

    fn fill(&self, staging: &Path) -> Result<BackupReport, StoreError> {
        // Read before the copy begins: every collection a record up to here
        // writes to was created (in LMDB, synchronously) before the record was
        // acknowledged, so the copy has it. A record acknowledged later might
        // belong to a collection created after the copy's transaction began.
        let acked_seq = self.share.acked_seq.load(Ordering::Acquire);
        let data = staging.join("data.mdb");
        let copied = self.env.copy_to_path(&data, CompactionOption::Enabled).map_err(|source| match source {
            heed::Error::Io(error) => backup_error(staging, "copying LMDB", error),
            source => StoreError::Io { dir: staging.to_owned(), doing: "copying LMDB", source },
        })?;
        copied.sync_all().map_err(|source| backup_error(staging, "syncing the LMDB copy", source))?;
        let mut n_bytes = copied.metadata().map(|meta| meta.len()).unwrap_or(0);
        drop(copied);
        let checkpointed_seq = read_checkpoint(staging)?;
        // A checkpoint may have passed `acked_seq` meanwhile: the copy alone is then the backup.
        let seq = checkpointed_seq.max(acked_seq);
        n_bytes += write_tail(&self.dir, staging, checkpointed_seq, seq)?;
        sync_dir(staging).map_err(|source| backup_error(staging, "syncing the backup", source))?;
        Ok(BackupReport { seq, checkpointed_seq, n_bytes })
    }
}

/// The checkpoint of the LMDB copy in `staging`, read by opening it as a store
/// (which also checks its format). The files the open leaves (`LOCK`,
/// `lock.mdb`) are removed: a restore makes its own.
fn read_checkpoint(staging: &Path) -> Result<u64, StoreError> {
    let (store, _) = Store::open(staging, StoreOptions::default())?;
    let checkpointed_seq = store.last_seq();
    drop(store);
    for name in ["LOCK", "lock.mdb"] {
        let _ = std::fs::remove_file(staging.join(name));
    }
    Ok(checkpointed_seq)
}

/// Copies the log records `checkpointed_seq + 1 ..= through_seq` of `dir` into
/// one segment of `staging`, framed as they are; returns its size.
fn write_tail(dir: &Path, staging: &Path, checkpointed_seq: u64, through_seq: u64) -> Result<u64, StoreError> {
    if through_seq <= checkpointed_seq {
        return Ok(0);
    }
    let path = staging.join(wal::segment_name(checkpointed_seq + 1));
    let file = File::create(&path).map_err(|source| backup_error(staging, "creating the backup's log", source))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut n_bytes = 0u64;
    wal::read_records(dir, checkpointed_seq + 1, through_seq, &mut |record| {
        out.write_all(record.framed).map_err(|source| backup_error(staging, "writing the backup's log", source))?;
        n_bytes += record.framed.len() as u64;
        Ok(())
    })?;
    let file =
        out.into_inner().map_err(|error| backup_error(staging, "writing the backup's log", error.into_error()))?;
    file.sync_all().map_err(|source| backup_error(staging, "syncing the backup's log", source))?;
    Ok(n_bytes)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// An I/O error while writing the backup; a full disk is `DiskFull` (of the destination).
fn backup_error(dir: &Path, doing: &'static str, source: std::io::Error) -> StoreError {
    if source.raw_os_error().is_some_and(|errno| errno == libc::ENOSPC || errno == libc::EDQUOT) {
        StoreError::DiskFull { dir: dir.to_owned() }
    } else {
        StoreError::BackupIo { dir: dir.to_owned(), doing, source }
    }
}
