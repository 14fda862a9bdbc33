//! The admin routes: each parses its input into the owning room's terms, asks that room, and
//! answers with an [`api`] type.
//!
//! Invariants:
//! - A handler holds no business logic: filters are parsed here, the work is done by the inbox,
//!   the registry, [`crate::ingest::replay`] or [`crate::retention::discard`].
//! - A malformed query or body is answered by axum's own 4xx; everything else the contract's
//!   JSON (an [`api`] type, or an [`ApiError`]).
//! - A filter is never dropped: replay's and discard's filter is their JSON body alone, so a
//!   query string, or a body not sent as `application/json`, is refused in the contract's JSON
//!   (400, 415) instead of being ignored, which would widen the call to everything.

use std::sync::Arc;

use axum::{
    Json,
    body::Body,
    extract::{
        FromRequest, Path, Query, Request, State,
        rejection::{JsonRejection, QueryRejection},
    },
    http::{StatusCode, Uri, header},
    response::{IntoResponse, Response},
};

use super::api;
use crate::{
    Shared,
    cli::client::query as query_string,
    error::ApiError,
    inbox::{EventFilter, InboxError, ReplayFilter, cluster::NodeBeat},
    ingest::replay::{self, ReplayError},
    model::DeliveryState,
    registry::RollbackError,
    retention::discard,
};

/// Most deliveries (plus quarantined requests) one replay call touches.
pub const MAX_REPLAY: usize = 10_000;

/// Events listed when the query sets no `limit`, and the most it may ask for.
const DEFAULT_EVENTS: usize = 100;
pub const MAX_EVENTS: usize = 10_000;

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

impl From<InboxError> for Rejection {
    fn from(e: InboxError) -> Self {
        Self::Api(e.into())
    }
}

impl From<ReplayError> for Rejection {
    fn from(e: ReplayError) -> Self {
        Self::Api(replay_error(e))
    }
}

/// How a replay that did not run is answered: an unknown source or handler is the caller's
/// mistake.
pub(super) fn replay_error(e: ReplayError) -> ApiError {
    match e {
        ReplayError::UnknownSource(_) | ReplayError::UnknownHandler(_) => {
            ApiError::BadRequest(e.to_string())
        }
        ReplayError::Inbox(e) => e.into(),
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

impl From<RollbackError> for ApiError {
    fn from(e: RollbackError) -> Self {
        match e {
            RollbackError::UnknownFile(_) | RollbackError::NeverLoaded(..) => {
                Self::NotFound(e.to_string())
            }
            RollbackError::NoPrevious(_) | RollbackError::Moved { .. } => {
                Self::Conflict(e.to_string())
            }
        }
    }
}

#[utoipa::path(get, path = "/healthz", tag = "probes",
    responses((status = 200, description = "The host is up", body = api::Health)))]
pub(super) async fn healthz(State(shared): State<Arc<Shared>>) -> Json<api::Health> {
    Json(api::Health {
        backlog: shared.inbox.backlog(),
        pooling_allocator: shared.runtime.pooling(),
        status: "ok".to_owned(),
    })
}

/// How long `/readyz` waits for the database.
const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

#[utoipa::path(get, path = "/readyz", tag = "probes",
    responses(
        (status = 200, description = "The host's database answers: it can take webhooks", body = api::Readiness),
        (status = 503, description = "The database does not answer (within 2 s): ingest would answer 503", body = api::Readiness),
    ))]
pub(super) async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    match shared.inbox.ready(READY_WITHIN).await {
        Ok(()) => Json(api::Readiness {
            status: "ready".to_owned(),
            reason: None,
        })
        .into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            Json(api::Readiness {
                status: "unready".to_owned(),
                reason: Some(reason),
            }),
        )
            .into_response(),
    }
}

pub(super) fn parse_state(state: Option<&str>) -> Result<Option<DeliveryState>, ApiError> {
    state
        .map(|s| {
            DeliveryState::parse(s).ok_or_else(|| {
                let names = DeliveryState::ALL.map(DeliveryState::as_str).join(", ");
                ApiError::BadRequest(format!("state {s:?} is not one of {names}"))
            })
        })
        .transpose()
}

