//! `NameRoutes`: collection names to values, ignoring case.
//!
//! Names are stored folded: ASCII names with ASCII lowercase, other names
//! with `str::to_lowercase`, which for ASCII gives the same string, so every
//! stored key equals `name.to_lowercase()`. A lookup with an ASCII name (the
//! usual case: a URL path segment) folds on the fly while hashing and
//! comparing, so it allocates nothing; a lookup with any other name folds it
//! with `to_lowercase` first and then takes the same path (RavenDB routes
//! collection names the same way). Both agree with the naive
//! `map.get(&name.to_lowercase())` for every input; the model test checks it.
//!
//! Why folding an ASCII query with ASCII rules finds non-ASCII names too: a
//! stored key never holds an ASCII capital (lowercasing never produces one),
//! so "equal ignoring ASCII case" is plain equality between stored keys, and
//! between a stored key and `query.to_lowercase()`. A non-ASCII name can fold
//! to an all-ASCII key (the Kelvin sign `K`, U+212A, lowercases to `k`), and
//! an ASCII query finds it, as the naive lookup would.
//!
//! The hasher is std's (SipHash, randomly keyed): names come from clients.
//! Name length limits are the caller's (the protocol allows 1..=128 bytes).

use std::borrow::Borrow;
use std::collections::hash_map::{Entry, HashMap};
use std::fmt;
use std::hash::{Hash, Hasher};

/// Collection names to values, ignoring case; see the module documentation.
#[derive(Debug, Clone)]
pub struct NameRoutes<V> {
    routes: HashMap<FoldedName, Route<V>>,
}

#[derive(Debug, Clone)]
struct Route<V> {
    /// The name as it was inserted; responses spell it this way.
    name: Box<str>,
    value: V,
}

/// [`NameRoutes::insert`] was given a name that, ignoring case, is already
/// taken. The value comes back to the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameTaken<V> {
    /// The name that was refused.
    pub name: String,
    /// The existing name it collides with, as that one was inserted.
    pub existing_name: String,
    /// The value that was not inserted.
    pub value: V,
}

impl<V> fmt::Display for NameTaken<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "collection name `{}` is taken by `{}` (names are compared ignoring case)",
            self.name, self.existing_name
        )
    }
}

impl<V: fmt::Debug> std::error::Error for NameTaken<V> {}

impl<V> Default for NameRoutes<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V> NameRoutes<V> {
    /// No routes.
    pub fn new() -> Self {
        NameRoutes { routes: HashMap::new() }
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether there are no routes.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Routes `name`, in any case, to `value`; refused if a name equal to it
    /// ignoring case is already routed.
    pub fn insert(&mut self, name: &str, value: V) -> Result<(), NameTaken<V>> {
        let folded = if name.is_ascii() { name.to_ascii_lowercase() } else { name.to_lowercase() };
        debug_assert_eq!(folded, name.to_lowercase());
        match self.routes.entry(FoldedName(folded.into_boxed_str())) {
            Entry::Occupied(taken) => {
                Err(NameTaken { name: name.to_owned(), existing_name: taken.get().name.to_string(), value })
            }
            Entry::Vacant(slot) => {
                slot.insert(Route { name: name.into(), value });
                Ok(())
            }
        }
    }

    /// The value routed to `name`, in any case. Allocates nothing when `name`
    /// is ASCII.
    pub fn get(&self, name: &str) -> Option<&V> {
        self.route(name).map(|route| &route.value)
    }

    /// The value routed to `name`, in any case, with the name as it was
    /// inserted.
    pub fn get_with_name(&self, name: &str) -> Option<(&str, &V)> {
        self.route(name).map(|route| (&*route.name, &route.value))
    }

    /// Unroutes `name` (in any case); returns its value. The name is free again.
    pub fn remove(&mut self, name: &str) -> Option<V> {
        let folded = if name.is_ascii() { name.to_ascii_lowercase() } else { name.to_lowercase() };
        self.routes.remove(&FoldedName(folded.into_boxed_str())).map(|route| route.value)
    }

    /// Every route, as (name as inserted, value), in no particular order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &V)> + '_ {
        self.routes.values().map(|route| (&*route.name, &route.value))
    }

