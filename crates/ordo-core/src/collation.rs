//! Locale-aware string order for sort keys: ICU4X collation with compiled CLDR data.
//!
//! A collated sort key orders strings the way readers of a language expect ("Émile"
//! among the Es in French, "Ö" after "Z" in Swedish) instead of by UTF-8 bytes. The
//! index still keys every item by a 128-bit prefix (see `sort`): for a collated key
//! that prefix holds the first bytes of the string's ICU *sort key*, whose bytewise
//! order is the collator's order. Cutting it keeps that order non-strictly, so the
//! prefix rule of `sort` holds; equal prefixes fall back to [`Collation::compare`].
//!
//! Nothing here allocates per update: the collator borrows static baked data and is
//! built once, when the view is compiled; [`Collation::sort_key_head`] writes into a
//! 16-byte array and stops ICU as soon as it is full, so a long string costs no more
//! than its first few characters. [`Collation::compare`] puts strings that are not in
//! NFC into two buffers the collation owns (grown once, then reused) before comparing:
//! ICU buffers the collation elements of a comparison past the strings' common
//! prefix in an 8-element array that spills to the heap beyond that, and a
//! decomposed "A" + U+030A against a precomposed "Å" has no common prefix at all.
//! (Two long NFC strings equal at the primary level for more than 7 elements past
//! their first difference, such as a long name and its upper-case spelling, still
//! make ICU spill; they are rare among ties of 16-byte sort key heads.)

use std::cell::RefCell;
use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use icu_collator::options::{CollatorOptions, Strength};
use icu_collator::{CollationKeySink, CollatorBorrowed};
use icu_locale_core::Locale;
use icu_normalizer::ComposingNormalizerBorrowed;

use crate::error::ViewError;
use crate::limits::MAX_COLLATION_LOCALE_BYTES;

/// A compiled collation: the collator for one locale at one strength.
#[derive(Clone)]
pub(crate) struct Collation {
    /// The locale in canonical BCP 47 form (`und` for the root collation).
    locale: String,
    case_insensitive: bool,
    /// Shared so that cloning a compiled sort does not redo the locale lookup.
    collator: Arc<CollatorBorrowed<'static>>,
}

thread_local! {
    /// NFC forms of the two strings of a comparison, when they are not NFC
    /// already: per thread rather than per collation, because a compiled sort
    /// is shared by views on any thread (see `engine::shared`), and kept so that
    /// comparisons allocate only until the buffers fit the longest names.
    static NFC_SCRATCH: RefCell<(String, String)> = const { RefCell::new((String::new(), String::new())) };
}

const NFC: ComposingNormalizerBorrowed<'static> = ComposingNormalizerBorrowed::new_nfc();

impl Collation {
    /// The collator for `locale` (a BCP 47 tag, or `root`), at tertiary strength
    /// (case and accents both matter, accents first), or at secondary strength
    /// when `case_insensitive` (accents matter, case does not).
    pub(crate) fn new(field: &str, locale: &str, case_insensitive: bool) -> Result<Collation, ViewError> {
        let parsed = parse_locale(field, locale)?;
        let mut options = CollatorOptions::default();
        options.strength = Some(if case_insensitive { Strength::Secondary } else { Strength::Tertiary });
        let collator =
            CollatorBorrowed::try_new((&parsed).into(), options).map_err(|error| ViewError::InvalidCollation {
                field: field.to_owned(),
                locale: locale.to_owned(),
                reason: error.to_string(),
            })?;
        Ok(Collation { locale: parsed.to_string(), case_insensitive, collator: Arc::new(collator) })
    }

    /// The full collation order of two strings (equal only when equal at this
    /// strength: canonically equivalent strings, for one, are equal).
    ///
    /// Collation orders canonically equivalent strings alike, so comparing NFC
    /// forms gives the same answer; it lets ICU skip the common prefix of two
    /// spellings of one name instead of buffering both whole (see the module doc).
    pub(crate) fn compare(&self, left: &str, right: &str) -> Ordering {
        if left == right {
            return Ordering::Equal;
        }
        if NFC.is_normalized(left) && NFC.is_normalized(right) {
            return self.collator.compare(left, right);
        }
        NFC_SCRATCH.with_borrow_mut(|(left_nfc, right_nfc)| {
            left_nfc.clear();
            left_nfc.extend(NFC.normalize_iter(left.chars()));
            right_nfc.clear();
            right_nfc.extend(NFC.normalize_iter(right.chars()));
            self.collator.compare(left_nfc, right_nfc)
        })
    }