/// `GET /admin/events`: the request URI's query string → the inbox filter. This is the
/// handler's whole input parsing, public so it can be fuzzed.
pub fn events_filter(uri: &Uri) -> Result<EventFilter, Rejection> {
    let Query(query) = Query::<api::EventsQuery>::try_from_uri(uri).map_err(Rejection::Query)?;
    Ok(EventFilter {
        source: query.source,
        state: parse_state(query.state.as_deref())?,
        handler: query.handler,
        event_type: query.event_type,
        event_id: query.event_id,
        since_ms: query.since,
        until_ms: query.until,
        before: query.before,
        limit: query.limit.unwrap_or(DEFAULT_EVENTS).min(MAX_EVENTS),
    })
}

/// `GET /admin/events`: a full page also answers `Link: <next page>; rel="next"` (RFC 8288),
/// the same query with `before` set to the page's cursor; the body is the list alone.
#[utoipa::path(get, path = "/admin/events", tag = "events", params(api::EventsQuery),
    responses(
        (status = 200, description = "The newest events matching the filter", body = Vec<api::EventSummary>,
            headers(("Link" = String, description = "On a full page: `<the same query with before = this page's cursor>; rel=\"next\"`"))),
        (status = 400, description = "An unknown state (JSON), or a malformed query (text)", content(
            (api::ErrorBody = "application/json"), (String = "text/plain"))),
    ))]
pub(super) async fn list_events(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
) -> Result<Response, Rejection> {
    let filter = events_filter(&uri)?;
    let limit = filter.limit;
    let events = shared.inbox.list_events(filter).await?;
    let next = next_page(&events, limit).map(|before| {
        let Query(mut query) = Query::<api::EventsQuery>::try_from_uri(&uri).expect("parsed above");
        query.before = Some(before);
        format!(
            "<{}{}>; rel=\"next\"",
            uri.path(),
            query_string(&query.pairs())
        )
    });
    let body: Vec<api::EventSummary> = events.into_iter().map(Into::into).collect();
    let mut response = Json(body).into_response();
    if let Some(link) = next.and_then(|l| http::HeaderValue::from_str(&l).ok()) {
        response.headers_mut().insert(http::header::LINK, link);
    }
    Ok(response)
}

/// The cursor of the page after `events` (a page of at most `limit`), if it was full.
pub fn next_page(events: &[crate::inbox::EventSummary], limit: usize) -> Option<i64> {
    (limit > 0 && events.len() == limit)
        .then(|| events.last().map(|e| e.cursor))
        .flatten()
}

#[utoipa::path(get, path = "/admin/events/{source}/{event_id}", tag = "events",
    params(("source" = String, Path, description = "The source's name"),
           ("event_id" = String, Path, description = "The provider's event id")),
    responses(
        (status = 200, description = "The event with its deliveries and their history", body = api::EventDetail),
        (status = 400, description = "A path that is not UTF-8", body = String, content_type = "text/plain"),
        (status = 404, description = "No such event", body = api::ErrorBody),
    ))]
pub(super) async fn event_detail(
    State(shared): State<Arc<Shared>>,
    Path((source, event_id)): Path<(String, String)>,
) -> Result<Json<api::EventDetail>, ApiError> {
    let detail = shared
        .inbox
        .event_detail(source.clone(), event_id.clone())
        .await?;
    detail
        .map(|d| Json(d.into()))
        .ok_or_else(|| ApiError::NotFound(format!("no event {event_id:?} from source {source:?}")))
}

/// `POST /admin/replay` and `POST /admin/discard`: the request → what to replay (discard).
/// The filter is the JSON body alone: a query string is refused (400, naming its parameters),
/// and so is a non-empty body whose `Content-Type` is not JSON (415), rather than either being
/// ignored and the call widened to every dead delivery. No body (or an empty one) and a JSON
/// `null` mean "no filter". This is the handlers' whole input parsing, public so it can be
/// fuzzed.
pub async fn replay_filter(request: Request) -> Result<ReplayFilter, Rejection> {
    refuse_query(request.uri())?;
    let (parts, body) = request.into_parts();
    // In memory already: the listener read it whole, under its cap, before any route.
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(|e| ApiError::BadRequest(format!("reading the request body: {e}")))?;
    let body = if bytes.is_empty() {
        None
    } else {
        let path = parts.uri.path().to_owned();
        let sent = parts.headers.get(header::CONTENT_TYPE).map_or_else(
            || "no Content-Type".to_owned(),
            |v| format!("Content-Type {:?}", String::from_utf8_lossy(v.as_bytes())),
        );
        let size = bytes.len();
        let Json(body) = Json::<Option<api::ReplayRequest>>::from_request(
            Request::from_parts(parts, Body::from(bytes)),
            &(),
        )
        .await
        .map_err(|e| match e {
            JsonRejection::MissingJsonContentType(_) => {
                Rejection::Api(ApiError::UnsupportedMediaType(format!(
                    "POST {path}: a body of {size} bytes with {sent} is not read as a \
                 filter: send the filter as JSON with Content-Type: application/json (or no \
                 body for no filter); nothing was done"
                )))
            }
            e => Rejection::Body(e),
        })?;
        body
    };
    let body = body.unwrap_or_default();
    Ok(ReplayFilter {
        source: body.source,
        handler: body.handler,
        state: parse_state(body.state.as_deref())?,
        event_ids: body.event_ids,
        since_ms: body.since,
        until_ms: body.until,
        error_kind: body.error_kind,
        limit: MAX_REPLAY,
        dry_run: body.dry_run,
        force: body.force,
        orphaned: false,
        declared_handlers: None,
    })
}

