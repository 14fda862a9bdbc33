//! The admin listener: `/healthz`, `/readyz`, `/metrics`, the bearer-token `/admin/*` API (events,
//! replay, discard, plugins, rollback, plugin state) and the operator's dashboard at `/`
//! ([`ui`]). This file is the router and its checks; the routes are in [`handlers`] and
//! [`state`] (plugin state), their wire types in [`api`].
//!
//! Invariants:
//! - Every `/admin/*` route checks the `Host` (against DNS rebinding, [`guard`]) and the token
//!   (constant time; there always is one: configured or generated, [`token`]) before doing
//!   anything; an address that keeps presenting wrong tokens is locked out ([`lockout`]).
//! - No route answers a browser's cross-origin request.
//! - Replay and discard are bounded per call ([`MAX_REPLAY`]); their rules are
//!   [`crate::ingest::replay`]'s and [`crate::retention::discard`]'s.
//! - A body is read only for a route that takes one, and only once the request passed the
//!   checks that need none: the token for `/admin/*`, the session for the dashboard's forms
//!   ([`ui`]). It is read under the ingest's rules ([`crate::ingest::body`]: a size cap, the
//!   listener's in-flight budget, the body timeouts), so a client that stalls its body is cut
//!   off with 408 instead of holding the connection. The one body a client without the token
//!   has read, the sign-in form, is read under a budget of its own ([`ui::SIGN_IN_BUDGET`]), so
//!   anonymous clients never hold any of the budget the operators' own writes use. The cap for
//!   the rest ([`MAX_BODY_BYTES`])
//!   is also the `/admin/*` extractors' limit, so no smaller default (axum's 2 MiB) answers a
//!   body the routes take in place of their own checks.

pub mod api;
pub mod guard;
mod handlers;
pub mod lockout;
mod metrics;
pub mod openapi;
mod state;
pub mod token;
mod ui;

use std::sync::LazyLock;

use std::{net::SocketAddr, sync::Arc};
use tracing::Level;

use axum::{
    Router,
    body::Body,
    extract::{DefaultBodyLimit, Request, State},
    http::header,
    middleware::{self, Next},
    response::Response,
    routing::{get, post},
};

pub use handlers::{MAX_EVENTS, MAX_REPLAY, Rejection, events_filter, replay_filter};
pub use state::MAX_KEYS;

use crate::{
    Shared,
    error::ApiError,
    ingest::body::{self, BodyBudget, BodyLimits},
    telemetry::Repeated,
};
use handlers::{
    discard, event_detail, healthz, list_events, nodes, plugins, readyz, replay, rollback,
};
use metrics::metrics;

/// The admin routes of the listener bound to `local`.
pub fn router(shared: Arc<Shared>, local: SocketAddr) -> Router {
    let guard = Arc::new(guard::Guard {
        local,
        names: shared.config.server.admin_hosts.clone(),
    });
    let lockout = Arc::new(lockout::Lockout::default());
    // No share per address here: the dashboard, the CLI and scripts usually come from one
    // loopback address, and a state `PUT` may be larger than a share sized by the sources.
    // Only a client with the token (or a session) reads more than the sign-in form.
    let bodies = Bodies::new(
        BodyLimits::new(&shared.config.server, MAX_BODY_BYTES as u64),
        BodyBudget::new(
            shared.config.server.max_inflight_body_bytes,
            shared.config.server.max_inflight_body_bytes,
        ),
    );
    let dashboard = ui::router(shared.clone(), guard.clone(), lockout.clone(), &bodies);
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
                .delete(state::delete_key),
        )
        .route("/admin/nodes", get(nodes))
        .route("/admin/openapi.json", get(openapi::document))
        // The extractors' own cap is the gate's ([`read_body`]), not axum's 2 MiB default.
        .route_layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        // Inside the token's check: only a client with the token has its body read.
        .route_layer(middleware::from_fn_with_state(bodies, read_body))
        .route_layer(middleware::from_fn_with_state(
            TokenGate {
                shared: shared.clone(),
                lockout,
            },
            require_token,
        ))
        .route_layer(middleware::from_fn_with_state(guard, require_host));
    // `/healthz`, `/readyz` and `/metrics` (counts only, nothing secret) stay open to probes and scrapers
    // under whatever name they use, so they get the Origin check but not the Host check.
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(admin)
        .merge(dashboard)
        .fallback(crate::error::no_route)
        .method_not_allowed_fallback(crate::error::wrong_method)
        .layer(middleware::from_fn_with_state(shared.clone(), bound_reads))
        .layer(middleware::from_fn(refuse_cross_origin))
        .layer(middleware::from_fn(ui::security_headers))
        .with_state(shared)
}

/// How long a read (`GET`, `HEAD`: the API's reads and the dashboard's pages) waits for a
/// shared database (PostgreSQL) before it is answered 503 instead: one that stopped answering
/// without closing anything would hold it for as long as TCP's own timeouts (20 s and more).
/// Writes are not cut off (an answer must say whether they happened); the embedded database is
/// this process's own and not waited on.
const SHARED_READ_ANSWER: std::time::Duration = std::time::Duration::from_secs(10);