    fn route(&self, name: &str) -> Option<&Route<V>> {
        if name.is_ascii() {
            self.routes.get(&AsciiCaselessQuery(name) as &dyn AsciiCaseless)
        } else {
            let folded = name.to_lowercase();
            self.routes.get(&AsciiCaselessQuery(&folded) as &dyn AsciiCaseless)
        }
    }
}

/// A name seen through ASCII case folding: hashed and compared as if every
/// ASCII capital were lowercase.
///
/// The map's key type borrows as `dyn AsciiCaseless`, which lets
/// `HashMap::get` take a query that is not a stored key (a `&str` in any
/// case) without `unsafe` and without allocating a folded copy; the price is
/// two indirect calls per lookup.
trait AsciiCaseless {
    fn bytes(&self) -> &[u8];
}

impl Hash for dyn AsciiCaseless + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Lowercased in stack chunks, so the hasher sees whole slices rather
        // than a call per byte.
        const CHUNK_BYTES: usize = 32;
        let mut chunk = [0u8; CHUNK_BYTES];
        for source in self.bytes().chunks(CHUNK_BYTES) {
            let folded = &mut chunk[..source.len()];
            folded.copy_from_slice(source);
            folded.make_ascii_lowercase();
            state.write(folded);
        }
        // As `str` does, so that no key's hash input is a prefix of another's.
        state.write_u8(0xff);
    }
}

impl PartialEq for dyn AsciiCaseless + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.bytes().eq_ignore_ascii_case(other.bytes())
    }
}

impl Eq for dyn AsciiCaseless + '_ {}

/// A stored key: the name folded (see the module documentation). Hashes and
/// compares through its `dyn AsciiCaseless` view, as `Borrow` requires; since
/// it holds no ASCII capital, that is the same as plain equality.
#[derive(Debug, Clone)]
struct FoldedName(Box<str>);

impl AsciiCaseless for FoldedName {
    fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl<'a> Borrow<dyn AsciiCaseless + 'a> for FoldedName {
    fn borrow(&self) -> &(dyn AsciiCaseless + 'a) {
        self
    }
}

impl Hash for FoldedName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self as &dyn AsciiCaseless).hash(state);
    }
}

impl PartialEq for FoldedName {
    fn eq(&self, other: &Self) -> bool {
        (self as &dyn AsciiCaseless) == (other as &dyn AsciiCaseless)
    }
}

impl Eq for FoldedName {}

/// A lookup: an ASCII name in any case, or a name already lowercased.
struct AsciiCaselessQuery<'a>(&'a str);

