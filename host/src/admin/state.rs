//! `/admin/plugins/{name}/state[/{key}]`: a plugin instance's durable state, listed, read and
//! edited by an operator, and what the dashboard's state pages share with these routes.
//!
//! Invariants:
//! - Every key has a version (from the plugin's version clock; 0 = absent). A read answers it
//!   as a strong `ETag`; a write names the version it replaces (`If-Match`, or
//!   `If-None-Match: *` for a key that must be absent) and is refused with 409 (`version_conflict`) when the key
//!   moved on, with 428 when it names none. The check and the write are one store operation
//!   ([`crate::inbox::Inbox::edit_state`]), so an attempt that read the key before an edit
//!   conflicts and runs again.
//! - Keys and values are held to the caps a plugin's own writes are
//!   ([`MAX_STATE_KEY_BYTES`], [`MAX_STATE_VALUE_BYTES`]), and to the plugin's totals.
//! - A value is answered as its own JSON when its bytes are UTF-8 JSON, byte for byte (a
//!   [`RawValue`]), else base64; a `PUT` of what a `GET` answered stores the same bytes.

use std::sync::Arc;

use axum::{
    Json,
    extract::{Path, Query, State, rejection::JsonRejection},
    http::{HeaderMap, HeaderValue, header},
    response::{IntoResponse, Response},
};
use serde_json::value::RawValue;

use super::{api, handlers::Rejection};
use crate::{
    Shared,
    config::PluginConfig,
    error::ApiError,
    ids::PluginName,
    inbox::{Edited, StateEdit, StateKeyFilter},
    model::{MAX_STATE_KEY_BYTES, MAX_STATE_VALUE_BYTES},
};

/// Keys listed when the query sets no `limit`, and the most it may ask for.
pub(super) const DEFAULT_KEYS: usize = 100;
pub const MAX_KEYS: usize = 1000;

/// The largest `PUT` body: the largest value as base64 or as escaped JSON text, with room to
/// spare.
pub(super) const MAX_BODY_BYTES: usize = 6 * MAX_STATE_VALUE_BYTES + 64 * 1024;

/// The configured plugin instance `name`, or a 404 naming it.
pub(super) fn instance(shared: &Shared, name: &str) -> Result<Arc<PluginConfig>, ApiError> {
    shared.config.plugins.get(name).cloned().ok_or_else(|| {
        ApiError::NotFound(format!(
            "no plugin instance {name:?} (no [plugins.{name}] in the configuration, and no \
             source names it)"
        ))
    })
}

/// Refuses a value for an instance that only parses: a parser has no state, so nothing would
/// ever read it (a delete is still taken, so such rows can be cleared).
fn check_has_state(shared: &Shared, name: &str) -> Result<(), ApiError> {
    let sources = shared.config.sources.values();
    let (mut parses, mut handles) = (false, false);
    for source in sources {
        parses |= source.parser.as_ref().is_some_and(|p| p.as_str() == name);
        handles |= source.handlers.iter().any(|h| h.as_str() == name);
    }
    if parses && !handles {
        return Err(ApiError::BadRequest(format!(
            "plugin {name} is only a parser here, and a parser has no state: nothing would \
             read this value"
        )));
    }
    Ok(())
}

/// Refuses a key no plugin can write (longer than the cap, or holding a NUL), naming the
/// plugin.
fn check_key(plugin: &str, key: &str) -> Result<(), ApiError> {
    if crate::text::has_nul(key) {
        return Err(ApiError::BadRequest(format!(
            "plugin {plugin}: a state key may not hold a NUL character (%00): no plugin can \
             have written one"
        )));
    }
    if key.len() > MAX_STATE_KEY_BYTES {
        return Err(ApiError::BadRequest(format!(
            "plugin {plugin}: a state key of {} bytes is over the {MAX_STATE_KEY_BYTES}-byte cap",
            key.len()
        )));
    }
    Ok(())
}

/// A page of plugin `name`'s keys.
pub(super) async fn keys_page(
    shared: &Shared,
    name: &str,
    query: api::StateKeysQuery,
) -> Result<api::StateKeys, ApiError> {
    instance(shared, name)?;
    let prefix = query.prefix.unwrap_or_default();
    check_key(name, &prefix)?;
    if let Some(after) = &query.after {
        check_key(name, after)?;
    }
    // `limit=0` asks for no keys (as the event list's does): an empty page, no next one.
    let limit = query.limit.unwrap_or(DEFAULT_KEYS).min(MAX_KEYS);
    let keys: Vec<api::StateKey> = if limit == 0 {
        Vec::new()
    } else {
        let filter = StateKeyFilter {
            prefix,
            after: query.after,
            limit,
        };
        shared
            .inbox
            .state_keys(name, filter)
            .await?
            .into_iter()
            .map(Into::into)
            .collect()
    };
    let next_after = (limit > 0 && keys.len() == limit)
        .then(|| keys.last().map(|k| k.key.clone()))
        .flatten();
    Ok(api::StateKeys {
        plugin: name.to_owned(),
        keys,
        next_after,
    })
}