/// Refuses any query string on a route whose filter is its JSON body, naming the parameters.
fn refuse_query(uri: &Uri) -> Result<(), ApiError> {
    let Some(query) = uri.query().filter(|q| !q.is_empty()) else {
        return Ok(());
    };
    let mut names: Vec<String> = Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map(|Query(pairs)| pairs.into_iter().map(|(name, _)| name).collect())
        .unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    let given = if names.is_empty() {
        format!("the query string {query:?}")
    } else {
        names
            .iter()
            .map(|name| format!("{name:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(ApiError::BadRequest(format!(
        "POST {} takes no query parameters, but was given {given}: its filter goes in the JSON \
         body, sent with Content-Type: application/json (e.g. {{\"source\": \"github\", \
         \"dry_run\": true}}); nothing was done",
        uri.path()
    )))
}

#[utoipa::path(post, path = "/admin/replay", tag = "replay",
    request_body(content = Option<api::ReplayRequest>, content_type = "application/json",
        description = "What to replay, the only place a filter is read (a query string is \
                       refused); no body (or an empty one), or `null`, replays every dead delivery"),
    responses(
        (status = 200, description = "What was selected and replayed", body = api::ReplayAnswer),
        (status = 400, description = "A query string, an unknown source or state (JSON), or a body that is not JSON (text); nothing was replayed", content(
            (api::ErrorBody = "application/json"), (String = "text/plain"))),
        (status = 415, description = "A body without `Content-Type: application/json` (`unsupported_media_type`); nothing was replayed", body = api::ErrorBody),
        (status = 422, description = "A JSON body of the wrong shape", body = String, content_type = "text/plain"),
    ))]
pub(super) async fn replay(
    State(shared): State<Arc<Shared>>,
    request: Request,
) -> Result<Json<api::ReplayAnswer>, Rejection> {
    let filter = replay_filter(request).await?;
    let report = replay::run(&shared, filter).await?;
    Ok(Json(report.into()))
}

#[utoipa::path(post, path = "/admin/discard", tag = "replay",
    request_body(content = Option<api::ReplayRequest>, content_type = "application/json",
        description = "What to discard (replay's filter; `state` may only be `dead`, or `pending` \
                       or `retrying` for a `handler` the configuration no longer declares), the only \
                       place a filter is read (a query string is refused); no body (or an empty \
                       one), or `null`, discards every dead delivery and every held quarantined \
                       request"),
    responses(
        (status = 200, description = "What was selected and discarded", body = api::DiscardAnswer),
        (status = 400, description = "A query string, an unknown source, a state discard does not take (JSON: other than `dead`, or `pending`/`retrying` of a handler the configuration no longer declares), or a body that is not JSON (text); nothing was discarded", content(
            (api::ErrorBody = "application/json"), (String = "text/plain"))),
        (status = 415, description = "A body without `Content-Type: application/json` (`unsupported_media_type`); nothing was discarded", body = api::ErrorBody),
        (status = 422, description = "A JSON body of the wrong shape", body = String, content_type = "text/plain"),
    ))]
/// `POST /admin/discard`: the body is replay's (`state` only `dead`, or the waiting states of a
/// handler no longer declared), at most [`MAX_REPLAY`]
/// per call.
pub(super) async fn discard(
    State(shared): State<Arc<Shared>>,
    request: Request,
) -> Result<Json<api::DiscardAnswer>, Rejection> {
    let filter = replay_filter(request).await?;
    let report = discard::run(&shared, filter).await?;
    Ok(Json(report.into()))
}

