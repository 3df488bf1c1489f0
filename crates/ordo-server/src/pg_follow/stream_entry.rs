//! Cluster mode's follower entries: what the node holding the follower lease
//! publishes to the stream (a `postgres` entry, `cluster::entry`) and every
//! node applies (`pg_follow::apply`). One JSON object, in the entry's
//! `postgres` key:
//!
//! ```json
//! {"slot":"ordo","term":41,"change":{"op":"rows","collection":"rooms","end_lsn":23462728,
//!  "ops":[{"op":"upsert","id":"r1","fields":[["title","Lobby"],["score",{"f64":"inf"}]]},
//!         {"op":"remove","id":"r2"}]}}
//! ```
//!
//! `term` is the lease revision the publishing node took the lease at (a
//! fencing token: every later lease has a higher one). The changes:
//!
//! | `op`                | what every node does (after the fencing of `apply`)          |
//! |---------------------|--------------------------------------------------------------|
//! | `claim`             | stores `term` as the slot's term; answers the stored position |
//! | `create_collection` | creates the followed collection (`fields`: name and type)    |
//! | `add_field`         | adds a field (`field`, `field_type`, `default`)              |
//! | `remove_field`      | removes a field                                              |
//! | `drop_collection`   | drops a followed collection (a copy started again)           |
//! | `rows`              | one batch of a transaction (or of the copy's last rows), at `end_lsn` |
//! | `copy_rows`         | one batch of a copy, at no LSN: written whatever the position |
//! | `tables`            | stores `tables` as the slot's record of followed tables (`pg_follow::tables`) |
//! | `position`          | stores `end_lsn` as the slot's position: the transaction ends |
//!
//! One PostgreSQL transaction is the `rows` entries of the collections it
//! touched (a batch split in several when it passes the stream's message size)
//! and, last, its `position` entry: an entry is one batch at one seq, and a
//! transaction's batches are in several collections (docs/SCALING.md, "The
//! PostgreSQL follower"). The holder submits each transaction as a unit
//! (`Cluster::submit_units_as`), so it goes whole into one stream message
//! unless it alone is larger than one, and every node applies a transaction's
//! entries that came in one run as one group commit with one published seq
//! (`cluster::apply`), as a single node does: a transaction larger than a
//! message may be seen in the parts its messages make. Each entry's message id
//! is `pg/<slot>/<term>/<end LSN>/<index>` behind the node's own prefix
//! (`Shared::register`): it names the request waiting for the entry's outcome,
//! and JetStream dedupes on it only for an entry published alone (a pack has an
//! id of its own); a transaction published again, by this holder or a later
//! one, is applied once by the apply's fencing (`pg_follow::apply`). A copy is `copy_rows` entries, then its last rows,
//! the `tables` record and (a first copy) the `position`: the copy of a table
//! newly followed at a restart is written while a position is stored, so its
//! rows cannot be `rows` (those at or before the position are skipped). Values
//! keep their type: a string, a bool, null, an integer (`i64`), `{"u64": n}`,
//! `{"f64": "text"}` (so infinities cross too).

use ordo_core::{Batch, FieldType, OwnedValue, Value};
use serde::{Deserialize, Serialize};

use super::tables::StoredTable;

/// The entry's `postgres` object.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PgEntry {
    pub slot: String,
    pub term: u64,
    #[serde(deserialize_with = "super::wire_decode::change")]
    pub change: PgChange,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum PgChange {
    Claim {},
    CreateCollection { collection: String, fields: Vec<(String, String)> },
    AddField { collection: String, field: String, field_type: String, default: WireValue },
    RemoveField { collection: String, field: String },
    DropCollection { collection: String },
    Rows { collection: String, end_lsn: u64, ops: Vec<WireOp> },
    CopyRows { collection: String, ops: Vec<WireOp> },
    Tables { tables: Vec<StoredTable> },
    Position { end_lsn: u64 },
}

/// Read by `wire_decode`'s own visitor (in the same JSON).
#[derive(Debug, Serialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum WireOp {
    Upsert {
        id: String,
        fields: Vec<(String, WireValue)>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<String>,
    },
    Remove {
        id: String,
    },
}

/// A field value with its type (see the module doc); read by `wire_decode`'s
/// own visitor.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(untagged)]
pub enum WireValue {
    Null(()),
    Bool(bool),
    I64(i64),
    Str(String),
    U64 { u64: u64 },
    F64 { f64: String },
}

