//! The one identity-lease store of a process: one watch of `kube-system` Leases labelled
//! `apiserver.kubernetes.io/identity=kube-apiserver`, folded into a [`LeaseSet`] of
//! [`LeaseRecord`]s (name, label, renewTime, duration: nothing else is kept), shared by the lease
//! view (admission) and the garbage collector.
//!
//! - Readers take a snapshot of one lease ([`LeaseStore::get`]) or run a closure over the whole
//!   set ([`LeaseStore::read`]); no API call.
//! - Subscribers ([`LeaseStore::subscribe`]) get every change (deletions, leases gone at a
//!   relist, watch errors), e.g. the collector while it leads.
//! - [`WatchHealth`] says how long the store has been stale: a watch error marks it broken, and
//!   only a re-list that really completes (or a watch that delivers again) clears the mark. An
//!   `Init` event alone (a re-list that starts, and may fail) clears nothing.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use std::borrow::Cow;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use super::{LeaseChange, LeaseSet};
use crate::model::{
    LeaseRecord, IDENTITY_LABEL_KEY, IDENTITY_LABEL_VALUE, IDENTITY_LEASE_NAMESPACE,
};

/// Changes a slow subscriber may fall behind by before it is told it lagged (and re-reads the
/// whole store instead).
const CHANGES_BUFFER: usize = 1024;

/// A watch that has reported no error for this long (and is not re-listing) is up again, even if
/// nothing changed since. Longer than kube-runtime's longest default watch backoff (30 s), so a
/// watch that keeps failing never looks up in between two attempts.
pub const QUIET_AFTER_ERROR: Duration = Duration::from_secs(35);

/// What subscribers hear.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreEvent {
    Changed(Arc<LeaseChange>),
    /// The watch failed (it retries with backoff).
    WatchFailed(String),
}

/// How fresh the store is.
#[derive(Clone, Debug, Default)]
pub struct WatchHealth {
    /// Since when the watch has been failing, if it is.
    broken_since: Option<Instant>,
    last_error: Option<Instant>,
    /// An `Init` was seen and its `InitDone` not yet.
    relisting: bool,
}

impl WatchHealth {
    pub fn on_event(&mut self, event: &watcher::Event<Lease>) {
        match event {
            watcher::Event::Init => self.relisting = true,
            watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => {
                self.relisting = false;
                self.clear();
            }
            // The watch delivers: it works.
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => {
                if !self.relisting {
                    self.clear();
                }
            }
        }
    }

    pub fn on_error(&mut self, now: Instant) {
        self.broken_since.get_or_insert(now);
        self.last_error = Some(now);
    }

    fn clear(&mut self) {
        self.broken_since = None;
        self.last_error = None;
    }

    /// How long the store has been stale at `now` (zero when the watch is up).
    pub fn staleness(&self, now: Instant) -> Duration {
        let Some(since) = self.broken_since else {
            return Duration::ZERO;
        };
        let quiet = self
            .last_error
            .is_some_and(|e| now.saturating_duration_since(e) >= QUIET_AFTER_ERROR);
        if quiet && !self.relisting {
            // Resumed without a re-list (kube-runtime re-watches from the last resourceVersion
            // after a transient error) and failing no more.
            return Duration::ZERO;
        }
        now.saturating_duration_since(since)
    }
}

#[derive(Default)]
struct State {
    leases: LeaseSet,
    health: WatchHealth,
}

/// A cheap handle on the process's identity-lease store.
#[derive(Clone)]
pub struct LeaseStore {
    inner: Arc<Inner>,
}

struct Inner {
    api: Api<Lease>,
    state: RwLock<State>,
    changes: broadcast::Sender<StoreEvent>,
    synced: watch::Sender<bool>,
}

impl LeaseStore {
    /// Starts the one watch in the background (until every handle is dropped).
    pub fn spawn(client: kube::Client) -> LeaseStore {
        let store = LeaseStore::new(Api::namespaced(client.clone(), IDENTITY_LEASE_NAMESPACE));
        let watched = Api::namespaced(client, IDENTITY_LEASE_NAMESPACE);
        tokio::spawn(run(Arc::downgrade(&store.inner), watched));
        store
    }

    fn new(api: Api<Lease>) -> LeaseStore {
        LeaseStore {
            inner: Arc::new(Inner {
                api,
                state: RwLock::new(State::default()),
                changes: broadcast::channel(CHANGES_BUFFER).0,
                synced: watch::channel(false).0,
            }),
        }
    }

    /// The Lease API the store watches (for live GETs).
    pub fn api(&self) -> &Api<Lease> {
        &self.inner.api
    }

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A panic while holding the lock cannot leave the map half-written in a way that
        // matters here; keep serving from it.
        self.inner.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// True once a full list has completed.
    pub fn is_synced(&self) -> bool {
        self.read_state().leases.is_synced()
    }

