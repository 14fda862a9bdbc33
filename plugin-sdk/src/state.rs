//! Durable key-value state, private to the plugin instance (handlers only).
//!
//! Reads see committed state plus this attempt's own writes. Writes are buffered and
//! committed atomically with the delivery's success: an attempt that fails, traps or times out
//! leaves no trace, so a read-modify-write here is safe to retry. If another delivery changed
//! a key this attempt read, the host re-runs the attempt, so concurrent updates are not lost;
//! the re-run sends its [`http`](crate::http) requests again (same `Idempotency-Key`), so a
//! handler whose requests a service would act on twice reads no key other deliveries write.
//!
//! Writes are bounded by the plugin instance's settings: per attempt, `attempt_state_keys`
//! distinct keys set or deleted and `attempt_state_kib` of keys and values; in total,
//! `state_max_keys` keys and `state_max_mib` of keys and values. [`set`] and [`delete`] return
//! nothing, so the host refuses a write over a limit by stopping the attempt at that call: the
//! attempt fails with an error naming the limit (over an attempt limit it is not retried; over
//! the total it is retried later) and none of its writes are kept. Deleting, or writing a
//! smaller value, is never refused by the total.
//!
//! Only handlers have state: the `parser-plugin` world does not import it, and the ingest path
//! must stay free of side effects. Do not call these from a [`Parser`](crate::Parser).
//!
//! On the host target, a [`Harness`](crate::testing::Harness) call keeps state with these same
//! rules, so a unit test sees what hookd would commit.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::HandleError;

/// The longest key hookd stores, in bytes. A longer key, an empty one (for [`set`]) or one
/// holding a NUL character stops the attempt at that call: `permanent`, error kind
/// `state_limit`.
pub const MAX_KEY_BYTES: usize = 1024;

/// The largest value hookd stores under one key, in bytes; [`set`] of a larger one stops the
/// attempt as [`MAX_KEY_BYTES`] says.
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;

/// The value stored under `key`, if any.
///
/// # Panics
///
/// Outside hookd (on a non-wasm target) when no [`Harness`](crate::testing::Harness) call is
/// running, as there is no state to read.
pub fn get(key: &str) -> Option<Vec<u8>> {
    #[cfg(target_arch = "wasm32")]
    {
        crate::__private::state::get(key)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        crate::testing::state_get(key).unwrap_or_else(|| crate::outside_hookd("state::get", key))
    }
}

/// Stores `value` under `key` (committed only if the attempt succeeds).
///
/// Over the instance's state limits the host stops the attempt here (see the module docs).
///
/// # Panics
///
/// Outside hookd (on a non-wasm target) when no [`Harness`](crate::testing::Harness) call is
/// running.
pub fn set(key: &str, value: &[u8]) {
    #[cfg(target_arch = "wasm32")]
    {
        crate::__private::state::set(key, value)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        if !crate::testing::state_write(key, Some(value)) {
            crate::outside_hookd("state::set", key)
        }
    }
}

/// Removes `key` (committed only if the attempt succeeds).
///
/// # Panics
///
/// Outside hookd (on a non-wasm target) when no [`Harness`](crate::testing::Harness) call is
/// running.
pub fn delete(key: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        crate::__private::state::delete(key)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        if !crate::testing::state_write(key, None) {
            crate::outside_hookd("state::delete", key)
        }
    }
}

/// The JSON value stored under `key`, decoded into `T`.
///
/// A value that does not decode is a [permanent](HandleError::permanent) error: retrying
/// would read the same bytes.
pub fn get_json<T: DeserializeOwned>(key: &str) -> Result<Option<T>, HandleError> {
    get(key)
        .map(|bytes| {
            serde_json::from_slice(&bytes).map_err(|e| {
                HandleError::permanent(format!("state key `{key}` does not hold valid JSON: {e}"))
            })
        })
        .transpose()
}

/// Stores `value` as JSON under `key`.
pub fn set_json<T: Serialize + ?Sized>(key: &str, value: &T) -> Result<(), HandleError> {
    let bytes = serde_json::to_vec(value).map_err(|e| {
        HandleError::permanent(format!("cannot encode state key `{key}` as JSON: {e}"))
    })?;
    set(key, &bytes);
    Ok(())
}