/// Plugin `name`'s committed value of `key`, or a 404 naming both.
pub(super) async fn read_value(
    shared: &Shared,
    name: &str,
    key: &str,
) -> Result<api::StateValue, ApiError> {
    instance(shared, name)?;
    check_key(name, key)?;
    let stored = shared
        .inbox
        .state_value(name, key)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("plugin {name} has no state key {key:?}")))?;
    let (encoding, value) = api::StateEncoding::encode(&stored.value);
    Ok(api::StateValue {
        plugin: name.to_owned(),
        key: key.to_owned(),
        version: stored.version,
        size: stored.value.len() as u64,
        updated_at: stored.updated_at_ms,
        encoding,
        value,
    })
}

/// The bytes `value` carries in `encoding`, held to the value cap; a bad value is a 400 naming
/// the plugin and key.
pub(super) fn decode(
    plugin: &str,
    key: &str,
    encoding: api::StateEncoding,
    value: &RawValue,
) -> Result<Vec<u8>, ApiError> {
    let bytes = encoding.decode(value).map_err(|why| {
        ApiError::BadRequest(format!("plugin {plugin}, state key {key:?}: {why}"))
    })?;
    if bytes.len() > MAX_STATE_VALUE_BYTES {
        return Err(ApiError::BadRequest(format!(
            "plugin {plugin}, state key {key:?}: a value of {} bytes is over the \
             {MAX_STATE_VALUE_BYTES}-byte cap",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Sets (`Some`) or deletes (`None`) plugin `name`'s `key` if it is still at version
/// `expected` (0: absent); returns its version now (0 after a delete). A key that moved on is
/// a 409 (`version_conflict`) saying its version now; a write over the plugin's totals a 409
/// (`conflict`) naming the setting. A write is logged with the plugin, the key and the old and
/// new versions, never the value.
pub(super) async fn write(
    shared: &Shared,
    name: &str,
    key: &str,
    expected: i64,
    value: Option<Vec<u8>>,
) -> Result<i64, ApiError> {
    let plugin = instance(shared, name)?;
    check_key(name, key)?;
    if value.is_some() {
        check_has_state(shared, name)?;
    }
    let edit = StateEdit {
        plugin: PluginName::new(name),
        key: key.to_owned(),
        expected,
        value,
        limits: plugin.state_limits,
    };
    match shared.inbox.edit_state(edit).await? {
        Edited::Written { version } => {
            // Never the value: it may be anything a plugin keeps.
            tracing::info!(
                plugin = name,
                key = %crate::text::escape(key),
                old_version = expected,
                new_version = version,
                "plugin state edited by an operator"
            );
            Ok(version)
        }
        Edited::Changed { now } => Err(ApiError::VersionConflict(stale(name, key, expected, now))),
        Edited::OverQuota(message) => Err(ApiError::Conflict(message)),
    }
}

/// Why a write naming version `expected` of `key` was refused, the key being at `now`.
fn stale(plugin: &str, key: &str, expected: i64, now: i64) -> String {
    let was = match expected {
        0 => "absent".to_owned(),
        v => format!("at version {v}"),
    };
    let is = match now {
        0 => "is absent".to_owned(),
        v => format!("is at version {v}"),
    };
    format!(
        "plugin {plugin}, state key {key:?}: the write expected it {was}, but it {is} now \
         (changed since it was read); nothing was written: read it again"
    )
}

/// The strong `ETag` of `version`.
fn etag(version: i64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{version}\"")).expect("digits are a header value")
}

/// The version a write must find: `If-Match: "<version>"` (or bare digits), or
/// `If-None-Match: *` (`create`: the key must be absent, version 0).
fn precondition(
    headers: &HeaderMap,
    plugin: &str,
    key: &str,
    create: bool,
) -> Result<i64, ApiError> {
    let if_match = headers.get(header::IF_MATCH);
    let if_none = headers.get(header::IF_NONE_MATCH);
    match (if_match, if_none) {
        (Some(_), Some(_)) => Err(ApiError::BadRequest(
            "send If-Match or If-None-Match, not both".into(),
        )),
        (None, Some(value)) if create && value.as_bytes() == b"*" => Ok(0),
        (None, Some(_)) if create => Err(ApiError::BadRequest(
            "If-None-Match may only be `*` (create the key only if it is absent)".into(),
        )),
        (Some(value), None) => {
            let text = value.to_str().unwrap_or_default().trim();
            let digits = text
                .strip_prefix('"')
                .and_then(|t| t.strip_suffix('"'))
                .unwrap_or(text);
            digits.parse::<i64>().ok().filter(|v| *v >= 0).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "If-Match must be one version, as the key's ETag gives it (\"12\"), not {text:?}"
                ))
            })
        }
        _ => Err(ApiError::PreconditionRequired(format!(
            "plugin {plugin}, state key {key:?}: a write must say which version it replaces: \
             If-Match with the ETag of a GET of the key{}",
            if create {
                ", or If-None-Match: * to create it"
            } else {
                ""
            }
        ))),
    }
}

