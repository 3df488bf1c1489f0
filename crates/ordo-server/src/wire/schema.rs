//! Schemas on the wire: `PUT /v1/collections/{name}` and the collection JSON.

use serde::Deserialize;
use serde_json::Value as Json;

use ordo_core::{FieldType, OwnedValue, Schema};

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
}

impl SchemaRequest {
    pub fn to_schema(&self) -> Result<Schema, ApiError> {
        let mut schema = Schema::new();
        for field in &self.fields {
            let field_type = parse_field_type(&field.field_type).ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidSchema,
                    format!(
                        "field `{}` has type `{}`; the types are bool, i64, u64, f64 and string",
                        field.name, field.field_type
                    ),
                )
            })?;
            schema = schema.try_with_field(&field.name, field_type)?;
        }
        Ok(schema)
    }
}

/// `POST /v1/collections/{name}/fields`: `{"name":"x","type":"u64","default":0}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddFieldRequest {
    pub name: String,
    #[serde(rename = "type")]
    pub field_type: String,
    /// Absent or null: the field is null in existing items.
    #[serde(default)]
    pub default: Json,
}

impl AddFieldRequest {
    /// The field's type and its default converted to it; the engine checks the
    /// rest (the name, the limits).
    pub fn typed(&self) -> Result<(FieldType, OwnedValue), ApiError> {
        let field_type = parse_field_type(&self.field_type).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidSchema,
                format!(
                    "field `{}` has type `{}`; the types are bool, i64, u64, f64 and string",
                    self.name, self.field_type
                ),
            )
        })?;
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

pub fn schema_json(name: &str, schema: &Schema, n_items: Option<usize>) -> Json {
    let fields: Vec<Json> = schema
        .fields()
        .iter()
        .map(|field| serde_json::json!({"name": field.name, "type": field.field_type.name()}))
        .collect();
    let mut object = serde_json::json!({"name": name, "fields": fields});
    if let Some(n_items) = n_items {
        object["items"] = n_items.into();
    }
    object
}
