//! The server's gate: who is calling (a verified token, or everyone an admin
//! when auth is off), from where (`Host` and `Origin` checks against DNS
//! rebinding and cross-site requests), and how much each identity may take
//! (connections, request rate, collection creation). Rules live in `rules`;
//! this module holds the state shared by every network task.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::auth::{AuthFailure, Identity, Role, Verifier};
use crate::error::{ApiError, ErrorCode};
use crate::limits;
use crate::metrics::{self, METRICS};
use crate::rate_limit::TokenBucket;
use crate::routing::{is_reserved_name, CollectionEntry, Routes};
use crate::rules::{Action, Grant, RuleSet, SharedRules};
use crate::write_rules::WriteGrant;

/// Who may reach the server and from where; built at start.
pub struct Gate {
    /// `None`: auth is off and every caller is an admin (`ordo serve` without auth options).
    verifier: Option<Verifier>,
    pub rules: SharedRules,
    /// Host names (besides IP literals and `localhost`) requests may be addressed to.
    allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) allowed to call from a browser, besides the server's own.
    allowed_origins: Vec<String>,
    identities: Mutex<HashMap<Arc<str>, IdentityUse>>,
    /// Tokens verified recently, so that a backend sending the same token with
    /// every write pays for the signature once (HS256 ~5 µs, EdDSA ~60 µs), not
    /// per request. Keyed by the whole token; an entry is used only until its
    /// token expires.
    verified: Mutex<HashMap<Box<str>, Arc<Identity>>>,
    /// Raised by a rules change: live connections of non-admins close so that
    /// their views are rebuilt under the new rules when they come back. An atomic
    /// each connection reads before handling anything (a watch channel would put
    /// every connection's event loop through one shared waiter list).
    rules_version: AtomicU64,
    anonymous: Arc<Identity>,
    /// WebSockets that have no identity yet (their token is to come in an `auth`
    /// message), at most `max_unauthenticated`: see `wait_for_auth`.
    waiting_for_auth: Mutex<WaitingRoom>,
    max_unauthenticated: AtomicUsize,
}

/// Sockets waiting for their `auth`, oldest first, each with the signal that closes it.
#[derive(Default)]
struct WaitingRoom {
    next_id: u64,
    waiting: BTreeMap<u64, oneshot::Sender<()>>,
}

/// What one identity is using right now.
struct IdentityUse {
    connections: usize,
    requests: TokenBucket,
    created_this_hour: u32,
    hour_started: Instant,
}

impl IdentityUse {
    fn new() -> IdentityUse {
        IdentityUse {
            connections: 0,
            requests: TokenBucket::new(limits::IDENTITY_REQUESTS_PER_SECOND, limits::IDENTITY_REQUEST_BURST),
            created_this_hour: 0,
            hour_started: Instant::now(),
        }
    }
}

/// Holds one of an identity's connection slots, or, for a WebSocket without an
/// identity yet, its place among those waiting for `auth`; gives it back when dropped.
pub struct ConnectionSlot {
    gate: Arc<Gate>,
    key: Option<Arc<str>>,
    /// The place among the sockets waiting for `auth`, and the signal that this
    /// one must close to make room for a newer one.
    waiting: Option<(u64, oneshot::Receiver<()>)>,
}

impl ConnectionSlot {
    fn new(gate: &Arc<Gate>, key: Option<Arc<str>>) -> ConnectionSlot {
        ConnectionSlot { gate: gate.clone(), key, waiting: None }
    }

    /// Resolves when this socket, still waiting for `auth`, must close to make
    /// room (never for a slot of an identity).
    pub async fn evicted(&mut self) {
        match &mut self.waiting {
            Some((_, evicted)) => {
                let _ = evicted.await;
                self.waiting = None;
            }
            None => std::future::pending().await,
        }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if let Some((id, _)) = &self.waiting {
            self.gate.waiting_for_auth.lock().expect("waiting room lock").waiting.remove(id);
        }
        if let Some(key) = &self.key {
            let mut identities = self.gate.identities.lock().expect("identities lock");
            if let Some(usage) = identities.get_mut(key) {
                usage.connections = usage.connections.saturating_sub(1);
            }
        }
    }
}

