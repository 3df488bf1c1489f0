//! The record of which tables a slot's position covers: item `<slot>/tables`
//! of [`super::POSITION_COLLECTION`], JSON, written with the copies (in the
//! group that holds their last rows) and whenever the followed tables change.
//! A restart compares `--pg-table` with it: a table in both resumes, a table
//! only in `--pg-table` is newly followed (copied beside the slot), a table
//! only in the record is no longer followed (its collection is kept as it is).
//! Slot names are `[a-z0-9_]`, so `<slot>/tables` is never another slot's item.

use serde::{Deserialize, Serialize};

use super::config::TableMapping;
use super::{Followed, Stored};
use crate::routing::Routes;
use ordo_pgsource::Lsn;

/// A followed table as recorded: the table, its collection and, for a table
/// copied beside the running slot, its copy's consistent point (`X/Y`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredTable {
    pub schema: String,
    pub name: String,
    pub collection: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_at: Option<String>,
}

impl StoredTable {
    fn is(&self, mapping: &TableMapping) -> bool {
        self.schema == mapping.table.schema && self.name == mapping.table.name && self.collection == mapping.collection
    }
}

pub fn item_id(slot: &str) -> String {
    format!("{slot}/tables")
}

pub fn parse(payload: &[u8], slot: &str) -> Result<Vec<StoredTable>, String> {
    serde_json::from_slice(payload)
        .map_err(|error| format!("the stored list of tables followed by slot `{slot}` does not parse: {error}"))
}

pub fn render(record: &[StoredTable]) -> String {
    serde_json::to_string(record).expect("a list of strings serialises")
}

/// The record of `followed`, in their order.
pub(super) fn record(followed: &[Followed]) -> Vec<StoredTable> {
    followed
        .iter()
        .map(|table| StoredTable {
            schema: table.table.name.schema.clone(),
            name: table.table.name.name.clone(),
            collection: table.map.collection.clone(),
            copied_at: table.copied_at.map(|lsn| lsn.to_string()),
        })
        .collect()
}

/// Whether `mapping` was followed at the stored position. A data directory
/// without the record (written before it was kept) followed every table
/// whose collection exists.
pub(super) fn was_followed(stored: &Stored, mapping: &TableMapping, routes: &Routes) -> bool {
    match &stored.tables {
        Some(record) => record.iter().any(|table| table.is(mapping)),
        None => routes.read().expect("routes lock").get(&mapping.collection).is_some(),
    }
}

/// The copy's consistent point recorded for `mapping`, if it was copied beside the slot.
pub(super) fn copied_at(stored: &Stored, mapping: &TableMapping) -> Option<Lsn> {
    let record = stored.tables.as_ref()?;
    let table = record.iter().find(|table| table.is(mapping))?;
    Lsn::parse(table.copied_at.as_deref()?)
}