#[utoipa::path(get, path = "/admin/plugins", tag = "plugins",
    responses((status = 200, description = "Every configured plugin instance", body = Vec<api::PluginInfo>)))]
pub(super) async fn plugins(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<Vec<api::PluginInfo>>, ApiError> {
    Ok(Json(plugin_infos(&shared).await?))
}

/// Every configured plugin instance with its file's status and what each live node runs. In a
/// cluster, `previous` is the cluster's history of the file (what a rollback on any node goes
/// back to), not this node's.
pub(super) async fn plugin_infos(shared: &Shared) -> Result<Vec<api::PluginInfo>, ApiError> {
    let files = shared.registry.statuses();
    let histories: std::collections::HashMap<String, Vec<String>> = match shared.inbox.cluster() {
        Some(cluster) => cluster
            .releases()
            .await?
            .into_iter()
            .map(|release| (release.stem, release.previous))
            .collect(),
        None => Default::default(),
    };
    let alive: Vec<api::NodeInfo> = nodes_now(shared)
        .await?
        .into_iter()
        .filter(|node| node.alive)
        .collect();
    let list = shared
        .config
        .plugins
        .values()
        .map(|plugin| {
            let wasm = shared.registry.path_of(&plugin.wasm).display().to_string();
            // Two instances may share a file: each gets its own copy of the file's status.
            let file = files.get(&plugin.wasm).cloned();
            let mut info = api::PluginInfo::new(plugin.name.to_string(), wasm, file);
            if let Some(previous) = histories.get(&plugin.wasm) {
                info.previous = previous.clone();
            }
            info.shared_with = shared
                .config
                .instances_of(&plugin.wasm)
                .filter(|other| **other != plugin.name)
                .map(|other| other.to_string())
                .collect();
            info.nodes = alive
                .iter()
                .map(|node| (node.id.clone(), node.plugins.get(&plugin.wasm).cloned()))
                .collect();
            info
        })
        .collect();
    Ok(list)
}

#[utoipa::path(get, path = "/admin/nodes", tag = "nodes",
    responses((status = 200, description = "The nodes of the cluster (on SQLite, this one)", body = Vec<api::NodeInfo>)))]
pub(super) async fn nodes(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<Vec<api::NodeInfo>>, ApiError> {
    Ok(Json(nodes_now(&shared).await?))
}

/// The cluster's nodes as of now: their heartbeats on a shared database; on SQLite this node
/// alone, as it is now.
async fn nodes_now(shared: &Shared) -> Result<Vec<api::NodeInfo>, ApiError> {
    // The clock the heartbeats are stamped with.
    let now = shared.inbox.clock().now_ms();
    let this = &shared.node;
    let beats = match shared.inbox.cluster() {
        Some(cluster) => cluster.nodes().await?,
        None => {
            // As last sampled (a count over every delivery costs a scan of them all).
            let running = shared
                .inbox
                .state_counts(&[DeliveryState::Running])
                .await?
                .into_iter()
                .find_map(|(state, n)| (state == DeliveryState::Running.as_str()).then_some(n))
                .unwrap_or(0);
            let live = shared
                .registry
                .statuses()
                .into_iter()
                .filter_map(|(stem, status)| Some((stem, status.sha256?)))
                .collect();
            vec![NodeBeat {
                id: this.id.clone(),
                listen: this.listen.to_string(),
                admin_listen: this.admin_listen.to_string(),
                started_at_ms: this.started_at_ms,
                at_ms: now,
                in_flight: running.max(0) as u64,
                live,
            }]
        }
    };
    Ok(beats
        .into_iter()
        .map(|beat| api::NodeInfo::new(beat, now, &this.id))
        .collect())
}

#[utoipa::path(post, path = "/admin/plugins/{name}/rollback", tag = "plugins",
    params(("name" = String, Path, description = "The `[plugins.<name>]` instance")),
    responses(
        (status = 200, description = "The version now live", body = api::RollbackAnswer),
        (status = 400, description = "A path that is not UTF-8", body = String, content_type = "text/plain"),
        (status = 404, description = "No such plugin, or its file was never loaded", body = api::ErrorBody),
        (status = 409, description = "No previous version to return to, or (in a cluster) one the cluster has no bytes of, or a release another node changed meanwhile", body = api::ErrorBody),
        (status = 503, description = "The database cannot be reached now (a cluster's rollback looks the version up there); nothing was rolled back", body = api::ErrorBody),
    ))]