impl Gate {
    pub fn new(
        verifier: Option<Verifier>,
        rules: RuleSet,
        allowed_hosts: Vec<String>,
        allowed_origins: Vec<String>,
    ) -> Gate {
        Gate {
            verifier,
            rules: Arc::new(RwLock::new(Arc::new(rules))),
            allowed_hosts: allowed_hosts.into_iter().map(|host| host.to_ascii_lowercase()).collect(),
            allowed_origins: allowed_origins
                .into_iter()
                .map(|origin| origin.trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            identities: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
            rules_version: AtomicU64::new(0),
            anonymous: Arc::new(Identity::anonymous_admin()),
            waiting_for_auth: Mutex::new(WaitingRoom::default()),
            // Until `serve` sets the share of the connection cap in force.
            max_unauthenticated: AtomicUsize::new(limits::MIN_UNAUTHENTICATED_CONNECTIONS),
        }
    }

    /// How many WebSockets may wait for their `auth` at once (`limits::unauthenticated_cap`
    /// of the connection cap in force).
    pub fn set_max_unauthenticated(&self, max: usize) {
        self.max_unauthenticated.store(max.max(1), Ordering::Relaxed);
    }

    pub fn auth_enabled(&self) -> bool {
        self.verifier.is_some()
    }

    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.read().expect("rules lock").clone()
    }

    /// Replaces the rules (after they are durable) and tells live connections.
    pub fn set_rules(&self, rules: RuleSet) {
        *self.rules.write().expect("rules lock") = Arc::new(rules);
        self.rules_version.fetch_add(1, Ordering::Release);
    }

    /// How many times the rules changed since start.
    pub fn rules_version(&self) -> u64 {
        self.rules_version.load(Ordering::Acquire)
    }

    /// The caller of a request: `token` is the bearer token if one came.
    /// With auth off every caller is the anonymous admin, token or not.
    pub fn authenticate(&self, token: Option<&str>, where_: &str) -> Result<Arc<Identity>, ApiError> {
        let Some(verifier) = &self.verifier else { return Ok(self.anonymous.clone()) };
        let Some(token) = token else { return Err(refuse(AuthFailure::Missing, where_)) };
        if let Some(identity) = self.verified.lock().expect("token cache lock").get(token) {
            // A token verified before is as good as it was until it expires.
            if identity.expires_at.saturating_add(limits::TOKEN_LEEWAY_SECS) > crate::auth::now_unix() {
                return Ok(identity.clone());
            }
        }
        let identity = Arc::new(verifier.verify(token).map_err(|failure| refuse(failure, where_))?);
        let mut verified = self.verified.lock().expect("token cache lock");
        if verified.len() >= limits::MAX_CACHED_TOKENS {
            // Simpler than an LRU, and a backend's few tokens are back after one verification each.
            verified.clear();
        }
        verified.insert(Box::from(token), identity.clone());
        Ok(identity)
    }

    /// The identity of a request that may come without a token (`/v1/ws`, whose
    /// token may come in a message): `Ok(None)` when none was presented.
    pub fn authenticate_optional(&self, token: Option<&str>, where_: &str) -> Result<Option<Arc<Identity>>, ApiError> {
        match (&self.verifier, token) {
            (None, _) => Ok(Some(self.anonymous.clone())),
            (Some(_), None) => Ok(None),
            (Some(_), Some(token)) => self.authenticate(Some(token), where_).map(Some),
        }
    }

