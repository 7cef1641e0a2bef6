//! The collector's work while this replica leads (one *term*).
//!
//! It judges from two stores, not from per-object reads: StorageVersions from a watch folded
//! into a kube-runtime reflector store (metadata trimmed, see [`StoredSv`]), identity leases from
//! the process's shared [`LeaseStore`]. One loop runs *passes*, woken by store events, by the
//! next grace to run out, and by the periodic sweep. A pass is four steps:
//!
//! 1. [`Term::observe`]: from the stores, which apiServerIDs look gone and which objects name
//!    them (also the `stale_entries` gauge). No API call.
//! 2. [`Term::due`]: which of those *suspects* have been gone for the deletion grace (or are
//!    expired beyond the expired-lease grace, or were deleted and need a follow-up).
//! 3. [`Term::confirm`]: one live GET per due lease, right before the writes that act on it: a
//!    lease that is back, or a lookup that fails, removes nothing.
//! 4. [`Term::act`]: each object naming a confirmed lease costs one write (the `/status` PUT with
//!    the stored copy's resourceVersion, or the preconditioned DELETE); a conflict reads the
//!    object again, confirms again (after that read) the leases it still names, and retries.
//!    [`Term::send`] is the one place write errors are mapped.
//!
//! The copies acted on come from one snapshot of the store taken before step 3, so each entry
//! removed was written before its lease was seen gone (invariant I1 in docs/gc.md).
//!
//! Everything stops when the term's token is cancelled.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::{GcMetrics, InFlight, ReasonLabels, ResultLabels};
use super::plan::{self, LeaseState, Plan, Reason, Removal};
use super::stored::StoredSv;
use crate::leases::{could_be_lease_name, LeaseChange, LeaseStore, StoreEvent};
use crate::model::{
    LeaseLookup, LeaseRecord, ServerStorageVersion, StorageVersion, IDENTITY_LEASE_NAMESPACE,
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
/// Conflicts retried at once (with backoff) before the object waits for the next pass.
const MAX_CONFLICT_RETRIES: u32 = 6;
const MIN_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// Shortest time between two passes, so a burst of store events costs one pass, not hundreds.
const MIN_PASS_INTERVAL: Duration = Duration::from_millis(50);
/// Longest an Event note may be (the API allows 1 kB).
const MAX_NOTE: usize = 1000;

/// Long-lived pieces shared by every term.
pub struct Collector {
    svs: Api<StoredSv>,
    leases: LeaseStore,
    cfg: CollectorConfig,
    metrics: GcMetrics,
    recorder: Recorder,
    /// The running term's StorageVersion store, for other leader-only work (the report).
    shared: watch::Sender<Option<SvView>>,
}

/// A read-only view of the collector's StorageVersion store while a term runs: the store, and a
/// counter bumped after every change the watch delivered, 0 until the first list is in the store
/// (wait on it, not on `Store::wait_until_ready`, whose future keeps only one waker: the
/// collector's own wait would be lost). Shared so that other leader-only work (`serve --report`)
/// judges from the same watch instead of a second.
#[derive(Clone)]
pub struct SvView {
    pub store: Store<StoredSv>,
    pub changes: watch::Receiver<u64>,
}

impl Collector {
    pub fn new(
        client: kube::Client,
        leases: LeaseStore,
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
            svs: Api::all(client),
            leases,
            cfg,
            metrics,
            recorder,
            shared: watch::channel(None).0,
        }
    }

    /// Follows the store of each term: `Some` while a term runs, `None` between terms.
    pub fn sv_view(&self) -> watch::Receiver<Option<SvView>> {
        self.shared.subscribe()
    }

    /// One term of leadership: runs until `token` is cancelled.
    pub async fn lead(self: Arc<Self>, token: CancellationToken) {
        let (reader, writer) = reflector::store();
        let (changes, changes_rx) = watch::channel(0u64);
        self.shared.send_replace(Some(SvView {
            store: reader.clone(),
            changes: changes_rx,
        }));
        let term = Arc::new(Term {
            c: Arc::clone(&self),
            token: token.clone(),
            svs: reader,
            changes,
            wake: Notify::new(),
            sweep_due: AtomicBool::new(true),
            state: Mutex::new(TermState::default()),
        });
        let changes = self.leases.subscribe();
        tokio::join!(
            Arc::clone(&term).watch_storage_versions(writer),
            Arc::clone(&term).follow_leases(changes),
            Arc::clone(&term).sweeper(),
            Arc::clone(&term).run(),
        );
        self.shared.send_replace(None);
        self.metrics.stale_entries.set(0);
    }
}

/// An apiServerID whose lease looks gone (or was deleted), being waited on.
#[derive(Clone, Debug)]
struct Suspect {
    /// When this term first saw it gone.
    since: Instant,
    /// The deletion grace applies (missing, or not an apiserver's); not for an expired lease.
    needs_grace: bool,
    /// A deletion (or a lease gone at a relist) to follow up with a GET even if no object
    /// names it.
    follow_up: bool,
    /// After a failed lookup or write: not before this.
    retry_at: Option<Instant>,
    failures: u32,
}

