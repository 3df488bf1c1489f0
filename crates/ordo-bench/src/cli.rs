//! Value parsers the binaries' command lines share (for clap's `value_parser`):
//! counts may be written `1_000_000`, and every number has its range.

/// A count of at least 1, written with or without `_` between digits (`1_000_000`).
pub fn count(text: &str) -> Result<usize, String> {
    match text.replace('_', "").parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(value) => Ok(value),
        Err(_) => Err(format!("`{text}` is not a count")),
    }
}

/// A parser of a number within `low..=high`.
pub fn in_range<T>(low: T, high: T) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy + Send + Sync + 'static,
{
    move |text| {
        let value: T = text.replace('_', "").parse().map_err(|_| format!("`{text}` is not a valid number"))?;
        if value < low || value > high {
            return Err(format!("must be in {low}..={high}, not {value}"));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_ranges() {
        assert_eq!(count("1_000_000"), Ok(1_000_000));
        assert!(count("0").is_err() && count("many").is_err());
        let window = in_range(1usize, 1_000);
        assert_eq!(window("20"), Ok(20));
        assert!(window("0").is_err() && window("1001").is_err());
        assert_eq!(in_range(0.1, 10.0)("1.5"), Ok(1.5));
    }
}
