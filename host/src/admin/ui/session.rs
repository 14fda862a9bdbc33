//! Signing in to the dashboard: the admin token presented once in a form becomes a server-side
//! session named by an HttpOnly, SameSite=Strict cookie, with a CSRF token of its own.
//!
//! Invariants:
//! - The token is only ever read from a POSTed form body (never a URL), compared in constant
//!   time ([`Secret::matches`], as the bearer check does), and never logged, stored or echoed:
//!   a failed sign-in is logged with the peer's address alone.
//! - A session id is 256 random bits; the server keeps only its SHA-256 (so a lookup's timing
//!   says nothing of the ids), with the session's CSRF token (256 random bits) and its last use.
//!   A session unused for [`IDLE`] is gone; signing out removes it at once.
//! - Every state-changing request of a signed-in page carries the session's CSRF token in its
//!   form, compared in constant time ([`Sessions::csrf_matches`]).
//! - A failed sign-in counts against its address as a wrong bearer token does
//!   ([`crate::admin::lockout`]), and is answered only after [`FAILURE_DELAY`].

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use axum::http::{HeaderMap, HeaderValue, header};
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};

use crate::verify::Secret;

/// The session cookie's name.
pub(super) const COOKIE: &str = "hookd_session";
/// A session unused this long is signed out.
pub(super) const IDLE: Duration = Duration::from_secs(12 * 60 * 60);
/// Sessions kept at most; signing in beyond it drops the least recently used one.
const MAX_SESSIONS: usize = 1024;
/// How long a failed sign-in waits before it is answered.
pub(super) const FAILURE_DELAY: Duration = Duration::from_secs(1);

/// A signed-in session as a page sees it.
#[derive(Clone)]
pub(super) struct SignedIn {
    /// The session's CSRF token, for the forms of the page.
    pub csrf: String,
    /// The SHA-256 of the session id (the map's key), to sign out.
    key: [u8; 32],
}

#[cfg(test)]
impl SignedIn {
    /// A session for rendering a page in a test.
    pub(in crate::admin::ui) fn for_tests() -> Self {
        Self {
            csrf: "csrf".into(),
            key: [0; 32],
        }
    }
}

struct Session {
    csrf: Secret,
    csrf_text: String,
    last_used: Instant,
}

/// The live sessions.
#[derive(Default)]
pub(super) struct Sessions {
    sessions: Mutex<HashMap<[u8; 32], Session>>,
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

fn key_of(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    /// A new session at `now`; returns its id (the cookie's value).
    pub fn create(&self, now: Instant) -> String {
        let id = random_hex();
        let csrf_text = random_hex();
        let mut sessions = self.sessions.lock().expect("poisoned");
        sessions.retain(|_, s| now.duration_since(s.last_used) < IDLE);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| *k)
        {
            sessions.remove(&oldest);
        }
        sessions.insert(
            key_of(&id),
            Session {
                csrf: Secret::new(csrf_text.clone()),
                csrf_text,
                last_used: now,
            },
        );
        id
    }

    /// The session the request's cookie names, if it is live at `now` (its idle clock restarts).
    pub fn find(&self, headers: &HeaderMap, now: Instant) -> Option<SignedIn> {
        self.lookup(headers, now, true)
    }

    /// As [`Self::find`], for a request a page's script makes by itself (the overview's live
    /// figures): its idle clock goes on, so a tab left open on an unattended screen does not
    /// keep the session alive forever.
    pub fn peek(&self, headers: &HeaderMap, now: Instant) -> Option<SignedIn> {
        self.lookup(headers, now, false)
    }

    fn lookup(&self, headers: &HeaderMap, now: Instant, used: bool) -> Option<SignedIn> {
        let id = cookie(headers, COOKIE)?;
        let key = key_of(id);
        let mut sessions = self.sessions.lock().expect("poisoned");
        let session = sessions.get_mut(&key)?;
        if now.duration_since(session.last_used) >= IDLE {
            sessions.remove(&key);
            return None;
        }
        if used {
            session.last_used = now;
        }
        Some(SignedIn {
            csrf: session.csrf_text.clone(),
            key,
        })
    }

    /// Whether `presented` is `signed_in`'s CSRF token (constant time).
    pub fn csrf_matches(&self, signed_in: &SignedIn, presented: &str) -> bool {
        let sessions = self.sessions.lock().expect("poisoned");
        sessions
            .get(&signed_in.key)
            .is_some_and(|s| s.csrf.matches(presented.as_bytes()))
    }

    /// Signs `signed_in` out: its cookie names nothing any more.
    pub fn remove(&self, signed_in: &SignedIn) {
        self.sessions
            .lock()
            .expect("poisoned")
            .remove(&signed_in.key);
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(k, v)| (k == name).then_some(v))
}