pub(super) async fn rollback(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Json<api::RollbackAnswer>, ApiError> {
    Ok(Json(rollback_plugin(&shared, name, None).await?))
}

/// Puts plugin instance `name`'s file back to its previous version, which every instance of
/// that file runs from then on; the answer (and the log line) names them all. In a cluster the
/// previous version is the cluster's (its release's history, the same on every node), and the
/// rollback is a publish of it, which every node follows; it must be one the cluster stores
/// (every node must be able to run it): otherwise it is refused, and nothing changes.
pub(super) async fn rollback_plugin(
    shared: &Shared,
    name: String,
    expected: Option<&str>,
) -> Result<api::RollbackAnswer, ApiError> {
    let plugin = shared
        .config
        .plugins
        .get(name.as_str())
        .ok_or_else(|| ApiError::NotFound(format!("no plugin {name:?}")))?;
    // The instance asked for and its file, which may be named otherwise (the error names the
    // file: the instance is said first only when its name is another).
    let named = |e: RollbackError| match ApiError::from(e) {
        e if name == plugin.wasm.as_str() => e,
        ApiError::NotFound(d) => ApiError::NotFound(format!("plugin {name}: {d}")),
        ApiError::Conflict(d) => ApiError::Conflict(format!("plugin {name}: {d}")),
        other => other,
    };
    let sha256 = match shared.inbox.cluster() {
        Some(cluster) => {
            let (from, target) =
                cluster_rollback_target(shared, &*cluster, &plugin.wasm, &named).await?;
            crate::registry::check_expected(&plugin.wasm, expected, &target).map_err(named)?;
            let Some(bytes) = cluster.plugin_bytes(&target).await? else {
                return Err(ApiError::Conflict(format!(
                    "plugin {name}: its previous version {target} ran only on this node and was \
                     never published to the cluster, which has no bytes of it for the other \
                     nodes; nothing was rolled back (drop that version's file into plugins_dir \
                     to publish it)"
                )));
            };
            // Only from the release read: a publish on another node in between is not undone.
            let rolled = cluster
                .roll_back(&plugin.wasm, &from, &target, &shared.node.id)
                .await?;
            if rolled.is_none() {
                return Err(ApiError::Conflict(format!(
                    "plugin {name}: the cluster's version changed while rolling back (another \
                     node published or rolled back {}); nothing was rolled back: see GET \
                     /admin/plugins and roll back again if still wanted",
                    plugin.wasm
                )));
            }
            // Live here at once if this node still holds it; else the sync loads it, as on
            // every other node.
            shared.registry.rollback_to(&plugin.wasm, &target);
            // The file holds it too, as on the nodes that adopt it: left holding the version
            // rolled back from, a later touch of the file here (a chmod -R) reloaded that one
            // as new, and the sync published it back to every node. The rollback is done
            // whatever this write does: an error answered now would be retried, and take the
            // cluster back one more version.
            if let Err(e) =
                crate::cluster::write_release(&shared.registry, &plugin.wasm, &target, &bytes).await
            {
                tracing::error!(
                    plugin = %name,
                    sha256 = %target,
                    "rolled back, but this node's file still holds the version rolled back \
                     from ({e:#}): fix plugins_dir and write the file again, or a change to it \
                     publishes that version again"
                );
            }
            target
        }
        None => {
            let live = shared
                .registry
                .rollback(&plugin.wasm, expected)
                .map_err(named)?;
            live.plugin.sha256().to_owned()
        }
    };
    let instances: Vec<String> = shared
        .config
        .instances_of(&plugin.wasm)
        .map(|instance| instance.to_string())
        .collect();
    tracing::info!(
        plugin = %name,
        file = %plugin.wasm,
        sha256 = %sha256,
        instances = %instances.join(", "),
        "rolled back"
    );
    Ok(api::RollbackAnswer {
        name,
        sha256,
        instances,
    })
}

/// The version a cluster's rollback of file `stem` goes to: the newest of its release's
/// earlier versions. A file this node never loaded is [`RollbackError::NeverLoaded`] (or
/// unknown), as on one node.
async fn cluster_rollback_target(
    shared: &Shared,
    cluster: &dyn crate::inbox::cluster::ClusterStore,
    stem: &str,
    named: impl Fn(RollbackError) -> ApiError,
) -> Result<(String, String), ApiError> {
    if let Err(e @ (RollbackError::NeverLoaded(..) | RollbackError::UnknownFile(_))) =
        shared.registry.rollback_target(stem)
    {
        return Err(named(e));
    }
    let releases = cluster.releases().await?;
    releases
        .into_iter()
        .find(|release| release.stem == stem)
        .and_then(|release| {
            let to = release.previous.into_iter().next()?;
            Some((release.sha256, to))
        })
        .ok_or_else(|| named(RollbackError::NoPrevious(stem.to_owned())))
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    #[test]
    fn rolling_back_a_file_never_loaded_is_not_found() {
        let response = ApiError::from(RollbackError::UnknownFile("h".into())).into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_replay_of_an_unknown_source_is_a_bad_request() {
        let response = Rejection::from(ReplayError::UnknownSource("nope".into())).into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }

    /// [`replay_filter`] of a `POST` to `uri` with `content_type` and `body`, done on its first
    /// poll (as the fuzz target needs: no I/O).
    fn filter_of(
        uri: &str,
        content_type: Option<&str>,
        body: &'static str,
    ) -> Result<ReplayFilter, Rejection> {
        use std::{
            future::Future,
            task::{Context, Poll, Waker},
        };
        let mut request = Request::post(uri);
        if let Some(content_type) = content_type {
            request = request.header(header::CONTENT_TYPE, content_type);
        }
        let mut parse = std::pin::pin!(replay_filter(request.body(Body::from(body)).unwrap()));
        match parse.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => result,
            Poll::Pending => panic!("parsing an in-memory body waited"),
        }
    }

    /// The status, `Content-Type` and JSON body `rejection` is answered with.
    async fn answer(rejection: Rejection) -> (StatusCode, String, serde_json::Value) {
        let response = rejection.into_response();
        let status = response.status();
        let content_type = response.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, content_type, serde_json::from_slice(&body).unwrap())
    }

    #[test]
    fn no_body_an_empty_one_or_null_is_no_filter_and_a_json_body_is_the_filter() {
        for (content_type, body) in [
            (None, ""),
            (Some("application/json"), ""),
            (Some("text/plain"), ""),
            (Some("application/json"), "null"),
        ] {
            let filter = filter_of("/admin/replay", content_type, body).unwrap();
            assert_eq!(
                (filter.source, filter.event_ids, filter.dry_run),
                (None, None, false),
                "{content_type:?} {body:?}"
            );
        }
        let filter = filter_of(
            "/admin/discard",
            Some("application/json; charset=utf-8"),
            r#"{"source": "gen", "dry_run": true}"#,
        )
        .unwrap();
        assert_eq!(
            (filter.source.as_deref(), filter.dry_run),
            (Some("gen"), true)
        );
    }

    /// A filter where it is not read used to be dropped, and the call replayed (discarded)
    /// every dead delivery.
    #[tokio::test]
    async fn a_query_string_is_refused_naming_its_parameters() {
        for body in ["", r#"{"dry_run": true}"#] {
            let refused = filter_of(
                "/admin/discard?dry_run=true&source=gen&source=x",
                Some("application/json"),
                body,
            )
            .unwrap_err();
            let (status, content_type, reply) = answer(refused).await;
            assert_eq!(
                (status, content_type.as_str(), &reply["error"]),
                (
                    StatusCode::BAD_REQUEST,
                    "application/json",
                    &serde_json::json!("bad_request")
                )
            );
            let detail = reply["detail"].as_str().unwrap();
            assert!(
                detail.starts_with(
                    "POST /admin/discard takes no query parameters, but was given \"dry_run\", \
                     \"source\": its filter goes in the JSON body"
                ),
                "{detail}"
            );
        }
        assert!(filter_of("/admin/replay?", None, "").is_ok());
    }

    #[tokio::test]
    async fn a_body_not_sent_as_json_is_refused_with_415() {
        let filter = r#"{"dry_run": true, "event_ids": ["nothing"]}"#;
        for content_type in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
        ] {
            let refused = filter_of("/admin/replay", content_type, filter).unwrap_err();
            let (status, kind, reply) = answer(refused).await;
            assert_eq!(
                (status, kind.as_str(), &reply["error"]),
                (
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "application/json",
                    &serde_json::json!("unsupported_media_type")
                ),
                "{content_type:?}"
            );
            let detail = reply["detail"].as_str().unwrap();
            assert!(
                detail.starts_with("POST /admin/replay: a body of 43 bytes with ")
                    && detail
                        .contains("send the filter as JSON with Content-Type: application/json"),
                "{detail}"
            );
        }
    }
}
