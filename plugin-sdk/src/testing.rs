//! Unit tests of a plugin's own [`Handler::handle`] and [`Parser::parse`] with `cargo test` on
//! the host target: a [`Harness`] stands in for hookd.
//!
//! ```
//! use plugin_sdk::testing::Harness;
//! use plugin_sdk::{Event, HandleError, Handler, output, state};
//!
//! struct Counter;
//!
//! impl Handler for Counter {
//!     fn handle(_event: Event) -> Result<Option<String>, HandleError> {
//!         let count = state::get_json::<u64>("count")?.unwrap_or(0) + 1;
//!         state::set_json("count", &count)?;
//!         output::json(&count)
//!     }
//! }
//!
//! let mut hookd = Harness::new().with_state_json("count", &41);
//! let output = hookd.handle::<Counter>(Event::new("s", "evt_1", "ping", "{}"));
//! assert_eq!(output, Ok(Some("42".to_owned())));
//! assert_eq!(hookd.state_json::<u64>("count"), Some(42));
//! ```
//!
//! During [`Harness::handle`] and [`Harness::parse`], the SDK's host services are the
//! harness's, with the rules hookd applies:
//!
//! - [`state`](crate::state): reads see the committed state plus this call's own writes;
//!   writes are buffered and committed only when the handler returns `Ok`. An `Err` or a panic
//!   leaves no trace, as a failed or trapped attempt does in hookd. A parser has no state
//!   (hookd's parser world does not import it), so a state call from one panics. A key or
//!   value hookd refuses (an empty key to `set`, a key holding a NUL character or over
//!   [`state::MAX_KEY_BYTES`], a value over [`state::MAX_VALUE_BYTES`]) stops the call there
//!   with a panic naming it, where hookd stops the attempt (`permanent`, `state_limit`).
//! - An [`Envelope`] hookd would not store (an empty event id; an id, type or ordering key
//!   holding a NUL character or over 1 KiB; a sequence over 2^63 - 1) makes
//!   [`Harness::parse`] return the [`ParseError::Invalid`] hookd answers the request with
//!   (`400 unparsable`).
//! - [`config`](crate::config): the values given with [`Harness::with_config`].
//! - [`log`](crate::log): lines are kept, in order, in [`Harness::logs`].
//! - [`http`](crate::http): a request is answered by the stub registered for its method and
//!   URL ([`Harness::respond_to`], [`Harness::respond_with`], [`Harness::fail_with`]); a URL
//!   without one is refused with [`HttpError::Denied`], as hookd refuses a host that is not in
//!   the plugin's `allow_hosts` (with `?` in a handler: a permanent failure), and so is every
//!   stubbed request after the 64th of one call (refused ones do not count, as in hookd), and
//!   any request from a parser (parsers never get network). Every request sent, refused or not, is in [`Harness::requests`], with the
//!   headers the plugin set (hookd adds `Idempotency-Key` and configured credentials after
//!   the request leaves the plugin; a stub never sees those).
//!
//! Not modelled: the per-call caps (output, log bytes, state written per attempt, state held
//! in total), time limits, and the re-run of an attempt whose read keys another delivery
//! changed meanwhile. hookd enforces those on the built component.
//!
//! A panic in the plugin reaches the test as a panic (hookd would record a `trap`), after the
//! harness discarded the call's state writes; catch it with
//! `std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hookd.handle::<H>(event)))` to
//! look at the harness afterwards.
//!
//! # Parallel tests
//!
//! A harness serves the calls made on the thread that runs [`Harness::handle`] or
//! [`Harness::parse`], for as long as that call lasts (a thread-local slot, so tests running in
//! parallel, each on its own thread, never see each other's state). Outside such a call, the
//! services behave as without hookd: [`log`](crate::log) writes to stderr, the others panic
//! with a message pointing here.
//!
//! # Why no cargo feature
//!
//! This module is compiled on every non-wasm target and on none of the wasm ones. A plugin's
//! unit tests run on the host target, and its component is built for `wasm32-wasip2`, so
//! nothing of the harness ever reaches a component, and a plugin crate needs no
//! `[dev-dependencies]` entry or feature to test itself. The SDK's host services need the
//! slot anyway to tell a test from "no host here".

use std::{cell::RefCell, collections::BTreeMap, mem};

use serde::{Serialize, de::DeserializeOwned};

use crate::{
    Envelope, Event, HandleError, Handler, Header, ParseError, Parser, Request,
    http::{self, HttpError, Method, Url},
    log::Level,
    state,
};

/// The most requests one call may send; hookd refuses the next ones the same way.
const MAX_REQUESTS_PER_CALL: usize = 64;

/// A stand-in for hookd: configuration, committed state, HTTP stubs, and what the plugin
/// logged and sent. See the [module docs](self).
#[derive(Debug, Default)]
pub struct Harness {
    world: World,
}

/// Everything a harness holds between calls.
#[derive(Debug, Default)]
struct World {
    config: BTreeMap<String, String>,
    state: BTreeMap<String, Vec<u8>>,
    /// Later stubs win over earlier ones for the same method and URL.
    stubs: Vec<Stub>,
    logs: Vec<LogLine>,
    requests: Vec<SentRequest>,
}

