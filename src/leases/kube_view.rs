//! The cluster-backed lease view: a watch cache of identity Leases with a live fallback.
//!
//! - A hit in the synced cache answers without an API call.
//! - A miss (or a cached lease that looks expired) does one live GET with a short deadline,
//!   because a lease created a moment ago may not have reached the watch yet, and a lease is only
//!   judged missing on a NotFound.
//! - Readiness waits for the first full list; if the watch has been broken for longer than
//!   `max_staleness`, the view reports not ready and the staleness metric says how long.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::budget::{
    FoundCache, LookupBudget, NegativeCache, FOUND_CACHE_MAX, FOUND_CACHE_TTL, NEGATIVE_CACHE_MAX,
    NEGATIVE_CACHE_TTL,
};
use super::{could_be_lease_name, LeaseStore, LeaseView, Requester};
use crate::metrics::{Metrics, ResultLabels};
use crate::model::{LeaseLookup, LeaseRecord, IDENTITY_LEASE_NAMESPACE};

/// How long a live lookup may take before it counts as failed (and so never denies).
pub const LIVE_LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

pub struct KubeLeaseView {
    store: LeaseStore,
    metrics: Metrics,
    /// `lease_lookups{result="cache_hit"}`, resolved once: the hot path skips the label lookup.
    cache_hits: prometheus_client::metrics::counter::Counter,
    max_staleness: Duration,
    /// What live lookups may cost, process-wide.
    budget: LookupBudget,
    /// Live NotFounds of the last few seconds.
    missing: NegativeCache,
    /// Leases live lookups found in the last few seconds.
    found: FoundCache,
}

/// Default of `--lease-lookup-rate`: live lease lookups per second, all reviews together.
pub const DEFAULT_LOOKUP_RATE: f64 = 20.0;
/// Default of `--lease-lookup-burst`.
pub const DEFAULT_LOOKUP_BURST: u32 = 40;

impl KubeLeaseView {
    /// A view with its own identity-lease watch (tests, tools). `serve` shares one store with
    /// the collector through [`KubeLeaseView::on_store`].
    pub fn spawn(client: kube::Client, metrics: Metrics, max_staleness: Duration) -> Arc<Self> {
        Self::on_store(LeaseStore::spawn(client), metrics, max_staleness)
    }

    /// A view on `store` (the process's one identity-lease watch); keeps the lease-view gauges
    /// current in the background.
    pub fn on_store(store: LeaseStore, metrics: Metrics, max_staleness: Duration) -> Arc<Self> {
        Self::on_store_with_budget(
            store,
            metrics,
            max_staleness,
            LookupBudget::new(DEFAULT_LOOKUP_RATE, DEFAULT_LOOKUP_BURST),
        )
    }

    /// The same with its own budget of live lookups (`--lease-lookup-rate`, `--lease-lookup-burst`).
    pub fn on_store_with_budget(
        store: LeaseStore,
        metrics: Metrics,
        max_staleness: Duration,
        budget: LookupBudget,
    ) -> Arc<Self> {
        let cache_hits = metrics
            .lease_lookups
            .get_or_create(&ResultLabels {
                result: "cache_hit",
            })
            .clone();
        let view = Arc::new(KubeLeaseView {
            store,
            cache_hits,
            metrics,
            max_staleness,
            budget,
            missing: NegativeCache::new(NEGATIVE_CACHE_TTL, NEGATIVE_CACHE_MAX),
            found: FoundCache::new(FOUND_CACHE_TTL, FOUND_CACHE_MAX),
        });
        tokio::spawn(report_staleness(Arc::downgrade(&view)));
        view
    }

    /// True once the first full list has been seen and the watch is not broken for longer than
    /// the staleness bound (a re-list that keeps failing counts as broken).
    pub fn is_ready(&self) -> bool {
        self.store.is_synced() && self.store.staleness() <= self.max_staleness
    }

    /// Number of identity leases in the cache.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cached lease `id`, once the view has synced. No API call.
    pub fn cached_record(&self, id: &str) -> Option<LeaseRecord> {
        self.store.get(id)
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .lease_lookups
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// The watch has listed and is delivering: what it does not hold, it has not been told of.
    fn watch_is_healthy(&self) -> bool {
        self.store.is_synced() && self.store.staleness().is_zero()
    }

    async fn live(&self, id: &str) -> LeaseLookup {
        let result = tokio::time::timeout(LIVE_LOOKUP_TIMEOUT, self.store.api().get_opt(id)).await;
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
        match &lookup {
            LeaseLookup::NotFound => {
                self.missing.insert(id);
                self.found.forget(id);
            }
            LeaseLookup::Found(record) => {
                self.missing.forget(id);
                self.found.remember(id, record.clone());
            }
            _ => {}
        }
        self.count(label);
        lookup
    }
}

impl LeaseView for KubeLeaseView {
    fn lookup<'a>(&'a self, id: &'a str) -> BoxFuture<'a, LeaseLookup> {
        self.lookup_as(id, Requester::Other)
    }