/// A version answered as JSON with its `ETag`.
fn written(name: String, key: String, version: i64) -> Response {
    let mut response = Json(api::StateWritten {
        plugin: name,
        key,
        version,
    })
    .into_response();
    response.headers_mut().insert(header::ETAG, etag(version));
    response
}

#[utoipa::path(get, path = "/admin/plugins/{name}/state", tag = "state",
    params(("name" = String, Path, description = "The `[plugins.<name>]` instance"), api::StateKeysQuery),
    responses(
        (status = 200, description = "A page of the instance's state keys, in byte order", body = api::StateKeys),
        (status = 400, description = "A prefix over the key cap (JSON), or a malformed query (text)", content(
            (api::ErrorBody = "application/json"), (String = "text/plain"))),
        (status = 404, description = "No such plugin instance", body = api::ErrorBody),
    ))]
pub(super) async fn list_keys(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    query: Result<Query<api::StateKeysQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<api::StateKeys>, Rejection> {
    let Query(query) = query.map_err(Rejection::Query)?;
    Ok(Json(keys_page(&shared, &name, query).await?))
}

#[utoipa::path(get, path = "/admin/plugins/{name}/state/{key}", tag = "state",
    params(("name" = String, Path, description = "The `[plugins.<name>]` instance"),
           ("key" = String, Path, description = "The state key (percent-encoded)")),
    responses(
        (status = 200, description = "The key's value and version", body = api::StateValue,
            headers(("ETag" = String, description = "The version, quoted: what `If-Match` sends back"))),
        (status = 400, description = "A key over the cap (JSON), or a path that is not UTF-8 (text)", content(
            (api::ErrorBody = "application/json"), (String = "text/plain"))),
        (status = 404, description = "No such plugin instance, or no such key", body = api::ErrorBody),
    ))]
pub(super) async fn get_key(
    State(shared): State<Arc<Shared>>,
    Path((name, key)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let value = read_value(&shared, &name, &key).await?;
    let tag = etag(value.version);
    let mut response = Json(value).into_response();
    response.headers_mut().insert(header::ETAG, tag);
    Ok(response)
}

#[utoipa::path(put, path = "/admin/plugins/{name}/state/{key}", tag = "state",
    params(("name" = String, Path, description = "The `[plugins.<name>]` instance"),
           ("key" = String, Path, description = "The state key (percent-encoded)"),
           ("If-Match" = Option<String>, Header, description = "The version replaced (the key's `ETag`)"),
           ("If-None-Match" = Option<String>, Header, description = "`*`: create the key only if it is absent")),
    request_body(content = api::StatePut, content_type = "application/json"),
    responses(
        (status = 200, description = "Written: the key's version now", body = api::StateWritten,
            headers(("ETag" = String, description = "The new version, quoted"))),
        (status = 400, description = "A bad precondition, key or value, or an instance that is only a parser (JSON), or a body that is not JSON (text)", content(
            (api::ErrorBody = "application/json"), (String = "text/plain"))),
        (status = 404, description = "No such plugin instance", body = api::ErrorBody),
        (status = 409, description = "The key is no longer at the version named (`version_conflict`), or the write would take the plugin over its totals: nothing written", body = api::ErrorBody),
        (status = 415, description = "A body that is not `application/json`", body = String, content_type = "text/plain"),
        (status = 422, description = "A JSON body of the wrong shape", body = String, content_type = "text/plain"),
        (status = 428, description = "Neither `If-Match` nor `If-None-Match: *`", body = api::ErrorBody),
    ))]
