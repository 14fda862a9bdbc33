//! The operator's dashboard on the admin listener: server-rendered HTML pages over the same
//! inbox reads, replay and discard services and registry calls the JSON API uses, behind a
//! sign-in with the admin token.
//!
//! Invariants:
//! - Every route checks the `Host` as `/admin/*` does (against DNS rebinding), and the admin
//!   listener's Origin check refuses cross-site requests before any of them.
//! - Every page but the sign-in form and the static assets needs a live session
//!   ([`session`]); every request that changes state (a POST) also carries the session's CSRF
//!   token, checked here before its handler runs.
//! - Every response of the admin listener (this room's, the JSON API's, every refusal and
//!   fallback) carries a strict `Content-Security-Policy` (scripts and styles only from
//!   this listener, no inline script, no framing), `X-Frame-Options: DENY`,
//!   `Referrer-Policy: same-origin` and `X-Content-Type-Options: nosniff`; all but the
//!   static assets are `Cache-Control: no-store`. (`same-origin`, not `no-referrer`: under `no-referrer` a
//!   browser sends `Origin: null` with the dashboard's own form posts, which the Origin check
//!   rightly refuses; `same-origin` still sends nothing, not even the origin, to another site.)
//! - Pages hold no business logic and no SQL: they parse a form or query into the owning
//!   room's terms and render its answer; every value is escaped by `maud`.
//! - Every asset is compiled into the binary ([`assets`]): nothing is fetched from elsewhere.

mod assets;
mod dead_letters;
mod events;
mod format;
mod layout;
mod overview;
mod plugins;
mod quarantine;
mod replay;
mod session;
mod state;

use std::{sync::Arc, time::Instant};

use axum::{
    Router,
    body::{Body, to_bytes},
    extract::{DefaultBodyLimit, Form, FromRequest, Request, State},
    handler::Handler as _,
    http::{HeaderValue, Method, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Redirect, Response},
    routing::{get, post},
};
use maud::html;
use serde::Deserialize;

use super::guard::Guard;
use crate::{Shared, error::ApiError, ingest::body::BodyBudget};
use session::{FAILURE_DELAY, Sessions, SignedIn};

/// What the dashboard's routes share.
pub(super) struct Ui {
    shared: Arc<Shared>,
    sessions: Sessions,
    /// Wrong admin tokens per address, shared with the API's bearer check.
    lockout: Arc<super::lockout::Lockout>,
}

type UiState = State<Arc<Ui>>;

/// The body budget sign-in forms (each at most [`MAX_FORM_BYTES`], a fixed cap: one sized from
/// the token would tell a guesser its length) are read under, all connections together: the only bodies a
/// client without the token has read, kept apart from the budget the operators' writes use.
pub(super) const SIGN_IN_BUDGET: u64 = 1024 * 1024;
/// Of [`SIGN_IN_BUDGET`], what one address (IPv6: one /64) may hold at once.
const SIGN_IN_SHARE: u64 = 64 * 1024;

/// Largest form a dashboard POST may send (they carry a few short fields)...
const MAX_FORM_BYTES: usize = 16 * 1024;
/// ...but a state value's edit, which carries up to the largest value (percent-encoded).
pub(super) const MAX_STATE_FORM_BYTES: usize =
    3 * crate::model::MAX_STATE_VALUE_BYTES + MAX_FORM_BYTES;

/// `value` (an event id, a state key) as the last segment of a page's path, percent-encoded.
/// A browser resolves a segment `.` or `..` away before it sends the request (percent-encoded
/// too: `%2E%2E` is `..` to it), so such a value is written with a NUL after it (`..%00`), which
/// no id or key can hold, and [`segment_value`] takes it off again.
pub(super) fn path_segment(value: &str) -> String {
    let encoded = crate::cli::client::percent_encode(value);
    match value {
        "." | ".." => encoded + "%00",
        _ => encoded,
    }
}

/// The value [`path_segment`] wrote.
fn segment_value(segment: String) -> String {
    match segment.strip_suffix('\0') {
        Some(dots @ ("." | "..")) => dots.to_owned(),
        _ => segment,
    }
}

