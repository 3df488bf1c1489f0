//! Text tests of `contains` and `prefix` filters: case-insensitive, canonically
//! equivalent, and optionally accent-insensitive.
//!
//! Both the needle and the haystack are brought to one *search form*, and the test
//! is a substring or prefix test on those forms:
//!
//! - plain: `NFC(case_fold(NFD(text)))`. Two strings have one plain form exactly when
//!   they are canonical caseless matches (Unicode D145), so "É", "é" and "e" + U+0301
//!   are one letter, and "ß" matches "SS".
//! - accent-insensitive: `NFC(drop_marks(NFD(case_fold(NFD(text)))))`, where
//!   `drop_marks` removes every character of nonzero canonical combining class: the
//!   diacritics that canonical decomposition splits off ("É" → "E" + U+0301), so
//!   "emile" matches "Émile". Letters with no decomposition ("ø", "ł", "đ") keep
//!   their identity.
//!
//! The needle's form is computed once, when the filter is compiled. A haystack that
//! is ASCII is its own NFC and NFD form, so it is tested in place with an ASCII
//! case-insensitive comparison; only non-ASCII haystacks go through the normalizers:
//! `contains` writes the form into the caller's scratch buffer, `prefix` streams it.

use caseless::Caseless;
use icu_normalizer::properties::CanonicalCombiningClassMapBorrowed;
use icu_normalizer::{ComposingNormalizerBorrowed, DecomposingNormalizerBorrowed};

const NFD: DecomposingNormalizerBorrowed<'static> = DecomposingNormalizerBorrowed::new_nfd();
const NFC: ComposingNormalizerBorrowed<'static> = ComposingNormalizerBorrowed::new_nfc();
const COMBINING_CLASS: CanonicalCombiningClassMapBorrowed<'static> = CanonicalCombiningClassMapBorrowed::new();

/// A `contains` / `prefix` needle in its search form.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FoldedNeedle {
    folded: String,
    /// Whether `folded` is ASCII. A needle such as "ß" folds to ASCII ("ss"), and an
    /// accent-insensitive "é" to "e", so this is a property of the folded form, not
    /// of what the user typed.
    folded_is_ascii: bool,
    accent_insensitive: bool,
}

impl FoldedNeedle {
    pub(crate) fn new(needle: &str, accent_insensitive: bool) -> FoldedNeedle {
        let folded: String = search_form(needle, accent_insensitive).collect();
        FoldedNeedle { folded_is_ascii: folded.is_ascii(), folded, accent_insensitive }
    }
}

/// The search form of `text`, streamed one `char` at a time without allocating
/// (the normalizers buffer a run of combining marks inline).
pub(crate) fn search_form(text: &str, accent_insensitive: bool) -> impl Iterator<Item = char> + '_ {
    let folded = NFD.normalize_iter(text.chars()).default_case_fold();
    if accent_insensitive {
        let bare = NFD.normalize_iter(folded).filter(|&character| COMBINING_CLASS.get_u8(character) == 0);
        SearchForm::Bare(NFC.normalize_iter(bare))
    } else {
        SearchForm::Plain(NFC.normalize_iter(folded))
    }
}

/// One iterator type for both forms, so that callers need neither a box nor two copies.
enum SearchForm<Plain, Bare> {
    Plain(Plain),
    Bare(Bare),
}

impl<Plain: Iterator<Item = char>, Bare: Iterator<Item = char>> Iterator for SearchForm<Plain, Bare> {
    type Item = char;

    #[inline]
    fn next(&mut self) -> Option<char> {
        match self {
            SearchForm::Plain(chars) => chars.next(),
            SearchForm::Bare(chars) => chars.next(),
        }
    }
}

/// Whether the search form of `haystack` contains the needle's. `folded_haystack`
/// is the caller's buffer for a non-ASCII haystack's form; cleared, never shrunk.
pub(crate) fn contains_folded(haystack: &str, needle: &FoldedNeedle, folded_haystack: &mut String) -> bool {
    let needle_bytes = needle.folded.as_bytes();
    if needle_bytes.is_empty() {
        return true;
    }
    if haystack.is_ascii() {
        // An ASCII string folds to ASCII (only A-Z change) and has no marks to drop,
        // so it cannot contain a non-ASCII needle.
        if !needle.folded_is_ascii {
            return false;
        }
        // The needle is folded, hence lowercase: comparing it case-insensitively with
        // the raw haystack equals comparing it with the folded haystack.
        return haystack.as_bytes().windows(needle_bytes.len()).any(|window| window.eq_ignore_ascii_case(needle_bytes));
    }
    // A non-ASCII haystack may fold to something of another length ("ß" -> "ss", "İ" ->
    // "i̇"), so byte positions do not line up: fold it whole, into the reused buffer.
    folded_haystack.clear();
    folded_haystack.extend(search_form(haystack, needle.accent_insensitive));
    folded_haystack.contains(needle.folded.as_str())
}

