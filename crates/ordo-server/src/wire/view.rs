//! Views on the wire: filters, sorts, projections and window ranges, checked against a schema.

use serde::Deserialize;
use serde_json::Value as Json;

use ordo_core::{CompareOp, FieldId, Filter, Schema, SortKey, ViewDef};

use super::*;
use crate::error::{ApiError, ErrorCode};
use crate::limits;

/// `POST /v1/collections/{name}/query`: the collection is in the path.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    #[serde(default)]
    pub filter: Json,
    #[serde(default, deserialize_with = "null_as_default")]
    pub sort: Vec<SortRequest>,
    #[serde(default)]
    pub offset: Option<usize>,
    #[serde(default)]
    pub around: Option<AroundRequest>,
    #[serde(default)]
    pub after: Option<String>,
    #[serde(default)]
    pub before: Option<String>,
    #[serde(default)]
    pub tail: Option<bool>,
    pub limit: usize,
    #[serde(default)]
    pub fields: Option<Vec<String>>,
    #[serde(default = "yes")]
    pub payload: bool,
    /// Answer only once the store has applied this batch (read-your-writes).
    #[serde(default)]
    pub min_seq: Option<u64>,
}

impl QueryRequest {
    pub fn position_keys(&self) -> PositionKeys {
        PositionKeys {
            offset: self.offset,
            around: self.around.clone(),
            after: self.after.clone(),
            before: self.before.clone(),
            tail: self.tail,
        }
    }
}

pub(crate) fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SortRequest {
    pub field: String,
    #[serde(default)]
    pub dir: SortDirection,
    #[serde(default)]
    pub case_insensitive: bool,
    /// A BCP 47 locale (`"fr"`, `"sv"`, `"de-u-co-phonebk"`; `"root"` or `"und"` for
    /// the root collation): order this string key as readers of that language do.
    #[serde(default)]
    pub collation: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SortDirection {
    #[default]
    Asc,
    Desc,
}

/// Which parts of each item a window sends.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Projection {
    /// Fields in the order the client listed them (all fields, in schema order, by default).
    pub fields: Vec<FieldId>,
    pub payload: bool,
    /// Target fields read through references (`room.name`), in the order listed;
    /// sent after the own fields, under these names. Their engine field ids
    /// exist only once a window reads them, so they go by name (see `refs`).
    pub through: Vec<String>,
    /// The client listed the fields (`fields`): the list is kept as given when the
    /// schema changes, even when it names every field. Otherwise the projection is
    /// every field, and takes an added one.
    pub is_listed: bool,
}

impl Projection {
    pub fn all(schema: &Schema) -> Projection {
        Projection {
            fields: (0..schema.len()).map(|index| field_id_at(schema, index)).collect(),
            payload: true,
            through: Vec::new(),
            is_listed: false,
        }
    }
}

fn field_id_at(schema: &Schema, index: usize) -> FieldId {
    schema.field_id(&schema.fields()[index].name).expect("a schema's own field")
}

/// A checked window request: everything the writer thread needs.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowSpec {
    pub def: ViewDef,
    /// The first row. For a tail window, where the tail was when last resolved
    /// (it moves with the view's end); for a `seek`, 0 until the writer finds it.
    pub offset: usize,
    pub limit: usize,
    /// The window follows the view's end (`tail`).
    pub is_tail: bool,
    /// A position relative to an item, still to be found (the writer thread
    /// resolves it to `offset` and `limit`, and clears it).
    pub seek: Option<Seek>,
    pub projection: Projection,
    /// For a view of a collection read by relationship: the relationship the
    /// writer thread checks when the view opens and watches while it lives
    /// (`related`). Not part of a window's identity (`share_key`): callers who
    /// hold the same relationship share the window as any equal views do.
    pub relation: Option<std::sync::Arc<crate::related::RelationCheck>>,
    /// The subscription asked for the window digest on every frame, whatever the
    /// window's size (`"digest": true`). Not part of the window's identity: one
    /// shared window serves subscriptions that asked and others.
    pub digest: bool,
}

