//! The I/O edge of the CRD migrator: while this replica leads, it watches the
//! CustomResourceDefinitions, applies [`super::decide`] to each, records a migration before it
//! begins one, runs our own rewrites ([`super::rewrite`]) or creates StorageVersionMigrations,
//! follows them, and prunes `status.storedVersions` after a rewrite of ours succeeded. All of a
//! term's work is [`Migrator::lead`]: one function of the term's token.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::args::MethodChoice;
use super::decide::{self, Decision, Method, Phase, Seen};
use super::metrics::{CrdMetrics, MethodLabels, OutcomeLabels, StateLabels};
use super::prune::Pruned;
use super::rewrite::{self, Counts, Failure, Pace};
use super::state::{self, Memory};
use super::types::Crd;
use crate::migrate::svm::{self, StorageVersionMigration};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Passes are at least this far apart, however many CRD events arrive (each pass may cost a
/// discovery GET and a LIST of our StorageVersionMigrations).
const MIN_PASS_GAP: Duration = Duration::from_millis(250);
/// Label value on the StorageVersionMigrations the CRD migrator creates (the migration
/// trigger's are `storageversion-webhook`: neither follows the other's).
pub const MANAGED_BY_VALUE: &str = "storageversion-webhook-crd";
/// Annotation on those: the CRD it migrates.
pub const ANNOTATION_CRD: &str = "storageversion-webhook.io/crd";

#[derive(Clone, Debug)]
pub struct MigratorConfig {
    pub timing: decide::Timing,
    pub interval: Duration,
    pub rate: f64,
    pub method: MethodChoice,
    /// Namespace and name of the state ConfigMap.
    pub namespace: String,
    pub configmap: String,
}

pub struct Migrator {
    client: kube::Client,
    cfg: MigratorConfig,
    metrics: CrdMetrics,
    pace: Pace,
}

/// A rewrite this term runs.
struct Running {
    migration: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<Counts, Failure>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
        self.task.abort();
    }
}

/// Sets a gauge to 0 when dropped.
struct ZeroOnDrop(prometheus_client::metrics::gauge::Gauge);

impl Drop for ZeroOnDrop {
    fn drop(&mut self) {
        self.0.set(0);
    }
}

/// What one term knows between passes.
#[derive(Default)]
struct Term {
    /// The CRDs as watched (only the fields of [`Crd`]); valid once `synced`.
    crds: BTreeMap<String, Crd>,
    synced: bool,
    memory: Option<Memory>,
    dirty: bool,
    seen: HashMap<String, Seen>,
    running: HashMap<String, Running>,
    /// Last decision state logged per CRD.
    logged: HashMap<String, &'static str>,
    /// The StorageVersionMigration API version found (outer None: not asked yet).
    api: Option<Option<svm::ApiVersion>>,
}

impl crate::leader_task::LeaderTask for Migrator {
    const NAME: &'static str = "crd migrator";

    async fn lead(self: Arc<Self>, term: CancellationToken) {
        self.lead_term(term).await;
    }
}

impl Migrator {
    pub fn new(client: kube::Client, cfg: MigratorConfig, metrics: CrdMetrics) -> Migrator {
        let pace = Pace::new(cfg.rate);
        Migrator {
            client,
            cfg,
            metrics,
            pace,
        }
    }