/// What applying a follower entry did, handed to the node that published it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The claim of a term: the slot's stored position (`None`: none, a copy
    /// is due), the tables it covers (`None`: no record, or no position), and
    /// the reserved collection that holds them, on this node.
    Claimed {
        position: Option<ordo_pgsource::Lsn>,
        tables: Option<Vec<StoredTable>>,
        collection: ordo_core::CollectionId,
    },
    /// A collection created (or found with the same schema): its id here.
    Created(ordo_core::CollectionId),
    Done,
    /// A `rows` or `position` entry at or before the stored position: a
    /// transaction applied already (a publish sent again), nothing written.
    AlreadyApplied,
    /// An entry of an older term than the slot's (a node that lost the lease
    /// and did not know it yet): nothing written, on every node.
    Fenced {
        current_term: u64,
    },
}

impl WireValue {
    pub fn of(value: Value<'_>) -> WireValue {
        match value {
            Value::Null => WireValue::Null(()),
            Value::Bool(flag) => WireValue::Bool(flag),
            Value::I64(number) => WireValue::I64(number),
            Value::U64(number) => WireValue::U64 { u64: number },
            Value::F64(number) => WireValue::F64 { f64: number.to_string() },
            Value::Str(text) => WireValue::Str(text.to_owned()),
        }
    }

    pub fn to_owned_value(&self) -> Result<OwnedValue, String> {
        Ok(match self {
            WireValue::Null(()) => OwnedValue::Null,
            WireValue::Bool(flag) => OwnedValue::Bool(*flag),
            WireValue::I64(number) => OwnedValue::I64(*number),
            WireValue::U64 { u64 } => OwnedValue::U64(*u64),
            WireValue::F64 { f64 } => {
                OwnedValue::F64(f64.parse().map_err(|_| format!("`{f64}` is not a floating-point number"))?)
            }
            WireValue::Str(text) => OwnedValue::Str(text.clone()),
        })
    }
}

/// A batch's ops as the entry carries them. The follower writes only upserts
/// of field values (and a payload) and removes: anything else is refused.
pub fn ops_of(batch: &Batch) -> Result<Vec<WireOp>, String> {
    batch
        .ops()
        .map(|op| {
            if op.precondition().is_some() || op.atomics().len() > 0 {
                return Err(format!("the change of `{}` has a precondition or an atomic operation", op.id()));
            }
            if op.is_remove() {
                return Ok(WireOp::Remove { id: op.id().to_owned() });
            }
            let fields = op.fields().map(|(name, value)| (name.to_owned(), WireValue::of(value))).collect();
            let payload = match op.payload() {
                None => None,
                Some(bytes) => Some(
                    String::from_utf8(bytes.to_vec())
                        .map_err(|_| format!("the payload of `{}` is not UTF-8", op.id()))?,
                ),
            };
            Ok(WireOp::Upsert { id: op.id().to_owned(), fields, payload })
        })
        .collect()
}

/// Appends `ops` to `batch`.
pub fn fill_batch(batch: &mut Batch, ops: &[WireOp]) -> Result<(), String> {
    for op in ops {
        match op {
            WireOp::Remove { id } => batch.remove(id),
            WireOp::Upsert { id, fields, payload } => {
                let mut upsert = batch.upsert(id);
                for (name, value) in fields {
                    let value = value.to_owned_value()?;
                    upsert = upsert.set(name, value.as_value());
                }
                if let Some(payload) = payload {
                    upsert.payload(payload.as_bytes());
                }
            }
        }
    }
    Ok(())
}

/// Splits `ops` into runs whose JSON takes at most `max_bytes` each (one op
/// larger than that is refused: the stream would not take it).
pub fn split_ops(ops: Vec<WireOp>, max_bytes: usize) -> Result<Vec<Vec<WireOp>>, String> {
    let mut runs: Vec<Vec<WireOp>> = Vec::new();
    let mut run_bytes = 0;
    for op in ops {
        // Each op's size once more: the price of never passing the stream's limit.
        let op_bytes = serde_json::to_vec(&op).map_err(|error| error.to_string())?.len() + 1;
        if op_bytes > max_bytes {
            return Err(format!("one change takes {op_bytes} bytes: more than a stream message holds ({max_bytes})"));
        }
        if runs.is_empty() || run_bytes + op_bytes > max_bytes {
            runs.push(Vec::new());
            run_bytes = 0;
        }
        run_bytes += op_bytes;
        runs.last_mut().expect("a run was just pushed if there was none").push(op);
    }
    Ok(runs)
}