impl WindowSpec {
    /// The engine anchor this spec asks for.
    pub fn anchor(&self) -> ordo_core::WindowAnchor<'_> {
        match (&self.seek, self.is_tail) {
            (Some(seek), _) => seek.anchor.as_anchor(),
            (None, true) => ordo_core::WindowAnchor::Tail,
            (None, false) => ordo_core::WindowAnchor::Offset(self.offset),
        }
    }

    /// Records where the engine placed the window.
    pub fn resolve(&mut self, range: ordo_core::WindowRange) {
        (self.offset, self.limit, self.is_tail, self.seek) = (range.offset, range.limit, range.is_tail, None);
    }

    /// Sets the position a request asked for (its `offset` stays until resolved).
    pub fn set_position(&mut self, position: Position) {
        self.seek = None;
        self.is_tail = false;
        match position {
            Position::Offset(offset) => self.offset = offset,
            Position::Tail => self.is_tail = true,
            Position::Seek(seek) => self.seek = Some(seek),
        }
    }
}

pub fn check_range(offset: usize, limit: usize) -> Result<(), ApiError> {
    if limit > limits::MAX_WINDOW_LIMIT {
        return Err(ApiError::limit(format!(
            "the window limit is {limit}; at most {} is allowed",
            limits::MAX_WINDOW_LIMIT
        )));
    }
    if offset > limits::MAX_WINDOW_OFFSET {
        return Err(ApiError::limit(format!(
            "the window offset is {offset}; at most {} is allowed",
            limits::MAX_WINDOW_OFFSET
        )));
    }
    Ok(())
}

pub fn window_spec(
    schema: &Schema,
    filter: &Json,
    sort: &[SortRequest],
    position: PositionKeys,
    limit: usize,
    fields: Option<&[String]>,
    payload: bool,
) -> Result<WindowSpec, ApiError> {
    let position = position.check(limit)?;
    check_range(0, limit)?;
    let def = view_def(schema, filter, sort)?;
    let projection = match fields {
        None => Projection { payload, ..Projection::all(schema) },
        Some(names) => {
            if names.len() > ordo_core::limits::MAX_FIELDS_PER_SCHEMA {
                return Err(ApiError::limit("the projection lists more fields than a schema can have"));
            }
            let mut ids = Vec::with_capacity(names.len());
            let mut through = Vec::new();
            for name in names {
                // A field read through a reference: `schema` has it when `refs::read_schema` checked it.
                if schema.field_id(name).is_none() && schema.view_field_id(name).is_some() {
                    if through.contains(name) {
                        return Err(ApiError::new(
                            ErrorCode::InvalidView,
                            format!("the projection names `{name}` twice"),
                        ));
                    }
                    through.push(name.clone());
                    continue;
                }
                let field_id = schema.field_id(name).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::InvalidView,
                        format!("the projection names `{name}`, which the schema does not have"),
                    )
                })?;
                if ids.contains(&field_id) {
                    return Err(ApiError::new(ErrorCode::InvalidView, format!("the projection names `{name}` twice")));
                }
                ids.push(field_id);
            }
            Projection { fields: ids, payload, through, is_listed: true }
        }
    };
    // The engine keeps the projected target fields current, and sends a `Set` when one changes.
    let def = def.showing(projection.through.clone());
    let mut spec =
        WindowSpec { def, offset: 0, limit, is_tail: false, seek: None, projection, relation: None, digest: false };
    spec.set_position(position);
    Ok(spec)
}

