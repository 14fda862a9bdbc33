//! Reading a request body under the edge's limits, before anything verifies or parses it (on
//! the ingest listener and on the admin listener alike): a size cap, one budget of body bytes
//! in memory shared by every request of the listener, and the clock (an idle bound, a minimum
//! average rate, a total bound).
//!
//! Invariants: no body byte is held without being counted in the [`BodyBudget`], and no more
//! is counted than twice what was sent: a body is reserved as its bytes arrive, in steps that
//! double (never past its declared `Content-Length` or its cap), and the buffer holds no more
//! than its reservation. A head costs nothing: a client that declares a large
//! body and sends none of it holds none of the budget (it used to reserve the whole declared
//! length, so six head-only connections kept every webhook at 503). A declared length the
//! budget cannot hold now is refused from the head alone. A reservation is given back when the
//! request is done with its body, whatever the outcome. A client that stops sending, or sends
//! slower than the minimum rate, is cut off with 408 long before the total bound. One client
//! address (IPv6: one /64) holds at most its share of the budget, so a sender keeping the pace
//! on many connections cannot hold all of it and refuse everyone else.

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

use crate::{error::ApiError, server::Client};

/// Seconds a client refused by the budget is told to wait: about the idle bound, after which
/// a stalled body has given its reservation back.
const BUDGET_RETRY_AFTER_SECS: u64 = 5;

/// The bytes of request bodies that may be in memory at once, across all connections, and of
/// those, the bytes one client address may hold.
#[derive(Debug)]
pub struct BodyBudget {
    available: AtomicU64,
    /// The most one address may hold; at least the total turns the share off.
    share: u64,
}

impl BodyBudget {
    /// `total` bytes, of which one address ([`Client`]: every connection of it counts in one
    /// sum) may hold `share`.
    pub fn new(total: u64, share: u64) -> Arc<Self> {
        Arc::new(Self {
            available: AtomicU64::new(total),
            share: if share >= total { u64::MAX } else { share },
        })
    }

    /// Bytes not reserved right now.
    pub fn available(&self) -> u64 {
        self.available.load(Ordering::Relaxed)
    }

    /// Bytes `client` could reserve now: what is left, and of its share.
    fn available_to(&self, client: Option<&Client>) -> u64 {
        let left = self.available();
        match self.counted(client) {
            Some(client) => left.min(
                self.share
                    .saturating_sub(client.body_bytes.load(Ordering::Relaxed)),
            ),
            None => left,
        }
    }

