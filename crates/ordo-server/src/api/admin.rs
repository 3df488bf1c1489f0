//! The server's own routes: `/v1/health`, `/v1/limits`, `/metrics`, the access
//! rules (`/v1/rules`) and `/v1/backup`.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use tokio::sync::oneshot;

use super::request::read_body;
use super::{caller, json_response, parse, require_admin, send, Body, Call};
use crate::auth::Role;
use crate::error::ApiError;
use crate::http_state::HttpState;
use crate::metrics;
use crate::rules::{RuleSet, RulesDoc};
use crate::writer::Command;

/// GET /v1/limits: the server's limits, as configured.
pub(super) fn limits(call: Call<'_>) -> Response<Body> {
    json_response(200, call.state.limits_json.to_string().into_bytes())
}

/// GET /v1/health: whether the server is up, for anyone; its sizes, for an admin.
pub(super) async fn health(call: Call<'_>) -> Result<Response<Body>, ApiError> {
    let Call { state, path, token, .. } = call;
    // Anyone may ask whether the server is up; only an admin learns its sizes.
    let admin = token.is_some() || !state.gate.auth_enabled();
    let admin = admin && caller(state, token, path).is_ok_and(|identity| identity.role == Role::Admin);
    let body = if admin {
        let gauges = gauges(state).await?;
        serde_json::json!({
            "status": "ok", "protocol": 1, "last_seq": gauges.last_seq,
            "collections": gauges.n_collections, "items": gauges.n_items,
        })
    } else {
        serde_json::json!({"status": "ok", "protocol": 1})
    };
    let mut body = body;
    if let Some(cluster) = state.cluster_health() {
        // Everyone: a load balancer reads `lagging` without a token.
        body["cluster"] = cluster;
    }
    // Admins only: the follower's error names tables and columns.
    if let (Some(postgres), true) = (&state.postgres, admin) {
        body["postgres"] = postgres.health_json();
    }
    Ok(json_response(200, body.to_string().into_bytes()))
}

/// GET /metrics: the counters and gauges, in Prometheus' text format.
pub(super) async fn metrics(call: Call<'_>) -> Result<Response<Body>, ApiError> {
    let Call { state, path, token, .. } = call;
    if !state.metrics_public {
        require_admin(&*caller(state, token, path)?, "/metrics (or `--metrics-public`)")?;
    }
    let gauges = gauges(state).await?;
    let depth = state.writer.max_capacity() - state.writer.capacity();
    let mut text = metrics::render(&gauges, depth);
    state.render_cluster_metrics(&mut text);
    if let Some(postgres) = &state.postgres {
        postgres.render_metrics(&mut text);
    }
    Ok(Response::builder()
        .status(200)
        .header("content-type", "text/plain; version=0.0.4")
        .body(Full::new(Bytes::from(text)))
        .expect("a valid response"))
}

/// GET /v1/rules (admin).
pub(super) async fn get_rules(call: Call<'_>) -> Result<Response<Body>, ApiError> {
    let Call { state, path, token, .. } = call;
    require_admin(&*caller(state, token, path)?, "reading the rules")?;
    let body = serde_json::to_vec(state.gate.rules().doc()).expect("rules serialise");
    Ok(json_response(200, body))
}

/// PUT /v1/rules (admin): replaces the access rules.
pub(super) async fn put_rules(call: Call<'_>) -> Result<Response<Body>, ApiError> {
    let Call { state, request, path, token } = call;
    let identity = caller(state, token, path)?;
    require_admin(&identity, "changing the rules")?;
    let body = read_body(request).await?;
    let doc: RulesDoc = parse(&body)?;
    let rules = RuleSet::compile(doc.clone())?;
    let text = serde_json::to_string(&doc).expect("rules serialise");
    let seq = state.submit.set_rules(&identity, text, rules, &state.gate).await?;
    let mut body = serde_json::to_value(&doc).expect("rules serialise");
    body["seq"] = seq.into();
    Ok(json_response(200, body.to_string().into_bytes()))
}

/// POST /v1/backup (admin): a hot backup (see `backup`).
pub(super) async fn backup(call: Call<'_>) -> Result<Response<Body>, ApiError> {
    let Call { state, request, path, token } = call;
    require_admin(&*caller(state, token, path)?, "a backup")?;
    let body = read_body(request).await?;
    Ok(json_response(200, crate::backup::backup(state, &body).await?))
}

/// The writer's gauges, for `/v1/health` and `/metrics`.
async fn gauges(state: &HttpState) -> Result<crate::metrics::WriterGauges, ApiError> {
    let (reply, answer) = oneshot::channel();
    send(state, Command::Gauges { reply }).await?;
    answer.await.map_err(|_| ApiError::shutting_down())
}
