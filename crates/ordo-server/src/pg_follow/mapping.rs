//! How a followed table's rows become a collection's items: the schema (a
//! field per followed column, typed from the column), the item id (the primary
//! key), and each value. No I/O: a row in, batch operations out.

use std::borrow::Cow;
use std::collections::HashMap;

use ordo_core::limits::{MAX_FIELDS_PER_SCHEMA, MAX_ID_BYTES, MAX_PAYLOAD_BYTES, MAX_STRING_FIELD_BYTES};
use ordo_core::{Batch, CollectionId, FieldType, Schema, Value as OrdoValue};
use ordo_pgsource::stream::Layout;
use ordo_pgsource::{ColumnType, Field, Table, TableName, Value};

use super::config::TableMapping;
use crate::limits::MAX_PAYLOAD_DEPTH;
use crate::strict_json::{self, Integers::AsWritten, Refusal};

/// Joins the parts of a composite primary key into an item id. Inside each part
/// `\` is written `\\` and `/` is written `\/`, so two different keys never give
/// the same id. A one-column key is the id as it is, unescaped.
pub const KEY_SEPARATOR: char = '/';

/// A followed table as the server maps it: which of its columns are fields.
#[derive(Clone, Debug)]
pub struct TableMap {
    pub collection: String,
    /// The collection's fields, in its order.
    pub fields: Vec<MappedField>,
    /// The configured columns besides the key (`None`: every followed column):
    /// they decide whether a column added in PostgreSQL becomes a field.
    pub wanted: Option<Vec<String>>,
    pub key_columns: Vec<String>,
    /// The `ref` columns: each field's values are ids of the target's items.
    pub refs: Vec<MappedRef>,
    /// The column that is each item's payload (never a field).
    pub payload: Option<String>,
}

/// A `ref` column and the collection it points at.
#[derive(Clone, Debug, PartialEq)]
pub struct MappedRef {
    pub column: String,
    pub target_collection: String,
    /// The target's id, once it exists (`TableMap::resolve_refs`).
    pub target: Option<CollectionId>,
}

/// A field and the column it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct MappedField {
    pub name: String,
    pub field_type: FieldType,
    /// The column's type as last seen; `None` when not known (a field kept at a
    /// restart whose column the catalog no longer has with values of its type:
    /// the stream, behind the catalog, says what it was).
    pub column_type: Option<ColumnType>,
}

impl MappedField {
    #[cfg(test)]
    fn of_column(name: &str, column_type: ColumnType) -> MappedField {
        MappedField { name: name.to_owned(), field_type: field_type(column_type), column_type: Some(column_type) }
    }
}

/// What a table's new layout changes in its collection's fields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldChanges {
    /// Followed columns that are no field yet: fields to append.
    pub added: Vec<(String, ColumnType)>,
    /// Fields whose column is gone, or no longer configured.
    pub removed: Vec<String>,
    /// Fields whose column changed to a type of the same values (`int4` to
    /// `int8`): the collection is unchanged.
    pub retyped: Vec<(String, ColumnType)>,
}

impl FieldChanges {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.retyped.is_empty()
    }
}

/// The field type that holds a column's values.
pub fn field_type(column_type: ColumnType) -> FieldType {
    match column_type {
        ColumnType::Bool => FieldType::Bool,
        ColumnType::Int | ColumnType::Numeric => FieldType::I64,
        ColumnType::Float => FieldType::F64,
        ColumnType::Text | ColumnType::Uuid | ColumnType::Json => FieldType::String,
        ColumnType::Timestamp | ColumnType::TimestampTz | ColumnType::Date => FieldType::I64,
    }
}

