//! Schemas on the wire: `PUT /v1/collections/{name}` and the collection JSON.

use serde::Deserialize;
use serde_json::Value as Json;

use ordo_core::{FieldType, Schema};

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
