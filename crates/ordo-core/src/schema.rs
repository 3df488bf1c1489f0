//! Collection schemas: the typed hot fields an item carries besides its id and payload.

use crate::limits::{MAX_FIELDS_PER_SCHEMA, MAX_FIELD_NAME_BYTES};

/// The type of a hot field. Every field may also be null (absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldType {
    Bool,
    I64,
    U64,
    /// A finite-or-infinite float; NaN is rejected at the batch boundary so that
    /// every field has a total order.
    F64,
    String,
}

/// Index of a field in its collection's schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FieldId(pub(crate) u16);

impl FieldId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDef {
    pub name: String,
    pub field_type: FieldType,
}

/// An ordered list of uniquely named, typed fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schema {
    fields: Vec<FieldDef>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaError {
    DuplicateField { name: String },
    FieldNameInvalid { name: String },
    TooManyFields { n_fields_max: usize },
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchemaError::DuplicateField { name } => write!(f, "field `{name}` is declared twice"),
            SchemaError::FieldNameInvalid { name } => {
                write!(f, "field name `{name}` is invalid: it must be 1..={MAX_FIELD_NAME_BYTES} bytes")
            }
            SchemaError::TooManyFields { n_fields_max } => {
                write!(f, "a schema holds at most {n_fields_max} fields")
            }
        }
    }
}

impl std::error::Error for SchemaError {}

impl Schema {
    pub fn new() -> Schema {
        Schema::default()
    }

    /// Drops the field list's spare capacity (a collection keeps its schema for life,
    /// and each user's collection pays for it).
    pub(crate) fn shrink_to_fit(&mut self) {
        self.fields.shrink_to_fit();
    }

    /// Adds a field; fails on a duplicate or invalid name, or past the field limit.
    pub fn try_with_field(mut self, name: &str, field_type: FieldType) -> Result<Schema, SchemaError> {
        if name.is_empty() || name.len() > MAX_FIELD_NAME_BYTES {
            return Err(SchemaError::FieldNameInvalid { name: name.to_owned() });
        }
        if self.field_id(name).is_some() {
            return Err(SchemaError::DuplicateField { name: name.to_owned() });
        }
        if self.fields.len() >= MAX_FIELDS_PER_SCHEMA {
            return Err(SchemaError::TooManyFields { n_fields_max: MAX_FIELDS_PER_SCHEMA });
        }
        self.fields.push(FieldDef { name: name.to_owned(), field_type });
        Ok(self)
    }

    /// Like [`Schema::try_with_field`], for schemas written in code: panics on a bad field.
    pub fn with_field(self, name: &str, field_type: FieldType) -> Schema {
        match self.try_with_field(name, field_type) {
            Ok(schema) => schema,
            Err(error) => panic!("invalid schema: {error}"),
        }
    }

    /// The schema without `field_id`: the fields after it move down by one
    /// (a schema change; see `Engine::remove_field`).
    pub(crate) fn without_field(&self, field_id: FieldId) -> Schema {
        let mut fields = self.fields.clone();
        fields.remove(field_id.index());
        Schema { fields }
    }

    /// Finds a field by name. Schemas are small (a limit holds them to
    /// `MAX_FIELDS_PER_SCHEMA`), so a linear scan beats hashing here.
    pub fn field_id(&self, name: &str) -> Option<FieldId> {
        self.fields.iter().position(|field| field.name == name).map(|index| FieldId(index as u16))
    }

    pub fn field(&self, field_id: FieldId) -> &FieldDef {
        &self.fields[field_id.index()]
    }

    pub fn fields(&self) -> &[FieldDef] {
        &self.fields
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }
}
