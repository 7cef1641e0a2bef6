//! The cluster-backed lease view: a watch cache of identity Leases with a live fallback.
//!
//! - A hit in the synced cache answers without an API call.
//! - A miss (or a cached lease that looks expired) does one live GET with a short deadline,
//!   because a lease created a moment ago may not have reached the watch yet, and a lease is only
//!   judged missing on a NotFound.
//! - Readiness waits for the first full list; if the watch has been broken for longer than
//!   `max_staleness`, the view reports not ready and the staleness metric says how long.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};

use super::{LeaseSet, LeaseView};
use crate::metrics::{Metrics, ResultLabels};
use crate::model::{
    LeaseLookup, LeaseRecord, IDENTITY_LABEL_KEY, IDENTITY_LABEL_VALUE, IDENTITY_LEASE_NAMESPACE,
};

/// How long a live lookup may take before it counts as failed (and so never denies).
pub const LIVE_LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

pub struct KubeLeaseView {
    api: Api<Lease>,
    state: RwLock<State>,
    metrics: Metrics,
    max_staleness: Duration,
}

#[derive(Default)]
struct State {
    leases: LeaseSet,
    /// Since when the watch has been failing, if it is.
    broken_since: Option<Instant>,
}

impl KubeLeaseView {
    /// Starts watching identity leases in the background and returns the view.
    pub fn spawn(client: kube::Client, metrics: Metrics, max_staleness: Duration) -> Arc<Self> {
        let view = Arc::new(KubeLeaseView {
            api: Api::namespaced(client, IDENTITY_LEASE_NAMESPACE),
            state: RwLock::new(State::default()),
            metrics,
            max_staleness,
        });
        tokio::spawn(watch(Arc::clone(&view)));
        tokio::spawn(report_staleness(Arc::downgrade(&view)));
        view
    }

    /// True once the first full list has been seen and the watch is not broken for longer than
    /// the staleness bound.
    pub fn is_ready(&self) -> bool {
        let state = self.read_state();
        state.leases.is_synced() && staleness(&state) <= self.max_staleness
    }

    /// Number of identity leases in the cache.
    pub fn len(&self) -> usize {
        self.read_state().leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A panic while holding the lock cannot leave the map half-written in a way that matters
        // here; keep serving from it.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_state(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    fn apply(&self, event: watcher::Event<Lease>) {
        let mut state = self.write_state();
        state.broken_since = None;
        let was_synced = state.leases.is_synced();
        state.leases.apply(event);
        if !was_synced && state.leases.is_synced() {
            tracing::info!(leases = state.leases.len(), "lease view synced");
        }
        self.metrics
            .lease_view_leases
            .set(state.leases.len() as i64);
        self.metrics
            .lease_view_synced
            .set(i64::from(state.leases.is_synced()));
    }

    fn watch_failed(&self, error: &watcher::Error) {
        let mut state = self.write_state();
        if state.broken_since.is_none() {
            state.broken_since = Some(Instant::now());
        }
        tracing::warn!(%error, "identity lease watch failed; retrying with backoff");
    }

    /// The cached lease `id`, once the view has synced. No API call.
    pub fn cached(&self, id: &str) -> Option<LeaseRecord> {
        let state = self.read_state();
        if !state.leases.is_synced() {
            return None;
        }
        state.leases.get(id).cloned()
    }

    async fn live(&self, id: &str) -> LeaseLookup {
        let result = tokio::time::timeout(LIVE_LOOKUP_TIMEOUT, self.api.get_opt(id)).await;
        let (lookup, label) = match result {
            Ok(Ok(Some(lease))) => (LeaseLookup::Found(LeaseRecord::from_lease(&lease)), "live_found"),
            Ok(Ok(None)) => (LeaseLookup::NotFound, "live_not_found"),
            Ok(Err(e)) => (
                LeaseLookup::Failed(format!("GET lease {IDENTITY_LEASE_NAMESPACE}/{id}: {e}")),
                "error",
            ),
            Err(_) => (
                LeaseLookup::Failed(format!(
                    "GET lease {IDENTITY_LEASE_NAMESPACE}/{id} took longer than {LIVE_LOOKUP_TIMEOUT:?}"
                )),
                "error",
            ),
        };
        self.metrics
            .lease_lookups
            .get_or_create(&ResultLabels { result: label })
            .inc();
        lookup
    }
}

impl LeaseView for KubeLeaseView {
    fn lookup<'a>(&'a self, id: &'a str) -> BoxFuture<'a, LeaseLookup> {
        Box::pin(async move {
            if !could_be_lease_name(id) {
                // No lease can have this name; don't put it in a URL.
                return LeaseLookup::NotFound;
            }
            match self.cached(id) {
                Some(record) if looks_live(&record) => {
                    self.metrics
                        .lease_lookups
                        .get_or_create(&ResultLabels {
                            result: "cache_hit",
                        })
                        .inc();
                    LeaseLookup::Found(record)
                }
                // A miss, or a cached lease that looks dead: ask the API server before judging.
                _ => self.live(id).await,
            }
        })
    }
}

/// A cached lease that needs no confirmation: labelled and not past its duration.
fn looks_live(record: &LeaseRecord) -> bool {
    let (Some(renew), Some(duration)) = (record.renew_time, record.lease_duration_seconds) else {
        return false;
    };
    record.identity_label.as_deref() == Some(IDENTITY_LABEL_VALUE)
        && renew
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(i64::from(
                duration,
            )))
            .is_ok_and(|expiry| expiry > Timestamp::now())
}

/// Lease names are DNS-1123 subdomains: anything else cannot exist.
use crate::rules::names::is_dns1123_subdomain as could_be_lease_name;

fn staleness(state: &State) -> Duration {
    state.broken_since.map(|t| t.elapsed()).unwrap_or_default()
}

async fn watch(view: Arc<KubeLeaseView>) {
    let config =
        watcher::Config::default().labels(&format!("{IDENTITY_LABEL_KEY}={IDENTITY_LABEL_VALUE}"));
    let mut events = std::pin::pin!(watcher(view.api.clone(), config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => view.apply(event),
            Err(error) => view.watch_failed(&error),
        }
    }
}

/// Keeps the staleness gauge current, also when no event arrives, and says once when the watch
/// has been broken for longer than the bound (and once when it recovers).
async fn report_staleness(view: std::sync::Weak<KubeLeaseView>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut was_stale = false;
    loop {
        tick.tick().await;
        let Some(view) = view.upgrade() else { return };
        let stale = staleness(&view.read_state());
        view.metrics
            .lease_view_staleness_seconds
            .set(stale.as_secs_f64());
        let is_stale = stale > view.max_staleness;
        if is_stale && !was_stale {
            tracing::error!(
                stale_seconds = stale.as_secs(),
                "identity lease watch broken for longer than --lease-view-max-staleness; /readyz fails until it recovers"
            );
        } else if !is_stale && was_stale {
            tracing::info!("identity lease watch recovered");
        }
        was_stale = is_stale;
    }
}
