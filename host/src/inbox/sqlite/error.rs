//! SQLite's errors sorted into the inbox's: busy or locked is [`InboxError::Busy`], the rest is
//! [`InboxError::Storage`].
//!
//! Invariant: a `rusqlite::Error` never leaves this room as itself; it crosses only as the
//! opaque [`StorageError`](crate::inbox::StorageError) inside an [`InboxError`].

use std::sync::Arc;

use crate::inbox::InboxError;

/// Sorts a shared engine error (one commit's error answers every job of its batch).
pub(super) fn from_shared(e: Arc<rusqlite::Error>) -> InboxError {
    let busy = matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    );
    if busy {
        InboxError::Busy(e)
    } else {
        InboxError::Storage(e)
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

    #[test]
    fn other_engine_failures_are_storage_errors() {
        let e = InboxError::from(sqlite_failure(rusqlite::ffi::SQLITE_CORRUPT));
        assert!(matches!(e, InboxError::Storage(_)), "{e:?}");
    }
}
