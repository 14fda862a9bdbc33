//! Guessing the admin token: every place the admin listener checks it (the API's bearer token,
//! the dashboard's sign-in) counts a wrong one against the client's address, and an address with
//! [`MAX_FAILURES`] wrong tokens within [`FAILURE_WINDOW`] of its first is refused (429 +
//! `Retry-After`) until that window has passed.
//!
//! Invariants:
//! - A locked-out address learns nothing of a token it presents: it is refused before the check.
//! - Addresses are counted as connections are ([`crate::server::client_key`]: IPv6 by its /64),
//!   so the addresses of one host do not each get their own tries.
//! - Only the window clears a count, not a right token: another client of the same address (a
//!   script polling with the right token, every client behind one proxy) cannot keep a guesser
//!   under the limit. So every client of a locked-out address waits with it; the lockout is
//!   logged once, naming the address.
//! - At most [`MAX_TRACKED_ADDRESSES`] addresses are remembered, so a flood of addresses costs
//!   bounded memory. The oldest address not locked out is forgotten first, so a guesser cannot
//!   free its own locked-out address by failing from as many others; only when every address
//!   remembered is locked out does the oldest of those go (a guesser with more /64s than that
//!   gets five more tries per 20 000 wrong tokens).
//! - A request without a token is refused (401) without counting: it guessed nothing.
//! - Each listener counts its own: several nodes each give an address its tries.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use crate::server::client_key;

/// Wrong tokens an address may present within [`FAILURE_WINDOW`].
pub const MAX_FAILURES: u32 = 5;
/// How long an address's wrong tokens count, from its first.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(5 * 60);
/// Addresses whose failures are remembered at most (the oldest are forgotten first).
const MAX_TRACKED_ADDRESSES: usize = 4096;

struct Failures {
    count: u32,
    since: Instant,
}

/// The wrong tokens of each address, for one listener.
#[derive(Default)]
pub struct Lockout {
    failures: Mutex<HashMap<IpAddr, Failures>>,
}

impl Lockout {
    /// How long `client` must still wait before its token is checked again, if it is locked
    /// out.
    pub fn locked_out(&self, client: IpAddr, now: Instant) -> Option<Duration> {
        let failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        let f = failures.get(&client_key(client))?;
        let elapsed = now.duration_since(f.since);
        (f.count >= MAX_FAILURES && elapsed < FAILURE_WINDOW).then(|| FAILURE_WINDOW - elapsed)
    }

    /// Counts a wrong token from `client` (presented to `to`) at `now`, and says so when it
    /// locks the address out: once per address and window, however many it sends.
    pub fn wrong_token(&self, client: IpAddr, now: Instant, to: &str) {
        if self.failed(client, now) {
            tracing::warn!(
                address = %client,
                to,
                failures = MAX_FAILURES,
                window_secs = FAILURE_WINDOW.as_secs(),
                "admin token: address locked out after too many wrong tokens"
            );
        }
    }

    /// Counts a wrong token from `client` at `now`; true if it locked the address out.
    fn failed(&self, client: IpAddr, now: Instant) -> bool {
        let key = client_key(client);
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        failures.retain(|_, f| now.duration_since(f.since) < FAILURE_WINDOW);
        if failures.len() >= MAX_TRACKED_ADDRESSES
            && !failures.contains_key(&key)
            && let Some(oldest) = failures
                .iter()
                .min_by_key(|(_, f)| (f.count >= MAX_FAILURES, f.since))
                .map(|(a, _)| *a)
        {
            failures.remove(&oldest);
        }
        let entry = failures.entry(key).or_insert(Failures {
            count: 0,
            since: now,
        });
        entry.count += 1;
        entry.count == MAX_FAILURES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_locked_out_after_its_failures_until_the_window_passes() {
        let lockout = Lockout::default();
        let now = Instant::now();
        let address: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..MAX_FAILURES - 1 {
            assert!(!lockout.failed(address, now));
        }
        assert_eq!(lockout.locked_out(address, now), None);
        assert!(
            lockout.failed(address, now),
            "the failure that locks it out says so"
        );
        assert!(lockout.locked_out(address, now).is_some());
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!(lockout.locked_out(other, now), None);
        assert_eq!(lockout.locked_out(address, now + FAILURE_WINDOW), None);
    }

    #[test]
    fn a_locked_out_address_is_not_forgotten_for_others_that_fail() {
        let lockout = Lockout::default();
        let now = Instant::now();
        let guesser: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..MAX_FAILURES {
            lockout.failed(guesser, now);
        }
        // As many other addresses as the table holds, each failing once, later.
        for i in 0..MAX_TRACKED_ADDRESSES as u32 {
            let other = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            lockout.failed(other, now + Duration::from_secs(1));
        }
        assert!(lockout.locked_out(guesser, now).is_some());
        let count = lockout.failures.lock().unwrap().len();
        assert_eq!(count, MAX_TRACKED_ADDRESSES);
    }

    /// The addresses of one IPv6 /64 share their tries.
    #[test]
    fn one_ipv6_64_shares_its_tries() {
        let lockout = Lockout::default();
        let now = Instant::now();
        for host in 1..=MAX_FAILURES {
            let address: IpAddr = format!("2001:db8::{host}").parse().unwrap();
            lockout.failed(address, now);
        }
        let another: IpAddr = "2001:db8::ffff".parse().unwrap();
        assert!(lockout.locked_out(another, now).is_some());
        let elsewhere: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        assert_eq!(lockout.locked_out(elsewhere, now), None);
    }
}
