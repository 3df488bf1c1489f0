//! PostgreSQL column types and the typed values Ordo keeps of them, parsed from
//! the text form both the initial copy and pgoutput send. Nothing is converted
//! with a loss: a value that has no exact image (a `numeric` with a fraction, a
//! `NaN` float) is refused, naming its column, instead of being rounded.
//!
//! Text forms are read as the server prints them under the session settings the
//! connection sets at start-up (`DateStyle=ISO`, `TimeZone=UTC`,
//! `extra_float_digits=3`): see [`crate::wire::SESSION_SETTINGS`].

use std::fmt;

/// A column type this source follows, by its PostgreSQL type OID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    Bool,
    /// `int2`, `int4`, `int8`.
    Int,
    /// `float4`, `float8`.
    Float,
    /// `numeric`: kept as an integer when the value is integral and fits in 64
    /// bits, refused otherwise.
    Numeric,
    /// `text`, `varchar`, `char(n)`, `name`.
    Text,
    /// `uuid`, kept as its canonical lower-case text.
    Uuid,
    /// `timestamp` (without time zone): microseconds since 1970-01-01 00:00, read as UTC.
    Timestamp,
    /// `timestamptz`: microseconds since the Unix epoch.
    TimestampTz,
    /// `date`: days since 1970-01-01.
    Date,
    /// `json`, `jsonb`: the document's text.
    Json,
}

impl ColumnType {
    /// The followed type of a PostgreSQL type OID; `None` for a type this source
    /// does not follow (the caller names the table and column in its error).
    pub fn from_oid(type_oid: u32) -> Option<ColumnType> {
        Some(match type_oid {
            16 => ColumnType::Bool,
            20 | 21 | 23 => ColumnType::Int,
            700 | 701 => ColumnType::Float,
            1700 => ColumnType::Numeric,
            19 | 25 | 1042 | 1043 => ColumnType::Text,
            2950 => ColumnType::Uuid,
            1114 => ColumnType::Timestamp,
            1184 => ColumnType::TimestampTz,
            1082 => ColumnType::Date,
            114 | 3802 => ColumnType::Json,
            _ => return None,
        })
    }
}

/// A column's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    /// Microseconds since the Unix epoch; `infinity` is `i64::MAX`, `-infinity` `i64::MIN`.
    TimestampMicros(i64),
    /// Days since 1970-01-01; `infinity` is `i32::MAX`, `-infinity` `i32::MIN`.
    DateDays(i32),
    Json(String),
}

/// A value whose text has no exact image in the column's Ordo type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueError {
    pub column_type: ColumnType,
    pub text: String,
    pub reason: &'static str,
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the {:?} value `{}` is refused: {}", self.column_type, self.text, self.reason)
    }
}

impl std::error::Error for ValueError {}

/// Parses the text form of a non-null value of `column_type`.
pub fn parse_value(column_type: ColumnType, text: &str) -> Result<Value, ValueError> {
    let refuse = |reason| ValueError { column_type, text: text.to_owned(), reason };
    match column_type {
        ColumnType::Bool => match text {
            "t" => Ok(Value::Bool(true)),
            "f" => Ok(Value::Bool(false)),
            _ => Err(refuse("not `t` or `f`")),
        },
        ColumnType::Int => text.parse().map(Value::Int).map_err(|_| refuse("not a 64-bit integer")),
        ColumnType::Float => parse_float(text).map(Value::Float).ok_or_else(|| refuse("NaN or not a float")),
        ColumnType::Numeric => {
            parse_integral_numeric(text).map(Value::Int).ok_or_else(|| refuse("not an integer within 64 bits"))
        }
        ColumnType::Text | ColumnType::Uuid => Ok(Value::Text(text.to_owned())),
        ColumnType::Json => Ok(Value::Json(text.to_owned())),
        ColumnType::Date => parse_date_days(text).map(Value::DateDays).ok_or_else(|| refuse("not an ISO date")),
        ColumnType::Timestamp | ColumnType::TimestampTz => {
            parse_timestamp_micros(text).map(Value::TimestampMicros).ok_or_else(|| refuse("not an ISO timestamp"))
        }
    }
}

fn parse_float(text: &str) -> Option<f64> {
    let value: f64 = match text {
        "Infinity" => f64::INFINITY,
        "-Infinity" => f64::NEG_INFINITY,
        _ => text.parse().ok()?,
    };
    (!value.is_nan()).then_some(value)
}

/// `-12`, `12.000` → the integer; `12.5`, `NaN`, `Infinity` or beyond i64 → `None`.
fn parse_integral_numeric(text: &str) -> Option<i64> {
    let (integral, fraction) = text.split_once('.').unwrap_or((text, ""));
    if !fraction.bytes().all(|digit| digit == b'0') {
        return None;
    }
    let digits = integral.strip_prefix('-').unwrap_or(integral);
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    integral.parse().ok()
}

const MICROS_PER_SECOND: i64 = 1_000_000;
const SECONDS_PER_DAY: i64 = 86_400;

