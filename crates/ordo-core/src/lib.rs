//! Ordo's engine: keyed collections, live ordered views and windows that emit
//! minimal positional diffs (`eyeball_im::VectorDiff` semantics).
//!
//! The engine does no I/O and knows nothing of JSON, sockets or disks. It is
//! single-threaded by design: one owner applies batches, and nothing on the
//! update path takes a lock or, in steady state, allocates.
//!
//! ```
//! use ordo_core::{Batch, CollectingSink, Engine, FieldType, Filter, OwnedDiff, OwnedValue, Precondition, Schema, SortKey, Value, ViewDef};
//!
//! let mut engine = Engine::new();
//! let schema = Schema::new()
//!     .with_field("name", FieldType::String)
//!     .with_field("recency", FieldType::U64)
//!     .with_field("unread", FieldType::U64)
//!     .with_field("left", FieldType::Bool);
//! let rooms = engine.create_collection("rooms", schema).unwrap();
//!
//! let mut batch = Batch::new();
//! batch.upsert("!a:example.org").set("name", Value::Str("Alice")).set("recency", Value::U64(10)).set("left", Value::Bool(false));
//! batch.upsert("!b:example.org").set("name", Value::Str("Bob")).set("recency", Value::U64(20)).set("left", Value::Bool(false));
//! let mut sink = CollectingSink::new();
//! engine.apply_batch(rooms, &batch, &mut sink).unwrap();
//!
//! // The room list: rooms not left, most recent first, top 20.
//! let room_list = ViewDef::new(Filter::eq("left", OwnedValue::Bool(false)), vec![SortKey::desc("recency"), SortKey::asc("name")]);
//! let window = engine.open_window(rooms, &room_list, 0, 20, &mut sink).unwrap();
//! let mut local: Vec<_> = Vec::new();
//! for diff in sink.take_for(window) {
//!     diff.apply(&mut local); // the first diff is a Reset with the window's contents
//! }
//! assert_eq!(local.iter().map(|item| item.id.as_str()).collect::<Vec<_>>(), ["!b:example.org", "!a:example.org"]);
//!
//! // A new message in Alice's room moves it to the top: one Remove, one Insert.
//! batch.clear();
//! batch.upsert("!a:example.org").set("recency", Value::U64(30)).payload(b"Alice: hi!");
//! engine.apply_batch(rooms, &batch, &mut sink).unwrap();
//! let diffs = sink.take_for(window);
//! assert!(matches!(diffs[..], [OwnedDiff::Remove { index: 1 }, OwnedDiff::Insert { index: 0, .. }]));
//! for diff in diffs {
//!     diff.apply(&mut local);
//! }
//! assert_eq!(local[0].payload, b"Alice: hi!");
//!
//! // Atomic operations and preconditions, resolved against the item as the batch finds it.
//! batch.clear();
//! batch.upsert("!a:example.org").precondition(Precondition::Exists).set_max("recency", Value::U64(31)).increment("unread", Value::U64(1));
//! engine.apply_batch(rooms, &batch, &mut sink).unwrap();
//! let alice = engine.collection(rooms).unwrap().get("!a:example.org").unwrap();
//! assert_eq!((alice.field_by_name("unread"), alice.version()), (Some(Value::U64(1)), 3)); // the third batch
//! ```

// The modules from the leaves up: each uses only the modules listed before it
// (a module's own submodules aside: the engine's, the collection's, the order
// tree's, the filter's compiler).

// Basic types.
// `CollectionId`, `WindowId`, `Slot`: the handles every layer passes around.
mod ids;
// Cache hints for loops over cold per-item state.
mod prefetch;
// Every input's limit, in one place.
pub mod limits;
// `Schema`, `FieldDef`, `FieldId`, `FieldType`: typed fields.
mod schema;
// `Value` (borrowed) and `OwnedValue`, and their conversion to a field's type.
mod value;
// `ViewDef`: a `Filter` AST and `SortKey`s, plain data.
mod view_def;
// `Batch`: a caller-owned, reusable list of upserts and removes.
mod batch;
// `BatchError`, `LoadError`, `ViewError`.
mod error;
// `check_field_value`: one value checked against its field, for every writer.
mod field_check;

// Storage.
// `SlotId`: an item's id, stored once in its slot; the id index's entries.
mod slot_id;
// `Collection`: items in slots, a column per field (`collection::column`).
mod collection;
// `KeyIndex`: keyed views and the equality index.
mod key_index;
// `RefIndex`: the reverse index of a reference field.
mod reference;

// Views.
// `contains` / `prefix`: case- and accent-folded matching.
mod text_match;
// `Collation`: ICU collators for collated sort keys.
mod collation;
// `CompiledFilter`: a filter compiled (`filter::compile`) and evaluated per slot.
mod filter;
// `CompiledSort`: sort keys encoded into one 128-bit prefix.
mod sort;
// `OrderTree`: a view's sorted index of (prefix, slot) entries.
mod order_tree;
// `View` and `ViewPlan`: plan, index and membership.
mod view;
// `WindowAnchor`: windows placed by key.
mod anchor;

// Diffs.
// `DiffSink`, `DiffRef`, `OwnedDiff`: what a window's owner receives.
mod diff;
// `Window`: a view's range, and one item's move as that range's diffs.
mod window;
// The smallest diff between two contents of a window.
mod list_diff;

// Batches and the engine.
// Atomic operations and preconditions resolved into plain values.
mod resolve;
// `BulkLoad`: many new items, indexed at once.
mod bulk_load;
// `Engine`: owns everything above; validates, applies and delivers batches.
mod engine;

#[cfg(test)]
mod test_rng;

// The unit tests count allocations, so that memory accounting is checked
// against what was allocated (`key_index::tests`).
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: ordo_test_kit::alloc::CountingAllocator = ordo_test_kit::alloc::CountingAllocator;

pub use anchor::{ItemPosition, WindowAnchor, WindowRange};
pub use batch::{AtomicOp, Batch, BatchOp, Precondition, UpsertBuilder};
pub use bulk_load::BulkLoad;
pub use collation::canonical_collation_locale;
pub use collection::{Collection, ItemRef, OwnedItem};
pub use diff::{CollectingSink, DiffRef, DiffSink, ItemList, NullSink, OwnedDiff};
pub use engine::{BatchSummary, CreateCollectionError, Engine, EngineStats, SchemaChangeError};
pub use error::{BatchError, LoadError, ViewError};
pub use filter::CompiledFilter;
pub use ids::{CollectionId, WindowId};
pub use schema::{FieldDef, FieldId, FieldType, Schema, SchemaError};
pub use sort::CompiledSort;
pub use value::{OwnedValue, Value};
pub use view_def::{CompareOp, Direction, Filter, SortKey, ViewDef};
