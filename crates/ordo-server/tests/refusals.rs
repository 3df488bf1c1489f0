//! What a caller cannot reach through a refusal or a claim: no version or
//! state of a hidden item in a conflict, no probing or pinning of other
//! collections through a schema's `ref` targets, and no other user's
//! collection through a claim that carries a pattern's syntax.

mod common;

use common::{mint, write_secret, Server};
use serde_json::{json, Value};

/// A server with HS256 auth, signed in as an admin, under these rules.
fn start_with_rules(dir: &std::path::Path, rules: Value) -> (Server, std::path::PathBuf) {
    let secret_file = write_secret(dir);
    let mut server = Server::start(&dir.join("data"), &["--auth-secret-file", secret_file.to_str().unwrap()]);
    server.token = Some(mint(&secret_file, "ops", "admin", &[]));
    server.ok("PUT", "/v1/rules", rules);
    (server, secret_file)
}

/// Readers may write every note but read only their own.
fn start_with_hidden_notes(dir: &std::path::Path) -> (Server, std::path::PathBuf) {
    let (server, secret_file) = start_with_rules(
        dir,
        json!({"rules": [{"collection": "notes", "roles": ["reader"], "write": true,
            "read": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}}]}),
    );
    server.ok("PUT", "/v1/collections/notes", json!({"fields": [{"name": "owner", "type": "string"}]}));
    for _ in 0..3 {
        server.ok(
            "POST",
            "/v1/collections/notes/batch",
            json!({"ops": [{"op": "upsert", "id": "bobs", "fields": {"owner": "bob"}}]}),
        );
    }
    (server, secret_file)
}

fn conflict_message(answer: &Value, id: &str) -> String {
    assert_eq!(answer["error"]["code"], "conflict", "{answer}");
    answer["error"]["message"].as_str().unwrap().replace(id, "ID")
}

#[test]
fn a_conflict_on_a_hidden_item_says_no_more_than_one_on_a_missing_item() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret_file) = start_with_hidden_notes(dir.path());
    let alice = mint(&secret_file, "alice", "reader", &[]);
    let write = |id: &str, condition: Value| {
        let body = json!({"ops": [{"op": "upsert", "id": id, "if": condition, "fields": {"owner": "alice"}}]});
        let single = server.http_as(Some(&alice), "POST", "/v1/collections/notes/batch", Some(&body));
        let multi = server.http_as(
            Some(&alice),
            "POST",
            "/v1/batch",
            Some(&json!({"writes": [{"collection": "notes", "ops": body["ops"]}]})),
        );
        assert_eq!(single.0, 409, "{}", single.1);
        assert_eq!(multi.0, 409, "{}", multi.1);
        let multi_error = json!({"error": multi.1["results"][0]["error"]});
        assert_eq!(conflict_message(&single.1, id), conflict_message(&multi_error, id), "the same on every path");
        conflict_message(&single.1, id)
    };
    let version = server.http("GET", "/v1/collections/notes/items/bobs", None).1["version"].as_u64().unwrap();
    for condition in [json!({"version": 99}), json!({"version": version - 1}), json!({"exists": true})] {
        let hidden = if condition == json!({"exists": true}) { None } else { Some(write("bobs", condition.clone())) };
        let missing = write("nobody", condition.clone());
        assert!(!missing.contains("found"), "{missing}");
        if let Some(hidden) = hidden {
            assert_eq!(hidden, missing, "{condition}: a hidden item answers as a missing one");
        }
    }
    let hidden = write("bobs", json!({"exists": false}));
    assert!(!hidden.contains("version") && !hidden.contains("found"), "{hidden}");
    // An admin, who may read everything, is told what was found.
    let (status, answer) = server.http(
        "POST",
        "/v1/collections/notes/batch",
        Some(&json!({"ops": [{"op": "upsert", "id": "bobs", "if": {"version": 99}, "fields": {}}]})),
    );
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains(&format!("found {version}")), "{answer}");
    server.stop();
}

