//! Ordo's durable store: collections persisted in LMDB through `heed`, batches
//! committed crash-safely before the engine applies them, and the engine rebuilt
//! in bulk at start. The engine (`ordo-core`) knows nothing of this crate; the
//! store feeds it.
//!
//! - [`Database`] keeps one [`ordo_core::Engine`] equal to one data directory.
//! - [`Writer`] runs a `Database` on its own thread with group commit.
//! - The on-disk layout is documented in `docs/STORAGE.md`.
//!
//! ```
//! use ordo_core::{Batch, CollectingSink, FieldType, Filter, NullSink, OwnedValue, Schema, SortKey, Value, ViewDef};
//! use ordo_store::{print_load_progress, Database, StoreOptions, Writer};
//!
//! let dir = tempfile::tempdir()?;
//! let schema = Schema::new().with_field("name", FieldType::String).with_field("recency", FieldType::U64);
//!
//! // Opens (or creates) the data directory and rebuilds every collection in bulk.
//! let (mut database, _report) = Database::open(dir.path(), StoreOptions::default(), &mut print_load_progress)?;
//! let rooms = database.create_collection("rooms", schema)?;
//!
//! // A batch is validated, committed, and only then applied to the engine.
//! let mut batch = Batch::new();
//! batch.upsert("!a:example.org").set("name", Value::Str("Alice")).set("recency", Value::U64(10));
//! let mut sink = CollectingSink::new();
//! let (batch, result) = database.write(rooms, batch, &mut sink);
//! assert_eq!(result?.seq, 1); // acknowledged: durable
//!
//! // Schemas change online, durably, each change with its own seq (windows on the collection get a Reset).
//! let seq = database.add_field(rooms, "pinned", FieldType::Bool, &OwnedValue::Bool(false), &mut sink)?;
//! assert_eq!(seq, 2);
//!
//! // On a writer thread, batches queued during a commit share the next one (group commit).
//! let writer = Writer::spawn(database, Box::new(NullSink), 1024);
//! let mut batch = batch;
//! batch.clear();
//! batch.upsert("!b:example.org").set("name", Value::Str("Bob")).set("recency", Value::U64(20));
//! let (_batch, result) = writer.submit(rooms, batch)?.wait()?;
//! assert_eq!(result?.seq, 3);
//! drop(writer.shutdown()?);
//!
//! // After a restart, everything is back, and views are built by sorting once.
//! let (mut database, report) = Database::open(dir.path(), StoreOptions::default(), &mut print_load_progress)?;
//! assert_eq!((report.n_items, report.last_seq), (2, 3));
//! let room_list = ViewDef::new(Filter::True, vec![SortKey::desc("recency")]);
//! let window = database.open_window(rooms, &room_list, 0, 20, &mut sink)?;
//! let names: Vec<_> = database.window_items(window)?.into_iter().map(|item| item.id).collect();
//! assert_eq!(names, ["!b:example.org", "!a:example.org"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod background;
mod backup;
mod checkpointer;
mod codec;
mod database;
mod error;
mod store;
mod wal;
mod writer;

pub use backup::{Backup, BackupReport};
pub use codec::FORMAT_VERSION;
pub use database::{print_load_progress, Ack, Database, OpenReport, PendingWrite};
pub use error::StoreError;
pub use store::{Durability, LoadProgress, Store, StoreOptions, StoreStats, DEFAULT_LOG_SEGMENT_BYTES};
pub use writer::{WriteTicket, Writer, WriterStopped, MAX_BATCHES_PER_COMMIT, MAX_BYTES_PER_COMMIT};
