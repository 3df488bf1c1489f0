//! Reading follower entries (`stream_entry`) without serde's buffering: an
//! internally tagged enum (`"op"`) is read into an owned tree of every value
//! before its variant is chosen, and an untagged one tries each variant in
//! turn, building an error for each miss. A `rows` entry of a hundred rows
//! made every node allocate thousands of times to read it, more than it spent
//! applying it (docs/bench-history/2026-12-06-postgres-gathered-transactions.md).
//! So a value and an op are read by visitors of their own, and a change's
//! `op` is looked up first: `rows` and `copy_rows` are read as plain structs,
//! the rare other changes through the derived reader. The JSON is unchanged.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Unexpected, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::stream_entry::{PgChange, WireOp, WireValue};

/// `PgEntry::change`: the `op` first, then the change as that op's fields.
pub fn change<'de, D: Deserializer<'de>>(deserializer: D) -> Result<PgChange, D::Error> {
    let raw = <&RawValue>::deserialize(deserializer)?;
    change_of(raw.get()).map_err(de::Error::custom)
}

fn change_of(text: &str) -> Result<PgChange, serde_json::Error> {
    #[derive(Deserialize)]
    struct Op<'a> {
        #[serde(borrow)]
        op: Cow<'a, str>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rows {
        #[allow(dead_code)]
        op: IgnoredAny,
        collection: String,
        end_lsn: u64,
        ops: Vec<WireOp>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct CopyRows {
        #[allow(dead_code)]
        op: IgnoredAny,
        collection: String,
        ops: Vec<WireOp>,
    }
    let op: Op<'_> = serde_json::from_str(text)?;
    Ok(match op.op.as_ref() {
        "rows" => {
            let Rows { collection, end_lsn, ops, .. } = serde_json::from_str(text)?;
            PgChange::Rows { collection, end_lsn, ops }
        }
        "copy_rows" => {
            let CopyRows { collection, ops, .. } = serde_json::from_str(text)?;
            PgChange::CopyRows { collection, ops }
        }
        _ => serde_json::from_str(text)?,
    })
}

