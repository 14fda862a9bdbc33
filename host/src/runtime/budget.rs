//! The host budget of one call: host memory a guest makes the host allocate for it through
//! `wasi:http` (header fields, request and response parts, outgoing body buffers), which the
//! linear-memory limit does not see.
//!
//! Invariants:
//! - Every `wasi:http` import that makes the host keep guest-supplied bytes is wrapped here and
//!   charges them to the call's [`HostBudget`] *before* the host allocates; past
//!   [`HOST_BYTES`] the call traps with [`LimitExceeded::HostMemory`], naming the limit.
//! - A host call's arguments are lifted (allocated) before its function runs, so the lists
//!   whose elements cost the host more than the guest (`fields.set`'s and `fields.from-list`'s
//!   many small values) are taken as views into guest memory ([`WasmList`]), charged from
//!   their lengths, and only then copied. Their entries' least cost is charged from the
//!   list's count before any entry is read, so no host call walks more of a list than the
//!   budget could pay for (a host call runs to its end whatever the guest's deadline).
//! - The budget only grows during a call (bytes are counted when allocated, not refunded when
//!   the guest drops a resource), so it bounds what a call can hold at once and is never an
//!   undercount. A store lives for one call, so the budget is per call.
//! - Everything else the host table can hold is small and capped by
//!   [`super::limiter::HOST_HANDLES`] live entries.

use http::{HeaderName, HeaderValue};
use wasmtime::{
    AsContextMut as _, StoreContextMut,
    component::{Linker, LinkerInstance, Resource, WasmList, WasmStr},
};
use wasmtime_wasi_http::{
    FieldMap, WasiHttpView,
    p2::bindings::http::types::{
        self as wt, HostFields, HostOutgoingRequest, HostOutgoingResponse, HostRequestOptions,
    },
};

use super::{host::HostState, limiter::LimitExceeded};

/// Host bytes one call (handler attempt or parse) may make the host hold for it.
pub const HOST_BYTES: usize = 16 * 1024 * 1024;

/// What creating any host resource (fields, request, response, options, body) costs at least:
/// its table entry and the host structure behind it.
pub const RESOURCE_BYTES: usize = 256;
/// Largest single write to an outgoing body stream (what `blocking-write-and-flush` allows
/// anyway). A body buffers at most [`BODY_BUFFER_CHUNKS`] + 1 such chunks before the
/// connection takes them, and is charged for them when it is created.
pub const BODY_CHUNK_BYTES: usize = 4096;
/// Chunks an outgoing body buffers (wasmtime-wasi-http needs at least 1).
pub const BODY_BUFFER_CHUNKS: usize = 1;
/// What one outgoing body costs against the budget: with the request and its fields, a call
/// can create about 1 800 requests (it may send 64) before the budget stops it.
pub const BODY_BYTES: usize = RESOURCE_BYTES + (BODY_BUFFER_CHUNKS + 1) * BODY_CHUNK_BYTES;
/// Per header entry on top of its name and value bytes (the map's own structures).
const ENTRY_BYTES: usize = size_of::<HeaderName>() + size_of::<HeaderValue>() + 16;

/// The `wasi:http` version hookd links (wasmtime-wasi-http 48).
const TYPES: &str = "wasi:http/types@0.2.12";

/// Host bytes charged to one call so far.
#[derive(Debug, Clone)]
pub struct HostBudget {
    used: usize,
    limit: usize,
}

impl HostBudget {
    pub fn new(limit: usize) -> Self {
        Self { used: 0, limit }
    }

    /// Counts `bytes` more, or traps (typed) if that passes the limit; nothing is counted then.
    pub fn charge(&mut self, bytes: usize) -> wasmtime::Result<()> {
        let desired = self.used.saturating_add(bytes);
        if desired > self.limit {
            return Err(LimitExceeded::HostMemory {
                desired,
                limit: self.limit,
            }
            .into());
        }
        self.used = desired;
        Ok(())
    }

