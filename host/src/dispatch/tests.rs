//! Dispatch schedules against a real inbox on a temp file, with [`Clock::tokio`] under tokio's
//! paused clock: a lease or a backoff passes as soon as the test waits for it, never for real.
//!
//! Invariant: no test here loads a plugin, so none needs a compiled component; each drives the
//! dispatcher's own clock-dependent steps (lease length, reclaim, the producer loop).

use std::{collections::HashMap, sync::Arc, time::Duration};

use bytes::Bytes;
use http::HeaderMap;
use tempfile::TempDir;

use super::Dispatcher;
use crate::{
    clock::Clock,
    config::Config,
    dispatch::fair::Fairness,
    ids::{EventId, PluginName, SourceName},
    inbox::{ClaimRequest, Claimed, Inbox, OpenOptions, RawRequest},
    model::Envelope,
    registry::Registry,
    runtime::{Compiler, Runtime},
    telemetry::Telemetry,
    verify::{Scheme, Verifier},
};

/// A dispatcher for one source `s` whose handler `h` has the `[plugins.h]` settings given.
struct Fixture {
    dispatcher: Arc<Dispatcher>,
    inbox: Inbox,
    clock: Clock,
    _dir: TempDir,
}

impl Fixture {
    fn new(plugin_h: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let text =
            format!("[sources.s]\nscheme = \"none\"\nhandlers = [\"h\"]\n[plugins.h]\n{plugin_h}");
        let config = Arc::new(Config::parse(&text, dir.path(), &|_| None).unwrap());
        let clock = Clock::tokio();
        let inbox = Inbox::open_with(
            config.server.database.sqlite_path().unwrap(),
            OpenOptions::new(&config.server, clock.clone()),
        )
        .unwrap();
        let runtime = Runtime::new().unwrap();
        let compiler = Compiler::missing();
        let registry = Arc::new(Registry::new(
            runtime.clone(),
            dir.path().join("plugins"),
            config.file_needs(),
            None,
            compiler,
            Telemetry::new(clock.clone()),
        ));
        let dispatcher = Dispatcher::new(
            config,
            inbox.clone(),
            registry,
            runtime,
            clock.clone(),
            Telemetry::new(clock.clone()),
        );
        Self {
            dispatcher,
            inbox,
            clock,
            _dir: dir,
        }
    }

    /// Stores event `id` with one delivery to `h`, received now.
    async fn arrive(&self, id: &str) {
        let verified = Verifier::new(Scheme::None, Vec::new(), Duration::ZERO)
            .unwrap()
            .verify(HeaderMap::new(), Bytes::new(), self.clock.now())
            .unwrap();
        let envelope = Envelope {
            event_id: EventId::new(id),
            event_type: "t".into(),
            ordering_key: None,
            sequence: None,
        };
        self.inbox
            .accept(
                SourceName::new("s"),
                envelope,
                RawRequest::from_verified(verified, self.clock.now_ms()),
                vec![PluginName::new("h")],
                None,
            )
            .await
            .unwrap();
    }

    /// Leases what is due for `h` now, with the dispatcher's lease lengths.
    async fn claim(&self) -> Vec<Claimed> {
        self.inbox
            .claim(ClaimRequest {
                caps: Default::default(),
                now_ms: self.clock.now_ms(),
                limit: 1,
                capacity: HashMap::from([("h".to_string(), 1)]),
                lease_ms: self.dispatcher.lease_ms(),
                fairness: Fairness::default(),
                deliver_stale: self.dispatcher.deliver_stale(),
            })
            .await
            .unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn a_lease_is_not_taken_back_before_the_plugins_timeout_and_margin() {
    let fixture = Fixture::new("timeout_ms = 2000");
    fixture.arrive("e").await;
    assert_eq!(fixture.claim().await.len(), 1);
    // 2 s of timeout + 10 s of margin, less a little.
    tokio::time::sleep(Duration::from_millis(11_900)).await;
    assert_eq!(fixture.dispatcher.reclaim_expired().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_lease_is_taken_back_once_the_plugins_timeout_and_margin_have_passed() {
    let fixture = Fixture::new("timeout_ms = 2000");
    fixture.arrive("e").await;
    assert_eq!(fixture.claim().await.len(), 1);
    tokio::time::sleep(Duration::from_millis(12_100)).await;
    assert_eq!(fixture.dispatcher.reclaim_expired().await.unwrap(), 1);
}

/// A delivery whose worker vanished is retried after the first backoff (with equal jitter:
/// between half the base and the base), not before.
#[tokio::test(start_paused = true)]
async fn a_reclaimed_delivery_is_not_due_before_half_its_backoff() {
    let fixture = Fixture::new("backoff_base_ms = 4000");
    fixture.arrive("e").await;
    assert_eq!(fixture.claim().await.len(), 1);
    assert_eq!(
        fixture.dispatcher.reclaim_all_at_startup().await.unwrap(),
        1
    );
    tokio::time::sleep(Duration::from_millis(1_900)).await;
    assert!(fixture.claim().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_reclaimed_delivery_is_due_again_once_its_backoff_has_passed() {
    let fixture = Fixture::new("backoff_base_ms = 4000");
    fixture.arrive("e").await;
    assert_eq!(fixture.claim().await.len(), 1);
    assert_eq!(
        fixture.dispatcher.reclaim_all_at_startup().await.unwrap(),
        1
    );
    tokio::time::sleep(Duration::from_millis(4_100)).await;
    let retried = fixture.claim().await;
    assert_eq!(retried.iter().map(|c| c.attempt).collect::<Vec<_>>(), [2]);
}

/// Seconds of the producer loop (many idle rounds and reclaim passes) leave a delivery whose
/// plugin is not loaded untouched: its first lease is still the test's.
#[tokio::test(start_paused = true)]
async fn the_producer_never_claims_for_a_plugin_that_is_not_loaded() {
    let fixture = Fixture::new("");
    fixture.arrive("e").await;
    fixture
        .dispatcher
        .clone()
        .run(
            tokio::runtime::Handle::current(),
            tokio::time::sleep(Duration::from_secs(5)),
        )
        .await;
    let claimed = fixture.claim().await;
    assert_eq!(claimed.iter().map(|c| c.attempt).collect::<Vec<_>>(), [1]);
}
