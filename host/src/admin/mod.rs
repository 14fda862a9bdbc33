//! The admin listener: `/healthz`, `/metrics`, the bearer-token `/admin/*` API (events,
//! replay, discard, plugins, rollback, plugin state) and the operator's dashboard at `/`
//! ([`ui`]). This file is the router and its checks; the routes are in [`handlers`] and
//! [`state`] (plugin state), their wire types in [`api`].
//!
//! Invariants:
//! - Every `/admin/*` route checks the `Host` (against DNS rebinding, [`guard`]) and the token
//!   (constant time; there always is one: configured or generated, [`token`]) before doing
//!   anything.
//! - No route answers a browser's cross-origin request.
//! - Replay and discard are bounded per call ([`MAX_REPLAY`]); their rules are
//!   [`crate::ingest::replay`]'s and [`crate::retention::discard`]'s.

pub mod api;
pub mod guard;
mod handlers;
mod metrics;
pub mod openapi;
mod state;
pub mod token;
mod ui;

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Router,
    extract::{DefaultBodyLimit, Request, State},
    http::header,
    middleware::{self, Next},
    response::Response,
    routing::{get, post},
};

pub use handlers::{MAX_REPLAY, Rejection, events_filter, replay_filter};

use crate::{Shared, error::ApiError};
use handlers::{discard, event_detail, healthz, list_events, nodes, plugins, replay, rollback};
use metrics::metrics;

/// The admin routes of the listener bound to `local`.
pub fn router(shared: Arc<Shared>, local: SocketAddr) -> Router {
    let guard = Arc::new(guard::Guard {
        local,
        names: shared.config.server.admin_hosts.clone(),
    });
    let dashboard = ui::router(shared.clone(), guard.clone());
    let admin = Router::new()
        .route("/admin/events", get(list_events))
        .route("/admin/events/{source}/{event_id}", get(event_detail))
        .route("/admin/replay", post(replay))
        .route("/admin/discard", post(discard))
        .route("/admin/plugins", get(plugins))
        .route("/admin/plugins/{name}/rollback", post(rollback))
        .route("/admin/plugins/{name}/state", get(state::list_keys))
        .route(
            "/admin/plugins/{name}/state/{key}",
            get(state::get_key)
                .put(state::put_key)
                .delete(state::delete_key)
                .layer(DefaultBodyLimit::max(state::MAX_BODY_BYTES)),
        )
        .route("/admin/nodes", get(nodes))
        .route("/admin/openapi.json", get(openapi::document))
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
        .merge(dashboard)
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
