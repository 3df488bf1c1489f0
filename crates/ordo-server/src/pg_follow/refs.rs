//! A followed table's `ref` columns and its payload column: how they are
//! written (the fourth part of `--pg-table`, `refs` and `payload` in
//! `[[postgres.table]]`) and checked at start against the tables as the
//! catalog describes them, and the order the collections are created in (a
//! `ref` field's target first: the engine takes a target by its collection id).

use std::collections::HashMap;

use ordo_pgsource::{ColumnType, Connection, Table, TableName};

use super::config::TableMapping;

/// A column whose values are the item ids of another followed table's rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefColumn {
    pub column: String,
    /// The followed table it points at, as named in its own `--pg-table`.
    pub target: TableName,
}

/// The fourth part of a `--pg-table` value: comma-separated `ref.COLUMN=TABLE`
/// (the column holds ids of `TABLE`'s rows) and at most one `payload=COLUMN`.
pub fn parse_extras(spec: &str, text: &str) -> Result<(Vec<RefColumn>, Option<String>), String> {
    let mut refs: Vec<RefColumn> = Vec::new();
    let mut payload: Option<String> = None;
    let shape = || {
        format!("--pg-table `{spec}`: the fourth part takes `ref.COLUMN=TABLE` and `payload=COLUMN`, comma-separated")
    };
    for entry in text.split(',').map(str::trim).filter(|entry| !entry.is_empty()) {
        let (key, value) = entry.split_once('=').ok_or_else(shape)?;
        let value = value.trim();
        if value.is_empty() {
            return Err(shape());
        }
        if key == "payload" {
            if payload.replace(value.to_owned()).is_some() {
                return Err(format!("--pg-table `{spec}`: one payload column at most"));
            }
            continue;
        }
        let column = key.strip_prefix("ref.").filter(|column| !column.is_empty()).ok_or_else(shape)?;
        if value.split('.').any(str::is_empty) {
            return Err(shape());
        }
        if refs.iter().any(|other| other.column == column) {
            return Err(format!("--pg-table `{spec}`: the column `{column}` is declared a ref twice"));
        }
        refs.push(RefColumn { column: column.to_owned(), target: TableName::parse(value) });
    }
    Ok((refs, payload))
}

/// The fourth part of a `--pg-table` value for a `[[postgres.table]]` entry's
/// `refs` (a table of `COLUMN = "TABLE"`) and `payload`; `None` without either.
pub fn toml_extras(entry: &toml::Table, shape: &dyn Fn() -> String) -> Result<Option<String>, String> {
    let mut parts = Vec::new();
    if let Some(refs) = entry.get("refs") {
        for (column, target) in refs.as_table().ok_or_else(shape)? {
            parts.push(format!("ref.{column}={}", target.as_str().ok_or_else(shape)?));
        }
    }
    if let Some(payload) = entry.get("payload") {
        parts.push(format!("payload={}", payload.as_str().ok_or_else(shape)?));
    }
    if parts.iter().any(|part| part.matches('=').count() > 1 || part.contains([',', ':', ';'])) {
        return Err(format!("{}: `refs` and `payload` names hold no `=`, `,`, `:` or `;`", shape()));
    }
    Ok((!parts.is_empty()).then(|| parts.join(",")))
}

/// Checks every table's payload column and `ref` columns against the tables
/// (`tables[i]` describes `mappings[i]`), and returns the order to create the
/// collections in: each `ref` field's target before the collection that holds it.
pub fn check_and_order(mappings: &[TableMapping], tables: &[Table]) -> Result<Vec<usize>, String> {
    let mut targets: Vec<Vec<usize>> = Vec::with_capacity(mappings.len());
    for (mapping, table) in mappings.iter().zip(tables) {
        check_payload(mapping, table)?;
        let mut table_targets = Vec::with_capacity(mapping.refs.len());
        for reference in &mapping.refs {
            table_targets.push(check_ref(mapping, table, reference, tables)?);
        }
        targets.push(table_targets);
    }
    creation_order(mappings, &targets)
}

fn check_payload(mapping: &TableMapping, table: &Table) -> Result<(), String> {
    let Some(name) = &mapping.payload else { return Ok(()) };
    let refuse = |why: &str| Err(format!("--pg-table {}: the payload column `{name}` {why}", mapping.table));
    let Some(column) = table.columns.iter().find(|column| &column.name == name) else {
        return refuse("is not a column of the table");
    };
    if column.key_position.is_some() {
        return refuse("is in the primary key (the key is the item id)");
    }
    if mapping.refs.iter().any(|reference| &reference.column == name)
        || mapping.columns.as_ref().is_some_and(|columns| columns.contains(name))
    {
        return refuse("is also a field: a column is the payload or a field, not both");
    }
    match column.column_type {
        Some(ColumnType::Text | ColumnType::Json) => Ok(()),
        _ => refuse("is not of type text, varchar, char, name, json or jsonb (bytea is not followed)"),
    }
}

