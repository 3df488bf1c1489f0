//! Schema changes and drops in LMDB: each is one write transaction that also
//! sets `last_seq` to the change's own sequence number, so after a crash LMDB
//! holds the collection either as it was or as it became, never a mix.
//!
//! Why items are rewritten rather than decoded through a tolerant schema: an
//! item record lists its fields in schema order with a presence bitmap (see
//! `docs/STORAGE.md`), so a removed field would leave every later field at the
//! wrong position, and a decoder that tolerated it would need the history of
//! every removal kept forever in the collection record and consulted on every
//! load and every merge of a partial upsert. Rewriting costs one pass over the
//! collection's items, once, inside the change's transaction (an admin
//! operation, as `ALTER TABLE` is elsewhere), and keeps every record complete
//! under its collection's current schema (invariant 4).
//!
//! A drop deletes the collection's items, its record and its item count in one
//! transaction. The pages those held go back to LMDB's freelist when it
//! commits and are reused by later writes; LMDB never shrinks `data.mdb`.

use std::ops::Bound;

use heed::RwTxn;
use ordo_core::{OwnedValue, Schema};

use super::Store;
use crate::codec::{self, FieldSource, PayloadSource};
use crate::error::StoreError;

/// A schema change or a drop, as the store applies it.
pub(crate) enum SchemaChange {
    /// `old_schema` is the one the stored items are encoded under.
    Fields {
        number: u32,
        name: String,
        old_schema: Schema,
        new_schema: Schema,
        change: FieldChange,
    },
    Drop {
        number: u32,
    },
}

pub(crate) enum FieldChange {
    /// Appended last; every item takes `default` (already of the field's type, or null).
    Added {
        default: OwnedValue,
    },
    Removed {
        field_index: usize,
    },
}

/// Items rewritten per read of the `items` database: bounds the memory a
/// rewrite holds (keys and records) whatever the collection's size.
const REWRITE_CHUNK_ITEMS: usize = 4096;

impl Store {
    /// Applies `change` and sets `last_seq` to `seq` in one transaction (which
    /// is retried after growing the map when it is full).
    pub(crate) fn change_schema(&mut self, change: &SchemaChange, seq: u64) -> Result<(), StoreError> {
        debug_assert_eq!(seq, self.last_seq + 1, "a change follows the last checkpointed batch");
        self.with_map_growth("changing a collection's schema", |store| {
            let mut txn = store.env.write_txn()?;
            match change {
                SchemaChange::Fields { number, name, old_schema, new_schema, change } => {
                    let mut record = Vec::new();
                    codec::encode_collection(&mut record, name, new_schema);
                    store.collections.put(&mut txn, &codec::collection_key(*number), &record)?;
                    store.rewrite_items(&mut txn, *number, old_schema, change)?;
                }
                SchemaChange::Drop { number } => {
                    let (start, end) = item_range(*number);
                    store.items.delete_range(&mut txn, &(Bound::Included(&start[..]), end_bound(&end)))?;
                    store.collections.delete(&mut txn, &codec::collection_key(*number))?;
                    store.item_counts.delete(&mut txn, &codec::collection_key(*number))?;
                }
            }
            store.meta.put(&mut txn, codec::META_LAST_SEQ, &seq.to_le_bytes())?;
            txn.commit()?;
            // Durable before anything after it is logged, in every durability mode:
            // with `Relaxed` (no meta-page sync) a machine crash could otherwise
            // take the change back while later log records, written under the new
            // schema and in a segment that starts after it, survive.
            store.env.force_sync()
        })?;
        self.last_seq = seq;
        Ok(())
    }

    /// Re-encodes every item of collection `number` under the new schema, a chunk
    /// of items at a time (read, then written, so no cursor is open across a put).
    fn rewrite_items(
        &self,
        txn: &mut RwTxn<'_>,
        number: u32,
        old_schema: &Schema,
        change: &FieldChange,
    ) -> heed::Result<()> {
        let (start, end) = item_range(number);
        let corrupt = |corrupt: codec::Corrupt| heed::Error::Decoding(corrupt.0.into());
        let mut after: Option<Vec<u8>> = None;
        let mut spans = Vec::new();
        let mut chunk: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        loop {
            chunk.clear();
            let lower = match &after {
                Some(key) => Bound::Excluded(&key[..]),
                None => Bound::Included(&start[..]),
            };
            for entry in self.items.range(txn, &(lower, end_bound(&end)))?.take(REWRITE_CHUNK_ITEMS) {
                let (key, old_record) = entry?;
                let payload = codec::scan_item(old_record, old_schema, &mut spans).map_err(corrupt)?;
                let mut sources: Vec<FieldSource<'_>> =
                    spans.iter().map(|span| span.map_or(FieldSource::Null, FieldSource::Old)).collect();
                match change {
                    FieldChange::Added { default } => sources.push(FieldSource::New(default.as_value())),
                    FieldChange::Removed { field_index } => {
                        sources.remove(*field_index);
                    }
                }
                let mut new_record = Vec::new();
                codec::encode_item(&mut new_record, old_record, &sources, PayloadSource::Old(payload));
                chunk.push((key.to_vec(), new_record));
            }
            for (key, record) in &chunk {
                self.items.put(txn, key, record)?;
            }
            match chunk.pop() {
                Some((last_key, _)) if chunk.len() + 1 == REWRITE_CHUNK_ITEMS => after = Some(last_key),
                _ => return Ok(()),
            }
        }
    }
}

/// The keys of collection `number`'s items: from its 4-byte prefix up to the
/// next number's (`None`: the last possible number, up to the end).
fn item_range(number: u32) -> ([u8; 4], Option<[u8; 4]>) {
    (codec::collection_key(number), number.checked_add(1).map(codec::collection_key))
}

fn end_bound(end: &Option<[u8; 4]>) -> Bound<&[u8]> {
    match end {
        Some(end) => Bound::Excluded(&end[..]),
        None => Bound::Unbounded,
    }
}