/// A field type as the entry names it: its name, and a reference's target's
/// (collection ids are this node's own).
pub fn type_name(field_type: FieldType, target_name: impl Fn(ordo_core::CollectionId) -> Option<String>) -> String {
    match field_type {
        FieldType::Ref(target) => format!("ref:{}", target_name(target).unwrap_or_default()),
        other => other.name().to_owned(),
    }
}

/// The field type an entry names (see [`type_name`]).
pub fn parse_type(
    text: &str,
    target_id: impl Fn(&str) -> Option<ordo_core::CollectionId>,
) -> Result<FieldType, String> {
    Ok(match text {
        "bool" => FieldType::Bool,
        "i64" => FieldType::I64,
        "u64" => FieldType::U64,
        "f64" => FieldType::F64,
        "string" => FieldType::String,
        _ => match text.strip_prefix("ref:") {
            Some(target) => FieldType::Ref(target_id(target).ok_or_else(|| format!("no collection `{target}`"))?),
            None => return Err(format!("unknown field type `{text}`")),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_crosses_the_stream_with_its_values_typed() {
        let mut batch = Batch::new();
        batch
            .upsert("a/1")
            .set("n", Value::I64(-3))
            .set("u", Value::U64(u64::MAX))
            .set("x", Value::F64(f64::NEG_INFINITY))
            .set("y", Value::F64(0.1))
            .set("s", Value::Str("5"))
            .set("b", Value::Bool(true))
            .set("z", Value::Null)
            .payload(b"0/16B3748");
        batch.remove("gone");
        let ops = ops_of(&batch).unwrap();
        let entry =
            PgEntry { slot: "s".into(), term: 7, change: PgChange::Rows { collection: "c".into(), end_lsn: 9, ops } };
        let text = serde_json::to_string(&entry).unwrap();
        let back: PgEntry = serde_json::from_str(&text).unwrap();
        assert_eq!(back, entry, "{text}");
        let PgChange::Rows { ops, .. } = back.change else { panic!() };
        let mut again = Batch::new();
        fill_batch(&mut again, &ops).unwrap();
        assert_eq!(ops_of(&again).unwrap(), ops);
        let first = again.ops().next().unwrap();
        let values: Vec<_> = first.fields().map(|(_, value)| value.to_owned_value()).collect();
        assert_eq!(
            values,
            [
                OwnedValue::I64(-3),
                OwnedValue::U64(u64::MAX),
                OwnedValue::F64(f64::NEG_INFINITY),
                OwnedValue::F64(0.1),
                OwnedValue::Str("5".into()),
                OwnedValue::Bool(true),
                OwnedValue::Null
            ]
        );
        assert!(serde_json::from_str::<PgEntry>(r#"{"slot":"s","term":1,"change":{"op":"claim","x":1}}"#).is_err());
    }

    #[test]
    fn a_copys_rows_and_the_record_of_the_followed_tables_cross_the_stream() {
        let ops = vec![WireOp::Remove { id: "a".into() }];
        let record = vec![StoredTable {
            schema: "public".into(),
            name: "items".into(),
            collection: "items".into(),
            copied_at: Some("0/16B3748".into()),
        }];
        for change in [PgChange::CopyRows { collection: "items".into(), ops }, PgChange::Tables { tables: record }] {
            let entry = PgEntry { slot: "s".into(), term: 3, change };
            let text = serde_json::to_string(&entry).unwrap();
            assert_eq!(serde_json::from_str::<PgEntry>(&text).unwrap(), entry, "{text}");
        }
        let unknown = r#"{"slot":"s","term":1,"change":{"op":"tables","tables":[],"position":"0/1"}}"#;
        assert!(serde_json::from_str::<PgEntry>(unknown).is_err());
    }

    #[test]
    fn ops_are_split_under_the_message_size_and_an_op_past_it_is_refused() {
        let ops: Vec<WireOp> = (0..100).map(|n| WireOp::Remove { id: format!("{n:08}") }).collect();
        let one = serde_json::to_vec(&ops[0]).unwrap().len() + 1;
        let runs = split_ops(ops, one * 30).unwrap();
        assert_eq!(runs.iter().map(Vec::len).collect::<Vec<_>>(), [30, 30, 30, 10]);
        let big = vec![WireOp::Remove { id: "x".repeat(100) }];
        assert!(split_ops(big, 50).is_err());
    }
}
