//! The write-ahead log: batches appended to a sequential file and synced once
//! per group, which is all a write waits for. LMDB is brought up to date later,
//! in bulk, by the checkpointer (`checkpointer.rs`); the log keeps every batch
//! the checkpoint has not reached yet.
//!
//! Why: an LMDB commit writes every B-tree page the batch touched, at random
//! places, and syncs twice. Under a chat load (one small batch per new message,
//! spread over a million rooms) that was 54 % of the writer thread's samples and
//! held the end-to-end p99 at 85 ms. Appending to one file and syncing it costs
//! one sequential write; the checkpoint then writes each touched page once per
//! checkpoint instead of once per batch.
//!
//! Layout (see `docs/STORAGE.md`): segment files `wal-<first seq, 20 digits>.log`
//! in the data directory, each a run of records
//! `u32 body length, u32 CRC-32 of the body, body`, body =
//! `u64 seq, u32 collection number, u32 op count, ops`. Sequence numbers are
//! consecutive across segments. A record that is short or fails its CRC ends the
//! log; after it, a segment may hold only zeros (space preallocated, below).
//! Anything else is only legal at the end of the last segment (a write cut short
//! by a crash, never acknowledged), where it is cut off at open.
//!
//! Preallocation: in full durability a new segment is, when one is ready, a
//! spare file of zeros the size of a segment (`wal-spare`), written in the
//! background at low priority once the log is in use (see `want_spare`), and
//! never into the disk's last free space (see `write_spare`). Appending inside a file's
//! length leaves its size alone, so each `fdatasync` writes the data pages only:
//! on this project's machine p50 0.32 → 0.20 ms and p99 0.90 → 0.33 ms for 8 KiB
//! appends (the growing file's inode had to be written too, a second I/O the
//! writer waited for).
//!
//! A full disk: an append that fails with `ENOSPC` is cut back to the last
//! acknowledged record by the next append, which then tries again (see
//! `repair`), so writes resume by themselves once there is room.
//!
//! This file keeps the segment files: opening (with replay and the cut-off of a
//! torn end), appending and syncing, rotation, the spare, and removal once
//! checkpointed. A record's own bytes (framing, encoding, decoding) are in `record`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::StoreError;

mod record;

pub(crate) use record::{decode_batch, encode_marker, encode_record, next_record, RawRecord, MARKER_COLLECTION};

const SEGMENT_PREFIX: &str = "wal-";
const SEGMENT_SUFFIX: &str = ".log";
/// A segment-sized file of zeros, ready to become the next segment.
const SPARE_NAME: &str = "wal-spare";
/// The spare while it is being written (renamed to `SPARE_NAME` once complete).
const SPARE_TMP_NAME: &str = "wal-spare.tmp";
/// The spare is written and synced this much at a time, with a pause after
/// each, so that the log's own `fdatasync` never waits behind more than one
/// small chunk of write-back: with 1 MiB chunks and no pause, appends of the
/// first seconds after a rotation took 7–10 ms instead of 0.5.
const SPARE_CHUNK_BYTES: usize = 256 << 10;
const SPARE_CHUNK_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);
/// The free space a spare always leaves on the disk, beyond what the active
/// segment may still need (LMDB's checkpoints need some too).
const SPARE_MIN_RESERVE_BYTES: u64 = 1 << 20;
/// The nice value of the thread writing the spare (background work).
const SPARE_WRITER_NICE: i32 = 10;

/// `ENOSPC` and `EDQUOT`: the disk (or the user's quota) is full. An append
/// that fails with one of these is repaired and retried by the next append.
const DISK_FULL_ERRNOS: [i32; 2] = [libc::ENOSPC, libc::EDQUOT];

/// What the log shares with a backup running on another thread (`backup.rs`).
pub(crate) struct LogShare {
    /// Sequence number of the last acknowledged batch: its append (and sync)
    /// returned. A backup's log tail stops here, never at a record still being
    /// written, whose batch may yet fail and its sequence number be reused.
    pub(crate) acked_seq: AtomicU64,
    /// The first sequence number a running backup still needs from the log
    /// (`NO_PIN` when none runs): no segment holding it or a later record is
    /// deleted, whatever the checkpoint. At most one backup runs at a time.
    pub(crate) pinned_from: AtomicU64,
}

