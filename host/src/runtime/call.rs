//! One call into a plugin: a fresh store and instance, the role's export called under the
//! call's budget, its output capped, its failures mapped to [`CallError`].
//!
//! Invariants:
//! - Every call, of any role, goes through [`Runtime::call_role`]: a fresh `Store` (nothing
//!   survives a call except through the `state` import), instantiate, call, cap the output. A
//!   new role is one more [`Role`] impl and a new WIT version one more arm in each, not
//!   another copy of that path; calls take and return the latest WIT's shapes.
//! - A call is bounded twice: by the epoch deadline (fires inside guest code) and by a wall
//!   clock on top ([`bounded`], fires while the guest is blocked in a host call).
//! - The WASI context grants nothing but a bounded in-memory stderr ([`GuestStderr`]); outbound
//!   HTTP is refused unless the call carries an [`Outbound`] grant, which only
//!   [`Runtime::handle`] passes on.
//! - A trap after the guest reported a panic on stderr is a [`CallError::Trap`] whose message
//!   starts with the panic's location and message (escaped, capped), then the trap, with the
//!   backtrace trimmed to the guest's own frames ([`panic_trap_message`]); any other trap's
//!   message is as wasmtime words it.

use std::{collections::BTreeMap, sync::Arc, time::Duration, time::Instant};

use wasmtime::{
    Store, Trap, UpdateDeadline,
    component::{Instance, InstancePre, ResourceTable},
};
use wasmtime_wasi::WasiCtxBuilder;

use super::{
    LimitExceeded, Plugin, Runtime, StateLimit, StateRefused, StateStore,
    bindings::{HandlerPre, ParserPre, WitVersion, types, v0_1, v0_2, v0_3},
    budget,
    engine::TICK,
    host::{self, HostState},
    limiter,
    outbound_hooks::OutboundHooks,
    stderr::GuestStderr,
};
use crate::{
    ids::{EventId, PluginName},
    model::{Envelope, Header, StateChanges},
    outbound::Outbound,
};

/// Largest `wasi:random` request one import call may make (the guest's hash-map seeds need
/// 16 bytes).
const MAX_RANDOM_BYTES: u64 = 64 * 1024;

/// Per-call budget.
#[derive(Debug, Clone)]
pub struct Limits {
    pub timeout: Duration,
    /// The setting `timeout` comes from (`timeout_ms`, `parser_timeout_ms`), named when a call
    /// runs out of it.
    pub timeout_key: &'static str,
    pub memory_bytes: u64,
    /// The setting `memory_bytes` comes from (`memory_mib`, `parser_memory_mib`), named when a
    /// call exceeds it.
    pub memory_key: &'static str,
    /// What of the host's plugin memory the call may draw on (a handler attempt: the
    /// handlers' share).
    pub pool_share: limiter::PoolShare,
    pub output_bytes: usize,
    pub log_bytes: usize,
}

/// Why a call did not return a value.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The deadline passed (epoch interruption or wall clock).
    #[error("timed out after {limit:?} ({key})")]
    Timeout { limit: Duration, key: &'static str },
    /// The guest trapped: panic, out of memory, stack overflow, or a host-side refusal.
    #[error("{0}")]
    Trap(String),
    /// The output exceeded its cap; it is an error, never silently truncated.
    #[error("output of {size} bytes exceeds the {limit}-byte cap (output_kib)")]
    OutputTooLarge { size: usize, limit: usize },
    /// The component lacks the role asked for.
    #[error("the plugin does not export the {0} role")]
    MissingRole(&'static str),
    /// The host refused a state write (the call was stopped there); the message names the limit.
    #[error("{}", .0.message)]
    StateRefused(StateRefused),
    /// The calls in flight together held the host's plugin memory (`server.plugin_memory_mib`):
    /// a trap of this call's growth, but not its fault, so it may succeed later.
    #[error("{0}")]
    HostMemory(String),
    /// [`CallError::HostMemory`] while the instance was being made (before its export was
    /// called) and before any request of the call went out: nothing it did can have reached the
    /// world (a start function may have run, but only its state, never committed, is touched).
    #[error("{0}")]
    NoMemoryToStart(String),
}

impl CallError {
    /// The `error_kind` stored on an attempt.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Timeout { .. } => "timeout",
            Self::Trap(_) | Self::HostMemory(_) => "trap",
            Self::NoMemoryToStart(_) => "plugin_memory",
            Self::OutputTooLarge { .. } => "output_too_large",
            Self::MissingRole(_) => "missing_role",
            Self::StateRefused(refused) => match refused.limit {
                StateLimit::Attempt => "state_limit",
                StateLimit::Total => "state_quota",
            },
        }
    }
}

