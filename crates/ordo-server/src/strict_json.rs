//! One meaning per JSON text. serde_json, like most parsers, reads an object
//! that repeats a key by keeping one of the values, and an integer too wide for
//! 64 bits by rounding it to an `f64`; two readers of one text (a rule check and
//! the write, a token's verifier and its role) could then disagree on what was
//! sent. `check` refuses both, in one pass over the bytes that allocates nothing
//! for objects of up to `LINEAR_KEYS_MAX` keys.
//!
//! Typed parses that do not keep text for later refuse these themselves (the
//! write path's field visitor, serde's derived structs for known keys); this
//! pass is for what is kept or read as a whole: payloads, bodies read into
//! `serde_json::Value`s (filters, rules), tokens' claims, cluster entries.

use std::borrow::Cow;
use std::collections::HashSet;

use crate::error::{ApiError, ErrorCode};

/// Deeper than this, serde_json refuses a text anyway (its recursion limit).
pub const MAX_DEPTH: usize = 128;

/// Keys of one object compared one by one up to this many; a larger object's
/// keys go into a hash set (an object that large allocates anyway).
const LINEAR_KEYS_MAX: usize = 32;

/// Key ranges kept on the stack before the spill vector is used.
const INLINE_KEYS: usize = 64;

/// What the integers of the text must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Integers {
    /// An integer written without fraction or exponent must fit `i64` or `u64`:
    /// the server reads it exactly, never rounded through an `f64`.
    Exact64,
    /// Any width: the text is kept and sent back as written (payloads).
    AsWritten,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Arrays and objects nest deeper than the limit given.
    TooDeep,
    /// An object names this key twice (after undoing escapes).
    RepeatedKey(String),
    /// An integer outside -2^63..=2^64-1, as written.
    WideInteger(String),
}

impl Refusal {
    /// The refusal as `bad_json`, `what` saying where (`the body`, `op 3's payload`).
    pub fn to_api_error(&self, what: &str) -> ApiError {
        let message = match self {
            Refusal::TooDeep => format!("not valid JSON: {what} nests arrays and objects too deep"),
            Refusal::RepeatedKey(key) => {
                format!("not valid JSON: {what} repeats the key `{key}` in one object; name each key once")
            }
            Refusal::WideInteger(integer) => format!(
                "not valid JSON: {what} has the integer {integer}, outside -2^63..2^64-1; an integer is read \
                 exactly, so it must fit 64 bits (write a float with a fraction or exponent instead)"
            ),
        };
        ApiError::new(ErrorCode::BadJson, message)
    }
}

/// Parses `text` as `T` once `check` accepted it (integers `Exact64`). Every
/// body, message and document that is not on the write path goes through here.
pub fn parse<'a, T: serde::Deserialize<'a>>(text: &'a [u8], what: &str) -> Result<T, ApiError> {
    check(text, MAX_DEPTH, Integers::Exact64).map_err(|refusal| refusal.to_api_error(what))?;
    serde_json::from_slice(text).map_err(|error| ApiError::from_json(&error))
}

/// `deserialize_with` for a `serde_json::Map` inside a typed parse (a cluster
/// entry's caller claims): refuses a key repeated at any depth of it within that
/// one parse, with serde's own words for a repeated field (`duplicate field`).
pub fn unique_keys_map<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<serde_json::Map<String, serde_json::Value>, D::Error> {
    match <UniqueKeysValue as serde::Deserialize>::deserialize(deserializer)?.0 {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err(serde::de::Error::custom("expected a map")),
    }
}

/// A JSON value whose objects name each key once, at every depth.
struct UniqueKeysValue(serde_json::Value);

impl<'de> serde::Deserialize<'de> for UniqueKeysValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeysValue;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<UniqueKeysValue, E> {
        Ok(UniqueKeysValue(serde_json::Value::Null))
    }
    fn visit_bool<E>(self, value: bool) -> Result<UniqueKeysValue, E> {
        Ok(UniqueKeysValue(value.into()))
    }
    fn visit_i64<E>(self, value: i64) -> Result<UniqueKeysValue, E> {
        Ok(UniqueKeysValue(value.into()))
    }
    fn visit_u64<E>(self, value: u64) -> Result<UniqueKeysValue, E> {
        Ok(UniqueKeysValue(value.into()))
    }
    fn visit_f64<E>(self, value: f64) -> Result<UniqueKeysValue, E> {
        Ok(UniqueKeysValue(serde_json::Number::from_f64(value).map_or(serde_json::Value::Null, Into::into)))
    }
    fn visit_str<E>(self, value: &str) -> Result<UniqueKeysValue, E> {
        Ok(UniqueKeysValue(value.into()))
    }
    fn visit_string<E>(self, value: String) -> Result<UniqueKeysValue, E> {
        Ok(UniqueKeysValue(value.into()))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeysValue, A::Error> {
        let mut values = Vec::new();
        while let Some(UniqueKeysValue(value)) = seq.next_element()? {
            values.push(value);
        }
        Ok(UniqueKeysValue(serde_json::Value::Array(values)))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeysValue, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format_args!("duplicate field `{key}`")));
            }
            let UniqueKeysValue(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(UniqueKeysValue(serde_json::Value::Object(object)))
    }
}

