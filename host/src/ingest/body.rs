//! Reading a request body under the edge's limits, before anything verifies or parses it (on
//! the ingest listener and on the admin listener alike): a size cap, one budget of body bytes
//! in memory shared by every request of the listener, and the clock (an idle bound, a minimum
//! average rate, a total bound).
//!
//! Invariants: no body byte is held without being counted in the [`BodyBudget`] — a declared
//! `Content-Length` is reserved whole before the first byte is read (a request the budget
//! cannot hold is refused from its head alone), an undeclared length is reserved chunk by
//! chunk — and a reservation is given back when the request is done with its body, whatever
//! the outcome. A client that stops sending, or sends slower than the minimum rate, is cut
//! off with 408 long before the total bound.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::time::Instant;

use crate::error::ApiError;

/// Seconds a client refused by the budget is told to wait: about the idle bound, after which
/// a stalled body has given its reservation back.
const BUDGET_RETRY_AFTER_SECS: u64 = 5;

/// The bytes of request bodies that may be in memory at once, across all connections.
#[derive(Debug)]
pub struct BodyBudget {
    available: AtomicU64,
}

impl BodyBudget {
    pub fn new(total: u64) -> Arc<Self> {
        Arc::new(Self {
            available: AtomicU64::new(total),
        })
    }

    /// Bytes not reserved right now.
    pub fn available(&self) -> u64 {
        self.available.load(Ordering::Relaxed)
    }

    fn take(&self, bytes: u64) -> bool {
        self.available
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                a.checked_sub(bytes)
            })
            .is_ok()
    }

    /// Reserves `bytes`, or None if the budget cannot hold them now.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        self.take(bytes).then(|| Reservation {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes taken from a [`BodyBudget`]; given back on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<BodyBudget>,
    bytes: u64,
}

impl Reservation {
    /// Takes `more` bytes on top; false (and nothing taken) if the budget cannot hold them.
    fn grow(&mut self, more: u64) -> bool {
        let ok = self.budget.take(more);
        if ok {
            self.bytes += more;
        }
        ok
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget
            .available
            .fetch_add(self.bytes, Ordering::AcqRel);
    }
}

/// The limits one body is read under.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// The source's `max_body_bytes`: more is 413.
    pub max_bytes: u64,
    /// The whole body must be in by then (`body_timeout_ms`).
    pub total: Duration,
    /// Longest wait for the first byte and between bytes (`body_idle_timeout_ms`); also the
    /// allowance before the minimum rate is enforced.
    pub idle: Duration,
    /// Bytes per second on average since the head, once `idle` has passed; 0 = no minimum
    /// (and no pace either). A declared length must also keep the pace that completes it by
    /// `total`, so a client cannot hold a large reservation cheaply by trickling.
    pub min_rate: u64,
}

impl BodyLimits {
    /// The `[server]` timeouts and minimum rate, with a size cap of `max_bytes`.
    pub fn new(server: &crate::config::ServerConfig, max_bytes: u64) -> Self {
        Self {
            max_bytes,
            total: server.body_timeout,
            idle: server.body_idle_timeout,
            min_rate: server.min_body_bytes_per_sec,
        }
    }
}

/// The request's `Content-Length`, if it declares a valid one.
pub fn declared_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Reads the whole body under `limits`, counted in `budget`. The reservation must be kept as
/// long as the bytes are.
///
/// Errors: over the cap → 413 (from the declared length alone when there is one); the budget
/// cannot hold it → 503 `overloaded` + Retry-After; idle too long, too slow or not complete in
/// time → 408.
pub async fn read(
    body: Body,
    declared: Option<u64>,
    limits: BodyLimits,
    budget: &Arc<BodyBudget>,
) -> Result<(Bytes, Reservation), ApiError> {
    if declared.is_some_and(|len| len > limits.max_bytes) {
        return Err(ApiError::PayloadTooLarge);
    }
    let overloaded = ApiError::Overloaded {
        retry_after_secs: BUDGET_RETRY_AFTER_SECS,
    };
    let mut reservation = budget.reserve(declared.unwrap_or(0)).ok_or(overloaded)?;
    let start = Instant::now();
    let end = start + limits.total;
    // The pace that completes a declared body by `end`, starting after the idle allowance.
    let pace = declared.map_or(0.0, |len| {
        len as f64
            / limits
                .total
                .saturating_sub(limits.idle)
                .as_secs_f64()
                .max(1.0)
    });
    let rate = (limits.min_rate > 0).then(|| pace.max(limits.min_rate as f64));
    // Only the reserved length is allocated up front; pages are touched as bytes arrive.
    let mut received = BytesMut::with_capacity(declared.unwrap_or(0) as usize);
    let mut body = body;
    loop {
        let mut deadline = end.min(Instant::now() + limits.idle);
        if let Some(rate) = rate {
            // received ≥ rate × (elapsed − idle): broken at start + idle + received / rate.
            let earned = Duration::from_secs_f64(received.len() as f64 / rate);
            deadline = deadline.min(start + limits.idle + earned);
        }
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(ApiError::BodyTimeout),
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(ApiError::BadRequest(format!(
                    "reading the body failed: {e}"
                )));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers carry no body bytes
        };
        let len = received.len() as u64 + data.len() as u64;
        if len > limits.max_bytes {
            return Err(ApiError::PayloadTooLarge);
        }
        if len > reservation.bytes && !reservation.grow(len - reservation.bytes) {
            return Err(ApiError::Overloaded {
                retry_after_secs: BUDGET_RETRY_AFTER_SECS,
            });
        }
        received.extend_from_slice(&data);
    }
    Ok((received.freeze(), reservation))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_given_back_and_never_overdraw() {
        let budget = BodyBudget::new(100);
        let mut a = budget.reserve(60).unwrap();
        assert!(budget.reserve(41).is_none());
        assert!(!a.grow(41), "growing past the budget fails");
        assert!(a.grow(40));
        assert_eq!(budget.available(), 0);
        assert!(budget.reserve(1).is_none());
        drop(a);
        assert_eq!(budget.available(), 100);
        let _b = budget.reserve(100).unwrap();
        assert_eq!(budget.available(), 0);
    }
}
