//! The log entry: one change of state, as the node that took the request
//! publishes it to the stream and as every node applies it. JSON, one object:
//!
//! ```json
//! {"kind":"write","collection":"rooms","ops":[{"op":"upsert","id":"r1","fields":{"n":1}}],
//!  "caller":{"sub":"ops","role":"admin","claims":{}}}
//! ```
//!
//! | `kind`              | other keys                                              |
//! |---------------------|---------------------------------------------------------|
//! | `write`             | `collection`, `ops` (the HTTP ops array, as sent)       |
//! | `create_collection` | `collection`, `schema` (`{"fields":[...]}`, as sent)    |
//! | `add_field`         | `collection`, `field` (`{"name","type","default"}`)     |
//! | `remove_field`      | `collection`, `field` (the field's name, a string)      |
//! | `drop_collection`   | `collection`                                            |
//! | `set_rules`         | `rules` (the rules document)                            |
//! | `postgres`          | `postgres` (a PostgreSQL follower's change: `pg_follow::stream_entry`) |
//!
//! Collections go by *name* (a `CollectionId` is node-local), and requests as
//! the client sent them: every node checks them at apply time against its own
//! state at that seq (rules, schema, preconditions), which is the same state on
//! every node, so every node reaches the same outcome. `caller` is the identity
//! the rules are checked against (its token was verified by the publishing node;
//! an entry outlives its token).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::auth::{identity_key, Identity, Role};
use crate::wire::InlineOps;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Write,
    CreateCollection,
    AddField,
    RemoveField,
    DropCollection,
    SetRules,
    /// The PostgreSQL follower's (`pg_follow::stream_entry`), applied with its fencing.
    Postgres,
}

/// The caller an entry is applied for.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caller<'a> {
    #[serde(borrow)]
    pub sub: Cow<'a, str>,
    /// Borrowed too: a `Cow` field without `borrow` is decoded into a `String`.
    #[serde(borrow)]
    pub role: Cow<'a, str>,
    /// A claim named twice has no one value for the rules of every node to read.
    #[serde(default, deserialize_with = "crate::strict_json::unique_keys_map")]
    pub claims: serde_json::Map<String, serde_json::Value>,
}

impl Caller<'_> {
    pub fn of(identity: &Identity) -> Caller<'static> {
        Caller {
            sub: Cow::Owned(identity.sub.clone()),
            role: Cow::Borrowed(identity.role.as_str()),
            claims: identity.claims.clone(),
        }
    }

    /// The identity the rules see at apply time. An unknown role is a reader's
    /// (the least power), so a malformed entry can never grant more. Its `key`
    /// is the publishing node's `Identity::key`: the canonical claims of the
    /// token (`auth::identity_key`), or the subject alone for a caller without
    /// claims (the anonymous admin of a server without auth, whose key that is).
    pub fn identity(&self) -> Identity {
        let key = if self.claims.is_empty() { std::sync::Arc::from(&*self.sub) } else { identity_key(&self.claims) };
        Identity {
            sub: self.sub.clone().into_owned(),
            role: self.role(),
            claims: self.claims.clone(),
            expires_at: u64::MAX,
            key,
        }
    }

    fn role(&self) -> Role {
        Role::parse(&self.role).unwrap_or(Role::Reader)
    }
}

/// One entry (see the module's table). Borrowed from the message's bytes when
/// decoded, so the parts the apply reads again (`ops`) are not copied.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry<'a> {
    pub kind: Kind,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub collection: Option<Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub field: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<&'a RawValue>,
    #[serde(borrow)]
    pub caller: Caller<'a>,
}

impl<'a> Entry<'a> {
    pub fn new(kind: Kind, collection: Option<&'a str>, caller: Caller<'a>) -> Entry<'a> {
        Entry {
            kind,
            collection: collection.map(Cow::Borrowed),
            ops: None,
            schema: None,
            field: None,
            rules: None,
            postgres: None,
            caller,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an entry serialises")
    }