    /// Charges a guest list of `count` entries: `base` and what every entry costs at least
    /// (`floor` each) before any entry is read, so a list longer than the budget allows traps
    /// without being walked (the guest's deadline cannot stop a host call before it returns);
    /// then each entry's own length as it is read, stopping at the first that passes the limit.
    /// Nothing is counted if it traps.
    fn charge_listed(
        &mut self,
        base: usize,
        count: usize,
        floor: usize,
        lengths: impl IntoIterator<Item = wasmtime::Result<usize>>,
    ) -> wasmtime::Result<()> {
        let before = self.used;
        let charge = || {
            self.charge(base.saturating_add(count.saturating_mul(floor)))?;
            for length in lengths {
                self.charge(length?)?;
            }
            Ok(())
        };
        let charged = charge();
        if charged.is_err() {
            self.used = before;
        }
        charged
    }

    /// Bytes charged so far.
    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.used
    }
}

fn entry_bytes(name: &str, value: &[u8]) -> usize {
    name.len() + value.len() + ENTRY_BYTES
}

fn map_bytes(map: &FieldMap) -> usize {
    map.iter()
        .map(|(name, value)| entry_bytes(name.as_str(), value.as_bytes()))
        .sum()
}

/// Charges the call's budget for the guest list `list` ([`HostBudget::charge_listed`]), each
/// element's own bytes being `length(element)`.
fn charge_list<T: wasmtime::component::Lift + 'static>(
    cx: &mut Cx<'_>,
    base: usize,
    floor: usize,
    list: &WasmList<T>,
    length: impl Fn(T) -> usize,
) -> wasmtime::Result<()> {
    // The budget is store data and the list's reads borrow the store: held apart meanwhile.
    let mut budget = std::mem::replace(&mut cx.data_mut().budget, HostBudget::new(0));
    let charged = list.iter(cx.as_context_mut()).and_then(|elements| {
        budget.charge_listed(base, list.len(), floor, elements.map(|e| e.map(&length)))
    });
    cx.data_mut().budget = budget;
    charged
}

/// The `i`th element of `list` (in bounds), lifted.
fn listed<T: wasmtime::component::Lift>(
    list: &WasmList<T>,
    cx: &mut Cx<'_>,
    i: usize,
) -> wasmtime::Result<T> {
    list.get(cx.as_context_mut(), i)
        .unwrap_or_else(|| Err(wasmtime::format_err!("list element {i} out of bounds")))
}

fn opt_len(s: &Option<String>) -> usize {
    s.as_ref().map_or(0, String::len)
}

type Cx<'a> = StoreContextMut<'a, HostState>;

/// Re-defines the `wasi:http/types` functions that allocate host memory for the guest so they
/// charge the call's budget first, then do exactly what wasmtime-wasi-http does. Call after
/// `wasmtime_wasi_http::p2::add_only_http_to_linker_async`.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    add_charged(&mut linker.instance(TYPES)?)?;
    linker.allow_shadowing(false);
    Ok(())
}

