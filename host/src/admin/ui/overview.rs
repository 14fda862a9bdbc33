//! The overview page: the last hour minute by minute from this node's telemetry (per source,
//! requests by outcome and acknowledgement latency; attempts by handler and outcome) as
//! server-drawn SVG charts, and the inbox's figures as last sampled (deliveries by state, the
//! oldest due delivery's lag, held requests). The live part is re-fetched by the page's script
//! every [`REFRESH_SECS`] s (`/overview/live`) and is the same HTML without it.
//!
//! Invariant: every figure comes from [`crate::telemetry`] (`recent`, `inbox_gauges`) or the
//! inbox façade; the charts are plain SVG drawn here (no chart library, no script).

use std::{collections::BTreeMap, sync::Arc};

use axum::{
    Extension,
    extract::State,
    response::{IntoResponse, Response},
};
use maud::{Markup, html};

use super::{
    Ui, format,
    layout::{self, Nav},
    session::SignedIn,
};
use crate::telemetry::{Minute, Recent};

/// Seconds between refreshes of the live part.
const REFRESH_SECS: u32 = 10;
const MINUTE_MS: i64 = 60_000;
/// Series colours; the legend's `.sN` classes match them.
const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// A chart's lines: name → one value per minute (`None`: nothing that minute).
type Series = BTreeMap<String, Vec<Option<f64>>>;

/// `GET /`.
pub(super) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
) -> Response {
    let body = html! {
        p.muted aria-live="polite" #refresh-status { "Refreshes every " (REFRESH_SECS) " s." }
        section #live data-refresh="/overview/live" data-every=(REFRESH_SECS) aria-label="Live figures" {
            (live_part(&ui))
        }
    };
    layout::page("Overview", Nav::Overview, &signed_in, body).into_response()
}

/// `GET /overview/live`: the live part alone, for the page's script.
pub(super) async fn live(State(ui): State<Arc<Ui>>) -> Response {
    live_part(&ui).into_response()
}

/// Adds `value` at minute `slot` of series `name` (created empty for `minutes` minutes).
fn add(series: &mut Series, name: &str, minutes: usize, slot: usize, value: f64) {
    let values = series
        .entry(name.to_owned())
        .or_insert_with(|| vec![None; minutes]);
    values[slot] = Some(values[slot].unwrap_or(0.0) + value);
}

fn live_part(ui: &Ui) -> Markup {
    let shared = &ui.shared;
    let now = shared.inbox.clock().now_ms();
    let Recent { minutes } = shared.telemetry.recent(now);
    let gauges = shared.telemetry.inbox_gauges();
    let start = minutes.first().map_or(now, |m| m.start_ms);
    let n = minutes.len();
    // Per source: requests by outcome, and ack latency p50/p99; attempts by outcome and by
    // plugin; hour totals of attempts per (plugin, outcome).
    let mut requests: BTreeMap<String, Series> = BTreeMap::new();
    let mut latency: BTreeMap<String, Series> = BTreeMap::new();
    let mut attempts_by_outcome = Series::new();
    let mut attempt_totals: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut requests_total = 0;
    for (
        slot,
        Minute {
            ingest, attempts, ..
        },
    ) in minutes.iter().enumerate()
    {
        for source in ingest {
            let chart = requests.entry(source.source.clone()).or_default();
            for (outcome, count) in &source.outcomes {
                add(chart, outcome, n, slot, *count as f64);
                requests_total += count;
            }
            let lat = latency.entry(source.source.clone()).or_default();
            if let Some(p50) = source.ack_p50_ms {
                add(lat, "p50", n, slot, p50);
            }
            if let Some(p99) = source.ack_p99_ms {
                add(lat, "p99", n, slot, p99);
            }
        }
        for attempt in attempts {
            add(
                &mut attempts_by_outcome,
                &attempt.outcome,
                n,
                slot,
                attempt.count as f64,
            );
            *attempt_totals
                .entry((attempt.plugin.clone(), attempt.outcome.clone()))
                .or_default() += attempt.count;
        }
    }
    let count = |state: &str| {
        gauges
            .states
            .iter()
            .find(|(s, _)| s == state)
            .map_or(0, |(_, c)| *c)
    };
    let lag = gauges
        .oldest_due_ms
        .filter(|due| *due <= now)
        .map(|due| now - due);
    let attempts_total: u64 = attempt_totals.values().sum();
    html! {
        div.cards {
            div.card { div.value { (shared.inbox.backlog()) } div.label { "Backlog (open deliveries)" } }
            div.card {
                div.value { @if let Some(lag) = lag { (format::duration(lag)) } @else { "—" } }
                div.label { "Oldest due delivery waiting" }
            }
            div.card { div.value { (count("dead")) } div.label { a href="/dead-letters" { "Dead letters" } } }
            div.card { div.value { (gauges.quarantined) } div.label { a href="/quarantine" { "Held in quarantine" } } }
            div.card { div.value { (requests_total) } div.label { "Requests, last hour" } }
            div.card { div.value { (attempts_total) } div.label { "Attempts, last hour" } }
        }
        p.muted {
            "Charts: this node, the last hour, per minute (UTC). Inbox figures sampled "
            @if gauges.sampled_at_ms > 0 { (layout::time(gauges.sampled_at_ms)) } @else { "not yet" } "."
        }
        h2 { "Requests by source" }
        @if requests.is_empty() { p.notice { "No request in the last hour." } }
        div.charts {
            @for (source, chart) in &requests {
                @let name = source_label(source);
                (figure(&format!("{name}: requests per minute by outcome"), chart, start, n, ""))
                @if let Some(lat) = latency.get(source) {
                    (figure(&format!("{name}: acknowledgement time"), lat, start, n, " ms"))
                }
            }
        }
        h2 { "Attempts" }
        div.charts {
            (figure("Attempts per minute by outcome", &attempts_by_outcome, start, n, ""))
            figure {
                figcaption { "Attempts by handler and outcome, last hour" }
                @if attempt_totals.is_empty() { p.muted { "None." } } @else {
                    div.scroll { table {
                        thead { tr { th scope="col" { "Handler" } th scope="col" { "Outcome" } th scope="col" class="num" { "Attempts" } } }
                        tbody {
                            @for ((plugin, outcome), total) in &attempt_totals {
                                tr { td { (plugin) } td { (layout::badge(outcome)) } td.num { (total) } }
                            }
                        }
                    } }
                }
            }
        }
        h2 { "Deliveries by state" }
        div.scroll { table {
            thead { tr { th scope="col" { "State" } th scope="col" class="num" { "Deliveries" } } }
            tbody {
                @for (state, n) in &gauges.states {
                    tr {
                        td { a href={ "/events?state=" (state) } { (layout::badge(state)) } }
                        td.num { (n) }
                    }
                }
            }
        } }
    }
}