impl<'de> Deserialize<'de> for WireValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<WireValue, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = WireValue;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(r#"null, a bool, an i64, a string, {"u64": n} or {"f64": "text"}"#)
    }

    fn visit_unit<E: de::Error>(self) -> Result<WireValue, E> {
        Ok(WireValue::Null(()))
    }

    fn visit_bool<E: de::Error>(self, flag: bool) -> Result<WireValue, E> {
        Ok(WireValue::Bool(flag))
    }

    fn visit_i64<E: de::Error>(self, number: i64) -> Result<WireValue, E> {
        Ok(WireValue::I64(number))
    }

    fn visit_u64<E: de::Error>(self, number: u64) -> Result<WireValue, E> {
        // Past i64 a number crosses as `{"u64": n}`.
        i64::try_from(number).map(WireValue::I64).map_err(|_| E::invalid_value(Unexpected::Unsigned(number), &self))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<WireValue, E> {
        Ok(WireValue::Str(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<WireValue, E> {
        Ok(WireValue::Str(text))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WireValue, A::Error> {
        #[derive(Deserialize)]
        #[serde(field_identifier, rename_all = "snake_case")]
        enum Key {
            U64,
            F64,
        }
        let value = match map.next_key::<Key>()? {
            Some(Key::U64) => WireValue::U64 { u64: map.next_value()? },
            Some(Key::F64) => WireValue::F64 { f64: map.next_value()? },
            None => return Err(de::Error::invalid_length(0, &self)),
        };
        if map.next_key::<IgnoredAny>()?.is_some() {
            return Err(de::Error::invalid_length(2, &self));
        }
        Ok(value)
    }
}

impl<'de> Deserialize<'de> for WireOp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<WireOp, D::Error> {
        deserializer.deserialize_map(OpVisitor)
    }
}

struct OpVisitor;

impl<'de> Visitor<'de> for OpVisitor {
    type Value = WireOp;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(r#"an op: {"op": "upsert", "id", "fields"[, "payload"]} or {"op": "remove", "id"}"#)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WireOp, A::Error> {
        #[derive(Deserialize, PartialEq)]
        #[serde(field_identifier, rename_all = "snake_case")]
        enum Key {
            Op,
            Id,
            Fields,
            Payload,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "snake_case")]
        enum Name {
            Upsert,
            Remove,
        }
        let (mut name, mut id, mut fields, mut payload) = (None, None, None, None);
        while let Some(key) = map.next_key::<Key>()? {
            let duplicate = match key {
                Key::Op => name.replace(map.next_value::<Name>()?).is_some(),
                Key::Id => id.replace(map.next_value::<String>()?).is_some(),
                Key::Fields => fields.replace(map.next_value::<Vec<(String, WireValue)>>()?).is_some(),
                Key::Payload => payload.replace(map.next_value::<Option<String>>()?).is_some(),
            };
            if duplicate {
                return Err(de::Error::custom("an op names a key twice"));
            }
        }
        let id = id.ok_or_else(|| de::Error::missing_field("id"))?;
        match name.ok_or_else(|| de::Error::missing_field("op"))? {
            Name::Upsert => {
                let fields = fields.ok_or_else(|| de::Error::missing_field("fields"))?;
                Ok(WireOp::Upsert { id, fields, payload: payload.flatten() })
            }
            Name::Remove if fields.is_some() => Err(de::Error::unknown_field("fields", &["op", "id"])),
            Name::Remove if payload.is_some() => Err(de::Error::unknown_field("payload", &["op", "id"])),
            Name::Remove => Ok(WireOp::Remove { id }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_the_untagged_form_wrote_them_and_nothing_else() {
        let read = |text: &str| serde_json::from_str::<WireValue>(text);
        assert_eq!(read("null").unwrap(), WireValue::Null(()));
        assert_eq!(read("true").unwrap(), WireValue::Bool(true));
        assert_eq!(read("-3").unwrap(), WireValue::I64(-3));
        assert_eq!(read(&i64::MAX.to_string()).unwrap(), WireValue::I64(i64::MAX));
        assert_eq!(read(r#""5""#).unwrap(), WireValue::Str("5".into()));
        assert_eq!(read(r#""a\"b""#).unwrap(), WireValue::Str("a\"b".into()));
        assert_eq!(read(r#"{"u64":18446744073709551615}"#).unwrap(), WireValue::U64 { u64: u64::MAX });
        assert_eq!(read(r#"{"f64":"-inf"}"#).unwrap(), WireValue::F64 { f64: "-inf".into() });
        for bad in ["1.5", "9223372036854775808", "[]", "{}", r#"{"u64":1,"f64":"1"}"#, r#"{"x":1}"#, r#"{"u64":"1"}"#]
        {
            assert!(read(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ops_read_in_any_key_order_and_refuse_what_the_derived_reader_refused() {
        let read = |text: &str| serde_json::from_str::<WireOp>(text);
        let upsert = WireOp::Upsert { id: "a".into(), fields: vec![("n".into(), WireValue::I64(1))], payload: None };
        assert_eq!(read(r#"{"op":"upsert","id":"a","fields":[["n",1]]}"#).unwrap(), upsert);
        assert_eq!(read(r#"{"fields":[["n",1]],"id":"a","op":"upsert"}"#).unwrap(), upsert);
        assert_eq!(
            read(r#"{"op":"upsert","id":"a","fields":[],"payload":"p"}"#).unwrap(),
            WireOp::Upsert { id: "a".into(), fields: vec![], payload: Some("p".into()) }
        );
        assert_eq!(read(r#"{"op":"remove","id":"a"}"#).unwrap(), WireOp::Remove { id: "a".into() });
        for bad in [
            r#"{"op":"remove","id":"a","fields":[]}"#,
            r#"{"op":"upsert","id":"a"}"#,
            r#"{"op":"upsert","fields":[]}"#,
            r#"{"id":"a","fields":[]}"#,
            r#"{"op":"change","id":"a"}"#,
            r#"{"op":"remove","id":"a","x":1}"#,
            r#"{"op":"remove","id":"a","id":"b"}"#,
        ] {
            assert!(read(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_change_is_read_by_its_op_whatever_the_keys_order() {
        let rows = r#"{"collection":"c","end_lsn":9,"ops":[{"op":"remove","id":"a"}],"op":"rows"}"#;
        assert_eq!(
            change_of(rows).unwrap(),
            PgChange::Rows { collection: "c".into(), end_lsn: 9, ops: vec![WireOp::Remove { id: "a".into() }] }
        );
        assert_eq!(
            change_of(r#"{"op":"copy_rows","collection":"c","ops":[]}"#).unwrap(),
            PgChange::CopyRows { collection: "c".into(), ops: vec![] }
        );
        assert_eq!(change_of(r#"{"op":"position","end_lsn":7}"#).unwrap(), PgChange::Position { end_lsn: 7 });
        for bad in [
            r#"{"op":"copy_rows","collection":"c","ops":[],"end_lsn":1}"#,
            r#"{"op":"rows","collection":"c","ops":[]}"#,
            r#"{"op":"rows","collection":"c","end_lsn":1,"ops":[],"x":1}"#,
            r#"{"op":"position"}"#,
            r#"{"collection":"c"}"#,
        ] {
            assert!(change_of(bad).is_err(), "{bad}");
        }
    }
}