    /// A hit in the watch cache; else, for requesters other than kube-apiserver, a NotFound of
    /// the last few seconds while the watch is healthy and has no such lease; else a live GET if
    /// the budget allows one, else `Failed` (a warning). Only the live GET waits.
    fn lookup_as<'a>(&'a self, id: &'a str, who: Requester) -> BoxFuture<'a, LeaseLookup> {
        if let Some(answer) = LeaseView::cached(self, id) {
            return Box::pin(std::future::ready(answer));
        }
        // A live lookup found it a moment ago (the watch has not delivered it yet): the same
        // answer, for anyone; a lease found, like a cached one, can only allow.
        if let Some(record) = self.found.get(id).filter(looks_live) {
            self.cache_hits.inc();
            return Box::pin(std::future::ready(LeaseLookup::Found(record)));
        }
        // A miss, or a cached lease that looks dead: ask the API server before judging.
        if who == Requester::Other
            && self.store.get(id).is_none()
            && self.watch_is_healthy()
            && self.missing.is_missing(id)
        {
            self.count("negative_cache_hit");
            return Box::pin(std::future::ready(LeaseLookup::NotFound));
        }
        if !self.budget.try_take(who) {
            self.count("over_budget");
            return Box::pin(std::future::ready(LeaseLookup::Failed(format!(
                "not looked up: live lease lookups are over their budget (--lease-lookup-rate, \
                 --lease-lookup-burst); lease {IDENTITY_LEASE_NAMESPACE}/{id} is not in the watch cache"
            ))));
        }
        Box::pin(self.live(id))
    }

