//! `GET /metrics`: the inbox's counts in the Prometheus text format.
//!
//! Invariant: the metric names and labels are a contract (dashboards and alerts scrape them);
//! every delivery state has a `hookd_deliveries` line, 0 when none is in it.

use std::{collections::BTreeMap, fmt::Write as _, sync::Arc};

use axum::{
    extract::State,
    http::header,
    response::{IntoResponse, Response},
};

use crate::{Shared, error::ApiError, model::DeliveryState};

#[utoipa::path(get, path = "/metrics", tag = "probes",
    responses((status = 200, description = "The inbox's counts, Prometheus text format", body = String,
        content_type = "text/plain")))]
pub(super) async fn metrics(State(shared): State<Arc<Shared>>) -> Result<Response, ApiError> {
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