    /// ICU's comparison, without the NFC detour: the reference in tests.
    #[cfg(test)]
    pub(crate) fn compare_directly(&self, left: &str, right: &str) -> Ordering {
        self.collator.compare(left, right)
    }

    /// The first 16 bytes of `text`'s sort key, zero-padded, as a big-endian
    /// number: `sort_key_head(a) < sort_key_head(b)` implies `compare(a, b)` is
    /// `Less`, because sort keys compare bytewise as the collator does, and
    /// cutting and zero-padding a byte string keeps that order non-strictly
    /// (sort keys hold no zero bytes, so padding is below any real byte).
    pub(crate) fn sort_key_head(&self, text: &str) -> u128 {
        let mut head = HeadSink { bytes: [0; 16], n_bytes: 0 };
        // `Err(Full)` only says that ICU was stopped early, with the head complete.
        let _ = self.collator.write_sort_key_to(text, &mut head);
        u128::from_be_bytes(head.bytes)
    }
}

impl fmt::Debug for Collation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collation")
            .field("locale", &self.locale)
            .field("case_insensitive", &self.case_insensitive)
            .finish()
    }
}

impl PartialEq for Collation {
    /// Two collations with one locale and strength order every string alike.
    fn eq(&self, other: &Collation) -> bool {
        self.locale == other.locale && self.case_insensitive == other.case_insensitive
    }
}

/// The canonical form of a collation locale (`"FR-ca"` becomes `"fr-CA"`, `"root"`
/// becomes `"und"`), or why it is refused. Servers canonicalize what clients send so
/// that equal collations spelled differently share one view.
pub fn canonical_collation_locale(locale: &str) -> Result<String, ViewError> {
    Ok(parse_locale("", locale)?.to_string())
}

fn parse_locale(field: &str, locale: &str) -> Result<Locale, ViewError> {
    if locale.len() > MAX_COLLATION_LOCALE_BYTES {
        return Err(ViewError::CollationLocaleTooLong {
            field: field.to_owned(),
            n_bytes: locale.len(),
            n_bytes_max: MAX_COLLATION_LOCALE_BYTES,
        });
    }
    // CLDR names the root collation `root`; BCP 47 calls it `und` (undetermined).
    if locale.eq_ignore_ascii_case("root") {
        return Ok(Locale::UNKNOWN);
    }
    Locale::try_from_str(locale).map_err(|error| ViewError::InvalidCollation {
        field: field.to_owned(),
        locale: locale.to_owned(),
        reason: format!("not a BCP 47 locale ({error:?})"),
    })
}

/// Keeps the first 16 bytes of a sort key, then stops ICU.
struct HeadSink {
    bytes: [u8; 16],
    n_bytes: usize,
}

/// The head is full: no more of the sort key is needed.
struct Full;

impl CollationKeySink for HeadSink {
    type Error = Full;
    type State = ();
    type Output = ();

    fn write(&mut self, _: &mut (), buf: &[u8]) -> Result<(), Full> {
        let n_taken = buf.len().min(self.bytes.len() - self.n_bytes);
        self.bytes[self.n_bytes..self.n_bytes + n_taken].copy_from_slice(&buf[..n_taken]);
        self.n_bytes += n_taken;
        if self.n_bytes == self.bytes.len() {
            Err(Full)
        } else {
            Ok(())
        }
    }

    fn finish(&mut self, _: ()) -> Result<(), Full> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(locale: &str, case_insensitive: bool, words: &[&str]) -> Vec<String> {
        let collation = Collation::new("name", locale, case_insensitive).expect("a valid locale");
        let mut words: Vec<String> = words.iter().map(|word| word.to_string()).collect();
        words.sort_by(|left, right| collation.compare(left, right));
        words
    }

