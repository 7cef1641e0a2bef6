//! The collector's work while this replica leads (one *term*): watches, queue, sweeps, writes.
//!
//! Data flows one way: lease and StorageVersion events (and sweeps) decide *which* objects to
//! look at; [`Term::process`] reads each one live, judges its entries' leases with live GETs,
//! asks the pure [`plan`](super::plan) what to do, re-checks the leases it is about to remove,
//! and writes. Everything stops when the term's token is cancelled.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::metrics::{GcMetrics, ReasonLabels, ResultLabels};
use super::plan::{self, LeaseState, Plan, Reason, Removal};
use crate::leases::{LeaseChange, LeaseSet};
use crate::model::{
    LeaseLookup, LeaseRecord, StorageVersion, API_VERSION, IDENTITY_LABEL_KEY,
    IDENTITY_LABEL_VALUE, IDENTITY_LEASE_NAMESPACE, KIND,
};

/// Settings of the collector (from [`super::GcArgs`]).
#[derive(Clone, Debug)]
pub struct CollectorConfig {
    pub deletion_grace: Duration,
    pub resync_interval: Duration,
    pub concurrency: usize,
    pub expired_grace: Option<Duration>,
    pub dry_run: bool,
}

/// How long one API call may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Conflicts retried at once (with backoff) before the object is requeued.
const MAX_CONFLICT_RETRIES: u32 = 6;
const MIN_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// How long a sweep waits for the lease watch to list before it goes ahead anyway.
const SYNC_WAIT: Duration = Duration::from_secs(30);
/// Longest an Event note may be (the API allows 1 kB).
const MAX_NOTE: usize = 1000;

/// Long-lived pieces shared by every term.
pub struct Collector {
    svs: Api<StorageVersion>,
    leases: Api<Lease>,
    cfg: CollectorConfig,
    metrics: GcMetrics,
    recorder: Recorder,
}

impl Collector {
    pub fn new(
        client: kube::Client,
        cfg: CollectorConfig,
        metrics: GcMetrics,
        identity: &str,
    ) -> Collector {
        let recorder = Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "storageversion-webhook-gc".to_string(),
                instance: Some(identity.to_string()),
            },
        );
        Collector {
            svs: Api::all(client.clone()),
            leases: Api::namespaced(client, IDENTITY_LEASE_NAMESPACE),
            cfg,
            metrics,
            recorder,
        }
    }

    /// One term of leadership: runs until `token` is cancelled, then waits for its tasks.
    pub async fn lead(self: Arc<Self>, token: CancellationToken) {
        let (tx, rx) = mpsc::unbounded_channel();
        let term = Arc::new(Term {
            c: Arc::clone(&self),
            token: token.clone(),
            tasks: TaskTracker::new(),
            absent_since: Mutex::new(HashMap::new()),
            cache: Mutex::new(LeaseSet::default()),
            synced: Notify::new(),
            queued: Mutex::new(HashSet::new()),
            queue: tx,
            workers: Semaphore::new(self.cfg.concurrency.max(1)),
            locks: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            expiry_handled: Mutex::new(HashSet::new()),
        });
        term.tasks.spawn(Arc::clone(&term).watch_leases());
        term.tasks.spawn(Arc::clone(&term).watch_storage_versions());
        term.tasks.spawn(Arc::clone(&term).sweeper());
        term.tasks.spawn(Arc::clone(&term).worker(rx));
        if self.cfg.expired_grace.is_some() {
            term.tasks.spawn(Arc::clone(&term).expiry_scanner());
        }
        token.cancelled().await;
        term.tasks.close();
        term.tasks.wait().await;
    }
}

/// What one term knows and runs.
struct Term {
    c: Arc<Collector>,
    token: CancellationToken,
    tasks: TaskTracker,
    /// apiServerID → when its lease was first seen absent (or unlabelled) in this term.
    absent_since: Mutex<HashMap<String, Instant>>,
    /// Identity leases from the watch: only decides which objects to look at, never what to
    /// remove (that takes live GETs).
    cache: Mutex<LeaseSet>,
    synced: Notify,
    queued: Mutex<HashSet<String>>,
    queue: mpsc::UnboundedSender<String>,
    workers: Semaphore,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    failures: Mutex<HashMap<String, u32>>,
    expiry_handled: Mutex<HashSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lease names are DNS-1123 subdomains; anything else cannot exist (and is not put in a URL).
use crate::rules::names::is_dns1123_subdomain as could_be_lease_name;

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The outcome of one check of one StorageVersion.
enum Outcome {
    Done,
    /// Check again after this long.
    RetryIn(Duration),
    /// Check again at this instant (an absent lease's grace runs out).
    RetryAt(Instant),
    Cancelled,
}

impl Term {
    /// Runs `fut` unless the term ends first (then `None`).
    async fn cancellable<F: std::future::Future>(&self, fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            _ = self.token.cancelled() => None,
            out = fut => Some(out),
        }
    }

