//! The admin API's wire types: every request and answer body of the admin listener, shared by
//! the server ([`super::handlers`]) and its client (`hookd events | replay | plugins`).
//!
//! Invariants:
//! - These types are the JSON contract (README "HTTP API"); the inbox and registry read models
//!   carry no serde and are converted here, so storage can change without the wire changing.
//! - Fields are declared in the order each route has always sent them (the objects once built
//!   with `json!` sent their keys sorted), so an answer's bytes do not change either.
//! - Delivery states and attempt outcomes travel as their contract names (`as_str`).
//! - The OpenAPI document (`/admin/openapi.json`, [`super::openapi`]) derives its schemas from
//!   these types, so it describes exactly what is sent.

use std::collections::BTreeMap;

use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};

use crate::{inbox, model::DeliveryState, registry::PluginStatus};

/// The schema of a delivery state name (a field typed `String` carrying one): one of
/// [`DeliveryState::ALL`], so the document lists exactly the names the handlers accept.
pub struct StateName;

impl utoipa::PartialSchema for StateName {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(DeliveryState::ALL.map(DeliveryState::as_str)))
            .into()
    }
}

impl ToSchema for StateName {}

/// The body of a refusal: what kind (`forbidden`, `not_found`, ...) and, for some, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub error: String,
}

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Deliveries not yet finished.
    pub backlog: i64,
    pub pooling_allocator: bool,
    /// Always `ok`: a host that answers is up.
    pub status: String,
}

/// `GET /readyz`: whether this node can take webhooks now (its database answers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    /// `ready` (200) or `unready` (503).
    pub status: String,
    /// Why not, when unready: what the database said, or that it did not answer in time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `GET /admin/events` query string.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// A delivery state name; checked by the handler, so a wrong one is answered in JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[param(value_type = Option<StateName>)]
    pub state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// Exactly this provider event id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// Received at or after, in ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<i64>,
    /// Received at or before, in ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<i64>,
    /// The page after this cursor: the `before` of the answer's `Link: <...>; rel="next"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<i64>,
}

impl EventsQuery {
    /// The query's `(key, value)` pairs, in this order, `None` where it does not filter.
    pub fn pairs(self) -> [(&'static str, Option<String>); 9] {
        [
            ("source", self.source),
            ("state", self.state),
            ("handler", self.handler),
            ("limit", self.limit.map(|n| n.to_string())),
            ("event_type", self.event_type),
            ("event_id", self.event_id),
            ("since", self.since.map(|n| n.to_string())),
            ("until", self.until.map(|n| n.to_string())),
            ("before", self.before.map(|n| n.to_string())),
        ]
    }
}

/// One entry of the `GET /admin/events` list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EventSummary {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    /// Ms since the Unix epoch.
    pub received_at: i64,
    /// Handler → delivery state.
    #[schema(value_type = BTreeMap<String, StateName>)]
    pub states: BTreeMap<String, String>,
}

impl From<inbox::EventSummary> for EventSummary {
    fn from(e: inbox::EventSummary) -> Self {
        Self {
            source: e.source,
            event_id: e.event_id,
            event_type: e.event_type,
            received_at: e.received_at,
            states: e.states,
        }
    }
}

/// `GET /admin/events/{source}/{event_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EventDetail {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub ordering_key: Option<String>,
    pub sequence: Option<i64>,
    /// Ms since the Unix epoch.
    pub received_at: i64,
    pub deliveries: Vec<DeliveryDetail>,
    /// When retention pruned the event's payload (ms since the Unix epoch): its headers, body,
    /// outputs, errors and attempt history are gone, its id still dedupes. Absent while kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pruned_at: Option<i64>,
}

impl From<inbox::EventDetail> for EventDetail {
    fn from(e: inbox::EventDetail) -> Self {
        Self {
            source: e.source,
            event_id: e.event_id,
            event_type: e.event_type,
            ordering_key: e.ordering_key,
            sequence: e.sequence,
            received_at: e.received_at,
            deliveries: e.deliveries.into_iter().map(Into::into).collect(),
            pruned_at: e.pruned_at,
        }
    }
}