/// Answers a read 503 `overloaded` + `Retry-After` once it has waited [`SHARED_READ_ANSWER`] for
/// a shared database.
async fn bound_reads(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: middleware::Next,
) -> Response {
    let read = matches!(*request.method(), http::Method::GET | http::Method::HEAD);
    if !read || shared.inbox.single_node() {
        return next.run(request).await;
    }
    let path = request.uri().path().to_owned();
    match tokio::time::timeout(SHARED_READ_ANSWER, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(
                path,
                waited_secs = SHARED_READ_ANSWER.as_secs(),
                "the database did not answer a read in time: answered 503"
            );
            axum::response::IntoResponse::into_response(crate::error::ApiError::Overloaded {
                retry_after_secs: 1,
            })
        }
    }
}

/// The largest body any route of this listener takes: a plugin state value's `PUT` (the
/// dashboard's largest form, a state edit, is smaller). Routes that take less check their own
/// cap on the body read here.
const MAX_BODY_BYTES: usize = state::MAX_BODY_BYTES;
const _: () = assert!(MAX_BODY_BYTES >= ui::MAX_STATE_FORM_BYTES);

/// What [`read_body`] reads a body under: its cap and timeouts, and the listener's own
/// in-flight budget.
#[derive(Clone)]
struct Bodies {
    limits: BodyLimits,
    budget: Arc<BodyBudget>,
}

impl Bodies {
    fn new(limits: BodyLimits, budget: Arc<BodyBudget>) -> Self {
        Self { limits, budget }
    }

    /// These rules with a smaller cap, under a budget of their own.
    fn capped(&self, max_bytes: u64, budget: Arc<BodyBudget>) -> Self {
        let limits = BodyLimits {
            max_bytes: max_bytes.min(self.limits.max_bytes),
            ..self.limits
        };
        Self::new(limits, budget)
    }
}

/// Reads the request's whole body (413 over the cap, from its declared length alone when it has
/// one; 408 when it stalls or trickles; 503 when the listener's budget is spent), then hands
/// the request on with it.
async fn read_body(
    State(bodies): State<Bodies>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let (parts, received) = request.into_parts();
    let declared = body::declared_length(&parts.headers);
    // Held until the request is answered: the body's bytes live that long. Counted under the
    // client's address too, for a budget with a share per address (the sign-in form's).
    let client = crate::server::Client::of(&parts.extensions);
    let (bytes, _reservation) =
        body::read(received, declared, bodies.limits, &bodies.budget, client).await?;
    Ok(next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await)
}

async fn refuse_cross_origin(request: Request, next: Next) -> Response {
    if let Err(detail) = guard::Guard::check_origin(request.headers(), request.uri()) {
        static REFUSED: LazyLock<Repeated> =
            LazyLock::new(|| Repeated::new(Level::WARN, "admin request refused (Origin check)"));
        log_refused(&REFUSED, request.uri().path(), detail);
        return guard::forbidden(detail);
    }
    next.run(request).await
}

async fn require_host(
    State(guard): State<Arc<guard::Guard>>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(detail) = guard.check_host(request.headers(), request.uri()) {
        static REFUSED: LazyLock<Repeated> =
            LazyLock::new(|| Repeated::new(Level::WARN, "admin request refused (Host check)"));
        log_refused(&REFUSED, request.uri().path(), detail);
        return guard::forbidden(detail);
    }
    next.run(request).await
}

/// Longest part of a refused request's path a log line quotes.
const LOGGED_PATH_BYTES: usize = 256;

/// The line for a request the Host or Origin guard refused. Any web page the operator has open
/// can send such requests without end, so at most one line per period is written for each
/// guard ([`Repeated`]), counting those left out, and a long path is cut.
fn log_refused(repeated: &Repeated, path: &str, detail: &str) {
    if let Some(left_out) = repeated.write() {
        let (path, whole) = crate::text::escape_within(path, LOGGED_PATH_BYTES);
        let path = if whole { path } else { path + "…" };
        tracing::warn!(path, detail, left_out, "admin request refused");
    }
}

/// What the bearer-token check needs: the token, and the listener's wrong tokens per address.
#[derive(Clone)]
struct TokenGate {
    shared: Arc<Shared>,
    lockout: Arc<lockout::Lockout>,
}

async fn require_token(
    State(TokenGate { shared, lockout }): State<TokenGate>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // `run` always fills the token in (configured or generated); without one nothing passes.
    let Some(token) = &shared.config.server.admin_token else {
        return Err(ApiError::Unauthorized);
    };
    let client = crate::server::peer(request.extensions());
    let now = std::time::Instant::now();
    if let Some(wait) = client.and_then(|client| lockout.locked_out(client, now)) {
        return Err(ApiError::TooManyRequests {
            detail: "too many wrong admin tokens from this address".into(),
            retry_after_secs: wait.as_secs() + 1,
        });
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        // The scheme name is case-insensitive (RFC 9110 §11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token.trim_start());
    if !token.matches(presented.as_bytes()) {
        if let Some(client) = client.filter(|_| !presented.is_empty()) {
            lockout.wrong_token(client, now, "admin API");
        }
        return Err(ApiError::Unauthorized);
    }
    Ok(next.run(request).await)
}