/// Who is calling, for the plugin's imports and log attribution.
#[derive(Clone)]
pub struct CallContext {
    pub plugin: PluginName,
    pub config: Arc<BTreeMap<String, String>>,
    pub event: Option<EventId>,
    pub limits: Limits,
}

/// A parser's verdict on a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseVerdict {
    Envelope(Envelope),
    Invalid(String),
    Ignore(String),
    /// Not an event: answer the provider with this (e.g. a handshake) and store nothing.
    Respond(ParserResponse),
}

/// An answer a parser gives the provider itself: a status from 200 to 599 and valid headers
/// (checked when it leaves the runtime); its size counted against the parser's output cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParserResponse {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

/// What a parser is given: a verified request.
#[derive(Debug, Clone, Copy)]
pub struct ParseRequest<'a> {
    /// The source's name.
    pub source: &'a str,
    /// The HTTP method, upper-case.
    pub method: &'a str,
    /// The raw query string without `?` (empty when none).
    pub query: &'a str,
    pub headers: &'a [Header],
    pub body: &'a [u8],
    pub received_at_ms: i64,
}

/// What a handler is given.
#[derive(Debug, Clone)]
pub struct EventInput {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub ordering_key: Option<String>,
    pub sequence: Option<u64>,
    /// A newer sequence of its key was already done when it was leased.
    pub stale: bool,
    pub attempt: u32,
    pub received_at_ms: i64,
    pub headers: Vec<Header>,
    pub body: Vec<u8>,
}

/// A handler's verdict on an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandleVerdict {
    Ok(Option<String>),
    Retry {
        reason: String,
        after: Option<Duration>,
    },
    Permanent(String),
}

/// One role a component exports, as the host links, checks and calls it. Implemented by each
/// role's generated pre-instance type.
pub(super) trait Role: Sized + Send + Sync {
    /// The role's name in `hookd:plugin/{NAME}` and in errors.
    const NAME: &'static str;
    /// What the call is given (the WIT type).
    type Input: Sync;
    /// What the call returns (the WIT type).
    type Output: Send;

    /// The role's pre-instance, for WIT `version`, of a component whose imports `pre`
    /// satisfies; errs if its export does not match that WIT.
    fn link(pre: InstancePre<HostState>, version: WitVersion) -> wasmtime::Result<Self>;
    /// The component's linked pre-instance.
    fn linked(&self) -> &InstancePre<HostState>;
    /// Looks the role's export up in an instance, checking its type against its WIT.
    fn check_exports(
        &self,
        store: &mut Store<HostState>,
        instance: &Instance,
    ) -> wasmtime::Result<()>;
    /// The role's pre-instance in `plugin`, if it exports the role.
    fn of(plugin: &Plugin) -> Option<&Self>;
    /// Instantiates the component in `store` and makes the role's one call.
    fn call(
        &self,
        store: &mut Store<HostState>,
        input: &Self::Input,
    ) -> impl Future<Output = wasmtime::Result<Self::Output>> + Send;
    /// Bytes of a returned value that count against [`Limits::output_bytes`].
    fn output_bytes(output: &Self::Output) -> usize;
}

impl Role for ParserPre {
    const NAME: &'static str = "parser";
    type Input = types::Request;
    type Output = Result<types::Envelope, types::ParseError>;