    pub fn decode(bytes: &'a [u8]) -> Result<Entry<'a>, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// An entry as the writer applies it: [`Entry`]'s keys, with a write's `ops`
/// decoded in the same pass as the rest (borrowed from the message's bytes),
/// not kept raw and parsed again: one pass over each entry's bytes fewer on a
/// catching-up node (docs/bench-history/2026-11-24-cluster-mode.md, "Catch-up profile"). An op that does
/// not decode makes the whole entry malformed, which every node decides alike.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decoded<'a> {
    pub kind: Kind,
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    pub collection: Option<Cow<'a, str>>,
    /// One op (a message, a read marker: nearly every entry) is held inline, so
    /// decoding it allocates nothing.
    #[serde(borrow, default)]
    pub ops: Option<InlineOps<'a>>,
    #[serde(borrow, default)]
    pub schema: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub field: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub rules: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub postgres: Option<&'a RawValue>,
    #[serde(borrow)]
    pub caller: DecodedCaller<'a>,
}

/// The caller of a [`Decoded`] entry, its claims kept as the message's text:
/// a node keeps the identity it applied the last write entry for and reuses it
/// while the next entries name the same caller (`DecodedCaller::is`), so the
/// claims are read, into a map of their own, only when the caller changes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodedCaller<'a> {
    #[serde(borrow)]
    pub sub: Cow<'a, str>,
    #[serde(borrow)]
    pub role: Cow<'a, str>,
    /// Read by [`DecodedCaller::identity`]: an object naming each claim once
    /// (`null`, another value or a repeated key make the entry malformed).
    #[serde(borrow, default, deserialize_with = "raw_claims")]
    claims: Option<&'a RawValue>,
}

/// The claims as written, `null` included (which `Option` would read as absent).
fn raw_claims<'de: 'a, 'a, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<&'a RawValue>, D::Error> {
    <&'a RawValue>::deserialize(deserializer).map(Some)
}

impl DecodedCaller<'_> {
    /// The claims' text as the entry carries them (`{}` for none, as published).
    pub fn claims_text(&self) -> &str {
        self.claims.map_or("{}", RawValue::get)
    }

    /// The identity the rules see at apply time ([`Caller::identity`]); an error
    /// when the claims are not an object naming each claim once (a claim named
    /// twice has no one value for the rules of every node to read).
    pub fn identity(&self) -> Result<Identity, serde_json::Error> {
        #[derive(Deserialize)]
        struct Claims(
            #[serde(deserialize_with = "crate::strict_json::unique_keys_map")]
            serde_json::Map<String, serde_json::Value>,
        );
        let claims = match self.claims {
            None => serde_json::Map::new(),
            Some(raw) => serde_json::from_str::<Claims>(raw.get())?.0,
        };
        Ok(Caller { sub: Cow::Borrowed(&self.sub), role: Cow::Borrowed(&self.role), claims }.identity())
    }

    /// Whether `identity`, built by [`DecodedCaller::identity`] for a caller
    /// whose claims read `claims_text`, is this caller's: the same subject and
    /// role, and the same claims written alike (claims written otherwise but
    /// equal only cost an identity built again; the key is a function of the
    /// subject and the claims, so it is equal too).
    pub fn is(&self, identity: &Identity, claims_text: &str) -> bool {
        identity.sub == *self.sub
            && identity.role == Role::parse(&self.role).unwrap_or(Role::Reader)
            && self.claims_text() == claims_text
            && identity.expires_at == u64::MAX
    }
}

/// An optional string borrowed from the message unless it has escapes: serde's
/// `borrow` reaches a `Cow` field, not one inside an `Option`, which it would
/// decode into a `String` (an allocation per entry).
fn borrowed_str<'de: 'a, 'a, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Borrowed<'a>>::deserialize(deserializer)?.map(|Borrowed(text)| text))
}