/// Checks the configured columns against the table and lists its fields: the
/// key and `ref` columns always, then the configured ones (all followed ones
/// by default), never the payload column. `followed` are every followed
/// table's mappings, for the `ref` columns' targets (checked before by
/// `refs::check_and_order`).
pub fn map_table(mapping: &TableMapping, table: &Table, followed: &[TableMapping]) -> Result<TableMap, String> {
    if let Some(wanted) = &mapping.columns {
        for name in wanted {
            let column = table
                .columns
                .iter()
                .find(|column| &column.name == name)
                .ok_or_else(|| format!("--pg-table {}: the table has no column `{name}`", mapping.table))?;
            if column.column_type.is_none() {
                return Err(format!(
                    "--pg-table {}: the column `{name}` has a type Ordo does not follow",
                    mapping.table
                ));
            }
        }
    }
    let refs = mapping
        .refs
        .iter()
        .map(|reference| {
            let target = followed.iter().find(|other| other.table == reference.target);
            let target_collection = target.map(|other| other.collection.clone()).ok_or_else(|| {
                format!(
                    "--pg-table {}: the ref column `{}` points at a table not followed",
                    mapping.table, reference.column
                )
            })?;
            Ok(MappedRef { column: reference.column.clone(), target_collection, target: None })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut map = TableMap {
        collection: mapping.collection.clone(),
        fields: Vec::new(),
        wanted: mapping.columns.clone(),
        key_columns: table.key_columns.clone(),
        refs,
        payload: mapping.payload.clone(),
    };
    for column in &table.columns {
        if let (Some(column_type), true) = (column.column_type, map.wants(&column.name)) {
            map.fields.push(map.field_of(&column.name, column_type));
        }
    }
    check_field_count(&mapping.table, map.fields.len())?;
    Ok(map)
}

fn check_field_count(table: &impl std::fmt::Display, n_fields: usize) -> Result<(), String> {
    if n_fields > MAX_FIELDS_PER_SCHEMA {
        return Err(format!(
            "--pg-table {table}: {n_fields} columns; a collection has at most {MAX_FIELDS_PER_SCHEMA} fields (name the columns to follow)"
        ));
    }
    Ok(())
}

/// Whether a column of type `new` holds the values its field holds: the same
/// type, or integers either way (`int2/4/8`, integral `numeric`). Any other
/// change rewrote the rows in PostgreSQL without a change in the stream.
fn keeps_values(field: &MappedField, new: ColumnType) -> bool {
    let is_integer = |column_type| matches!(column_type, ColumnType::Int | ColumnType::Numeric);
    match field.column_type {
        Some(old) => old == new || (is_integer(old) && is_integer(new)),
        None => field_type(new) == field.field_type.value_type(),
    }
}

/// Refuses a layout that both drops and adds columns: a column renamed looks
/// just so, and its rows keep their values in PostgreSQL without a change in
/// the stream, so a field removed and another added would lose them.
fn refuse_a_possible_rename(table: &TableName, changes: &FieldChanges) -> Result<(), String> {
    if changes.removed.is_empty() || changes.added.is_empty() {
        return Ok(());
    }
    let gone = changes.removed.join("`, `");
    let new: Vec<&str> = changes.added.iter().map(|(name, _)| name.as_str()).collect();
    Err(format!(
        "the columns of `{table}` changed between two of its changes: `{gone}` gone, `{}` new. A column renamed looks so, and its values are not streamed again; copy the table anew (docs/POSTGRES.md, \"Failures while serving\")",
        new.join("`, `")
    ))
}

/// The PostgreSQL types a column type stands for, for messages.
pub fn postgres_types(column_type: ColumnType) -> &'static str {
    match column_type {
        ColumnType::Bool => "bool",
        ColumnType::Int => "int2/int4/int8",
        ColumnType::Float => "float4/float8",
        ColumnType::Numeric => "numeric",
        ColumnType::Text => "text/varchar/char/name",
        ColumnType::Uuid => "uuid",
        ColumnType::Timestamp => "timestamp",
        ColumnType::TimestampTz => "timestamptz",
        ColumnType::Date => "date",
        ColumnType::Json => "json/jsonb",
    }
}

impl TableMap {
    /// The field that holds a column: a `ref` column's is a reference to its
    /// target (a string until the target's id is known).
    fn field_of(&self, name: &str, column_type: ColumnType) -> MappedField {
        let field_type = match self.ref_of(name) {
            Some(MappedRef { target: Some(target), .. }) => FieldType::Ref(*target),
            _ => field_type(column_type),
        };
        MappedField { name: name.to_owned(), field_type, column_type: Some(column_type) }
    }

    fn ref_of(&self, name: &str) -> Option<&MappedRef> {
        self.refs.iter().find(|reference| reference.column == name)
    }

    /// The field type of a column added to the table.
    pub fn added_field_type(&self, name: &str, column_type: ColumnType) -> FieldType {
        self.field_of(name, column_type).field_type
    }

    /// Makes each `ref` column's field a reference, once every target exists
    /// (`ids`: collection ids by name).
    pub fn resolve_refs(&mut self, ids: &HashMap<String, CollectionId>) -> Result<(), String> {
        for reference in &mut self.refs {
            let target = *ids.get(&reference.target_collection).ok_or_else(|| {
                format!("the collection `{}` is not created before `{}`", reference.target_collection, self.collection)
            })?;
            reference.target = Some(target);
            if let Some(field) = self.fields.iter_mut().find(|field| field.name == reference.column) {
                field.field_type = FieldType::Ref(target);
            }
        }
        Ok(())
    }

    /// At a restart: the collection as it exists must have the configured
    /// `ref` fields (to the same targets) and no field of the payload column;
    /// otherwise the configuration changed since the copy.
    pub fn check_kept(&self, schema: &Schema) -> Result<(), String> {
        let kept_type = |name: &str| schema.field_id(name).map(|id| schema.field(id).field_type);
        let changed = |what: String| {
            Err(format!(
                "the collection `{}` was copied with {what}; a change of `ref` or payload columns needs a new copy (start with a new --pg-slot)",
                self.collection
            ))
        };
        for reference in &self.refs {
            let wanted = reference.target.map(FieldType::Ref);
            if kept_type(&reference.column).is_some_and(|kept| Some(kept) != wanted) {
                return changed(format!("`{}` not a ref to `{}`", reference.column, reference.target_collection));
            }
        }
        for field in schema.fields() {
            if let Some(target) = field.field_type.ref_target() {
                let configured = self.ref_of(&field.name).and_then(|reference| reference.target);
                if configured != Some(target) {
                    return changed(format!("`{}` a ref the configuration does not declare", field.name));
                }
            }
        }
        match &self.payload {
            Some(payload) if kept_type(payload).is_some() => changed(format!("`{payload}` a field, not the payload")),
            _ => Ok(()),
        }
    }

    pub fn schema(&self) -> Result<Schema, String> {
        let mut schema = Schema::new();
        for field in &self.fields {
            schema = schema
                .try_with_field(&field.name, field.field_type)
                .map_err(|error| format!("collection `{}`, column `{}`: {error}", self.collection, field.name))?;
        }
        Ok(schema)
    }

    /// The map of the collection as it exists (a restart): its fields are those
    /// of the table as of the stored position, which the catalog may be past;
    /// the stream brings them up to date. Each keeps its column's type where
    /// the catalog has the column with values of the field's type.
    pub fn adopt(self, schema: &Schema) -> TableMap {
        let fields = schema
            .fields()
            .iter()
            .map(|field| {
                let column_type = self
                    .fields
                    .iter()
                    .find(|column| column.name == field.name && column.field_type == field.field_type)
                    .and_then(|column| column.column_type);
                MappedField { name: field.name.clone(), field_type: field.field_type, column_type }
            })
            .collect();
        TableMap { fields, ..self }
    }

    /// What the table's columns (a new layout's, in order) change in the
    /// fields: a followed column that is no field is added, a field whose
    /// column is gone (or no longer configured) removed. A column whose values changed their form
    /// (`int8` to `text`, `date` to `timestamp`) is refused, naming both types:
    /// PostgreSQL rewrote its rows without streaming them.
    pub fn field_changes(
        &self,
        table: &TableName,
        columns: &[(String, Option<ColumnType>)],
    ) -> Result<FieldChanges, String> {
        let mut changes = FieldChanges::default();
        for (name, column_type) in columns {
            let Some(column_type) = *column_type else { continue };
            match self.fields.iter().find(|field| field.name == *name) {
                Some(field) if !keeps_values(field, column_type) => {
                    let old = field.column_type.map_or_else(
                        || format!("a type held as `{}`", field.field_type.name()),
                        |old| format!("`{}`", postgres_types(old)),
                    );
                    return Err(format!(
                        "the column `{table}.{name}` changed type in PostgreSQL from {old} to `{}`: a field keeps its type, and PostgreSQL rewrote the rows without streaming them; copy the table anew (docs/POSTGRES.md, \"Failures while serving\")",
                        postgres_types(column_type)
                    ));
                }
                Some(field) if field.column_type != Some(column_type) => {
                    changes.retyped.push((name.clone(), column_type));
                }
                Some(_) => {}
                None if self.wants(name) => changes.added.push((name.clone(), column_type)),
                None => {}
            }
        }
        let is_followed = |field: &&MappedField| {
            self.wants(&field.name) && columns.iter().any(|(name, kind)| *name == field.name && kind.is_some())
        };
        changes.removed =
            self.fields.iter().filter(|field| !is_followed(field)).map(|field| field.name.clone()).collect();
        check_field_count(table, self.fields.len() - changes.removed.len() + changes.added.len())?;
        refuse_a_possible_rename(table, &changes)?;
        Ok(changes)
    }

    /// Records `changes` once the collection has them.
    pub fn apply(&mut self, changes: &FieldChanges) {
        self.fields.retain(|field| !changes.removed.contains(&field.name));
        for (name, column_type) in &changes.retyped {
            if let Some(field) = self.fields.iter_mut().find(|field| field.name == *name) {
                field.column_type = Some(*column_type);
            }
        }
        let added: Vec<MappedField> =
            changes.added.iter().map(|(name, column_type)| self.field_of(name, *column_type)).collect();
        self.fields.extend(added);
    }

    /// Whether a column is a field: a key or `ref` column, or one configured
    /// (every one by default), never the payload column.
    fn wants(&self, name: &str) -> bool {
        if self.payload.as_deref() == Some(name) {
            return false;
        }
        self.key_columns.iter().any(|key| key == name)
            || self.ref_of(name).is_some()
            || self.wanted.as_ref().is_none_or(|columns| columns.iter().any(|column| column == name))
    }

    fn is_field(&self, name: &str) -> bool {
        self.fields.iter().any(|field| field.name == name)
    }

    /// An upsert of a copied row (values in the order of the table's columns).
    pub fn upsert_copied(&self, table: &Table, row: &[Value], batch: &mut Batch) -> Result<(), String> {
        let key: Vec<&Value> = table
            .key_columns
            .iter()
            .map(|key| table.columns.iter().position(|column| &column.name == key).map(|index| &row[index]))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("collection `{}`: a key column is missing from the copy", self.collection))?;
        let id = item_id(&self.collection, &key)?;
        let cells = table.columns.iter().zip(row).map(|(column, value)| (column.name.as_str(), Some(value)));
        self.upsert(&id, cells, batch)
    }

    /// An upsert of a streamed row; an unchanged TOASTed value is not set, so
    /// the item keeps the value it holds.
    pub fn upsert_streamed(&self, layout: &Layout, row: &[Field], batch: &mut Batch) -> Result<(), String> {
        let key = layout.key_of(row).map_err(|error| format!("collection `{}`: {error}", self.collection))?;
        let id = item_id(&self.collection, &key.iter().collect::<Vec<_>>())?;
        let cells = layout.columns.iter().zip(row).map(|((name, _), field)| {
            let value = match field {
                Field::Value(value) => Some(value),
                Field::UnchangedToast => None,
            };
            (name.as_str(), value)
        });
        self.upsert(&id, cells, batch)
    }

    /// A remove by primary key values.
    pub fn remove(&self, key: &[Value], batch: &mut Batch) -> Result<(), String> {
        let id = item_id(&self.collection, &key.iter().collect::<Vec<_>>())?;
        batch.remove(&id);
        Ok(())
    }

    fn upsert<'a>(
        &self,
        id: &str,
        cells: impl Iterator<Item = (&'a str, Option<&'a Value>)>,
        batch: &mut Batch,
    ) -> Result<(), String> {
        let mut upsert = batch.upsert(id);
        for (name, value) in cells {
            // `None`: an unchanged TOASTed value, which the item keeps (its payload too).
            let Some(value) = value else { continue };
            if self.payload.as_deref() == Some(name) {
                upsert = upsert.payload(&self.payload_bytes(name, value)?);
                continue;
            }
            // A column not followed, or one dropped in PostgreSQL since this row.
            if !self.is_field(name) {
                continue;
            }
            if let Some(reference) = self.ref_of(name) {
                let id = ref_id(&self.collection, name, reference, value)?;
                upsert = upsert.set(name, id.as_deref().map_or(OrdoValue::Null, OrdoValue::Str));
                continue;
            }
            let value = ordo_value(value);
            if let OrdoValue::Str(text) = value {
                if text.len() > MAX_STRING_FIELD_BYTES {
                    return Err(format!(
                        "collection `{}`, column `{name}`: a value of {} bytes; a string field holds at most {MAX_STRING_FIELD_BYTES}",
                        self.collection,
                        text.len()
                    ));
                }
            }
            upsert = upsert.set(name, value);
        }
        Ok(())
    }
}