pub(crate) const NO_PIN: u64 = u64::MAX;

pub(crate) fn segment_name(first_seq: u64) -> String {
    format!("{SEGMENT_PREFIX}{first_seq:020}{SEGMENT_SUFFIX}")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(SEGMENT_PREFIX)?.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A closed segment: every record in it is older than the current segment's.
struct ClosedSegment {
    path: PathBuf,
    last_seq: u64,
}

/// The writer's side of the log: appends and syncs; removes segments once the
/// checkpoint has passed them.
pub(crate) struct Wal {
    dir: PathBuf,
    file: File,
    /// Sequence number of the first record of the current segment (its name).
    current_first_seq: u64,
    /// Bytes of records in the current segment; the next append goes here.
    end: u64,
    /// Oldest first.
    closed: Vec<ClosedSegment>,
    /// A segment that has reached this size is closed before the next append.
    segment_bytes: u64,
    sync: bool,
    /// Sequence number of the last record appended (or of the checkpoint, before any).
    last_seq: u64,
    /// Set by a failed append other than a full disk: nothing is appended
    /// after it, since a failed sync (an I/O error) leaves unknown pages
    /// unwritten (the kernel may drop them) and the device may be failing.
    failed: bool,
    /// Set by an append that failed because the disk is full: what it wrote
    /// after `end` (part of an unacknowledged group) is cut off before the next
    /// append, which then writes at `end` again.
    needs_repair: bool,
    /// Whether the next spare has been asked for since the last rotation (the
    /// spare is written lazily: see `want_spare`).
    spare_requested: bool,
    share: Arc<LogShare>,
    /// New segments start as spare files of zeros (see the module doc).
    preallocate: bool,
    /// Whether the current segment started as a spare. One that did not (the
    /// first ever, or the spare was not ready) is closed once a spare is.
    current_is_spare: bool,
    /// The thread writing the next spare segment, if one is running.
    spare_writer: Option<SpareWriter>,
    /// The thread deleting checkpointed segments, if one was started.
    remover: Option<JoinHandle<()>>,
}

struct SpareWriter {
    stop: Arc<AtomicBool>,
    /// Set once the spare is published under `SPARE_NAME`.
    ready: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.wait_for_remover();
        if let Some(spare) = self.spare_writer.take() {
            // At most one chunk more: a half-written spare is just not used.
            spare.stop.store(true, Ordering::Relaxed);
            let _ = spare.thread.join();
        }
    }
}

/// What opening the log found.
pub(crate) struct WalRecovery {
    pub(crate) n_records_replayed: u64,
    /// Bytes of a cut-off record removed from the end of the last segment.
    pub(crate) n_torn_bytes_removed: u64,
}

/// Calls `each` with every record of the log in `dir` whose sequence number is in
/// `from_seq..=through_seq`, in order. For a checkpoint that failed and must be
/// written again: the checkpointer keeps no copy of the records it was handed,
/// the log has them (segments are deleted only once LMDB holds all of theirs).
/// Fails with `Corrupt` if a record of the range is missing.
pub(crate) fn read_records(
    dir: &Path,
    from_seq: u64,
    through_seq: u64,
    each: &mut dyn FnMut(&RawRecord<'_>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    if from_seq > through_seq {
        return Ok(());
    }
    let segments = list_segments(dir)?;
    let mut next_seq = from_seq;
    let mut bytes = Vec::new();
    for (index, (first_seq, path)) in segments.iter().enumerate() {
        // Skip segments that end before the range (the next one starts at or before it).
        if segments.get(index + 1).is_some_and(|(next_first, _)| *next_first <= next_seq) || *first_seq > next_seq {
            continue;
        }
        bytes.clear();
        File::open(path)
            .and_then(|mut file| file.read_to_end(&mut bytes))
            .map_err(wal_io(dir, "reading the write-ahead log"))?;
        let mut offset = 0;
        // The writer may be appending to the last segment: a record cut short at
        // its end is one that was never handed over, past `through_seq`.
        while let Some((record, len)) = next_record(&bytes[offset..]) {
            if (record.first_seq..=record.seq).contains(&next_seq) {
                each(&record)?;
                if record.seq >= through_seq {
                    return Ok(());
                }
                next_seq = record.seq + 1;
            }
            offset += len;
        }
    }
    Err(StoreError::Corrupt {
        dir: dir.to_owned(),
        expected: "every record after the checkpoint in the write-ahead log",
    })
}

