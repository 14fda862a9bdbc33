//! The plugins page: for each configured instance its file's live version (sha256, WIT
//! version, roles, when loaded, the load error), the previous versions with a rollback, the
//! instances sharing the file, what each live node runs, and (for a handler) a link to its
//! state.
//!
//! Invariant: the page shows exactly what `GET /admin/plugins` answers
//! ([`crate::admin::handlers::plugin_infos`]) and rolls back exactly as
//! `POST /admin/plugins/{name}/rollback` does.

use std::sync::Arc;

use axum::{
    Extension, Form,
    extract::{Path, State},
    response::{IntoResponse, Redirect, Response},
};
use maud::html;
use serde::Deserialize;

use super::{
    Ui, UiError, format,
    layout::{self, Nav},
    session::SignedIn,
};
use crate::{
    admin::handlers::{plugin_infos, rollback_plugin},
    cli::client::percent_encode,
};

/// `GET /plugins`.
pub(super) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
) -> Result<Response, UiError> {
    let plugins = plugin_infos(&ui.shared).await?;
    let body = html! {
        @for plugin in &plugins {
            section.delivery aria-labelledby={ "plugin-" (plugin.name) } {
                header {
                    h2 id={ "plugin-" (plugin.name) } { (plugin.name) }
                    (live_badge(plugin.sha256.is_some(), plugin.error.is_some()))
                }
                dl.envelope {
                    dt { "File" } dd.mono { (plugin.wasm) }
                    dt { "Live sha256" } dd.sha { (plugin.sha256.as_deref().unwrap_or("— (not loaded)")) }
                    dt { "Interface" } dd { @if let Some(v) = &plugin.wit_version { "hookd:plugin@" (v) } @else { "—" } }
                    dt { "Roles" } dd { @if plugin.exports.is_empty() { "—" } @else { (plugin.exports.join(", ")) } }
                    dt { "Live since" } dd { @if let Some(at) = plugin.loaded_at { (layout::time(at)) } @else { "—" } }
                    @if let Some(error) = &plugin.error {
                        dt { "Error" } dd.mono { (error) }
                    }
                    dt { "Shares its file with" } dd {
                        @if plugin.shared_with.is_empty() { "no other instance" } @else { (plugin.shared_with.join(", ")) }
                    }
                    @if plugin.exports.iter().any(|role| role == "handler") {
                        dt { "State" } dd {
                            a href={ "/plugins/" (percent_encode(&plugin.name)) "/state" } { "Keys of " (plugin.name) }
                        }
                    }
                    @if plugin.nodes.len() > 1 {
                        dt { "Nodes" } dd { ul {
                            @for (node, sha) in &plugin.nodes {
                                li { span.mono { (node) } ": " span.sha { (sha.as_deref().map_or("not loaded", format::short_sha)) } }
                            }
                        } }
                    }
                }
                h3 { "Previous versions" }
                @if plugin.previous.is_empty() {
                    p.muted { "None kept: a rollback has no version to return to." }
                } @else {
                    ol {
                        @for sha in &plugin.previous { li.sha { (sha) } }
                    }
                    form method="post" action={ "/plugins/" (percent_encode(&plugin.name)) "/rollback" }
                        data-confirm={ "Roll " (plugin.name) " back to " (format::short_sha(&plugin.previous[0])) "?" } {
                        (layout::csrf_field(&signed_in))
                        // The version the operator confirms: a rollback or a new file since
                        // this page was shown makes the form refused, not step further back.
                        input type="hidden" name="expect" value=(plugin.previous[0]);
                        button.danger type="submit" {
                            "Roll back to " span.sha { (format::short_sha(&plugin.previous[0])) }
                        }
                    }
                }
            }
        }
    };
    Ok(layout::page("Plugins", Nav::Plugins, &signed_in, body).into_response())
}

/// Whether a version serves: one whose file failed to load or was removed since (an error
/// beside a live sha256) still does, and says so.
fn live_badge(live: bool, error: bool) -> maud::Markup {
    let (class, text) = match (live, error) {
        (true, false) => ("badge ok", "live"),
        (true, true) => ("badge warn", "live, with an error"),
        (false, _) => ("badge bad", "not loaded"),
    };
    html! { span class=(class) { (text) } }
}

/// The rollback form: the version the page offered to return to.
#[derive(Debug, Deserialize)]
pub(super) struct RollbackForm {
    /// Absent from a page served before hookd knew of it: then no check.
    #[serde(default)]
    expect: Option<String>,
}

/// `POST /plugins/{name}/rollback`: only to the version the page named (else a 409 page).
pub(super) async fn rollback(
    State(ui): State<Arc<Ui>>,
    Path(name): Path<String>,
    Form(form): Form<RollbackForm>,
) -> Result<Response, UiError> {
    rollback_plugin(&ui.shared, name, form.expect.as_deref()).await?;
    Ok(Redirect::to("/plugins").into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version still serving is never shown as dead because its file's last load failed.
    #[test]
    fn a_live_version_whose_file_was_refused_is_shown_live() {
        let badge = |live, error| live_badge(live, error).into_string();
        assert!(badge(true, false).contains(">live<"));
        assert!(badge(true, true).contains("live, with an error"));
        assert!(badge(false, true).contains("not loaded"));
        assert!(badge(false, false).contains("not loaded"));
    }
}