impl TableMap {
    /// The payload column's value as the item's payload, which Ordo's API
    /// sends as JSON: a json or jsonb document as PostgreSQL prints it (checked
    /// as a payload written through the API is: one meaning, bounded depth), a
    /// text as a JSON string; NULL is no payload (`"payload": null`).
    fn payload_bytes<'a>(&self, name: &str, value: &'a Value) -> Result<Cow<'a, [u8]>, String> {
        let refuse = |why: String| Err(format!("collection `{}`, payload column `{name}`: {why}", self.collection));
        let bytes: Cow<'a, [u8]> = match value {
            Value::Null => Cow::Borrowed(&[]),
            Value::Json(document) => match strict_json::check(document.as_bytes(), MAX_PAYLOAD_DEPTH, AsWritten) {
                Ok(()) => Cow::Borrowed(document.as_bytes()),
                Err(Refusal::TooDeep) => return refuse(format!("a document nested over {MAX_PAYLOAD_DEPTH} deep")),
                Err(refusal) => return refuse(refusal.to_api_error("a document").message),
            },
            Value::Text(text) => Cow::Owned(serde_json::Value::from(text.as_str()).to_string().into_bytes()),
            _ => return refuse("its type changed in PostgreSQL to one that is not text, json or jsonb".to_owned()),
        };
        if bytes.len() > MAX_PAYLOAD_BYTES {
            return refuse(format!("a value of {} bytes; a payload holds at most {MAX_PAYLOAD_BYTES}", bytes.len()));
        }
        Ok(bytes)
    }
}