    /// One leadership term: the watch, the passes and the rewrites, all dropped when `term` ends.
    async fn lead_term(self: Arc<Self>, term: CancellationToken) {
        // The term's rewrites stop with it (dropping `t` stops them): so does the gauge.
        let _running = ZeroOnDrop(self.metrics.running.clone());
        let mut t = Term::default();
        let wake = Arc::new(Notify::new());
        let api: Api<Crd> = Api::all(self.client.clone());
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut last_pass: Option<Instant> = None;
        loop {
            tokio::select! {
                biased;
                () = term.cancelled() => return,
                ev = events.next() => {
                    let Some(ev) = ev else { return };
                    self.fold(&mut t, ev);
                    // Take every event already there before a pass.
                    while let Some(Some(ev)) = events.next().now_or_never() {
                        self.fold(&mut t, ev);
                    }
                }
                () = wake.notified() => {}
                () = tokio::time::sleep(self.cfg.interval) => {}
            }
            if !t.synced {
                continue;
            }
            let gap = self.cfg.interval.min(MIN_PASS_GAP);
            if let Some(at) = last_pass.map(|l| l + gap).filter(|at| *at > Instant::now()) {
                tokio::select! {
                    () = term.cancelled() => return,
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            last_pass = Some(Instant::now());
            tokio::select! {
                biased;
                () = term.cancelled() => return,
                () = self.pass(&mut t, &term, &wake) => {}
            }
        }
    }

    fn fold(&self, t: &mut Term, ev: Result<watcher::Event<Crd>, watcher::Error>) {
        match ev {
            Ok(watcher::Event::Apply(c)) => {
                t.crds.insert(c.name().to_string(), c);
            }
            Ok(watcher::Event::Delete(c)) => {
                t.crds.remove(c.name());
            }
            Ok(watcher::Event::Init) => {}
            Ok(watcher::Event::InitApply(c)) => {
                // A relist: what was not listed again is gone; start over.
                if t.synced {
                    t.synced = false;
                    t.crds.clear();
                }
                t.crds.insert(c.name().to_string(), c);
            }
            Ok(watcher::Event::InitDone) => t.synced = true,
            Err(e) => {
                self.metrics.error("watch_crds");
                tracing::debug!(error = %e, "CustomResourceDefinition watch error; retrying");
            }
        }
    }

    async fn pass(&self, t: &mut Term, term: &CancellationToken, wake: &Arc<Notify>) {
        if t.memory.is_none() {
            match state::load(&self.client, &self.cfg.namespace, &self.cfg.configmap).await {
                Ok(m) => t.memory = Some(m),
                Err(e) => {
                    self.metrics.error("read_state");
                    tracing::warn!(error = %format!("{e:#}"), "cannot read the CRD migration state; nothing is decided until it can be read");
                    return;
                }
            }
        }
        // CRDs that are gone: their rewrites stop, their records go (nothing left behind).
        t.running.retain(|name, _| t.crds.contains_key(name));
        t.seen.retain(|name, _| t.crds.contains_key(name));
        if let Some(m) = t.memory.as_mut() {
            let before = m.len();
            m.retain(|name, _| t.crds.contains_key(name));
            t.dirty |= m.len() != before;
        }
        self.collect_rewrites(t).await;
        let api = self.discover(t).await;
        let ours = match api {
            Some(v) => self.list_ours(v).await.map(|l| (v, l)),
            None => None,
        };
        let method = match (self.cfg.method, api, &ours) {
            (MethodChoice::Rewrite, _, _) => Some(Method::Rewrite),
            (_, Some(_), Some(_)) => Some(Method::Svm),
            // Served, but our migrations cannot be listed now: begin nothing this pass.
            (_, Some(_), None) => None,
            (MethodChoice::Auto, None, _) => Some(Method::Rewrite),
            (MethodChoice::Svm, None, _) => None,
        };
        let now = Instant::now();
        let mut counts: HashMap<&'static str, i64> = HashMap::new();
        let names: Vec<String> = t.crds.keys().cloned().collect();
        for name in names {
            // Cancelled, or a write without a good answer dropped the record (`act`): nothing
            // more is decided on a record this pass cannot trust.
            if term.is_cancelled() || t.memory.is_none() {
                return;
            }
            let Some(crd) = t.crds.get(&name).cloned() else {
                continue;
            };
            let snap = crd.snapshot();
            let seen = Seen::observe(t.seen.get(&name), &snap, now);
            let record = t.memory.as_ref().and_then(|m| m.get(&name)).cloned();
            let highest = ours
                .as_ref()
                .map(|(_, l)| highest_sequence(l, &name, &snap.uid))
                .unwrap_or(0);
            let timing = self.cfg.timing;
            let decide_on = |record: Option<&decide::Record>| {
                decide::decide(&snap, record, &seen, now, timing, method, highest)
            };
            let mut decision = decide_on(record.as_ref());
            // A StorageVersionMigration of ours that ended: record its outcome, decide again.
            if decision == Decision::Run {
                if let (Some(m), Some((_, list))) = (
                    record.as_ref().and_then(|r| r.migration.as_ref()),
                    ours.as_ref(),
                ) {
                    if m.method == Method::Svm {
                        if let Some(found) = list.iter().find(|o| o.name() == m.name) {
                            let phase = match found.phase() {
                                svm::Phase::Succeeded => Some(Phase::Succeeded),
                                svm::Phase::Failed => Some(Phase::Failed),
                                _ => None,
                            };
                            if let Some(p) = phase {
                                let message = found.phase_message().to_string();
                                self.end(t, &name, &m.name, Method::Svm, p, message);
                                let record = t.memory.as_ref().and_then(|m| m.get(&name)).cloned();
                                decision = decide_on(record.as_ref());
                            }
                        }
                    }
                }
            }
            t.seen.insert(name.clone(), seen.after(&decision, now));
            *counts.entry(decision.state()).or_default() += 1;
            self.log_decision(t, &name, &decision);
            self.act(t, &crd, &decision, ours.as_ref(), wake).await;
        }
        for s in [
            "not_ready",
            "up_to_date",
            "settling",
            "migrating",
            "prune_pending",
            "failed",
            "no_method",
        ] {
            self.metrics
                .crds
                .get_or_create(&StateLabels { state: s })
                .set(counts.get(s).copied().unwrap_or(0));
        }
        self.metrics.running.set(t.running.len() as i64);
        self.save_if_dirty(t).await;
        self.metrics.checks.inc();
    }

    async fn act(
        &self,
        t: &mut Term,
        crd: &Crd,
        decision: &Decision,
        ours: Option<&(svm::ApiVersion, Vec<StorageVersionMigration>)>,
        wake: &Arc<Notify>,
    ) {
        let name = crd.name().to_string();
        let record = t.memory.as_ref().and_then(|m| m.get(&name)).cloned();
        let migration = record.as_ref().and_then(|r| r.migration.clone());
        match decision {
            Decision::Start { sequence, method } => {
                let snap = crd.snapshot();
                let storage = snap.storage.clone().unwrap_or_default();
                let mname = super::migration_name(&name, &snap.uid, &storage, *sequence);
                let Some(mut begun) = decide::Record::begin(&snap, &mname, *sequence, *method)
                else {
                    return;
                };
                // A retry after a failure keeps the count of failures in a row (the next wait).
                begun.failures =
                    decide::Record::of(record.as_ref(), &snap).map_or(0, |r| r.failures);
                // The end of the previous migration (found in this pass) is written first, so
                // the record shows every migration's end before the next begins (I8).
                if !self.save_if_dirty(t).await {
                    return;
                }
                // Recorded before it begins: no leader begins a second one for this need, and
                // the name is never used again.
                let Some(memory) = t.memory.as_mut() else {
                    return;
                };
                memory.insert(name.clone(), begun);
                t.dirty = true;
                if !self.save_if_dirty(t).await {
                    // A write without a good answer may still have been applied: the record is
                    // read again next pass (a recorded migration with no task is resumed under
                    // its name), never guessed from memory, so no number is used twice (I8).
                    t.memory = None;
                    t.dirty = false;
                    return;
                }
                self.metrics
                    .started
                    .get_or_create(&MethodLabels {
                        method: method.as_str(),
                    })
                    .inc();
                tracing::info!(crd = %name, migration = %mname, method = method.as_str(), to = %storage,
                    stored = ?snap.stored, "CRD migration begun");
                match method {
                    Method::Rewrite => self.spawn_rewrite(t, crd, &mname, wake),
                    Method::Svm => {
                        if let Some((v, _)) = ours {
                            self.create_svm(*v, crd, &mname, *sequence, &storage).await;
                        }
                    }
                }
            }
            Decision::Run => {
                let Some(m) = migration else { return };
                match m.method {
                    Method::Rewrite => {
                        if t.running.get(&name).map(|r| r.migration.as_str()) != Some(&m.name) {
                            tracing::info!(crd = %name, migration = %m.name, "resuming the CRD rewrite (begun in an earlier term)");
                            self.spawn_rewrite(t, crd, &m.name, wake);
                        }
                    }
                    Method::Svm => {
                        // Recorded by a leader that stopped before creating it: create it now.
                        if let Some((v, list)) = ours {
                            if !list.iter().any(|o| o.name() == m.name) {
                                self.create_svm(*v, crd, &m.name, m.sequence, &m.storage)
                                    .await;
                            }
                        }
                    }
                }
            }
            Decision::Abandon { reason } => {
                let Some(m) = migration else { return };
                t.running.remove(&name);
                tracing::info!(crd = %name, migration = %m.name, reason = %reason,
                    "CRD changed during its migration: stopped; nothing is pruned on it");
                self.end(
                    t,
                    &name,
                    &m.name,
                    m.method,
                    Phase::Abandoned,
                    reason.clone(),
                );
            }
            Decision::Prune { .. } => self.prune(t, &name).await,
            _ => {}
        }
    }

    fn spawn_rewrite(&self, t: &mut Term, crd: &Crd, migration: &str, wake: &Arc<Notify>) {
        let name = crd.name().to_string();
        let Some(target) = crd.target() else {
            self.end(
                t,
                &name,
                migration,
                Method::Rewrite,
                Phase::Failed,
                "no version of the CRD is served".to_string(),
            );
            return;
        };
        let stop = CancellationToken::new();
        let wake = Arc::clone(wake);
        let work = rewrite::rewrite(
            self.client.clone(),
            target,
            self.pace.clone(),
            self.metrics.clone(),
            stop.clone(),
        );
        let task = tokio::spawn(async move {
            let r = work.await;
            wake.notify_one();
            r
        });
        t.running.insert(
            name,
            Running {
                migration: migration.to_string(),
                stop,
                task,
            },
        );
    }

    /// Records the outcome of every rewrite of this term that ended.
    async fn collect_rewrites(&self, t: &mut Term) {
        let done: Vec<String> = t
            .running
            .iter()
            .filter(|(_, r)| r.task.is_finished())
            .map(|(k, _)| k.clone())
            .collect();
        for name in done {
            let Some(mut r) = t.running.remove(&name) else {
                continue;
            };
            let result = match (&mut r.task).await {
                Ok(result) => result,
                Err(e) => Err(Failure::Error(format!("the rewrite task ended: {e}"))),
            };
            let migration = r.migration.clone();
            match result {
                Ok(c) => {
                    tracing::info!(crd = %name, migration = %migration, rewritten = c.rewritten,
                        gone = c.gone, conflicts = c.conflicts, "CRD rewrite succeeded");
                    self.end(
                        t,
                        &name,
                        &migration,
                        Method::Rewrite,
                        Phase::Succeeded,
                        String::new(),
                    );
                }
                Err(Failure::Stopped) => {}
                // Gone: the CRD is being deleted (its record goes with it, or the next pass
                // abandons the migration); if it is not, its resource is not served, which a
                // new try each pass would not mend.
                Err(Failure::Gone) => {
                    let deleting = t.crds.get(&name).is_none_or(|c| c.snapshot().terminating);
                    if !deleting {
                        let e = "the resource is not served (404 on its list)".to_string();
                        tracing::warn!(crd = %name, migration = %migration, error = %e, "CRD rewrite failed");
                        self.end(t, &name, &migration, Method::Rewrite, Phase::Failed, e);
                    }
                }
                Err(Failure::Error(e)) => {
                    tracing::warn!(crd = %name, migration = %migration, error = %e,
                        "CRD rewrite failed; storedVersions is left alone (see docs/crd.md)");
                    self.end(t, &name, &migration, Method::Rewrite, Phase::Failed, e);
                }
            }
        }
    }

    /// Records that migration `migration` of `name` ended in `phase` (if it is still the one
    /// recorded).
    fn end(
        &self,
        t: &mut Term,
        name: &str,
        migration: &str,
        method: Method,
        phase: Phase,
        message: String,
    ) {
        let Some(r) = t.memory.as_mut().and_then(|m| m.get_mut(name)) else {
            return;
        };
        let Some(m) = r
            .migration
            .as_mut()
            .filter(|m| m.name == migration && m.phase == Phase::Running)
        else {
            return;
        };
        m.phase = phase;
        m.message = message;
        r.failures = match phase {
            Phase::Failed => r.failures.saturating_add(1),
            Phase::Succeeded => 0,
            Phase::Running | Phase::Abandoned => r.failures,
        };
        t.dirty = true;
        self.metrics
            .outcomes
            .get_or_create(&OutcomeLabels {
                method: method.as_str(),
                result: phase.as_str(),
            })
            .inc();
    }

    /// Prunes storedVersions ([`super::prune`]); the next pass decides again whatever happened.
    ///
    /// The record's success is written first: a CRD whose storedVersions shows the prune
    /// also shows, in the state ConfigMap, the migration that allowed it. If that write
    /// fails, nothing is pruned this pass.
    async fn prune(&self, t: &mut Term, name: &str) {
        if !self.save_if_dirty(t).await {
            return;
        }
        let record = t.memory.as_ref().and_then(|m| m.get(name));
        match super::prune::prune(&self.client, name, record).await {
            Pruned::Pruned { from, to } => {
                self.metrics.prune("pruned");
                tracing::info!(crd = name, from = ?from, to = ?to, "pruned status.storedVersions");
            }
            Pruned::NotNeeded => {}
            Pruned::Conflict => {
                self.metrics.prune("conflict");
                tracing::info!(
                    crd = name,
                    "the CRD changed before the prune; deciding again"
                );
            }
            Pruned::Failed(e) => {
                self.metrics.prune("failed");
                tracing::warn!(crd = name, error = %e, "cannot prune status.storedVersions");
            }
        }
    }

    async fn create_svm(
        &self,
        v: svm::ApiVersion,
        crd: &Crd,
        mname: &str,
        sequence: u64,
        to: &str,
    ) {
        let obj: StorageVersionMigration = match serde_json::from_value(serde_json::json!({
            "apiVersion": v.api_version(),
            "kind": svm::KIND,
            "metadata": {
                "name": mname,
                "labels": {svm::MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                "annotations": {
                    ANNOTATION_CRD: crd.name(),
                    svm::ANNOTATION_VERSION: to,
                    svm::ANNOTATION_SEQUENCE: sequence.to_string(),
                    super::ANNOTATION_CRD_UID: crd.metadata.uid.clone().unwrap_or_default(),
                },
            },
            "spec": {"resource": {"group": crd.spec.group, "resource": crd.spec.names.plural}},
        })) {
            Ok(o) => o,
            Err(e) => {
                self.metrics.error("create_migration");
                tracing::warn!(crd = crd.name(), error = %e, "cannot build the StorageVersionMigration");
                return;
            }
        };
        let api: Api<StorageVersionMigration> = Api::all_with(self.client.clone(), &v);
        match tokio::time::timeout(CALL_TIMEOUT, api.create(&PostParams::default(), &obj)).await {
            Ok(Ok(_)) => tracing::info!(
                crd = crd.name(),
                migration = mname,
                "created StorageVersionMigration"
            ),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {}
            Ok(Err(e)) => {
                self.metrics.error("create_migration");
                tracing::warn!(crd = crd.name(), migration = mname, error = %e, "cannot create the StorageVersionMigration");
            }
            Err(_) => self.metrics.error("create_migration"),
        }
    }

    /// Which StorageVersionMigration API version is served (asked while none is, as the
    /// migration trigger does; `--crd-migrate-method=rewrite` never asks).
    async fn discover(&self, t: &mut Term) -> Option<svm::ApiVersion> {
        if self.cfg.method == MethodChoice::Rewrite {
            return None;
        }
        if let Some(Some(v)) = t.api {
            return Some(v);
        }
        let found =
            match tokio::time::timeout(CALL_TIMEOUT, svm::ApiVersion::discover(&self.client)).await
            {
                Ok(Ok(found)) => found,
                _ => {
                    self.metrics.error("discover_api");
                    return None;
                }
            };
        if t.api != Some(found) {
            match found {
                Some(v) => tracing::info!(api_version = v.api_version(),
                    "CRD migrations use StorageVersionMigrations (kube-controller-manager's migrator rewrites and prunes)"),
                None => tracing::info!(
                    "no StorageVersionMigration API is served: CRD migrations rewrite objects themselves"),
            }
            t.api = Some(found);
        }
        found
    }

    async fn list_ours(&self, v: svm::ApiVersion) -> Option<Vec<StorageVersionMigration>> {
        let api: Api<StorageVersionMigration> = Api::all_with(self.client.clone(), &v);
        let lp = ListParams::default().labels(&format!(
            "{}={}",
            svm::MANAGED_BY_LABEL,
            MANAGED_BY_VALUE
        ));
        match tokio::time::timeout(CALL_TIMEOUT, api.list(&lp)).await {
            Ok(Ok(list)) => Some(list.items),
            _ => {
                self.metrics.error("list_migrations");
                None
            }
        }
    }

    async fn save_if_dirty(&self, t: &mut Term) -> bool {
        state::map(&self.cfg.namespace, &self.cfg.configmap)
            .save_if_dirty(&self.client, &mut t.dirty, t.memory.as_ref(), state::data, |e| {
                self.metrics.error("write_state");
                tracing::warn!(error = %format!("{e:#}"), "cannot write the CRD migration state; retrying next pass");
            })
            .await
    }

    fn log_decision(&self, t: &mut Term, name: &str, d: &Decision) {
        let state = d.state();
        if t.logged.get(name) == Some(&state) {
            return;
        }
        match d {
            Decision::Settle { remaining } => tracing::info!(crd = name, remaining = ?remaining,
                "storedVersions lists versions besides the storage version; migrating once the CRD has held still for the settle time"),
            Decision::AwaitPrune => tracing::info!(crd = name,
                grace = ?decide::KCM_PRUNE_GRACE,
                "our StorageVersionMigration succeeded; kube-controller-manager's migrator prunes storedVersions (if it has not within the grace, as 1.35's never does, we prune)"),
            Decision::Failed { retry_in } => tracing::warn!(crd = name, retry_in = ?retry_in,
                "the last migration of this CRD failed; storedVersions is left alone, and the migration is tried again after the wait (or after the settle time once the CRD changes)"),
            Decision::NoMethod => tracing::warn!(crd = name,
                "a migration is needed but --crd-migrate-method=svm and no StorageVersionMigration API is served"),
            _ => {}
        }
        t.logged.insert(name.to_string(), state);
    }
}

/// The highest number of our StorageVersionMigrations of CRD `name` (object `uid`).
fn highest_sequence(list: &[StorageVersionMigration], name: &str, uid: &str) -> u64 {
    list.iter()
        .filter(|m| m.annotation(ANNOTATION_CRD) == Some(name))
        .filter(|m| m.annotation(super::ANNOTATION_CRD_UID) == Some(uid))
        .filter_map(|m| m.annotation(svm::ANNOTATION_SEQUENCE)?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}
