//! Ordo's engine: keyed collections, live ordered views and windows that emit
//! minimal positional diffs (`eyeball_im::VectorDiff` semantics).
//!
//! The engine does no I/O and knows nothing of JSON, sockets or disks. It is
//! single-threaded by design: one owner applies batches, and nothing on the
//! update path takes a lock or, in steady state, allocates.

mod batch;
mod collection;
mod diff;
mod engine;
mod error;
mod filter;
mod list_diff;
mod order_tree;
mod schema;
mod sort;
mod value;
mod view;
mod view_def;
mod window;

pub mod limits;

pub use batch::{Batch, UpsertBuilder};
pub use collection::{Collection, ItemRef, OwnedItem};
pub use diff::{CollectingSink, DiffRef, DiffSink, ItemList, NullSink, OwnedDiff, WindowId};
pub use engine::{BatchSummary, CollectionId, CreateCollectionError, Engine, EngineStats};
pub use error::{BatchError, ViewError};
pub use filter::CompiledFilter;
pub use schema::{FieldDef, FieldId, FieldType, Schema, SchemaError};
pub use sort::CompiledSort;
pub use value::{OwnedValue, Value};
pub use view_def::{CompareOp, Direction, Filter, SortKey, ViewDef};