    /// An API call bounded by [`CALL_TIMEOUT`] and the term.
    async fn call<T, F>(&self, what: &str, fut: F) -> Option<Result<T, kube::Error>>
    where
        F: std::future::Future<Output = Result<T, kube::Error>>,
    {
        match self
            .cancellable(tokio::time::timeout(CALL_TIMEOUT, fut))
            .await?
        {
            Ok(r) => Some(r),
            Err(_) => Some(Err(kube::Error::Service(
                format!("{what} took longer than {CALL_TIMEOUT:?}").into(),
            ))),
        }
    }

    fn spawn_after(self: &Arc<Self>, delay: Duration, f: impl FnOnce(Arc<Term>) + Send + 'static) {
        let term = Arc::clone(self);
        self.tasks.spawn(async move {
            if term.cancellable(tokio::time::sleep(delay)).await.is_some() {
                f(term);
            }
        });
    }

    // ------------------------------------------------------------------ queue --

    fn enqueue(&self, name: &str) {
        if lock(&self.queued).insert(name.to_string()) {
            let _ = self.queue.send(name.to_string());
        }
    }

    fn enqueue_after(self: &Arc<Self>, name: String, delay: Duration) {
        self.spawn_after(delay, move |t| t.enqueue(&name));
    }

    async fn worker(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<String>) {
        while let Some(Some(name)) = self.cancellable(rx.recv()).await {
            lock(&self.queued).remove(&name);
            let term = Arc::clone(&self);
            self.tasks.spawn(async move { term.check(name).await });
        }
    }

    /// Checks one object and schedules a retry if it asks for one.
    async fn check(self: Arc<Self>, name: String) {
        let outcome = self.process(&name).await;
        match outcome {
            Outcome::Done | Outcome::Cancelled => {
                lock(&self.failures).remove(&name);
            }
            Outcome::RetryAt(at) => {
                let delay = at.saturating_duration_since(Instant::now());
                self.enqueue_after(name, delay + Duration::from_millis(50));
            }
            Outcome::RetryIn(min) => {
                let n = {
                    let mut f = lock(&self.failures);
                    let n = f.entry(name.clone()).or_insert(0);
                    *n = n.saturating_add(1);
                    *n
                };
                let delay = backoff(n).max(min);
                self.enqueue_after(name, delay);
            }
        }
    }

    // ---------------------------------------------------------------- leases --

    async fn watch_leases(self: Arc<Self>) {
        let config = watcher::Config::default()
            .labels(&format!("{IDENTITY_LABEL_KEY}={IDENTITY_LABEL_VALUE}"));
        let mut events = std::pin::pin!(watcher(self.c.leases.clone(), config).default_backoff());
        while let Some(Some(event)) = self.cancellable(events.next()).await {
            match event {
                Ok(event) => self.lease_event(event),
                Err(e) => {
                    self.c.metrics.error("watch_leases");
                    tracing::warn!(error = %e, "identity lease watch failed; retrying");
                }
            }
        }
    }

    fn lease_event(self: &Arc<Self>, event: watcher::Event<Lease>) {
        let change = lock(&self.cache).apply(event);
        match change {
            LeaseChange::None => {}
            LeaseChange::Listed { vanished } => {
                let present: Vec<String> = lock(&self.cache).names().map(String::from).collect();
                self.c.metrics.lease_event("listed");
                for name in present {
                    self.lease_present(&name);
                }
                // Deleted while the watch was down: upstream's tombstone case.
                for name in vanished {
                    self.lease_gone(name, "vanished");
                }
                self.synced.notify_waiters();
            }
            LeaseChange::Applied(name) => self.lease_present(&name),
            // Deleted, or no longer carries the identity label (the selector drops it).
            LeaseChange::Deleted(name) => self.lease_gone(name, "deleted"),
        }
    }

    fn lease_present(&self, name: &str) {
        lock(&self.absent_since).remove(name);
        lock(&self.expiry_handled).remove(name);
    }