/// One handler's delivery of an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryDetail {
    pub handler: String,
    /// A delivery state name.
    #[schema(value_type = StateName)]
    pub state: String,
    pub attempts: i64,
    pub output: Option<String>,
    pub last_error: Option<String>,
    /// Ms since the Unix epoch.
    pub next_attempt_at: Option<i64>,
    pub history: Vec<AttemptRecord>,
}

impl From<inbox::DeliveryDetail> for DeliveryDetail {
    fn from(d: inbox::DeliveryDetail) -> Self {
        Self {
            handler: d.handler,
            state: d.state,
            attempts: d.attempts,
            output: d.output,
            last_error: d.last_error,
            next_attempt_at: d.next_attempt_at,
            history: d.history.into_iter().map(Into::into).collect(),
        }
    }
}

/// One attempt of a delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AttemptRecord {
    pub attempt: i64,
    /// Ms since the Unix epoch.
    pub started_at: i64,
    /// Ms since the Unix epoch.
    pub finished_at: i64,
    /// An attempt outcome name.
    pub outcome: String,
    pub error_kind: Option<String>,
    pub error: Option<String>,
    /// The plugin version that ran it.
    pub plugin_sha256: Option<String>,
}

impl From<inbox::AttemptRecord> for AttemptRecord {
    fn from(a: inbox::AttemptRecord) -> Self {
        Self {
            attempt: a.attempt,
            started_at: a.started_at,
            finished_at: a.finished_at,
            outcome: a.outcome,
            error_kind: a.error_kind,
            error: a.error,
            plugin_sha256: a.plugin_sha256,
        }
    }
}

/// `POST /admin/replay` body (optional as a whole: no body or `null`; absent fields do not
/// filter); also the body of `POST /admin/discard`, whose `state` may only be `dead`, or
/// `pending` or `retrying` for a `handler` the configuration no longer declares.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// A handler instance. A replay without one takes the deliveries of every handler the
    /// configuration declares (not those of a removed one: nothing would run them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    /// A delivery state name; `dead` when not given. A replay takes `dead`, `stale`, `done` or
    /// `discarded` (run again with a fresh attempt budget), and `retrying` (run now, instead of
    /// after its backoff, with the budget it has); a discard takes `dead`, and `pending` or `retrying` for a `handler` the
    /// configuration no longer declares.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<StateName>)]
    pub state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_ids: Option<Vec<String>>,
    /// Received at or after, in ms since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<i64>,
    /// Received at or before, in ms since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<i64>,
    /// Only deliveries whose last attempt failed with this `error_kind` (a dead-letter group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub dry_run: bool,
    /// Replay only: deliver each replayed delivery even if a newer sequence of its ordering key
    /// is done by then (the handler gets it with `stale` set) instead of marking it `stale`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub force: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// `POST /admin/replay` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReplayAnswer {
    /// Deliveries and quarantined requests the filter selected.
    pub matched: usize,
    /// How many of them were queued again or left quarantine (0 on a dry run).
    pub replayed: usize,
}

impl From<crate::ingest::replay::ReplayReport> for ReplayAnswer {
    fn from(r: crate::ingest::replay::ReplayReport) -> Self {
        Self {
            matched: r.matched,
            replayed: r.replayed,
        }
    }
}

/// `POST /admin/discard` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DiscardAnswer {
    /// Dead deliveries and held quarantined requests the filter selected.
    pub matched: usize,
    /// How many of them were closed (0 on a dry run).
    pub discarded: usize,
}

impl From<crate::retention::discard::DiscardReport> for DiscardAnswer {
    fn from(r: crate::retention::discard::DiscardReport) -> Self {
        Self {
            matched: r.matched,
            discarded: r.discarded,
        }
    }
}

/// One entry of the `GET /admin/plugins` list: a configured plugin instance and its file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PluginInfo {
    /// Why the file is not (or no longer) what runs, if it is not.
    pub error: Option<String>,
    /// The roles the live version exports (`parser`, `handler`).
    pub exports: Vec<String>,
    /// Ms since the Unix epoch.
    pub loaded_at: Option<i64>,
    /// The `[plugins.<name>]` instance name.
    pub name: String,
    /// sha256 of the versions a rollback can return to, most recent first (in a cluster, the
    /// cluster's history of the file, the same on every node).
    pub previous: Vec<String>,
    /// sha256 of the live version.
    pub sha256: Option<String>,
    /// The file's path.
    pub wasm: String,
    /// The `hookd:plugin` WIT version the live version was built against (`0.1.0`, `0.2.0`,
    /// `0.3.0`).
    #[serde(default)]
    pub wit_version: Option<String>,
    /// The other instances configured with the same file: a new version, or a rollback, of the
    /// file changes them too.
    #[serde(default)]
    pub shared_with: Vec<String>,
    /// Node id → sha256 of the version live on that node (`null`: not loaded there), for every
    /// node alive in the cluster; on SQLite only this node. Differing values are a cluster
    /// caught mid-change (or a node that cannot load the version the others run).
    #[serde(default)]
    pub nodes: BTreeMap<String, Option<String>>,
}