    fn link(pre: InstancePre<HostState>, version: WitVersion) -> wasmtime::Result<Self> {
        Ok(match version {
            WitVersion::V0_1 => Self::V0_1(v0_1::parser_world::ParserPluginPre::new(pre)?),
            WitVersion::V0_2 => Self::V0_2(v0_2::parser_world::ParserPluginPre::new(pre)?),
            WitVersion::V0_3 => Self::V0_3(v0_3::parser_world::ParserPluginPre::new(pre)?),
        })
    }

    fn linked(&self) -> &InstancePre<HostState> {
        match self {
            Self::V0_1(pre) => pre.instance_pre(),
            Self::V0_2(pre) => pre.instance_pre(),
            Self::V0_3(pre) => pre.instance_pre(),
        }
    }

    fn check_exports(
        &self,
        store: &mut Store<HostState>,
        instance: &Instance,
    ) -> wasmtime::Result<()> {
        match self {
            Self::V0_1(_) => v0_1::parser_world::ParserPlugin::new(store, instance).map(drop),
            Self::V0_2(_) => v0_2::parser_world::ParserPlugin::new(store, instance).map(drop),
            Self::V0_3(_) => v0_3::parser_world::ParserPlugin::new(store, instance).map(drop),
        }
    }

    fn of(plugin: &Plugin) -> Option<&Self> {
        plugin.parser.as_ref()
    }

    async fn call(
        &self,
        store: &mut Store<HostState>,
        input: &types::Request,
    ) -> wasmtime::Result<Self::Output> {
        match self {
            Self::V0_1(pre) => v0_1::parse(pre, store, input).await,
            Self::V0_2(pre) => v0_2::parse(pre, store, input).await,
            Self::V0_3(pre) => v0_3::parse(pre, store, input).await,
        }
    }

    fn output_bytes(output: &Self::Output) -> usize {
        match output {
            Ok(env) => {
                env.event_id.len()
                    + env.event_type.len()
                    + env.ordering_key.as_ref().map_or(0, String::len)
            }
            Err(types::ParseError::Respond(response)) => {
                header_bytes(&response.headers) + response.body.len()
            }
            Err(_) => 0,
        }
    }
}

impl Role for HandlerPre {
    const NAME: &'static str = "handler";
    type Input = types::Event;
    type Output = Result<Option<String>, types::HandleError>;

    fn link(pre: InstancePre<HostState>, version: WitVersion) -> wasmtime::Result<Self> {
        Ok(match version {
            WitVersion::V0_1 => Self::V0_1(v0_1::handler_world::HandlerPluginPre::new(pre)?),
            WitVersion::V0_2 => Self::V0_2(v0_2::handler_world::HandlerPluginPre::new(pre)?),
            WitVersion::V0_3 => Self::V0_3(v0_3::handler_world::HandlerPluginPre::new(pre)?),
        })
    }

    fn linked(&self) -> &InstancePre<HostState> {
        match self {
            Self::V0_1(pre) => pre.instance_pre(),
            Self::V0_2(pre) => pre.instance_pre(),
            Self::V0_3(pre) => pre.instance_pre(),
        }
    }

    fn check_exports(
        &self,
        store: &mut Store<HostState>,
        instance: &Instance,
    ) -> wasmtime::Result<()> {
        match self {
            Self::V0_1(_) => v0_1::handler_world::HandlerPlugin::new(store, instance).map(drop),
            Self::V0_2(_) => v0_2::handler_world::HandlerPlugin::new(store, instance).map(drop),
            Self::V0_3(_) => v0_3::handler_world::HandlerPlugin::new(store, instance).map(drop),
        }
    }

    fn of(plugin: &Plugin) -> Option<&Self> {
        plugin.handler.as_ref()
    }

    async fn call(
        &self,
        store: &mut Store<HostState>,
        input: &types::Event,
    ) -> wasmtime::Result<Self::Output> {
        match self {
            Self::V0_1(pre) => v0_1::handle(pre, store, input).await,
            Self::V0_2(pre) => v0_2::handle(pre, store, input).await,
            Self::V0_3(pre) => v0_3::handle(pre, store, input).await,
        }
    }

