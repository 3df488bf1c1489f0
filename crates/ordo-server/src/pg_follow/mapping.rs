//! How a followed table's rows become a collection's items: the schema (a
//! field per followed column, typed from the column), the item id (the primary
//! key), and each value. No I/O: a row in, batch operations out.

use ordo_core::limits::{MAX_ID_BYTES, MAX_STRING_FIELD_BYTES};
use ordo_core::{Batch, FieldType, Schema, Value as OrdoValue};
use ordo_pgsource::stream::Layout;
use ordo_pgsource::{ColumnType, Field, Table, Value};

use super::config::TableMapping;

/// Joins the parts of a composite primary key into an item id. Inside each part
/// `\` is written `\\` and `/` is written `\/`, so two different keys never give
/// the same id. A one-column key is the id as it is, unescaped.
pub const KEY_SEPARATOR: char = '/';

/// A followed table as the server maps it: which of its columns are fields.
#[derive(Clone, Debug)]
pub struct TableMap {
    pub collection: String,
    /// `(column name, field type)` of each column that is a field.
    pub fields: Vec<(String, FieldType)>,
    pub n_key_columns: usize,
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
/// key columns always, then the configured ones (all followed ones by default).
pub fn map_table(mapping: &TableMapping, table: &Table) -> Result<TableMap, String> {
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
    let wanted = |name: &str, is_key: bool| {
        is_key || mapping.columns.as_ref().is_none_or(|columns| columns.iter().any(|c| c == name))
    };
    let mut fields = Vec::new();
    for column in &table.columns {
        if let (Some(column_type), true) = (column.column_type, wanted(&column.name, column.key_position.is_some())) {
            fields.push((column.name.clone(), field_type(column_type)));
        }
    }
    if fields.len() > ordo_core::limits::MAX_FIELDS_PER_SCHEMA {
        return Err(format!(
            "--pg-table {}: {} columns; a collection has at most {} fields (name the columns to follow)",
            mapping.table,
            fields.len(),
            ordo_core::limits::MAX_FIELDS_PER_SCHEMA
        ));
    }
    Ok(TableMap { collection: mapping.collection.clone(), fields, n_key_columns: table.key_columns.len() })
}

impl TableMap {
    pub fn schema(&self) -> Result<Schema, String> {
        let mut schema = Schema::new();
        for (name, field_type) in &self.fields {
            schema = schema
                .try_with_field(name, *field_type)
                .map_err(|error| format!("collection `{}`, column `{name}`: {error}", self.collection))?;
        }
        Ok(schema)
    }

    fn is_field(&self, name: &str) -> bool {
        self.fields.iter().any(|(field, _)| field == name)
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
            // A column added in PostgreSQL after the start is not a field (yet).
            let Some(value) = value.filter(|_| self.is_field(name)) else { continue };
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

    #[test]
    fn an_id_past_the_limit_is_refused() {
        let long = "x".repeat(MAX_ID_BYTES + 1);
        assert!(item_id("c", &[&text(&long)]).is_err());
        assert!(item_id("c", &[&text(&long[1..])]).is_ok());
    }
}