impl PluginInfo {
    /// The instance `name` whose file is at `wasm`, as the registry knows it (`None`: the
    /// registry never tried to load it).
    pub fn new(name: String, wasm: String, file: Option<PluginStatus>) -> Self {
        let Some(file) = file else {
            return Self {
                error: Some("not loaded".to_owned()),
                exports: Vec::new(),
                loaded_at: None,
                name,
                previous: Vec::new(),
                sha256: None,
                wasm,
                wit_version: None,
                shared_with: Vec::new(),
                nodes: BTreeMap::new(),
            };
        };
        Self {
            error: file.error,
            exports: file.exports.into_iter().map(str::to_owned).collect(),
            loaded_at: file.loaded_at,
            name,
            previous: file.previous,
            sha256: file.sha256,
            wasm: file.wasm,
            wit_version: file.wit_version.map(|v| v.as_str().to_owned()),
            shared_with: Vec::new(),
            nodes: BTreeMap::new(),
        }
    }
}

/// `GET /admin/nodes`: one node of the cluster (on SQLite, this process alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeInfo {
    /// Random per start: a restarted node is a new one.
    pub id: String,
    /// Its ingest and admin listeners.
    pub listen: String,
    pub admin_listen: String,
    /// Ms since the Unix epoch.
    pub started_at: i64,
    pub last_heartbeat: i64,
    /// Whether it beat within the last 5 s.
    pub alive: bool,
    /// Attempts running on it; 0 for a node that is not alive (its last beat's figure is
    /// stale: its leases expire and other nodes take the work back).
    pub in_flight: u64,
    /// Plugin file stem → sha256 of the version live on it.
    pub plugins: BTreeMap<String, String>,
    /// Whether this is the node that answered.
    pub this_node: bool,
}

impl NodeInfo {
    /// `beat` as of `now_ms`, seen from node `this`.
    pub fn new(beat: inbox::cluster::NodeBeat, now_ms: i64, this: &str) -> Self {
        let alive = now_ms - beat.at_ms <= crate::cluster::ALIVE_WITHIN_MS;
        Self {
            this_node: beat.id == this,
            alive,
            id: beat.id,
            listen: beat.listen,
            admin_listen: beat.admin_listen,
            started_at: beat.started_at_ms,
            last_heartbeat: beat.at_ms,
            in_flight: if alive { beat.in_flight } else { 0 },
            plugins: beat.live,
        }
    }
}

/// `POST /admin/plugins/{name}/rollback` answer: the version now live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RollbackAnswer {
    pub name: String,
    pub sha256: String,
    /// Every instance the rollback changed: all those configured with `name`'s file (`name`
    /// included), by name.
    #[serde(default)]
    pub instances: Vec<String>,
}

/// `GET /admin/plugins/{name}/state` query string.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StateKeysQuery {
    /// Only keys starting with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// The page after this key: the `next_after` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Keys per page (default 100, at most 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

impl StateKeysQuery {
    /// The query's `(key, value)` pairs, in this order, `None` where it does not filter.
    pub fn pairs(self) -> [(&'static str, Option<String>); 3] {
        [
            ("prefix", self.prefix),
            ("after", self.after),
            ("limit", self.limit.map(|n| n.to_string())),
        ]
    }
}

/// `GET /admin/plugins/{name}/state`: a page of a plugin instance's state keys, in byte order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StateKeys {
    /// The `[plugins.<name>]` instance.
    pub plugin: String,
    pub keys: Vec<StateKey>,
    /// On a full page: the `after` of the next one.
    pub next_after: Option<String>,
}

