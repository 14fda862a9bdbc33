//! `GET /metrics`: this host's metrics in the Prometheus text format ([`crate::telemetry`]).
//!
//! Invariant: a scrape renders what is in memory (the database-derived figures are sampled by
//! the telemetry's own task), so scraping costs no query; the metric names and labels are a
//! contract (dashboards and alerts scrape them).

use std::sync::Arc;

use axum::{
    extract::State,
    http::header,
    response::{IntoResponse, Response},
};

use crate::Shared;

pub(super) async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let text = shared
        .telemetry
        .render(&shared.inbox, &shared.registry.live_versions());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
