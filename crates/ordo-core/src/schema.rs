//! Collection schemas: the typed hot fields an item carries besides its id and payload.

use crate::ids::CollectionId;
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
    /// A reference (a one-hop lookup join): the value is the id of an item of the
    /// target collection, given and stored as a string. Views of the referencing
    /// collection read the target's fields through it as `field.target_field`
    /// (see `engine::references`); while the target item is absent every field
    /// read through the reference is null.
    Ref(CollectionId),
}

impl FieldType {
    /// The type values of this field have: a reference holds a string (the target's id).
    pub fn value_type(self) -> FieldType {
        match self {
            FieldType::Ref(_) => FieldType::String,
            other => other,
        }
    }

    /// The target collection of a reference field.
    pub fn ref_target(self) -> Option<CollectionId> {
        match self {
            FieldType::Ref(target) => Some(target),
            _ => None,
        }
    }
}

/// Index of a field in its collection's schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FieldId(pub(crate) u16);

/// Field ids from here on name *derived* fields: a target's field read through a
/// reference (`room.recency`), held by the referencing collection in a column of
/// its own (see `engine::references`). They never shift when a schema field is
/// added or removed, and no batch can write them.
pub(crate) const DERIVED_FIELD_BASE: u16 = 0x8000;

impl FieldId {
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// Whether this names a field read through a reference (not a schema field).
    pub fn is_derived(self) -> bool {
        self.0 >= DERIVED_FIELD_BASE
    }

    pub(crate) fn derived(index: usize) -> FieldId {
        FieldId(DERIVED_FIELD_BASE + index as u16)
    }

    pub(crate) fn derived_index(self) -> usize {
        debug_assert!(self.is_derived());
        (self.0 - DERIVED_FIELD_BASE) as usize
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldDef {
    pub name: String,
    pub field_type: FieldType,
}

/// An ordered list of uniquely named, typed fields.
#[derive(Clone, Debug, Default)]
pub struct Schema {
    fields: Vec<FieldDef>,
    /// Target fields read through references (`room.recency`), added by the engine
    /// when a view first reads one; named by [`FieldId::derived`] ids. Not part of
    /// the schema proper: not listed by [`Schema::fields`], not found by
    /// [`Schema::field_id`] (so batches cannot write them), not compared.
    derived: Vec<FieldDef>,
}

impl PartialEq for Schema {
    fn eq(&self, other: &Schema) -> bool {
        self.fields == other.fields
    }
}

impl Eq for Schema {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaError {
    DuplicateField {
        name: String,
    },
    FieldNameInvalid {
        name: String,
    },
    TooManyFields {
        n_fields_max: usize,
    },
    /// A `ref` field names a collection that does not exist (or its own collection:
    /// a collection cannot reference itself).
    UnknownRefTarget {
        field: String,
    },
    /// A `ref` field would close a cycle of references between collections.
    RefCycle {
        field: String,
    },
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
            SchemaError::RefCycle { field } => {
                write!(f, "ref field `{field}` would make references between collections form a cycle")
            }
            SchemaError::UnknownRefTarget { field } => {
                write!(f, "ref field `{field}` targets no existing collection (nor may it target its own)")
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

    /// Equal fields and equal derived fields: one schema may stand for the other
    /// everywhere, compiled field ids included (`PartialEq` ignores derived fields).
    pub(crate) fn is_identical(&self, other: &Schema) -> bool {
        self.fields == other.fields && self.derived == other.derived
    }

    /// Hashes what [`Schema::is_identical`] compares.
    pub(crate) fn hash_identity(&self, state: &mut impl std::hash::Hasher) {
        use std::hash::Hash;
        self.fields.hash(state);
        self.derived.hash(state);
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
        // Derived fields are dropped too: the engine rebuilds those its views still need.
        Schema { fields, derived: Vec::new() }
    }

    /// The schema without its derived fields (what a server publishes: the
    /// engine's derived fields come and go with its views).
    pub fn without_derived(&self) -> Schema {
        Schema { fields: self.fields.clone(), derived: Vec::new() }
    }

    /// Adds a derived field (see [`Schema::derived`]) and returns its id.
    pub(crate) fn push_derived(&mut self, name: &str, field_type: FieldType) -> FieldId {
        self.derived.push(FieldDef { name: name.to_owned(), field_type });
        FieldId::derived(self.derived.len() - 1)
    }

    /// The schema with one more field a view may read through a reference
    /// (`room.name`, of the target field's value type), for checking a view's
    /// filter and sort away from the engine (a server's network threads) with
    /// [`crate::CompiledFilter::compile`] and [`crate::CompiledSort::compile`].
    /// The engine adds its own derived fields when a view needs them.
    pub fn with_read_through(mut self, name: &str, field_type: FieldType) -> Schema {
        if self.view_field_id(name).is_none() {
            self.push_derived(name, field_type.value_type());
        }
        self
    }

    pub(crate) fn derived_fields(&self) -> &[FieldDef] {
        &self.derived
    }

    /// Finds a field a view may read: a schema field, or a derived field
    /// (`room.recency`) already added for a view. A schema field's own name wins.
    pub fn view_field_id(&self, name: &str) -> Option<FieldId> {
        self.field_id(name).or_else(|| self.derived.iter().position(|field| field.name == name).map(FieldId::derived))
    }

    /// Finds a field by name. Schemas are small (a limit holds them to
    /// `MAX_FIELDS_PER_SCHEMA`), so a linear scan beats hashing here.
    pub fn field_id(&self, name: &str) -> Option<FieldId> {
        self.fields.iter().position(|field| field.name == name).map(|index| FieldId(index as u16))
    }

    pub fn field(&self, field_id: FieldId) -> &FieldDef {
        if field_id.is_derived() {
            return &self.derived[field_id.derived_index()];
        }
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