/// One state key as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StateKey {
    pub key: String,
    /// Bytes of the value.
    pub size: u64,
    /// The version a write must name (`If-Match`).
    pub version: i64,
    /// When it was last written, in ms since the Unix epoch (`null`: before hookd recorded it).
    pub updated_at: Option<i64>,
}

impl From<inbox::StateEntry> for StateKey {
    fn from(e: inbox::StateEntry) -> Self {
        Self {
            key: e.key,
            size: e.size,
            version: e.version,
            updated_at: e.updated_at_ms,
        }
    }
}

/// How a state value travels: `json` (the value is the stored bytes, which are UTF-8 JSON,
/// as that JSON) or `base64` (any other bytes, as a base64 string).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StateEncoding {
    Json,
    Base64,
}

impl StateEncoding {
    /// How `bytes` travel: as their own JSON text if they are UTF-8 JSON (byte for byte), else
    /// as a base64 string. JSON with whitespace around it travels as base64: a JSON value in a
    /// JSON document has none, so it would arrive without it.
    pub fn encode(bytes: &[u8]) -> (Self, Box<RawValue>) {
        let json = std::str::from_utf8(bytes).ok().and_then(|text| {
            RawValue::from_string(text.to_owned())
                .ok()
                .filter(|json| json.get().len() == text.len())
        });
        match json {
            Some(json) => (Self::Json, json),
            None => {
                let text =
                    serde_json::to_string(&BASE64.encode(bytes)).expect("a string serializes");
                let raw = RawValue::from_string(text).expect("a JSON string is JSON");
                (Self::Base64, raw)
            }
        }
    }

    /// The bytes `value` carries in this encoding, or why it carries none.
    pub fn decode(self, value: &RawValue) -> Result<Vec<u8>, String> {
        match self {
            Self::Json => Ok(value.get().as_bytes().to_vec()),
            Self::Base64 => {
                let text: String = serde_json::from_str(value.get())
                    .map_err(|_| "a base64 value must be a JSON string".to_owned())?;
                BASE64
                    .decode(text.trim())
                    .map_err(|e| format!("the value is not base64: {e}"))
            }
        }
    }
}

/// `GET /admin/plugins/{name}/state/{key}` (its `ETag` is the version).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StateValue {
    pub plugin: String,
    pub key: String,
    pub version: i64,
    /// Bytes of the value.
    pub size: u64,
    /// Ms since the Unix epoch (`null`: written before hookd recorded it).
    pub updated_at: Option<i64>,
    pub encoding: StateEncoding,
    /// The stored JSON exactly as stored (`json`), or a base64 string of the bytes (`base64`).
    #[schema(value_type = serde_json::Value)]
    pub value: Box<RawValue>,
}

/// `PUT /admin/plugins/{name}/state/{key}` body: the new value, as [`StateValue`] carries it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatePut {
    pub encoding: StateEncoding,
    /// `json`: stored exactly as sent (its JSON text); `base64`: a string of the bytes to store.
    #[schema(value_type = serde_json::Value)]
    pub value: Box<RawValue>,
}

impl StatePut {
    /// The body that stores exactly `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        let (encoding, value) = StateEncoding::encode(bytes);
        Self { encoding, value }
    }
}

/// `PUT` / `DELETE /admin/plugins/{name}/state/{key}` answer: the key's version now (0 after a
/// delete: absent), also its `ETag`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StateWritten {
    pub plugin: String,
    pub key: String,
    pub version: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node that stopped beating (killed with attempts running) shows none in flight: its
    /// last figure stays in the database, but its work is being taken back by the others.
    #[test]
    fn a_node_that_is_not_alive_has_nothing_in_flight() {
        let beat = |at_ms| inbox::cluster::NodeBeat {
            id: "n1".into(),
            listen: "127.0.0.1:1".into(),
            admin_listen: "127.0.0.1:2".into(),
            started_at_ms: 0,
            at_ms,
            in_flight: 4,
            live: BTreeMap::new(),
        };
        let now = 100_000;
        let fresh = NodeInfo::new(beat(now - 1_000), now, "n2");
        assert_eq!((fresh.alive, fresh.in_flight), (true, 4));
        let silent = NodeInfo::new(beat(now - 60_000), now, "n2");
        assert_eq!((silent.alive, silent.in_flight), (false, 0));
    }
}
