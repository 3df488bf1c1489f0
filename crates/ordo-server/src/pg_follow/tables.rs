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
#[serde(deny_unknown_fields)]
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

/// A followed table and its collection as one text, to compare a node's
/// `--pg-table` with a record.
pub fn key(schema: &str, name: &str, collection: &str) -> String {
    format!("{schema}.{name} into `{collection}`")
}

/// `--pg-table`'s tables as [`key`]s.
pub fn keys_of(mappings: &[TableMapping]) -> Vec<String> {
    mappings.iter().map(|mapping| key(&mapping.table.schema, &mapping.table.name, &mapping.collection)).collect()
}

/// Cluster mode: how `record` (what the lease holder follows) differs from
/// this node's `--pg-table` (`own`, as [`key`]s); `None` when it does not.
/// The order does not count, nor where a table was copied.
pub fn differences(own: &[String], record: &[StoredTable]) -> Option<String> {
    let recorded: Vec<String> = record.iter().map(|table| key(&table.schema, &table.name, &table.collection)).collect();
    let only_here: Vec<&str> = own.iter().filter(|key| !recorded.contains(key)).map(String::as_str).collect();
    let only_there: Vec<&str> = recorded.iter().filter(|key| !own.contains(key)).map(String::as_str).collect();
    if only_here.is_empty() && only_there.is_empty() {
        return None;
    }
    Some(format!(
        "this node's --pg-table differs from the tables the PostgreSQL follower follows (written by the node that \
         held the lease): only here [{}], only there [{}]; give every node the same --pg-table",
        only_here.join(", "),
        only_there.join(", ")
    ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_pgsource::TableName;

    fn mapping(table: &str, collection: &str) -> TableMapping {
        TableMapping {
            table: TableName::parse(table),
            collection: collection.to_owned(),
            columns: None,
            refs: Vec::new(),
            payload: None,
        }
    }

    fn stored(schema: &str, name: &str, collection: &str, copied_at: Option<&str>) -> StoredTable {
        let (schema, name, collection) = (schema.to_owned(), name.to_owned(), collection.to_owned());
        StoredTable { schema, name, collection, copied_at: copied_at.map(str::to_owned) }
    }

    #[test]
    fn a_record_differs_from_a_nodes_tables_by_table_or_collection_not_by_order_or_copy() {
        let own = keys_of(&[mapping("items", "items"), mapping("s.rooms", "chat_rooms")]);
        let same = [stored("s", "rooms", "chat_rooms", Some("0/16B3748")), stored("public", "items", "items", None)];
        assert_eq!(differences(&own, &same), None);
        let other = [stored("public", "items", "things", None), stored("s", "rooms", "chat_rooms", None)];
        let message = differences(&own, &other).unwrap();
        assert!(message.contains("only here [public.items into `items`]"), "{message}");
        assert!(message.contains("only there [public.items into `things`]"), "{message}");
        let fewer = [stored("public", "items", "items", None)];
        assert!(differences(&own, &fewer).unwrap().contains("only here [s.rooms into `chat_rooms`], only there []"));
    }

    #[test]
    fn a_record_round_trips_and_refuses_unknown_keys() {
        let record = vec![stored("public", "items", "items", Some("0/16B3748"))];
        assert_eq!(parse(render(&record).as_bytes(), "s").unwrap(), record);
        let unknown = br#"[{"schema":"public","name":"items","collection":"items","extra":1}]"#;
        assert!(parse(unknown, "s").is_err());
    }
}