    /// A lease went away: remember since when, and look again once the grace is over.
    fn lease_gone(self: &Arc<Self>, name: String, how: &'static str) {
        self.c.metrics.lease_event(how);
        lock(&self.absent_since)
            .entry(name.clone())
            .or_insert_with(Instant::now);
        tracing::info!(
            lease = %format!("{IDENTITY_LEASE_NAMESPACE}/{name}"),
            how,
            grace = ?self.c.cfg.deletion_grace,
            "identity lease gone; checking again after the deletion grace"
        );
        self.spawn_after(self.c.cfg.deletion_grace, move |t| {
            let t2 = Arc::clone(&t);
            t.tasks.spawn(async move { t2.lease_check(name, 0).await });
        });
    }

    /// Looks at lease `name` live; if it is still gone, queues every object with its entries.
    /// (Boxed: it schedules itself again on errors.)
    fn lease_check(self: Arc<Self>, name: String, attempt: u32) -> BoxFuture<'static, ()> {
        Box::pin(self.lease_check_once(name, attempt))
    }

    async fn lease_check_once(self: Arc<Self>, name: String, attempt: u32) {
        let lookup = match self.lookup(&name).await {
            Some(l) => l,
            None => return,
        };
        let state = plan::judge_lease(&lookup, Timestamp::now(), self.c.cfg.expired_grace);
        match state {
            LeaseState::Unknown(e) => {
                self.c.metrics.lease_check("error");
                tracing::warn!(lease = %name, error = %e, "cannot check identity lease; retrying");
                let delay = backoff(attempt + 1);
                self.spawn_after(delay, move |t| {
                    let t2 = Arc::clone(&t);
                    t.tasks
                        .spawn(async move { t2.lease_check(name, attempt + 1).await });
                });
            }
            LeaseState::Live => {
                self.c.metrics.lease_check("present");
                lock(&self.absent_since).remove(&name);
                tracing::info!(lease = %name, "identity lease is back; nothing to collect");
            }
            gone => {
                if gone.needs_deletion_grace() {
                    lock(&self.absent_since)
                        .entry(name.clone())
                        .or_insert_with(Instant::now);
                }
                let listed = match self
                    .call(
                        "LIST storageversions",
                        self.c.svs.list(&ListParams::default()),
                    )
                    .await
                {
                    Some(r) => r,
                    None => return,
                };
                match listed {
                    Ok(list) => {
                        self.c.metrics.lease_check("absent");
                        let mut n = 0;
                        for sv in list.items.iter().filter(|sv| sv.entry(&name).is_some()) {
                            n += 1;
                            self.enqueue(sv.name());
                        }
                        tracing::info!(
                            lease = %name,
                            objects = n,
                            "identity lease still gone; checking the StorageVersions that name it"
                        );
                    }
                    Err(e) => {
                        self.c.metrics.lease_check("error");
                        self.c.metrics.error("list_storage_versions");
                        tracing::warn!(error = %e, "cannot list StorageVersions; retrying");
                        let delay = backoff(attempt + 1);
                        self.spawn_after(delay, move |t| {
                            let t2 = Arc::clone(&t);
                            t.tasks
                                .spawn(async move { t2.lease_check(name, attempt + 1).await });
                        });
                    }
                }
            }
        }
    }

    /// With `--gc-expired-lease-grace`: notices cached leases that have been expired for
    /// longer than the grace (an expiring lease sends no event).
    async fn expiry_scanner(self: Arc<Self>) {
        let Some(grace) = self.c.cfg.expired_grace else {
            return;
        };
        let every = (grace / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
        let mut tick = tokio::time::interval(every);
        while self.cancellable(tick.tick()).await.is_some() {
            let now = Timestamp::now();
            let due: Vec<String> = {
                let cache = lock(&self.cache);
                let handled = lock(&self.expiry_handled);
                cache
                    .records()
                    .filter(|r| !handled.contains(&r.name))
                    .filter(|r| plan::judge_record(r, now, Some(grace)).is_gone())
                    .map(|r| r.name.clone())
                    .collect()
            };
            for name in due {
                lock(&self.expiry_handled).insert(name.clone());
                let term = Arc::clone(&self);
                self.tasks
                    .spawn(async move { term.lease_check(name, 0).await });
            }
        }
    }

    /// A live GET of identity lease `id`; `None` if the term ended.
    async fn lookup(&self, id: &str) -> Option<LeaseLookup> {
        if !could_be_lease_name(id) {
            return Some(LeaseLookup::NotFound);
        }
        let got = self.call("GET lease", self.c.leases.get_opt(id)).await?;
        Some(match got {
            Ok(Some(lease)) => LeaseLookup::Found(LeaseRecord::from_lease(&lease)),
            Ok(None) => LeaseLookup::NotFound,
            Err(e) => {
                self.c.metrics.error("get_lease");
                LeaseLookup::Failed(format!("GET lease {IDENTITY_LEASE_NAMESPACE}/{id}: {e}"))
            }
        })
    }

    // -------------------------------------------------------- storageversions --

    async fn watch_storage_versions(self: Arc<Self>) {
        let mut events = std::pin::pin!(
            watcher(self.c.svs.clone(), watcher::Config::default()).default_backoff()
        );
        while let Some(Some(event)) = self.cancellable(events.next()).await {
            match event {
                Ok(watcher::Event::Apply(sv)) | Ok(watcher::Event::InitApply(sv)) => {
                    if self.suspicious(&sv) {
                        self.enqueue(sv.name());
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    self.c.metrics.error("watch_storage_versions");
                    tracing::warn!(error = %e, "StorageVersion watch failed; retrying");
                }
            }
        }
    }

    /// An object worth a live look: some entry's lease is not a live identity lease in the
    /// cache. Before the cache has listed, nothing is (the first sweep covers that time).
    fn suspicious(&self, sv: &StorageVersion) -> bool {
        let cache = lock(&self.cache);
        if !cache.is_synced() {
            return false;
        }
        let now = Timestamp::now();
        plan::entry_ids(sv)
            .into_iter()
            .any(|id| match cache.get(id) {
                None => true,
                Some(r) => plan::judge_record(r, now, self.c.cfg.expired_grace).is_gone(),
            })
    }

    /// Sweeps on gaining leadership and then every resync interval.
    async fn sweeper(self: Arc<Self>) {
        // Wait (bounded) for the lease watch's first list, so that events and sweep agree.
        let synced = lock(&self.cache).is_synced();
        if !synced {
            let wait = tokio::time::timeout(SYNC_WAIT, self.synced.notified());
            if self.cancellable(wait).await.is_none() {
                return;
            }
        }
        loop {
            if Arc::clone(&self).sweep().await.is_none() {
                return;
            }
            if self
                .cancellable(tokio::time::sleep(self.c.cfg.resync_interval))
                .await
                .is_none()
            {
                return;
            }
        }
    }

    /// One full sweep: one LIST of identity leases and one of StorageVersions; every object
    /// with an entry whose lease is not live in that list is checked (bounded concurrency).
    async fn sweep(self: Arc<Self>) -> Option<()> {
        let start = std::time::Instant::now();
        let lp =
            ListParams::default().labels(&format!("{IDENTITY_LABEL_KEY}={IDENTITY_LABEL_VALUE}"));
        let leases = match self.call("LIST leases", self.c.leases.list(&lp)).await? {
            Ok(l) => l,
            Err(e) => {
                self.c.metrics.error("list_leases");
                tracing::warn!(error = %e, "sweep: cannot list identity leases; next sweep will retry");
                return Some(());
            }
        };
        let svs = match self
            .call(
                "LIST storageversions",
                self.c.svs.list(&ListParams::default()),
            )
            .await?
        {
            Ok(l) => l,
            Err(e) => {
                self.c.metrics.error("list_storage_versions");
                tracing::warn!(error = %e, "sweep: cannot list StorageVersions; next sweep will retry");
                return Some(());
            }
        };
        let now = Timestamp::now();
        let live: HashMap<String, LeaseRecord> = leases
            .items
            .iter()
            .map(LeaseRecord::from_lease)
            .map(|r| (r.name.clone(), r))
            .collect();
        let candidates: Vec<String> = svs
            .items
            .iter()
            .filter(|sv| {
                plan::entry_ids(sv)
                    .into_iter()
                    .any(|id| match live.get(id) {
                        None => true,
                        Some(r) => plan::judge_record(r, now, self.c.cfg.expired_grace).is_gone(),
                    })
            })
            .map(|sv| sv.name().to_string())
            .collect();
        let total = svs.items.len();
        let n = candidates.len();
        futures::stream::iter(candidates)
            .for_each_concurrent(self.c.cfg.concurrency.max(1), |name| {
                let term = Arc::clone(&self);
                async move { term.check(name).await }
            })
            .await;
        if self.token.is_cancelled() {
            return None;
        }
        let took = start.elapsed();
        self.c.metrics.sweep_duration.observe(took.as_secs_f64());
        self.c.metrics.sweeps.inc();
        tracing::info!(objects = total, checked = n, took = ?took, "GC sweep done");
        Some(())
    }

    fn object_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = lock(&self.locks);
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        Arc::clone(locks.entry(name.to_string()).or_default())
    }

    /// Judges each distinct apiServerID of `sv` with a live GET. `None` if the term ended.
    async fn judge(&self, sv: &StorageVersion) -> Option<Vec<(String, LeaseState)>> {
        let mut out = Vec::new();
        for id in plan::entry_ids(sv) {
            let lookup = self.lookup(id).await?;
            let state = plan::judge_lease(&lookup, Timestamp::now(), self.c.cfg.expired_grace);
            out.push((id.to_string(), state));
        }
        Some(out)
    }

    /// Checks StorageVersion `name` and removes what may be removed (docs/upstream.md §5 plus the
    /// grace, the re-check, the preconditions and the conflict retries of docs/design.md §5).
    async fn process(self: &Arc<Self>, name: &str) -> Outcome {
        let Some(Ok(_permit)) = self.cancellable(self.workers.acquire()).await else {
            return Outcome::Cancelled;
        };
        let _in_flight = super::metrics::InFlight::start(&self.c.metrics);
        let object_lock = self.object_lock(name);
        let Some(_guard) = self.cancellable(object_lock.lock()).await else {
            return Outcome::Cancelled;
        };
        let mut conflicts = 0u32;
        loop {
            let Some(got) = self
                .call("GET storageversion", self.c.svs.get_opt(name))
                .await
            else {
                return Outcome::Cancelled;
            };
            let sv = match got {
                Ok(Some(sv)) => sv,
                Ok(None) => {
                    self.c.metrics.check("gone");
                    return Outcome::Done;
                }
                Err(e) => {
                    self.c.metrics.error("get_storage_version");
                    self.c.metrics.check("error");
                    tracing::warn!(storageversion = name, error = %e, "cannot read StorageVersion; retrying");
                    return Outcome::RetryIn(MIN_RETRY);
                }
            };
            let Some(states) = self.judge(&sv).await else {
                return Outcome::Cancelled;
            };
            let (remove, wait_until, unknown) = self.removable(&states);
            let now = plan::format_time(Timestamp::now());
            let mut decided = plan::plan(&sv, &remove, &now);
            if !matches!(decided, Plan::Nothing) {
                // Right before the write: is each lease still gone?
                let Some(recheck) = self.recheck(&decided).await else {
                    return Outcome::Cancelled;
                };
                if recheck.len() != remove.len() {
                    tracing::info!(
                        storageversion = name,
                        "a lease came back during the check; entries kept"
                    );
                    decided = plan::plan(&sv, &recheck, &now);
                }
            }
            let later = |done: Outcome| match (wait_until, unknown) {
                (Some(at), _) => Outcome::RetryAt(at),
                (None, true) => Outcome::RetryIn(MIN_RETRY),
                (None, false) => done,
            };
            match decided {
                Plan::Nothing => {
                    self.c.metrics.check(if wait_until.is_some() {
                        "waiting"
                    } else if unknown {
                        "error"
                    } else {
                        "unchanged"
                    });
                    return later(Outcome::Done);
                }
                decided if self.c.cfg.dry_run => {
                    let (what, result) = match &decided {
                        Plan::Delete { .. } => ("delete", "would_delete"),
                        _ => ("rewrite", "would_rewrite"),
                    };
                    self.c
                        .metrics
                        .dry_run_changes
                        .get_or_create(&ResultLabels { result: what })
                        .inc();
                    self.c.metrics.check(result);
                    tracing::info!(
                        storageversion = name,
                        action = what,
                        removed = %describe(decided.removed()),
                        "dry run: would {what} the StorageVersion; changing nothing"
                    );
                    return later(Outcome::Done);
                }
                Plan::Rewrite { object, removed } => {
                    if self.token.is_cancelled() {
                        return Outcome::Cancelled;
                    }
                    match self.write_status(name, *object).await {
                        Some(Ok(written)) => {
                            self.done(&written, &removed, false).await;
                            return later(Outcome::Done);
                        }
                        Some(Err(e)) if is_status(&e, 409) => {
                            self.c.metrics.write("update_status", "conflict");
                        }
                        Some(Err(e)) if is_status(&e, 404) => {
                            self.c.metrics.write("update_status", "not_found");
                            self.c.metrics.check("gone");
                            return Outcome::Done;
                        }
                        Some(Err(e)) => {
                            self.c.metrics.write("update_status", "error");
                            self.c.metrics.error("update_status");
                            self.c.metrics.check("error");
                            tracing::warn!(storageversion = name, error = %e, "status write failed; retrying");
                            return Outcome::RetryIn(MIN_RETRY);
                        }
                        None => return Outcome::Cancelled,
                    }
                }
                Plan::Delete { removed } => {
                    if self.token.is_cancelled() {
                        return Outcome::Cancelled;
                    }
                    let dp = delete_params(&sv);
                    match self
                        .call("DELETE storageversion", self.c.svs.delete(name, &dp))
                        .await
                    {
                        Some(Ok(_)) => {
                            self.c.metrics.write("delete", "ok");
                            self.c.metrics.objects_deleted.inc();
                            self.done(&sv, &removed, true).await;
                            return later(Outcome::Done);
                        }
                        Some(Err(e)) if is_status(&e, 409) => {
                            // Changed since we read it (e.g. an apiserver re-added itself):
                            // the precondition kept it. Read again.
                            self.c.metrics.write("delete", "conflict");
                        }
                        Some(Err(e)) if is_status(&e, 404) => {
                            self.c.metrics.write("delete", "not_found");
                            self.c.metrics.check("gone");
                            return Outcome::Done;
                        }
                        Some(Err(e)) => {
                            self.c.metrics.write("delete", "error");
                            self.c.metrics.error("delete");
                            self.c.metrics.check("error");
                            tracing::warn!(storageversion = name, error = %e, "delete failed; retrying");
                            return Outcome::RetryIn(MIN_RETRY);
                        }
                        None => return Outcome::Cancelled,
                    }
                }
            }
            // A conflict: back off a little and read again.
            conflicts += 1;
            if conflicts > MAX_CONFLICT_RETRIES {
                self.c.metrics.check("error");
                tracing::warn!(
                    storageversion = name,
                    conflicts,
                    "still conflicting; requeued"
                );
                return Outcome::RetryIn(MIN_RETRY);
            }
            tracing::debug!(
                storageversion = name,
                conflicts,
                "write conflict; reading again"
            );
            if self
                .cancellable(tokio::time::sleep(backoff(conflicts)))
                .await
                .is_none()
            {
                return Outcome::Cancelled;
            }
        }
    }

    /// Which gone IDs may go now; the earliest instant a waiting one may; whether any lookup
    /// failed.
    fn removable(
        &self,
        states: &[(String, LeaseState)],
    ) -> (BTreeMap<String, Reason>, Option<Instant>, bool) {
        let now = Instant::now();
        let grace = self.c.cfg.deletion_grace;
        let mut remove = BTreeMap::new();
        let mut wait_until: Option<Instant> = None;
        let mut unknown = false;
        let mut absent = lock(&self.absent_since);
        for (id, state) in states {
            match state {
                LeaseState::Live => {
                    absent.remove(id);
                }
                LeaseState::Unknown(e) => {
                    unknown = true;
                    tracing::warn!(apiserver = %id, error = %e, "cannot judge identity lease; entry kept");
                }
                gone => {
                    let Some(reason) = gone.reason() else {
                        continue;
                    };
                    if gone.needs_deletion_grace() {
                        let since = *absent.entry(id.clone()).or_insert(now);
                        let until = since + grace;
                        if now >= until {
                            remove.insert(id.clone(), reason);
                        } else {
                            wait_until = Some(wait_until.map_or(until, |w| w.min(until)));
                        }
                    } else {
                        remove.insert(id.clone(), reason);
                    }
                }
            }
        }
        (remove, wait_until, unknown)
    }

    /// Live GETs, right before the write, of every lease about to be removed; returns the IDs
    /// that are still gone.
    async fn recheck(&self, decided: &Plan) -> Option<BTreeMap<String, Reason>> {
        let mut still = BTreeMap::new();
        for r in decided.removed() {
            let lookup = self.lookup(&r.id).await?;
            let state = plan::judge_lease(&lookup, Timestamp::now(), self.c.cfg.expired_grace);
            match state.reason() {
                Some(reason) => {
                    still.insert(r.id.clone(), reason);
                }
                None => {
                    if state == LeaseState::Live {
                        lock(&self.absent_since).remove(&r.id);
                    }
                }
            }
        }
        Some(still)
    }

    async fn write_status(
        &self,
        name: &str,
        mut object: StorageVersion,
    ) -> Option<Result<StorageVersion, kube::Error>> {
        object.api_version = Some(API_VERSION.to_string());
        object.kind = Some(KIND.to_string());
        let r = self
            .call(
                "PUT storageversion status",
                self.c
                    .svs
                    .replace_status(name, &PostParams::default(), &object),
            )
            .await?;
        if r.is_ok() {
            self.c.metrics.write("update_status", "ok");
        }
        Some(r)
    }

    /// After a successful write: metrics, log, Event.
    async fn done(&self, sv: &StorageVersion, removed: &[Removal], deleted: bool) {
        for r in removed {
            let n = sv
                .status
                .storage_versions
                .iter()
                .filter(|e| e.api_server_id == r.id)
                .count()
                .max(1);
            self.c
                .metrics
                .entries_removed
                .get_or_create(&ReasonLabels {
                    reason: r.reason.code(),
                })
                .inc_by(n as u64);
        }
        let what = describe(removed);
        let (reason, note) = if deleted {
            self.c.metrics.check("deleted");
            tracing::info!(storageversion = sv.name(), removed = %what, "deleted StorageVersion: no entry left");
            (
                "StorageVersionDeleted",
                format!("Deleted: no entry left after removing {what}"),
            )
        } else {
            self.c.metrics.check("rewritten");
            let common = sv
                .status
                .common_encoding_version
                .as_deref()
                .unwrap_or("unset");
            tracing::info!(storageversion = sv.name(), removed = %what, common_encoding_version = common, "removed stale entries");
            (
                "StaleEntriesRemoved",
                format!("Removed the entries of {what}; commonEncodingVersion is now {common}"),
            )
        };
        let event = Event {
            type_: EventType::Normal,
            reason: reason.to_string(),
            note: Some(truncate(note, MAX_NOTE)),
            action: "GarbageCollect".to_string(),
            secondary: None,
        };
        let reference = sv.object_ref(&());
        let published = self
            .cancellable(tokio::time::timeout(
                CALL_TIMEOUT,
                self.c.recorder.publish(&event, &reference),
            ))
            .await;
        match published {
            Some(Ok(Ok(()))) | None => {}
            Some(Ok(Err(e))) => {
                self.c.metrics.error("event");
                tracing::warn!(storageversion = sv.name(), error = %e, "cannot record Event");
            }
            Some(Err(_)) => {
                self.c.metrics.error("event");
                tracing::warn!(storageversion = sv.name(), "recording an Event timed out");
            }
        }
    }
}