/// A page's two path values (`/events/{source}/{event_id}`, `/plugins/{name}/state/{key}`),
/// the second (an event id, a state key) as [`path_segment`] wrote it.
pub(super) struct Named(pub String, pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Named {
    type Rejection = axum::extract::rejection::PathRejection;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        use axum::extract::Path;
        let Path((first, last)) =
            Path::<(String, String)>::from_request_parts(parts, state).await?;
        Ok(Self(first, segment_value(last)))
    }
}

/// The largest form a POST to `path` may send.
fn form_limit(path: &str) -> usize {
    let state_edit = path.starts_with("/plugins/") && path.contains("/state/");
    if state_edit {
        MAX_STATE_FORM_BYTES
    } else {
        MAX_FORM_BYTES
    }
}

/// The policy every answer carries: only this listener's own script and style, no inline
/// script or style, forms posting only here, no framing, no base rewriting.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The dashboard's routes, for the admin listener's router to merge.
pub(super) fn router(
    shared: Arc<Shared>,
    guard: Arc<Guard>,
    lockout: Arc<super::lockout::Lockout>,
    bodies: &super::Bodies,
) -> Router<Arc<Shared>> {
    let ui = Arc::new(Ui {
        shared,
        sessions: Sessions::default(),
        lockout,
    });
    let signed_in = Router::new()
        .route("/", get(overview::page))
        .route("/overview/live", get(overview::live))
        .route("/events", get(events::list))
        .route("/events/{source}/{event_id}", get(events::detail))
        .route("/dead-letters", get(dead_letters::page))
        .route("/quarantine", get(quarantine::page))
        .route("/quarantine/{id}/replay", post(quarantine::replay))
        .route("/quarantine/{id}/discard", post(quarantine::discard))
        .route("/plugins", get(plugins::page))
        .route("/plugins/{name}/rollback", post(plugins::rollback))
        .route("/plugins/{name}/state", get(state::list))
        .route(
            "/plugins/{name}/state/{key}",
            get(state::key)
                .post(state::save)
                .layer(DefaultBodyLimit::max(MAX_STATE_FORM_BYTES)),
        )
        .route("/plugins/{name}/state/{key}/delete", post(state::delete))
        .route("/replay", post(replay::replay))
        .route("/discard", post(replay::discard))
        .route("/sign-out", post(sign_out))
        .route_layer(middleware::from_fn(refusals_as_pages))
        .route_layer(middleware::from_fn_with_state(ui.clone(), require_csrf))
        // Read once the session is known: only a signed-in client has a form read.
        .route_layer(middleware::from_fn_with_state(bodies.clone(), read_form))
        .route_layer(middleware::from_fn_with_state(ui.clone(), require_session));
    // The one form a client without the token may send: a small cap, and a budget of its own.
    let sign_in_bodies = bodies.capped(
        MAX_FORM_BYTES as u64,
        BodyBudget::new(SIGN_IN_BUDGET, SIGN_IN_SHARE),
    );
    let sign_in_form = middleware::from_fn_with_state(sign_in_bodies, read_form);
    Router::new()
        .route(
            "/sign-in",
            get(sign_in_page).post(sign_in.layer(sign_in_form)),
        )
        .route("/assets/{file}", get(assets::serve))
        .merge(signed_in)
        .route_layer(middleware::from_fn_with_state(guard, super::require_host))
        .with_state(ui)
}

