//! What a write rule allows an op to do besides its filter: which fields it may
//! set, which atomic operations it may apply, whether it may set the payload,
//! create items, remove them (`WriteLimits`); and what one identity may write
//! in one collection (`WriteGrant`). A key left out allows, so `"write": true`
//! and `{"filter": F}` keep their meaning: every field, every atomic, the
//! payload, creation and removal.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use ordo_core::AtomicOp;
use smallvec::SmallVec;

use crate::rules::Grant;

/// A rule's `write` as written: `false` (the default), `true`, or an object of
/// `filter`, `fields`, `atomics`, `payload`, `create`, `remove`. Kept as
/// written, so that `GET /v1/rules` answers what was put, and read by
/// [`parse_write`], which refuses an unknown key by name (a typed parse would
/// either drop it silently or refuse it without saying which rule).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum WriteDoc {
    #[default]
    #[serde(skip)]
    None,
    Flag(bool),
    Object(Map<String, Json>),
}

impl WriteDoc {
    pub fn is_none(&self) -> bool {
        matches!(self, WriteDoc::None | WriteDoc::Flag(false))
    }
}

/// The keys of the object form, as listed in a refusal.
const WRITE_KEYS: &str = "filter, fields, atomics, payload, create, remove";

/// The atomic kinds an op may apply, one bit per [`AtomicOp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AtomicKinds(u8);

impl AtomicKinds {
    const ALL: AtomicKinds = AtomicKinds(0b1111);
    const NAMES: [(&'static str, AtomicOp); 4] = [
        ("increment", AtomicOp::Increment),
        ("decrement", AtomicOp::Decrement),
        ("set_max", AtomicOp::SetMax),
        ("set_min", AtomicOp::SetMin),
    ];

    fn bit(op: AtomicOp) -> u8 {
        match op {
            AtomicOp::Increment => 1,
            AtomicOp::Decrement => 2,
            AtomicOp::SetMax => 4,
            AtomicOp::SetMin => 8,
        }
    }

    fn contains(self, op: AtomicOp) -> bool {
        self.0 & AtomicKinds::bit(op) != 0
    }

    fn parse(list: &Json) -> Result<AtomicKinds, String> {
        let names = list.as_array().ok_or("`atomics` is a list of atomic kinds")?;
        let mut kinds = 0;
        for name in names {
            let name = name.as_str().ok_or("`atomics` is a list of atomic kinds")?;
            let (_, op) = AtomicKinds::NAMES.iter().find(|(known, _)| *known == name).ok_or_else(|| {
                format!("`atomics`: unknown atomic kind `{name}` (increment, decrement, set_max, set_min)")
            })?;
            kinds |= AtomicKinds::bit(*op);
        }
        Ok(AtomicKinds(kinds))
    }
}

/// What a write rule lets an op do, besides keeping its item inside the filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteLimits {
    /// The fields an op may set or apply an atomic to; `None`: every field.
    fields: Option<Vec<String>>,
    atomics: AtomicKinds,
    payload: bool,
    /// May upsert an id that does not exist (as the batch's earlier ops leave it).
    create: bool,
    remove: bool,
}

impl WriteLimits {
    /// `"write": true` and `{"filter": F}`: every field, atomic, the payload, creation and removal.
    pub const EVERYTHING: WriteLimits =
        WriteLimits { fields: None, atomics: AtomicKinds::ALL, payload: true, create: true, remove: true };

    pub fn allows_everything(&self) -> bool {
        *self == WriteLimits::EVERYTHING
    }

    pub fn may_set(&self, field: &str) -> bool {
        self.fields.as_ref().is_none_or(|fields| fields.iter().any(|allowed| allowed == field))
    }

    /// An atomic needs both its kind and its field allowed.
    pub fn may_apply(&self, op: AtomicOp, field: &str) -> bool {
        self.atomics.contains(op) && self.may_set(field)
    }

    pub fn may_set_payload(&self) -> bool {
        self.payload
    }

    pub fn may_create(&self) -> bool {
        self.create
    }

    pub fn may_remove(&self) -> bool {
        self.remove
    }
}