    fn output_bytes(output: &Self::Output) -> usize {
        output
            .as_ref()
            .map_or(0, |out| out.as_ref().map_or(0, String::len))
    }
}

impl Runtime {
    /// A fresh store for one call: its limiter, handle caps, host budget, WASI context that
    /// grants nothing, outbound hooks without a grant, and the epoch deadline.
    pub(super) fn store(
        &self,
        ctx: &CallContext,
        state: Option<Arc<dyn StateStore>>,
    ) -> Store<HostState> {
        let limits = limiter::Limiter::new(
            ctx.limits.memory_bytes,
            ctx.limits.memory_key,
            self.memory.clone(),
            ctx.limits.pool_share,
        );
        let mut table = ResourceTable::new();
        table.set_max_capacity(limiter::HOST_HANDLES);
        let deadline = Instant::now() + ctx.limits.timeout;
        let stderr = GuestStderr::default();
        let host = HostState {
            // Nothing granted but a bounded in-memory stderr (read only to explain a trap);
            // random bytes per call are capped far below the default 64 MiB so one import
            // call cannot make the host allocate that much.
            wasi: WasiCtxBuilder::new()
                .stderr(stderr.clone())
                .max_random_size(MAX_RANDOM_BYTES)
                .build(),
            stderr,
            table,
            limits,
            config: ctx.config.clone(),
            log_budget: ctx.limits.log_bytes,
            log_line_bytes: host::LOG_LINE_BYTES
                + ctx.event.as_ref().map_or(0, |e| e.as_str().len()),
            log_truncated: false,
            state: state.map(|store| host::StateTxn::new(store, ctx.plugin.clone())),
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
            budget: budget::HostBudget::new(budget::HOST_BYTES),
            outbound: OutboundHooks::new(
                ctx.plugin.clone(),
                ctx.event.clone(),
                deadline,
                self.connector.clone(),
                self.sockets.clone(),
                self.lookups.clone(),
            ),
            _live: self.live_store(),
            started: false,
        };
        let mut store = Store::new(&self.engine, host);
        store.limiter(|s| &mut s.limits);
        store.set_max_component_handles(limiter::RESOURCE_HANDLES);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        store
    }

