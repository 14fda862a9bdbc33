//! What nodes sharing one database tell each other through it: who is up (a heartbeat per
//! node) and which version of each plugin file is the cluster's (releases, content-addressed
//! by sha256).
//!
//! Invariants (each implementation keeps them):
//! - A plugin's bytes are stored once per sha256 and never change; a release names a sha256
//!   whose bytes are stored.
//! - A release's `version` grows with every change of the cluster's choice, so a node can tell
//!   a new choice from the one it has acted on.
//! - A heartbeat replaces the node's previous one: one row per node.
//! - A release's history (`previous`) changes only with the release, in the same transaction:
//!   every node reads the same one.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::InboxError;

/// One node's heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBeat {
    pub id: String,
    /// Where its ingest and admin listeners are bound.
    pub listen: String,
    pub admin_listen: String,
    pub started_at_ms: i64,
    pub at_ms: i64,
    /// Attempts running on it now.
    pub in_flight: u64,
    /// Plugin file stem → sha256 of the version live on it.
    pub live: BTreeMap<String, String>,
}

/// The cluster's version of one plugin file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub stem: String,
    pub sha256: String,
    /// Grows with every change of the release.
    pub version: i64,
    /// The node that published it.
    pub node: String,
    /// The cluster's earlier versions of the file, newest first (at most
    /// [`PREVIOUS_KEPT`]): a new version pushes the one it replaces; the newest earlier one
    /// coming back (a rollback) is a step back, which drops the version it replaces.
    pub previous: Vec<String>,
}

/// Earlier versions a release keeps.
pub const PREVIOUS_KEPT: usize = 5;

/// The storage a cluster of nodes coordinates through.
#[async_trait::async_trait]
pub trait ClusterStore: Send + Sync + 'static {
    /// Records `beat` as its node's latest, and forgets nodes silent since before
    /// `forget_before_ms`.
    async fn heartbeat(&self, beat: NodeBeat, forget_before_ms: i64) -> Result<(), InboxError>;

    /// Every node's latest heartbeat, oldest start first.
    async fn nodes(&self) -> Result<Vec<NodeBeat>, InboxError>;

    /// Forgets node `id`, stopping (a node's id is new at each start: a row left behind would
    /// be listed as a node not alive for a day).
    async fn leave(&self, id: &str) -> Result<(), InboxError>;

    /// A reading of the database server's clock, the one clock every node follows: the best
    /// (shortest round trip) of `tries` (at least one), timed on a connection already held.
    async fn database_clock(&self, tries: usize) -> Result<crate::clock::Reading, InboxError>;

    /// Makes `sha256` the cluster's version of `stem`, storing `bytes` under it first when given
    /// (a version already stored, as for a rollback, needs none). Returns the new release, or
    /// the current one unchanged if it already names `sha256`. Refused if the bytes are
    /// neither given nor stored.
    async fn publish(
        &self,
        stem: &str,
        sha256: &str,
        bytes: Option<Bytes>,
        node: &str,
    ) -> Result<Release, InboxError>;

    /// A rollback: makes `to` the cluster's version of `stem` as a step back, only if the
    /// release is still `from` with `to` the newest of its history (what the rollback read);
    /// `None`, changing nothing, if another node published or rolled back since. (`to`'s bytes
    /// are stored: the caller checked.)
    async fn roll_back(
        &self,
        stem: &str,
        from: &str,
        to: &str,
        node: &str,
    ) -> Result<Option<Release>, InboxError>;

    /// Every plugin file's release.
    async fn releases(&self) -> Result<Vec<Release>, InboxError>;

    /// The stored bytes of version `sha256`, if any.
    async fn plugin_bytes(&self, sha256: &str) -> Result<Option<Bytes>, InboxError>;
}