    /// `Host` must name this server: an IP literal, `localhost`, or a name given
    /// with `--allow-host`. Anything else is a DNS-rebinding attempt (a page of
    /// evil.example whose name now points at this machine) or a misrouted request.
    pub fn check_host(&self, host: Option<&str>) -> Result<(), ApiError> {
        let Some(host) = host else {
            return Err(ApiError::new(ErrorCode::HostNotAllowed, "the request names no host (`Host`)"));
        };
        let name = host_name(host);
        let allowed = name.parse::<IpAddr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || self.allowed_hosts.iter().any(|allowed| allowed.eq_ignore_ascii_case(name));
        if allowed {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorCode::HostNotAllowed,
                format!("this server does not answer to `{name}` (start it with `--allow-host {name}` if it should)"),
            ))
        }
    }

    /// A browser request from another site must come from an allowed origin:
    /// CORS alone would only hide the answer, not stop a write (a `text/plain`
    /// POST needs no preflight), nor a WebSocket (browsers do not apply CORS to it).
    pub fn check_origin(&self, origin: Option<&str>, host: Option<&str>) -> Result<(), ApiError> {
        let Some(origin) = origin else { return Ok(()) };
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        let same_origin = host.is_some_and(|host| {
            let host = host.to_ascii_lowercase();
            origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) == Some(host.as_str())
        });
        if same_origin || self.allowed_origins.contains(&origin) {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::OriginNotAllowed,
            format!("requests from the origin `{origin}` are not allowed (`--allow-origin` lists the allowed ones)"),
        ))
    }

    /// The collection `name` as `identity` may use it for `action`, and what it
    /// is granted: the one check behind every HTTP route and WebSocket request.
    /// Rules are checked before the name is looked up, so a refusal says the same
    /// whether the collection exists or not. Non-admins must spell names exactly:
    /// `lists/U42` must not reach `lists/u42` through case-insensitive routing.
    pub fn granted_collection(
        &self,
        routes: &Routes,
        identity: &Identity,
        name: &str,
        action: Action,
    ) -> Result<(Arc<CollectionEntry>, Grant), ApiError> {
        if is_reserved_name(name) {
            return Err(ApiError::new(ErrorCode::Forbidden, format!("`{name}` is reserved for the server")));
        }
        let verb = match action {
            Action::Read => "read",
            Action::Write => "write to",
        };
        // A `through` grant grants nothing here: refused as a collection no rule names.
        let grant =
            self.rules().direct_grant(identity, name, action).ok_or_else(|| crate::rules::forbidden(name, verb))?;
        let entry = routes.read().expect("routes lock").get(name).cloned();
        let entry = entry.ok_or_else(|| ApiError::unknown_collection(name))?;
        if identity.role != Role::Admin && entry.name != name {
            return Err(ApiError::unknown_collection(name));
        }
        Ok((entry, grant))
    }

    /// `granted_collection` for a write, with what the caller may write there
    /// rule by rule: its write guard is built from it.
    pub fn granted_write(
        &self,
        routes: &Routes,
        identity: &Identity,
        name: &str,
    ) -> Result<(Arc<CollectionEntry>, WriteGrant), ApiError> {
        let (entry, _) = self.granted_collection(routes, identity, name, Action::Write)?;
        // The rules may have changed since: the newer ones decide, refusing with the same words.
        let grant =
            self.rules().write_grant(identity, name).ok_or_else(|| crate::rules::forbidden(name, "write to"))?;
        Ok((entry, grant))
    }

    pub fn allowed_origins(&self) -> &[String] {
        &self.allowed_origins
    }

    /// Takes a WebSocket connection slot of `identity` (readers are capped), or
    /// without one a place among the sockets waiting for `auth`.
    pub fn open_connection(self: &Arc<Self>, identity: Option<&Identity>) -> Result<ConnectionSlot, ApiError> {
        let Some(identity) = identity else { return Ok(self.wait_for_auth()) };
        if identity.role != Role::Reader {
            return Ok(ConnectionSlot::new(self, None));
        }
        let mut identities = self.identities.lock().expect("identities lock");
        let usage = entry(&mut identities, &identity.key);
        if usage.connections >= limits::MAX_CONNECTIONS_PER_IDENTITY {
            return Err(ApiError::limit(format!(
                "this identity holds {} connections already",
                limits::MAX_CONNECTIONS_PER_IDENTITY
            )));
        }
        usage.connections += 1;
        Ok(ConnectionSlot::new(self, Some(identity.key.clone())))
    }

    /// A place among the WebSockets waiting for `auth`. They may hold only a
    /// small share of the connection cap: past it, the one that has waited
    /// longest is told to close. Refusing the newest instead would let sockets
    /// that never authenticate keep every newcomer out, a browser about to send
    /// its token included; this way they cannot hold their places longer than
    /// it takes the newcomers to fill the share, and a client sends its `auth`
    /// within a round trip of the `welcome`.
    fn wait_for_auth(self: &Arc<Self>) -> ConnectionSlot {
        let (signal, evicted) = oneshot::channel();
        let max = self.max_unauthenticated.load(Ordering::Relaxed);
        let mut room = self.waiting_for_auth.lock().expect("waiting room lock");
        while room.waiting.len() >= max {
            let Some((_, oldest)) = room.waiting.pop_first() else { break };
            metrics::add(&METRICS.unauthenticated_evicted, 1);
            let _ = oldest.send(());
        }
        let id = room.next_id;
        room.next_id += 1;
        room.waiting.insert(id, signal);
        ConnectionSlot { gate: self.clone(), key: None, waiting: Some((id, evicted)) }
    }

    /// Counts one request (or WebSocket message) against a reader's budget.
    /// Writers and admins are trusted backends, limited per connection only.
    pub fn take_request(&self, identity: &Identity) -> Result<(), ApiError> {
        if identity.role != Role::Reader {
            return Ok(());
        }
        let mut identities = self.identities.lock().expect("identities lock");
        if entry(&mut identities, &identity.key).requests.try_take() {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorCode::RateLimited,
                format!(
                    "more than {} requests per second from this identity, over all its connections",
                    limits::IDENTITY_REQUESTS_PER_SECOND
                ),
            ))
        }
    }

    /// Counts one collection creation against a non-admin's hourly quota.
    pub fn take_creation(&self, identity: &Identity) -> Result<(), ApiError> {
        if identity.role == Role::Admin {
            return Ok(());
        }
        let mut identities = self.identities.lock().expect("identities lock");
        let usage = entry(&mut identities, &identity.key);
        if usage.hour_started.elapsed() >= Duration::from_secs(3600) {
            usage.hour_started = Instant::now();
            usage.created_this_hour = 0;
        }
        if usage.created_this_hour >= limits::COLLECTIONS_CREATED_PER_IDENTITY_PER_HOUR {
            return Err(ApiError::limit(format!(
                "this identity created {} collections in the last hour already",
                limits::COLLECTIONS_CREATED_PER_IDENTITY_PER_HOUR
            )));
        }
        usage.created_this_hour += 1;
        Ok(())
    }
}