/// Delete options for an object as it was read: resourceVersion and uid preconditions, so a
/// StorageVersion that changed since (an apiserver re-added itself) or was re-created is kept
/// (the API server answers 409 Conflict). Upstream deletes unconditionally (docs/upstream.md §7 (b)).
pub fn delete_params(read: &StorageVersion) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: read.metadata.resource_version.clone(),
            uid: read.metadata.uid.clone(),
        }),
        ..DeleteParams::default()
    }
}

/// `apiserver-a (its identity lease does not exist), apiserver-b (...)`.
pub fn describe(removed: &[Removal]) -> String {
    removed
        .iter()
        .map(|r| format!("{} ({})", r.id, r.reason))
        .collect::<Vec<_>>()
        .join(", ")
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max.saturating_sub(3);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// Capped exponential backoff: 100 ms, 200 ms, 400 ms, ... up to 30 s.
fn backoff(attempt: u32) -> Duration {
    let exp = attempt.saturating_sub(1).min(16);
    (MIN_RETRY * 2u32.pow(exp)).min(MAX_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(100), MAX_RETRY);
    }

    #[test]
    fn lease_names() {
        assert!(could_be_lease_name("apiserver-abc"));
        assert!(!could_be_lease_name(""));
        assert!(!could_be_lease_name("Bad/Name"));
    }

    #[test]
    fn notes_are_bounded() {
        let s = truncate("é".repeat(600), 1000);
        assert!(s.len() <= 1000 && s.ends_with("..."));
        assert_eq!(truncate("short".into(), 1000), "short");
    }
}
