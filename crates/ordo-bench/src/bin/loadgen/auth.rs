//! `--auth`: the run an authenticated deployment does. An admin installs access
//! rules, every subscriber connects under its own identity, the live writes carry
//! a writer token, and a request the rules must refuse is checked to be refused.

use std::sync::Arc;

use hyper::Method;
use ordo_bench::live::http::{HttpPool, HttpReply};
use ordo_bench::live::subscriber::preview;
use ordo_bench::live::wire::QueryReply;
use ordo_bench::live::Result;
use ordo_server::auth::Role;

use crate::options::Options;
use crate::report::count_failures;

/// Tokens minted by loadgen live this much longer than the write phase (set-up
/// of a million rooms and a thousand connections included).
const TOKEN_TTL_MARGIN_SECS: u64 = 3_600;

/// The HS256 secret of a run with `--auth`, and tokens minted with it as
/// `ordo token` mints them.
pub struct Auth {
    pub secret: Vec<u8>,
    ttl_secs: u64,
}

impl Auth {
    /// A fresh secret per server (or the one of `--auth-secret-file`); `None` without `--auth`.
    pub fn new(options: &Options) -> Result<Option<Arc<Auth>>> {
        if !options.auth {
            return Ok(None);
        }
        let secret = match &options.auth_secret_file {
            Some(path) => ordo_server::auth::read_secret_file(path)?,
            None => ordo_server::auth::generate_secret(),
        };
        Ok(Some(Arc::new(Auth { secret, ttl_secs: options.seconds.ceil() as u64 + TOKEN_TTL_MARGIN_SECS })))
    }

    pub fn token(&self, sub: &str, role: Role) -> Arc<str> {
        Arc::from(ordo_server::auth::mint(&self.secret, "role", sub, role, self.ttl_secs, &serde_json::Map::new()))
    }
}

/// One POST on a pooled connection, the connection returned to the pool.
pub async fn post_once(pool: &mut HttpPool, token: Option<Arc<str>>, path: &str, body: &str) -> Result<HttpReply> {
    let mut connection = pool.acquire().await;
    let reply = connection.request(Method::POST, path, body.as_bytes().to_vec(), token.as_deref()).await;
    let _ = pool.releaser().send(connection);
    reply
}

/// With `--auth`, a request the rules must refuse: `forbidden` (403) is
/// printed, anything else is a correctness failure (the rules would not be
/// what the run claims to measure).
pub async fn expect_forbidden(
    pool: &mut HttpPool,
    token: Option<Arc<str>>,
    what: &str,
    path: &str,
    body: &str,
) -> Result<()> {
    let reply = post_once(pool, token, path, body).await?;
    if reply.status == 403 {
        println!("  auth check: {what}: HTTP 403, refused as it must be");
    } else {
        count_failures(1);
        println!("  auth check FAILED: {what}: HTTP {} (expected 403): {}", reply.status, preview(&reply.body));
    }
    Ok(())
}

/// With `--auth` in chat-shared: a query the row predicate must leave empty.
pub async fn expect_no_rows(
    pool: &mut HttpPool,
    token: Option<Arc<str>>,
    what: &str,
    path: &str,
    body: &str,
) -> Result<()> {
    let reply = post_once(pool, token, path, body).await?;
    let items = serde_json::from_slice::<QueryReply>(&reply.body).map(|parsed| parsed.items.len());
    if reply.status == 200 && items.as_ref().is_ok_and(|&n| n == 0) {
        println!("  auth check: {what}: no rows, as it must be");
    } else {
        count_failures(1);
        println!(
            "  auth check FAILED: {what}: HTTP {} (expected 200, no items): {}",
            reply.status,
            preview(&reply.body)
        );
    }
    Ok(())
}

/// `PUT /v1/rules` as admin; connections of non-admins opened before would be
/// closed by it, so it comes before the subscribers connect.
pub async fn install_rules(pool: &mut HttpPool, rules: &str) -> Result<()> {
    pool.run_requests(1, |_| (Method::PUT, "/v1/rules".to_string(), rules.as_bytes().to_vec()), None).await?;
    Ok(())
}

/// With `--auth`: who sets up and checks (admin), who writes live (writer).
pub const ADMIN_SUB: &str = "loadgen-admin";
pub const WRITER_SUB: &str = "loadgen-writer";

/// With `--auth`: each chat user reads only its own collection; the writer
/// (a trusted backend) writes to every user's.
pub const CHAT_RULES: &str = r#"{"rules":[{"collection":"user-{sub}","roles":["reader"],"read":true},{"collection":"user-*","roles":["writer"],"write":true}]}"#;
/// chat-shared with `--auth`: a reader reads the rows it owns, whatever filter it sends.
pub const SHARED_RULES: &str = r#"{"rules":[{"collection":"rooms","roles":["reader"],"read":{"filter":{"field":"owner","op":"eq","value":"$sub"}}},{"collection":"rooms","roles":["writer"],"write":true}]}"#;
/// The flagship's rooms layout: a reader reads its own memberships, the rooms only
/// through them; the writer (the app's backend) writes rooms and memberships.
pub const FLAGSHIP_RULES: &str = r#"{"rules":[{"collection":"members","roles":["reader"],"read":{"filter":{"field":"owner","op":"eq","value":"$sub"}}},{"collection":"rooms","roles":["reader"],"read":{"through":"members.room"}},{"collection":"rooms","roles":["writer"],"write":true},{"collection":"members","roles":["writer"],"write":true}]}"#;
pub const LEADERBOARD_RULES: &str = r#"{"rules":[{"collection":"leaderboard","roles":["reader"],"read":true},{"collection":"leaderboard","roles":["writer"],"write":true}]}"#;