impl Suspect {
    fn new(since: Instant) -> Suspect {
        Suspect {
            since,
            needs_grace: true,
            follow_up: false,
            retry_at: None,
            failures: 0,
        }
    }

    fn due_at(&self, grace: Duration) -> Instant {
        let after = if self.needs_grace {
            self.since + grace
        } else {
            self.since
        };
        self.retry_at.map_or(after, |r| r.max(after))
    }
}

#[derive(Default)]
struct TermState {
    suspects: HashMap<String, Suspect>,
    /// Objects already written (or, in a dry run, reported) at this resourceVersion: the store
    /// may still hold the old copy for a moment; don't write it twice.
    acted: HashMap<String, String>,
}

/// What one term knows and runs.
struct Term {
    c: Arc<Collector>,
    token: CancellationToken,
    svs: Store<StoredSv>,
    /// Bumped after every change of `svs` (see [`SvView`]).
    changes: watch::Sender<u64>,
    wake: Notify,
    sweep_due: AtomicBool,
    state: Mutex<TermState>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the stores show at one moment.
#[derive(Debug, Default)]
struct Observed {
    /// Gone-looking apiServerIDs named by some object, and whether the deletion grace applies.
    gone: BTreeMap<String, bool>,
    /// Entries whose apiserver's lease is missing, not an apiserver's, or expired.
    stale_entries: usize,
    /// The earliest instant a named lease will count as expired beyond the expired-lease grace.
    next_expiry: Option<Instant>,
}

/// How a write went, after [`Term::send`] mapped it.
enum Sent {
    Ok(Box<StoredSv>),
    Conflict,
    Gone,
    Failed,
}

/// What became of one object in [`Term::act`].
enum Outcome {
    Done,
    /// Written: the Event that records it, published once the batch's writes are done.
    Changed(Box<EventNote>),
    /// Try again at a later pass (a failed write or read).
    Retry,
}

/// A Normal Event to record on a changed (or deleted) StorageVersion.
struct EventNote {
    name: String,
    reference: k8s_openapi::api::core::v1::ObjectReference,
    reason: &'static str,
    note: String,
    /// The entries the write removed, as they were: given back if their apiserver turns out to
    /// have come back during the batch ([`Term::give_back`]).
    removed: Vec<ServerStorageVersion>,
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

    // ------------------------------------------------------------ inputs --

    /// Feeds the StorageVersion store (a paginated list, then watch events) and wakes the loop.
    async fn watch_storage_versions(self: Arc<Self>, writer: reflector::store::Writer<StoredSv>) {
        let events = watcher(self.c.svs.clone(), watcher::Config::default())
            .modify(|sv| *sv = std::mem::take(sv).trim())
            .default_backoff()
            .reflect(writer);
        let mut events = std::pin::pin!(events);
        while let Some(Some(event)) = self.cancellable(events.next()).await {
            match event {
                Ok(watcher::Event::Init) | Ok(watcher::Event::InitApply(_)) => {}
                Ok(watcher::Event::InitDone) => {
                    // The list's pages are decoded and dropped: hand their memory back.
                    crate::memory::release_free();
                    self.wake.notify_one();
                    self.changes.send_modify(|n| *n = n.wrapping_add(1));
                }
                Ok(_) => {
                    self.wake.notify_one();
                    self.changes.send_modify(|n| *n = n.wrapping_add(1));
                }
                Err(e) => {
                    self.c.metrics.error("watch_storage_versions");
                    tracing::warn!(error = %e, "StorageVersion watch failed; retrying");
                }
            }
        }
    }

    /// Lease deletions become suspects to follow up; a lease that is back wakes the loop.
    async fn follow_leases(
        self: Arc<Self>,
        mut changes: tokio::sync::broadcast::Receiver<StoreEvent>,
    ) {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            let event = match self.cancellable(changes.recv()).await {
                None | Some(Err(RecvError::Closed)) => return,
                Some(Err(RecvError::Lagged(_))) => {
                    // Missed changes: the next pass reads the whole store anyway.
                    self.wake.notify_one();
                    continue;
                }
                Some(Ok(event)) => event,
            };
            match event {
                StoreEvent::WatchFailed(_) => self.c.metrics.error("watch_leases"),
                StoreEvent::Changed(change) => match &*change {
                    LeaseChange::Deleted(name) => {
                        self.c.metrics.lease_event("deleted");
                        self.follow_up(name);
                    }
                    LeaseChange::Listed { vanished } => {
                        self.c.metrics.lease_event("listed");
                        for name in vanished {
                            self.c.metrics.lease_event("vanished");
                            self.follow_up(name);
                        }
                        self.wake.notify_one();
                    }
                    LeaseChange::Applied(name) => {
                        // A suspect that is back is forgotten now, so that its next absence
                        // waits the whole grace again (even if it goes before the next pass).
                        // With the expired-lease grace, any change of a lease may move when it
                        // expires (a renewTime set back), so the next pass recomputes its
                        // wake-up from the store.
                        let was_suspect = lock(&self.state).suspects.contains_key(name);
                        if was_suspect && self.looks_live(name) {
                            lock(&self.state).suspects.remove(name);
                        }
                        if self.c.cfg.expired_grace.is_some() || was_suspect {
                            self.wake.notify_one();
                        }
                    }
                    LeaseChange::None => {}
                },
            }
        }
    }

