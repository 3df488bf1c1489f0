//! Compiling a `Filter` into a `CompiledFilter`: field names resolved, literals
//! converted to their field's type, needles folded and `in` sets sorted, once;
//! limits checked on the way down. Control plane only: evaluation, the hot path,
//! is in the parent module.

use crate::error::ViewError;
use crate::limits::{MAX_FILTER_DEPTH, MAX_FILTER_IN_VALUES, MAX_FILTER_NODES};
use crate::schema::{FieldId, FieldType, Schema};
use crate::text_match::FoldedNeedle;
use crate::value::OwnedValue;
use crate::view_def::{CompareOp, Filter};

use super::{normalize_zero, CompiledFilter, InSet, Literal, Node, TableIndex};

/// Compiles `filter` against `schema` (see `CompiledFilter::compile`).
pub(super) fn compile(filter: &Filter, schema: &Schema) -> Result<CompiledFilter, ViewError> {
    let mut compiler = Compiler {
        schema,
        compiled: CompiledFilter {
            nodes: Vec::new(),
            texts: Vec::new(),
            needles: Vec::new(),
            in_sets: Vec::new(),
            fields_read: Vec::new(),
        },
    };
    compiler.compile_node(filter, 0)?;
    let mut compiled = compiler.compiled;
    compiled.fields_read.sort_unstable();
    compiled.fields_read.dedup();
    Ok(compiled)
}

struct Compiler<'schema> {
    schema: &'schema Schema,
    compiled: CompiledFilter,
}