pub fn view_def(schema: &Schema, filter: &Json, sort: &[SortRequest]) -> Result<ViewDef, ApiError> {
    let mut n_nodes = 0;
    let filter = filter_from_json(schema, filter, Operands::LiteralsOrFields, 1, &mut n_nodes)?;
    if sort.len() > ordo_core::limits::MAX_SORT_KEYS {
        return Err(ApiError::limit(format!(
            "the sort has {} keys; at most {} are allowed",
            sort.len(),
            ordo_core::limits::MAX_SORT_KEYS
        )));
    }
    let n_collated_keys = sort.iter().filter(|key| key.collation.is_some()).count();
    if n_collated_keys > ordo_core::limits::MAX_COLLATED_SORT_KEYS {
        return Err(ApiError::limit(format!(
            "the sort has {n_collated_keys} keys with a collation; at most {} are allowed",
            ordo_core::limits::MAX_COLLATED_SORT_KEYS
        )));
    }
    let sort = sort.iter().map(sort_key).collect::<Result<_, _>>()?;
    let def = ViewDef::new(filter, sort);
    // Compiling here reports every view error on the network thread, with the
    // engine's own checks; the writer thread then cannot refuse the view.
    ordo_core::CompiledFilter::compile(&def.filter, schema)?;
    ordo_core::CompiledSort::compile(&def.sort, schema)?;
    Ok(def)
}

/// A rule's filter (claims already bound) as an engine filter over `schema`,
/// under the same limits and checks as a client's.
pub fn filter_from_rule(schema: &Schema, filter: &Json) -> Result<Filter, ApiError> {
    let mut n_nodes = 0;
    let filter = filter_from_json(schema, filter, Operands::LiteralsOnly, 1, &mut n_nodes)?;
    ordo_core::CompiledFilter::compile(&filter, schema)?;
    Ok(filter)
}

/// `restrict` for a whole window request: the rule also goes with an item anchor,
/// so that an item outside it reads as missing (see `Seek::rule`).
pub fn restrict_spec(spec: &mut WindowSpec, predicate: Option<&Filter>, schema: &Schema) -> Result<(), ApiError> {
    restrict(&mut spec.def, predicate, schema)?;
    if let Some(seek) = &mut spec.seek {
        seek.rule = predicate.cloned();
    }
    Ok(())
}

/// Conjoins an access rule's predicate into a checked view: the client's filter
/// can then only narrow what the rule lets through. The combined filter is
/// compiled again (it is one level deeper than either part).
pub fn restrict(def: &mut ViewDef, predicate: Option<&Filter>, schema: &Schema) -> Result<(), ApiError> {
    let Some(predicate) = predicate else { return Ok(()) };
    let client = std::mem::replace(&mut def.filter, Filter::True);
    def.filter = match client {
        Filter::True => predicate.clone(),
        client => Filter::All(vec![predicate.clone(), client]),
    };
    ordo_core::CompiledFilter::compile(&def.filter, schema).map_err(|_| {
        ApiError::limit("the filter is too deep or too large once this collection's access rule is added to it")
    })?;
    Ok(())
}

fn sort_key(request: &SortRequest) -> Result<SortKey, ApiError> {
    let mut key = match request.dir {
        SortDirection::Asc => SortKey::asc(&request.field),
        SortDirection::Desc => SortKey::desc(&request.field),
    };
    key.case_insensitive = request.case_insensitive;
    if let Some(locale) = &request.collation {
        if locale.len() > ordo_core::limits::MAX_COLLATION_LOCALE_BYTES {
            return Err(ApiError::limit(format!(
                "the collation of sort key `{}` is {} bytes; at most {} are allowed",
                request.field,
                locale.len(),
                ordo_core::limits::MAX_COLLATION_LOCALE_BYTES
            )));
        }
        // Canonical, so that `"FR"` and `"fr"` name one view (and share its index).
        let canonical = ordo_core::canonical_collation_locale(locale).map_err(|_| {
            ApiError::new(
                ErrorCode::InvalidView,
                format!(
                    "the collation of sort key `{}` is `{locale}`, which is not a BCP 47 locale (such as \"fr\", \"sv\", \"de-u-co-phonebk\", or \"root\")",
                    request.field
                ),
            )
        })?;
        key.collation = Some(canonical);
    }
    Ok(key)
}