    fn cached(&self, id: &str) -> Option<LeaseLookup> {
        if !could_be_lease_name(id) {
            // No lease can have this name; don't put it in a URL.
            return Some(LeaseLookup::NotFound);
        }
        let record = self.store.get(id).filter(looks_live)?;
        self.cache_hits.inc();
        Some(LeaseLookup::Found(record))
    }
}

/// A cached lease that needs no confirmation: labelled and not past its duration.
fn looks_live(record: &LeaseRecord) -> bool {
    record.is_apiserver()
        && record
            .expiry()
            .is_some_and(|expiry| expiry > k8s_openapi::jiff::Timestamp::now())
}

/// Keeps the staleness gauge current, also when no event arrives, and says once when the watch
/// has been broken for longer than the bound (and once when it recovers).
async fn report_staleness(view: std::sync::Weak<KubeLeaseView>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut was_stale = false;
    loop {
        tick.tick().await;
        let Some(view) = view.upgrade() else { return };
        let stale = view.store.staleness();
        view.metrics
            .lease_view_leases
            .set(i64::try_from(view.store.len()).unwrap_or(i64::MAX));
        view.metrics
            .lease_view_synced
            .set(i64::from(view.store.is_synced()));
        view.metrics
            .lease_view_staleness_seconds
            .set(stale.as_secs_f64());
        let is_stale = stale > view.max_staleness;
        if is_stale && !was_stale {
            tracing::error!(
                stale_seconds = stale.as_secs(),
                "identity lease watch broken (or re-listing without success) for longer than --lease-view-max-staleness; /readyz fails until it recovers"
            );
        } else if !is_stale && was_stale {
            tracing::info!("identity lease watch recovered");
        }
        was_stale = is_stale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher;

    fn detached_store() -> LeaseStore {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        LeaseStore::detached(kube::Client::new(service, "default"))
    }

    /// A view on a detached store that has listed (nothing), with `budget`.
    fn synced_view(budget: LookupBudget) -> (LeaseStore, Arc<KubeLeaseView>) {
        let store = detached_store();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        let view = KubeLeaseView::on_store_with_budget(
            store.clone(),
            metrics,
            Duration::from_secs(60),
            budget,
        );
        store.apply(watcher::Event::Init);
        store.apply(watcher::Event::InitDone);
        (store, view)
    }

    /// A Lease named `name` with the identity label and no renewTime: cached, but it looks
    /// expired, so a lookup must go live.
    fn unrenewed_lease(name: &str) -> k8s_openapi::api::coordination::v1::Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "kube-system",
                         "labels": {crate::model::IDENTITY_LABEL_KEY: crate::model::IDENTITY_LABEL_VALUE}},
            "spec": {},
        }))
        .expect("lease")
    }

    /// The negative cache answers only for other requesters, only when the watch cache has no
    /// lease of that name, and only while the watch is healthy; everything else goes live (the
    /// mock API never answers, so a live lookup is a future that is not ready).
    #[tokio::test]
    async fn a_remembered_not_found_is_used_only_when_it_cannot_hide_a_lease() {
        use futures::FutureExt;
        let (store, view) = synced_view(LookupBudget::new(100.0, 100));
        view.missing.insert("gone");
        view.missing.insert("back");
        assert_eq!(
            view.lookup_as("gone", Requester::Other).now_or_never(),
            Some(LeaseLookup::NotFound)
        );
        assert!(
            view.lookup_as("gone", Requester::ApiServer)
                .now_or_never()
                .is_none(),
            "kube-apiserver's reviews always ask live"
        );
        // The watch has a lease of that name (looking expired): never hidden by the cache.
        store.apply(watcher::Event::Apply(unrenewed_lease("back")));
        assert!(view
            .lookup_as("back", Requester::Other)
            .now_or_never()
            .is_none());
        // A broken watch turns the cache off.
        store.failed(&watcher::Error::NoResourceVersion);
        assert!(view
            .lookup_as("gone", Requester::Other)
            .now_or_never()
            .is_none());
    }

    /// A lease a live lookup found a moment ago answers the next lookups of it at once, without
    /// the budget (kube-apiserver's burst of reviews at its start, before the watch delivers its
    /// new lease); an expired one does not.
    #[tokio::test]
    async fn a_lease_found_live_answers_the_next_lookups_without_the_budget() {
        use futures::FutureExt;
        let (_store, view) = synced_view(LookupBudget::new(0.001, 2));
        let live = crate::model::LeaseRecord::live_apiserver("apiserver-new");
        view.found.remember("apiserver-new", live.clone());
        for _ in 0..100 {
            assert_eq!(
                view.lookup_as("apiserver-new", Requester::ApiServer)
                    .now_or_never(),
                Some(LeaseLookup::Found(live.clone()))
            );
        }
        // An expired record is no answer: the lookup goes live.
        let stale = LeaseRecord::from_lease(&unrenewed_lease("apiserver-old"));
        view.found.remember("apiserver-old", stale);
        assert!(view
            .lookup_as("apiserver-old", Requester::ApiServer)
            .now_or_never()
            .is_none());
    }

    /// Over the budget, a lookup is answered at once with `Failed` (a warning), never waited on.
    #[tokio::test]
    async fn over_the_budget_a_lookup_fails_at_once() {
        use futures::FutureExt;
        let (_store, view) = synced_view(LookupBudget::new(0.001, 4));
        let ids: Vec<String> = (0..3).map(|i| format!("x{i}")).collect();
        let mut live = Vec::new();
        for id in &ids {
            let mut lookup = view.lookup_as(id, Requester::Other);
            assert!((&mut lookup).now_or_never().is_none(), "{id}: live");
            live.push(lookup);
        }
        match view.lookup_as("x9", Requester::Other).now_or_never() {
            Some(LeaseLookup::Failed(why)) => assert!(why.contains("budget"), "{why}"),
            other => panic!("over the budget: {other:?}"),
        }
        assert!(
            view.lookup_as("y", Requester::ApiServer)
                .now_or_never()
                .is_none(),
            "kube-apiserver's share is left"
        );
    }

    /// A re-list that keeps failing makes `/readyz` fail once the staleness bound has passed;
    /// only a re-list that completes makes it ready again (before, every `Init` cleared the
    /// broken mark).
    #[tokio::test(start_paused = true)]
    async fn a_relist_that_keeps_failing_makes_readiness_fail() {
        let store = detached_store();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        let view = KubeLeaseView::on_store(store.clone(), metrics, Duration::from_secs(60));
        assert!(!view.is_ready(), "ready before the first list");
        store.apply(watcher::Event::Init);
        store.apply(watcher::Event::InitDone);
        assert!(view.is_ready());

        store.failed(&watcher::Error::NoResourceVersion);
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(15)).await;
            store.apply(watcher::Event::Init);
            store.failed(&watcher::Error::NoResourceVersion);
        }
        assert!(!view.is_ready(), "a failing re-list must count as broken");

        store.apply(watcher::Event::Init);
        store.apply(watcher::Event::InitDone);
        assert!(view.is_ready());
    }
}
