//! `Value::coerce_to` between numeric types: lossless or refused. Checked
//! against a naive reference that works in `i128` from the `f64`'s bits (no
//! float arithmetic, no `as` casts between floats and integers), on the edges
//! and on many generated values.

use ordo_core::{FieldType, Value};

use crate::reference::Rng;

/// The integer an `f64` is exactly, decoded from its bits; `None` when it is
/// not an integer (a fraction, NaN, ±∞) or is far past any `u64`/`i64`.
fn exact_integer_of(float: f64) -> Option<i128> {
    let bits = float.to_bits();
    let negative = bits >> 63 == 1;
    let exponent = ((bits >> 52) & 0x7ff) as i32;
    let fraction = (bits & ((1u64 << 52) - 1)) as i128;
    let magnitude = match exponent {
        0x7ff => return None,
        // Zero (either sign) or a subnormal, which is never an integer.
        0 => return (fraction == 0).then_some(0),
        _ => {
            let mantissa = fraction | (1i128 << 52);
            let shift = exponent - 1075;
            if shift >= 0 {
                if shift > 70 {
                    return None;
                }
                mantissa << shift
            } else {
                let shift = -shift;
                if shift > 60 || mantissa & ((1i128 << shift) - 1) != 0 {
                    return None;
                }
                mantissa >> shift
            }
        }
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// Whether an `f64` can be exactly `n`: its odd part needs at most 53 bits.
fn f64_can_hold(n: i128) -> bool {
    n == 0 || (n.unsigned_abs() >> n.trailing_zeros()) < (1u128 << 53)
}

/// What `coerce_to` must answer, as the integer it stands for (`None`: refused).
fn reference(value: Value<'_>, field_type: FieldType) -> Option<i128> {
    let number: i128 = match value {
        Value::I64(n) => n.into(),
        Value::U64(n) => n.into(),
        Value::F64(float) => exact_integer_of(float)?,
        _ => unreachable!("numbers only"),
    };
    let fits = match field_type {
        FieldType::I64 => (i128::from(i64::MIN)..=i128::from(i64::MAX)).contains(&number),
        FieldType::U64 => (0..=i128::from(u64::MAX)).contains(&number),
        FieldType::F64 => f64_can_hold(number),
        _ => unreachable!("numeric types only"),
    };
    fits.then_some(number)
}

/// The number a converted value stands for, exactly.
fn stands_for(value: Value<'_>) -> Option<i128> {
    match value {
        Value::I64(n) => Some(n.into()),
        Value::U64(n) => Some(n.into()),
        Value::F64(float) => exact_integer_of(float),
        _ => None,
    }
}

fn check(value: Value<'_>, field_type: FieldType) {
    let converted = value.coerce_to(field_type);
    // An f64 into an f64 field is kept as it is (fractions included): no conversion.
    if let (Value::F64(float), FieldType::F64) = (value, field_type) {
        assert_eq!(converted.map(|v| v.type_name()), Some("f64"), "{value:?}");
        assert!(matches!(converted, Some(Value::F64(kept)) if kept.to_bits() == float.to_bits() ));
        return;
    }
    let expected = reference(value, field_type);
    match (converted, expected) {
        (None, None) => {}
        (Some(converted), Some(expected)) => {
            assert_eq!(converted.type_name(), field_type.name(), "{value:?} into {field_type:?}");
            assert_eq!(stands_for(converted), Some(expected), "{value:?} into {field_type:?} gave {converted:?}");
        }
        (converted, expected) => {
            panic!("{value:?} into {field_type:?}: coerce_to gave {converted:?}, the reference {expected:?}")
        }
    }
}

const TYPES: [FieldType; 3] = [FieldType::I64, FieldType::U64, FieldType::F64];
const TWO_53: i64 = 1 << 53;

#[test]
fn the_edges_convert_exactly_or_not_at_all() {
    let i = |n: i64| Value::I64(n);
    let u = |n: u64| Value::U64(n);
    let f = |x: f64| Value::F64(x);
    // Integers into an f64 field: 2^53 fits, 2^53 + 1 does not, 2^53 + 2 does.
    assert_eq!(u(9_007_199_254_740_992).coerce_to(FieldType::F64), Some(f(9_007_199_254_740_992.0)));
    assert_eq!(u(9_007_199_254_740_993).coerce_to(FieldType::F64), None);
    assert_eq!(u(9_007_199_254_740_994).coerce_to(FieldType::F64), Some(f(9_007_199_254_740_994.0)));
    assert_eq!(i(-TWO_53 - 1).coerce_to(FieldType::F64), None);
    assert_eq!(i(-TWO_53).coerce_to(FieldType::F64), Some(f(-9_007_199_254_740_992.0)));
    assert_eq!(i(TWO_53 - 1).coerce_to(FieldType::F64), Some(f(9_007_199_254_740_991.0)));
    // i64::MIN is -2^63 (exact); i64::MAX and u64::MAX round up to a power of two.
    assert_eq!(i(i64::MIN).coerce_to(FieldType::F64), Some(f(-9_223_372_036_854_775_808.0)));
    assert_eq!(i(i64::MAX).coerce_to(FieldType::F64), None);
    assert_eq!(u(u64::MAX).coerce_to(FieldType::F64), None);
    assert_eq!(u(1 << 63).coerce_to(FieldType::F64), Some(f(9_223_372_036_854_775_808.0)));
    // Floats into integer fields: integers in range only.
    assert_eq!(f(1.0).coerce_to(FieldType::I64), Some(i(1)));
    assert_eq!(f(1.0).coerce_to(FieldType::U64), Some(u(1)));
    assert_eq!(f(1.5).coerce_to(FieldType::I64), None);
    assert_eq!(f(-1.0).coerce_to(FieldType::U64), None);
    assert_eq!(f(-1.0).coerce_to(FieldType::I64), Some(i(-1)));
    assert_eq!(f(9_223_372_036_854_775_808.0).coerce_to(FieldType::I64), None, "2^63 is past i64::MAX");
    assert_eq!(f(9_223_372_036_854_775_808.0).coerce_to(FieldType::U64), Some(u(1 << 63)));
    assert_eq!(f(-9_223_372_036_854_775_808.0).coerce_to(FieldType::I64), Some(i(i64::MIN)));
    assert_eq!(f(18_446_744_073_709_551_616.0).coerce_to(FieldType::U64), None, "2^64 is past u64::MAX");
    assert_eq!(f(1e308).coerce_to(FieldType::I64), None);
    assert_eq!(f(1e308).coerce_to(FieldType::U64), None);
    assert_eq!(f(1e308).coerce_to(FieldType::F64), Some(f(1e308)));
    assert_eq!(f(f64::NAN).coerce_to(FieldType::I64), None);
    assert_eq!(f(f64::INFINITY).coerce_to(FieldType::U64), None);
    assert_eq!(f(f64::NEG_INFINITY).coerce_to(FieldType::I64), None);
    assert_eq!(f(f64::MIN_POSITIVE / 2.0).coerce_to(FieldType::I64), None, "a subnormal");
    // ±0.0: the same number as 0 (an integer has no sign of zero to keep).
    for zero in [0.0, -0.0] {
        assert_eq!(f(zero).coerce_to(FieldType::I64), Some(i(0)));
        assert_eq!(f(zero).coerce_to(FieldType::U64), Some(u(0)));
    }
    // Between the integer types, as before.
    assert_eq!(i(-1).coerce_to(FieldType::U64), None);
    assert_eq!(u(i64::MAX as u64 + 1).coerce_to(FieldType::I64), None);
    assert_eq!(u(i64::MAX as u64).coerce_to(FieldType::I64), Some(i(i64::MAX)));
    // Every edge also agrees with the reference.
    let edges_i = [0, 1, -1, TWO_53 - 1, TWO_53, TWO_53 + 1, TWO_53 + 2, -TWO_53 - 1, i64::MIN, i64::MIN + 1, i64::MAX];
    let edges_u = [0, 1, 1 << 53, (1 << 53) + 1, 1 << 63, (1 << 63) + 1, u64::MAX, u64::MAX - 2047, u64::MAX - 2048];
    let edges_f = [0.0, -0.0, 1.0, 1.5, -1.0, 1e308, -1e308, 9_223_372_036_854_775_808.0, 18_446_744_073_709_551_616.0];
    for field_type in TYPES {
        edges_i.iter().for_each(|&n| check(i(n), field_type));
        edges_u.iter().for_each(|&n| check(u(n), field_type));
        edges_f.iter().for_each(|&x| check(f(x), field_type));
    }
}

#[test]
fn generated_numbers_agree_with_the_reference() {
    let mut rng = Rng(0x5eed_c0e7);
    for _ in 0..200_000 {
        // Raw bits hit every magnitude; a small odd part shifted left hits the
        // large integers an f64 holds exactly and their neighbours (± a little).
        let shifted = (rng.next_u64() >> rng.below(64)) << rng.below(64);
        let nudged = shifted.wrapping_add(rng.below(5) as u64).wrapping_sub(2);
        let raw = rng.next_u64();
        let value = match rng.below(6) {
            0 => Value::U64(raw),
            1 => Value::I64(raw as i64),
            2 => Value::U64(nudged),
            3 => Value::I64(nudged as i64),
            4 => Value::F64(f64::from_bits(raw)),
            // Integral floats near the type boundaries, and fractions among them.
            _ => Value::F64((nudged as i64) as f64 * if rng.chance(10) { 0.5 } else { 1.0 }),
        };
        for field_type in TYPES {
            check(value, field_type);
        }
    }
}