impl Compiler<'_> {
    /// Appends `filter`'s subtree in pre-order. `n_enclosing_combinators` counts the
    /// `all` / `any` / `not` above it. Limits are checked on the way down, so a
    /// hostile filter (very deep or very wide) is refused after bounded work and
    /// bounded recursion.
    fn compile_node(&mut self, filter: &Filter, n_enclosing_combinators: usize) -> Result<(), ViewError> {
        if self.compiled.nodes.len() >= MAX_FILTER_NODES {
            return Err(ViewError::FilterTooLarge { n_nodes_max: MAX_FILTER_NODES });
        }
        let is_combinator = matches!(filter, Filter::All(_) | Filter::Any(_) | Filter::Not(_));
        if is_combinator && n_enclosing_combinators >= MAX_FILTER_DEPTH {
            return Err(ViewError::FilterTooDeep { depth_max: MAX_FILTER_DEPTH });
        }
        match filter {
            Filter::True => self.compiled.nodes.push(Node::Constant(true)),
            Filter::Compare { field, op, value } => {
                let (field_id, field_type) = self.resolve_field(field)?;
                let applies = field_type != FieldType::Bool || matches!(op, CompareOp::Eq | CompareOp::Ne);
                if !applies {
                    return Err(ViewError::NotApplicable {
                        field: field.clone(),
                        operation: compare_op_symbol(*op),
                        field_type: field_type.name(),
                    });
                }
                let literal = match convert_literal(field, field_type, value)? {
                    TypedLiteral::Bool(flag) => Literal::Bool(flag),
                    TypedLiteral::I64(number) => Literal::I64(number),
                    TypedLiteral::U64(number) => Literal::U64(number),
                    TypedLiteral::F64(number) => Literal::F64(number),
                    TypedLiteral::Str(text) => {
                        let index = self.compiled.texts.len() as TableIndex;
                        self.compiled.texts.push(text.to_owned());
                        Literal::Str(index)
                    }
                };
                self.compiled.nodes.push(Node::Compare { field_id, op: *op, literal });
            }
            Filter::CompareFields { field, op, other } => {
                let node = self.compile_compare_fields(field, *op, other)?;
                self.compiled.nodes.push(node);
            }
            Filter::In { field, values } => {
                let (field_id, field_type) = self.resolve_field(field)?;
                if values.len() > MAX_FILTER_IN_VALUES {
                    return Err(ViewError::TooManyInValues { n_values_max: MAX_FILTER_IN_VALUES });
                }
                let set = build_in_set(field, field_type, values)?;
                let index = self.compiled.in_sets.len() as TableIndex;
                self.compiled.in_sets.push(set);
                self.compiled.nodes.push(Node::In { field_id, set: index });
            }
            Filter::IsNull { field } => {
                let (field_id, _) = self.resolve_field(field)?;
                self.compiled.nodes.push(Node::IsNull { field_id });
            }
            Filter::Contains { field, needle, accent_insensitive } => {
                let (field_id, needle) = self.compile_needle(field, needle, *accent_insensitive, "contains")?;
                self.compiled.nodes.push(Node::Contains { field_id, needle });
            }
            Filter::Prefix { field, prefix, accent_insensitive } => {
                let (field_id, needle) = self.compile_needle(field, prefix, *accent_insensitive, "prefix")?;
                self.compiled.nodes.push(Node::Prefix { field_id, needle });
            }
            Filter::All(children) | Filter::Any(children) if children.is_empty() => {
                // The identities of `and` and `or`.
                let result = matches!(filter, Filter::All(_));
                self.compiled.nodes.push(Node::Constant(result));
            }
            Filter::All(children) | Filter::Any(children) => {
                let combinator_index = self.compiled.nodes.len();
                // Placeholder; the end is known once the children are in.
                self.compiled.nodes.push(Node::Constant(false));
                for child in children {
                    self.compile_node(child, n_enclosing_combinators + 1)?;
                }
                let subtree_end = self.compiled.nodes.len() as TableIndex;
                self.compiled.nodes[combinator_index] = if matches!(filter, Filter::All(_)) {
                    Node::All { subtree_end }
                } else {
                    Node::Any { subtree_end }
                };
            }
            Filter::Not(child) => {
                let not_index = self.compiled.nodes.len();
                self.compiled.nodes.push(Node::Constant(false));
                self.compile_node(child, n_enclosing_combinators + 1)?;
                let subtree_end = self.compiled.nodes.len() as TableIndex;
                self.compiled.nodes[not_index] = Node::Not { subtree_end };
            }
        }
        Ok(())
    }

    fn resolve_field(&mut self, name: &str) -> Result<(FieldId, FieldType), ViewError> {
        let field_id =
            self.schema.view_field_id(name).ok_or_else(|| ViewError::UnknownField { field: name.to_owned() })?;
        self.compiled.fields_read.push(field_id);
        // A reference compares as the string it holds.
        Ok((field_id, self.schema.field(field_id).field_type.value_type()))
    }

    /// `field <op> other`: both names resolved (derived fields too), their types
    /// checked comparable. A float and an integer are refused rather than
    /// compared: no conversion between them is exact for every value.
    fn compile_compare_fields(&mut self, field: &str, op: CompareOp, other: &str) -> Result<Node, ViewError> {
        let (field_id, field_type) = self.resolve_field(field)?;
        let (other_field_id, other_type) = self.resolve_field(other)?;
        let is_integer = |field_type| matches!(field_type, FieldType::I64 | FieldType::U64);
        let comparable = field_type == other_type || (is_integer(field_type) && is_integer(other_type));
        if !comparable {
            return Err(ViewError::IncomparableFields {
                field: field.to_owned(),
                field_type: field_type.name(),
                other: other.to_owned(),
                other_type: other_type.name(),
            });
        }
        if field_type == FieldType::Bool && !matches!(op, CompareOp::Eq | CompareOp::Ne) {
            return Err(ViewError::NotApplicable {
                field: field.to_owned(),
                operation: compare_op_symbol(op),
                field_type: field_type.name(),
            });
        }
        Ok(Node::CompareFields { field_id, op, other_field_id })
    }

    /// Checks that `field` is a string field and stores the folded needle.
    fn compile_needle(
        &mut self,
        field: &str,
        needle: &str,
        accent_insensitive: bool,
        operation: &'static str,
    ) -> Result<(FieldId, TableIndex), ViewError> {
        let (field_id, field_type) = self.resolve_field(field)?;
        if field_type != FieldType::String {
            return Err(ViewError::NotApplicable { field: field.to_owned(), operation, field_type: field_type.name() });
        }
        let index = self.compiled.needles.len() as TableIndex;
        self.compiled.needles.push(FoldedNeedle::new(needle, accent_insensitive));
        Ok((field_id, index))
    }
}

fn compare_op_symbol(op: CompareOp) -> &'static str {
    match op {
        CompareOp::Eq => "=",
        CompareOp::Ne => "!=",
        CompareOp::Lt => "<",
        CompareOp::Le => "<=",
        CompareOp::Gt => ">",
        CompareOp::Ge => ">=",
    }
}

/// A literal converted to its field's type, borrowing its text from the filter.
enum TypedLiteral<'filter> {
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(&'filter str),
}