/// The log segments in `dir`, by the sequence number of their first record.
fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut segments = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(wal_io(dir, "listing the write-ahead log"))? {
        let entry = entry.map_err(wal_io(dir, "listing the write-ahead log"))?;
        if let Some(first_seq) = entry.file_name().to_str().and_then(parse_segment_name) {
            segments.push((first_seq, entry.path()));
        }
    }
    segments.sort_unstable();
    Ok(segments)
}

fn wal_io<'a>(dir: &'a Path, doing: &'static str) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| {
        if source.raw_os_error().is_some_and(|errno| DISK_FULL_ERRNOS.contains(&errno)) {
            StoreError::DiskFull { dir: dir.to_owned() }
        } else {
            StoreError::Wal { dir: dir.to_owned(), doing, source }
        }
    }
}

/// A new, empty segment at `path`: the spare of zeros renamed there when one is
/// ready (and `preallocated`), else a new empty file. The caller syncs the directory.
/// Returns the file and whether it is the spare.
fn create_segment(dir: &Path, path: &Path, preallocated: bool) -> Result<(File, bool), StoreError> {
    let spare = dir.join(SPARE_NAME);
    if preallocated && std::fs::rename(&spare, path).is_ok() {
        let file = OpenOptions::new().write(true).open(path).map_err(wal_io(dir, "opening a log segment"))?;
        return Ok((file, true));
    }
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .map_err(wal_io(dir, "creating a log segment"))?;
    Ok((file, false))
}

/// Bytes free for an unprivileged writer on the file system holding `dir`.
pub(crate) fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string that outlives the call, and
    // `stats` is a writable `statvfs` that the call fills when it returns 0.
    let stats = unsafe {
        if libc::statvfs(path.as_ptr(), stats.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        stats.assume_init()
    };
    Ok((stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64))
}

/// Writes `size` bytes of zeros to the spare's temporary name, a synced chunk at
/// a time, then publishes it under `SPARE_NAME`.
///
/// The spare is a convenience (faster syncs), never worth a write: it gives up
/// (and its file is removed) as soon as the disk would keep less than `reserve`
/// bytes free after the rest of it, which leaves the active segment room to
/// fill up. So a spare is never what fills the disk first.
fn write_spare(dir: &Path, size: u64, reserve: u64, stop: &AtomicBool) -> std::io::Result<()> {
    let tmp = dir.join(SPARE_TMP_NAME);
    let mut file = OpenOptions::new().create(true).truncate(true).write(true).open(&tmp)?;
    let zeros = vec![0u8; SPARE_CHUNK_BYTES];
    let mut written = 0u64;
    while written < size {
        if stop.load(Ordering::Relaxed) {
            return Err(std::io::Error::other("stopped"));
        }
        if free_bytes(dir)? < (size - written).saturating_add(reserve) {
            return Err(std::io::Error::other("the disk is too full for a spare log segment"));
        }
        let n = (size - written).min(SPARE_CHUNK_BYTES as u64) as usize;
        file.write_all(&zeros[..n])?;
        file.sync_data()?;
        written += n as u64;
        std::thread::sleep(SPARE_CHUNK_PAUSE);
    }
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(SPARE_NAME))?;
    File::open(dir)?.sync_all()
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|handle| handle.sync_all()).map_err(wal_io(dir, "syncing the data directory"))
}