pub(super) async fn put_key(
    State(shared): State<Arc<Shared>>,
    Path((name, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Json<api::StatePut>, JsonRejection>,
) -> Result<Response, Rejection> {
    instance(&shared, &name)?;
    check_key(&name, &key)?;
    let expected = precondition(&headers, &name, &key, true)?;
    let Json(body) = body.map_err(Rejection::Body)?;
    let value = decode(&name, &key, body.encoding, &body.value)?;
    let version = write(&shared, &name, &key, expected, Some(value)).await?;
    Ok(written(name, key, version))
}

#[utoipa::path(delete, path = "/admin/plugins/{name}/state/{key}", tag = "state",
    params(("name" = String, Path, description = "The `[plugins.<name>]` instance"),
           ("key" = String, Path, description = "The state key (percent-encoded)"),
           ("If-Match" = String, Header, description = "The version deleted (the key's `ETag`)")),
    responses(
        (status = 200, description = "Deleted: version 0 (absent)", body = api::StateWritten),
        (status = 400, description = "A bad precondition or key (JSON), or a path that is not UTF-8 (text)", content(
            (api::ErrorBody = "application/json"), (String = "text/plain"))),
        (status = 404, description = "No such plugin instance", body = api::ErrorBody),
        (status = 409, description = "The key is no longer at the version named (`version_conflict`): nothing deleted", body = api::ErrorBody),
        (status = 428, description = "No `If-Match`", body = api::ErrorBody),
    ))]
pub(super) async fn delete_key(
    State(shared): State<Arc<Shared>>,
    Path((name, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    instance(&shared, &name)?;
    check_key(&name, &key)?;
    let expected = precondition(&headers, &name, &key, false)?;
    let version = write(&shared, &name, &key, expected, None).await?;
    Ok(written(name, key, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| (name.clone(), HeaderValue::from_str(value).unwrap()))
            .collect()
    }

    #[test]
    fn a_write_names_the_version_it_replaces() {
        let check = |pairs: &[(header::HeaderName, &str)], create| {
            precondition(&headers(pairs), "counter", "count", create)
        };
        assert_eq!(check(&[(header::IF_MATCH, "\"12\"")], true).unwrap(), 12);
        assert_eq!(check(&[(header::IF_MATCH, "7")], false).unwrap(), 7);
        assert_eq!(check(&[(header::IF_NONE_MATCH, "*")], true).unwrap(), 0);
        let missing = check(&[], false).unwrap_err();
        assert!(
            matches!(&missing, ApiError::PreconditionRequired(m) if m.contains("counter") && m.contains("\"count\"")),
            "{missing:?}"
        );
        assert!(matches!(
            check(&[(header::IF_NONE_MATCH, "*")], false),
            Err(ApiError::PreconditionRequired(_))
        ));
        for bad in ["*", "W/\"3\"", "\"a\"", "-1", "\"1\", \"2\""] {
            assert!(
                matches!(
                    check(&[(header::IF_MATCH, bad)], true),
                    Err(ApiError::BadRequest(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            check(
                &[(header::IF_MATCH, "1"), (header::IF_NONE_MATCH, "*")],
                true
            ),
            Err(ApiError::BadRequest(_))
        ));
    }

    #[test]
    fn json_travels_as_itself_and_other_bytes_as_base64() {
        let encode = api::StateEncoding::encode;
        let (encoding, value) = encode(b"{\"a\": 1.50}");
        assert_eq!(
            (encoding, value.get()),
            (api::StateEncoding::Json, "{\"a\": 1.50}")
        );
        let (encoding, value) = encode(b"not json");
        assert_eq!(
            (encoding, value.get()),
            (api::StateEncoding::Base64, "\"bm90IGpzb24=\"")
        );
        let (encoding, _) = encode(&[0xff, 0]);
        assert_eq!(encoding, api::StateEncoding::Base64);
        for bytes in [
            &b"{\"a\": 1.50}"[..],
            b"not json",
            &[0xff, 0],
            b"12345678901234567890123",
            b"42\n",
            b" {\"a\":1}",
            b"{}\r\n",
            b"\t\"x\" ",
        ] {
            let (encoding, value) = encode(bytes);
            assert_eq!(
                decode("p", "k", encoding, &value).unwrap(),
                bytes,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        // JSON with whitespace around it is no JSON value byte for byte.
        assert_eq!(encode(b"42\n").0, api::StateEncoding::Base64);
    }

    #[test]
    fn a_bad_value_is_refused_naming_the_plugin_and_key() {
        let number = RawValue::from_string("3".into()).unwrap();
        let err = decode("counter", "count", api::StateEncoding::Base64, &number).unwrap_err();
        assert!(
            err.to_string()
                .contains("plugin counter, state key \"count\""),
            "{err}"
        );
        let huge = serde_json::to_string(&"x".repeat(MAX_STATE_VALUE_BYTES)).unwrap();
        let huge = RawValue::from_string(huge).unwrap();
        let err = decode("counter", "count", api::StateEncoding::Json, &huge).unwrap_err();
        assert!(err.to_string().contains("-byte cap"), "{err}");
    }

    #[test]
    fn a_stale_write_says_what_it_expected_and_what_is() {
        let message = stale("counter", "count", 3, 0);
        assert!(
            message.contains("expected it at version 3, but it is absent now"),
            "{message}"
        );
        let message = stale("counter", "count", 0, 9);
        assert!(
            message.contains("expected it absent, but it is at version 9 now"),
            "{message}"
        );
    }
}