    /// Runs role `R` of `plugin` once: fresh store (with `state` and the network `grant`, if
    /// any), instantiate, call, cap the output. The guest's log lines and the host's refusals run in its `call` span, which names the
    /// plugin and the role.
    #[tracing::instrument(
        name = "call", level = "error", skip_all, fields(plugin = %ctx.plugin, role = %R::NAME)
    )]
    async fn call_role<R: Role>(
        &self,
        plugin: &Plugin,
        ctx: &CallContext,
        state: Option<Arc<dyn StateStore>>,
        grant: Option<Outbound>,
        input: &R::Input,
    ) -> Called<R::Output> {
        let Some(pre) = R::of(plugin) else {
            return Called {
                output: Err(CallError::MissingRole(R::NAME)),
                changes: StateChanges::default(),
                refused: None,
            };
        };
        let mut store = self.store(ctx, state);
        if let Some(grant) = grant {
            store.data_mut().outbound.grant(grant);
        }
        let stderr = store.data().stderr.clone();
        let result = match bounded(&ctx.limits, &stderr, pre.call(&mut store, input)).await {
            Err(CallError::HostMemory(message))
                if !store.data().started && !store.data().outbound.sent_any() =>
            {
                Err(CallError::NoMemoryToStart(message))
            }
            result => result,
        };
        let changes = store.data_mut().take_state_changes();
        let refused = store.data().outbound.first_refusal();
        let limit = ctx.limits.output_bytes;
        let output = result.and_then(|output| match R::output_bytes(&output) {
            size if size > limit => Err(CallError::OutputTooLarge { size, limit }),
            _ => Ok(output),
        });
        Called {
            output,
            changes,
            refused,
        }
    }

    /// Runs a parser on a verified request.
    pub async fn parse(
        &self,
        plugin: &Plugin,
        ctx: &CallContext,
        req: ParseRequest<'_>,
    ) -> Result<ParseVerdict, CallError> {
        let request = types::Request {
            source: req.source.to_owned(),
            method: req.method.to_owned(),
            query: req.query.to_owned(),
            headers: wit_headers(req.headers),
            body: req.body.to_vec(),
            received_at_ms: req.received_at_ms.max(0) as u64,
        };
        let called = self
            .call_role::<ParserPre>(plugin, ctx, None, None, &request)
            .await;
        Ok(match called.output? {
            Ok(env) if env.event_id.is_empty() => ParseVerdict::Invalid(format!(
                "parser plugin {} returned an empty event id",
                ctx.plugin
            )),
            Ok(env) => ParseVerdict::Envelope(Envelope {
                event_id: EventId::new(env.event_id),
                event_type: env.event_type,
                ordering_key: env.ordering_key,
                sequence: env.sequence,
            }),
            Err(types::ParseError::Invalid(message)) => ParseVerdict::Invalid(message),
            Err(types::ParseError::Ignore(message)) => ParseVerdict::Ignore(message),
            Err(types::ParseError::Respond(response)) => parser_response(response)?,
        })
    }

    /// Runs a handler on one event. Returns the verdict and the attempt's buffered state changes
    /// (to be committed only if the verdict is `Ok`). `outbound` is the attempt's network grant:
    /// the plugin's `allow_hosts` and the `Idempotency-Key` its requests carry.
    pub async fn handle(
        &self,
        plugin: &Plugin,
        ctx: &CallContext,
        state: Arc<dyn StateStore>,
        event: EventInput,
        outbound: Outbound,
    ) -> (Result<HandleVerdict, CallError>, StateChanges) {
        let input = types::Event {
            source: event.source,
            event_id: event.event_id,
            event_type: event.event_type,
            ordering_key: event.ordering_key,
            sequence: event.sequence,
            attempt: event.attempt,
            received_at_ms: event.received_at_ms.max(0) as u64,
            headers: wit_headers(&event.headers),
            body: event.body,
            stale: event.stale,
        };
        let Called {
            output,
            changes,
            refused,
        } = self
            .call_role::<HandlerPre>(plugin, ctx, Some(state), Some(outbound), &input)
            .await;
        let explain = |reason: String| with_refusal(reason, refused.as_ref());
        let verdict = match output {
            Ok(Ok(output)) => Ok(HandleVerdict::Ok(output)),
            Ok(Err(types::HandleError::Retry(retry))) => Ok(HandleVerdict::Retry {
                reason: explain(retry.reason),
                after: retry.after_ms.map(Duration::from_millis),
            }),
            Ok(Err(types::HandleError::Permanent(reason))) => {
                Ok(HandleVerdict::Permanent(explain(reason)))
            }
            Err(CallError::Trap(message)) => Err(CallError::Trap(explain(message))),
            Err(other) => Err(other),
        };
        (verdict, changes)
    }
}

/// What one call of a role left behind.
struct Called<T> {
    /// The call's value (its output capped).
    output: Result<T, CallError>,
    /// The state changes it buffered.
    changes: StateChanges,
    /// The first outbound refusal's reason, and how many requests the call had refused.
    refused: Option<(String, u64)>,
}

/// A failed attempt's error with the reason the host refused one of its outbound requests, so
/// the stored error says why even when the plugin only passed on a bare `wasi:http` error
/// code. Nothing is added when the plugin's own text already carries the reason.
fn with_refusal(error: String, refused: Option<&(String, u64)>) -> String {
    match refused {
        Some((first, _)) if error.contains(first.as_str()) => error,
        Some((first, 1)) => format!("{error} (hookd refused an outbound request: {first})"),
        Some((first, count)) => {
            format!("{error} (hookd refused {count} outbound requests; the first: {first})")
        }
        None => error,
    }
}