    /// `client`, if its bytes are counted against a share (there is one to keep).
    fn counted<'c>(&self, client: Option<&'c Client>) -> Option<&'c Client> {
        client.filter(|_| self.share != u64::MAX)
    }

    /// Why a request from `client` that the budget could not hold was refused: when it is its
    /// address's share (not the whole budget), that is said, once per period for all
    /// addresses, naming the address, so an operator can tell it from the budget running out
    /// (a proxy or a NAT whose clients all come from one address needs a larger share).
    fn refused(&self, client: Option<&Client>) -> ApiError {
        if let Some(client) = self.counted(client)
            && self.available_to(Some(client)) < self.available()
        {
            static SHARE_FULL: std::sync::LazyLock<crate::telemetry::Repeated> =
                std::sync::LazyLock::new(|| {
                    crate::telemetry::Repeated::new(
                        tracing::Level::WARN,
                        "a client address holds its whole share of the in-flight body budget",
                    )
                });
            if let Some(left_out) = SHARE_FULL.write() {
                tracing::warn!(
                    address = %client.key,
                    share = self.share,
                    left_out,
                    "a client address holds its whole share of the in-flight body budget \
                     (server.max_inflight_body_bytes_per_ip): its request answered 503"
                );
            }
        }
        ApiError::Overloaded {
            retry_after_secs: BUDGET_RETRY_AFTER_SECS,
        }
    }

    fn take_from_total(&self, bytes: u64) -> bool {
        self.available
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                a.checked_sub(bytes)
            })
            .is_ok()
    }

    /// Takes `bytes` for `held` (an address's sum: its share first, then the total); false,
    /// with nothing taken, if either cannot hold them. Two atomic updates, no lock: every
    /// request takes this path.
    fn take(&self, held: Option<&AtomicU64>, bytes: u64) -> bool {
        let Some(held) = held.filter(|_| bytes > 0) else {
            return self.take_from_total(bytes);
        };
        let share = self.share;
        let within = held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
            h.checked_add(bytes).filter(|&sum| sum <= share)
        });
        if within.is_err() {
            return false;
        }
        if !self.take_from_total(bytes) {
            held.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn give_back(&self, held: Option<&AtomicU64>, bytes: u64) {
        if let Some(held) = held {
            held.fetch_sub(bytes, Ordering::AcqRel);
        }
        self.available.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Reserves `bytes` for a request from `client` (none: counted in the total only), or None
    /// if the budget or the client's share cannot hold them now.
    pub fn reserve(self: &Arc<Self>, client: Option<&Client>, bytes: u64) -> Option<Reservation> {
        let held = self.counted(client).map(|c| c.body_bytes.clone());
        self.take(held.as_deref(), bytes).then(|| Reservation {
            budget: self.clone(),
            held,
            bytes,
        })
    }
}

/// Bytes taken from a [`BodyBudget`] (and from its client's share); given back on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<BodyBudget>,
    /// The sum of its address, when it counts against a share.
    held: Option<Arc<AtomicU64>>,
    bytes: u64,
}

impl Reservation {
    /// Takes `more` bytes on top; false (and nothing taken) if the budget cannot hold them.
    fn grow(&mut self, more: u64) -> bool {
        let ok = self.budget.take(self.held.as_deref(), more);
        if ok {
            self.bytes += more;
        }
        ok
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.held.as_deref(), self.bytes);
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

/// Reads the whole body of a request from `client` under `limits`, counted in `budget` (and in
/// the client's share of it). The reservation must be kept as long as the bytes are.
///
/// Errors: over the cap → 413 (from the declared length alone when there is one); the budget
/// cannot hold it → 503 `overloaded` + Retry-After; idle too long, too slow or not complete in
/// time → 408; the body ended before its end (its sender closed its side) → 400; the
/// connection was reset → [`ApiError::ClientGone`].
pub async fn read(
    body: Body,
    declared: Option<u64>,
    limits: BodyLimits,
    budget: &Arc<BodyBudget>,
    client: Option<&Client>,
) -> Result<(Bytes, Reservation), ApiError> {
    if declared.is_some_and(|len| len > limits.max_bytes) {
        return Err(ApiError::PayloadTooLarge(limits.max_bytes));
    }
    if declared.is_some_and(|len| len > budget.available_to(client)) {
        return Err(budget.refused(client));
    }
    let mut reservation = budget.reserve(client, 0).expect("nothing always fits");
    // The most this body can hold: its declared length, else its cap.
    let most = declared.unwrap_or(limits.max_bytes);
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
    let mut received = BytesMut::new();
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
            Ok(Some(Err(e))) if client_gone(&e) => return Err(ApiError::ClientGone),
            Ok(Some(Err(e))) if ended_early(&e) => {
                // The client closed its sending side before the body's end: it may still read
                // the answer (a half-closed connection is served), so it gets one, counted.
                let short = match declared {
                    Some(len) => format!("{} of its declared {len} bytes", received.len()),
                    None => format!("{} bytes, before its last chunk", received.len()),
                };
                return Err(ApiError::BadRequest(format!(
                    "the request's body ended after {short} (its sender closed the connection \
                     early)"
                )));
            }
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
            return Err(ApiError::PayloadTooLarge(limits.max_bytes));
        }
        if len > reservation.bytes {
            // What arrived, or twice the last step if more: a frame of one byte holds one.
            let step = len.max(reservation.bytes * 2).min(most).max(len);
            if !reservation.grow(step - reservation.bytes) {
                return Err(budget.refused(client));
            }
            grow_exactly(&mut received, step as usize);
        }
        received.extend_from_slice(&data);
    }
    Ok((received.freeze(), reservation))
}

