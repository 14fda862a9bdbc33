//! Helpers to build a handler's output: the optional string the host stores on the delivery
//! and shows in the admin API (capped, 64 KiB by default).

use serde::Serialize;

use crate::HandleError;

/// `value` serialised as JSON, as a handler's successful result.
///
/// ```
/// # use plugin_sdk::HandleError;
/// fn handle() -> Result<Option<String>, HandleError> {
///     plugin_sdk::output::json(&plugin_sdk::serde_json::json!({ "label": "bug" }))
/// }
/// assert_eq!(handle().unwrap().as_deref(), Some(r#"{"label":"bug"}"#));
/// ```
pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Option<String>, HandleError> {
    serde_json::to_string(value)
        .map(Some)
        .map_err(|e| HandleError::permanent(format!("cannot encode output as JSON: {e}")))
}