#[derive(Clone, Copy, Default)]
struct Container {
    is_object: bool,
    /// In an object: the next string is a key.
    expects_key: bool,
    /// Where this object's keys start in the key list.
    keys_start: usize,
}

/// A key as it is in the text: the bytes between its quotes.
#[derive(Clone, Copy, Default)]
struct KeySpan {
    start: usize,
    end: usize,
    has_escape: bool,
}

/// The keys of every open object, innermost last: on the stack up to
/// `INLINE_KEYS`, then in a vector.
struct KeyList {
    inline: [KeySpan; INLINE_KEYS],
    spill: Vec<KeySpan>,
    len: usize,
}

impl KeyList {
    fn get(&self, index: usize) -> KeySpan {
        if index < INLINE_KEYS {
            self.inline[index]
        } else {
            self.spill[index - INLINE_KEYS]
        }
    }

    fn push(&mut self, key: KeySpan) {
        if self.len < INLINE_KEYS {
            self.inline[self.len] = key;
        } else {
            self.spill.push(key);
        }
        self.len += 1;
    }

    fn truncate(&mut self, len: usize) {
        self.len = len;
        self.spill.truncate(len.saturating_sub(INLINE_KEYS));
    }
}

/// Checks `text` (JSON, or anything: a text that is not JSON passes or fails
/// here as it may; the parser after refuses it) for arrays and objects nested
/// deeper than `max_depth` (at most `MAX_DEPTH`), a key repeated in one object at
/// any depth, and, with `Integers::Exact64`, an integer too wide for 64 bits.
pub fn check(text: &[u8], max_depth: usize, integers: Integers) -> Result<(), Refusal> {
    // A text without arrays or objects (a write's field value, a number or a
    // string) has no key and no depth: scanning it for numbers alone spares
    // setting up the containers' stack, which costs more than such a text.
    if !text.iter().any(|byte| matches!(byte, b'{' | b'[')) {
        return check_scalars(text, integers);
    }
    check_nested(text, max_depth, integers)
}

/// `check` of a text with no `{` or `[` (in a string or not): its integers.
fn check_scalars(text: &[u8], integers: Integers) -> Result<(), Refusal> {
    if integers == Integers::AsWritten {
        return Ok(());
    }
    let mut index = 0;
    while index < text.len() {
        match text[index] {
            b'"' => index = string_end(text, index + 1).0 + 1,
            b'-' | b'0'..=b'9' => {
                let end = number_end(text, index);
                check_integer(&text[index..end])?;
                index = end;
            }
            _ => index += 1,
        }
    }
    Ok(())
}