    /// Waits until the first full list has completed.
    pub async fn synced(&self) {
        let mut rx = self.inner.synced.subscribe();
        // The sender lives as long as `self`, so this only ends when synced.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The lease `name`, once synced (None before, or when absent).
    pub fn get(&self, name: &str) -> Option<LeaseRecord> {
        let state = self.read_state();
        if !state.leases.is_synced() {
            return None;
        }
        state.leases.get(name).cloned()
    }

    /// Runs `f` over the whole set (held under a read lock: keep `f` short and without I/O).
    pub fn read<T>(&self, f: impl FnOnce(&LeaseSet) -> T) -> T {
        f(&self.read_state().leases)
    }

    pub fn len(&self) -> usize {
        self.read_state().leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How long the store has been stale (zero while its watch is up).
    pub fn staleness(&self) -> Duration {
        self.read_state().health.staleness(Instant::now())
    }

    /// Every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        self.inner.changes.subscribe()
    }

    /// Folds one watcher event in (also used by tests to drive the store without a cluster).
    pub fn apply(&self, event: watcher::Event<Lease>) {
        let change = {
            let mut state = self.inner.state.write().unwrap_or_else(|e| e.into_inner());
            state.health.on_event(&event);
            let was_synced = state.leases.is_synced();
            let change = state.leases.apply(event);
            if !was_synced && state.leases.is_synced() {
                tracing::info!(leases = state.leases.len(), "identity lease store synced");
                self.inner.synced.send_replace(true);
            }
            change
        };
        if change != LeaseChange::None {
            let _ = self
                .inner
                .changes
                .send(StoreEvent::Changed(Arc::new(change)));
        }
    }

    /// Records a watch error.
    pub fn failed(&self, error: &watcher::Error) {
        self.inner
            .state
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .health
            .on_error(Instant::now());
        tracing::warn!(%error, "identity lease watch failed; retrying with backoff");
        let _ = self
            .inner
            .changes
            .send(StoreEvent::WatchFailed(error.to_string()));
    }

    /// A store fed by hand (tests): never watches.
    pub fn detached(client: kube::Client) -> LeaseStore {
        LeaseStore::new(Api::namespaced(client, IDENTITY_LEASE_NAMESPACE))
    }
}

/// A Lease as the watch decodes it: of `metadata` only what [`crate::metadata::kept`] keeps
/// (no `managedFields` trees are built), the spec as it is.
#[derive(Clone, Debug, serde::Deserialize)]
struct WatchedLease {
    #[serde(default, deserialize_with = "crate::metadata::kept")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<LeaseSpec>,
}

impl kube::Resource for WatchedLease {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        <Lease as kube::Resource>::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        <Lease as kube::Resource>::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        <Lease as kube::Resource>::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        <Lease as kube::Resource>::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl From<WatchedLease> for Lease {
    fn from(w: WatchedLease) -> Lease {
        Lease {
            metadata: w.metadata,
            spec: w.spec,
        }
    }
}

fn to_lease_event(e: watcher::Event<WatchedLease>) -> watcher::Event<Lease> {
    match e {
        watcher::Event::Apply(l) => watcher::Event::Apply(l.into()),
        watcher::Event::Delete(l) => watcher::Event::Delete(l.into()),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(l) => watcher::Event::InitApply(l.into()),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// The watch: a paginated list (kube-runtime lists in pages of 500), then watch events; ends
/// when every handle is gone.
async fn run(store: std::sync::Weak<Inner>, watched: Api<WatchedLease>) {
    let config =
        watcher::Config::default().labels(&format!("{IDENTITY_LABEL_KEY}={IDENTITY_LABEL_VALUE}"));
    let mut events = std::pin::pin!(watcher(watched, config).default_backoff());
    while let Some(event) = events.next().await {
        let Some(inner) = store.upgrade() else { return };
        let store = LeaseStore { inner };
        match event.map(to_lease_event) {
            Ok(event) => {
                let listed = matches!(event, watcher::Event::InitDone);
                store.apply(event);
                if listed {
                    // The list's pages are decoded and dropped: hand their memory back.
                    crate::memory::release_free();
                }
            }
            Err(error) => store.failed(&error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some(name.to_string());
        l
    }

    /// A re-list that keeps failing leaves the store broken, however many `Init`s it starts
    /// (before, every `Init` cleared the mark and readiness never failed).
    #[tokio::test(start_paused = true)]
    async fn broken_until_a_relist_completes() {
        let mut h = WatchHealth::default();
        h.on_event(&watcher::Event::Init);
        h.on_event(&watcher::Event::InitApply(lease("a")));
        h.on_event(&watcher::Event::InitDone);
        assert_eq!(h.staleness(Instant::now()), Duration::ZERO);

        h.on_error(Instant::now());
        for _ in 0..10 {
            tokio::time::advance(Duration::from_secs(20)).await;
            // The watcher starts a re-list ... which fails again.
            h.on_event(&watcher::Event::Init);
            h.on_event(&watcher::Event::InitApply(lease("a")));
            tokio::time::advance(Duration::from_secs(1)).await;
            h.on_error(Instant::now());
        }
        assert!(h.staleness(Instant::now()) >= Duration::from_secs(200));
        // Quiet for long, but still re-listing: still broken.
        tokio::time::advance(QUIET_AFTER_ERROR * 2).await;
        assert!(h.staleness(Instant::now()) >= Duration::from_secs(270));

        h.on_event(&watcher::Event::Init);
        h.on_event(&watcher::Event::InitApply(lease("a")));
        assert!(h.staleness(Instant::now()) > Duration::ZERO);
        h.on_event(&watcher::Event::InitDone);
        assert_eq!(h.staleness(Instant::now()), Duration::ZERO);
    }

    /// A watch that fails and resumes without a re-list counts as up once it has been quiet for
    /// longer than the watcher's longest backoff, or at once when it delivers an event.
    #[tokio::test(start_paused = true)]
    async fn resumed_watch_recovers() {
        let mut h = WatchHealth::default();
        h.on_event(&watcher::Event::Init);
        h.on_event(&watcher::Event::InitDone);
        h.on_error(Instant::now());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(h.staleness(Instant::now()), Duration::from_secs(10));
        tokio::time::advance(QUIET_AFTER_ERROR).await;
        assert_eq!(h.staleness(Instant::now()), Duration::ZERO);

        h.on_error(Instant::now());
        tokio::time::advance(Duration::from_secs(3)).await;
        h.on_event(&watcher::Event::Apply(lease("b")));
        assert_eq!(h.staleness(Instant::now()), Duration::ZERO);
    }
}