/// Runs a guest call with a wall-clock bound (`limits.timeout`) on top of the epoch deadline
/// (which cannot fire while the guest is blocked in a host call), mapping traps to
/// [`CallError`]; `stderr` is the call's, read to explain a trap.
pub(super) async fn bounded<T>(
    limits: &Limits,
    stderr: &GuestStderr,
    call: impl Future<Output = wasmtime::Result<T>>,
) -> Result<T, CallError> {
    let (limit, key) = (limits.timeout, limits.timeout_key);
    match tokio::time::timeout(limit + TICK * 5, call).await {
        Err(_) => Err(CallError::Timeout { limit, key }),
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
                Err(CallError::Timeout { limit, key })
            } else if let Some(exceeded) = e.downcast_ref::<LimitExceeded>() {
                Err(match exceeded {
                    LimitExceeded::HostWide { .. } => CallError::HostMemory(exceeded.to_string()),
                    _ => CallError::Trap(exceeded.to_string()),
                })
            } else if e
                .downcast_ref::<wasmtime::PoolConcurrencyLimitError>()
                .is_some()
            {
                // The pool's slots are the host's, like its plugin memory: not the plugin's
                // fault, so not counted against its attempts.
                Err(CallError::HostMemory(format!(
                    "the host's pool of plugin instances is full: {e}"
                )))
            } else if let Some(refused) = e.downcast_ref::<StateRefused>() {
                Err(CallError::StateRefused(refused.clone()))
            } else if let Some(panic) = stderr.panic() {
                Err(CallError::Trap(panic_trap_message(&panic, &e)))
            } else {
                Err(CallError::Trap(trap_message(&e)))
            }
        }
    }
}

/// The first line of a trap plus its cause, without the long backtrace.
fn trap_message(e: &wasmtime::Error) -> String {
    let full = format!("{e:#}");
    let mut message: String = full.lines().take(3).collect::<Vec<_>>().join(" | ");
    // A host call's refusal (a state key the host will not store, say) is the error's root,
    // under the backtrace's lines: it goes first, as what the plugin must fix.
    let root = e.root_cause().to_string();
    if e.downcast_ref::<Trap>().is_none() && !message.contains(&root) {
        message = format!("{root} | {message}");
    }
    if let Some(trap) = e.downcast_ref::<Trap>() {
        let kind = match trap {
            Trap::StackOverflow => "stack overflow",
            Trap::UnreachableCodeReached => "unreachable (the guest panicked or aborted)",
            Trap::MemoryOutOfBounds => "memory out of bounds",
            _ => "",
        };
        if !kind.is_empty() && !message.contains(kind) {
            message = format!("{kind}: {message}");
        }
    }
    crate::text::cap(message, 2048)
}

/// How many of the guest's own frames a panic's error keeps.
const PANIC_FRAMES: usize = 6;

/// A trap after a panic: the panic's report (already escaped and capped) first, then the trap
/// (`unreachable (the guest panicked or aborted): wasm trap: ...`), then the backtrace's frames
/// without the panic machinery (std, core, alloc), innermost first, each with its location
/// when the plugin was built with line tables.
fn panic_trap_message(panic: &str, e: &wasmtime::Error) -> String {
    let mut message = format!("{panic} | ");
    match e.downcast_ref::<Trap>() {
        Some(Trap::UnreachableCodeReached) => {
            message.push_str("unreachable (the guest panicked or aborted): ");
        }
        Some(Trap::StackOverflow) => message.push_str("stack overflow: "),
        Some(Trap::MemoryOutOfBounds) => message.push_str("memory out of bounds: "),
        _ => {}
    }
    message.push_str(&e.root_cause().to_string());
    if let Some(backtrace) = e.downcast_ref::<wasmtime::WasmBacktrace>() {
        let frames = guest_frames(&backtrace.to_string());
        if !frames.is_empty() {
            message.push_str(" | at ");
            message.push_str(&frames.join(" <- "));
        }
    }
    crate::text::cap(message, 2048)
}