impl Wal {
    /// Opens the log of `dir`, hands every record after `checkpointed_seq` to
    /// `replay` in order, cuts off a write a crash left incomplete, and starts a
    /// new segment for the writes to come.
    pub(crate) fn open(
        dir: &Path,
        checkpointed_seq: u64,
        segment_bytes: u64,
        sync: bool,
        preallocate: bool,
        replay: &mut dyn FnMut(&RawRecord<'_>) -> Result<(), StoreError>,
    ) -> Result<(Wal, WalRecovery), StoreError> {
        let corrupt = |expected| StoreError::Corrupt { dir: dir.to_owned(), expected };
        let segments = list_segments(dir)?;
        let mut recovery = WalRecovery { n_records_replayed: 0, n_torn_bytes_removed: 0 };
        let mut closed = Vec::new();
        let mut last_seq = checkpointed_seq;
        let mut bytes = Vec::new();
        for (index, (first_seq, path)) in segments.iter().enumerate() {
            let is_last = index + 1 == segments.len();
            if *first_seq > last_seq + 1 {
                return Err(corrupt("write-ahead log segments without a gap after the checkpoint"));
            }
            bytes.clear();
            File::open(path)
                .and_then(|mut file| file.read_to_end(&mut bytes))
                .map_err(wal_io(dir, "reading the write-ahead log"))?;
            let mut offset = 0;
            let mut expected_seq = *first_seq;
            while let Some((record, len)) = next_record(&bytes[offset..]) {
                if record.first_seq != expected_seq {
                    break;
                }
                if record.seq > last_seq {
                    replay(&record)?;
                    recovery.n_records_replayed += 1;
                    last_seq = record.seq;
                }
                expected_seq = record.seq + 1;
                offset += len;
            }
            // Zeros after the records are preallocated space, not damage.
            let written_end = bytes.iter().rposition(|&byte| byte != 0).map_or(0, |last| last + 1);
            if offset < written_end {
                if !is_last {
                    return Err(corrupt("intact records up to the end of every write-ahead log segment but the last"));
                }
                // A write cut short by a crash: it was never acknowledged.
                let file = OpenOptions::new().write(true).open(path).map_err(wal_io(dir, "opening the log"))?;
                file.set_len(offset as u64).map_err(wal_io(dir, "cutting off an incomplete log record"))?;
                file.sync_all().map_err(wal_io(dir, "cutting off an incomplete log record"))?;
                recovery.n_torn_bytes_removed = (written_end - offset) as u64;
            }
            closed.push(ClosedSegment { path: path.clone(), last_seq: expected_seq - 1 });
        }
        // A spare a stopped run left half-written is started again.
        match std::fs::remove_file(dir.join(SPARE_TMP_NAME)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(wal_io(dir, "removing a half-written spare log segment")(error))
            }
            _ => {}
        }
        let path = dir.join(segment_name(last_seq + 1));
        let (file, current_is_spare) = create_segment(dir, &path, preallocate)?;
        sync_dir(dir)?;
        closed.retain(|segment| segment.path != path);
        let mut wal = Wal {
            dir: dir.to_owned(),
            file,
            current_first_seq: last_seq + 1,
            end: 0,
            closed,
            segment_bytes,
            sync,
            last_seq,
            failed: false,
            needs_repair: false,
            spare_requested: false,
            share: Arc::new(LogShare { acked_seq: AtomicU64::new(last_seq), pinned_from: AtomicU64::new(NO_PIN) }),
            preallocate,
            current_is_spare,
            spare_writer: None,
            remover: None,
        };
        wal.remove_checkpointed(checkpointed_seq)?;
        Ok((wal, recovery))
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// What a backup on another thread reads and pins (see [`LogShare`]).
    pub(crate) fn share(&self) -> &Arc<LogShare> {
        &self.share
    }

    /// Appends `records` (framed, with consecutive seqs ending at `last_seq`) and,
    /// in full durability, syncs them: when this returns `Ok`, they survive a crash.
    ///
    /// After an append that failed because the disk was full, the next one
    /// first cuts the segment back to its last acknowledged record (the failed
    /// group was never acknowledged; its sequence numbers are used again), then
    /// appends as usual: once space is back, writes go on without a restart.
    pub(crate) fn append(&mut self, records: &[u8], last_seq: u64) -> Result<(), StoreError> {
        if self.failed {
            return Err(StoreError::Wal {
                dir: self.dir.clone(),
                doing: "appending to the log after an I/O error (restart to recover)",
                source: std::io::Error::other("an earlier append failed"),
            });
        }
        let result = self.repair().and_then(|()| self.try_append(records));
        match result {
            Ok(()) => {
                self.last_seq = last_seq;
                self.share.acked_seq.store(last_seq, Ordering::Release);
                if self.want_spare() {
                    self.spare_requested = true;
                    self.prepare_spare();
                }
                Ok(())
            }
            Err(error @ StoreError::DiskFull { .. }) => {
                self.needs_repair = true;
                Err(error)
            }
            Err(error) => {
                self.failed = true;
                Err(error)
            }
        }
    }

    /// Cuts off what a failed append left after the last acknowledged record.
    /// Truncating needs no free space; a preallocated segment loses its zeros
    /// after the cut and grows from there like any other (a spare replaces it
    /// as soon as one is ready). The truncation is synced before anything is
    /// appended at the same place: a crash must not find new records followed
    /// by the failed group's leftovers.
    fn repair(&mut self) -> Result<(), StoreError> {
        if !self.needs_repair {
            return Ok(());
        }
        let cut = |source| wal_io(&self.dir, "cutting off a failed log append")(source);
        self.file.set_len(self.end).map_err(cut)?;
        self.file.sync_all().map_err(cut)?;
        self.current_is_spare = false;
        self.needs_repair = false;
        Ok(())
    }

    /// Whether to start writing the next spare now. Not at open: a server that
    /// is never written to keeps no preallocated space. Once written to, a
    /// segment that is not a spare wants one at once (appends into a growing
    /// file sync slower), and a spare wants its successor from half full, so
    /// that it is ready at the rotation: a busy log holds two segments' worth
    /// of preallocated space, an idle one at most one.
    fn want_spare(&self) -> bool {
        self.preallocate && !self.spare_requested && (!self.current_is_spare || self.end >= self.segment_bytes / 2)
    }

    fn try_append(&mut self, records: &[u8]) -> Result<(), StoreError> {
        if self.end >= self.segment_bytes || (self.end > 0 && self.spare_is_waiting()) {
            // Synced even in relaxed durability: only the last segment may end in a cut-off write.
            self.start_segment_after(self.last_seq)?;
        }
        self.file.write_all_at(records, self.end).map_err(wal_io(&self.dir, "appending to the log"))?;
        if self.sync {
            self.file.sync_data().map_err(wal_io(&self.dir, "syncing the log"))?;
        }
        self.end += records.len() as u64;
        Ok(())
    }

    /// Gives sequence number `seq` (the next one) to a change LMDB committed by
    /// itself (a schema change or a drop, see `Database::add_field`), which has no
    /// log record. A segment's records must be consecutive, so the current segment
    /// is closed and the next record starts a new one named `seq + 1`: at the next
    /// open, LMDB's `last_seq` (at least `seq`) skips the closed segment, and the
    /// new one follows without a gap. The closed segment is deleted once
    /// checkpointed, as any other. A failure here leaves the log refusing appends
    /// (as after a failed append) until a restart, which finds LMDB and the log
    /// consistent either way.
    pub(crate) fn skip_seq(&mut self, seq: u64) -> Result<(), StoreError> {
        debug_assert_eq!(seq, self.last_seq + 1, "sequence numbers are consecutive");
        let result = self.start_segment_after(seq);
        self.last_seq = seq;
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    /// Closes the current segment and starts the next at `last_seq + 1`.
    fn start_segment_after(&mut self, last_seq: u64) -> Result<(), StoreError> {
        self.file.sync_data().map_err(wal_io(&self.dir, "syncing the log"))?;
        let path = self.dir.join(segment_name(last_seq + 1));
        let (file, is_spare) = create_segment(&self.dir, &path, self.preallocate)?;
        self.current_is_spare = is_spare;
        sync_dir(&self.dir)?;
        // The next spare is written once this segment is used (see `try_append`).
        self.spare_requested = false;
        let old_path = self.dir.join(segment_name(self.current_first_seq));
        self.closed.push(ClosedSegment { path: old_path, last_seq: self.last_seq });
        self.file = file;
        self.end = 0;
        self.current_first_seq = last_seq + 1;
        Ok(())
    }

    /// Deletes the closed segments whose records are all in LMDB (seq at most
    /// `checkpointed_seq`): they will never be replayed.
    pub(crate) fn remove_checkpointed(&mut self, checkpointed_seq: u64) -> Result<(), StoreError> {
        self.wait_for_remover();
        for path in self.take_checkpointed(checkpointed_seq) {
            std::fs::remove_file(&path).map_err(wal_io(&self.dir, "removing a checkpointed log segment"))?;
        }
        Ok(())
    }

    /// As `remove_checkpointed`, on a background thread: unlinking a 64 MiB
    /// file took 43 ms on the writer thread in a chat run (its blocks are freed
    /// while a checkpoint's write-back has the disk), and every write waited.
    /// A segment whose removal fails or never runs is found again at the next
    /// open, which deletes it then (its records are all in LMDB).
    pub(crate) fn remove_checkpointed_in_background(&mut self, checkpointed_seq: u64) {
        if self.remover.as_ref().is_some_and(|remover| !remover.is_finished()) {
            return; // The next write tries again.
        }
        let paths = self.take_checkpointed(checkpointed_seq);
        if paths.is_empty() {
            return;
        }
        self.wait_for_remover();
        let spawned = std::thread::Builder::new().name("ordo-log-remove".to_owned()).spawn(move || {
            for path in paths {
                let _ = std::fs::remove_file(path);
            }
        });
        self.remover = spawned.ok();
    }

    /// The closed segments that can go: every record in LMDB, and none that a
    /// running backup still needs (it pins its first sequence number).
    fn take_checkpointed(&mut self, checkpointed_seq: u64) -> Vec<PathBuf> {
        let pinned_from = self.share.pinned_from.load(Ordering::Acquire);
        let removable_through = checkpointed_seq.min(pinned_from.saturating_sub(1));
        let n_done = self.closed.iter().take_while(|segment| segment.last_seq <= removable_through).count();
        self.closed.drain(..n_done).map(|segment| segment.path).collect()
    }

    fn wait_for_remover(&mut self) {
        if let Some(remover) = self.remover.take() {
            let _ = remover.join();
        }
    }

    /// A spare is ready while the current segment is not one: worth a rotation.
    /// Checked before every append, so it is one atomic load, no system call.
    fn spare_is_waiting(&self) -> bool {
        !self.current_is_spare && self.spare_writer.as_ref().is_some_and(|spare| spare.ready.load(Ordering::Acquire))
    }

    /// Starts writing the next spare segment in the background, unless one is
    /// ready or being written.
    fn prepare_spare(&mut self) {
        if !self.preallocate || self.dir.join(SPARE_NAME).exists() {
            return;
        }
        if let Some(spare) = &self.spare_writer {
            if !spare.thread.is_finished() {
                return;
            }
        }
        if let Some(spare) = self.spare_writer.take() {
            let _ = spare.thread.join();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(AtomicBool::new(false));
        let (stopping, published) = (Arc::clone(&stop), Arc::clone(&ready));
        let dir = self.dir.clone();
        let size = self.segment_bytes;
        // Room for the active segment to fill up, whatever the spare takes.
        let reserve = if self.current_is_spare { 0 } else { self.segment_bytes.saturating_sub(self.end) };
        let reserve = reserve.max(SPARE_MIN_RESERVE_BYTES);
        let spawned = std::thread::Builder::new().name("ordo-log-spare".to_owned()).spawn(move || {
            crate::background::lower_priority(SPARE_WRITER_NICE);
            // Best effort: without a spare, the next segment is an empty file, as before.
            match write_spare(&dir, size, reserve, &stopping) {
                Ok(()) => published.store(true, Ordering::Release),
                Err(_) => {
                    let _ = std::fs::remove_file(dir.join(SPARE_TMP_NAME));
                }
            }
        });
        if let Ok(thread) = spawned {
            self.spare_writer = Some(SpareWriter { stop, ready, thread });
        }
    }

    /// Log segment files on disk, the current one included (for tests and stats).
    pub(crate) fn n_segments(&self) -> usize {
        self.closed.len() + 1
    }
}
