//! Accept in SQL: the event row, its delivery rows, and the quarantine resolution.
//!
//! Invariant: all of it is one transaction, and the insert is
//! `ON CONFLICT (source, event_id) DO NOTHING RETURNING id`: the unique constraint decides a
//! duplicate, also between nodes accepting one event at the same time (the second insert waits
//! for the first's commit, then inserts nothing).

use deadpool_postgres::{Client, Transaction};

use super::quarantine;
use crate::inbox::{Accepted, InboxError, request::headers_json, store::NewEvent};

/// Inserts the event and its deliveries unless `(source, event_id)` is stored, and resolves the
/// quarantined request it came from either way.
pub(super) async fn store_event(
    tx: &Transaction<'_>,
    new: &NewEvent,
) -> Result<Accepted, InboxError> {
    let NewEvent {
        source,
        envelope,
        request,
        handlers,
        from_quarantine,
    } = new;
    let sequence = envelope.sequence.map(|s| s as i64);
    let inserted = tx
        .query_opt(
            &tx.prepare_cached(
                "INSERT INTO events (source, event_id, event_type, ordering_key, sequence,
                                 received_at, headers, body)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (source, event_id) DO NOTHING
             RETURNING id",
            )
            .await?,
            &[
                &source.as_str(),
                &envelope.event_id.as_str(),
                &envelope.event_type,
                &envelope.ordering_key,
                &sequence,
                &request.received_at_ms,
                &headers_json(&request.headers),
                &&request.body[..],
            ],
        )
        .await?;
    let accepted = match inserted {
        Some(row) => {
            let event: i64 = row.get(0);
            let handlers: Vec<&str> = handlers.iter().map(|h| h.as_str()).collect();
            tx.execute(
                &tx.prepare_cached(
                    "INSERT INTO deliveries (event, source, handler, ordering_key, sequence,
                                         state, next_attempt_at, updated_at)
                 SELECT $1, $2, handler, $4, $5, 'pending', $6, $6
                 FROM unnest($3::text[]) WITH ORDINALITY AS h (handler, n) ORDER BY n",
                )
                .await?,
                &[
                    &event,
                    &source.as_str(),
                    &handlers,
                    &envelope.ordering_key,
                    &sequence,
                    &request.received_at_ms,
                ],
            )
            .await?;
            Accepted::New
        }
        None => Accepted::Duplicate,
    };
    if let Some(id) = from_quarantine {
        let resolution = format!("accepted as {}", envelope.event_id);
        quarantine::resolve(tx, *id, request.received_at_ms, &resolution).await?;
    }
    Ok(accepted)
}

/// Whether `(source, event_id)` is stored.
pub(super) async fn contains_event(
    client: &Client,
    source: &str,
    event_id: &str,
) -> Result<bool, InboxError> {
    Ok(client
        .query_opt(
            &client
                .prepare_cached("SELECT 1 FROM events WHERE source = $1 AND event_id = $2")
                .await?,
            &[&source, &event_id],
        )
        .await?
        .is_some())
}