/// Grows `buffer` to hold exactly `capacity` bytes, its reservation. (`reserve` would round up
/// to twice the old capacity: a body whose cap is not a doubling of its first step, 25 MiB
/// after 16, held 32 MiB against a reservation of 25.)
fn grow_exactly(buffer: &mut BytesMut, capacity: usize) {
    if buffer.capacity() >= capacity {
        return;
    }
    let mut grown = BytesMut::with_capacity(capacity);
    grown.extend_from_slice(buffer);
    *buffer = grown;
}

/// Whether a body's read failed because its client's connection is gone (reset or aborted),
/// not because the body was malformed or cut short: nobody is left to read its answer.
fn client_gone(e: &axum::Error) -> bool {
    use std::io::ErrorKind;
    io_error_of(e).is_some_and(|kind| {
        matches!(
            kind,
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
        )
    })
}

/// Whether a body's read failed because the body ended before its declared length or its
/// last chunk (hyper reports it as an I/O error of kind `UnexpectedEof` under its body error;
/// a malformed chunk is `InvalidInput` or `InvalidData`).
fn ended_early(e: &axum::Error) -> bool {
    io_error_of(e) == Some(std::io::ErrorKind::UnexpectedEof)
}

/// The kind of the I/O error among `e`'s causes, if there is one.
fn io_error_of(e: &axum::Error) -> Option<std::io::ErrorKind> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cause = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_given_back_and_never_overdraw() {
        let budget = BodyBudget::new(100, 100);
        let mut a = budget.reserve(None, 60).unwrap();
        assert!(budget.reserve(None, 41).is_none());
        assert!(!a.grow(41), "growing past the budget fails");
        assert!(a.grow(40));
        assert_eq!(budget.available(), 0);
        assert!(budget.reserve(None, 1).is_none());
        drop(a);
        assert_eq!(budget.available(), 100);
        let _b = budget.reserve(None, 100).unwrap();
        assert_eq!(budget.available(), 0);
    }

    /// One address holds at most its share, whichever of its connections asks; another
    /// address still has the rest, and what one gives back is its own again.
    #[test]
    fn one_address_holds_at_most_its_share() {
        let budget = BodyBudget::new(100, 40);
        let client = |key: &str| Client {
            peer: key.parse().unwrap(),
            key: key.parse().unwrap(),
            body_bytes: Arc::default(),
        };
        let (a, b) = (client("2001:db8::"), client("192.0.2.7"));
        let mut first = budget.reserve(Some(&a), 30).unwrap();
        assert!(
            budget.reserve(Some(&a.clone()), 11).is_none(),
            "another of its connections"
        );
        assert!(!first.grow(11));
        assert_eq!(budget.available_to(Some(&a)), 10);
        let second = budget.reserve(Some(&b), 40).unwrap();
        assert!(budget.reserve(Some(&b), 1).is_none());
        assert_eq!(budget.available(), 30);
        drop(first);
        assert_eq!(budget.available_to(Some(&a)), 40);
        drop(second);
        assert_eq!(budget.available(), 100);
        assert_eq!(a.body_bytes.load(Ordering::Relaxed), 0);
        // A share the total cannot hold takes nothing from the address either.
        let _all = budget.reserve(None, 95).unwrap();
        assert!(budget.reserve(Some(&b), 10).is_none());
        assert_eq!(b.body_bytes.load(Ordering::Relaxed), 0);
    }

    const LIMITS: BodyLimits = BodyLimits {
        max_bytes: 1 << 20,
        total: Duration::from_secs(30),
        idle: Duration::from_secs(5),
        min_rate: 0,
    };

    /// Waits (a few seconds at most) until `budget` has `available` bytes left.
    async fn until_available(budget: &BodyBudget, available: u64) {
        for _ in 0..500 {
            if budget.available() == available {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(budget.available(), available);
    }

    /// A head declaring a large body reserves nothing until its bytes come, then in doubling
    /// steps: before, it reserved the whole declared length, so a few head-only connections
    /// held the whole budget and every other request got 503.
    /// The buffer never holds more than its reservation, also on a step that is not a doubling.
    #[test]
    fn a_buffer_grows_to_its_reservation_and_no_further() {
        let mut buffer = BytesMut::new();
        for (step, len) in [(1, 1), (2, 2), (16 << 10, 9_000), (25 << 10, 25 << 10)] {
            grow_exactly(&mut buffer, step);
            assert_eq!(buffer.capacity(), step, "step {step}");
            buffer.resize(len, 7);
        }
        assert!(buffer.iter().all(|b| *b == 7));
        grow_exactly(&mut buffer, 1);
        assert_eq!(
            buffer.capacity(),
            25 << 10,
            "a smaller step keeps the buffer"
        );
    }

    #[tokio::test]
    async fn a_declared_length_is_reserved_as_its_bytes_arrive() {
        let total = 4 << 20;
        let budget = BodyBudget::new(total, total);
        let (mut tx, body) =
            http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(1);
        let reading = tokio::spawn({
            let budget = budget.clone();
            async move { read(Body::new(body), Some(1 << 20), LIMITS, &budget, None).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(budget.available(), total, "a head alone reserves nothing");
        tx.send_data(Bytes::from(vec![b'x'; 1000])).await.unwrap();
        until_available(&budget, total - 1000).await;
        tx.send_data(Bytes::from(vec![b'x'; 500])).await.unwrap();
        until_available(&budget, total - 2000).await;
        tx.send_data(Bytes::from(vec![b'x'; 99_500])).await.unwrap();
        until_available(&budget, total - 101_000).await;
        drop(tx);
        let (bytes, reservation) = reading.await.unwrap().unwrap();
        assert_eq!(bytes.len(), 101_000);
        drop(reservation);
        assert_eq!(budget.available(), total);
    }

    /// A declared body sent above the minimum rate but behind the pace that would end it by
    /// the total bound is cut off once the idle allowance has passed, not at the total bound.
    #[tokio::test(start_paused = true)]
    async fn a_declared_body_behind_its_pace_is_cut_off_after_the_idle_allowance() {
        let budget = BodyBudget::new(4 << 20, 4 << 20);
        let limits = BodyLimits {
            min_rate: 1,
            ..LIMITS
        };
        let (mut tx, body) =
            http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(1);
        let started = Instant::now();
        let reading = tokio::spawn({
            let budget = budget.clone();
            async move { read(Body::new(body), Some(1 << 20), limits, &budget, None).await }
        });
        // 1 000 bytes a second: a thousand times the minimum rate, 2% of the pace.
        let sending = tokio::spawn(async move {
            while tx.send_data(Bytes::from(vec![b'x'; 1000])).await.is_ok() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let cut = reading.await.unwrap();
        assert!(matches!(cut, Err(ApiError::BodyTimeout)), "{cut:?}");
        let took = started.elapsed();
        assert!(
            took >= LIMITS.idle && took < LIMITS.idle + Duration::from_secs(2),
            "cut off after {took:?}"
        );
        sending.abort();
    }

    /// A declared length the budget cannot hold now is refused from the head alone.
    #[tokio::test]
    async fn a_declared_length_over_what_is_left_is_refused_at_once() {
        let budget = BodyBudget::new(1000, 1000);
        let (_tx, body) =
            http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(1);
        let refused = read(Body::new(body), Some(1001), LIMITS, &budget, None).await;
        assert!(
            matches!(refused, Err(ApiError::Overloaded { .. })),
            "{refused:?}"
        );
        assert_eq!(budget.available(), 1000);
    }
}