/// A captioned chart with its legend.
fn figure(caption: &str, series: &Series, start_ms: i64, minutes: usize, unit: &str) -> Markup {
    html! {
        figure {
            figcaption { (caption) }
            (line_chart(series, start_ms, minutes, unit, caption))
            ul.legend {
                @for (i, name) in series.keys().enumerate() {
                    li { span class={ "swatch s" (i % PALETTE.len()) } {} (name) }
                }
            }
        }
    }
}

/// A line per series over `minutes` minutes from `start_ms`, y from 0 to the largest value;
/// a minute without a value is skipped by its line. `label` names the chart for screen readers.
fn line_chart(series: &Series, start_ms: i64, minutes: usize, unit: &str, label: &str) -> Markup {
    const W: f64 = 600.0;
    const H: f64 = 180.0;
    const LEFT: f64 = 48.0;
    const BOTTOM: f64 = 20.0;
    let max = series
        .values()
        .flatten()
        .flatten()
        .copied()
        .fold(0.0_f64, f64::max);
    let max = if max > 0.0 { max } else { 1.0 };
    let last = minutes.saturating_sub(1).max(1) as f64;
    let x = |i: usize| LEFT + (W - LEFT - 8.0) * i as f64 / last;
    let y = |v: f64| 8.0 + (H - BOTTOM - 8.0) * (1.0 - v / max);
    let ticks: Vec<usize> = [
        0,
        minutes / 4,
        minutes / 2,
        minutes * 3 / 4,
        minutes.saturating_sub(1),
    ]
    .into_iter()
    .filter(|t| *t < minutes)
    .collect();
    let top = if max >= 10.0 {
        format!("{max:.0}{unit}")
    } else {
        format!("{max:.1}{unit}")
    };
    html! {
        svg.chart viewBox={ "0 0 " (W) " " (H) } role="img" aria-label=(label) {
            line x1=(LEFT) y1=(y(0.0)) x2=(W - 8.0) y2=(y(0.0)) stroke="#d0d7de" {}
            line x1=(LEFT) y1=(y(max)) x2=(W - 8.0) y2=(y(max)) stroke="#eef1f4" {}
            text x=(LEFT - 4.0) y=(y(max) + 4.0) text-anchor="end" font-size="11" fill="#57606a" { (top) }
            text x=(LEFT - 4.0) y=(y(0.0) + 4.0) text-anchor="end" font-size="11" fill="#57606a" { "0" }
            @for tick in &ticks {
                @let anchor = if *tick == 0 { "start" } else if *tick + 1 == minutes { "end" } else { "middle" };
                text x=(x(*tick)) y=(H - 4.0) text-anchor=(anchor) font-size="11" fill="#57606a" {
                    (format::utc(start_ms + *tick as i64 * MINUTE_MS)[11..16])
                }
            }
            @for (i, values) in series.values().enumerate() {
                @let colour = PALETTE[i % PALETTE.len()];
                @let points: Vec<(f64, f64)> = values.iter().enumerate()
                    .filter_map(|(m, v)| v.map(|v| (x(m), y(v)))).collect();
                polyline fill="none" stroke=(colour) stroke-width="2"
                    points=(points.iter().map(|(px, py)| format!("{px:.1},{py:.1}")).collect::<Vec<_>>().join(" ")) {}
                // A dot per minute, so a lone minute shows too.
                @for (px, py) in &points {
                    circle cx=(format!("{px:.1}")) cy=(format!("{py:.1}")) r="2.5" fill=(colour) {}
                }
            }
            @if series.is_empty() {
                text x=(W / 2.0) y=(H / 2.0) text-anchor="middle" font-size="13" fill="#57606a" { "Nothing in the last hour" }
            }
        }
    }
}

/// A source's name in a chart's caption; the requests counted under no source (an unknown
/// source, a path that is no route) are named for what they are.
fn source_label(source: &str) -> &str {
    if source.is_empty() {
        "No configured source (unknown sources, paths that are no route)"
    } else {
        source
    }
}

#[cfg(test)]
mod tests {
    /// A chart of the requests under no source has a caption, not a blank name.
    #[test]
    fn the_requests_of_no_source_are_named_in_their_caption() {
        assert_eq!(super::source_label("github"), "github");
        assert!(super::source_label("").starts_with("No configured source"));
    }
}