    /// Whether the lease store shows lease `id` live (present, an apiserver's, and not expired
    /// beyond the expired-lease grace when that is on).
    fn looks_live(&self, id: &str) -> bool {
        let now = Timestamp::now();
        let expired_grace = self.c.cfg.expired_grace;
        self.c
            .leases
            .read(|leases| !judge_stored(leases.get(id), now, expired_grace).is_gone())
    }

    fn follow_up(&self, name: &str) {
        let now = Instant::now();
        lock(&self.state)
            .suspects
            .entry(name.to_string())
            .or_insert_with(|| Suspect::new(now))
            .follow_up = true;
        self.wake.notify_one();
    }

    /// Asks for a full sweep on gaining leadership (set at start) and every resync interval.
    async fn sweeper(self: Arc<Self>) {
        loop {
            let sleep = tokio::time::sleep(self.c.cfg.resync_interval);
            if self.cancellable(sleep).await.is_none() {
                return;
            }
            self.sweep_due.store(true, Ordering::Release);
            self.wake.notify_one();
        }
    }

    // -------------------------------------------------------------- loop --

    /// Waits for both stores' first lists, then runs passes until the term ends.
    async fn run(self: Arc<Self>) {
        let ready = async {
            self.c.leases.synced().await;
            self.svs.wait_until_ready().await
        };
        match self.cancellable(ready).await {
            None => return,
            Some(Err(e)) => {
                tracing::error!(error = %e, "StorageVersion store closed before it listed");
                return;
            }
            Some(Ok(())) => {}
        }
        loop {
            let sweep = self.sweep_due.swap(false, Ordering::AcqRel);
            let started = std::time::Instant::now();
            let Some(next) = self.pass().await else {
                return;
            };
            if sweep {
                let took = started.elapsed();
                self.c.metrics.sweep_duration.observe(took.as_secs_f64());
                self.c.metrics.sweeps.inc();
                tracing::info!(objects = self.svs.state().len(), took = ?took, "GC sweep done");
            }
            let wait = async {
                tokio::time::sleep(MIN_PASS_INTERVAL).await;
                match next {
                    Some(at) => {
                        tokio::select! {
                            _ = self.wake.notified() => {}
                            _ = tokio::time::sleep_until(at) => {}
                        }
                    }
                    None => self.wake.notified().await,
                }
            };
            if self.cancellable(wait).await.is_none() {
                return;
            }
        }
    }

    /// One pass: observe, pick what is due, confirm it live, act. Returns when the next pass is
    /// needed without a wake-up (`None`: only on one), or `None` if the term ended.
    ///
    /// The objects acted on are the copies in one snapshot of the store taken at the start,
    /// before the confirming GETs: every entry in them was written before its lease was seen
    /// gone, so no entry written by an apiserver that came back afterwards is judged by that
    /// confirmation (invariant I1, docs/gc.md). A copy that is no longer current is refused by
    /// its resourceVersion, and then read and confirmed again ([`Term::write_one`]).
    async fn pass(self: &Arc<Self>) -> Option<Option<Instant>> {
        let snapshot = self.svs.state();
        let observed = self.observe(&snapshot);
        self.c
            .metrics
            .stale_entries
            .set(i64::try_from(observed.stale_entries).unwrap_or(i64::MAX));
        let due = self.due(&observed, &snapshot);
        if !due.is_empty() {
            let confirmed = self.confirm(&due).await?;
            if !confirmed.is_empty() {
                self.act(&confirmed, &snapshot).await?;
            }
        }
        let grace = self.c.cfg.deletion_grace;
        let next_suspect = lock(&self.state)
            .suspects
            .values()
            .map(|s| s.due_at(grace))
            .min();
        Some(min_opt(next_suspect, observed.next_expiry))
    }