/// `2024-02-29` (or `0044-03-15 BC`) → days since 1970-01-01.
fn parse_date_days(text: &str) -> Option<i32> {
    match text {
        "infinity" => return Some(i32::MAX),
        "-infinity" => return Some(i32::MIN),
        _ => {}
    }
    let (text, before_christ) = match text.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (text, false),
    };
    let mut parts = text.splitn(3, '-');
    let year: i64 = parts.next()?.parse().ok()?;
    let month: u32 = parts.next()?.parse().ok()?;
    let day: u32 = parts.next()?.parse().ok()?;
    // 1 BC is the astronomical year 0.
    let year = if before_christ { 1 - year } else { year };
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    i32::try_from(days_from_civil(year, month, day)).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// `2024-02-29 13:14:15.123456` with an optional `+HH`, `+HH:MM` or
/// `+HH:MM:SS` offset and an optional ` BC` → microseconds since the Unix epoch.
fn parse_timestamp_micros(text: &str) -> Option<i64> {
    match text {
        "infinity" => return Some(i64::MAX),
        "-infinity" => return Some(i64::MIN),
        _ => {}
    }
    let (text, era) = match text.strip_suffix(" BC") {
        Some(rest) => (rest, " BC"),
        None => (text, ""),
    };
    let (date, time) = text.split_once(' ')?;
    let days = i64::from(parse_date_days(&format!("{date}{era}"))?);
    let (clock, offset_seconds) = split_offset(time)?;
    let clock_micros = parse_clock_micros(clock)?;
    let local = days.checked_mul(SECONDS_PER_DAY * MICROS_PER_SECOND)?.checked_add(clock_micros)?;
    local.checked_sub(offset_seconds * MICROS_PER_SECOND)
}

/// `13:14:15.5+05:30` → (`13:14:15.5`, 19 800).
fn split_offset(time: &str) -> Option<(&str, i64)> {
    let Some(sign_at) = time.find(['+', '-']) else { return Some((time, 0)) };
    let (clock, offset) = time.split_at(sign_at);
    let sign = if offset.starts_with('-') { -1 } else { 1 };
    let mut seconds = 0;
    for (part, unit) in offset[1..].split(':').zip([3600, 60, 1]) {
        seconds += part.parse::<i64>().ok()? * unit;
    }
    Some((clock, sign * seconds))
}

/// `13:14:15.123` → microseconds since midnight.
fn parse_clock_micros(clock: &str) -> Option<i64> {
    let mut parts = clock.splitn(3, ':');
    let hours: i64 = parts.next()?.parse().ok()?;
    let minutes: i64 = parts.next()?.parse().ok()?;
    let seconds = parts.next()?;
    let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
    let whole: i64 = whole.parse().ok()?;
    if fraction.len() > 6 || !fraction.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let fraction_micros = format!("{fraction:0<6}").parse::<i64>().ok()?;
    Some(((hours * 60 + minutes) * 60 + whole) * MICROS_PER_SECOND + fraction_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_floats_and_bools_parse_exactly() {
        assert_eq!(parse_value(ColumnType::Int, "-9223372036854775808"), Ok(Value::Int(i64::MIN)));
        assert_eq!(parse_value(ColumnType::Bool, "t"), Ok(Value::Bool(true)));
        assert_eq!(parse_value(ColumnType::Float, "0.1"), Ok(Value::Float(0.1)));
        assert_eq!(parse_value(ColumnType::Float, "-Infinity"), Ok(Value::Float(f64::NEG_INFINITY)));
        assert!(parse_value(ColumnType::Float, "NaN").is_err());
    }

    #[test]
    fn a_numeric_is_kept_when_integral_and_refused_otherwise() {
        assert_eq!(parse_value(ColumnType::Numeric, "42"), Ok(Value::Int(42)));
        assert_eq!(parse_value(ColumnType::Numeric, "-42.000"), Ok(Value::Int(-42)));
        for refused in ["42.5", "NaN", "Infinity", "9223372036854775808", "-", ".5"] {
            assert!(parse_value(ColumnType::Numeric, refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn dates_are_days_since_the_unix_epoch() {
        assert_eq!(parse_date_days("1970-01-01"), Some(0));
        assert_eq!(parse_date_days("2000-03-01"), Some(11_017));
        assert_eq!(parse_date_days("1969-12-31"), Some(-1));
        // 0001-01-01 BC is the astronomical year 0, 366 days before 0001-01-01.
        assert_eq!(parse_date_days("0001-01-01 BC"), Some(parse_date_days("0001-01-01").unwrap() - 366));
        assert_eq!(parse_date_days("infinity"), Some(i32::MAX));
    }

    #[test]
    fn timestamps_are_microseconds_since_the_unix_epoch() {
        assert_eq!(parse_timestamp_micros("1970-01-01 00:00:00"), Some(0));
        assert_eq!(parse_timestamp_micros("1970-01-01 00:00:01.5"), Some(1_500_000));
        assert_eq!(parse_timestamp_micros("1970-01-01 00:00:00.000001+00"), Some(1));
        assert_eq!(parse_timestamp_micros("1970-01-01 05:30:00+05:30"), Some(0));
        assert_eq!(parse_timestamp_micros("1969-12-31 23:59:59-01"), Some(3_599_000_000));
        assert_eq!(parse_timestamp_micros("2000-01-01 00:00:00"), Some(946_684_800_000_000));
        assert_eq!(parse_timestamp_micros("-infinity"), Some(i64::MIN));
        assert!(parse_timestamp_micros("2000-01-01").is_none());
    }

    #[test]
    fn every_followed_oid_has_a_type_and_others_none() {
        assert_eq!(ColumnType::from_oid(23), Some(ColumnType::Int));
        assert_eq!(ColumnType::from_oid(3802), Some(ColumnType::Json));
        assert_eq!(ColumnType::from_oid(17), None, "bytea is not followed");
    }
}
