//! SQLite's errors sorted into the inbox's: busy or locked is [`InboxError::Busy`], a full disk
//! [`InboxError::Unavailable`] (both transient: 503 + `Retry-After`, nothing stored), the rest
//! [`InboxError::Storage`].
//!
//! Invariant: a `rusqlite::Error` never leaves this room as itself; it crosses only as the
//! opaque [`StorageError`](crate::inbox::StorageError) inside an [`InboxError`].

use std::sync::Arc;

use crate::inbox::InboxError;

/// Sorts a shared engine error (one commit's error answers every job of its batch).
pub(super) fn from_shared(e: Arc<rusqlite::Error>) -> InboxError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            InboxError::Busy(e)
        }
        // Space freed (retention, an operator) makes the same write succeed.
        Some(rusqlite::ErrorCode::DiskFull) => InboxError::Unavailable(e),
        _ => InboxError::Storage(e),
    }
}

/// Lets the room's SQL use `?`; the engine error is sorted, then hidden behind the opaque type.
impl From<rusqlite::Error> for InboxError {
    fn from(e: rusqlite::Error) -> Self {
        from_shared(Arc::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite_failure(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    #[test]
    fn a_busy_database_is_busy() {
        let e = InboxError::from(sqlite_failure(rusqlite::ffi::SQLITE_BUSY));
        assert!(matches!(e, InboxError::Busy(_)), "{e:?}");
    }

    #[test]
    fn a_locked_table_is_busy() {
        let e = InboxError::from(sqlite_failure(rusqlite::ffi::SQLITE_LOCKED));
        assert!(matches!(e, InboxError::Busy(_)), "{e:?}");
    }

    /// A full disk is a provider's cue to retry later (503 + `Retry-After`), not a 500.
    #[test]
    fn a_full_disk_is_unavailable() {
        let e = InboxError::from(sqlite_failure(rusqlite::ffi::SQLITE_FULL));
        assert!(matches!(e, InboxError::Unavailable(_)), "{e:?}");
        let answer = crate::error::ApiError::from(e);
        assert_eq!(answer.code(), "overloaded");
    }

    #[test]
    fn other_engine_failures_are_storage_errors() {
        let e = InboxError::from(sqlite_failure(rusqlite::ffi::SQLITE_CORRUPT));
        assert!(matches!(e, InboxError::Storage(_)), "{e:?}");
    }
}
