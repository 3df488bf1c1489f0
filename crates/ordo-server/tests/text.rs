//! Text as people expect it, over HTTP: collated sort keys, accent-insensitive and
//! normalization-blind `contains` / `prefix`, and the refusals of bad collations
//! with their documented codes, limits tested at their edges.

mod common;

use common::Server;
use serde_json::{json, Value};

fn code(answer: &Value) -> &str {
    answer["error"]["code"].as_str().unwrap_or_else(|| panic!("not an error: {answer}"))
}

fn ids(answer: &Value) -> Vec<String> {
    answer["items"].as_array().unwrap().iter().map(|item| item["id"].as_str().unwrap().to_owned()).collect()
}

/// People with a `name` and a `city`, ids spelled like the names they hold.
fn people_server(dir: &std::path::Path) -> Server {
    let server = Server::start(dir, &[]);
    server.ok(
        "PUT",
        "/v1/collections/people",
        json!({"fields": [{"name": "name", "type": "string"}, {"name": "city", "type": "string"}, {"name": "n", "type": "u64"}]}),
    );
    let people = [
        ("zorn", "Zorn"),
        ("oberg", "Öberg"),
        ("oberg-nfd", "O\u{308}berg"),
        ("olsson", "Olsson"),
        ("asa", "Åsa"),
        ("emile", "Émile"),
        ("emile-nfd", "E\u{301}mile"),
        ("eva", "Eva"),
        ("denis", "denis"),
    ];
    let ops: Vec<Value> = people
        .iter()
        .map(|(id, name)| json!({"op": "upsert", "id": id, "fields": {"name": name, "city": "Malmö", "n": 1}}))
        .collect();
    server.ok("POST", "/v1/collections/people/batch", json!({"ops": ops}));
    server
}

fn query(server: &Server, body: Value) -> Vec<String> {
    ids(&server.ok("POST", "/v1/collections/people/query", body))
}

#[test]
fn collated_sorts_and_accent_insensitive_filters_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let server = people_server(dir.path());
    // Swedish: Å and Ö after Z; canonically equivalent names tie, the id decides.
    let swedish = query(&server, json!({"limit": 20, "sort": [{"field": "name", "collation": "sv"}]}));
    assert_eq!(swedish, ["denis", "emile", "emile-nfd", "eva", "olsson", "zorn", "asa", "oberg", "oberg-nfd"]);
    // The root collation (and French, which uses it) keeps them with A and O.
    let root = query(&server, json!({"limit": 20, "sort": [{"field": "name", "collation": "root"}]}));
    assert_eq!(root, ["asa", "denis", "emile", "emile-nfd", "eva", "oberg", "oberg-nfd", "olsson", "zorn"]);
    let french_desc =
        query(&server, json!({"limit": 20, "sort": [{"field": "name", "dir": "desc", "collation": "FR"}]}));
    // Ties still go to the id, ascending, whatever the direction.
    assert_eq!(french_desc, ["zorn", "olsson", "oberg", "oberg-nfd", "eva", "emile", "emile-nfd", "denis", "asa"]);
    // Bytes, as before, without a collation: "d" after the capitals, a combining
    // mark after every ASCII letter, precomposed letters last.
    let bytes = query(&server, json!({"limit": 20, "sort": [{"field": "name"}]}));
    assert_eq!(bytes, ["eva", "emile-nfd", "olsson", "oberg-nfd", "zorn", "denis", "asa", "emile", "oberg"]);

    let by_id = json!([{"field": "n"}]);
    // Precomposed and decomposed match each other, with or without accents.
    let emile = query(&server, json!({"limit": 20, "sort": by_id, "filter": {"field": "name", "contains": "émi"}}));
    assert_eq!(emile, ["emile", "emile-nfd"]);
    let no_accent = json!({"field": "name", "prefix": "emi"});
    assert_eq!(query(&server, json!({"limit": 20, "sort": by_id, "filter": no_accent})), Vec::<String>::new());
    let accent_insensitive = json!({"field": "name", "prefix": "EMI", "accent_insensitive": true});
    assert_eq!(
        query(&server, json!({"limit": 20, "sort": by_id, "filter": accent_insensitive})),
        ["emile", "emile-nfd"]
    );
    let oe = json!({"field": "name", "contains": "OB", "accent_insensitive": true});
    assert_eq!(query(&server, json!({"limit": 20, "sort": by_id, "filter": oe})), ["oberg", "oberg-nfd"]);
    let explicit_false = json!({"field": "city", "contains": "malmo", "accent_insensitive": false});
    assert!(query(&server, json!({"limit": 20, "filter": explicit_false})).is_empty());
    server.stop();
}

#[test]
fn bad_collations_and_text_options_are_refused_with_their_codes() {
    let dir = tempfile::tempdir().unwrap();
    let server = people_server(dir.path());
    let refused = |body: Value| {
        let (status, answer) = server.http("POST", "/v1/collections/people/query", Some(&body));
        assert_eq!(status, 400, "{body}: {answer}");
        code(&answer).to_owned()
    };
    let sort = |keys: Value| json!({"limit": 5, "sort": keys});
    assert_eq!(refused(sort(json!([{"field": "name", "collation": "fr_FR"}]))), "invalid_view");
    assert_eq!(refused(sort(json!([{"field": "name", "collation": ""}]))), "invalid_view");
    assert_eq!(refused(sort(json!([{"field": "name", "collation": 7}]))), "bad_request");
    assert_eq!(refused(sort(json!([{"field": "n", "collation": "fr"}]))), "invalid_view");
    // Collated keys per view: at the limit, then one past it.
    let max_keys = ordo_core::limits::MAX_COLLATED_SORT_KEYS;
    assert_eq!(max_keys, 2, "the cases below list two, then three, string keys");
    let two = json!([{"field": "name", "collation": "sv"}, {"field": "city", "collation": "de"}]);
    server.ok("POST", "/v1/collections/people/query", sort(two));
    let three = json!([
        {"field": "name", "collation": "sv"},
        {"field": "city", "collation": "de"},
        {"field": "n", "collation": "fr"},
    ]);
    assert_eq!(refused(sort(three)), "limit_exceeded");
    // Locale length: at the limit (private-use subtags make any length valid), then past it.
    let max_bytes = ordo_core::limits::MAX_COLLATION_LOCALE_BYTES;
    let mut locale = String::from("sv-x");
    while locale.len() < max_bytes {
        locale.push_str(if max_bytes - locale.len() >= 2 { "-a" } else { "b" });
    }
    server.ok("POST", "/v1/collections/people/query", sort(json!([{"field": "name", "collation": locale}])));
    locale.push('c');
    assert_eq!(refused(sort(json!([{"field": "name", "collation": locale}]))), "limit_exceeded");
    // `accent_insensitive` takes a bool, and only on `contains` and `prefix`.
    let filter = |filter: Value| json!({"limit": 5, "filter": filter});
    let not_bool = json!({"field": "name", "contains": "e", "accent_insensitive": "yes"});
    assert_eq!(refused(filter(not_bool)), "invalid_view");
    let on_eq = json!({"field": "name", "op": "eq", "value": "e", "accent_insensitive": true});
    assert_eq!(refused(filter(on_eq)), "invalid_view");
    server.stop();
}