/// Converts a literal to `field_type`. Integers convert when no information is
/// lost, so that `count > 0` works whether the parser produced an i64 or a u64;
/// anything else is a type error rather than a silent, surprising comparison.
fn convert_literal<'filter>(
    field: &str,
    field_type: FieldType,
    literal: &'filter OwnedValue,
) -> Result<TypedLiteral<'filter>, ViewError> {
    let wrong_type = || ViewError::WrongType {
        field: field.to_owned(),
        expected: field_type.name(),
        found: literal.as_value().type_name(),
    };
    match (field_type, literal) {
        // Null and NaN are refused whatever the field's type: neither can ever compare
        // true, so a filter holding one is a mistake the user should hear about.
        (_, OwnedValue::Null) => Err(ViewError::NullLiteral { field: field.to_owned() }),
        (_, OwnedValue::F64(number)) if number.is_nan() => Err(ViewError::NotANumber { field: field.to_owned() }),
        (FieldType::Bool, OwnedValue::Bool(flag)) => Ok(TypedLiteral::Bool(*flag)),
        (FieldType::I64, OwnedValue::I64(number)) => Ok(TypedLiteral::I64(*number)),
        (FieldType::I64, OwnedValue::U64(number)) => {
            i64::try_from(*number).map(TypedLiteral::I64).map_err(|_| wrong_type())
        }
        (FieldType::U64, OwnedValue::U64(number)) => Ok(TypedLiteral::U64(*number)),
        (FieldType::U64, OwnedValue::I64(number)) => {
            u64::try_from(*number).map(TypedLiteral::U64).map_err(|_| wrong_type())
        }
        (FieldType::F64, OwnedValue::F64(number)) => Ok(TypedLiteral::F64(*number)),
        (FieldType::F64, OwnedValue::I64(number)) => {
            exact_f64(i128::from(*number)).map(TypedLiteral::F64).ok_or_else(wrong_type)
        }
        (FieldType::F64, OwnedValue::U64(number)) => {
            exact_f64(i128::from(*number)).map(TypedLiteral::F64).ok_or_else(wrong_type)
        }
        (FieldType::String, OwnedValue::Str(text)) => Ok(TypedLiteral::Str(text)),
        _ => Err(wrong_type()),
    }
}

/// `integer` as an f64 if the conversion is exact. The round trip goes through i128
/// because `i64::MAX as f64` is 2^63, which would saturate back to `i64::MAX` and
/// look exact if converted back to i64.
fn exact_f64(integer: i128) -> Option<f64> {
    let converted = integer as f64;
    (converted as i128 == integer).then_some(converted)
}

fn build_in_set(field: &str, field_type: FieldType, values: &[OwnedValue]) -> Result<InSet, ViewError> {
    let mut set = match field_type {
        FieldType::Bool => InSet::Bool { accepts_false: false, accepts_true: false },
        FieldType::I64 => InSet::I64(Vec::with_capacity(values.len())),
        FieldType::U64 => InSet::U64(Vec::with_capacity(values.len())),
        FieldType::F64 => InSet::F64(Vec::with_capacity(values.len())),
        FieldType::String | FieldType::Ref(_) => InSet::Str(Vec::with_capacity(values.len())),
    };
    for value in values {
        match (&mut set, convert_literal(field, field_type, value)?) {
            (InSet::Bool { accepts_true, .. }, TypedLiteral::Bool(true)) => *accepts_true = true,
            (InSet::Bool { accepts_false, .. }, TypedLiteral::Bool(false)) => *accepts_false = true,
            (InSet::I64(numbers), TypedLiteral::I64(number)) => numbers.push(number),
            (InSet::U64(numbers), TypedLiteral::U64(number)) => numbers.push(number),
            (InSet::F64(numbers), TypedLiteral::F64(number)) => numbers.push(normalize_zero(number)),
            (InSet::Str(texts), TypedLiteral::Str(text)) => texts.push(text.to_owned()),
            _ => unreachable!("convert_literal returns the field's type"),
        }
    }
    match &mut set {
        InSet::Bool { .. } => {}
        InSet::I64(numbers) => {
            numbers.sort_unstable();
            numbers.dedup();
        }
        InSet::U64(numbers) => {
            numbers.sort_unstable();
            numbers.dedup();
        }
        InSet::F64(numbers) => {
            numbers.sort_unstable_by(f64::total_cmp);
            numbers.dedup();
        }
        InSet::Str(texts) => {
            texts.sort_unstable();
            texts.dedup();
        }
    }
    Ok(set)
}
