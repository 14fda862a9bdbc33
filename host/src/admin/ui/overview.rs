//! The overview page: the inbox's figures now (backlog, held requests, deliveries by state,
//! the oldest due delivery's lag) and the last hour's events received per source and minute as
//! a server-drawn SVG chart; the live part is re-fetched by the page's script every
//! [`REFRESH_SECS`] s (`/overview/live`), and is the same HTML without it.
//!
//! Invariant: every figure comes from the inbox's read models; the chart is drawn here as
//! plain SVG (no chart library, no script).

use std::{sync::Arc, time::SystemTime};

use axum::{
    Extension,
    extract::State,
    response::{IntoResponse, Response},
};
use maud::{Markup, html};

use super::{
    Ui, UiError, format,
    layout::{self, Nav},
    session::SignedIn,
};
use crate::model::{DeliveryState, unix_ms};

/// Seconds between refreshes of the live part.
const REFRESH_SECS: u32 = 10;
/// Minutes the chart spans.
const MINUTES: i64 = 60;
const MINUTE_MS: i64 = 60_000;
/// Series colours, as the legend's `.sN` classes.
const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// `GET /`.
pub(super) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
) -> Result<Response, UiError> {
    let live = live_part(&ui).await?;
    let body = html! {
        p.muted aria-live="polite" #refresh-status { "Refreshes every " (REFRESH_SECS) " s." }
        section #live data-refresh="/overview/live" data-every=(REFRESH_SECS) { (live) }
    };
    Ok(layout::page("Overview", Nav::Overview, &signed_in, body).into_response())
}

/// `GET /overview/live`: the live part alone, for the page's script.
pub(super) async fn live(State(ui): State<Arc<Ui>>) -> Result<Response, UiError> {
    Ok(live_part(&ui).await?.into_response())
}

async fn live_part(ui: &Ui) -> Result<Markup, UiError> {
    let inbox = &ui.shared.inbox;
    let now = unix_ms(SystemTime::now());
    let states = inbox.state_counts().await?;
    let oldest_due = inbox.oldest_due().await?;
    let start = (now / MINUTE_MS - (MINUTES - 1)) * MINUTE_MS;
    let minutes = inbox.received_per_minute(start).await?;
    let count = |state: DeliveryState| {
        states
            .iter()
            .find(|(s, _)| s == state.as_str())
            .map_or(0, |(_, n)| *n)
    };
    let lag = oldest_due.filter(|due| *due <= now).map(|due| now - due);
    // One series per source: events per minute, oldest minute first.
    let mut series: Vec<(String, Vec<f64>)> = Vec::new();
    for minute in &minutes {
        let slot = ((minute.minute_ms - start) / MINUTE_MS) as usize;
        if slot >= MINUTES as usize {
            continue;
        }
        let index = match series.iter().position(|(s, _)| *s == minute.source) {
            Some(i) => i,
            None => {
                series.push((minute.source.clone(), vec![0.0; MINUTES as usize]));
                series.len() - 1
            }
        };
        series[index].1[slot] = minute.count as f64;
    }
    series.sort_by(|a, b| a.0.cmp(&b.0));
    let received: i64 = minutes.iter().map(|m| m.count).sum();
    Ok(html! {
        div.cards {
            div.card { div.value { (inbox.backlog()) } div.label { "Backlog (open deliveries)" } }
            div.card {
                div.value { @if let Some(lag) = lag { (format::duration(lag)) } @else { "—" } }
                div.label { "Oldest due delivery waiting" }
            }
            div.card { div.value { (count(DeliveryState::Dead)) } div.label { a href="/dead-letters" { "Dead letters" } } }
            div.card { div.value { (inbox.quarantine_held()) } div.label { a href="/quarantine" { "Held in quarantine" } } }
            div.card { div.value { (received) } div.label { "Events received, last hour" } }
        }
        div.charts {
            figure {
                figcaption #received-title { "Events received per minute, by source (last hour, UTC)" }
                (line_chart(&series, start, "received-title"))
                ul.legend {
                    @for (i, (source, _)) in series.iter().enumerate() {
                        li { span class={ "swatch s" (i % PALETTE.len()) } {} (source) }
                    }
                }
            }
            figure {
                figcaption { "Deliveries by state" }
                div.scroll { table {
                    thead { tr { th scope="col" { "State" } th scope="col" class="num" { "Deliveries" } } }
                    tbody {
                        @for state in DeliveryState::ALL {
                            tr {
                                td { a href={ "/events?state=" (state.as_str()) } { (layout::badge(state.as_str())) } }
                                td.num { (count(state)) }
                            }
                        }
                    }
                } }
            }
        }
    })
}

/// A line per series over the [`MINUTES`] minutes from `start_ms`, y from 0 to the largest
/// value, with axis labels; labelled by the element `labelled_by`.
fn line_chart(series: &[(String, Vec<f64>)], start_ms: i64, labelled_by: &str) -> Markup {
    const W: f64 = 600.0;
    const H: f64 = 200.0;
    const LEFT: f64 = 40.0;
    const BOTTOM: f64 = 20.0;
    let max = series
        .iter()
        .flat_map(|(_, values)| values.iter().copied())
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let x = |i: usize| LEFT + (W - LEFT - 8.0) * i as f64 / (MINUTES - 1) as f64;
    let y = |v: f64| 8.0 + (H - BOTTOM - 8.0) * (1.0 - v / max);
    let ticks = [0, 15, 30, 45, 59];
    html! {
        svg.chart viewBox={ "0 0 " (W) " " (H) } role="img" aria-labelledby=(labelled_by) {
            line x1=(LEFT) y1=(y(0.0)) x2=(W - 8.0) y2=(y(0.0)) stroke="#d0d7de" {}
            line x1=(LEFT) y1=(y(max)) x2=(W - 8.0) y2=(y(max)) stroke="#eef1f4" {}
            text x=(LEFT - 4.0) y=(y(max) + 4.0) text-anchor="end" font-size="11" fill="#57606a" { (max) }
            text x=(LEFT - 4.0) y=(y(0.0) + 4.0) text-anchor="end" font-size="11" fill="#57606a" { "0" }
            @for tick in ticks {
                @let anchor = match tick { 0 => "start", 59 => "end", _ => "middle" };
                text x=(x(tick)) y=(H - 4.0) text-anchor=(anchor) font-size="11" fill="#57606a" {
                    (format::utc(start_ms + tick as i64 * MINUTE_MS)[11..16])
                }
            }
            @for (i, (_, values)) in series.iter().enumerate() {
                polyline fill="none" stroke=(PALETTE[i % PALETTE.len()]) stroke-width="2"
                    points=(values.iter().enumerate().map(|(m, v)| format!("{:.1},{:.1}", x(m), y(*v))).collect::<Vec<_>>().join(" ")) {}
            }
            @if series.is_empty() {
                text x=(W / 2.0) y=(H / 2.0) text-anchor="middle" font-size="13" fill="#57606a" { "No events in the last hour" }
            }
        }
    }
}
