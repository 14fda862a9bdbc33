//! A plugin instance's state pages: its keys a page at a time (by prefix), one key's value
//! with an edit form and a delete, each naming the version it was shown (`If-Match`'s).
//!
//! Invariants:
//! - The pages read, write and refuse exactly as `/admin/plugins/{name}/state[/{key}]` does
//!   ([`crate::admin::state`]): a save or delete of a key that changed since its page was
//!   rendered writes nothing and says so, with the current value, and keeps the operator's
//!   text to copy from.
//! - A value is edited in the encoding it is shown in: JSON as its text, other bytes as base64.

use std::sync::Arc;

use axum::{
    Extension, Form,
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Redirect, Response},
};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{
    Ui, UiError, exact,
    layout::{self, Nav},
    session::SignedIn,
};
use crate::{
    admin::{api, state},
    cli::client::{percent_encode, query},
    error::ApiError,
};

/// Keys per page.
const PAGE: usize = state::DEFAULT_KEYS;

/// The list's query string.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    #[serde(default)]
    prefix: String,
    after: Option<String>,
}

/// The path of `plugin`'s state pages, or of its `key`'s.
fn href(plugin: &str, key: Option<&str>) -> String {
    let mut path = format!("/plugins/{}/state", percent_encode(plugin));
    if let Some(key) = key {
        path.push('/');
        path.push_str(&super::path_segment(key));
    }
    path
}

/// `GET /plugins/{name}/state`.
pub(super) async fn list(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    Path(name): Path<String>,
    Query(params): Query<ListQuery>,
) -> Result<Response, UiError> {
    let prefix = exact(&params.prefix);
    let request = api::StateKeysQuery {
        prefix: prefix.clone(),
        after: params.after.clone(),
        limit: Some(PAGE),
    };
    let page = state::keys_page(&ui.shared, &name, request).await?;
    let base = href(&name, None);
    let body = html! {
        p { a href="/plugins" { "← Plugins" } }
        form.filters method="get" action=(base) role="search" aria-label="Filter keys" {
            label { "Key prefix"
                input type="search" name="prefix" value=(params.prefix);
            }
            div.actions {
                button.primary type="submit" { "Filter" }
                a.button href=(base) { "Clear" }
            }
        }
        @if page.keys.is_empty() {
            p.notice { "No state key" @if let Some(p) = &prefix { " starts with “" (p) "”" } "." }
        } @else {
            div.scroll { table.rows {
                thead { tr {
                    th scope="col" { "Key" }
                    th scope="col" class="num" { "Size (bytes)" }
                    th scope="col" class="num" { "Version" }
                    th scope="col" { "Updated (UTC)" }
                } }
                tbody {
                    @for key in &page.keys {
                        tr {
                            td.wrap.mono data-label="Key" { a href=(href(&name, Some(&key.key))) { (key.key) } }
                            td.num data-label="Size" { (key.size) }
                            td.num data-label="Version" { (key.version) }
                            td data-label="Updated" { @if let Some(at) = key.updated_at { (layout::time(at)) } @else { "—" } }
                        }
                    }
                }
            } }
        }
        nav.pager aria-label="Pages" {
            @if params.after.is_some() {
                a href={ (base) (query(&[("prefix", prefix.clone())])) } { "← First" }
            }
            @if let Some(after) = &page.next_after {
                a href={ (base) (query(&[("prefix", prefix.clone()), ("after", Some(after.clone()))])) } rel="next" { "Next →" }
            }
        }
    };
    let title = format!("State of {name}");
    Ok(layout::page(&title, Nav::Plugins, &signed_in, body).into_response())
}

/// `GET /plugins/{name}/state/{key}`.
pub(super) async fn key(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    super::Named(name, key): super::Named,
) -> Result<Response, UiError> {
    let value = state::read_value(&ui.shared, &name, &key).await?;
    Ok(key_page(&signed_in, &value, None).into_response())
}

/// The text an operator edits: JSON as stored, base64 as the string it is.
fn editable(value: &api::StateValue) -> String {
    match value.encoding {
        api::StateEncoding::Json => value.value.get().to_owned(),
        api::StateEncoding::Base64 => serde_json::from_str(value.value.get()).unwrap_or_default(),
    }
}