/// The frames of a wasm backtrace as wasmtime prints it (`  N: 0xOFFSET - NAME`, then
/// `at FILE:LINE:COL` and inlined `- NAME` lines), as `NAME (FILE:LINE:COL)`, without the
/// panic machinery and runtime glue, at most [`PANIC_FRAMES`].
fn guest_frames(backtrace: &str) -> Vec<String> {
    let mut frames: Vec<(String, Option<String>)> = Vec::new();
    for line in backtrace.lines() {
        let line = line.trim();
        if let Some(at) = line.strip_prefix("at ") {
            if let Some(last) = frames.last_mut()
                && last.1.is_none()
            {
                last.1 = Some(at.to_owned());
            }
        } else if let Some(name) = line.strip_prefix("- ") {
            frames.push((without_crate_hashes(name), None));
        } else if let Some((index, rest)) = line.split_once(": ")
            && index.chars().all(|c| c.is_ascii_digit())
        {
            let name = rest.split_once(" - ").map_or(rest, |(_, name)| name);
            let name = name.split_once('!').map_or(name, |(_, name)| name);
            frames.push((without_crate_hashes(name), None));
        }
    }
    frames
        .into_iter()
        .filter(|(name, _)| !is_machinery(name))
        .take(PANIC_FRAMES)
        .map(|(name, at)| match at {
            Some(at) => format!("{name} ({at})"),
            None => name,
        })
        .collect()
}