#[derive(Debug)]
struct Stub {
    method: Method,
    /// Normalised as [`Url`] prints it, so `http://x` and `http://x/` are one URL.
    url: String,
    answer: Result<http::Response, HttpError>,
}

/// One line a plugin logged through [`log`](crate::log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Its level.
    pub level: Level,
    /// Its text.
    pub message: String,
}

/// One request a plugin sent through [`http`](crate::http), as the plugin built it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentRequest {
    /// The method.
    pub method: Method,
    /// The URL, normalised (`http://host/` for `http://host`; no fragment).
    pub url: String,
    /// The headers the plugin set, names lower-cased, in the order set.
    pub headers: Vec<Header>,
    /// The body.
    pub body: Vec<u8>,
}

impl SentRequest {
    /// The value of the first header called `name`, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str())
    }

    /// The body decoded as JSON into `T`.
    ///
    /// # Panics
    ///
    /// If the body is not that JSON, naming the request.
    pub fn json<T: DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "the body of {} {} is not the JSON expected: {e}",
                self.method.as_str(),
                self.url
            )
        })
    }
}

impl Harness {
    /// A harness with no configuration, no state and no stubs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the config value `key` (what `config = { key = "value" }` in the plugin's
    /// `hookd.toml` table gives).
    pub fn with_config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.world.config.insert(key.into(), value.into());
        self
    }

    /// Commits `value` under state `key`, as an earlier successful attempt would have.
    pub fn with_state(mut self, key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.world.state.insert(key.into(), value.into());
        self
    }

    /// Commits `value` as JSON under state `key` (what [`state::set_json`](crate::state::set_json)
    /// writes).
    ///
    /// # Panics
    ///
    /// If `value` does not serialise, naming the key.
    pub fn with_state_json<T: Serialize + ?Sized>(self, key: &str, value: &T) -> Self {
        let bytes = serde_json::to_vec(value)
            .unwrap_or_else(|e| panic!("state key `{key}`: the value does not serialise: {e}"));
        self.with_state(key, bytes)
    }

    /// Answers every `method` request to `url` with `status` and an empty body.
    ///
    /// # Panics
    ///
    /// If `method` is not one [`http::Method`] names or `url` is not an `http(s)://` URL.
    pub fn respond_to(self, method: &str, url: &str, status: u16) -> Self {
        self.respond_with(method, url, http::Response::new(status, Vec::new()))
    }

    /// Answers every `method` request to `url` with `response`.
    ///
    /// # Panics
    ///
    /// As [`respond_to`](Self::respond_to).
    pub fn respond_with(self, method: &str, url: &str, response: http::Response) -> Self {
        self.stub(method, url, Ok(response))
    }

    /// Fails every `method` request to `url` with `error` (e.g. [`HttpError::Timeout`]).
    ///
    /// # Panics
    ///
    /// As [`respond_to`](Self::respond_to).
    pub fn fail_with(self, method: &str, url: &str, error: HttpError) -> Self {
        self.stub(method, url, Err(error))
    }

    fn stub(mut self, method: &str, url: &str, answer: Result<http::Response, HttpError>) -> Self {
        let method = Method::from_name(method)
            .unwrap_or_else(|| panic!("Harness stub: {method:?} is not an HTTP method it sends"));
        let url = Url::parse(url)
            .unwrap_or_else(|e| panic!("Harness stub: {e}"))
            .to_string();
        self.world.stubs.push(Stub {
            method,
            url,
            answer,
        });
        self
    }

    /// Runs `H::handle(event)` as one attempt: its state writes are committed if it returns
    /// `Ok`, discarded if it returns `Err` or panics (the panic then continues into the test).
    ///
    /// # Panics
    ///
    /// If `H` panics, or calls a harness itself.
    pub fn handle<H: Handler>(&mut self, event: Event) -> Result<Option<String>, HandleError> {
        let call = Call::enter(self, Role::Handler);
        let result = H::handle(event);
        call.exit(result.is_ok());
        result
    }

    /// Runs `P::parse(req)` as hookd's ingest would.
    ///
    /// # Panics
    ///
    /// If `P` panics, touches [`state`](crate::state), calls a harness itself, or answers with
    /// a `respond` hookd could not send as given (a status outside 200-599, an invalid header,
    /// one of hookd's own such as `Content-Length`, more than 100 headers), whose parse fails
    /// in hookd.
    pub fn parse<P: Parser>(&mut self, req: Request) -> Result<Envelope, ParseError> {
        let call = Call::enter(self, Role::Parser);
        let result = P::parse(req);
        call.exit(false);
        let envelope = match result {
            Err(ParseError::Respond(response)) => {
                if let Some(why) = unsendable(&response) {
                    // hookd fails the parse (the request is quarantined), never half-answers.
                    panic!("the parser's respond {why}: hookd fails such a parse");
                }
                return Err(ParseError::Respond(response));
            }
            other => other?,
        };
        match unstorable(&envelope) {
            // hookd answers such an envelope `400 unparsable` with this detail.
            Some(why) => Err(ParseError::Invalid(format!("parser plugin {why}"))),
            None => Ok(envelope),
        }
    }

    /// The committed value of state `key`.
    pub fn state(&self, key: &str) -> Option<&[u8]> {
        self.world.state.get(key).map(Vec::as_slice)
    }

    /// The committed value of state `key` decoded from JSON.
    ///
    /// # Panics
    ///
    /// If the value is not that JSON, naming the key.
    pub fn state_json<T: DeserializeOwned>(&self, key: &str) -> Option<T> {
        self.state(key).map(|bytes| {
            serde_json::from_slice(bytes).unwrap_or_else(|e| {
                panic!("state key `{key}` does not hold the JSON expected: {e}")
            })
        })
    }

    /// Every committed state key, sorted.
    pub fn state_keys(&self) -> impl Iterator<Item = &str> {
        self.world.state.keys().map(String::as_str)
    }

    /// Every line logged so far, over all calls (a failed call's lines too, as in hookd).
    pub fn logs(&self) -> &[LogLine] {
        &self.world.logs
    }

    /// Every request sent so far, over all calls, in order (refused ones too).
    pub fn requests(&self) -> &[SentRequest] {
        &self.world.requests
    }
}