/// The `Set-Cookie` value that names session `id` (`None`: the one that clears it). `Secure`
/// is added when a TLS-terminating proxy says the browser spoke https (`X-Forwarded-Proto`):
/// a forged header only restricts the forger's own cookie. A session's cookie has no
/// `Max-Age` (it lasts while the browser runs): the server ends the session once it is unused
/// for [`IDLE`], and a cookie aged from the sign-in would end one in use.
pub(super) fn set_cookie(id: Option<&str>, request: &HeaderMap) -> HeaderValue {
    // A chain of proxies lists one protocol each, the browser's side first.
    let secure = request
        .get("x-forwarded-proto")
        .and_then(|p| p.to_str().ok())
        .and_then(|p| p.split(',').next())
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"));
    let (value, age) = match id {
        Some(id) => (id, ""),
        None => ("", "; Max-Age=0"),
    };
    let cookie = format!(
        "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/{age}{}",
        if secure { "; Secure" } else { "" }
    );
    HeaderValue::from_str(&cookie).expect("hex and ASCII only")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, value.parse().unwrap());
        headers
    }

    #[test]
    fn a_session_is_found_by_its_cookie_until_it_idles_out_or_signs_out() {
        let sessions = Sessions::default();
        let start = Instant::now();
        let id = sessions.create(start);
        assert_eq!(id.len(), 64, "256 bits, hex");
        let headers = with_cookie(&format!("other=1; {COOKIE}={id}"));
        let found = sessions.find(&headers, start + IDLE / 2).unwrap();
        // Used at IDLE / 2, so still live at IDLE (idle time restarts on use).
        assert!(sessions.find(&headers, start + IDLE).is_some());
        assert!(sessions.find(&headers, start + IDLE * 3).is_none());
        let again = sessions.create(start);
        let headers = with_cookie(&format!("{COOKIE}={again}"));
        let found_again = sessions.find(&headers, start).unwrap();
        sessions.remove(&found_again);
        assert!(sessions.find(&headers, start).is_none());
        assert!(
            sessions
                .find(&with_cookie(&format!("{COOKIE}=x{id}")), start)
                .is_none()
        );
        drop(found);
    }

    /// A page's own refreshes (the overview's live figures) do not keep a session alive: one
    /// left open on an unattended screen ends once it is unused for `IDLE`.
    #[test]
    fn a_pages_own_refreshes_do_not_keep_its_session_alive() {
        let sessions = Sessions::default();
        let start = Instant::now();
        let id = sessions.create(start);
        let headers = with_cookie(&format!("{COOKIE}={id}"));
        let mut now = start;
        while now < start + IDLE - Duration::from_secs(60) {
            assert!(sessions.peek(&headers, now).is_some());
            now += Duration::from_secs(600);
        }
        assert!(sessions.peek(&headers, start + IDLE).is_none());
        assert!(sessions.find(&headers, start + IDLE).is_none());
    }

    #[test]
    fn only_the_sessions_own_csrf_token_matches() {
        let sessions = Sessions::default();
        let now = Instant::now();
        let a = sessions.create(now);
        let b = sessions.create(now);
        let a = sessions
            .find(&with_cookie(&format!("{COOKIE}={a}")), now)
            .unwrap();
        let b = sessions
            .find(&with_cookie(&format!("{COOKIE}={b}")), now)
            .unwrap();
        assert!(sessions.csrf_matches(&a, &a.csrf));
        assert!(!sessions.csrf_matches(&a, &b.csrf));
        assert!(!sessions.csrf_matches(&a, ""));
        assert!(!sessions.csrf_matches(&a, &a.csrf[1..]));
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_behind_https() {
        let plain = set_cookie(Some("abc"), &HeaderMap::new());
        assert_eq!(
            plain,
            "hookd_session=abc; HttpOnly; SameSite=Strict; Path=/"
        );
        for forwarded in ["https", "HTTPS", "https, http", "https,http"] {
            let mut proxied = HeaderMap::new();
            proxied.insert("x-forwarded-proto", forwarded.parse().unwrap());
            assert!(
                set_cookie(Some("abc"), &proxied)
                    .to_str()
                    .unwrap()
                    .ends_with("; Secure"),
                "{forwarded}"
            );
        }
        let mut plain_first = HeaderMap::new();
        plain_first.insert("x-forwarded-proto", "http, https".parse().unwrap());
        assert!(
            !set_cookie(Some("abc"), &plain_first)
                .to_str()
                .unwrap()
                .contains("Secure")
        );
        assert!(
            set_cookie(None, &HeaderMap::new())
                .to_str()
                .unwrap()
                .contains("Max-Age=0")
        );
    }
}