/// `name` without the crate disambiguators of v0 mangling (`std[d123b7a1a2ed1472]::` is
/// `std::`).
fn without_crate_hashes(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        match after.find(']') {
            Some(close) if close > 0 && after[..close].chars().all(|c| c.is_ascii_hexdigit()) => {
                out.push_str(&rest[..open]);
                rest = &after[close + 1..];
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Frames every panic passes through: the panic runtime and the standard library.
fn is_machinery(name: &str) -> bool {
    let name = name.trim_start_matches('<');
    [
        "core::",
        "std::",
        "alloc::",
        "__rustc::",
        "__rust",
        "rust_panic",
        "rust_begin_unwind",
        "abort",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
}

/// The most headers a parser's `respond` may set (a handshake's answer needs a few).
pub const MAX_RESPOND_HEADERS: usize = 100;

/// A parser's `respond`, checked: a response hookd could not send as given is the parser's
/// failure (the request is quarantined like any other failed parse, never half-answered).
fn parser_response(response: types::Response) -> Result<ParseVerdict, CallError> {
    let refuse = |why: String| CallError::Trap(format!("the parser's respond {why}"));
    let status = http::StatusCode::from_u16(response.status)
        .ok()
        .filter(|s| (200..=599).contains(&s.as_u16()))
        .ok_or_else(|| refuse(format!("has status {}, outside 200-599", response.status)))?;
    if response.headers.len() > MAX_RESPOND_HEADERS {
        // Counted before anything is built: a map sized to tens of thousands of headers (of
        // empty names, which weigh nothing against the output cap) panics in the `http` crate.
        return Err(refuse(format!(
            "has {} headers, over the {MAX_RESPOND_HEADERS} an answer may carry",
            response.headers.len()
        )));
    }
    let mut headers = http::HeaderMap::with_capacity(response.headers.len());
    for h in response.headers {
        let name = http::HeaderName::from_bytes(h.name.as_bytes());
        let value = http::HeaderValue::from_str(&h.value);
        let (Ok(name), Ok(value)) = (name, value) else {
            return Err(refuse(format!("has an invalid header {:?}", h.name)));
        };
        if crate::outbound::policy::CONNECTION_HEADERS.contains(&name.as_str()) {
            // The answer's framing and the connection are hookd's: set by a plugin, they could
            // make one request's answer read as the next one's (behind a proxy, another
            // sender's).
            return Err(refuse(format!(
                "sets {name}, which hookd's HTTP layer owns (the length, the framing and the \
                 connection)"
            )));
        }
        headers.append(name, value);
    }
    Ok(ParseVerdict::Respond(ParserResponse {
        status,
        headers,
        body: response.body,
    }))
}

/// Bytes of headers that count against an output cap.
fn header_bytes(headers: &[types::Header]) -> usize {
    headers.iter().map(|h| h.name.len() + h.value.len()).sum()
}

fn wit_headers(headers: &[Header]) -> Vec<types::Header> {
    headers
        .iter()
        .map(|(name, value)| types::Header {
            name: name.clone(),
            value: value.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin that passes on a bare `wasi:http` error code (or was built before the host
    /// said why) still leaves the reason in the stored error; one that said it is left alone.
    #[test]
    fn a_failed_attempt_s_error_says_why_a_request_was_refused() {
        let first = "localhost:9100 is not in allow_hosts".to_owned();
        assert_eq!(
            with_refusal("request denied".into(), Some(&(first.clone(), 1))),
            "request denied (hookd refused an outbound request: localhost:9100 is not in \
             allow_hosts)"
        );
        assert_eq!(
            with_refusal("request denied".into(), Some(&(first.clone(), 3))),
            "request denied (hookd refused 3 outbound requests; the first: localhost:9100 is \
             not in allow_hosts)"
        );
        let said = format!("hookd refused the request to localhost:9100: {first}");
        assert_eq!(with_refusal(said.clone(), Some(&(first, 1))), said);
        assert_eq!(with_refusal("busy".into(), None), "busy");
    }

    fn respond(status: u16, header: (&str, &str)) -> Result<ParseVerdict, CallError> {
        parser_response(types::Response {
            status,
            headers: vec![types::Header {
                name: header.0.into(),
                value: header.1.into(),
            }],
            body: b"ok".to_vec(),
        })
    }

    /// A 1xx is not a final answer and a status over 599 is not HTTP: either would leave the
    /// provider without a usable reply, so the parse fails instead.
    #[test]
    fn a_respond_status_outside_200_to_599_fails_the_parse() {
        for status in [0, 101, 199, 600, 1000] {
            let verdict = respond(status, ("content-type", "text/plain"));
            assert!(
                matches!(verdict, Err(CallError::Trap(_))),
                "{status}: {verdict:?}"
            );
        }
        for status in [200, 404, 599] {
            let verdict = respond(status, ("content-type", "text/plain"));
            assert!(matches!(verdict, Ok(ParseVerdict::Respond(r)) if r.status == status));
        }
    }

    /// A parser answering with more headers than an answer may carry fails its parse. Before,
    /// 24 577 empty ones (0 bytes against the output cap) made the `http` crate panic sizing
    /// the map: the connection was reset and the request neither stored nor quarantined.
    #[test]
    fn a_respond_with_too_many_headers_fails_the_parse() {
        for (n, name) in [(30_000, ""), (MAX_RESPOND_HEADERS + 1, "x-a")] {
            let verdict = parser_response(types::Response {
                status: 200,
                headers: vec![
                    types::Header {
                        name: name.into(),
                        value: String::new(),
                    };
                    n
                ],
                body: Vec::new(),
            });
            let Err(CallError::Trap(why)) = verdict else {
                panic!("{n} headers: {verdict:?}");
            };
            assert_eq!(
                why,
                format!("the parser's respond has {n} headers, over the 100 an answer may carry")
            );
        }
        let most = vec![
            types::Header {
                name: "x-a".into(),
                value: "1".into(),
            };
            MAX_RESPOND_HEADERS
        ];
        let verdict = parser_response(types::Response {
            status: 200,
            headers: most,
            body: Vec::new(),
        });
        assert!(
            matches!(&verdict, Ok(ParseVerdict::Respond(r)) if r.headers.len() == MAX_RESPOND_HEADERS),
            "{verdict:?}"
        );
    }

    /// A header hookd could not send as given fails the parse rather than being dropped; so
    /// does one that would set the answer's framing or the connection (a `Content-Length: 0`
    /// with a body made the body read as the answer to the connection's next request).
    #[test]
    fn a_respond_header_that_is_not_valid_http_fails_the_parse() {
        for header in [
            ("bad name", "v"),
            ("x-ok", "line\nbreak"),
            ("content-length", "0"),
            ("Transfer-Encoding", "chunked"),
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
        ] {
            let verdict = respond(200, header);
            assert!(
                matches!(verdict, Err(CallError::Trap(_))),
                "{header:?}: {verdict:?}"
            );
        }
    }
}