/// A refused edit, shown above the current value: why, and the operator's own text.
struct Refused<'a> {
    message: &'a str,
    text: &'a str,
}

/// The page of one key: its value in an edit form, and a delete; `refused` above it.
fn key_page(signed_in: &SignedIn, value: &api::StateValue, refused: Option<Refused>) -> Markup {
    let (name, key) = (&value.plugin, &value.key);
    let action = href(name, Some(key));
    let encoding = match value.encoding {
        api::StateEncoding::Json => "json",
        api::StateEncoding::Base64 => "base64",
    };
    let body = html! {
        p { a href=(href(name, None)) { "← State of " (name) } }
        @if let Some(refused) = &refused {
            div.notice.error role="alert" {
                p { (refused.message) }
                p { "Your edit was not saved. The current value is below; your text is here to copy from:" }
                textarea.mono readonly rows="6" aria-label="Your unsaved text" { (refused.text) }
            }
        }
        dl.envelope {
            dt { "Plugin" } dd { (name) }
            dt { "Key" } dd.mono { (key) }
            dt { "Version" } dd { (value.version) }
            dt { "Size" } dd { (value.size) " bytes" }
            dt { "Updated" } dd { @if let Some(at) = value.updated_at { (layout::time(at)) } @else { "—" } }
            dt { "Shown as" } dd { @if encoding == "json" { "JSON" } @else { "base64 (not UTF-8 JSON)" } }
        }
        form.stack method="post" action=(action) aria-label="Edit value" {
            (layout::csrf_field(signed_in))
            input type="hidden" name="version" value=(value.version);
            input type="hidden" name="encoding" value=(encoding);
            label for="value" { "Value" }
            textarea.mono id="value" name="value" rows="12" spellcheck="false" { (editable(value)) }
            p.hint { "Saved only if the key is still at version " (value.version) "; a handler attempt that read it before runs again." }
            div { button.primary type="submit" { "Save" } }
        }
        form.inline method="post" action={ (action) "/delete" }
            data-confirm={ "Delete state key " (key) " of " (name) "?" } {
            (layout::csrf_field(signed_in))
            input type="hidden" name="version" value=(value.version);
            button.danger type="submit" { "Delete key" }
        }
    };
    layout::page_naming(&format!("{name}: "), key, Nav::Plugins, signed_in, body)
}

/// The edit form.
#[derive(Debug, Deserialize)]
pub(super) struct EditForm {
    version: i64,
    encoding: api::StateEncoding,
    #[serde(default)]
    value: String,
}

/// The delete form.
#[derive(Debug, Deserialize)]
pub(super) struct DeleteForm {
    version: i64,
}

/// The bytes the edit form's text stands for, or a 400 naming the plugin and key.
fn form_bytes(name: &str, key: &str, form: &EditForm) -> Result<Vec<u8>, ApiError> {
    let raw = match form.encoding {
        // A browser sends a textarea's line breaks as CRLF; in JSON they can only be whitespace.
        api::StateEncoding::Json => RawValue::from_string(form.value.replace("\r\n", "\n"))
            .map_err(|e| {
                ApiError::BadRequest(format!(
                    "plugin {name}, state key {key:?}: the value is not JSON ({e}); nothing was saved"
                ))
            })?,
        api::StateEncoding::Base64 => {
            let compact: String = form.value.split_whitespace().collect();
            let text = serde_json::to_string(&compact).expect("a string serializes");
            RawValue::from_string(text).expect("a JSON string is JSON")
        }
    };
    state::decode(name, key, form.encoding, &raw)
}

/// `POST /plugins/{name}/state/{key}`: saves the form's value at the version it was shown.
pub(super) async fn save(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    super::Named(name, key): super::Named,
    Form(form): Form<EditForm>,
) -> Result<Response, UiError> {
    let bytes = match form_bytes(&name, &key, &form) {
        Ok(bytes) => bytes,
        // The page again, the operator's text kept: not JSON is a typo to mend, not a loss.
        Err(ApiError::BadRequest(message)) => {
            let text = &form.value;
            let shown = Some(form.version);
            let refused = refused_page(&ui, &signed_in, &name, &key, text, &message, shown).await?;
            return Ok((StatusCode::BAD_REQUEST, refused).into_response());
        }
        Err(e) => return Err(e.into()),
    };
    let written = state::write(&ui.shared, &name, &key, form.version, Some(bytes)).await;
    refused_or(&ui, &signed_in, &name, &key, &form.value, written, || {
        Redirect::to(&href(&name, Some(&key))).into_response()
    })
    .await
}