/// A `write` read: `None` when it grants nothing, else its filter as written
/// (`None`: every item) and its limits.
pub type ParsedWrite = Option<(Option<Json>, WriteLimits)>;

/// Reads a rule's `write`; the error names the key at fault.
pub fn parse_write(doc: &WriteDoc) -> Result<ParsedWrite, String> {
    let object = match doc {
        WriteDoc::None | WriteDoc::Flag(false) => return Ok(None),
        WriteDoc::Flag(true) => return Ok(Some((None, WriteLimits::EVERYTHING))),
        WriteDoc::Object(object) => object,
    };
    let mut filter = None;
    let mut limits = WriteLimits::EVERYTHING;
    for (key, value) in object {
        match key.as_str() {
            "filter" => {
                if !value.is_object() {
                    return Err("`filter` is a filter object".to_owned());
                }
                filter = Some(value.clone());
            }
            "fields" => limits.fields = Some(parse_fields(value)?),
            "atomics" => limits.atomics = AtomicKinds::parse(value)?,
            "payload" => limits.payload = parse_flag(key, value)?,
            "create" => limits.create = parse_flag(key, value)?,
            "remove" => limits.remove = parse_flag(key, value)?,
            unknown => return Err(format!("unknown key `{unknown}` ({WRITE_KEYS})")),
        }
    }
    Ok(Some((filter, limits)))
}

fn parse_fields(list: &Json) -> Result<Vec<String>, String> {
    let message = "`fields` is a list of field names";
    let names = list.as_array().ok_or(message)?;
    // No schema has more fields: a longer list names fields no collection has.
    if names.len() > ordo_core::limits::MAX_FIELDS_PER_SCHEMA {
        return Err(format!("`fields` lists at most {} names", ordo_core::limits::MAX_FIELDS_PER_SCHEMA));
    }
    names.iter().map(|name| name.as_str().map(str::to_owned).ok_or_else(|| message.to_owned())).collect()
}

fn parse_flag(key: &str, value: &Json) -> Result<bool, String> {
    value.as_bool().ok_or_else(|| format!("`{key}` is true or false"))
}

/// What one identity may write in one collection: for each set of limits its
/// rules grant, the items they grant it on. Rules with equal limits act as one
/// rule whose filter is any of theirs, as rules without limits always did;
/// rules with different limits each admit an op alone, so that one rule's
/// fields never combine with another rule's items.
///
/// Every write part checks one (an admin's too), so the usual single group is
/// held inline: granting allocates nothing then.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WriteGrant {
    groups: SmallVec<[(WriteLimits, Grant); 1]>,
}

impl WriteGrant {
    /// An admin's: every op on every item.
    pub fn everything() -> WriteGrant {
        let mut groups = SmallVec::new();
        groups.push((WriteLimits::EVERYTHING, Grant::All));
        WriteGrant { groups }
    }

    /// Adds a rule's grant, merged with an earlier one of equal limits.
    pub fn add(&mut self, limits: &WriteLimits, grant: Grant) {
        let Some((_, held)) = self.groups.iter_mut().find(|(held, _)| held == limits) else {
            self.groups.push((limits.clone(), grant));
            return;
        };
        match (held, grant) {
            (Grant::All, _) => {}
            (held, Grant::All) => *held = Grant::All,
            (Grant::Where(filters), Grant::Where(more)) => filters.extend(more),
            // A write grant is every item or filters (read-only forms never
            // compile into one): anything else adds nothing, failing closed.
            _ => {}
        }
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Every op on every item: no guard needed.
    pub fn is_unrestricted(&self) -> bool {
        self.groups.iter().any(|(limits, grant)| limits.allows_everything() && *grant == Grant::All)
    }

    pub fn groups(&self) -> &[(WriteLimits, Grant)] {
        &self.groups
    }
}

/// What a refused op was not allowed, in the order an op is checked (see
/// `WriteGuard`): the words end the refusal's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disallowed {
    Removing,
    Field(String),
    Atomic(AtomicOp, String),
    Payload,
    Creating,
    /// The item, before or after the op, is outside the rule's filter.
    Item,
}

