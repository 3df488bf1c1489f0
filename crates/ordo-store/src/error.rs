//! What can go wrong with a data directory, in words a user can act on.

use std::fmt;
use std::path::PathBuf;

use ordo_core::{BatchError, CreateCollectionError, LoadError, SchemaChangeError};

use crate::codec::Corrupt;

#[derive(Debug)]
pub enum StoreError {
    /// Another process (or another `Store` in this one) holds the directory.
    Locked {
        dir: PathBuf,
    },
    /// The directory was written by a newer Ordo; it is left untouched.
    NewerFormat {
        dir: PathBuf,
        found: u32,
        supported: u32,
    },
    /// A record could not be decoded: the directory is damaged or not Ordo's.
    Corrupt {
        dir: PathBuf,
        expected: &'static str,
    },
    /// The map reached `max_map_size` and the write did not fit; nothing was written.
    MapFull {
        map_size: usize,
        max_map_size: usize,
    },
    /// The disk has no room left for the write; nothing was written.
    DiskFull {
        dir: PathBuf,
    },
    /// The batch breaks a rule; nothing was written.
    Batch(BatchError),
    CreateCollection(CreateCollectionError),
    /// A schema change or drop breaks a rule (or names no collection); nothing was written.
    SchemaChange(SchemaChangeError),
    /// A stored item was refused by the engine while loading (a damaged directory).
    Load(LoadError),
    /// The write-ahead log could not be read or written. After an append failed
    /// with an I/O error (not a full disk) the database refuses writes until it
    /// is reopened.
    Wal {
        dir: PathBuf,
        doing: &'static str,
        source: std::io::Error,
    },
    /// Bringing LMDB up to date with the log failed; it is retried, and new
    /// batches are refused meanwhile. Everything acknowledged is in the log.
    CheckpointFailed {
        dir: PathBuf,
        reason: String,
    },
    /// A backup was asked for while another one of the same database runs.
    BackupRunning {
        dir: PathBuf,
    },
    /// A backup's destination cannot be used; nothing was written.
    BackupDestination {
        to: PathBuf,
        reason: String,
    },
    /// Writing a backup failed (the data directory is untouched; the partial
    /// backup was removed).
    BackupIo {
        dir: PathBuf,
        doing: &'static str,
        source: std::io::Error,
    },
    /// Any other failure of the file system or of LMDB, with what was being done.
    Io {
        dir: PathBuf,
        doing: &'static str,
        source: heed::Error,
    },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Locked { dir } => write!(
                f,
                "the data directory {} is in use by another Ordo process (its LOCK file is held); \
                 stop that process or choose another directory",
                dir.display()
            ),
            StoreError::NewerFormat { dir, found, supported } => write!(
                f,
                "the data directory {} uses storage format {found}, written by a newer Ordo; \
                 this build reads formats up to {supported}. Upgrade Ordo; the directory was not modified",
                dir.display()
            ),
            StoreError::Corrupt { dir, expected } => write!(
                f,
                "the data directory {} is damaged or is not an Ordo data directory: expected {expected}",
                dir.display()
            ),
            StoreError::MapFull { map_size, max_map_size } => write!(
                f,
                "the store is full: the write needs more than the maximum map size ({max_map_size} bytes; \
                 the map is {map_size} bytes). Nothing was written; raise the maximum map size"
            ),
            StoreError::DiskFull { dir } => write!(
                f,
                "no space left on the device holding {}; nothing was written. Free some space and retry \
                 (writes resume by themselves once there is room)",
                dir.display()
            ),
            StoreError::BackupRunning { dir } => {
                write!(f, "a backup of {} is already running; wait for it to finish", dir.display())
            }
            StoreError::BackupDestination { to, reason } => {
                write!(f, "cannot write a backup to {}: {reason}; nothing was written", to.display())
            }
            StoreError::BackupIo { dir, doing, source } => {
                write!(f, "{doing} (backup in {}): {source}; no backup was written", dir.display())
            }
            StoreError::Batch(error) => write!(f, "batch refused: {error}"),
            StoreError::CreateCollection(error) => write!(f, "cannot create the collection: {error}"),
            StoreError::SchemaChange(error) => write!(f, "cannot change the collection: {error}"),
            StoreError::Load(error) => write!(f, "a stored item was refused while loading: {error}"),
            StoreError::Io { dir, doing, source } => write!(f, "{doing} in {}: {source}", dir.display()),
            StoreError::Wal { dir, doing, source } => {
                write!(f, "{doing} (write-ahead log in {}): {source}", dir.display())
            }
            StoreError::CheckpointFailed { dir, reason } => write!(
                f,
                "writes are refused until the store in {} catches up with its log: {reason}. \
                 Nothing acknowledged is lost; it is in the log",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Io { source, .. } => Some(source),
            StoreError::Wal { source, .. } => Some(source),
            StoreError::BackupIo { source, .. } => Some(source),
            StoreError::Batch(error) => Some(error),
            StoreError::Load(error) => Some(error),
            StoreError::CreateCollection(error) => Some(error),
            StoreError::SchemaChange(error) => Some(error),
            _ => None,
        }
    }
}

impl StoreError {
    /// The same error again, for each batch of a group that shared one failure.
    pub(crate) fn again(&self) -> StoreError {
        match self {
            StoreError::MapFull { map_size, max_map_size } => {
                StoreError::MapFull { map_size: *map_size, max_map_size: *max_map_size }
            }
            StoreError::DiskFull { dir } => StoreError::DiskFull { dir: dir.clone() },
            StoreError::Wal { dir, doing, source } => StoreError::Wal {
                dir: dir.clone(),
                doing,
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            StoreError::CheckpointFailed { dir, reason } => {
                StoreError::CheckpointFailed { dir: dir.clone(), reason: reason.clone() }
            }
            StoreError::Corrupt { dir, expected } => StoreError::Corrupt { dir: dir.clone(), expected },
            other => StoreError::CheckpointFailed { dir: std::path::PathBuf::new(), reason: other.to_string() },
        }
    }

    pub(crate) fn corrupt(dir: &std::path::Path, corrupt: Corrupt) -> StoreError {
        StoreError::Corrupt { dir: dir.to_owned(), expected: corrupt.0 }
    }
}
