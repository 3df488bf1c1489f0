//! Verified identity on a real server: every way a token can be wrong is refused
//! with `unauthorized`, counted by reason, and writes nothing; the WebSocket's
//! token life cycle (auth message, refresh, expiry, close 4401); `Host`,
//! `Origin` and CORS; sessions bound to their identity; the safe default.

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{mint, write_secret, Server};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

const KEYS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/keys");
const AUDIENCE: &str = "ordo-test";
const ISSUER: &str = "https://idp.test";

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

fn key_file(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(KEYS).join(name)).unwrap()
}

fn secret(dir: &Path) -> Vec<u8> {
    std::fs::read_to_string(dir.join("secret")).unwrap().trim().as_bytes().to_vec()
}

/// The claims of a token this server accepts.
fn good_claims() -> Value {
    json!({"sub": "ops", "role": "admin", "aud": AUDIENCE, "iss": ISSUER, "exp": now() + 600})
}

fn sign(algorithm: Algorithm, kid: Option<&str>, claims: &Value, key: &EncodingKey) -> String {
    let mut header = Header::new(algorithm);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

fn hs256(secret: &[u8], claims: &Value) -> String {
    sign(Algorithm::HS256, None, claims, &EncodingKey::from_secret(secret))
}

fn ed25519(file: &str, kid: &str, claims: &Value) -> String {
    sign(Algorithm::EdDSA, Some(kid), claims, &EncodingKey::from_ed_pem(&key_file(file)).unwrap())
}

fn b64(bytes: &[u8]) -> String {
    // base64url without padding, by hand: the test needs no crate for it.
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, byte)| n | (*byte as u32) << (16 - 8 * i));
        for i in 0..chunk.len() + 1 {
            out.push(TABLE[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// A token with this exact header and payload text, HS256-signed with `secret`.
fn raw_hs256(secret: &[u8], header: &str, payload: &[u8]) -> String {
    let message = format!("{}.{}", b64(header.as_bytes()), b64(payload));
    let signature =
        jsonwebtoken::crypto::sign(message.as_bytes(), &EncodingKey::from_secret(secret), Algorithm::HS256).unwrap();
    format!("{message}.{signature}")
}

fn start_with_auth(dir: &Path, extra: &[&str]) -> Server {
    let secret = write_secret(dir);
    let jwks = format!("{KEYS}/jwks.json");
    let mut args = vec![
        "--auth-secret-file",
        secret.to_str().unwrap(),
        "--auth-jwks",
        &jwks,
        "--auth-audience",
        AUDIENCE,
        "--auth-issuer",
        ISSUER,
    ];
    args.extend_from_slice(extra);
    Server::start(&dir.join("data"), &args)
}

/// A server with HS256 auth, signed in as an admin, and an empty `notes` collection.
fn start_with_notes(dir: &Path) -> (Server, std::path::PathBuf) {
    let secret_file = write_secret(dir);
    let mut server = Server::start(&dir.join("data"), &["--auth-secret-file", secret_file.to_str().unwrap()]);
    server.token = Some(mint(&secret_file, "ops", "admin", &[]));
    server.ok("PUT", "/v1/collections/notes", notes_schema());
    (server, secret_file)
}

fn notes_schema() -> Value {
    json!({"fields": [{"name": "owner", "type": "string"}, {"name": "score", "type": "i64"}]})
}

/// Rules letting `role` read and write only the notes it owns (`owner == $sub`).
fn own_notes_rules(role: &str) -> Value {
    let own = json!({"filter": {"field": "owner", "op": "eq", "value": "$sub"}});
    json!({"rules": [{"collection": "notes", "roles": [role], "read": own, "write": own}]})
}

fn write_one(server: &Server, token: Option<&str>, id: &str) -> (u16, Value) {
    let body = json!({"ops": [{"op": "upsert", "id": id, "fields": {"owner": "ops", "score": 1}}]});
    server.http_as(token, "POST", "/v1/collections/notes/batch", Some(&body))
}

fn failures(server: &Server, reason: &str) -> f64 {
    server.metric(&format!("ordo_auth_failures_total{{reason=\"{reason}\"}}"))
}

#[test]
fn every_bad_token_is_refused_with_its_reason_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_with_auth(dir.path(), &[]);
    let secret = secret(dir.path());
    let admin = hs256(&secret, &good_claims());
    server.token = Some(admin.clone());
    server.ok("PUT", "/v1/collections/notes", notes_schema());

    // Every accepted kind of key works.
    for (name, token) in [
        ("HS256", admin.clone()),
        ("EdDSA", ed25519("ed25519.pem", "ed-1", &good_claims())),
        (
            "RS256",
            sign(
                Algorithm::RS256,
                Some("rsa-1"),
                &good_claims(),
                &EncodingKey::from_rsa_pem(&key_file("rsa.pem")).unwrap(),
            ),
        ),
        (
            "ES256",
            sign(
                Algorithm::ES256,
                Some("ec-1"),
                &good_claims(),
                &EncodingKey::from_ec_pem(&key_file("p256.pem")).unwrap(),
            ),
        ),
    ] {
        let (status, answer) = write_one(&server, Some(&token), &format!("ok-{name}"));
        assert_eq!(status, 200, "{name}: {answer}");
    }

    let with = |changes: Value| {
        let mut claims = good_claims();
        for (key, value) in changes.as_object().unwrap() {
            if value.is_null() {
                claims.as_object_mut().unwrap().remove(key);
            } else {
                claims[key] = value.clone();
            }
        }
        claims
    };
    let rsa_public_pem = key_file("rsa-public.pem");
    let good = admin.clone();
    let cases: Vec<(&str, String, &str)> = vec![
        ("expired", hs256(&secret, &with(json!({"exp": now() - 120}))), "expired"),
        ("not yet valid", hs256(&secret, &with(json!({"nbf": now() + 600}))), "not_yet_valid"),
        ("wrong secret", hs256(b"another-secret-0123456789abcdef0123", &good_claims()), "bad_signature"),
        ("EdDSA from an unknown key", ed25519("ed25519-other.pem", "ed-1", &good_claims()), "bad_signature"),
        ("unknown key id", ed25519("ed25519.pem", "nope", &good_claims()), "unknown_key"),
        // `none` is no algorithm the token library knows: the header does not parse.
        (
            "alg none",
            format!("{}.{}.", b64(br#"{"alg":"none","typ":"JWT"}"#), b64(good_claims().to_string().as_bytes())),
            "malformed",
        ),
        // The attacker signs HS256 with the RSA public key as the HMAC secret: the
        // server checks HS256 only with its shared secret, never with a public key.
        (
            "HS256 keyed by the RSA public key",
            sign(Algorithm::HS256, Some("rsa-1"), &good_claims(), &EncodingKey::from_secret(&rsa_public_pem)),
            "bad_signature",
        ),
        (
            "RS256 header on an Ed25519 key",
            raw_hs256(&secret, r#"{"alg":"RS256","kid":"ed-1"}"#, good_claims().to_string().as_bytes()),
            "algorithm",
        ),
        ("wrong audience", hs256(&secret, &with(json!({"aud": "someone-else"}))), "wrong_audience"),
        ("no audience", hs256(&secret, &with(json!({"aud": null}))), "bad_claims"),
        ("wrong issuer", hs256(&secret, &with(json!({"iss": "https://evil.example"}))), "wrong_issuer"),
        ("no expiry", hs256(&secret, &with(json!({"exp": null}))), "bad_claims"),
        ("expiry as text", hs256(&secret, &with(json!({"exp": "tomorrow"}))), "bad_claims"),
        ("no subject", hs256(&secret, &with(json!({"sub": null}))), "bad_claims"),
        ("numeric subject", hs256(&secret, &with(json!({"sub": 42}))), "bad_claims"),
        ("unknown role", hs256(&secret, &with(json!({"role": "superuser"}))), "bad_claims"),
        // A signature cut short (to a whole base64 quantum, so it still decodes).
        ("truncated", good[..good.rfind('.').unwrap() + 5].to_owned(), "bad_signature"),
        ("two parts", good.rsplit_once('.').unwrap().0.to_owned(), "malformed"),
        ("oversized", hs256(&secret, &with(json!({"pad": "x".repeat(9000)}))), "too_large"),
        ("claims not JSON", raw_hs256(&secret, r#"{"alg":"HS256","typ":"JWT"}"#, b"not json at all"), "bad_claims"),
        ("claims a list", raw_hs256(&secret, r#"{"alg":"HS256","typ":"JWT"}"#, b"[1,2,3]"), "bad_claims"),
        ("garbage", "!!!.???.###".to_owned(), "malformed"),
    ];
    for (name, token, reason) in &cases {
        let reasons = ["malformed", "algorithm", "unknown_key", "bad_signature", "bad_claims", "too_large"];
        let before: Vec<f64> = reasons.iter().map(|reason| failures(&server, reason)).collect();
        let expected_before = failures(&server, reason);
        let (status, answer) = write_one(&server, Some(token), &format!("bad-{name}"));
        assert_eq!((status, answer["error"]["code"].as_str()), (401, Some("unauthorized")), "{name}: {answer}");
        let moved: Vec<&str> = reasons
            .iter()
            .zip(&before)
            .filter(|(reason, before)| failures(&server, reason) != **before)
            .map(|(reason, _)| *reason)
            .collect();
        assert_eq!(failures(&server, reason), expected_before + 1.0, "{name}: counted as {reason}, not {moved:?}");
        // The same token on a live WebSocket is refused too, and the connection stays unauthenticated.
    }
    let (status, answer) = write_one(&server, None, "bad-none");
    assert_eq!((status, answer["error"]["code"].as_str()), (401, Some("unauthorized")), "{answer}");
    let items = server.ok("GET", "/v1/collections/notes", json!(null))["items"].as_u64().unwrap();
    assert_eq!(items, 4, "only the four good writes landed");
    server.stop();

    // With public keys only, an HS256 token is refused for its algorithm,
    // whatever secret signed it (there is no secret to check it with).
    let dir = tempfile::tempdir().unwrap();
    let jwks = format!("{KEYS}/jwks.json");
    let server = Server::start(dir.path(), &["--auth-jwks", &jwks]);
    let token = sign(Algorithm::HS256, Some("rsa-1"), &good_claims(), &EncodingKey::from_secret(&rsa_public_pem));
    let (status, answer) = server.http_as(Some(&token), "GET", "/v1/collections", None);
    assert_eq!((status, answer["error"]["code"].as_str()), (401, Some("unauthorized")), "{answer}");
    let token = ed25519("ed25519.pem", "ed-1", &json!({"sub": "ops", "role": "admin", "exp": now() + 60}));
    assert_eq!(server.http_as(Some(&token), "GET", "/v1/collections", None).0, 200);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_authenticates_refreshes_and_is_closed_when_its_token_expires() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_with_auth(dir.path(), &["--auth-grace", "1", "--auth-timeout", "1"]);
    let secret = secret(dir.path());
    server.token = Some(hs256(&secret, &good_claims()));
    server.ok("PUT", "/v1/collections/notes", notes_schema());
    let claims_of =
        |sub: &str, exp: i64| json!({"sub": sub, "role": "reader", "aud": AUDIENCE, "iss": ISSUER, "exp": exp});

    // Before `auth`, nothing is done; a bad token is refused and changes nothing.
    let mut client = server.connect_as(None).await;
    let subscribe = json!({"op": "subscribe", "sub": "s", "collection": "notes", "limit": 5});
    client.send(subscribe.clone()).await;
    assert_eq!(client.expect_error().await["code"], "unauthorized");
    client.send(json!({"op": "auth", "token": "not.a.token"})).await;
    assert_eq!(client.expect_error().await["code"], "unauthorized");
    // No `auth` within the timeout: closed with 4401.
    let closed = client.read_until(Duration::from_secs(5), |c| c.frames.iter().any(|f| f["type"] == "close")).await;
    assert!(closed, "frames: {:?}", client.frames);
    assert_eq!(client.frames.last().unwrap()["code"], 4401);

    // A token valid for about two more seconds (inside the 30 s leeway), then a refresh.
    let mut client = server.connect_as(Some(&hs256(&secret, &claims_of("u1", now() - 28)))).await;
    let expired =
        client.read_until(Duration::from_secs(10), |c| c.frames.iter().any(|f| f["type"] == "auth_expired")).await;
    assert!(expired, "frames: {:?}", client.frames);
    client.send(json!({"op": "auth", "token": hs256(&secret, &claims_of("u1", now() + 600))})).await;
    let authed =
        client.read_until(Duration::from_secs(5), |c| c.frames.last().is_some_and(|f| f["type"] == "authed")).await;
    assert!(authed, "frames: {:?}", client.frames);
    // Another identity's token is refused on this connection; the old one stays.
    client.send(json!({"op": "auth", "token": hs256(&secret, &claims_of("u2", now() + 600))})).await;
    assert_eq!(client.expect_error().await["code"], "forbidden");
    tokio::time::sleep(Duration::from_secs(2)).await;
    client.send(json!({"op": "subscribe", "sub": "s", "collection": "notes", "limit": 5})).await;
    assert_eq!(client.expect_error().await["code"], "forbidden", "readers have no rule for notes yet");

    // Unrefreshed: `auth_expired`, then 4401 after the grace.
    let mut client = server.connect_as(Some(&hs256(&secret, &claims_of("u1", now() - 28)))).await;
    let closed = client.read_until(Duration::from_secs(10), |c| c.frames.iter().any(|f| f["type"] == "close")).await;
    assert!(closed, "frames: {:?}", client.frames);
    let kinds: Vec<&Value> = client.frames.iter().map(|f| &f["type"]).collect();
    assert_eq!(kinds[2..], [&json!("auth_expired"), &json!("close")], "{:?}", client.frames);
    assert_eq!(client.frames.last().unwrap()["code"], 4401);
    server.stop();
}

#[test]
fn host_origin_and_cors_protect_browsers() {
    let dir = tempfile::tempdir().unwrap();
    let secret = write_secret(dir.path());
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--auth-secret-file",
            secret.to_str().unwrap(),
            "--allow-origin",
            "https://app.example.org",
            "--allow-host",
            "ordo.example.org",
        ],
    );
    let admin = mint(&secret, "ops", "admin", &[]);
    let auth = format!("Authorization: Bearer {admin}\r\n");
    let status = |headers: &str, method: &str, path: &str, body: &[u8]| {
        let (status, answer) = server.http_with(method, path, &format!("{auth}{headers}"), Some(body));
        (status, String::from_utf8_lossy(&answer).into_owned())
    };
    let schema = notes_schema().to_string();
    assert_eq!(status("", "PUT", "/v1/collections/notes", schema.as_bytes()).0, 201);
    let write = br#"{"ops":[{"op":"upsert","id":"x","fields":{"owner":"a"}}]}"#;

    // DNS rebinding: a request for another host name is refused before anything else.
    let (code, body) = status("Host: evil.example\r\n", "POST", "/v1/collections/notes/batch", write);
    assert_eq!(code, 421, "{body}");
    assert!(body.contains("host_not_allowed"));
    assert_eq!(status("Host: ordo.example.org:7070\r\n", "GET", "/v1/limits", b"").0, 200);
    assert_eq!(status("Host: 10.1.2.3\r\n", "GET", "/v1/limits", b"").0, 200);
    // A cross-site `text/plain` POST (no preflight in a browser) is refused, and writes nothing.
    let (code, body) = status(
        "Origin: http://evil.example\r\nContent-Type: text/plain\r\n",
        "POST",
        "/v1/collections/notes/batch",
        write,
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("origin_not_allowed"));
    let items: Value = serde_json::from_str(&status("", "GET", "/v1/collections/notes", b"").1).unwrap();
    assert_eq!(items["items"], 0);
    // The allowed origin and the server's own may write.
    assert_eq!(status("Origin: https://app.example.org\r\n", "POST", "/v1/collections/notes/batch", write).0, 200);
    assert_eq!(status("Origin: http://localhost\r\n", "GET", "/v1/limits", b"").0, 200);

    // Preflights: answered with CORS headers for the allowed origin only.
    let preflight = |origin: &str| {
        let headers = format!(
            "Origin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization\r\n"
        );
        let (code, bytes) = server.http_with("OPTIONS", "/v1/collections/notes/batch", &headers, None);
        (code, String::from_utf8_lossy(&bytes).into_owned())
    };
    let raw = |origin: &str| {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        use std::io::{Read, Write};
        write!(
            stream,
            "OPTIONS /v1/collections/notes/batch HTTP/1.1\r\nHost: localhost\r\nOrigin: {origin}\r\n\
             Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response.to_ascii_lowercase()
    };
    assert_eq!(preflight("https://app.example.org").0, 200);
    let allowed = raw("https://app.example.org");
    assert!(allowed.contains("access-control-allow-origin: https://app.example.org"), "{allowed}");
    assert!(allowed.contains("authorization"), "{allowed}");
    let refused = raw("http://evil.example");
    assert!(!refused.contains("access-control-allow-origin"), "{refused}");

    // A WebSocket from another site is refused at the upgrade; from the allowed origin it opens.
    let upgrade = |origin: &str| {
        let headers = format!(
            "Origin: {origin}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        );
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        use std::io::{Read, Write};
        write!(stream, "GET /v1/ws HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n").unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buffer = [0u8; 256];
        let n = stream.read(&mut buffer).unwrap();
        String::from_utf8_lossy(&buffer[..n]).split(' ').nth(1).unwrap().to_owned()
    };
    assert_eq!(upgrade("http://evil.example"), "403");
    assert_eq!(upgrade("https://app.example.org"), "101");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_resumes_only_under_its_own_identity_and_its_token_changes_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret_file) = start_with_notes(dir.path());
    server.ok(
        "PUT",
        "/v1/rules",
        json!({"rules": [{"collection": "notes", "roles": ["reader"],
            "read": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}}]}),
    );
    let ops: Vec<Value> = (0..20)
        .map(|i| json!({"op": "upsert", "id": format!("n{i:02}"), "fields": {"owner": if i % 2 == 0 { "alice" } else { "bob" }, "score": i}}))
        .collect();
    server.ok("POST", "/v1/collections/notes/batch", json!({"ops": ops}));
    let alice = mint(&secret_file, "alice", "reader", &[]);
    let bob = mint(&secret_file, "bob", "reader", &[]);
    let sub = json!({"sub": "s", "collection": "notes", "sort": [{"field": "score", "dir": "desc"}], "limit": 5});

    let mut client = server.connect_as(Some(&alice)).await;
    let mut subscribe = sub.clone();
    subscribe["op"] = json!("subscribe");
    client.send(subscribe).await;
    assert!(client.read_until(Duration::from_secs(5), |c| c.lists.get("s").is_some_and(|l| l.seq == 1)).await);
    let alice_items = client.lists["s"].items.clone();
    assert!(alice_items.iter().all(|item| item["fields"]["owner"] == "alice"));
    let alice_session = client.session.clone();
    assert_eq!(alice_session.len(), 32, "128 random bits in hex");
    drop(client);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Bob presents Alice's session: treated as unknown, a reset with Bob's own items.
    let mut thief = server.connect_as(Some(&bob)).await;
    thief.lists.entry("s".to_owned()).or_default().seq = 1;
    let mut resume_entry = sub.clone();
    resume_entry["last_seq"] = json!(1);
    thief.send(json!({"op": "resume", "session": alice_session, "subs": [resume_entry.clone()]})).await;
    assert!(thief.read_until(Duration::from_secs(5), |c| c.lists.get("s").is_some_and(|l| l.seq == 2)).await);
    let resumed = thief.frames.iter().find(|f| f["type"] == "resumed").unwrap().clone();
    assert_eq!(resumed["subs"][0]["reset"], true, "{resumed}");
    assert!(thief.lists["s"].items.iter().all(|item| item["fields"]["owner"] == "bob"), "{:?}", thief.lists["s"]);

    // Alice's session is still hers: her resume replays (nothing missed), with a new token.
    let mut client = server.connect_as(Some(&alice)).await;
    client.lists.entry("s".to_owned()).or_default().seq = 1;
    client.send(json!({"op": "resume", "session": alice_session, "subs": [resume_entry.clone()]})).await;
    assert!(client.read_until(Duration::from_secs(5), |c| c.frames.iter().any(|f| f["type"] == "resumed")).await);
    let resumed = client.frames.iter().find(|f| f["type"] == "resumed").unwrap().clone();
    assert_eq!(resumed["subs"][0]["replayed"], 0, "{resumed}");
    let rotated = resumed["session"].as_str().unwrap().to_owned();
    assert_ne!(rotated, alice_session, "a resume issues a new session token");
    drop(client);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The old token is spent: presenting it again resets; the new one replays.
    let mut client = server.connect_as(Some(&alice)).await;
    client.lists.entry("s".to_owned()).or_default().seq = 1;
    client.send(json!({"op": "resume", "session": alice_session, "subs": [resume_entry.clone()]})).await;
    assert!(client.read_until(Duration::from_secs(5), |c| c.frames.iter().any(|f| f["type"] == "resumed")).await);
    let resumed = client.frames.iter().find(|f| f["type"] == "resumed").unwrap().clone();
    assert_eq!(resumed["subs"][0]["reset"], true, "{resumed}");
    drop(client);
    let mut client = server.connect_as(Some(&alice)).await;
    client.lists.entry("s".to_owned()).or_default().seq = 1;
    client.send(json!({"op": "resume", "session": rotated, "subs": [resume_entry]})).await;
    assert!(client.read_until(Duration::from_secs(5), |c| c.frames.iter().any(|f| f["type"] == "resumed")).await);
    let resumed = client.frames.iter().find(|f| f["type"] == "resumed").unwrap().clone();
    assert_eq!(resumed["subs"][0]["replayed"], 0, "{resumed}");
    server.stop();
}

#[test]
fn without_auth_the_server_stays_on_loopback_unless_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("refusing to listen on 0.0.0.0:0 without auth"), "{stderr}");

    // `--insecure` starts, and says so loudly.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(["serve", "--insecure", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() > 0, "ordo stopped");
    }
    // SAFETY: `kill` with a pid we own and a valid signal number.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let output = child.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&output.stderr).contains("WARNING: auth is off"));
}

#[test]
fn collection_creation_needs_a_rule_and_has_a_quota() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = write_secret(dir.path());
    let mut server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret_file.to_str().unwrap()]);
    let schema = notes_schema();
    let u1 = mint(&secret_file, "u1", "reader", &[]);
    let (status, answer) = server.http_as(Some(&u1), "PUT", "/v1/collections/anything", Some(&schema));
    assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{answer}");
    server.token = Some(mint(&secret_file, "ops", "admin", &[]));
    let (status, answer) = server.http("PUT", "/v1/collections/_ordo%2Frules", Some(&schema));
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "reserved even for admins: {answer}"
    );
    server.ok(
        "PUT",
        "/v1/rules",
        json!({"rules": [{"collection": "lists/{sub}", "roles": ["reader"], "read": true, "create": true},
                         {"collection": "scratch/*", "roles": ["writer"], "create": true}]}),
    );
    let (status, answer) = server.http_as(Some(&u1), "PUT", "/v1/collections/lists%2Fu2", Some(&schema));
    assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{answer}");
    let (status, answer) = server.http_as(Some(&u1), "PUT", "/v1/collections/lists%2Fu1", Some(&schema));
    assert_eq!(status, 201, "{answer}");
    // The rules survive a restart (they are stored with the data).
    let dir_data = server.dir.clone();
    server.stop();
    let server = Server::start(&dir_data, &["--auth-secret-file", secret_file.to_str().unwrap()]);
    let (status, answer) = server.http_as(Some(&u1), "GET", "/v1/collections/lists%2Fu1", None);
    assert_eq!(status, 200, "{answer}");
    // The quota: one identity creates at most 100 collections an hour.
    let backend = mint(&secret_file, "svc", "writer", &[]);
    let mut created = 0;
    loop {
        let path = format!("/v1/collections/scratch%2F{created}");
        let (status, answer) = server.http_as(Some(&backend), "PUT", &path, Some(&schema));
        if status != 201 {
            assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("limit_exceeded")), "{answer}");
            break;
        }
        created += 1;
        assert!(created <= 100, "no quota");
    }
    assert_eq!(created, 100);
    server.stop();
}