/// A `ref` column's value as the id of its target's item (`None`: null), the
/// same text [`item_id`] makes of the target's one-column key.
fn ref_id(collection: &str, column: &str, reference: &MappedRef, value: &Value) -> Result<Option<String>, String> {
    if *value == Value::Null {
        return Ok(None);
    }
    item_id(&reference.target_collection, &[value]).map(Some).map_err(|_| {
        format!(
            "collection `{collection}`, ref column `{column}`: a value of {} bytes as an id of `{}`; ids are 1..={MAX_ID_BYTES} bytes",
            key_text(value).len(),
            reference.target_collection
        )
    })
}

/// A PostgreSQL value as a field value (timestamps in µs, dates in days since 1970-01-01).
pub fn ordo_value(value: &Value) -> OrdoValue<'_> {
    match value {
        Value::Null => OrdoValue::Null,
        Value::Bool(flag) => OrdoValue::Bool(*flag),
        Value::Int(number) | Value::TimestampMicros(number) => OrdoValue::I64(*number),
        Value::DateDays(days) => OrdoValue::I64(i64::from(*days)),
        Value::Float(number) => OrdoValue::F64(*number),
        Value::Text(text) | Value::Json(text) => OrdoValue::Str(text),
    }
}

/// The item id of a primary key's values (see [`KEY_SEPARATOR`]).
pub fn item_id(collection: &str, key: &[&Value]) -> Result<String, String> {
    let mut id = String::new();
    for (index, value) in key.iter().enumerate() {
        let part = key_text(value);
        if key.len() == 1 {
            id = part;
            break;
        }
        if index > 0 {
            id.push(KEY_SEPARATOR);
        }
        for character in part.chars() {
            if character == '\\' || character == KEY_SEPARATOR {
                id.push('\\');
            }
            id.push(character);
        }
    }
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(format!(
            "collection `{collection}`: a primary key of {} bytes as an id; ids are 1..={MAX_ID_BYTES} bytes",
            id.len()
        ));
    }
    Ok(id)
}