/// `POST /plugins/{name}/state/{key}/delete`: deletes the key at the version it was shown.
pub(super) async fn delete(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    super::Named(name, key): super::Named,
    Form(form): Form<DeleteForm>,
) -> Result<Response, UiError> {
    let written = state::write(&ui.shared, &name, &key, form.version, None).await;
    refused_or(&ui, &signed_in, &name, &key, "", written, || {
        Redirect::to(&href(&name, None)).into_response()
    })
    .await
}

/// `done()` after a write; a stale one is the key's page with why and `text` (the operator's
/// own) above its current value (409), or an error page if the key is gone meanwhile.
async fn refused_or(
    ui: &Ui,
    signed_in: &SignedIn,
    name: &str,
    key: &str,
    text: &str,
    written: Result<i64, ApiError>,
    done: impl FnOnce() -> Response,
) -> Result<Response, UiError> {
    match written {
        Ok(_) => Ok(done()),
        Err(ApiError::VersionConflict(message)) => {
            let page = refused_page(ui, signed_in, name, key, text, &message, None).await?;
            Ok((StatusCode::CONFLICT, page).into_response())
        }
        Err(e) => Err(e.into()),
    }
}

/// The key's page with an edit refused for `message`: its current value, and `text` (the
/// operator's own) above it to copy from; an error page if the key is gone meanwhile. When the
/// form was `shown` at a version the key has left since, the message says so: the form below
/// is at the current version, so a save of text made on the old one would not be refused.
async fn refused_page(
    ui: &Ui,
    signed_in: &SignedIn,
    name: &str,
    key: &str,
    text: &str,
    message: &str,
    shown: Option<i64>,
) -> Result<Markup, UiError> {
    let current = match state::read_value(&ui.shared, name, key).await {
        Ok(current) => current,
        Err(ApiError::NotFound(_)) => {
            return Err(UiError(ApiError::VersionConflict(format!(
                "{message}. The key has been deleted meanwhile."
            ))));
        }
        Err(e) => return Err(e.into()),
    };
    let message = match shown {
        Some(shown) if shown != current.version => format!(
            "{message}. The key has also changed since you opened it (version {shown}, now {}): \
             check your text against its current value below.",
            current.version
        ),
        _ => message.to_owned(),
    };
    let refused = Refused {
        message: &message,
        text,
    };
    Ok(key_page(signed_in, &current, Some(refused)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(encoding: api::StateEncoding, value: &str) -> EditForm {
        EditForm {
            version: 1,
            encoding,
            value: value.to_owned(),
        }
    }

    #[test]
    fn the_form_stores_json_as_typed_and_base64_as_its_bytes() {
        let json = form(api::StateEncoding::Json, "{\r\n  \"a\": 1\r\n}");
        assert_eq!(form_bytes("p", "k", &json).unwrap(), b"{\n  \"a\": 1\n}");
        let base64 = form(api::StateEncoding::Base64, " AP8=\r\n");
        assert_eq!(form_bytes("p", "k", &base64).unwrap(), [0, 0xff]);
        let bad = form(api::StateEncoding::Json, "not json");
        let err = form_bytes("counter", "count", &bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("plugin counter, state key \"count\""), "{err}");
    }

    #[test]
    fn keys_are_one_path_segment() {
        assert_eq!(href("c", Some("a/b")), "/plugins/c/state/a%2Fb");
        assert_eq!(href("c", None), "/plugins/c/state");
        // A browser would resolve `.` and `..` away: a NUL (which no key holds) keeps them.
        assert_eq!(href("c", Some("..")), "/plugins/c/state/..%00");
        assert_eq!(href("c", Some(".")), "/plugins/c/state/.%00");
        assert_eq!(href("c", Some("...")), "/plugins/c/state/...");
        for key in [".", "..", "...", "a\0"] {
            let sent = percent_encoding::percent_decode_str(
                &href("c", Some(key))["/plugins/c/state/".len()..],
            )
            .decode_utf8()
            .unwrap()
            .into_owned();
            assert_eq!(super::super::segment_value(sent), key);
        }
    }
}