    /// Step 1: what the stores show. No API call.
    fn observe(&self, svs: &[Arc<StoredSv>]) -> Observed {
        let now = Timestamp::now();
        let expired_grace = self.c.cfg.expired_grace;
        self.c.leases.read(|leases| {
            let mut seen = Observed::default();
            let mut judged: HashMap<&str, LeaseState> = HashMap::new();
            for sv in svs {
                for e in &sv.status.known.storage_versions {
                    let id = e.api_server_id.as_str();
                    let record = leases.get(id);
                    let state = judged
                        .entry(id)
                        .or_insert_with(|| judge_stored(record, now, expired_grace));
                    if state.is_gone() {
                        seen.gone
                            .insert(id.to_string(), state.needs_deletion_grace());
                    }
                    if state.is_gone() || record.is_some_and(is_expired_at(now)) {
                        seen.stale_entries += 1;
                    }
                    if let (Some(grace), Some(r)) = (expired_grace, record) {
                        if !state.is_gone() {
                            seen.next_expiry =
                                min_opt(seen.next_expiry, expiry_instant(r, grace, now));
                        }
                    }
                }
            }
            seen
        })
    }

    /// Step 2: update the suspects from what was observed; return the IDs due for a live GET.
    fn due(&self, observed: &Observed, svs: &[Arc<StoredSv>]) -> Vec<String> {
        let now = Instant::now();
        let grace = self.c.cfg.deletion_grace;
        // A deletion to follow up whose lease the store shows live again: back, forget it (its
        // next absence waits the whole grace).
        let follow_ups: Vec<String> = lock(&self.state)
            .suspects
            .iter()
            .filter(|(id, s)| s.follow_up && !observed.gone.contains_key(*id))
            .map(|(id, _)| id.clone())
            .collect();
        let back: BTreeSet<String> = follow_ups
            .into_iter()
            .filter(|id| self.looks_live(id))
            .collect();
        let mut state = lock(&self.state);
        for (id, needs_grace) in &observed.gone {
            let s = state
                .suspects
                .entry(id.clone())
                .or_insert_with(|| Suspect::new(now));
            s.needs_grace = *needs_grace;
        }
        // Looks live again (and no deletion to follow up): forget it.
        state
            .suspects
            .retain(|id, s| observed.gone.contains_key(id) || (s.follow_up && !back.contains(id)));
        // Objects changed since we acted on them: the stored copy is newer now.
        let current: HashMap<String, Option<String>> = svs
            .iter()
            .map(|sv| (sv.name().to_string(), sv.metadata.resource_version.clone()))
            .collect();
        state
            .acted
            .retain(|name, rv| current.get(name).is_some_and(|c| c.as_ref() == Some(rv)));
        state
            .suspects
            .iter()
            .filter(|(_, s)| s.due_at(grace) <= now)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Step 3: one live GET per due lease. Returns the IDs still gone, with why; forgets the
    /// ones that are back; backs off the ones whose lookup failed.
    async fn confirm(&self, due: &[String]) -> Option<BTreeMap<String, Reason>> {
        let concurrency = self.c.cfg.concurrency.max(1);
        let looked: Vec<(String, LeaseLookup)> = futures::stream::iter(due.iter().cloned())
            .map(|id| async move {
                let lookup = self.lookup(&id).await;
                lookup.map(|l| (id, l))
            })
            .buffer_unordered(concurrency)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Option<_>>()?;
        let now = Timestamp::now();
        let mut confirmed = BTreeMap::new();
        for (id, lookup) in looked {
            let state = plan::judge_lease(&lookup, now, self.c.cfg.expired_grace);
            match (&state, state.reason()) {
                (LeaseState::Unknown(e), _) => {
                    tracing::warn!(apiserver = %id, error = %e, "cannot judge identity lease; entries kept");
                    for _ in self.names_of(&id) {
                        self.c.metrics.check("error");
                    }
                    self.retry_later(&id);
                }
                (_, Some(reason)) => {
                    confirmed.insert(id, reason);
                }
                (_, None) => {
                    // Back (or never gone): keep every entry.
                    lock(&self.state).suspects.remove(&id);
                }
            }
        }
        Some(confirmed)
    }

    /// A live GET of lease `id` (`None` if the term ended).
    async fn lookup(&self, id: &str) -> Option<LeaseLookup> {
        if !could_be_lease_name(id) {
            self.c.metrics.lease_check("absent");
            return Some(LeaseLookup::NotFound);
        }
        let got = self
            .call("GET lease", self.c.leases.api().get_opt(id))
            .await?;
        Some(match got {
            Ok(Some(lease)) => {
                self.c.metrics.lease_check("present");
                LeaseLookup::Found(LeaseRecord::from_lease(&lease))
            }
            Ok(None) => {
                self.c.metrics.lease_check("absent");
                LeaseLookup::NotFound
            }
            Err(e) => {
                self.c.metrics.lease_check("error");
                self.c.metrics.error("get_lease");
                LeaseLookup::Failed(format!("GET lease {IDENTITY_LEASE_NAMESPACE}/{id}: {e}"))
            }
        })
    }

    fn retry_later(&self, id: &str) {
        let now = Instant::now();
        if let Some(s) = lock(&self.state).suspects.get_mut(id) {
            s.failures = s.failures.saturating_add(1);
            s.retry_at = Some(now + backoff(s.failures));
        }
    }

    /// Names of the stored objects with an entry of `id`.
    fn names_of(&self, id: &str) -> Vec<String> {
        self.svs
            .state()
            .iter()
            .filter(|sv| {
                sv.status
                    .known
                    .storage_versions
                    .iter()
                    .any(|e| e.api_server_id == id)
            })
            .map(|sv| sv.name().to_string())
            .collect()
    }

    /// Step 4: one write per object naming a confirmed lease (bounded concurrency). Suspects
    /// whose objects are all done are forgotten; the others retry later.
    async fn act(
        self: &Arc<Self>,
        confirmed: &BTreeMap<String, Reason>,
        snapshot: &[Arc<StoredSv>],
    ) -> Option<()> {
        let targets = self.targets(confirmed, snapshot);
        let now = plan::format_time(Timestamp::now());
        let outcomes: Vec<(Arc<StoredSv>, Outcome)> = futures::stream::iter(targets)
            .map(|sv| {
                let now = now.as_str();
                async move {
                    let outcome = self.write_one(&sv, confirmed, now).await;
                    outcome.map(|o| (sv, o))
                }
            })
            .buffer_unordered(self.c.cfg.concurrency.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Option<_>>()?;
        self.settle(confirmed, &outcomes);
        let removed: Vec<(&str, &[ServerStorageVersion])> = outcomes
            .iter()
            .filter_map(|(_, o)| match o {
                Outcome::Changed(note) if !note.removed.is_empty() => {
                    Some((note.name.as_str(), note.removed.as_slice()))
                }
                _ => None,
            })
            .collect();
        if !removed.is_empty() {
            self.give_back_if_returned(&removed).await?;
        }
        // The record of the batch, after its writes: the Events do not hold up the collection,
        // nor compete with its writes at the apiserver.
        let notes = outcomes.into_iter().filter_map(|(_, o)| match o {
            Outcome::Changed(note) => Some(*note),
            _ => None,
        });
        futures::stream::iter(notes)
            .for_each_concurrent(self.c.cfg.concurrency.max(1), |note| self.publish(note))
            .await;
        Some(())
    }

    /// After a batch: one more live GET per lease whose entries it removed. A lease that is
    /// back was created before this GET, perhaps before some of the batch's writes, and its
    /// apiserver may have written its unchanged entry in between: kube-apiserver short-circuits
    /// a write that changes nothing, so the resourceVersion did not move and the precondition
    /// let the removal through. Its removed entries are given back where it has none now (its
    /// own newer entry always wins). `None` if the term ended.
    async fn give_back_if_returned(
        &self,
        removed: &[(&str, &[ServerStorageVersion])],
    ) -> Option<()> {
        let ids: BTreeSet<&str> = removed
            .iter()
            .flat_map(|(_, entries)| entries.iter().map(|e| e.api_server_id.as_str()))
            .collect();
        let mut back = BTreeSet::new();
        for id in ids {
            let lookup = self.lookup(id).await?;
            let state = plan::judge_lease(&lookup, Timestamp::now(), self.c.cfg.expired_grace);
            if !state.is_gone() && !matches!(state, LeaseState::Unknown(_)) {
                back.insert(id);
            }
        }
        if back.is_empty() {
            return Some(());
        }
        tracing::info!(apiservers = ?back, "identity lease back during the batch; giving its removed entries back");
        let now = plan::format_time(Timestamp::now());
        for (name, entries) in removed {
            let returned: Vec<ServerStorageVersion> = entries
                .iter()
                .filter(|e| back.contains(e.api_server_id.as_str()))
                .cloned()
                .collect();
            if !returned.is_empty() {
                self.give_back(name, &returned, &now).await?;
            }
        }
        Some(())
    }

    /// Appends `entries` to object `name` where their apiserver has none now (read fresh, written
    /// with its resourceVersion; a conflict reads again). An object the batch deleted is created
    /// again first: an apiserver that came back and rewrote its unchanged entry before the
    /// DELETE (which the precondition could not stop) gets its entry back now, not at its next
    /// 10-minute refresh.
    async fn give_back(
        &self,
        name: &str,
        entries: &[ServerStorageVersion],
        now: &str,
    ) -> Option<()> {
        for attempt in 0..=MAX_CONFLICT_RETRIES {
            let got = self
                .call("GET storageversion", self.c.svs.get_opt(name))
                .await?;
            let fresh = match got {
                Ok(Some(fresh)) => fresh.trim(),
                Ok(None) => {
                    // The batch deleted it (these were its last entries): create it again, and
                    // its status at the next attempt (kube-apiserver drops status on create).
                    // An apiserver that created it meanwhile wins: AlreadyExists reads it again.
                    self.recreate(name).await?;
                    continue;
                }
                Err(e) => {
                    self.c.metrics.error("get_storage_version");
                    tracing::warn!(storageversion = name, error = %e, "cannot read StorageVersion to give entries back");
                    return Some(());
                }
            };
            let Some(restored) = plan::restore(&fresh.to_model(), entries, now) else {
                return Some(());
            };
            let body = fresh.with_status(restored.status);
            let pp = PostParams::default();
            let put = self.c.svs.replace_status(name, &pp, &body);
            match self.call("PUT storageversion status", put).await? {
                Ok(_) => {
                    self.c.metrics.write("give_back", "ok");
                    self.c.metrics.check("given_back");
                    tracing::info!(
                        storageversion = name,
                        "gave back the entries of an apiserver that came back"
                    );
                    return Some(());
                }
                Err(e) if is_status(&e, 409) => {
                    self.c.metrics.write("give_back", "conflict");
                    self.cancellable(tokio::time::sleep(backoff(attempt + 1)))
                        .await?;
                }
                Err(e) if is_status(&e, 404) => return Some(()),
                Err(e) => {
                    self.c.metrics.write("give_back", "error");
                    self.c.metrics.error("give_back");
                    tracing::warn!(storageversion = name, error = %e, "cannot give entries back");
                    return Some(());
                }
            }
        }
        Some(())
    }

    /// Creates the StorageVersion `name` again, empty (its entries are written by the caller's
    /// next attempt through `/status`). `None` if the term ended.
    async fn recreate(&self, name: &str) -> Option<()> {
        let mut sv = StorageVersion::default();
        sv.metadata.name = Some(name.to_string());
        let api: Api<StorageVersion> = Api::all(self.c.svs.clone().into_client());
        let pp = PostParams::default();
        let create = api.create(&pp, &sv);
        match self.call("POST storageversion", create).await? {
            Ok(_) => {
                self.c.metrics.write("recreate", "ok");
                tracing::info!(
                    storageversion = name,
                    "created again to give back the entries of an apiserver that came back"
                );
            }
            Err(e) if is_status(&e, 409) => {}
            Err(e) => {
                self.c.metrics.write("recreate", "error");
                self.c.metrics.error("recreate");
                tracing::warn!(storageversion = name, error = %e, "cannot create StorageVersion again to give entries back");
            }
        }
        Some(())
    }

    /// The stored objects naming a confirmed lease, but for those already acted on at their
    /// current resourceVersion.
    fn targets(
        &self,
        confirmed: &BTreeMap<String, Reason>,
        snapshot: &[Arc<StoredSv>],
    ) -> Vec<Arc<StoredSv>> {
        let state = lock(&self.state);
        snapshot
            .iter()
            .filter(|sv| {
                let acted = state.acted.get(sv.name()).map(String::as_str);
                acted.is_none() || acted != sv.resource_version()
            })
            .filter(|sv| {
                sv.status
                    .known
                    .storage_versions
                    .iter()
                    .any(|e| confirmed.contains_key(&e.api_server_id))
            })
            .cloned()
            .collect()
    }

    /// After a batch: a confirmed lease with a failed object is retried later, the others are
    /// done (in a dry run: looked at again at the next sweep).
    fn settle(&self, confirmed: &BTreeMap<String, Reason>, outcomes: &[(Arc<StoredSv>, Outcome)]) {
        let failed: BTreeSet<&str> = outcomes
            .iter()
            .filter(|(_, outcome)| matches!(outcome, Outcome::Retry))
            .flat_map(|(sv, _)| sv.status.known.storage_versions.iter())
            .filter_map(|e| {
                confirmed
                    .get_key_value(&e.api_server_id)
                    .map(|(id, _)| id.as_str())
            })
            .collect();
        for id in confirmed.keys() {
            if failed.contains(id.as_str()) {
                self.retry_later(id);
            } else if self.c.cfg.dry_run {
                // Reported; look again at the next sweep, not at every pass.
                if let Some(s) = lock(&self.state).suspects.get_mut(id) {
                    s.retry_at = Some(Instant::now() + self.c.cfg.resync_interval);
                }
            } else {
                lock(&self.state).suspects.remove(id);
            }
        }
    }

    /// Plans and writes one object, reading it again after a conflict. `None` if the term ended.
    async fn write_one(
        &self,
        stored: &StoredSv,
        confirmed: &BTreeMap<String, Reason>,
        now: &str,
    ) -> Option<Outcome> {
        let _in_flight = InFlight::start(&self.c.metrics);
        let mut current = stored.clone();
        let mut confirmed = confirmed.clone();
        for attempt in 0..=MAX_CONFLICT_RETRIES {
            // A lease the watch has delivered back since the confirmation is back: its entries
            // stay (no API call; the give-back after the batch covers what the watch had not
            // delivered yet).
            confirmed.retain(|id, _| !self.looks_live(id));
            let decided = plan::plan(&current.to_model(), &confirmed, now);
            if matches!(decided, Plan::Nothing) {
                self.c.metrics.check("unchanged");
                self.mark_acted(stored);
                return Some(Outcome::Done);
            }
            if self.c.cfg.dry_run {
                self.dry_run(&current, &decided);
                self.mark_acted(stored);
                return Some(Outcome::Done);
            }
            match self.send(&current, &decided).await? {
                Sent::Ok(written) => {
                    // The store may hold `stored` until the watch delivers the change.
                    self.mark_acted(stored);
                    let before = current.to_model();
                    let after = match decided {
                        Plan::Delete { .. } => None,
                        _ => Some(written.to_model()),
                    };
                    let note = self.done(&before, after.as_ref(), decided.removed());
                    return Some(Outcome::Changed(Box::new(note)));
                }
                Sent::Gone => {
                    self.c.metrics.check("gone");
                    self.mark_acted(stored);
                    return Some(Outcome::Done);
                }
                Sent::Failed => {
                    self.c.metrics.check("error");
                    return Some(Outcome::Retry);
                }
                Sent::Conflict => match self.reread(current.name(), attempt).await? {
                    // The object changed after the leases were confirmed: an apiserver may have
                    // come back and written its entry again since. The confirmation holds only
                    // for what was written before it, so confirm again, after this read.
                    Ok(fresh) => match self.reconfirm(&fresh, &confirmed).await? {
                        Some(still_gone) => {
                            current = fresh;
                            confirmed = still_gone;
                        }
                        None => return Some(Outcome::Retry),
                    },
                    Err(outcome) => return Some(outcome),
                },
            }
        }
        self.c.metrics.check("error");
        tracing::warn!(
            storageversion = stored.name(),
            "still conflicting; retrying later"
        );
        Some(Outcome::Retry)
    }

    /// After a re-read: one live GET per confirmed lease that `fresh` still names, each after
    /// the read. Returns those still gone (`Some(None)`: a lookup failed, try at a later pass;
    /// `None`: the term ended). A lease that is back is no longer a suspect.
    async fn reconfirm(
        &self,
        fresh: &StoredSv,
        confirmed: &BTreeMap<String, Reason>,
    ) -> Option<Option<BTreeMap<String, Reason>>> {
        let named: BTreeSet<&str> = fresh
            .status
            .known
            .storage_versions
            .iter()
            .map(|e| e.api_server_id.as_str())
            .filter(|id| confirmed.contains_key(*id))
            .collect();
        let mut still = BTreeMap::new();
        for id in named {
            let lookup = self.lookup(id).await?;
            let state = plan::judge_lease(&lookup, Timestamp::now(), self.c.cfg.expired_grace);
            match (&state, state.reason()) {
                (LeaseState::Unknown(e), _) => {
                    tracing::warn!(apiserver = %id, error = %e, "cannot judge identity lease after a conflict; entries kept");
                    return Some(None);
                }
                (_, Some(reason)) => {
                    still.insert(id.to_string(), reason);
                }
                (_, None) => {
                    tracing::info!(apiserver = %id, storageversion = fresh.name(), "identity lease is back; its entries are kept");
                    lock(&self.state).suspects.remove(id);
                }
            }
        }
        Some(Some(still))
    }

    /// After a conflict: backs off, then reads the object again (`Err`: what became of it).
    async fn reread(&self, name: &str, attempt: u32) -> Option<Result<StoredSv, Outcome>> {
        tracing::debug!(
            storageversion = name,
            attempt,
            "write conflict; reading again"
        );
        self.cancellable(tokio::time::sleep(backoff(attempt + 1)))
            .await?;
        let got = self
            .call("GET storageversion", self.c.svs.get_opt(name))
            .await?;
        Some(match got {
            Ok(Some(fresh)) => Ok(fresh.trim()),
            Ok(None) => {
                self.c.metrics.check("gone");
                Err(Outcome::Done)
            }
            Err(e) => {
                self.c.metrics.error("get_storage_version");
                self.c.metrics.check("error");
                tracing::warn!(storageversion = name, error = %e, "cannot read StorageVersion after a conflict; retrying later");
                Err(Outcome::Retry)
            }
        })
    }

    fn mark_acted(&self, sv: &StoredSv) {
        if let Some(rv) = sv.resource_version() {
            lock(&self.state)
                .acted
                .insert(sv.name().to_string(), rv.to_string());
        }
    }

    /// The one write of an object, and the one place its errors are mapped.
    async fn send(&self, sv: &StoredSv, decided: &Plan) -> Option<Sent> {
        if self.token.is_cancelled() {
            return None;
        }
        let name = sv.name();
        let (operation, result) = match decided {
            Plan::Nothing => return Some(Sent::Gone),
            Plan::Rewrite { object, .. } => {
                let body = sv.with_status(object.status.clone());
                let pp = PostParams::default();
                let put = self.c.svs.replace_status(name, &pp, &body);
                (
                    "update_status",
                    self.call("PUT storageversion status", put).await?,
                )
            }
            Plan::Delete { .. } => {
                let dp = delete_params(&sv.to_model());
                let delete = self.c.svs.delete(name, &dp);
                let r = self.call("DELETE storageversion", delete).await?;
                ("delete", r.map(|_| sv.clone()))
            }
        };
        Some(match result {
            Ok(written) => {
                self.c.metrics.write(operation, "ok");
                if operation == "delete" {
                    self.c.metrics.objects_deleted.inc();
                }
                Sent::Ok(Box::new(written))
            }
            // Changed since the stored copy (an apiserver re-added itself): the resourceVersion
            // (or the delete precondition) kept it.
            Err(e) if is_status(&e, 409) => {
                self.c.metrics.write(operation, "conflict");
                Sent::Conflict
            }
            Err(e) if is_status(&e, 404) => {
                self.c.metrics.write(operation, "not_found");
                Sent::Gone
            }
            Err(e) => {
                self.c.metrics.write(operation, "error");
                self.c.metrics.error(operation);
                tracing::warn!(storageversion = name, error = %e, "{operation} failed; retrying later");
                Sent::Failed
            }
        })
    }

    fn dry_run(&self, sv: &StoredSv, decided: &Plan) {
        let (what, result) = match decided {
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
            storageversion = sv.name(),
            action = what,
            removed = %describe(decided.removed()),
            "dry run: would {what} the StorageVersion; changing nothing"
        );
    }

    /// After a successful write of `before` (into `after`, or deleted when `None`): metrics and
    /// log now, and the Event to publish after the batch.
    fn done(
        &self,
        before: &StorageVersion,
        after: Option<&StorageVersion>,
        removed: &[Removal],
    ) -> EventNote {
        for r in removed {
            let n = before
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
        let sv = after.unwrap_or(before);
        let (reason, note) = if after.is_none() {
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
        let removed = before
            .status
            .storage_versions
            .iter()
            .filter(|e| removed.iter().any(|r| r.id == e.api_server_id))
            .cloned()
            .collect();
        EventNote {
            name: sv.name().to_string(),
            reference: sv.object_ref(&()),
            reason,
            note,
            removed,
        }
    }

    /// Records a Normal Event (best effort: a failure is counted and logged).
    async fn publish(&self, note: EventNote) {
        let EventNote {
            name,
            reference,
            reason,
            note,
            ..
        } = note;
        let event = Event {
            type_: EventType::Normal,
            reason: reason.to_string(),
            note: Some(truncate(note, MAX_NOTE)),
            action: "GarbageCollect".to_string(),
            secondary: None,
        };
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
                tracing::warn!(storageversion = name, error = %e, "cannot record Event");
            }
            Some(Err(_)) => {
                self.c.metrics.error("event");
                tracing::warn!(storageversion = name, "recording an Event timed out");
            }
        }
    }
}

/// Judges a lease as the store shows it (`None`: not in the store, i.e. missing).
fn judge_stored(
    record: Option<&LeaseRecord>,
    now: Timestamp,
    expired_grace: Option<Duration>,
) -> LeaseState {
    match record {
        None => LeaseState::Missing,
        Some(r) => plan::judge_record(r, now, expired_grace),
    }
}

fn is_expired_at(now: Timestamp) -> impl Fn(&LeaseRecord) -> bool {
    move |r| r.expiry().is_none_or(|e| e <= now)
}

/// When the labelled lease `r` will count as expired beyond `grace`, on the monotonic clock
/// (None if it already does or never will).
fn expiry_instant(r: &LeaseRecord, grace: Duration, now: Timestamp) -> Option<Instant> {
    let at = r
        .expiry()?
        .checked_add(k8s_openapi::jiff::SignedDuration::try_from(grace).ok()?)
        .ok()?;
    let ahead = Duration::try_from(at.duration_since(now)).ok()?;
    Some(Instant::now() + ahead + Duration::from_millis(50))
}

fn min_opt(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
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
    fn notes_are_bounded() {
        let s = truncate("é".repeat(600), 1000);
        assert!(s.len() <= 1000 && s.ends_with("..."));
        assert_eq!(truncate("short".into(), 1000), "short");
    }

    #[tokio::test(start_paused = true)]
    async fn a_suspect_waits_for_the_grace_and_its_retries() {
        let grace = Duration::from_secs(30);
        let t0 = Instant::now();
        let mut s = Suspect::new(t0);
        assert_eq!(s.due_at(grace), t0 + grace);
        s.needs_grace = false;
        assert_eq!(s.due_at(grace), t0);
        s.retry_at = Some(t0 + Duration::from_secs(5));
        assert_eq!(s.due_at(grace), t0 + Duration::from_secs(5));
    }
}
