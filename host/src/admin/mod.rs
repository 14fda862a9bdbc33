//! The admin listener: `/healthz`, `/metrics`, and the bearer-token `/admin/*` API: events,
//! replay, plugins, rollback.
//!
//! Invariants: every `/admin/*` route checks the `Host` (against DNS rebinding, [`guard`]) and
//! the token (constant time; there always is one: configured or generated, [`token`]) before
//! doing anything; no route answers a browser's cross-origin request; replay is bounded per call
//! and holds at most one quarantined body in memory at a time (a dry run reads none);
//! quarantined requests are re-parsed, then deduped like any other.

pub mod guard;
pub mod token;

use std::{collections::BTreeMap, fmt::Write as _, net::SocketAddr, sync::Arc};

use axum::{
    Json, Router,
    extract::{
        FromRequest, Path, Query, Request, State,
        rejection::{JsonRejection, QueryRejection},
    },
    http::{Uri, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    Shared,
    error::ApiError,
    inbox::{Accepted, EventFilter, InboxError, ReplayFilter},
    ingest::{EnvelopeOutcome, envelope},
    model::DeliveryState,
};

/// Most deliveries (plus quarantined requests) one replay call touches.
pub const MAX_REPLAY: usize = 10_000;

/// The admin routes of the listener bound to `local`.
pub fn router(shared: Arc<Shared>, local: SocketAddr) -> Router {
    let guard = Arc::new(guard::Guard {
        local,
        names: shared.config.server.admin_hosts.clone(),
    });
    let admin = Router::new()
        .route("/admin/events", get(list_events))
        .route("/admin/events/{source}/{event_id}", get(event_detail))
        .route("/admin/replay", post(replay))
        .route("/admin/plugins", get(plugins))
        .route("/admin/plugins/{name}/rollback", post(rollback))
        .route_layer(middleware::from_fn_with_state(
            shared.clone(),
            require_token,
        ))
        .route_layer(middleware::from_fn_with_state(guard, require_host));
    // `/healthz` and `/metrics` (counts only, nothing secret) stay open to probes and scrapers
    // under whatever name they use, so they get the Origin check but not the Host check.
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .merge(admin)
        .layer(middleware::from_fn(refuse_cross_origin))
        .with_state(shared)
}

async fn refuse_cross_origin(request: Request, next: Next) -> Response {
    if let Err(detail) = guard::Guard::check_origin(request.headers()) {
        tracing::warn!(path = %request.uri().path(), detail, "admin request refused");
        return guard::forbidden(detail);
    }
    next.run(request).await
}

async fn require_host(
    State(guard): State<Arc<guard::Guard>>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(detail) = guard.check_host(request.headers()) {
        tracing::warn!(path = %request.uri().path(), detail, "admin request refused");
        return guard::forbidden(detail);
    }
    next.run(request).await
}

async fn require_token(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // `run` always fills the token in (configured or generated); without one nothing passes.
    let Some(token) = &shared.config.server.admin_token else {
        return Err(ApiError::Unauthorized);
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        // The scheme name is case-insensitive (RFC 9110 §11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token.trim_start());
    if !token.matches(presented.as_bytes()) {
        return Err(ApiError::Unauthorized);
    }
    Ok(next.run(request).await)
}

async fn healthz(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(json!({
        "status": "ok",
        "backlog": shared.inbox.backlog(),
        "pooling_allocator": shared.runtime.pooling(),
    }))
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Result<Response, ApiError> {
    let mut out = String::new();
    let counts: BTreeMap<String, i64> = shared.inbox.state_counts().await?.into_iter().collect();
    out.push_str("# HELP hookd_deliveries Deliveries by state.\n# TYPE hookd_deliveries gauge\n");
    for state in DeliveryState::ALL {
        let n = counts.get(state.as_str()).copied().unwrap_or(0);
        let _ = writeln!(out, "hookd_deliveries{{state=\"{state}\"}} {n}");
    }
    let quarantined = shared.inbox.quarantine_held_count().await?;
    let _ = writeln!(
        out,
        "# HELP hookd_quarantined Requests held in quarantine.\n# TYPE hookd_quarantined gauge\n\
         hookd_quarantined {quarantined}\n\
         # HELP hookd_backlog Deliveries not yet finished.\n# TYPE hookd_backlog gauge\n\
         hookd_backlog {}\n\
         # HELP hookd_inbox_commits_total Group commits by the inbox writer.\n\
         # TYPE hookd_inbox_commits_total counter\nhookd_inbox_commits_total {}",
        shared.inbox.backlog(),
        shared.inbox.commits()
    );
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    source: Option<String>,
    state: Option<String>,
    handler: Option<String>,
    limit: Option<usize>,
}

fn parse_state(state: Option<&str>) -> Result<Option<DeliveryState>, ApiError> {
    state
        .map(|s| {
            DeliveryState::parse(s).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "state {s:?} is not one of pending, running, retrying, done, dead, stale"
                ))
            })
        })
        .transpose()
}

