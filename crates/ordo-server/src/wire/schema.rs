//! Schemas on the wire: `PUT /v1/collections/{name}` and the collection JSON.

use serde::Deserialize;
use serde_json::Value as Json;

use ordo_core::{CollectionId, FieldType, OwnedValue, Schema};

use crate::error::{ApiError, ErrorCode};

/// `PUT /v1/collections/{name}`
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaRequest {
    pub fields: Vec<FieldRequest>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldRequest {
    pub name: String,
    #[serde(rename = "type")]
    pub field_type: String,
    /// `ref` fields only: the name of the target collection.
    #[serde(default)]
    pub target: Option<String>,
}

impl SchemaRequest {
    /// The collections the schema's `ref` fields name, as written.
    pub fn ref_targets(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().filter(|field| field.field_type == "ref").filter_map(|field| field.target.as_deref())
    }

    /// `collection_id` finds a `ref` field's target by name.
    pub fn to_schema(&self, collection_id: impl Fn(&str) -> Option<CollectionId>) -> Result<Schema, ApiError> {
        let mut schema = Schema::new();
        for field in &self.fields {
            let field_type = typed_field(&field.name, &field.field_type, field.target.as_deref(), &collection_id)?;
            schema = schema.try_with_field(&field.name, field_type)?;
        }
        Ok(schema)
    }
}

/// A field's type from its wire form: `"type"`, and for `"ref"` the `"target"` collection.
fn typed_field(
    name: &str,
    type_name: &str,
    target: Option<&str>,
    collection_id: &impl Fn(&str) -> Option<CollectionId>,
) -> Result<FieldType, ApiError> {
    let invalid = |message: String| ApiError::new(ErrorCode::InvalidSchema, message);
    if type_name == "ref" {
        let target = target.ok_or_else(|| {
            invalid(format!("ref field `{name}` needs a `target`: the name of the collection it references"))
        })?;
        let target_id = collection_id(target)
            .ok_or_else(|| invalid(format!("ref field `{name}` targets `{target}`, which is no collection")))?;
        return Ok(FieldType::Ref(target_id));
    }
    if target.is_some() {
        return Err(invalid(format!("field `{name}` has a `target`, which only ref fields take")));
    }
    parse_field_type(type_name).ok_or_else(|| {
        invalid(format!("field `{name}` has type `{type_name}`; the types are bool, i64, u64, f64, string and ref"))
    })
}

/// `POST /v1/collections/{name}/fields`: `{"name":"x","type":"u64","default":0}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddFieldRequest {
    pub name: String,
    #[serde(rename = "type")]
    pub field_type: String,
    /// `ref` fields only: the name of the target collection.
    #[serde(default)]
    pub target: Option<String>,
    /// Absent or null: the field is null in existing items.
    #[serde(default)]
    pub default: Json,
}

impl AddFieldRequest {
    /// The field's type and its default converted to it; the engine checks the
    /// rest (the name, the limits).
    pub fn typed(
        &self,
        collection_id: impl Fn(&str) -> Option<CollectionId>,
    ) -> Result<(FieldType, OwnedValue), ApiError> {
        let field_type = typed_field(&self.name, &self.field_type, self.target.as_deref(), &collection_id)?;
        let default = super::literal::typed_owned_value(&self.default, Some(field_type)).map_err(|found| {
            ApiError::new(
                ErrorCode::InvalidSchema,
                format!("the default of field `{}` must be {} or null, got {found}", self.name, field_type.name()),
            )
        })?;
        Ok((field_type, default))
    }
}

pub fn parse_field_type(name: &str) -> Option<FieldType> {
    Some(match name {
        "bool" => FieldType::Bool,
        "i64" => FieldType::I64,
        "u64" => FieldType::U64,
        "f64" => FieldType::F64,
        "string" => FieldType::String,
        _ => return None,
    })
}

/// `collection_name` names a `ref` field's target.
pub fn schema_json(
    name: &str,
    schema: &Schema,
    n_items: Option<usize>,
    collection_name: impl Fn(CollectionId) -> Option<String>,
) -> Json {
    let fields: Vec<Json> = schema
        .fields()
        .iter()
        .map(|field| match field.field_type {
            FieldType::Ref(target) => {
                serde_json::json!({"name": field.name, "type": "ref", "target": collection_name(target)})
            }
            field_type => serde_json::json!({"name": field.name, "type": field_type.name()}),
        })
        .collect();
    let mut object = serde_json::json!({"name": name, "fields": fields});
    if let Some(n_items) = n_items {
        object["items"] = n_items.into();
    }
    object
}