/// The identity's counters, creating them; past `MAX_TRACKED_IDENTITIES` the
/// ones without a connection are forgotten first (their budgets start full again,
/// which at worst gives one burst more).
fn entry<'a>(identities: &'a mut HashMap<Arc<str>, IdentityUse>, key: &Arc<str>) -> &'a mut IdentityUse {
    if !identities.contains_key(key) && identities.len() >= limits::MAX_TRACKED_IDENTITIES {
        identities.retain(|_, usage| usage.connections > 0);
    }
    identities.entry(key.clone()).or_insert_with(IdentityUse::new)
}

/// Counts and logs a refused token (the reason, never the token) and makes the error.
pub fn refuse(failure: AuthFailure, where_: &str) -> ApiError {
    metrics::count_auth_failure(failure);
    tracing::info!(reason = failure.reason(), on = where_, "auth refused ({}) on {where_}", failure.reason());
    ApiError::new(ErrorCode::Unauthorized, failure.message())
}

/// The name part of a `Host` value: `example.org:7070` → `example.org`, `[::1]:80` → `::1`.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(hosts: &[&str], origins: &[&str]) -> Gate {
        Gate::new(
            None,
            RuleSet::default(),
            hosts.iter().map(|h| h.to_string()).collect(),
            origins.iter().map(|o| o.to_string()).collect(),
        )
    }

    #[test]
    fn sockets_waiting_for_auth_make_room_oldest_first() {
        let gate = Arc::new(gate(&[], &[]));
        gate.set_max_unauthenticated(2);
        let mut first = gate.open_connection(None).unwrap();
        let mut second = gate.open_connection(None).unwrap();
        let evicted = |slot: &mut ConnectionSlot| match &mut slot.waiting {
            Some((_, signal)) => signal.try_recv().is_ok(),
            None => true,
        };
        assert!(!evicted(&mut first) && !evicted(&mut second));
        let mut third = gate.open_connection(None).unwrap();
        assert!(evicted(&mut first), "the longest waiting makes room");
        assert!(!evicted(&mut second) && !evicted(&mut third));
        // A socket that goes (or authenticates) gives its place back: no one else is closed.
        drop(second);
        let mut fourth = gate.open_connection(None).unwrap();
        assert!(!evicted(&mut third) && !evicted(&mut fourth));
        // An identity's slot is not among them.
        let admin = Identity::anonymous_admin();
        let _admin = gate.open_connection(Some(&admin)).unwrap();
        assert!(!evicted(&mut third) && !evicted(&mut fourth));
    }

    #[test]
    fn hosts_are_ip_literals_localhost_or_listed() {
        let gate = gate(&["chat.example.org"], &[]);
        for good in ["127.0.0.1:7070", "localhost", "LOCALHOST:1", "[::1]:7070", "10.0.0.1", "chat.example.org:443"] {
            assert!(gate.check_host(Some(good)).is_ok(), "{good}");
        }
        for bad in ["evil.example", "evil.example:7070", "localhost.evil.example", "chat.example.org.evil"] {
            assert_eq!(gate.check_host(Some(bad)).unwrap_err().code, ErrorCode::HostNotAllowed, "{bad}");
        }
        assert!(gate.check_host(None).is_err());
    }

    #[test]
    fn origins_are_the_servers_own_or_listed() {
        let gate = gate(&[], &["https://app.example.org"]);
        assert!(gate.check_origin(None, Some("x")).is_ok());
        assert!(gate.check_origin(Some("http://127.0.0.1:7070"), Some("127.0.0.1:7070")).is_ok());
        assert!(gate.check_origin(Some("https://app.example.org"), Some("127.0.0.1:7070")).is_ok());
        assert!(gate.check_origin(Some("http://evil.example"), Some("127.0.0.1:7070")).is_err());
        assert!(gate.check_origin(Some("http://127.0.0.1:7071"), Some("127.0.0.1:7070")).is_err());
        assert!(gate.check_origin(Some("null"), Some("127.0.0.1:7070")).is_err());
    }
}
