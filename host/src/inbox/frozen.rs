//! The wall around released migrations: each backend's tests pin the SHA-256 of every
//! migration's SQL, so an edit to one already released fails a test (a database migrated by the
//! released text would never run the edited one). A new migration appends its hash.

use sha2::{Digest as _, Sha256};

#[test]
fn released_sqlite_migrations_are_never_edited() {
    use super::sqlite::schema;
    assert_migrations_pinned(schema::MIGRATIONS, schema::RELEASED);
}

#[test]
fn released_postgres_migrations_are_never_edited() {
    use super::postgres::schema;
    assert_migrations_pinned(schema::MIGRATIONS, schema::RELEASED);
}

/// Fails unless `migrations` are SQL whose SHA-256 (hex) are `pinned`, in order: none edited,
/// every one pinned.
fn assert_migrations_pinned(migrations: &[&str], pinned: &[&str]) {
    let hashes: Vec<String> = migrations
        .iter()
        .map(|sql| hex::encode(Sha256::digest(sql.as_bytes())))
        .collect();
    for (n, (hash, pin)) in hashes.iter().zip(pinned).enumerate() {
        assert_eq!(
            hash,
            pin,
            "migration {} was edited after its release: put the change in a new migration at \
             the end",
            n + 1
        );
    }
    assert_eq!(
        hashes.len(),
        pinned.len(),
        "every migration is pinned once released; the hashes are {hashes:#?}"
    );
}