/// The longest event id, event type or ordering key hookd stores, in bytes.
const MAX_ENVELOPE_FIELD_BYTES: usize = 1024;

/// Why hookd would refuse `envelope` from a parser (it answers the request `400 unparsable`),
/// if it would.
/// The most headers a parser's answer may carry in hookd.
const MAX_RESPOND_HEADERS: usize = 100;

/// Headers hookd's HTTP layer writes itself, which a parser's answer may not set.
const RESPOND_RESERVED: [&str; 9] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
    "host",
];

/// Why hookd could not send a parser's `respond` as given (its parse then fails), if so.
fn unsendable(response: &crate::Response) -> Option<String> {
    if !(200..=599).contains(&response.status) {
        return Some(format!("has status {}, outside 200-599", response.status));
    }
    if response.headers.len() > MAX_RESPOND_HEADERS {
        return Some(format!(
            "has {} headers, over the {MAX_RESPOND_HEADERS} an answer may carry",
            response.headers.len()
        ));
    }
    response.headers.iter().find_map(|h| {
        let name_ok = http::is_field_name(&h.name);
        // Visible ASCII and tabs: what hookd's HTTP layer sends as given.
        let value_ok = h
            .value
            .bytes()
            .all(|b| b == b'\t' || (0x20..0x7f).contains(&b));
        if !name_ok || !value_ok {
            Some(format!("has an invalid header {:?}", h.name))
        } else if RESPOND_RESERVED
            .iter()
            .any(|r| h.name.eq_ignore_ascii_case(r))
        {
            Some(format!(
                "sets {}, which hookd's HTTP layer owns (the length, the framing and the \
                 connection)",
                h.name.to_ascii_lowercase()
            ))
        } else {
            None
        }
    })
}

fn unstorable(envelope: &Envelope) -> Option<String> {
    if envelope.event_id.is_empty() {
        return Some("returned an empty event id".to_owned());
    }
    if envelope.sequence.is_some_and(|s| s > i64::MAX as u64) {
        return Some(format!(
            "returned sequence {}, over the largest hookd stores (2^63 - 1)",
            envelope.sequence.unwrap_or_default()
        ));
    }
    let fields = [
        ("event id", envelope.event_id.as_str()),
        ("event type", envelope.event_type.as_str()),
        (
            "ordering key",
            envelope.ordering_key.as_deref().unwrap_or_default(),
        ),
    ];
    fields.into_iter().find_map(|(field, value)| {
        if value.contains('\0') {
            Some(format!(
                "gave an {field} holding a NUL character (U+0000), which hookd does not store"
            ))
        } else if value.len() > MAX_ENVELOPE_FIELD_BYTES {
            Some(format!(
                "gave an {field} of {} bytes, over the {MAX_ENVELOPE_FIELD_BYTES} hookd stores",
                value.len()
            ))
        } else {
            None
        }
    })
}

/// What the running call may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Parser,
    Handler,
}

/// The harness of the call running on this thread, moved here for the call's duration.
#[derive(Debug)]
struct Active {
    world: World,
    role: Role,
    /// This attempt's writes (`None`: deleted), visible to its reads, committed by `exit`.
    writes: BTreeMap<String, Option<Vec<u8>>>,
    /// Requests this call sent to a stubbed URL (what hookd counts against its cap).
    sent: usize,
}

thread_local! {
    static ACTIVE: RefCell<Option<Active>> = const { RefCell::new(None) };
}

/// One call in progress: the harness's world is in [`ACTIVE`] until this is dropped, which
/// puts it back (committing the writes only if [`Call::exit`] said so, so an unwinding panic
/// discards them).
struct Call<'a> {
    harness: &'a mut Harness,
    commit: bool,
}

