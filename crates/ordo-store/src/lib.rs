//! Ordo's durable store: collections persisted in LMDB through `heed`, batches
//! committed crash-safely before the engine applies them, and the engine rebuilt
//! in bulk at start. The engine (`ordo-core`) knows nothing of this crate; the
//! store feeds it.
//!
//! - [`Database`] keeps one [`ordo_core::Engine`] equal to one data directory.
//! - [`Writer`] runs a `Database` on its own thread with group commit.
//! - The on-disk layout is documented in `docs/STORAGE.md`.

mod codec;
mod database;
mod error;
mod store;
mod writer;

pub use codec::FORMAT_VERSION;
pub use database::{print_load_progress, Ack, Database, OpenReport, PendingWrite};
pub use error::StoreError;
pub use store::{Durability, LoadProgress, Store, StoreOptions, StoreStats};
pub use writer::{WriteTicket, Writer, WriterStopped, MAX_BATCHES_PER_COMMIT, MAX_BYTES_PER_COMMIT};