    #[test]
    fn collation_orders_like_readers_of_the_language() {
        // French (root order): accents sort with their base letter, not after "z".
        assert_eq!(sorted("fr", false, &["Zoé", "Émile", "Eva", "Denis"]), ["Denis", "Émile", "Eva", "Zoé"]);
        assert_eq!(sorted("fr", false, &["cote", "côte", "coté", "côté"]), ["cote", "coté", "côte", "côté"]);
        // German: umlauts with their base letter; phonebook order reads "ä" as "ae".
        assert_eq!(sorted("de", false, &["Zeh", "Äpfel", "Apfel", "Bach"]), ["Apfel", "Äpfel", "Bach", "Zeh"]);
        assert_eq!(sorted("de-u-co-phonebk", false, &["Müller", "Muff", "Mueller"]), ["Mueller", "Müller", "Muff"]);
        // Swedish: å, ä, ö are letters of their own, after z.
        assert_eq!(sorted("sv", false, &["Öberg", "Zorn", "Åsa", "Olsson"]), ["Olsson", "Zorn", "Åsa", "Öberg"]);
        // ... while the root collation keeps them with a and o.
        assert_eq!(sorted("root", false, &["Öberg", "Zorn", "Åsa", "Olsson"]), ["Åsa", "Öberg", "Olsson", "Zorn"]);
        // Numeric ordering through the `kn` keyword.
        assert_eq!(sorted("en-u-kn", false, &["file10", "file9", "file100"]), ["file9", "file10", "file100"]);
    }

    #[test]
    fn collation_strength_follows_case_insensitive() {
        let tertiary = Collation::new("name", "fr", false).unwrap();
        let secondary = Collation::new("name", "fr", true).unwrap();
        assert_eq!(tertiary.compare("emile", "Emile"), Ordering::Less);
        assert_eq!(secondary.compare("emile", "Emile"), Ordering::Equal);
        // Accents still count when case does not.
        assert_eq!(secondary.compare("emile", "émile"), Ordering::Less);
        assert_eq!(secondary.sort_key_head("EMILE"), secondary.sort_key_head("emile"));
        // Decomposed and precomposed forms are one string to a collator.
        assert_eq!(tertiary.compare("e\u{301}mile", "émile"), Ordering::Equal);
        assert_eq!(tertiary.sort_key_head("e\u{301}mile"), tertiary.sort_key_head("émile"));
    }

    #[test]
    fn collation_locale_is_checked_and_canonical() {
        assert_eq!(canonical_collation_locale("root").unwrap(), "und");
        assert_eq!(canonical_collation_locale("und").unwrap(), "und");
        assert_eq!(canonical_collation_locale("FR-ca").unwrap(), "fr-CA");
        assert_eq!(canonical_collation_locale("de-u-co-phonebk").unwrap(), "de-u-co-phonebk");
        for bad in ["", "fr_FR", "français", "x", "-fr", "fr--ca"] {
            assert!(
                matches!(canonical_collation_locale(bad), Err(ViewError::InvalidCollation { .. })),
                "{bad:?} is refused"
            );
        }
    }

    #[test]
    fn collation_locale_length_limit_edge() {
        // `en-` and then private-use subtags of 8 letters: a valid tag of any length.
        let mut at_limit = String::from("en-x");
        while at_limit.len() + 9 <= MAX_COLLATION_LOCALE_BYTES {
            at_limit.push_str("-abcdefgh");
        }
        while at_limit.len() < MAX_COLLATION_LOCALE_BYTES {
            at_limit.push_str(if MAX_COLLATION_LOCALE_BYTES - at_limit.len() >= 2 { "-a" } else { "b" });
        }
        assert_eq!(at_limit.len(), MAX_COLLATION_LOCALE_BYTES);
        assert!(Collation::new("name", &at_limit, false).is_ok(), "{at_limit}");
        let over = format!("{at_limit}c");
        assert!(matches!(
            Collation::new("name", &over, false),
            Err(ViewError::CollationLocaleTooLong { n_bytes, .. }) if n_bytes == MAX_COLLATION_LOCALE_BYTES + 1
        ));
    }

    #[test]
    fn sort_key_head_stops_at_sixteen_bytes() {
        let collation = Collation::new("name", "root", false).unwrap();
        let long = "abcdefghijklmnopqrstuvwxyz".repeat(100);
        let head = collation.sort_key_head(&long);
        let mut full = Vec::new();
        let Ok(()) = collation.collator.write_sort_key_to(&long, &mut full);
        assert_eq!(head.to_be_bytes(), full[..16]);
        let short = collation.sort_key_head("a");
        let mut full = Vec::new();
        let Ok(()) = collation.collator.write_sort_key_to("a", &mut full);
        assert!(full.len() < 16);
        assert_eq!(short.to_be_bytes()[..full.len()], full[..]);
        assert!(short.to_be_bytes()[full.len()..].iter().all(|&byte| byte == 0));
    }
}