/// The headers this module's invariants list, on every answer of the admin listener (its
/// pages, its JSON, its refusals and fallbacks alike: any of them may reach a browser).
pub(super) async fn security_headers(request: Request, next: Next) -> Response {
    let asset = request.uri().path().starts_with("/assets/");
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if !asset {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The CSRF field every dashboard form carries.
#[derive(Deserialize)]
struct CsrfField {
    #[serde(default)]
    csrf: String,
}

/// Lets a request through only with a live session (a page without one goes to the sign-in
/// form), [`SignedIn`] in its extensions, for [`require_csrf`] and the handler.
async fn require_session(State(ui): UiState, mut request: Request, next: Next) -> Response {
    // The overview's script asks for its live figures by itself: no sign of anyone there.
    let found = if request.uri().path() == "/overview/live" {
        ui.sessions.peek(request.headers(), Instant::now())
    } else {
        ui.sessions.find(request.headers(), Instant::now())
    };
    let Some(signed_in) = found else {
        // A HEAD is answered as its GET would be.
        if request.method() == Method::GET || request.method() == Method::HEAD {
            return Redirect::to("/sign-in").into_response();
        }
        return error_page(
            StatusCode::FORBIDDEN,
            "Your session has ended: sign in again.",
        );
    };
    request.extensions_mut().insert(signed_in);
    next.run(request).await
}

/// A signed-in request that changes state (a POST) carries its session's CSRF token, read from
/// its form (the body already read, under the listener's rules).
async fn require_csrf(State(ui): UiState, request: Request, next: Next) -> Response {
    let Some(signed_in) = request.extensions().get::<SignedIn>().cloned() else {
        return error_page(
            StatusCode::FORBIDDEN,
            "Your session has ended: sign in again.",
        );
    };
    let request = if request.method() == Method::GET || request.method() == Method::HEAD {
        request
    } else {
        let (parts, body) = request.into_parts();
        let Ok(bytes) = to_bytes(body, form_limit(parts.uri.path())).await else {
            return error_page(StatusCode::PAYLOAD_TOO_LARGE, "The form is too large.");
        };
        let form = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
        let presented = Form::<CsrfField>::from_request(form, &())
            .await
            .map(|Form(f)| f.csrf)
            .unwrap_or_default();
        if !ui.sessions.csrf_matches(&signed_in, &presented) {
            tracing::warn!(path = %parts.uri.path(), "dashboard request refused: bad CSRF token");
            return error_page(
                StatusCode::FORBIDDEN,
                "This form has expired or did not come from this dashboard: reload the page and try again.",
            );
        }
        Request::from_parts(parts, Body::from(bytes))
    };
    next.run(request).await
}

/// The dashboard's own error answer: an [`ApiError`] rendered as a page. A 4xx says why (the
/// caller's own mistake); anything else says nothing internal (the [`ApiError`] logs it).
pub(super) struct UiError(pub ApiError);

impl From<ApiError> for UiError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl From<crate::inbox::InboxError> for UiError {
    fn from(e: crate::inbox::InboxError) -> Self {
        Self(e.into())
    }
}

impl From<crate::ingest::replay::ReplayError> for UiError {
    fn from(e: crate::ingest::replay::ReplayError) -> Self {
        Self(super::handlers::replay_error(e))
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let message = self.0.to_string();
        let api = self.0.into_response();
        let status = api.status();
        if status.is_client_error() {
            error_page(status, &message)
        } else if status == StatusCode::SERVICE_UNAVAILABLE {
            let mut page = error_page(status, "The server is busy: try again in a moment.");
            if let Some(wait) = api.headers().get(header::RETRY_AFTER) {
                page.headers_mut().insert(header::RETRY_AFTER, wait.clone());
            }
            page
        } else {
            error_page(
                status,
                "Something went wrong on the server; its log says what.",
            )
        }
    }
}

/// [`super::read_body`] for the dashboard's forms: its refusals (a form over its cap, one that
/// stalls, a spent budget) answered as pages.
async fn read_form(State(bodies): State<super::Bodies>, request: Request, next: Next) -> Response {
    match super::read_body(State(bodies), request, next).await {
        Ok(response) => response,
        Err(refused) => UiError(refused).into_response(),
    }
}

/// A refusal axum wrote as plain text (a malformed number in a query, say) answered as the
/// dashboard's error page, like every other refusal of it.
async fn refusals_as_pages(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    match crate::error::plain_refusal(&mut response).await {
        Some(text) => error_page(response.status(), &text),
        None => response,
    }
}

/// A bare page saying `message`, answered with `status`.
pub(super) fn error_page(status: StatusCode, message: &str) -> Response {
    let body = html! {
        p.notice.error role="alert" { (message) }
        p { a href="/" { "Back to the overview" } }
    };
    (status, layout::bare("Error", body)).into_response()
}

async fn sign_in_page(State(ui): UiState, request: Request) -> Response {
    if ui
        .sessions
        .find(request.headers(), Instant::now())
        .is_some()
    {
        return Redirect::to("/").into_response();
    }
    layout::bare("Sign in", layout::sign_in_form(None)).into_response()
}

#[derive(Deserialize)]
struct SignInForm {
    #[serde(default)]
    token: String,
}

/// `POST /sign-in`: the admin token from the form, checked as the bearer token is.
async fn sign_in(State(ui): UiState, request: Request) -> Response {
    let address = crate::server::peer(request.extensions());
    let now = Instant::now();
    if let Some(wait) = address.and_then(|a| ui.lockout.locked_out(a, now)) {
        let message = format!(
            "Too many wrong admin tokens from this address: try again in {} s.",
            wait.as_secs() + 1
        );
        let mut response = error_page(StatusCode::TOO_MANY_REQUESTS, &message);
        if let Ok(value) = HeaderValue::from_str(&(wait.as_secs() + 1).to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    let headers = request.headers().clone();
    let token = Form::<SignInForm>::from_request(request, &())
        .await
        .map(|Form(f)| f.token)
        .unwrap_or_default();
    let right = ui
        .shared
        .config
        .server
        .admin_token
        .as_ref()
        .is_some_and(|t| t.matches(token.as_bytes()));
    // An empty form guessed nothing: refused, not counted (as a bearer check without a token).
    let guessed = !token.is_empty();
    drop(token);
    if !right {
        // A wrong token is logged (each address has a few before it is locked out); an empty
        // form, which guessed nothing and is not counted, is not, as the API's bearer check
        // logs no request without a token: either could be sent without end.
        if guessed {
            tracing::warn!(
                address = %address.map_or("unknown".to_owned(), |a| a.to_string()),
                "dashboard sign-in refused: wrong admin token"
            );
        }
        if let Some(address) = address.filter(|_| guessed) {
            ui.lockout.wrong_token(address, now, "dashboard sign-in");
        }
        tokio::time::sleep(FAILURE_DELAY).await;
        let form = layout::sign_in_form(Some("That is not the admin token."));
        return (StatusCode::UNAUTHORIZED, layout::bare("Sign in", form)).into_response();
    }
    let id = ui.sessions.create(now);
    let mut response = Redirect::to("/").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session::set_cookie(Some(&id), &headers));
    response
}

/// `POST /sign-out`: the session is removed and its cookie cleared.
async fn sign_out(
    State(ui): UiState,
    axum::Extension(signed_in): axum::Extension<SignedIn>,
    headers: axum::http::HeaderMap,
) -> Response {
    ui.sessions.remove(&signed_in);
    let mut response = Redirect::to("/sign-in").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session::set_cookie(None, &headers));
    response
}

/// A form field's value, trimmed; `None` when empty (an empty field does not filter).
pub(super) fn given(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// A form field that names one exact value (an event id, a state key prefix), as sent: an id
/// may begin or end with spaces, and trimmed it named another or none. `None` when empty.
pub(super) fn exact(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// Where a form may send the browser back to: a path on this listener, never another site.
pub(super) fn local_path(back: Option<&str>, fallback: &str) -> String {
    match back {
        Some(path)
            if path.starts_with('/')
                && !path.starts_with("//")
                && !path.contains('\\')
                && !path.chars().any(char::is_control) =>
        {
            path.to_owned()
        }
        _ => fallback.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_state_edit_may_post_a_large_form() {
        assert_eq!(form_limit("/plugins/c/state/count"), MAX_STATE_FORM_BYTES);
        assert_eq!(form_limit("/plugins/c/rollback"), MAX_FORM_BYTES);
        assert_eq!(form_limit("/replay"), MAX_FORM_BYTES);
        assert_eq!(form_limit("/discard"), MAX_FORM_BYTES);
    }

    #[test]
    fn only_a_local_path_is_a_place_to_go_back_to() {
        assert_eq!(local_path(Some("/events?x=1"), "/"), "/events?x=1");
        for bad in [
            "//evil.example/",
            "https://evil.example/",
            "/\\evil",
            "x",
            "/a\nb",
        ] {
            assert_eq!(local_path(Some(bad), "/"), "/", "{bad}");
        }
        assert_eq!(local_path(None, "/q"), "/q");
    }
}