/// Checks one `ref` column; returns the index of its target table.
fn check_ref(mapping: &TableMapping, table: &Table, reference: &RefColumn, tables: &[Table]) -> Result<usize, String> {
    let name = &reference.column;
    let refuse = |why: String| Err(format!("--pg-table {}: the ref column `{name}` {why}", mapping.table));
    let Some(column_type) = table.columns.iter().find(|column| &column.name == name).map(|column| column.column_type)
    else {
        return refuse("is not a column of the table".to_owned());
    };
    let Some(target) = tables.iter().position(|other| other.name == reference.target) else {
        return refuse(format!("points at `{}`, which is not a followed table", reference.target));
    };
    if table.name == tables[target].name {
        return refuse("points at its own table: a collection cannot reference itself".to_owned());
    }
    let [key] = tables[target].key_columns.as_slice() else {
        return refuse(format!(
            "points at `{}`, whose primary key has {} columns: a ref holds a one-column key",
            reference.target,
            tables[target].key_columns.len()
        ));
    };
    let key_type = tables[target].columns.iter().find(|column| &column.name == key).and_then(|c| c.column_type);
    match (column_type, key_type) {
        (Some(column_type), Some(key_type)) if same_id_form(column_type, key_type) => Ok(target),
        _ => refuse(format!(
            "cannot hold the ids of `{}`: its type is {}, the key `{key}` is {}",
            reference.target,
            type_words(column_type),
            type_words(key_type)
        )),
    }
}

/// Whether a column's values read as the same id text as the target key's
/// values (`mapping::item_id`): the same kind of value, integers of any width.
fn same_id_form(column: ColumnType, key: ColumnType) -> bool {
    let is_integer = |column_type| matches!(column_type, ColumnType::Int | ColumnType::Numeric);
    column == key || (is_integer(column) && is_integer(key))
}

fn type_words(column_type: Option<ColumnType>) -> String {
    column_type.map_or_else(
        || "a type Ordo does not follow".to_owned(),
        |t| format!("`{}`", super::mapping::postgres_types(t)),
    )
}

/// Kahn's order over "`i` refers to `targets[i]`": targets first. The engine
/// refuses references that form a cycle, so a cycle is refused here, named.
fn creation_order(mappings: &[TableMapping], targets: &[Vec<usize>]) -> Result<Vec<usize>, String> {
    let mut waiting_on: Vec<usize> = targets.iter().map(Vec::len).collect();
    let mut referrers: HashMap<usize, Vec<usize>> = HashMap::new();
    for (index, table_targets) in targets.iter().enumerate() {
        for &target in table_targets {
            referrers.entry(target).or_default().push(index);
        }
    }
    let mut order: Vec<usize> = (0..mappings.len()).filter(|&index| waiting_on[index] == 0).collect();
    let mut next = 0;
    while next < order.len() {
        for &referrer in referrers.get(&order[next]).into_iter().flatten() {
            waiting_on[referrer] -= 1;
            if waiting_on[referrer] == 0 {
                order.push(referrer);
            }
        }
        next += 1;
    }
    if order.len() < mappings.len() {
        let in_cycle: Vec<String> = (0..mappings.len())
            .filter(|index| !order.contains(index))
            .map(|index| mappings[index].table.to_string())
            .collect();
        return Err(format!(
            "--pg-table: the ref columns of {} form a cycle; Ordo's references may not (declare one of them as a plain column)",
            in_cycle.join(", ")
        ));
    }
    Ok(order)
}

/// Warns (stderr and log) about each `ref` column that no foreign key of
/// PostgreSQL backs: the reference still works (a missing target reads null),
/// but nothing in PostgreSQL keeps its ids pointing at rows.
pub async fn warn_without_foreign_key(
    connection: &mut Connection,
    mappings: &[TableMapping],
    tables: &[Table],
) -> Result<(), String> {
    for (mapping, table) in mappings.iter().zip(tables) {
        for reference in &mapping.refs {
            let Some(target) = tables.iter().find(|other| other.name == reference.target) else { continue };
            let backed = ordo_pgsource::catalog::has_foreign_key(connection, table.oid, &reference.column, target.oid)
                .await
                .map_err(|error| format!("PostgreSQL: {error}"))?;
            if !backed {
                let (column, target) = (&reference.column, &reference.target);
                eprintln!(
                    "ordo: WARNING: the ref column `{}.{column}` has no foreign key to `{target}` in PostgreSQL: ids that match no row read as null",
                    table.name
                );
                tracing::warn!(table = %table.name, column = column.as_str(), target = %target, "a ref column without a foreign key");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extras_name_refs_and_one_payload() {
        let (refs, payload) = parse_extras("s", "ref.room=chat.rooms, payload=body,ref.owner=users").unwrap();
        assert_eq!(refs[0], RefColumn { column: "room".into(), target: TableName::parse("chat.rooms") });
        assert_eq!(refs[1].target, TableName::parse("users"));
        assert_eq!(payload.as_deref(), Some("body"));
        for bad in ["room=rooms", "ref.=rooms", "ref.room=", "payload=a,payload=b", "ref.a=x,ref.a=y", "ref.a=.x", "x"]
        {
            assert!(parse_extras("s", bad).is_err(), "{bad}");
        }
    }

    fn mapping(table: &str, refs: &[(&str, &str)]) -> TableMapping {
        let refs = refs
            .iter()
            .map(|(column, target)| RefColumn { column: column.to_string(), target: TableName::parse(target) })
            .collect();
        TableMapping { table: TableName::parse(table), collection: table.into(), columns: None, refs, payload: None }
    }

    #[test]
    fn targets_are_created_first_and_a_cycle_is_refused() {
        let mappings = [mapping("members", &[]), mapping("rooms", &[]), mapping("messages", &[])];
        assert_eq!(creation_order(&mappings, &[vec![1], vec![], vec![1, 0]]).unwrap(), [1, 0, 2]);
        let refused = creation_order(&mappings, &[vec![2], vec![], vec![0]]).unwrap_err();
        assert!(refused.contains("public.members, public.messages form a cycle"), "{refused}");
    }
}