/// Whether the search form of `haystack` starts with the needle's. Needs no buffer:
/// the haystack's form is streamed and compared with the needle one `char` at a time.
pub(crate) fn starts_with_folded(haystack: &str, needle: &FoldedNeedle) -> bool {
    let needle_bytes = needle.folded.as_bytes();
    if haystack.is_ascii() {
        if !needle.folded_is_ascii {
            return false;
        }
        return haystack
            .as_bytes()
            .get(..needle_bytes.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(needle_bytes));
    }
    let mut folded_haystack = search_form(haystack, needle.accent_insensitive);
    needle.folded.chars().all(|needle_char| folded_haystack.next() == Some(needle_char))
}

#[cfg(test)]
mod tests {
    use super::*;
    use unicode_normalization::char::canonical_combining_class;
    use unicode_normalization::UnicodeNormalization;

    /// The definition, naively, with another crate's normalizer: whole strings,
    /// NFD, fold, (NFD, drop marks,) NFC.
    fn reference_form(text: &str, accent_insensitive: bool) -> String {
        let folded = caseless::default_case_fold_str(&text.nfd().collect::<String>());
        if accent_insensitive {
            folded.nfd().filter(|&character| canonical_combining_class(character) == 0).nfc().collect()
        } else {
            folded.nfc().collect()
        }
    }

    const TEXTS: [&str; 22] = [
        "",
        "Émile",
        "E\u{301}mile",
        "émile zola",
        "EMILE",
        "Ærøskøbing",
        "Łódź",
        "L\u{301}odz",
        "Ångström",
        "A\u{30A}ngstro\u{308}m",
        "straße",
        "STRASSE",
        "İstanbul",
        "Việt Nam",
        "Vie\u{323}\u{302}t Nam",
        "Vie\u{302}\u{323}t Nam",
        "한국어",
        "\u{1112}\u{1161}\u{11AB}\u{1100}\u{116E}\u{11A8}",
        "ǅemal",
        "σίσυφος",
        "ΣΙΣΥΦΟΣ",
        "a\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}b",
    ];

    const NEEDLES: [&str; 20] = [
        "", "e", "é", "e\u{301}", "\u{301}", "emile", "ÉMILE", "lodz", "ł", "angstrom", "å", "ss", "ß", "viet", "việt",
        "ệ", "한", "하", "σισ", "ab",
    ];

    #[test]
    fn search_form_agrees_with_the_reference() {
        let mut buffer = String::new();
        for accent_insensitive in [false, true] {
            for text in TEXTS.iter().chain(&NEEDLES) {
                assert_eq!(
                    search_form(text, accent_insensitive).collect::<String>(),
                    reference_form(text, accent_insensitive),
                    "{text:?}, accent-insensitive: {accent_insensitive}"
                );
            }
            for needle in NEEDLES {
                let folded = FoldedNeedle::new(needle, accent_insensitive);
                let reference_needle = reference_form(needle, accent_insensitive);
                for text in TEXTS {
                    let reference_text = reference_form(text, accent_insensitive);
                    let context = format!("{text:?} and {needle:?}, accent-insensitive: {accent_insensitive}");
                    assert_eq!(
                        contains_folded(text, &folded, &mut buffer),
                        reference_text.contains(&reference_needle),
                        "contains: {context}"
                    );
                    assert_eq!(
                        starts_with_folded(text, &folded),
                        reference_text.starts_with(&reference_needle),
                        "prefix: {context}"
                    );
                }
            }
        }
    }

    #[test]
    fn search_form_examples() {
        let mut buffer = String::new();
        let contains = |text: &str, needle: &str, accent_insensitive: bool, buffer: &mut String| {
            contains_folded(text, &FoldedNeedle::new(needle, accent_insensitive), buffer)
        };
        // Decomposed and precomposed are one text, with or without accents.
        assert!(contains("E\u{301}mile", "émile", false, &mut buffer));
        assert!(contains("Émile", "e\u{301}m", false, &mut buffer));
        assert!(starts_with_folded("E\u{301}mile", &FoldedNeedle::new("É", false)));
        // Accents count unless told otherwise.
        assert!(!contains("Émile", "emile", false, &mut buffer));
        assert!(contains("Émile", "emile", true, &mut buffer));
        assert!(contains("emile", "Émile", true, &mut buffer));
        assert!(contains("Việt Nam", "viet", true, &mut buffer));
        assert!(starts_with_folded("Ångström", &FoldedNeedle::new("angst", true)));
        assert!(!starts_with_folded("Ångström", &FoldedNeedle::new("angst", false)));
        // No decomposition, no folding: "ł" stays itself.
        assert!(!contains("Łódź", "lodz", true, &mut buffer));
        assert!(contains("Łódź", "łodz", true, &mut buffer));
        // A lone mark is nothing once marks are dropped.
        assert!(contains("abc", "\u{301}", true, &mut buffer));
        assert!(!contains("abc", "\u{301}", false, &mut buffer));
        // Hangul stays whole syllables: "하" is not in "한" (it is "하" + "ㄴ").
        assert!(!contains("한국어", "하", true, &mut buffer));
        assert!(contains("\u{1112}\u{1161}\u{11AB}\u{1100}\u{116E}\u{11A8}", "한국", false, &mut buffer));
    }
}