#[test]
fn a_write_rule_with_a_filter_keeps_writers_to_their_own_items() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret_file) = start_with_notes(dir.path());
    server.ok(
        "POST",
        "/v1/collections/notes/batch",
        json!({"ops": [{"op": "upsert", "id": "bobs", "fields": {"owner": "bob", "score": 1}}]}),
    );
    server.ok("PUT", "/v1/rules", own_notes_rules("writer"));
    let alice = mint(&secret_file, "alice", "writer", &[]);
    let write =
        |ops: Value| server.http_as(Some(&alice), "POST", "/v1/collections/notes/batch", Some(&json!({"ops": ops})));
    // Her own new item, then a change that keeps it hers: accepted.
    let (status, answer) = write(json!([{"op": "upsert", "id": "a1", "fields": {"owner": "alice", "score": 5}}]));
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = write(json!([{"op": "upsert", "id": "a1", "fields": {"score": 6}}]));
    assert_eq!(status, 200, "{answer}");
    // Each of these would write outside her rule: refused whole, nothing written.
    for (what, ops) in [
        ("an item for someone else", json!([{"op": "upsert", "id": "a2", "fields": {"owner": "bob", "score": 1}}])),
        ("an item with no owner", json!([{"op": "upsert", "id": "a3", "fields": {"score": 1}}])),
        ("giving her item away", json!([{"op": "upsert", "id": "a1", "fields": {"owner": "bob"}}])),
        ("overwriting Bob's item", json!([{"op": "upsert", "id": "bobs", "fields": {"owner": "alice", "score": 9}}])),
        ("removing Bob's item", json!([{"op": "remove", "id": "bobs"}])),
        (
            "a good op then a bad one",
            json!([{"op": "upsert", "id": "a4", "fields": {"owner": "alice"}},
                                           {"op": "remove", "id": "bobs"}]),
        ),
    ] {
        let (status, answer) = write(ops);
        assert_eq!((status, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{what}: {answer}");
    }
    // The rule holds over the batch's own earlier ops, not only the committed items.
    let (status, answer) =
        write(json!([{"op": "remove", "id": "a1"}, {"op": "upsert", "id": "a1", "fields": {"score": 1}}]));
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "removed, then written again without an owner: {answer}"
    );
    let (status, answer) = write(json!([{"op": "upsert", "id": "a5", "fields": {"owner": "alice", "score": 1}},
        {"op": "upsert", "id": "a5", "fields": {"score": 2}}, {"op": "upsert", "id": "a5", "increment": {"score": 1}}]));
    assert_eq!(status, 200, "created, then changed in the same batch: {answer}");
    // Across the parts of one request: the second part would be checked against
    // the committed `a5`, but applied after the first part removed it.
    let (status, answer) = server.http_as(
        Some(&alice),
        "POST",
        "/v1/batch",
        Some(&json!({"writes": [{"collection": "notes", "ops": [{"op": "remove", "id": "a5"}]},
            {"collection": "notes", "ops": [{"op": "upsert", "id": "a5", "fields": {"score": 7}}]}]})),
    );
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["results"][1]["error"]["code"], "forbidden", "{answer}");
    let (status, answer) = server.http_as(Some(&alice), "DELETE", "/v1/collections/notes/items/bobs", None);
    assert_eq!(status, 403, "{answer}");
    let all = server.ok("POST", "/v1/collections/notes/query", json!({"limit": 10}));
    let ids: Vec<&str> = all["items"].as_array().unwrap().iter().map(|item| item["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a1", "bobs"], "{all}");
    assert_eq!(all["items"][1]["fields"], json!({"owner": "bob", "score": 1}));
    assert_eq!(all["items"][0]["fields"], json!({"owner": "alice", "score": 6}));
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_is_limited_per_identity_not_only_per_connection() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = write_secret(dir.path());
    let server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret_file.to_str().unwrap()]);
    let reader = mint(&secret_file, "u1", "reader", &[]);
    // Connections: 32 at once, the 33rd refused; another identity is not affected.
    let mut clients = Vec::new();
    for _ in 0..32 {
        clients.push(server.connect_as(Some(&reader)).await);
    }
    let mut extra = server.connect_as(None).await;
    extra.send(json!({"op": "auth", "token": reader})).await;
    let error = extra.expect_error().await;
    assert_eq!(error["code"], "limit_exceeded", "{error}");
    let other = mint(&secret_file, "u2", "reader", &[]);
    let _other = server.connect_as(Some(&other)).await;
    drop(clients.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _again = server.connect_as(Some(&reader)).await;
    drop(clients);

    // Requests: a burst of 400 over all of the identity's connections, then 200 a
    // second; past that each request is refused with `rate_limited`.
    let started = std::time::Instant::now();
    let (mut accepted, mut refused) = (0u32, 0u32);
    while refused < 50 && started.elapsed() < Duration::from_secs(20) {
        match server.http_as(Some(&reader), "GET", "/v1/collections", None) {
            (200, _) => accepted += 1,
            (429, answer) => {
                assert_eq!(answer["error"]["code"], "rate_limited", "{answer}");
                refused += 1;
            }
            (status, answer) => panic!("{status} {answer}"),
        }
    }
    let allowed = 400.0 + 200.0 * started.elapsed().as_secs_f64();
    assert!(refused >= 50, "nothing refused in 20 s ({accepted} accepted)");
    assert!(f64::from(accepted) <= allowed + 5.0, "{accepted} accepted; the budget allowed {allowed:.0}");
    let (status, _) = server.http_as(Some(&other), "GET", "/v1/collections", None);
    assert_eq!(status, 200, "another identity has its own budget");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_change_closes_readers_connections_before_they_get_another_frame() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret_file) = start_with_notes(dir.path());
    let everything = json!({"rules": [{"collection": "notes", "roles": ["reader"], "read": true}]});
    server.ok("PUT", "/v1/rules", everything);
    let reader = mint(&secret_file, "alice", "reader", &[]);
    let mut client = server.connect_as(Some(&reader)).await;
    let mut admin = server.connect().await;
    for (client, sub) in [(&mut client, "s"), (&mut admin, "a")] {
        client.send(json!({"op": "subscribe", "sub": sub, "collection": "notes", "limit": 10})).await;
        assert!(client.read_until(Duration::from_secs(5), |c| c.lists.get(sub).is_some_and(|l| l.seq == 1)).await);
    }
    // Now only her own rows: the next write must not reach her under the old rule.
    let own = json!({"rules": [{"collection": "notes", "roles": ["reader"],
        "read": {"filter": {"field": "owner", "op": "eq", "value": "$sub"}}}]});
    server.ok("PUT", "/v1/rules", own);
    server.ok(
        "POST",
        "/v1/collections/notes/batch",
        json!({"ops": [{"op": "upsert", "id": "b1", "fields": {"owner": "bob"}}]}),
    );
    let closed = client.read_until(Duration::from_secs(5), |c| c.frames.iter().any(|f| f["type"] == "close")).await;
    assert!(closed, "frames: {:?}", client.frames);
    assert_eq!(client.frames.last().unwrap()["code"], 4403);
    assert_eq!(client.lists["s"].seq, 1, "no frame after the change: {:?}", client.lists["s"]);
    // An admin's connection carries on.
    assert!(admin.read_until(Duration::from_secs(5), |c| c.lists["a"].seq == 2).await);
    server.stop();
}