fn key_text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::Bool(flag) => flag.to_string(),
        Value::Int(number) | Value::TimestampMicros(number) => number.to_string(),
        Value::DateDays(days) => days.to_string(),
        Value::Float(number) => number.to_string(),
        Value::Text(text) | Value::Json(text) => text.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(value: &str) -> Value {
        Value::Text(value.to_owned())
    }

    #[test]
    fn a_one_column_key_is_the_id_as_it_is() {
        assert_eq!(item_id("c", &[&text("a/b\\c")]).unwrap(), "a/b\\c");
        assert_eq!(item_id("c", &[&Value::Int(-7)]).unwrap(), "-7");
    }

    #[test]
    fn composite_keys_never_collide() {
        // Without the escaping, ("a/b", "c") and ("a", "b/c") would both be "a/b/c".
        let first = item_id("c", &[&text("a/b"), &text("c")]).unwrap();
        let second = item_id("c", &[&text("a"), &text("b/c")]).unwrap();
        assert_eq!(first, "a\\/b/c");
        assert_eq!(second, "a/b\\/c");
        let third = item_id("c", &[&text("a\\"), &text("b")]).unwrap();
        let fourth = item_id("c", &[&text("a"), &text("\\b")]).unwrap();
        assert_ne!(third, fourth);
        assert_eq!(item_id("c", &[&Value::Int(1), &Value::Int(2)]).unwrap(), "1/2");
    }

    fn items_map(wanted: Option<Vec<String>>) -> TableMap {
        let fields =
            vec![MappedField::of_column("id", ColumnType::Text), MappedField::of_column("score", ColumnType::Int)];
        TableMap {
            collection: "items".into(),
            fields,
            wanted,
            key_columns: vec!["id".into()],
            refs: Vec::new(),
            payload: None,
        }
    }

    fn columns(list: &[(&str, ColumnType)]) -> Vec<(String, Option<ColumnType>)> {
        list.iter().map(|(name, column_type)| (name.to_string(), Some(*column_type))).collect()
    }

    #[test]
    fn a_column_added_is_a_field_to_add_and_a_column_dropped_one_to_remove() {
        let table = TableName::parse("items");
        let mut map = items_map(None);
        let added = columns(&[("id", ColumnType::Text), ("score", ColumnType::Int), ("rank", ColumnType::Date)]);
        let changes = map.field_changes(&table, &added).unwrap();
        assert_eq!(changes.added, [("rank".to_owned(), ColumnType::Date)]);
        assert!(changes.removed.is_empty());
        map.apply(&changes);
        assert!(map.field_changes(&table, &added).unwrap().is_empty(), "the same layout again changes nothing");
        let dropped = columns(&[("id", ColumnType::Text), ("rank", ColumnType::Date)]);
        let changes = map.field_changes(&table, &dropped).unwrap();
        assert_eq!(changes.removed, ["score"]);
        assert!(changes.added.is_empty());
        map.apply(&changes);
        let names: Vec<&str> = map.fields.iter().map(|field| field.name.as_str()).collect();
        assert_eq!(names, ["id", "rank"]);
    }

    #[test]
    fn a_column_renamed_is_refused_naming_both_names() {
        let table = TableName::parse("items");
        let renamed = columns(&[("id", ColumnType::Text), ("points", ColumnType::Int)]);
        let refused = items_map(None).field_changes(&table, &renamed).unwrap_err();
        assert!(
            refused.contains("`public.items` changed between two of its changes: `score` gone, `points` new"),
            "{refused}"
        );
    }

    #[test]
    fn only_configured_columns_become_fields() {
        let table = TableName::parse("items");
        let map = items_map(Some(vec!["score".into()]));
        let layout = columns(&[("id", ColumnType::Text), ("score", ColumnType::Int), ("extra", ColumnType::Bool)]);
        assert!(map.field_changes(&table, &layout).unwrap().is_empty());
    }

    #[test]
    fn a_type_change_is_followed_only_when_the_values_keep_their_form() {
        let table = TableName::parse("items");
        let mut map = items_map(None);
        let widened = columns(&[("id", ColumnType::Text), ("score", ColumnType::Numeric)]);
        let changes = map.field_changes(&table, &widened).unwrap();
        assert_eq!(changes.retyped, [("score".to_owned(), ColumnType::Numeric)]);
        assert!(changes.added.is_empty() && changes.removed.is_empty());
        map.apply(&changes);
        let to_text = columns(&[("id", ColumnType::Text), ("score", ColumnType::Text)]);
        let refused = map.field_changes(&table, &to_text).unwrap_err();
        assert!(
            refused.contains("`public.items.score` changed type in PostgreSQL from `numeric` to `text"),
            "{refused}"
        );
        // Both held as i64, but days are not microseconds.
        let mut dated = items_map(None);
        dated.fields[1] = MappedField::of_column("score", ColumnType::Date);
        let to_timestamp = columns(&[("id", ColumnType::Text), ("score", ColumnType::Timestamp)]);
        assert!(dated.field_changes(&table, &to_timestamp).is_err());
    }

    #[test]
    fn an_id_past_the_limit_is_refused() {
        let long = "x".repeat(MAX_ID_BYTES + 1);
        assert!(item_id("c", &[&text(&long)]).is_err());
        assert!(item_id("c", &[&text(&long[1..])]).is_ok());
    }
}