fn add_charged(types: &mut LinkerInstance<'_, HostState>) -> wasmtime::Result<()> {
    types.func_wrap("[constructor]fields", |mut cx: Cx<'_>, (): ()| {
        let state = cx.data_mut();
        state.budget.charge(RESOURCE_BYTES)?;
        Ok((HostFields::new(&mut state.http())?,))
    })?;
    // The entries are views into guest memory: charged from their lengths before any is copied
    // (one `Vec` per value costs the host several times the guest's 8 bytes for it).
    types.func_wrap(
        "[static]fields.from-list",
        |mut cx: Cx<'_>, (entries,): (WasmList<(WasmStr, WasmList<u8>)>,)| {
            // The values and the entries first (lengths only); each name once it is copied (one
            // name is at most the guest's memory, and it is dropped if the charge fails).
            charge_list(
                &mut cx,
                RESOURCE_BYTES,
                ENTRY_BYTES,
                &entries,
                |(_, value)| value.len(),
            )?;
            let mut copied = Vec::with_capacity(entries.len());
            for i in 0..entries.len() {
                let (name, value) = listed(&entries, &mut cx, i)?;
                let name = name.to_str(&cx)?.into_owned();
                cx.data_mut().budget.charge(name.len())?;
                copied.push((name, value.as_le_slice(&cx).to_vec()));
            }
            let entries = copied;
            let state = cx.data_mut();
            let mut view = state.http();
            Ok((match HostFields::from_list(&mut view, entries) {
                Ok(fields) => Ok(fields),
                Err(e) => Err(wt::Host::convert_header_error(&mut view, e)?),
            },))
        },
    )?;
    types.func_wrap(
        "[method]fields.set",
        |mut cx: Cx<'_>,
         (fields, name, values): (Resource<FieldMap>, String, WasmList<WasmList<u8>>)| {
            let floor = name.len().saturating_add(ENTRY_BYTES);
            charge_list(&mut cx, 0, floor, &values, |value| value.len())?;
            let mut copied = Vec::with_capacity(values.len());
            for i in 0..values.len() {
                let value = listed(&values, &mut cx, i)?;
                copied.push(value.as_le_slice(&cx).to_vec());
            }
            let values = copied;
            let state = cx.data_mut();
            let mut view = state.http();
            Ok((match HostFields::set(&mut view, fields, name, values) {
                Ok(()) => Ok(()),
                Err(e) => Err(wt::Host::convert_header_error(&mut view, e)?),
            },))
        },
    )?;
    types.func_wrap(
        "[method]fields.append",
        |mut cx: Cx<'_>, (fields, name, value): (Resource<FieldMap>, String, Vec<u8>)| {
            let state = cx.data_mut();
            state.budget.charge(entry_bytes(&name, &value))?;
            let mut view = state.http();
            Ok((match HostFields::append(&mut view, fields, name, value) {
                Ok(()) => Ok(()),
                Err(e) => Err(wt::Host::convert_header_error(&mut view, e)?),
            },))
        },
    )?;
    // A clone shares the map until its first change, which then copies all of it: charged
    // as a copy up front.
    types.func_wrap(
        "[method]fields.clone",
        |mut cx: Cx<'_>, (fields,): (Resource<FieldMap>,)| {
            let state = cx.data_mut();
            let bytes = map_bytes(state.table.get(&fields)?);
            state.budget.charge(RESOURCE_BYTES.saturating_add(bytes))?;
            Ok((HostFields::clone(&mut state.http(), fields)?,))
        },
    )?;

    types.func_wrap(
        "[constructor]outgoing-request",
        |mut cx: Cx<'_>, (headers,): (Resource<FieldMap>,)| {
            let state = cx.data_mut();
            state.budget.charge(RESOURCE_BYTES)?;
            Ok((HostOutgoingRequest::new(&mut state.http(), headers)?,))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.body",
        |mut cx: Cx<'_>, (request,): (Resource<wt::OutgoingRequest>,)| {
            let state = cx.data_mut();
            state.budget.charge(BODY_BYTES)?;
            Ok((HostOutgoingRequest::body(&mut state.http(), request)?,))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.set-method",
        |mut cx: Cx<'_>, (request, method): (Resource<wt::OutgoingRequest>, wt::Method)| {
            let state = cx.data_mut();
            let bytes = match &method {
                wt::Method::Other(other) => other.len(),
                _ => 0,
            };
            state.budget.charge(bytes)?;
            Ok((HostOutgoingRequest::set_method(
                &mut state.http(),
                request,
                method,
            )?,))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.set-path-with-query",
        |mut cx: Cx<'_>, (request, path): (Resource<wt::OutgoingRequest>, Option<String>)| {
            let state = cx.data_mut();
            state.budget.charge(opt_len(&path))?;
            Ok((HostOutgoingRequest::set_path_with_query(
                &mut state.http(),
                request,
                path,
            )?,))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.set-scheme",
        |mut cx: Cx<'_>, (request, scheme): (Resource<wt::OutgoingRequest>, Option<wt::Scheme>)| {
            let state = cx.data_mut();
            let bytes = match &scheme {
                Some(wt::Scheme::Other(other)) => other.len(),
                _ => 0,
            };
            state.budget.charge(bytes)?;
            Ok((HostOutgoingRequest::set_scheme(
                &mut state.http(),
                request,
                scheme,
            )?,))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.set-authority",
        |mut cx: Cx<'_>, (request, authority): (Resource<wt::OutgoingRequest>, Option<String>)| {
            let state = cx.data_mut();
            state.budget.charge(opt_len(&authority))?;
            Ok((HostOutgoingRequest::set_authority(
                &mut state.http(),
                request,
                authority,
            )?,))
        },
    )?;

    types.func_wrap(
        "[constructor]outgoing-response",
        |mut cx: Cx<'_>, (headers,): (Resource<FieldMap>,)| {
            let state = cx.data_mut();
            state.budget.charge(RESOURCE_BYTES)?;
            Ok((HostOutgoingResponse::new(&mut state.http(), headers)?,))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-response.body",
        |mut cx: Cx<'_>, (response,): (Resource<wt::OutgoingResponse>,)| {
            let state = cx.data_mut();
            state.budget.charge(BODY_BYTES)?;
            Ok((HostOutgoingResponse::body(&mut state.http(), response)?,))
        },
    )?;
    types.func_wrap("[constructor]request-options", |mut cx: Cx<'_>, (): ()| {
        let state = cx.data_mut();
        state.budget.charge(RESOURCE_BYTES)?;
        Ok((HostRequestOptions::new(&mut state.http())?,))
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_up_to_its_limit_then_traps_typed_and_counts_nothing() {
        let mut budget = HostBudget::new(1000);
        budget.charge(600).unwrap();
        budget.charge(400).unwrap();
        let err = budget.charge(1).unwrap_err();
        assert_eq!(
            err.downcast_ref::<LimitExceeded>(),
            Some(&LimitExceeded::HostMemory {
                desired: 1001,
                limit: 1000
            })
        );
        assert!(
            err.to_string().contains("host memory limit exceeded"),
            "{err}"
        );
        assert_eq!(budget.used(), 1000);
        assert!(budget.charge(usize::MAX).is_err());
    }

    #[test]
    fn a_list_longer_than_the_budget_allows_traps_before_an_element_is_read() {
        let mut budget = HostBudget::new(HOST_BYTES);
        budget.charge(100).unwrap();
        let mut read = 0;
        let lengths = std::iter::repeat_with(|| {
            read += 1;
            Ok(1)
        });
        let err = budget
            .charge_listed(
                RESOURCE_BYTES,
                HOST_BYTES / ENTRY_BYTES,
                ENTRY_BYTES,
                lengths,
            )
            .unwrap_err();
        assert!(err.downcast_ref::<LimitExceeded>().is_some(), "{err}");
        assert_eq!(
            read, 0,
            "elements were read before the list's least cost was charged"
        );
        assert_eq!(budget.used(), 100, "a trap counts nothing");
    }

    #[test]
    fn a_listed_charge_stops_at_the_first_element_past_the_limit() {
        let mut budget = HostBudget::new(1000);
        let mut read = 0;
        let lengths = std::iter::repeat_with(|| {
            read += 1;
            Ok(100)
        });
        // 10 + 4 × 10 up front, then 100 per element read: the tenth passes 1000.
        assert!(budget.charge_listed(10, 4, 10, lengths.take(50)).is_err());
        assert_eq!(read, 10);
        assert_eq!(budget.used(), 0);
        let lengths = [Ok(1), Ok(2), Ok(3)];
        budget.charge_listed(10, 3, 10, lengths).unwrap();
        assert_eq!(budget.used(), 10 + 30 + 6);
    }
}