impl<'a> Decoded<'a> {
    /// The bytes are checked to be UTF-8 once, whole, then decoded as text:
    /// decoding from bytes checks every string and raw value it borrows on its
    /// own, a call per key (docs/bench-history/2026-11-24-cluster-mode.md, "Catch-up, third pass"). Bytes
    /// that are not UTF-8 are refused either way.
    pub fn decode(bytes: &'a [u8]) -> Result<Decoded<'a>, serde_json::Error> {
        let text = std::str::from_utf8(bytes).map_err(|error| {
            <serde_json::Error as serde::de::Error>::custom(format_args!("the entry is not UTF-8: {error}"))
        })?;
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_round_trips_and_names_its_collection() {
        let ops = RawValue::from_string(r#"[{"op":"upsert","id":"a"}]"#.to_owned()).unwrap();
        let identity = Identity::anonymous_admin();
        let mut entry = Entry::new(Kind::Write, Some("rooms"), Caller::of(&identity));
        entry.ops = Some(&ops);
        let bytes = entry.encode();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert_eq!(
            text,
            r#"{"kind":"write","collection":"rooms","ops":[{"op":"upsert","id":"a"}],"caller":{"sub":"anonymous","role":"admin","claims":{}}}"#
        );
        let decoded = Entry::decode(&bytes).unwrap();
        assert_eq!(decoded.kind, Kind::Write);
        assert_eq!(decoded.collection.as_deref(), Some("rooms"));
        assert_eq!(decoded.ops.unwrap().get(), r#"[{"op":"upsert","id":"a"}]"#);
        assert_eq!(decoded.caller.identity().role, Role::Admin);
        let applied = Decoded::decode(&bytes).unwrap();
        assert_eq!((applied.kind, applied.collection.as_deref()), (Kind::Write, Some("rooms")));
        let ops = applied.ops.unwrap();
        assert_eq!((ops.len(), &*ops[0].op, &*ops[0].id), (1, "upsert", "a"));
    }

    /// A rules document is carried as the admin sent it and decoded by every node
    /// with the same parser: a rule filter comparing two fields (refused by
    /// `PUT /v1/rules` before it is published) is refused alike by each node that
    /// applies such an entry, and a field-comparing filter's JSON is kept as sent.
    #[test]
    fn a_rules_entry_decodes_to_the_same_refusal_on_every_node() {
        let doc = r#"{"rules":[{"collection":"members","roles":["reader"],"read":{"filter":{"all":[{"field":"owner","op":"eq","value":"$sub"},{"field":"room.last_seq","op":"gt","value":{"field":"read_upto"}}]}}}]}"#;
        let rules = RawValue::from_string(doc.to_owned()).unwrap();
        let identity = Identity::anonymous_admin();
        let mut entry = Entry::new(Kind::SetRules, None, Caller::of(&identity));
        entry.rules = Some(&rules);
        let bytes = entry.encode();
        let decoded = Decoded::decode(&bytes).unwrap();
        let carried = decoded.rules.unwrap().get();
        assert_eq!(carried, doc);
        let compile = |text: &str| {
            let doc: crate::rules::RulesDoc = serde_json::from_str(text).unwrap();
            crate::rules::RuleSet::compile(doc).unwrap_err()
        };
        let (sent, applied) = (compile(doc), compile(carried));
        assert_eq!((sent.code, &sent.message), (applied.code, &applied.message));
        assert_eq!(applied.code, crate::error::ErrorCode::InvalidRules);
    }

    /// A node that applies an entry sees the identity the publishing node
    /// verified, its key included (the canonical claims, not the subject alone).
    #[test]
    fn the_applied_identity_has_the_verified_identitys_key() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let verifier = crate::auth::Verifier::new(&crate::auth::AuthOptions {
            secret: Some(secret.to_vec()),
            ..Default::default()
        })
        .unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("team".to_owned(), serde_json::json!("blue"));
        let token = crate::auth::mint(secret, "role", "u7", Role::Writer, 60, &extra);
        let verified = verifier.verify(&token).unwrap();
        for identity in [verified, Identity::anonymous_admin()] {
            let bytes = Entry::new(Kind::DropCollection, Some("x"), Caller::of(&identity)).encode();
            let applied = Entry::decode(&bytes).unwrap().caller.identity();
            assert_eq!(applied.key, identity.key, "{}", String::from_utf8_lossy(&bytes));
            assert_eq!((applied.sub, applied.role, applied.claims), (identity.sub, identity.role, identity.claims));
        }
    }

    /// A followed entry's claims are read when its caller's identity is built:
    /// a claim named twice, `null` or claims that are no object make that
    /// identity, and so the entry, malformed on every node alike. Claims are
    /// compared with the last caller's as written.
    #[test]
    fn a_followed_callers_claims_name_each_claim_once_and_are_compared_as_written() {
        let caller_of = |claims: &str| {
            format!(r#"{{"kind":"drop_collection","collection":"x","caller":{{"sub":"s","role":"writer"{claims}}}}}"#)
        };
        for claims in [
            r#","claims":{"team":"red","team":"blue"}"#,
            r#","claims":{"a":[{"b":1,"b":2}]}"#,
            r#","claims":null"#,
            r#","claims":[1]"#,
        ] {
            let text = caller_of(claims);
            let entry = Decoded::decode(text.as_bytes()).unwrap();
            assert!(entry.caller.identity().is_err(), "{text}");
        }
        let red = caller_of(r#","claims":{"team":"red"}"#);
        let red = Decoded::decode(red.as_bytes()).unwrap();
        let identity = red.caller.identity().unwrap();
        assert_eq!((identity.claims["team"].as_str(), identity.role), (Some("red"), Role::Writer));
        assert!(red.caller.is(&identity, red.caller.claims_text()));
        assert!(!red.caller.is(&identity, r#"{"team":"blue"}"#));
        let none = caller_of("");
        let none = Decoded::decode(none.as_bytes()).unwrap();
        assert_eq!((none.caller.claims_text(), none.caller.identity().unwrap().claims.len()), ("{}", 0));
    }

    #[test]
    fn an_unknown_role_applies_as_a_reader() {
        let entry = Entry::decode(br#"{"kind":"drop_collection","collection":"x","caller":{"sub":"s","role":"root"}}"#)
            .unwrap();
        assert_eq!(entry.caller.identity().role, Role::Reader);
    }

    #[test]
    fn unknown_keys_and_kinds_are_refused() {
        assert!(Entry::decode(br#"{"kind":"write","extra":1,"caller":{"sub":"s","role":"admin"}}"#).is_err());
        assert!(Entry::decode(br#"{"kind":"truncate","caller":{"sub":"s","role":"admin"}}"#).is_err());
        assert!(Decoded::decode(br#"{"kind":"write","extra":1,"caller":{"sub":"s","role":"admin"}}"#).is_err());
        assert!(Decoded::decode(br#"{"kind":"truncate","caller":{"sub":"s","role":"admin"}}"#).is_err());
        // An op with an unknown key: the whole entry is malformed.
        let bad_op = br#"{"kind":"write","ops":[{"op":"upsert","id":"a","x":1}],"caller":{"sub":"s","role":"admin"}}"#;
        assert!(Decoded::decode(bad_op).is_err());
        // Bytes that are not UTF-8, in a string or a raw value, are refused as before.
        let not_utf8 = |before: &str, after: &str| [before.as_bytes(), &[0xff], after.as_bytes()].concat();
        for bad in [
            not_utf8(r#"{"kind":"write","collection":"r"#, r#"","caller":{"sub":"s","role":"admin"}}"#),
            not_utf8(
                r#"{"kind":"write","ops":[{"op":"upsert","id":"a","fields":{"n":""#,
                r#""}}],"caller":{"sub":"s","role":"admin"}}"#,
            ),
        ] {
            assert!(serde_json::from_slice::<Decoded>(&bad).is_err());
            let error = Decoded::decode(&bad).err().expect("refused");
            assert!(error.to_string().contains("not UTF-8"), "{error}");
        }
    }
}