impl Disallowed {
    /// How far an op got through a rule's checks: of several rules that refuse
    /// it, the refusal names what the furthest one lacked.
    pub fn stage(&self) -> u8 {
        match self {
            Disallowed::Removing => 0,
            Disallowed::Field(_) => 1,
            Disallowed::Atomic(..) => 2,
            Disallowed::Payload => 3,
            Disallowed::Creating => 4,
            Disallowed::Item => 5,
        }
    }
}

impl fmt::Display for Disallowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disallowed::Removing => f.write_str("removing items"),
            Disallowed::Field(name) => write!(f, "field `{name}`"),
            Disallowed::Atomic(op, name) => write!(f, "atomic {} on `{name}`", op.name()),
            Disallowed::Payload => f.write_str("the payload"),
            Disallowed::Creating => f.write_str("creating items"),
            Disallowed::Item => f.write_str("this item"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(doc: Json) -> Result<ParsedWrite, String> {
        parse_write(&serde_json::from_value(doc).unwrap())
    }

    #[test]
    fn absent_keys_allow_everything() {
        assert_eq!(parsed(json!(true)), Ok(Some((None, WriteLimits::EVERYTHING))));
        assert_eq!(parsed(json!(false)), Ok(None));
        let filter = json!({"field": "owner", "op": "eq", "value": "$sub"});
        assert_eq!(parsed(json!({"filter": filter})), Ok(Some((Some(filter), WriteLimits::EVERYTHING))));
    }

    #[test]
    fn the_object_form_limits_each_kind_of_change() {
        let (_, limits) = parsed(json!({"fields": ["read_upto", "favourite"], "atomics": ["set_max"],
            "payload": false, "create": false, "remove": false}))
        .unwrap()
        .unwrap();
        assert!(limits.may_set("read_upto") && limits.may_set("favourite"));
        assert!(!limits.may_set("room") && !limits.may_set("owner"));
        assert!(limits.may_apply(AtomicOp::SetMax, "read_upto"));
        assert!(!limits.may_apply(AtomicOp::Increment, "read_upto"), "a kind not listed");
        assert!(!limits.may_apply(AtomicOp::SetMax, "room"), "a field not listed");
        assert!(!limits.may_set_payload() && !limits.may_create() && !limits.may_remove());
        assert!(!limits.allows_everything());
    }

    #[test]
    fn unknown_keys_and_kinds_are_refused_by_name() {
        let error = parsed(json!({"feilds": ["a"]})).unwrap_err();
        assert!(error.contains("`feilds`"), "{error}");
        let error = parsed(json!({"atomics": ["multiply"]})).unwrap_err();
        assert!(error.contains("`multiply`"), "{error}");
        for bad in [json!({"fields": "a"}), json!({"fields": [1]}), json!({"payload": "no"}), json!({"filter": 1})] {
            assert!(parsed(bad.clone()).is_err(), "{bad}");
        }
        let too_many: Vec<String> = (0..=ordo_core::limits::MAX_FIELDS_PER_SCHEMA).map(|i| format!("f{i}")).collect();
        assert!(parsed(json!({ "fields": too_many })).is_err());
    }

    #[test]
    fn rules_with_equal_limits_merge_and_others_stay_apart() {
        let (_, limited) = parsed(json!({"fields": ["a"]})).unwrap().unwrap();
        let where_ = |value: &str| Grant::Where(vec![json!({"field": "owner", "op": "eq", "value": value})]);
        let mut grant = WriteGrant::default();
        grant.add(&WriteLimits::EVERYTHING, where_("a"));
        grant.add(&limited, Grant::All);
        grant.add(&WriteLimits::EVERYTHING, where_("b"));
        assert_eq!(grant.groups().len(), 2);
        let Grant::Where(filters) = &grant.groups()[0].1 else { panic!() };
        assert_eq!(filters.len(), 2);
        assert!(!grant.is_unrestricted(), "a limited rule on every item is not every op");
        grant.add(&WriteLimits::EVERYTHING, Grant::All);
        assert!(grant.is_unrestricted());
    }
}