impl<'a> Call<'a> {
    fn enter(harness: &'a mut Harness, role: Role) -> Self {
        ACTIVE.with(|slot| {
            let mut slot = slot.borrow_mut();
            assert!(
                slot.is_none(),
                "a Harness call is already running on this thread: a plugin cannot call \
                 Harness::handle or Harness::parse"
            );
            *slot = Some(Active {
                world: mem::take(&mut harness.world),
                role,
                writes: BTreeMap::new(),
                sent: 0,
            });
        });
        Call {
            harness,
            commit: false,
        }
    }

    fn exit(mut self, commit: bool) {
        self.commit = commit;
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let Some(mut active) = ACTIVE.with(|slot| slot.borrow_mut().take()) else {
            return;
        };
        if self.commit {
            for (key, value) in mem::take(&mut active.writes) {
                match value {
                    Some(value) => active.world.state.insert(key, value),
                    None => active.world.state.remove(&key),
                };
            }
        }
        self.harness.world = active.world;
    }
}

/// Runs `f` on the active call; `None` when no harness call is running on this thread.
fn with_active<R>(f: impl FnOnce(&mut Active) -> R) -> Option<R> {
    ACTIVE.with(|slot| slot.borrow_mut().as_mut().map(f))
}

/// Panics if the running call is a parser's: parsers have no state.
#[track_caller]
fn handler_only(role: Role, what: &str, key: &str) {
    assert!(
        role == Role::Handler,
        "plugin_sdk::{what}({key:?}) in a parser: only handlers have state (in hookd the call \
         traps: state is only available to handlers)"
    );
}

/// `config::get` during a call: `Some(value)`; `None` when no harness call is running.
pub(crate) fn config(key: &str) -> Option<Option<String>> {
    with_active(|active| active.world.config.get(key).cloned())
}

/// `state::get` during a call: this call's write, else the committed value; `None` when no
/// harness call is running.
pub(crate) fn state_get(key: &str) -> Option<Option<Vec<u8>>> {
    let (role, value) = with_active(|active| {
        let value = match active.writes.get(key) {
            Some(written) => written.clone(),
            None => active.world.state.get(key).cloned(),
        };
        (active.role, value)
    })?;
    handler_only(role, "state::get", key);
    refuse_as_hookd("state::get", key, usable_key(key));
    Some(value)
}

/// Why hookd refuses `key` in any state call, if it does.
fn usable_key(key: &str) -> Result<(), String> {
    if key.contains('\0') {
        return Err(format!(
            "state key {key:?} holds a NUL character (U+0000), which hookd's databases do not store"
        ));
    }
    if key.len() > state::MAX_KEY_BYTES {
        return Err(format!(
            "state key of {} bytes exceeds the {}-byte cap on a key",
            key.len(),
            state::MAX_KEY_BYTES
        ));
    }
    Ok(())
}

/// Why hookd refuses `state::set(key, value)`, if it does.
fn storable(key: &str, value: &[u8]) -> Result<(), String> {
    usable_key(key)?;
    if key.is_empty() {
        return Err(
            "state key \"\" is empty: a key an operator could not name in the admin \
                    API, so hookd does not store one"
                .to_owned(),
        );
    }
    if value.len() > state::MAX_VALUE_BYTES {
        return Err(format!(
            "state value of {} bytes for key {key:?} exceeds the {}-byte cap on a value",
            value.len(),
            state::MAX_VALUE_BYTES
        ));
    }
    Ok(())
}

/// Stops the call as hookd would stop the attempt at a refused state call: the harness
/// panics (the call's writes are discarded), naming what hookd would record.
#[track_caller]
fn refuse_as_hookd(what: &str, key: &str, verdict: Result<(), String>) {
    if let Err(why) = verdict {
        panic!(
            "plugin_sdk::{what}({key:?}): hookd stops the attempt here ({why}); it is recorded \
             `permanent` with error kind `state_limit`"
        );
    }
}

/// `state::set` (`Some`) or `state::delete` (`None`) during a call, buffered; `false` when no
/// harness call is running.
pub(crate) fn state_write(key: &str, value: Option<&[u8]>) -> bool {
    let Some(role) = with_active(|active| active.role) else {
        return false;
    };
    let what = if value.is_some() {
        "state::set"
    } else {
        "state::delete"
    };
    handler_only(role, what, key);
    let verdict = match value {
        Some(value) => storable(key, value),
        None => usable_key(key),
    };
    refuse_as_hookd(what, key, verdict);
    with_active(|active| {
        active
            .writes
            .insert(key.to_owned(), value.map(<[u8]>::to_vec))
    });
    true
}

/// A log line during a call, kept; `false` when no harness call is running.
pub(crate) fn log(level: Level, message: &str) -> bool {
    with_active(|active| {
        active.world.logs.push(LogLine {
            level,
            message: message.to_owned(),
        })
    })
    .is_some()
}