impl AsciiCaseless for AsciiCaselessQuery<'_> {
    fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::rng::Rng;

    /// Characters whose case mapping is easy to get wrong: `ß` (uppercases to
    /// "SS", lowercases to itself), `İ` (lowercases to two characters, `i`
    /// and a combining dot), `Σ` (lowercases to `ς` at the end of a word, `σ`
    /// elsewhere), the Kelvin sign (lowercases to ASCII `k`), and accented
    /// letters in both cases.
    const TRICKY: &[char] = &['ß', 'ẞ', 'İ', 'ı', 'Σ', 'σ', 'ς', '\u{212A}', 'é', 'É', 'Ö', 'ö', 'ǅ', 'ﬀ'];
    const PLAIN: &[char] = &['k', 'K', 'i', 'I', 's', 'S', 'a', 'B', 'z', '0', '7', '-', '_'];

    fn random_name(rng: &mut Rng, tricky_percent: usize) -> String {
        let len = 1 + rng.index(6);
        (0..len).map(|_| if rng.index(100) < tricky_percent { *rng.pick(TRICKY) } else { *rng.pick(PLAIN) }).collect()
    }

    /// Some case variant of `name`: each character kept, uppercased or
    /// lowercased (ASCII only or Unicode), so queries hit stored names in
    /// other spellings.
    fn respell(rng: &mut Rng, name: &str) -> String {
        let mut out = String::new();
        for c in name.chars() {
            match rng.index(4) {
                0 => out.push(c),
                1 => out.push(c.to_ascii_uppercase()),
                2 => out.extend(c.to_uppercase()),
                _ => out.extend(c.to_lowercase()),
            }
        }
        out
    }

    /// The naive reference: `to_lowercase`, then an ordinary map.
    struct Naive {
        map: HashMap<String, (String, u32)>,
    }

    impl Naive {
        fn get(&self, name: &str) -> Option<&u32> {
            self.map.get(&name.to_lowercase()).map(|(_, value)| value)
        }
    }

    fn run_model(seed: u64, tricky_percent: usize, steps: usize) {
        let mut rng = Rng::new(seed);
        let mut routes: NameRoutes<u32> = NameRoutes::new();
        let mut naive = Naive { map: HashMap::new() };
        let mut inserted: Vec<String> = Vec::new();
        for step in 0..steps {
            let context = format!("seed {seed}, tricky {tricky_percent}%, step {step}");
            let name = if !inserted.is_empty() && rng.index(2) == 0 {
                let existing = rng.pick(&inserted).clone();
                respell(&mut rng, &existing)
            } else {
                random_name(&mut rng, tricky_percent)
            };
            if rng.index(3) == 0 {
                let value = step as u32;
                let outcome = routes.insert(&name, value);
                match naive.map.get(&name.to_lowercase()) {
                    Some((existing_name, _)) => {
                        let expected = NameTaken { name: name.clone(), existing_name: existing_name.clone(), value };
                        assert_eq!(outcome, Err(expected), "{context}: insert {name:?}");
                    }
                    None => {
                        assert_eq!(outcome, Ok(()), "{context}: insert {name:?}");
                        naive.map.insert(name.to_lowercase(), (name.clone(), value));
                        inserted.push(name.clone());
                    }
                }
            } else {
                assert_eq!(routes.get(&name), naive.get(&name), "{context}: get {name:?}");
                let with_name = routes.get_with_name(&name);
                let expected = naive.map.get(&name.to_lowercase()).map(|(n, v)| (n.as_str(), v));
                assert_eq!(with_name, expected, "{context}: get_with_name {name:?}");
            }
            assert_eq!(routes.len(), naive.map.len(), "{context}: len");
        }
        let mut listed: Vec<(String, u32)> = routes.iter().map(|(n, &v)| (n.to_owned(), v)).collect();
        let mut expected: Vec<(String, u32)> = naive.map.values().cloned().collect();
        listed.sort();
        expected.sort();
        assert_eq!(listed, expected, "seed {seed}: iter");
    }

    #[test]
    fn matches_naive_lowercase_map() {
        for seed in 1..=20 {
            // All ASCII, a few tricky characters, mostly tricky characters.
            for tricky_percent in [0, 10, 60] {
                run_model(seed, tricky_percent, 3_000);
            }
        }
    }

    #[test]
    fn kelvin_sign_and_ascii_k_are_one_name() {
        let mut routes = NameRoutes::new();
        routes.insert("\u{212A}elvin-Rooms", 1).unwrap();
        assert_eq!(routes.get("KELVIN-rooms"), Some(&1));
        assert_eq!(routes.get("kelvin-rooms"), Some(&1));
        assert_eq!(routes.get("\u{212A}ELVIN-ROOMS"), Some(&1));
        let taken = routes.insert("Kelvin-rooms", 2).unwrap_err();
        assert_eq!(taken.existing_name, "\u{212A}elvin-Rooms");
        assert_eq!(taken.value, 2);
        assert_eq!(
            taken.to_string(),
            "collection name `Kelvin-rooms` is taken by `\u{212A}elvin-Rooms` (names are compared ignoring case)"
        );
    }

    #[test]
    fn dotted_capital_i_is_not_ascii_i() {
        // `İ` lowercases to "i\u{307}", which is not "i".
        let mut routes = NameRoutes::new();
        routes.insert("İnbox", 1).unwrap();
        assert_eq!(routes.get("inbox"), None);
        assert_eq!(routes.get("i\u{307}NBOX"), Some(&1));
        routes.insert("INBOX", 2).unwrap();
        assert_eq!(routes.get("Inbox"), Some(&2));
        assert_eq!(routes.get("İNBOX"), Some(&1));
    }

    #[test]
    fn names_longer_than_one_hash_chunk() {
        let mut routes = NameRoutes::new();
        let long = "Rooms-".repeat(20);
        routes.insert(&long, 1).unwrap();
        assert_eq!(routes.get(&long.to_ascii_uppercase()), Some(&1));
        assert_eq!(routes.get(&long[..long.len() - 1]), None);
    }
}
