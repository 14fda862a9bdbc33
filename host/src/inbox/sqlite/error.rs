//! SQLite's errors sorted into the inbox's: busy or locked is [`InboxError::Busy`], a full disk
//! or failing storage (an I/O error, read-only, cannot open) [`InboxError::Unavailable`] (both
//! transient: 503 + `Retry-After`, nothing stored), the rest [`InboxError::Storage`].
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
        // Space freed (retention, an operator) makes the same write succeed; so may the
        // storage under the file once it is back (an I/O error, a file system remounted
        // read-only, a file that cannot be opened now). SQLite rolls such a write back.
        Some(
            rusqlite::ErrorCode::DiskFull
            | rusqlite::ErrorCode::SystemIoFailure
            | rusqlite::ErrorCode::ReadOnly
            | rusqlite::ErrorCode::CannotOpen,
        ) => InboxError::Unavailable(e),
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

    /// Failing storage under the file is as transient as a full disk: the provider retries.
    #[test]
    fn failing_storage_is_unavailable() {
        for code in [
            rusqlite::ffi::SQLITE_IOERR_WRITE,
            rusqlite::ffi::SQLITE_IOERR_FSYNC,
            rusqlite::ffi::SQLITE_READONLY,
            rusqlite::ffi::SQLITE_CANTOPEN,
        ] {
            let e = InboxError::from(sqlite_failure(code));
            assert!(matches!(e, InboxError::Unavailable(_)), "{code}: {e:?}");
        }
    }

    #[test]
    fn other_engine_failures_are_storage_errors() {
        let e = InboxError::from(sqlite_failure(rusqlite::ffi::SQLITE_CORRUPT));
        assert!(matches!(e, InboxError::Storage(_)), "{e:?}");
    }
}