#[test]
fn a_readers_schema_neither_probes_nor_pins_collections_it_may_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret_file) = start_with_rules(
        dir.path(),
        json!({"rules": [{"collection": "lists/{sub}", "roles": ["reader"], "read": true, "create": true},
            {"collection": "rooms", "roles": ["reader"], "read": true}]}),
    );
    let plain = json!({"fields": [{"name": "title", "type": "string"}]});
    server.ok("PUT", "/v1/collections/lists%2Fbob", plain.clone());
    server.ok("PUT", "/v1/collections/rooms", plain);
    let alice = mint(&secret_file, "alice", "reader", &[]);
    let create_with_ref = |target: &str| {
        let schema = json!({"fields": [{"name": "r", "type": "ref", "target": target}]});
        server.http_as(Some(&alice), "PUT", "/v1/collections/lists%2Falice", Some(&schema))
    };
    let (status, missing) = create_with_ref("lists/nobody");
    assert_eq!((status, missing["error"]["code"].as_str()), (403, Some("forbidden")), "{missing}");
    let (status, existing) = create_with_ref("lists/bob");
    assert_eq!((status, existing["error"]["code"].as_str()), (403, Some("forbidden")), "{existing}");
    assert_eq!(
        missing["error"]["message"].as_str().unwrap().replace("nobody", "X"),
        existing["error"]["message"].as_str().unwrap().replace("bob", "X"),
        "the same answer whether the target exists or not"
    );
    // Bob's collection is not pinned: the admin drops it.
    let (status, answer) = server.http("DELETE", "/v1/collections/lists%2Fbob", None);
    assert_eq!(status, 200, "{answer}");
    // A collection the reader may read whole may be referenced.
    let (status, answer) = create_with_ref("rooms");
    assert_eq!(status, 201, "{answer}");
    server.stop();
}

fn hs256(secret_file: &std::path::Path, claims: Value) -> String {
    let secret = std::fs::read_to_string(secret_file).unwrap();
    let key = jsonwebtoken::EncodingKey::from_secret(secret.trim().as_bytes());
    jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256), &claims, &key).unwrap()
}

#[test]
fn a_claim_is_a_value_never_pattern_syntax() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret_file) = start_with_rules(
        dir.path(),
        json!({"rules": [{"collection": "lists/{sub}", "roles": ["reader"], "read": true},
            {"collection": "lists/{sub}/archive", "roles": ["reader"], "read": true},
            {"collection": "teams/{team}", "roles": ["reader"], "read": true}]}),
    );
    let plain = json!({"fields": [{"name": "title", "type": "string"}]});
    for name in ["lists%2Fbob%2Farchive", "teams%2Fred", "teams%2Fred%2Fx", "lists%2Fbob"] {
        server.ok("PUT", &format!("/v1/collections/{name}"), plain.clone());
    }
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 600;
    // A subject that would name someone else's collection is refused when the token is verified.
    let walker = hs256(&secret_file, json!({"sub": "bob/archive", "role": "reader", "exp": exp}));
    let (status, answer) = server.http_as(Some(&walker), "GET", "/v1/collections/lists%2Fbob%2Farchive", None);
    assert_eq!((status, answer["error"]["code"].as_str()), (401, Some("unauthorized")), "{answer}");
    assert_eq!(server.metric("ordo_auth_failures_total{reason=\"bad_subject\"}"), 1.0);
    // Any other claim outside the alphabet binds no pattern (and is counted).
    let red_slash = hs256(&secret_file, json!({"sub": "carol", "role": "reader", "exp": exp, "team": "red/x"}));
    let (status, answer) = server.http_as(Some(&red_slash), "GET", "/v1/collections/teams%2Fred%2Fx", None);
    assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{answer}");
    assert!(server.metric("ordo_claims_outside_alphabet_total") >= 1.0);
    // Subjects identity providers issue still work.
    for sub in ["@bob:example.org", "auth0|5f7c8ec7c33c6c004bbafe82", "bob.smith+x@example.org"] {
        let token = hs256(&secret_file, json!({"sub": sub, "role": "reader", "exp": exp, "team": "red"}));
        let (status, answer) = server.http_as(Some(&token), "GET", "/v1/collections/teams%2Fred", None);
        assert_eq!(status, 200, "{sub}: {answer}");
    }
    server.stop();
}
