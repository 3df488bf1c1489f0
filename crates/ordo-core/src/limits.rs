//! Every limit the engine enforces, in one place. Each one is tested at its edge.

/// Longest item id, in bytes. Ids are compared and hashed on every update; a bound keeps that cheap.
pub const MAX_ID_BYTES: usize = 255;
/// Longest string field value, in bytes.
pub const MAX_STRING_FIELD_BYTES: usize = 64 * 1024;
/// Largest opaque payload carried by one item.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// Most bytes of ids, field names, strings and payloads in one batch. Batches
/// address their buffers with `u32` offsets; this keeps them well inside that.
pub const MAX_BATCH_BYTES: usize = 256 * 1024 * 1024;
/// Most operations in one batch.
pub const MAX_OPS_PER_BATCH: usize = 1 << 20;
/// Most fields in a schema. Field lookup by name is a linear scan, fine at this size.
pub const MAX_FIELDS_PER_SCHEMA: usize = 64;
/// Longest field name, in bytes.
pub const MAX_FIELD_NAME_BYTES: usize = 64;
/// Most sort keys in one view (the item id is always appended after them).
pub const MAX_SORT_KEYS: usize = 8;
/// Most sort keys with a collation in one view. Each builds its own collator when
/// the view is compiled, and each costs a collator comparison whenever two items'
/// prefixes tie, so a bound keeps both the set-up and the worst-case update cheap.
pub const MAX_COLLATED_SORT_KEYS: usize = 2;
/// Longest collation locale (a BCP 47 tag such as `de-u-co-phonebk`), in bytes.
/// Real tags are far shorter; the bound keeps parsing and error messages small.
pub const MAX_COLLATION_LOCALE_BYTES: usize = 64;
/// Deepest nesting of `all` / `any` / `not` in a filter.
pub const MAX_FILTER_DEPTH: usize = 16;
/// Most nodes (comparisons and combinators) in one filter.
pub const MAX_FILTER_NODES: usize = 256;
/// Most items listed in one `in [...]` comparison.
pub const MAX_FILTER_IN_VALUES: usize = 1024;
/// Largest window limit. A window's diffs are buffered per batch up to this size.
pub const MAX_WINDOW_LIMIT: usize = 100_000;
/// Most items in one collection (slot indices are `u32`).
pub const MAX_ITEMS_PER_COLLECTION: usize = (u32::MAX - 1) as usize;
/// Longest collection name, in bytes.
pub const MAX_COLLECTION_NAME_BYTES: usize = 128;
/// Most collections in one engine (a chat server holds one room list per user).
pub const MAX_COLLECTIONS: usize = 1 << 20;
/// Most distinct target fields (`room.recency`, `room.name`) the views of one
/// collection read through its references. Each is a column of the referencing
/// collection, written whenever its target changes.
pub const MAX_DERIVED_FIELDS: usize = 64;
