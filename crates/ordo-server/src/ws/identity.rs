//! A connection's identity: its token's life cycle (the `auth` message, refresh,
//! expiry with a grace, close 4401) and what its rules let it read (the row
//! predicate conjoined into every view it opens).

use std::sync::Arc;
use std::time::Duration;

use fastwebsockets::OpCode;

use super::{Connection, CLOSE_UNAUTHORIZED};
use crate::auth::{self, AuthFailure, Identity, Role};
use crate::error::{ApiError, ErrorCode};
use crate::limits;
use crate::rules::Action;

impl Connection {
    /// Moves the token deadline, and the connection's one timer with it.
    pub(super) fn set_auth_deadline(&mut self, deadline: Option<tokio::time::Instant>) {
        self.auth_deadline = deadline;
        if let Some(deadline) = deadline {
            self.auth_timer.as_mut().reset(deadline);
        }
    }

    /// The connection's token deadline passed: no token yet (close), the token
    /// just expired (warn, start the grace), or the grace ran out (close).
    pub(super) async fn on_auth_deadline(&mut self) {
        if self.identity.is_none() {
            refuse_and_count(AuthFailure::Missing);
            self.close(CLOSE_UNAUTHORIZED, "no `auth` message within the auth timeout").await;
        } else if self.in_grace {
            refuse_and_count(AuthFailure::Expired);
            self.close(CLOSE_UNAUTHORIZED, "token expired").await;
        } else {
            self.in_grace = true;
            self.set_auth_deadline(Some(tokio::time::Instant::now() + self.context.config.auth_grace));
            self.frame.clear();
            self.frame.extend_from_slice(b"{\"type\":\"auth_expired\",\"grace_secs\":");
            crate::frame::write_u64(&mut self.frame, self.context.config.auth_grace.as_secs());
            self.frame.push(b'}');
            self.write(OpCode::Text).await;
        }
    }

    /// `{"op":"auth"}`: a first token, or a fresh one for the same identity.
    pub(super) async fn authenticate(&mut self, token: &str, req: Option<&str>) -> Result<(), ApiError> {
        if !self.context.gate.auth_enabled() {
            return Err(ApiError::bad_request(
                "this server runs without auth (`welcome.auth` is \"none\"); send no `auth`",
            ));
        }
        let identity = self.context.gate.authenticate(Some(token), "/v1/ws auth")?;
        match &self.identity {
            Some(current) if current.key != identity.key => {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "a connection keeps one identity: a fresh token must name the same one (same claims but exp, nbf, iat, jti)",
                ));
            }
            Some(_) => {}
            None => {
                self.slot = Some(self.context.gate.open_connection(Some(&identity))?);
                self.session.owner = identity.key.clone();
            }
        }
        self.set_auth_deadline(expiry_deadline(&identity));
        self.in_grace = false;
        let mut answer = identity.to_json();
        answer["type"] = "authed".into();
        if let Some(req) = req {
            answer["req"] = req.into();
        }
        self.identity = Some(identity);
        self.send_json(&answer).await;
        Ok(())
    }

    /// The identity whose view budget this connection's views are charged to:
    /// readers only (writers are trusted backends, admins operators; with auth
    /// off every caller is an admin).
    pub(super) fn view_budget_owner(&self) -> Option<Arc<str>> {
        self.identity.as_ref().filter(|identity| identity.role == Role::Reader).map(|identity| identity.key.clone())
    }

    /// The rule an item anchor of a `set_range` must pass (an item outside it
    /// reads as missing), as the rules are now: the row predicate, or, on a
    /// collection read by relationship, the subscription's own view filter
    /// (`view_filter`, which holds its pin), so that an anchor never tells of an
    /// item outside the pinned value. Refused the same way whether the
    /// collection exists or not.
    pub(super) fn seek_rule(
        &self,
        name: &str,
        view_filter: ordo_core::Filter,
    ) -> Result<Option<ordo_core::Filter>, ApiError> {
        let identity =
            self.identity.as_ref().ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "send `auth` first"))?;
        let (entry, grant) =
            self.context.gate.granted_collection(&self.context.routes, identity, name, Action::Read)?;
        match grant {
            crate::rules::Grant::Related(_) => Ok(Some(view_filter)),
            grant => grant.predicate(&entry.schema),
        }
    }

    /// The collection as this connection's identity may read it with a view of
    /// `filter`: the row predicate to conjoin (`None`: every item) and, on a
    /// collection read by relationship, the relationship the writer checks (the
    /// filter must pin it; `related::view_access`). Refused the same way
    /// whether the collection exists or not.
    pub(super) fn readable_view(
        &self,
        name: &str,
        filter: &serde_json::Value,
    ) -> Result<(Arc<crate::routing::CollectionEntry>, crate::related::ViewAccess), ApiError> {
        let identity =
            self.identity.as_ref().ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "send `auth` first"))?;
        let context = &self.context;
        let (entry, grant) = context.gate.granted_collection(&context.routes, identity, name, Action::Read)?;
        let access = crate::related::view_access(&context.gate, &context.routes, identity, &entry, &grant, filter)?;
        Ok((entry, access))
    }

    /// The schema to check a view request on `entry` against, once every name it
    /// reads through a reference passed `refs::read_schema` (the access rule among
    /// its checks); `None`: it reads none, use the entry's.
    pub(super) fn read_schema(
        &self,
        entry: &crate::routing::CollectionEntry,
        filter: &serde_json::Value,
        sort: &[crate::wire::SortRequest],
        fields: Option<&[String]>,
    ) -> Result<Option<ordo_core::Schema>, ApiError> {
        let identity =
            self.identity.as_ref().ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "send `auth` first"))?;
        let reader = crate::refs::Reader { gate: &self.context.gate, routes: &self.context.routes, identity };
        crate::refs::read_schema(&reader, entry, filter, sort, fields)
    }
}

/// When a verified token must be looked at again: its expiry plus the leeway.
pub(super) fn expiry_deadline(identity: &Identity) -> Option<tokio::time::Instant> {
    if identity.expires_at == u64::MAX {
        return None;
    }
    let left = (identity.expires_at + limits::TOKEN_LEEWAY_SECS).saturating_sub(auth::now_unix());
    Some(tokio::time::Instant::now() + Duration::from_secs(left))
}

fn refuse_and_count(failure: AuthFailure) {
    let _ = crate::access::refuse(failure, "/v1/ws");
}