/// `http::RequestBuilder::send` during a call: the stub's answer or hookd's refusal; `None`
/// when no harness call is running.
pub(crate) fn send(
    method: Method,
    url: &Url,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> Option<Result<http::Response, HttpError>> {
    with_active(|active| {
        let printed = url.to_string();
        active.world.requests.push(SentRequest {
            method,
            url: printed.clone(),
            headers: headers
                .iter()
                .map(|(name, value)| crate::input::header(name.as_str(), value.as_str()))
                .collect(),
            body,
        });
        if active.role == Role::Parser {
            return Err(HttpError::Denied(format!(
                "hookd refused the request to {}: parsers never get network (not even {})",
                url.authority,
                url.host_port()
            )));
        }
        let stub = active
            .world
            .stubs
            .iter()
            .rev()
            .find(|s| s.method == method && s.url == printed);
        match stub {
            // Counted, as hookd counts a request, only once its target is allowed: a refused
            // one does not use up the call's share.
            Some(_) if active.sent >= MAX_REQUESTS_PER_CALL => Err(HttpError::Denied(
                "hookd refused the request: this call reached its cap on requests".into(),
            )),
            Some(stub) => {
                active.sent += 1;
                stub.answer.clone()
            }
            // The URL cut to scheme and host, as every error shows one (a path or query may
            // carry a secret).
            None => Err(HttpError::Denied(format!(
                "hookd refused the request to {}: the test harness has no stub for {} {} \
                 (as hookd refuses {} when it is not in the plugin's allow_hosts; add one with \
                 Harness::respond_to)",
                url.authority,
                method.as_str(),
                url.redacted(),
                url.host_port()
            ))),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use super::*;
    use crate::{config, log, output, state};

    /// Adds the body's `n` to `total`; fails as the event type says, after writing.
    struct Adder;

    impl Handler for Adder {
        fn handle(event: Event) -> Result<Option<String>, HandleError> {
            let n: u64 = event.json::<serde_json::Value>()?["n"]
                .as_u64()
                .unwrap_or(0);
            let total = state::get_json::<u64>("total")?.unwrap_or(0) + n;
            state::set_json("total", &total)?;
            state::delete("scratch");
            // Reads see this attempt's own writes.
            assert_eq!(state::get_json::<u64>("total")?, Some(total));
            assert_eq!(state::get("scratch"), None);
            log::info(format!("{} total {total}", event.event_id));
            match event.event_type.as_str() {
                "fail" => Err(HandleError::retry("asked to fail")),
                "panic" => panic!("asked to panic"),
                _ => output::json(&total),
            }
        }
    }

    fn event(event_type: &str, n: u64) -> Event {
        Event::new("s", format!("e{n}"), event_type, format!(r#"{{"n":{n}}}"#))
    }

    #[test]
    fn writes_commit_only_when_the_handler_succeeds() {
        let mut hookd = Harness::new()
            .with_state_json("total", &10)
            .with_state("scratch", "x");
        assert_eq!(
            hookd.handle::<Adder>(event("add", 5)),
            Ok(Some("15".into()))
        );
        assert_eq!(hookd.state_json::<u64>("total"), Some(15));
        assert_eq!(hookd.state("scratch"), None, "the delete committed");

        assert_eq!(
            hookd.handle::<Adder>(event("fail", 7)),
            Err(HandleError::retry("asked to fail"))
        );
        assert_eq!(hookd.state_json::<u64>("total"), Some(15));

        let panicked = catch_unwind(AssertUnwindSafe(|| {
            hookd.handle::<Adder>(event("panic", 9))
        }));
        assert!(panicked.is_err());
        assert_eq!(hookd.state_json::<u64>("total"), Some(15));
        assert_eq!(hookd.state_keys().collect::<Vec<_>>(), ["total"]);

        // Every call logged, the failed ones too; the harness still serves after a panic.
        let lines: Vec<_> = hookd.logs().iter().map(|l| l.message.as_str()).collect();
        assert_eq!(lines, ["e5 total 15", "e7 total 22", "e9 total 24"]);
        assert_eq!(hookd.logs()[0].level, log::Level::Info);
        assert_eq!(
            hookd.handle::<Adder>(event("add", 1)),
            Ok(Some("16".into()))
        );
    }

    /// Reads config `greeting` and logs it; a parser that touches state when asked to.
    struct Greeter;

    impl Parser for Greeter {
        fn parse(req: Request) -> Result<Envelope, ParseError> {
            let greeting = config::get("greeting").ok_or(ParseError::invalid("no greeting"))?;
            log::debug(&greeting);
            if req.header("x-touch-state").is_some() {
                state::get("k");
            }
            Ok(Envelope::new(greeting, req.method))
        }
    }

    #[test]
    fn parsers_read_config_and_log_but_have_no_state() {
        let mut hookd = Harness::new();
        let req = || Request::new("s", "{}").with_method("put");
        assert_eq!(
            hookd.parse::<Greeter>(req()),
            Err(ParseError::invalid("no greeting"))
        );
        let mut hookd = Harness::new().with_config("greeting", "hi");
        assert_eq!(
            hookd.parse::<Greeter>(req()),
            Ok(Envelope::new("hi", "PUT"))
        );
        assert_eq!(
            hookd.logs(),
            [LogLine {
                level: log::Level::Debug,
                message: "hi".into()
            }]
        );
        let touched = catch_unwind(AssertUnwindSafe(|| {
            hookd.parse::<Greeter>(req().with_header("x-touch-state", "1"))
        }));
        let message = touched.unwrap_err();
        let message = message.downcast_ref::<String>().unwrap();
        assert!(message.contains("only handlers have state"), "{message}");
    }

    /// Writes the key and value sizes the event type names.
    struct Writer;

    impl Handler for Writer {
        fn handle(event: Event) -> Result<Option<String>, HandleError> {
            state::set("kept", b"1");
            match event.event_type.as_str() {
                "empty-key" => state::set("", b"v"),
                "nul-key" => state::delete("a\0b"),
                "long-key" => {
                    state::get(&"k".repeat(state::MAX_KEY_BYTES + 1));
                }
                "big-value" => state::set("v", &vec![0; state::MAX_VALUE_BYTES + 1]),
                _ => {
                    state::set(
                        &"k".repeat(state::MAX_KEY_BYTES),
                        &vec![0; state::MAX_VALUE_BYTES],
                    );
                    state::delete("");
                }
            }
            Ok(None)
        }
    }

    /// What hookd refuses in a state call stops the harness's call there, naming the rule, and
    /// keeps none of its writes; what hookd takes (a key and a value at their caps, deleting
    /// the empty key) the harness takes too.
    #[test]
    fn state_calls_hookd_refuses_stop_the_call() {
        for (kind, needle) in [
            ("empty-key", "is empty"),
            ("nul-key", "NUL character"),
            ("long-key", "1025 bytes exceeds the 1024-byte cap on a key"),
            ("big-value", "exceeds the 1048576-byte cap on a value"),
        ] {
            let mut hookd = Harness::new();
            let stopped = catch_unwind(AssertUnwindSafe(|| {
                hookd.handle::<Writer>(Event::new("s", "e", kind, "{}"))
            }));
            let message = stopped.unwrap_err();
            let message = message.downcast_ref::<String>().unwrap();
            assert!(
                message.contains(needle) && message.contains("state_limit"),
                "{kind}: {message}"
            );
            assert_eq!(hookd.state_keys().count(), 0, "{kind}");
        }
        let mut hookd = Harness::new();
        assert_eq!(
            hookd.handle::<Writer>(Event::new("s", "e", "at-the-caps", "{}")),
            Ok(None)
        );
        assert_eq!(hookd.state_keys().count(), 2);
    }

    /// Returns the envelope the request's body names.
    struct Echo;

    impl Parser for Echo {
        fn parse(req: Request) -> Result<Envelope, ParseError> {
            let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
            let mut envelope = Envelope::new(
                body["id"].as_str().unwrap_or_default(),
                body["type"].as_str().unwrap_or_default(),
            );
            if let Some(key) = body["key"].as_str() {
                envelope = envelope.ordering_key(key);
            }
            if let Some(sequence) = body["seq"].as_u64() {
                envelope = envelope.sequence(sequence);
            }
            Ok(envelope)
        }
    }

    /// An envelope hookd would not store is the `Invalid` hookd answers with.
    #[test]
    fn an_envelope_hookd_would_not_store_is_invalid() {
        let mut hookd = Harness::new();
        let long = "x".repeat(1025);
        for (body, needle) in [
            (serde_json::json!({"id": ""}), "empty event id"),
            (
                serde_json::json!({"id": "a\u{0}"}),
                "event id holding a NUL",
            ),
            (
                serde_json::json!({"id": "a", "type": long}),
                "event type of 1025 bytes",
            ),
            (
                serde_json::json!({"id": "a", "key": long}),
                "ordering key of 1025 bytes",
            ),
            (
                serde_json::json!({"id": "a", "seq": u64::MAX}),
                "over the largest",
            ),
        ] {
            let parsed = hookd.parse::<Echo>(Request::new("s", body.to_string()));
            assert!(
                matches!(&parsed, Err(ParseError::Invalid(m)) if m.contains(needle)),
                "{body}: {parsed:?}"
            );
        }
        let at_the_cap = serde_json::json!({"id": "x".repeat(1024), "seq": i64::MAX});
        let parsed = hookd.parse::<Echo>(Request::new("s", at_the_cap.to_string()));
        assert!(parsed.is_ok(), "{parsed:?}");
    }

    /// Posts the event id to config `url` and reports the status.
    struct Poster;

    impl Handler for Poster {
        fn handle(event: Event) -> Result<Option<String>, HandleError> {
            let url = config::get("url").ok_or(HandleError::permanent("no url"))?;
            let response = http::post(&url)
                .bearer_auth("t0k")
                .json(&serde_json::json!({ "id": event.event_id }))
                .send()?
                .error_for_status()?;
            output::json(&response.status)
        }
    }

    #[test]
    fn requests_get_their_stub_and_unlisted_urls_are_refused() {
        let url = "http://svc.test:9000/in";
        let mut hookd = Harness::new()
            .with_config("url", url)
            .respond_to("post", url, 503);
        assert!(matches!(
            hookd.handle::<Poster>(event("t", 1)),
            Err(HandleError::Retry { after: None, .. })
        ));
        let mut hookd = hookd.respond_with(
            "POST",
            url,
            http::Response::new(429, "slow down").with_header("Retry-After", "30"),
        );
        match hookd.handle::<Poster>(event("t", 2)) {
            Err(HandleError::Retry {
                after: Some(after),
                reason,
            }) => {
                assert_eq!(after.as_secs(), 30);
                assert!(reason.contains("slow down"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let mut hookd = hookd.respond_to("POST", url, 201);
        assert_eq!(
            hookd.handle::<Poster>(event("t", 3)),
            Ok(Some("201".into()))
        );

        let sent = &hookd.requests()[2];
        assert_eq!((sent.method, sent.url.as_str()), (Method::Post, url));
        assert_eq!(sent.header("Authorization"), Some("Bearer t0k"));
        assert_eq!(sent.header("content-type"), Some("application/json"));
        assert_eq!(sent.json::<serde_json::Value>()["id"], "e3");

        // Another path, or another method, is another URL: refused, a permanent failure.
        let mut hookd = hookd.with_config("url", "http://svc.test:9000/other");
        match hookd.handle::<Poster>(event("t", 4)) {
            Err(HandleError::Permanent(reason)) => assert!(
                reason.contains("denied")
                    && reason.contains("no stub for POST http://svc.test:9000/…")
                    && !reason.contains("/other"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(hookd.requests().len(), 4);
        // Named as hookd names a target, the scheme's port spelled out.
        let mut hookd = hookd.with_config("url", "https://other.test/in");
        match hookd.handle::<Poster>(event("t", 4)) {
            Err(HandleError::Permanent(reason)) => assert!(
                reason.contains("hookd refuses other.test:443 when it is not in"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        let mut hookd = Harness::new().with_config("url", url).fail_with(
            "POST",
            url,
            HttpError::Timeout("slow".into()),
        );
        assert!(matches!(
            hookd.handle::<Poster>(event("t", 5)),
            Err(HandleError::Retry { .. })
        ));
    }

    /// Sends one request more than a call may.
    struct Flooder;

    impl Handler for Flooder {
        fn handle(_event: Event) -> Result<Option<String>, HandleError> {
            for _ in 0..MAX_REQUESTS_PER_CALL {
                http::get("https://api.test/").send()?;
            }
            http::get("https://api.test/").send()?;
            Ok(None)
        }
    }

    /// Refused requests first, as many as a call may send, then one to a stubbed URL.
    struct RefusedFirst;

    impl Handler for RefusedFirst {
        fn handle(_event: Event) -> Result<Option<String>, HandleError> {
            for _ in 0..MAX_REQUESTS_PER_CALL {
                assert!(matches!(
                    http::get("https://unlisted.test/").send(),
                    Err(HttpError::Denied(_))
                ));
            }
            let response = http::get("https://api.test/").send()?;
            Ok(Some(response.status.to_string()))
        }
    }

    /// As in hookd, a refused request does not use up the call's share: only requests whose
    /// target is allowed (here: stubbed) count.
    #[test]
    fn refused_requests_do_not_count_against_the_cap() {
        let mut hookd = Harness::new().respond_to("GET", "https://api.test", 200);
        assert_eq!(
            hookd.handle::<RefusedFirst>(event("t", 1)),
            Ok(Some("200".into()))
        );
    }

    #[test]
    fn a_call_is_capped_at_the_hosts_request_limit() {
        let mut hookd = Harness::new().respond_to("GET", "https://api.test", 200);
        match hookd.handle::<Flooder>(event("t", 1)) {
            Err(HandleError::Permanent(reason)) => {
                assert!(reason.contains("cap on requests"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// Reads the status and the first 4 bytes of the body.
    struct Peeker;

    impl Handler for Peeker {
        fn handle(_event: Event) -> Result<Option<String>, HandleError> {
            let response = http::get("https://api.test/")
                .response_body_limit(4)
                .send()?;
            Ok(Some(format!("{} {}", response.status, response.text()?)))
        }
    }

    #[test]
    fn a_response_body_limit_keeps_the_start_of_the_body() {
        let mut hookd = Harness::new().respond_with(
            "GET",
            "https://api.test",
            http::Response::new(200, "long answer"),
        );
        assert_eq!(
            hookd.handle::<Peeker>(event("t", 1)),
            Ok(Some("200 long".into()))
        );
    }

    /// Sends one header, named and valued by config `name` and `value`.
    struct Headed;

    impl Handler for Headed {
        fn handle(_event: Event) -> Result<Option<String>, HandleError> {
            let name = config::get("name").unwrap_or_default();
            let value = config::get("value").unwrap_or_default();
            http::post("https://api.test/")
                .header(name, value)
                .body("x")
                .send()?;
            Ok(None)
        }
    }

    /// A header `wasi:http` refuses is refused here as in hookd, before anything is sent (the
    /// harness answered the stub, and in hookd every such event was dead-lettered); its value
    /// is never printed.
    #[test]
    fn headers_hookd_refuses_are_refused_before_sending() {
        let sent = |name: &str, value: &str| {
            let mut hookd = Harness::new()
                .with_config("name", name)
                .with_config("value", value)
                .respond_to("POST", "https://api.test", 200);
            let result = hookd.handle::<Headed>(event("t", 1));
            (result, hookd.requests().len())
        };
        for (name, value, says) in [
            (
                "Content-Length",
                "1",
                "\"Content-Length\" is hookd's to set",
            ),
            ("host", "evil.test", "\"host\" is hookd's to set"),
            ("Transfer-Encoding", "chunked", "hookd's to set"),
            ("Connection", "close", "hookd's to set"),
            ("Proxy-Authorization", "Basic c2VjcmV0", "hookd's to set"),
            (
                "bad name",
                "v",
                "header name \"bad name\" is not a valid HTTP field name",
            ),
            ("", "v", "is not a valid HTTP field name"),
            (
                "x-token",
                "s3cret\r\nx-evil: 1",
                "\"x-token\" holds a control character",
            ),
        ] {
            let (result, requests) = sent(name, value);
            match result {
                Err(HandleError::Permanent(reason)) => {
                    assert!(reason.contains(says), "{name}: {reason}");
                    assert!(
                        !reason.contains("s3cret") && !reason.contains("c2VjcmV0"),
                        "{reason}"
                    );
                }
                other => panic!("{name}: {other:?}"),
            }
            assert_eq!(requests, 0, "{name}: sent all the same");
        }
        let (result, requests) = sent("X-Trace", "a\tb");
        assert_eq!((result, requests), (Ok(None), 1));
    }

    /// A stub's body over hookd's cap fails as in hookd (the read ends at the cap), unless the
    /// request asked for the start of the body only.
    #[test]
    fn a_stub_body_over_the_cap_is_too_large() {
        struct Reader;
        impl Handler for Reader {
            fn handle(_event: Event) -> Result<Option<String>, HandleError> {
                match http::get("https://api.test/").send() {
                    Err(HttpError::TooLarge(why)) => Ok(Some(why)),
                    other => panic!("{other:?}"),
                }
            }
        }
        let body = vec![b'a'; http::MAX_RESPONSE_BYTES + 1];
        let mut hookd =
            Harness::new().respond_with("GET", "https://api.test", http::Response::new(200, body));
        assert_eq!(
            hookd.handle::<Reader>(event("t", 1)),
            Ok(Some("api.test sent more than 8388608 bytes".into()))
        );
        assert_eq!(
            hookd.handle::<Peeker>(event("t", 2)),
            Ok(Some("200 aaaa".into()))
        );
    }

    /// Answers with status config `status` and one header from config `name`.
    struct Answerer;

    impl Parser for Answerer {
        fn parse(_req: Request) -> Result<Envelope, ParseError> {
            let status = config::get("status").map_or(200, |s| s.parse().unwrap());
            let name = config::get("name").unwrap_or_else(|| "content-type".into());
            Err(ParseError::respond(
                crate::Response::new(status, "ok").with_header(name, "text/plain"),
            ))
        }
    }

    /// A `respond` hookd could not send as given fails the test as it fails the parse in
    /// hookd; one it can is returned.
    #[test]
    fn a_respond_hookd_would_refuse_panics() {
        for (status, name, says) in [
            ("101", "content-type", "has status 101, outside 200-599"),
            ("600", "content-type", "has status 600, outside 200-599"),
            (
                "200",
                "Content-Length",
                "sets content-length, which hookd's HTTP layer owns",
            ),
            ("200", "bad name", "has an invalid header \"bad name\""),
        ] {
            let mut hookd = Harness::new()
                .with_config("status", status)
                .with_config("name", name);
            let panicked = catch_unwind(AssertUnwindSafe(|| {
                hookd.parse::<Answerer>(Request::new("s", "{}"))
            }))
            .unwrap_err();
            let message = panicked.downcast_ref::<String>().unwrap();
            assert!(message.contains(says), "{message}");
        }
        let mut hookd = Harness::new();
        let answered = hookd.parse::<Answerer>(Request::new("s", "{}"));
        assert!(
            matches!(&answered, Err(ParseError::Respond(r)) if r.status == 200),
            "{answered:?}"
        );
    }

    #[test]
    fn without_a_harness_call_the_services_say_where_to_look() {
        let got = catch_unwind(|| config::get("k")).unwrap_err();
        let message = got.downcast_ref::<String>().unwrap();
        assert!(
            message.contains("plugin_sdk::testing::Harness"),
            "{message}"
        );
        // A harness serves only while its call runs.
        let mut hookd = Harness::new().with_config("url", "http://x/");
        let _ = hookd.handle::<Poster>(event("t", 1));
        assert!(catch_unwind(|| state::get("total")).is_err());
    }

    #[test]
    fn harnesses_on_parallel_threads_keep_their_own_state() {
        let threads: Vec<_> = (0..4u64)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut hookd = Harness::new();
                    for n in 0..50 {
                        hookd.handle::<Adder>(event("add", i + n)).unwrap();
                    }
                    hookd.state_json::<u64>("total").unwrap()
                })
            })
            .collect();
        let totals: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(totals, [1225, 1275, 1325, 1375]);
    }
}
