//! Every followed column type through a real PostgreSQL: the initial copy and
//! the stream read the same value, and that value is the one PostgreSQL itself
//! computes (epoch microseconds and days by `extract` and date arithmetic, not
//! by the source's parser), with nothing rounded. The infinities PostgreSQL
//! allows (floats, dates, timestamps) cross too: a float as itself, a date or
//! timestamp as the documented bound of its integer.

use ordo_pgsource::Value;
use ordo_test_kit::postgres::PostgresServer;

use crate::harness::{follow, Row, PUBLICATION};

/// One row's values in SQL; the copied row has id `n`, the streamed one `n + 100`.
const ROWS: [&str; 4] = [
    "1.5, 0.1, 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '2026-12-07', '2026-12-07 23:59:59.123456', \
     '2026-12-07 12:00:00.000001+05:30', 'ab', 'héllo', '{\"b\": 1,  \"a\": [1, 2]}', '{\"b\": 1,  \"a\": [1, 2]}', \
     true, -42.000, -9223372036854775808",
    "-2.25, -1e300, '00000000-0000-0000-0000-000000000000', '0044-03-15 BC', '1900-01-01 00:00:00', \
     '1970-01-01 00:00:00+00', 'abcd', '', '[]', 'null', false, 0, 9223372036854775807",
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL",
    "'Infinity', '-Infinity', NULL, 'infinity', '-infinity', 'infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL",
];

/// The row of `ROWS` that is all NULLs.
const NULL_ROW: i32 = 3;

const COLUMNS: [&str; 13] = ["f4", "f8", "u", "d", "ts", "tz", "c", "vc", "j", "jb", "b", "n", "big"];

fn insert(id: i32, values: &str) -> String {
    format!("INSERT INTO typed VALUES ({id}, {values})")
}

/// What PostgreSQL says each value of row `id` is, in the units the source
/// documents (microseconds and days since the epoch, text as printed).
fn expected_row(server: &PostgresServer, id: i32) -> Row {
    let line = server
        .psql(&format!(
            "SELECT f4::float8::text, f8::text, u::text, \
             CASE WHEN isfinite(d) THEN (d - DATE '1970-01-01')::text ELSE d::text END, \
             CASE WHEN isfinite(ts) THEN (extract(epoch FROM ts) * 1000000)::int8::text ELSE ts::text END, \
             CASE WHEN isfinite(tz) THEN (extract(epoch FROM tz) * 1000000)::int8::text ELSE tz::text END, \
             c::text, coalesce(vc, '<null>'), j::text, jb::text, b::text, n::int8::text, big::text FROM typed WHERE id = {id}"
        ))
        .unwrap();
    let fields: Vec<&str> = line.split('|').collect();
    let text = |index: usize| fields[index].to_owned();
    let is_null = id % 100 == NULL_ROW;
    let mut row = Row::new();
    row.insert("id".into(), Value::Int(i64::from(id)));
    for (field, column) in COLUMNS.iter().enumerate() {
        // psql prints NULL as nothing, so varchar's NULL is told from '' by a marker.
        let value = if is_null || (fields[field].is_empty() && *column != "vc") || fields[field] == "<null>" {
            Value::Null
        } else {
            match *column {
                "f4" | "f8" => Value::Float(fields[field].parse().unwrap()),
                "u" | "vc" => Value::Text(text(field)),
                "d" => Value::DateDays(match fields[field] {
                    "infinity" => i32::MAX,
                    "-infinity" => i32::MIN,
                    days => days.parse().unwrap(),
                }),
                "ts" | "tz" => Value::TimestampMicros(match fields[field] {
                    "infinity" => i64::MAX,
                    "-infinity" => i64::MIN,
                    micros => micros.parse().unwrap(),
                }),
                // `c::text` drops char(4)'s padding, which the column's value has.
                "c" => Value::Text(format!("{:<4}", fields[field])),
                "j" | "jb" => Value::Json(text(field)),
                "b" => Value::Bool(fields[field] == "true"),
                _ => Value::Int(fields[field].parse().unwrap()),
            }
        };
        row.insert((*column).into(), value);
    }
    row
}

#[tokio::test(flavor = "current_thread")]
async fn every_followed_type_is_copied_and_streamed_as_the_value_postgres_holds() {
    let server = PostgresServer::start().unwrap();
    server
        .psql(&format!(
            "CREATE TABLE typed (id int4 PRIMARY KEY, f4 float4, f8 float8, u uuid, d date, ts timestamp, \
             tz timestamptz, c char(4), vc varchar(10), j json, jb jsonb, b bool, n numeric, big int8); \
             CREATE PUBLICATION {PUBLICATION} FOR TABLE typed;"
        ))
        .unwrap();
    for (n, values) in (1..).zip(ROWS) {
        server.psql(&insert(n, values)).unwrap();
    }
    let (mut stream, mut mirror, _) = follow(&server, &["typed"], 1000).await;
    for (n, values) in (1..).zip(ROWS) {
        server.psql(&insert(n + 100, values)).unwrap();
    }
    for _ in ROWS {
        mirror.apply(&stream.next_transaction().await.unwrap());
    }
    for n in 1..=ROWS.len() as i32 {
        for id in [n, n + 100] {
            let got = &mirror.tables[0][&id.to_string()];
            assert_eq!(got, &expected_row(&server, id), "row {id} ({})", if id > 100 { "streamed" } else { "copied" });
        }
    }
    // The canonical forms, spelt out: a uuid in lower case, char(n) padded,
    // json as sent and jsonb as PostgreSQL normalises it.
    let first = &mirror.tables[0]["101"];
    assert_eq!(first["u"], Value::Text("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".into()));
    assert_eq!(first["c"], Value::Text("ab  ".into()));
    assert_eq!(first["j"], Value::Json("{\"b\": 1,  \"a\": [1, 2]}".into()));
    assert_eq!(first["jb"], Value::Json("{\"a\": [1, 2], \"b\": 1}".into()));
    assert_eq!(first["tz"], Value::TimestampMicros(1_796_625_000_000_001));
    let infinities = &mirror.tables[0]["104"];
    assert_eq!(
        (&infinities["f4"], &infinities["f8"]),
        (&Value::Float(f64::INFINITY), &Value::Float(f64::NEG_INFINITY))
    );
    assert_eq!((&infinities["d"], &infinities["tz"]), (&Value::DateDays(i32::MAX), &Value::TimestampMicros(i64::MAX)));
    assert_eq!(infinities["ts"], Value::TimestampMicros(i64::MIN));
}