#[test]
fn a_token_verified_once_is_not_accepted_past_its_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_auth(dir.path(), &[]);
    let secret = secret(dir.path());
    // Valid for about two more seconds (inside the 30 s leeway): verified, then remembered.
    let exp = now() - 28;
    let claims = json!({"sub": "ops", "role": "admin", "aud": AUDIENCE, "iss": ISSUER, "exp": exp});
    let token = hs256(&secret, &claims);
    for _ in 0..3 {
        assert_eq!(server.http_as(Some(&token), "GET", "/v1/collections", None).0, 200);
    }
    // Asked again until it is refused, instead of sleeping past the expiry and hoping:
    // the server checks whole seconds, so a refusal is right once its clock is past
    // `exp` plus the leeway, which it is by the time the answer is back.
    let last_valid_second = exp + ordo_server::limits::TOKEN_LEEWAY_SECS as i64;
    let (status, answer) = loop {
        let (status, answer) = server.http_as(Some(&token), "GET", "/v1/collections", None);
        let answered_at = now();
        if status != 200 {
            assert!(answered_at > last_valid_second, "refused while still valid: {answer}");
            break (status, answer);
        }
        assert!(
            answered_at <= last_valid_second + 5,
            "still accepted {} s past its expiry",
            answered_at - last_valid_second
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!((status, answer["error"]["code"].as_str()), (401, Some("unauthorized")), "{answer}");
    server.stop();
}

/// A key given twice in one object has no one meaning: a rule check reading one
/// value and the write keeping the other would let a reader plant an item in
/// another user's view. Refused whole (`bad_json`), on both write routes,
/// however the key is spelled; nothing is written.
#[test]
fn a_repeated_key_cannot_take_a_write_past_its_rule() {
    let dir = tempfile::tempdir().unwrap();
    let (server, secret_file) = start_with_notes(dir.path());
    server.ok("PUT", "/v1/rules", own_notes_rules("reader"));
    let alice = mint(&secret_file, "alice", "reader", &[]);
    let auth = format!("Authorization: Bearer {alice}\r\n");
    let planted = r#"{"op":"upsert","id":"planted-1","fields":{"owner":"alice","owner":"bob","score":1}}"#;
    let escaped = r#"{"op":"upsert","id":"planted-2","fields":{"owner":"alice","own\u0065r":"bob"}}"#;
    for op in [planted, escaped] {
        let body = format!(r#"{{"ops":[{op}]}}"#);
        let (status, answer) = server.http_with("POST", "/v1/collections/notes/batch", &auth, Some(body.as_bytes()));
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("bad_json")), "{op}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains("`owner`"), "{answer}");
        let body = format!(r#"{{"writes":[{{"collection":"notes","ops":[{op}]}}]}}"#);
        let (status, answer) = server.http_with("POST", "/v1/batch", &auth, Some(body.as_bytes()));
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!((status, answer["results"][0]["error"]["code"].as_str()), (422, Some("bad_json")), "{answer}");
    }
    // Bob's view, and the admin's, are as they were: empty.
    let bob = mint(&secret_file, "bob", "reader", &[]);
    let (status, answer) =
        server.http_as(Some(&bob), "POST", "/v1/collections/notes/query", Some(&json!({"limit": 10})));
    assert_eq!((status, answer["total"].as_u64()), (200, Some(0)), "{answer}");
    let all = server.ok("POST", "/v1/collections/notes/query", json!({"limit": 10}));
    assert_eq!(all["total"], 0, "{all}");
    server.stop();
}

/// A token whose claims repeat a key (`role` as `reader`, then `admin`) is
/// refused (`bad_claims`), whichever copy a reader of the claims would keep.
#[test]
fn a_token_naming_a_claim_twice_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_with_auth(dir.path(), &[]);
    let secret = secret(dir.path());
    let header = r#"{"alg":"HS256","typ":"JWT"}"#;
    let claims =
        |role: &str| format!(r#"{{"sub":"alice",{role},"aud":"{AUDIENCE}","iss":"{ISSUER}","exp":{}}}"#, now() + 600);
    let once = raw_hs256(&secret, header, claims(r#""role":"admin""#).as_bytes());
    let (status, answer) = server.http_as(Some(&once), "GET", "/v1/rules", None);
    assert_eq!(status, 200, "the same claims, each once, are accepted: {answer}");
    for role in [r#""role":"reader","role":"admin""#, r#""role":"admin","ext":{"a":1,"a":2}"#] {
        let token = raw_hs256(&secret, header, claims(role).as_bytes());
        let (status, answer) = server.http_as(Some(&token), "GET", "/v1/rules", None);
        assert_eq!((status, answer["error"]["code"].as_str()), (401, Some("unauthorized")), "{role}: {answer}");
    }
    server.token = Some(once);
    assert_eq!(failures(&server, "bad_claims"), 2.0);
    server.stop();
}

/// Two copies of a header the server reads (`Host`, `Origin`, `Authorization`)
/// could be read one way by the gate and another by whatever reads it next:
/// the request is refused (`400 bad_request`).
#[test]
fn a_request_repeating_a_header_the_server_reads_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = write_secret(dir.path());
    let server = Server::start(&dir.path().join("data"), &["--auth-secret-file", secret_file.to_str().unwrap()]);
    let admin = mint(&secret_file, "ops", "admin", &[]);
    let auth = format!("Authorization: Bearer {admin}\r\n");
    let (status, answer) = server.http_with("GET", "/v1/rules", &format!("Host: localhost\r\n{auth}"), None);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    for headers in [
        format!("Host: localhost\r\nHost: evil.example\r\n{auth}"),
        format!("Host: localhost\r\nHost: localhost\r\n{auth}"),
        format!("Host: localhost\r\nOrigin: http://localhost\r\nOrigin: https://evil.example\r\n{auth}"),
        format!("Host: localhost\r\n{auth}Authorization: Bearer x\r\n"),
    ] {
        let (status, answer) = server.http_with("GET", "/v1/rules", &headers, None);
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("bad_request")), "{headers}: {answer}");
    }
    server.stop();
}