/// An admin request refused before it reached the inbox, answered exactly as its cause says:
/// axum's own 4xx for a malformed query or body, else the contract's JSON error.
#[derive(Debug)]
pub enum Rejection {
    Query(QueryRejection),
    Body(JsonRejection),
    Api(ApiError),
}

impl From<ApiError> for Rejection {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

impl From<crate::inbox::InboxError> for Rejection {
    fn from(e: crate::inbox::InboxError) -> Self {
        Self::Api(e.into())
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        match self {
            Self::Query(e) => e.into_response(),
            Self::Body(e) => e.into_response(),
            Self::Api(e) => e.into_response(),
        }
    }
}

/// `GET /admin/events`: the request URI's query string → the inbox filter. This is the
/// handler's whole input parsing, public so it can be fuzzed.
pub fn events_filter(uri: &Uri) -> Result<EventFilter, Rejection> {
    let Query(query) = Query::<EventsQuery>::try_from_uri(uri).map_err(Rejection::Query)?;
    Ok(EventFilter {
        source: query.source,
        state: parse_state(query.state.as_deref())?,
        handler: query.handler,
        limit: query.limit.unwrap_or(100).min(10_000),
    })
}

async fn list_events(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
) -> Result<Json<Value>, Rejection> {
    let filter = events_filter(&uri)?;
    Ok(Json(json!(shared.inbox.list_events(filter).await?)))
}

async fn event_detail(
    State(shared): State<Arc<Shared>>,
    Path((source, event_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let detail = shared
        .inbox
        .event_detail(source.clone(), event_id.clone())
        .await?;
    detail
        .map(|d| Json(json!(d)))
        .ok_or_else(|| ApiError::NotFound(format!("no event {event_id:?} from source {source:?}")))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    source: Option<String>,
    handler: Option<String>,
    state: Option<String>,
    event_ids: Option<Vec<String>>,
    /// Received at or after, in ms since the Unix epoch.
    since: Option<i64>,
    /// Received at or before, in ms since the Unix epoch.
    until: Option<i64>,
    #[serde(default)]
    dry_run: bool,
}

/// `POST /admin/replay`: the request's optional JSON body → what to replay (no
/// `Content-Type`: no filter). This is the handler's whole input parsing, public so it can be
/// fuzzed.
pub async fn replay_filter(request: Request) -> Result<ReplayFilter, Rejection> {
    let body = Option::<Json<ReplayBody>>::from_request(request, &())
        .await
        .map_err(Rejection::Body)?;
    let body = body.map(|Json(b)| b).unwrap_or_default();
    Ok(ReplayFilter {
        source: body.source,
        handler: body.handler,
        state: parse_state(body.state.as_deref())?,
        event_ids: body.event_ids,
        since_ms: body.since,
        until_ms: body.until,
        limit: MAX_REPLAY,
        dry_run: body.dry_run,
    })
}

async fn replay(
    State(shared): State<Arc<Shared>>,
    request: Request,
) -> Result<Json<Value>, Rejection> {
    let filter = replay_filter(request).await?;
    if let Some(source) = &filter.source
        && !shared.config.sources.contains_key(source.as_str())
    {
        return Err(ApiError::BadRequest(format!("unknown source {source:?}")).into());
    }
    let (mut matched, mut replayed) = shared.inbox.replay(filter.clone()).await?;

    // Quarantined requests have no event id or handler yet: they match source and time only.
    if filter.handler.is_none() && filter.event_ids.is_none() && filter.state.is_none() {
        let dry_run = filter.dry_run;
        let filter = ReplayFilter {
            limit: MAX_REPLAY - matched.min(MAX_REPLAY),
            ..filter
        };
        if dry_run {
            // Counted in SQL: a dry run reads no body.
            matched += shared.inbox.held_quarantine_count(filter).await?;
        } else {
            let ids = shared.inbox.held_quarantine_ids(filter).await?;
            matched += ids.len();
            let result = replay_quarantined(&shared, &ids).await;
            // Accepts resolve quarantined rows too: recount once, whatever happened.
            shared.inbox.recount_quarantine().await?;
            replayed += result?;
        }
    }
    Ok(Json(json!({"matched": matched, "replayed": replayed})))
}

/// Parses the quarantined requests `ids` again, one at a time (one body in memory at once), and
/// accepts or resolves each; returns how many left quarantine.
async fn replay_quarantined(shared: &Shared, ids: &[i64]) -> Result<usize, InboxError> {
    let mut replayed = 0;
    for &id in ids {
        // Resolved meanwhile (a concurrent replay) or gone: nothing to do.
        let Some(item) = shared.inbox.held_quarantined(id).await? else {
            continue;
        };
        let Some(source) = shared.config.sources.get(item.source.as_str()) else {
            continue;
        };
        match envelope(shared, source, &item.request).await {
            EnvelopeOutcome::Envelope(envelope) => {
                let accepted = shared
                    .inbox
                    .accept(
                        source.name.clone(),
                        envelope,
                        item.request,
                        source.handlers.clone(),
                        Some(item.id),
                    )
                    .await?;
                tracing::info!(
                    source = %source.name, quarantine_id = item.id,
                    duplicate = accepted == Accepted::Duplicate,
                    "quarantined request replayed"
                );
                replayed += 1;
            }
            EnvelopeOutcome::Invalid(reason) | EnvelopeOutcome::Ignore(reason) => {
                shared
                    .inbox
                    .resolve_quarantine(
                        item.id,
                        crate::text::cap(
                            format!("parser now says: {reason}"),
                            crate::text::MAX_REASON_BYTES,
                        ),
                    )
                    .await?;
                replayed += 1;
            }
            EnvelopeOutcome::Quarantine(reason) => {
                tracing::warn!(quarantine_id = item.id, reason, "still cannot parse; kept");
            }
        }
    }
    Ok(replayed)
}

async fn plugins(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let files = shared.registry.statuses();
    let list: Vec<Value> = shared
        .config
        .plugins
        .values()
        .map(|plugin| {
            let file = files.get(&plugin.wasm);
            json!({
                "name": plugin.name,
                "wasm": file.map(|f| f.wasm.clone())
                    .unwrap_or_else(|| shared.registry.path_of(&plugin.wasm).display().to_string()),
                "sha256": file.and_then(|f| f.sha256.clone()),
                "loaded_at": file.and_then(|f| f.loaded_at),
                "exports": file.map(|f| f.exports.clone()).unwrap_or_default(),
                "error": file.and_then(|f| f.error.clone())
                    .or_else(|| file.is_none().then(|| "not loaded".to_string())),
                "previous": file.map(|f| f.previous.clone()).unwrap_or_default(),
            })
        })
        .collect();
    Json(Value::Array(list))
}

async fn rollback(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let plugin = shared
        .config
        .plugins
        .get(name.as_str())
        .ok_or_else(|| ApiError::NotFound(format!("no plugin {name:?}")))?;
    let live = shared
        .registry
        .rollback(&plugin.wasm)
        .map_err(ApiError::BadRequest)?;
    Ok(Json(json!({"name": name, "sha256": live.plugin.sha256()})))
}