/// What a comparison's `value` may be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Operands {
    /// A literal, or `{"field": NAME}`: another field of the same item.
    LiteralsOrFields,
    /// A literal only: an access rule's filter. `PUT /v1/rules` refuses a rule
    /// comparing two fields; this refuses one that got past it anyway, so a
    /// rule's predicate is always a test of fields against bound values.
    LiteralsOnly,
}

/// `{"field": NAME}` as a comparison's `value`: the name it holds, or `None` for any
/// other value (a literal). An object of any other shape is refused.
fn field_operand(value: &Json) -> Result<Option<&str>, ApiError> {
    let Json::Object(object) = value else { return Ok(None) };
    match (object.get("field"), object.len()) {
        (Some(Json::String(name)), 1) => Ok(Some(name)),
        _ => Err(ApiError::new(
            ErrorCode::InvalidView,
            "a comparison's `value` is a literal or `{\"field\": NAME}` (another field of the same item)".to_owned(),
        )),
    }
}

fn filter_from_json(
    schema: &Schema,
    json: &Json,
    operands: Operands,
    depth: usize,
    n_nodes: &mut usize,
) -> Result<Filter, ApiError> {
    let invalid = |message: String| ApiError::new(ErrorCode::InvalidView, message);
    if depth > ordo_core::limits::MAX_FILTER_DEPTH {
        return Err(ApiError::limit(format!(
            "the filter is nested more than {} deep",
            ordo_core::limits::MAX_FILTER_DEPTH
        )));
    }
    *n_nodes += 1;
    if *n_nodes > ordo_core::limits::MAX_FILTER_NODES {
        return Err(ApiError::limit(format!("the filter has more than {} nodes", ordo_core::limits::MAX_FILTER_NODES)));
    }
    let object = match json {
        Json::Null => return Ok(Filter::True),
        Json::Object(object) => object,
        other => return Err(invalid(format!("a filter is a JSON object, not {}", describe(other)))),
    };
    let only = |keys: &[&str]| -> Result<(), ApiError> {
        match object.keys().find(|key| !keys.contains(&key.as_str())) {
            Some(key) => Err(invalid(format!("unexpected key `{key}` in this filter (expected {})", keys.join(", ")))),
            None => Ok(()),
        }
    };
    let children = |list: &Json, n_nodes: &mut usize| -> Result<Vec<Filter>, ApiError> {
        let Json::Array(list) = list else {
            return Err(invalid("`all` and `any` take a list of filters".to_owned()));
        };
        list.iter().map(|child| filter_from_json(schema, child, operands, depth + 1, n_nodes)).collect()
    };
    if let Some(list) = object.get("all") {
        only(&["all"])?;
        return Ok(Filter::All(children(list, n_nodes)?));
    }
    if let Some(list) = object.get("any") {
        only(&["any"])?;
        return Ok(Filter::Any(children(list, n_nodes)?));
    }
    if let Some(inner) = object.get("not") {
        only(&["not"])?;
        return Ok(Filter::Not(Box::new(filter_from_json(schema, inner, operands, depth + 1, n_nodes)?)));
    }
    let field = match object.get("field") {
        Some(Json::String(field)) => field.clone(),
        Some(other) => return Err(invalid(format!("`field` is a string, not {}", describe(other)))),
        None => {
            return Err(invalid(
                "a filter is `{\"field\":..,\"op\":..,\"value\":..}`, `in`, `is_null`, `contains`, `prefix`, `all`, `any` or `not`"
                    .to_owned(),
            ))
        }
    };
    // `view_field_id`: a field read through a reference, when `refs::read_schema` added it.
    let field_type = schema.view_field_id(&field).map(|id| schema.field(id).field_type);
    let field_name = field.clone();
    let literal = |json: &Json| {
        typed_owned_value(json, field_type).map_err(|found| {
            invalid(format!(
                "field `{field_name}` is {}; {found} does not fit",
                field_type.map_or("unknown", |t| t.name())
            ))
        })
    };
    let short_string = |json: &Json, what: &str| -> Result<String, ApiError> {
        match json {
            Json::String(text) if text.len() <= limits::MAX_FILTER_STRING_BYTES => Ok(text.clone()),
            Json::String(text) => Err(ApiError::limit(format!(
                "the `{what}` string is {} bytes; at most {} are allowed",
                text.len(),
                limits::MAX_FILTER_STRING_BYTES
            ))),
            other => Err(invalid(format!("`{what}` takes a string, not {}", describe(other)))),
        }
    };
    if let Some(op) = object.get("op") {
        only(&["field", "op", "value"])?;
        let op = match op.as_str() {
            Some("eq") => CompareOp::Eq,
            Some("ne") => CompareOp::Ne,
            Some("lt") => CompareOp::Lt,
            Some("le") => CompareOp::Le,
            Some("gt") => CompareOp::Gt,
            Some("ge") => CompareOp::Ge,
            _ => return Err(invalid(format!("`op` is one of eq, ne, lt, le, gt, ge; got {op}"))),
        };
        let value = object.get("value").ok_or_else(|| invalid("a comparison needs a `value`".to_owned()))?;
        if let Some(other) = field_operand(value)? {
            if operands == Operands::LiteralsOnly {
                return Err(ApiError::new(
                    ErrorCode::InvalidRules,
                    format!("a rule's filter compares fields with values, not two fields (`{field}` with `{other}`)"),
                ));
            }
            // Types are checked when the filter compiles (`ViewError::IncomparableFields`).
            return Ok(Filter::CompareFields { field, op, other: other.to_owned() });
        }
        if let Json::String(text) = value {
            if text.len() > ordo_core::limits::MAX_STRING_FIELD_BYTES {
                return Err(ApiError::limit("a comparison's string is longer than a field can be"));
            }
        }
        return Ok(Filter::Compare { field, op, value: literal(value)? });
    }
    if let Some(values) = object.get("in") {
        only(&["field", "in"])?;
        let Json::Array(values) = values else {
            return Err(invalid("`in` takes a list of values".to_owned()));
        };
        if values.len() > ordo_core::limits::MAX_FILTER_IN_VALUES {
            return Err(ApiError::limit(format!(
                "`in` lists {} values; at most {} are allowed",
                values.len(),
                ordo_core::limits::MAX_FILTER_IN_VALUES
            )));
        }
        let values = values.iter().map(literal).collect::<Result<Vec<_>, _>>()?;
        return Ok(Filter::In { field, values });
    }
    if let Some(is_null) = object.get("is_null") {
        only(&["field", "is_null"])?;
        return match is_null {
            Json::Bool(true) => Ok(Filter::IsNull { field }),
            Json::Bool(false) => Ok(Filter::Not(Box::new(Filter::IsNull { field }))),
            other => Err(invalid(format!("`is_null` takes true or false, not {}", describe(other)))),
        };
    }
    let accent_insensitive = || match object.get("accent_insensitive") {
        None => Ok(false),
        Some(Json::Bool(flag)) => Ok(*flag),
        Some(other) => Err(invalid(format!("`accent_insensitive` takes true or false, not {}", describe(other)))),
    };
    if let Some(needle) = object.get("contains") {
        only(&["field", "contains", "accent_insensitive"])?;
        let needle = short_string(needle, "contains")?;
        return Ok(Filter::Contains { field, needle, accent_insensitive: accent_insensitive()? });
    }
    if let Some(prefix) = object.get("prefix") {
        only(&["field", "prefix", "accent_insensitive"])?;
        let prefix = short_string(prefix, "prefix")?;
        return Ok(Filter::Prefix { field, prefix, accent_insensitive: accent_insensitive()? });
    }
    Err(invalid(format!("a filter on `{field}` needs one of `op`, `in`, `is_null`, `contains`, `prefix`")))
}