/// `check` of any text: one pass keeping the open containers and their keys.
fn check_nested(text: &[u8], max_depth: usize, integers: Integers) -> Result<(), Refusal> {
    let max_depth = max_depth.min(MAX_DEPTH);
    let mut stack = [Container::default(); MAX_DEPTH];
    let mut depth = 0usize;
    let mut keys = KeyList { inline: [KeySpan::default(); INLINE_KEYS], spill: Vec::new(), len: 0 };
    // Hash sets of the open objects that passed `LINEAR_KEYS_MAX` keys, by depth.
    let mut large_objects: Vec<(usize, HashSet<Cow<'_, [u8]>>)> = Vec::new();
    let mut index = 0;
    while index < text.len() {
        match text[index] {
            b'"' => {
                let (end, has_escape) = string_end(text, index + 1);
                let top = depth.checked_sub(1).map(|top| &mut stack[top]);
                if let Some(container) = top.filter(|container| container.is_object && container.expects_key) {
                    container.expects_key = false;
                    let key = KeySpan { start: index + 1, end, has_escape };
                    let keys_start = container.keys_start;
                    add_key(text, &mut keys, keys_start, key, depth, &mut large_objects)?;
                }
                index = end;
            }
            byte @ (b'{' | b'[') => {
                if depth == max_depth {
                    return Err(Refusal::TooDeep);
                }
                stack[depth] = Container { is_object: byte == b'{', expects_key: byte == b'{', keys_start: keys.len };
                depth += 1;
            }
            b'}' | b']' => {
                if let Some(top) = depth.checked_sub(1) {
                    keys.truncate(stack[top].keys_start);
                    if large_objects.last().is_some_and(|(at, _)| *at == depth) {
                        large_objects.pop();
                    }
                    depth = top;
                }
            }
            b',' => {
                if let Some(container) = depth.checked_sub(1).map(|top| &mut stack[top]) {
                    container.expects_key = container.is_object;
                }
            }
            b'-' | b'0'..=b'9' => {
                let end = number_end(text, index);
                if integers == Integers::Exact64 {
                    check_integer(&text[index..end])?;
                }
                index = end;
                continue;
            }
            _ => {}
        }
        index += 1;
    }
    Ok(())
}

/// The index of the closing quote of the string whose contents start at
/// `start` (or the text's end), and whether the string has an escape.
fn string_end(text: &[u8], start: usize) -> (usize, bool) {
    let mut index = start;
    let mut has_escape = false;
    while index < text.len() {
        match text[index] {
            b'\\' => {
                has_escape = true;
                index += 2;
            }
            b'"' => return (index, has_escape),
            _ => index += 1,
        }
    }
    (text.len(), has_escape)
}

fn number_end(text: &[u8], start: usize) -> usize {
    let length =
        text[start..].iter().take_while(|byte| matches!(byte, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')).count();
    start + length
}

/// A number written as an integer (no fraction, no exponent) must fit `i64` or
/// `u64`. Parsing a slice of ASCII digits allocates nothing.
fn check_integer(number: &[u8]) -> Result<(), Refusal> {
    let digits = number.strip_prefix(b"-").unwrap_or(number);
    // Not an integer as JSON writes one (`-`, `1.5`, `2e3`, `1-2`): not this check's to refuse.
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Ok(());
    }
    let text = std::str::from_utf8(number).expect("ASCII digits");
    let fits = if digits.len() < number.len() { text.parse::<i64>().is_ok() } else { text.parse::<u64>().is_ok() };
    if fits {
        Ok(())
    } else {
        Err(Refusal::WideInteger(text.to_owned()))
    }
}

/// Adds `key` to the innermost object (its keys are `keys[keys_start..]`), or
/// refuses it when the object already has it.
fn add_key<'t>(
    text: &'t [u8],
    keys: &mut KeyList,
    keys_start: usize,
    key: KeySpan,
    depth: usize,
    large_objects: &mut Vec<(usize, HashSet<Cow<'t, [u8]>>)>,
) -> Result<(), Refusal> {
    let repeated = |key: &[u8]| Refusal::RepeatedKey(String::from_utf8_lossy(key).into_owned());
    if let Some((_, seen)) = large_objects.last_mut().filter(|(at, _)| *at == depth) {
        let decoded = decoded_key(text, key);
        if seen.contains(&decoded) {
            return Err(repeated(&decoded));
        }
        seen.insert(decoded);
        return Ok(());
    }
    for earlier in (keys_start..keys.len).map(|index| keys.get(index)) {
        if same_key(text, earlier, key) {
            return Err(repeated(&decoded_key(text, key)));
        }
    }
    keys.push(key);
    if keys.len - keys_start > LINEAR_KEYS_MAX {
        let seen = (keys_start..keys.len).map(|index| decoded_key(text, keys.get(index))).collect();
        large_objects.push((depth, seen));
    }
    Ok(())
}

fn same_key(text: &[u8], a: KeySpan, b: KeySpan) -> bool {
    if !a.has_escape && !b.has_escape {
        return text[a.start..a.end] == text[b.start..b.end];
    }
    decoded_key(text, a) == decoded_key(text, b)
}

/// The key with its escapes undone (`"\u0061"` is `"a"`): borrowed when it has none.
fn decoded_key(text: &[u8], key: KeySpan) -> Cow<'_, [u8]> {
    let raw = &text[key.start..key.end];
    if !key.has_escape {
        return Cow::Borrowed(raw);
    }
    let quoted = &text[key.start - 1..(key.end + 1).min(text.len())];
    match serde_json::from_slice::<String>(quoted) {
        Ok(decoded) => Cow::Owned(decoded.into_bytes()),
        // Not a valid string: the parser refuses the text; compare it as written.
        Err(_) => Cow::Borrowed(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(text: &str) -> Result<(), Refusal> {
        check(text.as_bytes(), MAX_DEPTH, Integers::Exact64)
    }

    #[test]
    fn a_key_repeated_in_one_object_is_refused_at_any_depth() {
        for text in [
            r#"{"a":1,"a":2}"#,
            r#"{"a":1,"b":{"c":[{"d":1,"d":1}]}}"#,
            r#"[{"x":{"y":{"a":1,"b":2,"a":3}}}]"#,
            r#"{"a":1,"\u0061":2}"#,
            r#"{"\"":1,"\u0022":2}"#,
        ] {
            assert!(matches!(checked(text), Err(Refusal::RepeatedKey(_))), "{text}");
        }
        for text in [
            r#"{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}"#,
            r#"{"a":"a","b":"\"a\":","c":"{\"a\":1,\"a\":2}"}"#,
            r#"{"a\\":1,"a":2}"#,
            r#"[1,"a","a",{"a":[]},{"a":{}}]"#,
        ] {
            assert_eq!(checked(text), Ok(()), "{text}");
        }
        assert_eq!(checked(r#"{"\u0061":1,"a":2}"#), Err(Refusal::RepeatedKey("a".to_owned())));
    }

    #[test]
    fn large_objects_are_checked_through_a_set() {
        let keys: Vec<String> = (0..1_000).map(|n| format!("\"k{n}\":{n}")).collect();
        let text = format!("{{{}}}", keys.join(","));
        assert_eq!(checked(&text), Ok(()));
        let text = format!("{{{},\"k\\u0037\":1,\"inner\":{{\"k7\":1}}}}", keys.join(","));
        assert_eq!(checked(&text), Err(Refusal::RepeatedKey("k7".to_owned())));
        // A large object closed, a small one after it at the same depth starts afresh.
        let text = format!("[{{{}}},{{\"k1\":1,\"k2\":2}}]", keys.join(","));
        assert_eq!(checked(&text), Ok(()));
    }

    #[test]
    fn integers_must_fit_64_bits_unless_kept_as_written() {
        for text in ["-9223372036854775808", "18446744073709551615", "0", "-0", "1e400", "1.5", "-1.0e30"] {
            assert_eq!(checked(text), Ok(()), "{text}");
        }
        for text in ["-9223372036854775809", "18446744073709551616", "[1,{\"a\":100000000000000000000000}]"] {
            assert!(matches!(checked(text), Err(Refusal::WideInteger(_))), "{text}");
            assert_eq!(check(text.as_bytes(), MAX_DEPTH, Integers::AsWritten), Ok(()), "{text}");
        }
        // Digits inside strings are not numbers.
        assert_eq!(checked(r#"{"a":"18446744073709551616"}"#), Ok(()));
    }

    #[test]
    fn depth_is_counted_outside_strings() {
        assert_eq!(check(b"[[[]]]", 3, Integers::Exact64), Ok(()));
        assert_eq!(check(b"[[[]]]", 2, Integers::Exact64), Err(Refusal::TooDeep));
        assert_eq!(check(br#"["[[[[", {"a": "{{{"}]"#, 2, Integers::Exact64), Ok(()));
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert_eq!(check(deep.as_bytes(), 64, Integers::AsWritten), Err(Refusal::TooDeep));
    }

    #[test]
    fn a_map_read_in_a_typed_parse_refuses_a_repeated_key_at_any_depth() {
        #[derive(serde::Deserialize)]
        struct Holder {
            #[serde(deserialize_with = "unique_keys_map")]
            claims: serde_json::Map<String, serde_json::Value>,
        }
        let read = |text: &str| serde_json::from_str::<Holder>(text).map(|holder| holder.claims);
        let claims = read(r#"{"claims":{"role":"reader","team":{"a":[1,{"b":2}]}}}"#).unwrap();
        assert_eq!(claims["team"]["a"][1]["b"], 2);
        for text in [r#"{"claims":{"role":"reader","role":"admin"}}"#, r#"{"claims":{"t":[{"a":1,"a":2}]}}"#] {
            let error = read(text).expect_err(text);
            assert!(error.to_string().starts_with("duplicate field"), "{error}");
        }
    }

    #[test]
    fn a_text_without_containers_is_checked_as_the_full_pass_checks_it() {
        let texts = [
            "0",
            "-0",
            "12",
            "-9223372036854775808",
            "-9223372036854775809",
            "18446744073709551615",
            "18446744073709551616",
            "1e400",
            "1.5",
            "-",
            "--1",
            "1-2",
            "12 99999999999999999999",
            "\"99999999999999999999\"",
            "\"a\\\"99999999999999999999\"",
            "\"\\",
            "true",
            "null",
            "\"x\", 99999999999999999999",
            ",,1",
            "}99999999999999999999",
            "",
            "\"",
            "\"unterminated 99999999999999999999",
        ];
        for text in texts {
            for integers in [Integers::Exact64, Integers::AsWritten] {
                for max_depth in [0, MAX_DEPTH] {
                    let full = check_nested(text.as_bytes(), max_depth, integers);
                    assert_eq!(check(text.as_bytes(), max_depth, integers), full, "{text:?} {integers:?} {max_depth}");
                }
            }
        }
        assert!(matches!(checked("-9223372036854775809"), Err(Refusal::WideInteger(_))));
    }

    #[test]
    fn text_that_is_not_json_does_not_panic() {
        for text in ["}", "]]]", "{\"a", "{\"a\\", "\"\\u00", "{,,\"a\":1,\"a\"", "-", "[-]"] {
            let _ = checked(text);
        }
    }
}
