//! A WAL position, as PostgreSQL prints it (`16/B374D848`: the high and low 32
//! bits in hexadecimal) and sends it (a big-endian u64).

use std::fmt;

/// A position in PostgreSQL's write-ahead log. Ordered: a later position is greater.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// Parses `HIGH/LOW` (hexadecimal halves); `None` for anything else.
    pub fn parse(text: &str) -> Option<Lsn> {
        let (high, low) = text.split_once('/')?;
        let high = u32::from_str_radix(high, 16).ok()?;
        let low = u32::from_str_radix(low, 16).ok()?;
        Some(Lsn((u64::from(high) << 32) | u64::from(low)))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_lsn_round_trips_through_its_text() {
        for text in ["0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF", "0/1"] {
            assert_eq!(Lsn::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(Lsn::parse("1/0").unwrap().0, 1 << 32);
        assert!(Lsn::parse("1").is_none());
        assert!(Lsn::parse("x/1").is_none());
        assert!(Lsn::parse("100000000/0").is_none());
    }
}
