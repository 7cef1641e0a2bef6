//! The I/O edge of the report: while this replica leads, judge every StorageVersion again
//! shortly after a change (debounced) and at every resync, and server-side apply the
//! ClusterReport when what it says changed.
//!
//! Inputs, all from what `serve` already has, plus one LIST where it must:
//! - StorageVersions: the garbage collector's watch-fed store ([`crate::gc::SvView`]), woken by
//!   its change counter;
//! - identity leases: the process's lease store ([`LeaseStore`]), woken by its changes; an entry
//!   naming a lease the store does not hold (missing, or without the identity label, which the
//!   store's watch filters out) is settled by one paginated LIST of the Leases in `kube-system`,
//!   at most every [`LEASE_LIST_MAX_AGE`] (and at each resync);
//! - with `--migrate`: the migration state ConfigMap and the StorageVersionMigrations, read at
//!   each resync;
//! - with `--crd-migrate`: every CRD (one paginated LIST, schemas skipped) and the CRD
//!   migrator's state ConfigMap, read at each resync ([`crate::crd::audit`]).
//!
//! On a cluster without the StorageVersion API the collector's store counts as listed (empty)
//! once the API is found not served, so the CRD findings are reported there too.
//!
//! Nothing is judged from inputs that are not there: before the StorageVersion store has listed,
//! while the lease store is not synced or stale, or when the LIST fails, the report is left as
//! it is.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::build::{self, Content};
use super::metrics::ReportMetrics;
use super::types::{ClusterReport, API_VERSION, PLURAL};
use crate::audit::{build_report, AuditOptions};
use crate::gc::SvView;
use crate::leases::{LeaseStore, StoreEvent};
use crate::migrate::state::Memory;
use crate::migrate::svm::{self, StorageVersionMigration};
use crate::model::{LeaseRecord, StorageVersion, IDENTITY_LEASE_NAMESPACE};

/// Field manager of the server-side applies.
pub const FIELD_MANAGER: &str = "storageversion-webhook-report";
/// How long after the first of a burst of changes the judgement runs (the rest of the burst
/// costs nothing more).
pub const DEBOUNCE: Duration = Duration::from_millis(500);
/// How old the LIST of kube-system Leases (for entries the lease store cannot settle) may be.
pub const LEASE_LIST_MAX_AGE: Duration = Duration::from_secs(10);
/// A lease store stale for longer is not judged from.
const LEASE_STORE_MAX_STALENESS: Duration = Duration::from_secs(60);
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const MIN_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Plain configuration of the report.
#[derive(Clone, Debug)]
pub struct ReportConfig {
    pub name: String,
    pub max_results: usize,
    pub resync_interval: Duration,
    pub lease_skew_allowance: Duration,
    pub gc_expired_lease_grace: Option<Duration>,
    /// Namespace and name of the migration state ConfigMap (with `--migrate`).
    pub migrate_state: Option<(String, String)>,
    /// Namespace and name of the CRD migrator's state ConfigMap (with `--crd-migrate`).
    pub crd_state: Option<(String, String)>,
}

pub struct Reporter {
    client: kube::Client,
    cfg: ReportConfig,
    metrics: ReportMetrics,
    leases: LeaseStore,
    svs: watch::Receiver<Option<SvView>>,
}

/// What one leadership term remembers.
#[derive(Default)]
struct Term {
    /// What the report says now, as last applied (None: not written in this term).
    written: Option<Content>,
    /// Every Lease in kube-system, when last listed.
    listed: Option<(Instant, Vec<LeaseRecord>)>,
    /// The migration state and migrations, as last read (with `--migrate`).
    migrations: Option<(Memory, Vec<StorageVersionMigration>, svm::ApiVersion)>,
    /// Every CRD and the CRD migrator's records, as last read (with `--crd-migrate`).
    crds: Option<(Vec<crate::crd::decide::Snapshot>, crate::crd::state::Memory)>,
    /// After a failed write: not before this.
    retry_at: Option<Instant>,
    backoff: Option<Duration>,
    /// The CRD was found missing (logged once per term until it is there).
    crd_missing: bool,
}

/// Why a judgement runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    Change,
    Resync,
}

impl crate::leader_task::LeaderTask for Reporter {
    const NAME: &'static str = "policy report";

    /// Its results gauges read 0 between terms.
    async fn lead(self: Arc<Self>, term: CancellationToken) {
        let _zero = ZeroOnDrop(&self.metrics);
        Arc::clone(&self).lead_term(term).await;
    }
}

impl Reporter {
    pub fn new(
        client: kube::Client,
        cfg: ReportConfig,
        metrics: ReportMetrics,
        leases: LeaseStore,
        svs: watch::Receiver<Option<SvView>>,
    ) -> Reporter {
        Reporter {
            client,
            cfg,
            metrics,
            leases,
            svs,
        }
    }

    /// One term: wait for the collector's store, then judge on changes and resyncs.
    async fn lead_term(self: Arc<Self>, term: CancellationToken) {
        let mut views = self.svs.clone();
        let view = loop {
            if let Some(v) = views.borrow_and_update().clone() {
                break v;
            }
            if views.changed().await.is_err() {
                return;
            }
        };
        // The counter is 0 until the store's first list is in. (Not `Store::wait_until_ready`:
        // its future keeps one waker, and the collector waits on it too.)
        let mut svs_changed = view.changes.clone();
        if svs_changed.wait_for(|n| *n > 0).await.is_err() {
            // The collector's term ended before its first list: nothing to judge from.
            return;
        }
        let mut leases = self.leases.subscribe();
        let mut t = Term::default();
        let mut next_resync = Instant::now();
        loop {
            let retry_at = t.retry_at;
            let why = tokio::select! {
                biased;
                () = term.cancelled() => return,
                () = tokio::time::sleep_until(next_resync) => Why::Resync,
                () = sleep_until_opt(retry_at) => Why::Change,
                changed = svs_changed.changed() => {
                    if changed.is_err() {
                        // The collector's term ended: ours ends with it.
                        return;
                    }
                    Why::Change
                }
                event = leases.recv() => match event {
                    Ok(StoreEvent::WatchFailed(_)) => continue,
                    Err(RecvError::Closed) => return,
                    Ok(StoreEvent::Changed(_)) | Err(RecvError::Lagged(_)) => Why::Change,
                },
            };
            if why == Why::Resync {
                next_resync = Instant::now() + self.cfg.resync_interval;
            } else {
                // Let the rest of a burst arrive, then judge once.
                tokio::time::sleep(DEBOUNCE).await;
                svs_changed.borrow_and_update();
                while leases.try_recv().is_ok() {}
            }
            self.metrics.judgements.inc();
            self.pass(&mut t, &view, why).await;
        }
    }

    /// One judgement, and a write if the report changed.
    async fn pass(&self, t: &mut Term, view: &SvView, why: Why) {
        // After a failed write, events still judge (metrics), but only the retry writes.
        let backing_off = match t.retry_at {
            Some(at) if Instant::now() < at => true,
            Some(_) => {
                t.retry_at = None;
                false
            }
            None => false,
        };
        if !self.leases.is_synced() || self.leases.staleness() > LEASE_STORE_MAX_STALENESS {
            tracing::debug!("identity lease store not synced or stale; report left as it is");
            t.retry_at.get_or_insert(Instant::now() + MIN_BACKOFF);
            return;
        }
        let svs: Vec<StorageVersion> = view.store.state().iter().map(|s| s.to_model()).collect();
        let Some(records) = self.lease_records(t, &svs, why).await else {
            self.retry_later(t);
            return;
        };
        let opts = AuditOptions {
            now: Timestamp::now(),
            lease_skew_allowance: self.cfg.lease_skew_allowance,
            gc_expired_lease_grace: self.cfg.gc_expired_lease_grace,
        };
        let mut report = build_report(&svs, &records, &opts);
        if let Some((namespace, configmap)) = &self.cfg.migrate_state {
            if why == Why::Resync || t.migrations.is_none() {
                match crate::migrate::audit::read(self.client.clone(), namespace, configmap).await {
                    Ok(read) => t.migrations = Some(read),
                    Err(e) => {
                        self.metrics.error("read_migrations");
                        tracing::warn!(error = %format!("{e:#}"), "cannot read the migration state for the report; its migration findings are left out");
                    }
                }
            }
            if let Some((memory, migrations, v)) = &t.migrations {
                report.stale_storage = crate::migrate::audit::judge(&svs, memory, migrations, *v);
            }
        }
        if let Some((namespace, configmap)) = &self.cfg.crd_state {
            if why == Why::Resync || t.crds.is_none() {
                match crate::crd::audit::read(self.client.clone(), namespace, configmap).await {
                    Ok(read) => t.crds = Some(read),
                    Err(e) => {
                        self.metrics.error("read_crds");
                        tracing::warn!(error = %format!("{e:#}"), "cannot read the CRDs or the CRD migrator's state for the report; its CRD findings are left out");
                    }
                }
            }
            if let Some((crds, memory)) = &t.crds {
                report.crds = crate::crd::audit::judge(crds, memory);
            }
        }
        let content = build::content(&report, &svs, self.cfg.max_results);
        self.metrics.judged(Some(&content.summary), content.omitted);
        // After a change, only new findings are worth a write (not a message that names a new
        // time); at a resync, any difference, or a stored report that is gone or was edited.
        let needed = match (&t.written, why) {
            (None, _) => true,
            (Some(w), Why::Change) => !w.same_findings(&content),
            (Some(w), Why::Resync) => *w != content || !self.stored_matches(&content).await,
        };
        if needed && !backing_off {
            self.write(t, content).await;
        }
    }

    /// Whether the stored report says what `content` says (a GET; false on any error).
    async fn stored_matches(&self, content: &Content) -> bool {
        let api: Api<ClusterReport> = Api::all(self.client.clone());
        match tokio::time::timeout(CALL_TIMEOUT, api.get_opt(&self.cfg.name)).await {
            Ok(Ok(Some(stored))) => build::matches(&stored, content),
            _ => false,
        }
    }

    /// Every lease record the judgement needs: the store's, plus (when an entry names a lease
    /// the store lacks) the LIST of kube-system's. None when that LIST failed.
    async fn lease_records(
        &self,
        t: &mut Term,
        svs: &[StorageVersion],
        why: Why,
    ) -> Option<Vec<LeaseRecord>> {
        let mut records: Vec<LeaseRecord> =
            self.leases.read(|set| set.records().cloned().collect());
        let known: std::collections::HashSet<String> =
            records.iter().map(|r| r.name.clone()).collect();
        let unknown = svs
            .iter()
            .flat_map(|sv| sv.status.storage_versions.iter())
            .any(|e| !known.contains(&e.api_server_id));
        if !unknown {
            return Some(records);
        }
        let fresh = t
            .listed
            .as_ref()
            .is_some_and(|(at, _)| why == Why::Change && at.elapsed() < LEASE_LIST_MAX_AGE);
        if !fresh {
            let api: Api<Lease> = Api::namespaced(self.client.clone(), IDENTITY_LEASE_NAMESPACE);
            let what = format!("leases in {IDENTITY_LEASE_NAMESPACE}");
            match crate::audit::fetch::list_all(&api, &what, |l: Lease| LeaseRecord::from_lease(&l))
                .await
            {
                Ok(all) => t.listed = Some((Instant::now(), all)),
                Err(e) => {
                    self.metrics.error("list_leases");
                    tracing::warn!(error = %format!("{e:#}"), "cannot list the Leases in {IDENTITY_LEASE_NAMESPACE} for the report; report left as it is");
                    return None;
                }
            }
        }
        if let Some((_, listed)) = &t.listed {
            records.extend(listed.iter().filter(|r| !known.contains(&r.name)).cloned());
        }
        Some(records)
    }

    /// Server-side apply of the whole report (forced: this field manager owns every field it
    /// sends, so there is no conflict to lose; a report deleted by someone is created again).
    async fn write(&self, t: &mut Term, content: Content) {
        let api: Api<ClusterReport> = Api::all(self.client.clone());
        let object = content.to_object(&self.cfg.name);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let sent = tokio::time::timeout(
            CALL_TIMEOUT,
            api.patch(&self.cfg.name, &params, &Patch::Apply(&object)),
        )
        .await;
        match sent {
            Ok(Ok(_)) => {
                self.metrics.write("applied");
                if t.crd_missing {
                    tracing::info!(report = %self.cfg.name, "the ClusterReport CRD is installed now; report written");
                    t.crd_missing = false;
                }
                if content.omitted > 0 && t.written.as_ref().is_none_or(|w| w.omitted == 0) {
                    tracing::warn!(
                        report = %self.cfg.name,
                        listed = content.results.len(),
                        omitted = content.omitted,
                        max_results = self.cfg.max_results,
                        "policy report truncated: the findings beyond --report-max-results (or the size bound) are only counted; run `storageversion-webhook audit` for all of them"
                    );
                }
                tracing::debug!(report = %self.cfg.name, results = content.results.len(), "policy report written");
                t.written = Some(content);
                t.backoff = None;
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
                self.metrics.write("crd_missing");
                if !t.crd_missing {
                    tracing::warn!(
                        report = %self.cfg.name,
                        "cannot write the policy report: the API {PLURAL}.{API_VERSION} is not served (is the OpenReports ClusterReport CRD clusterreports.openreports.io installed? the chart does not install it); retrying with backoff up to {MAX_BACKOFF:?}"
                    );
                    t.crd_missing = true;
                }
                self.retry_later(t);
            }
            Ok(Err(e)) => {
                self.metrics.write("error");
                self.metrics.error("apply");
                tracing::warn!(report = %self.cfg.name, error = %e, "cannot write the policy report; retrying with backoff");
                self.retry_later(t);
            }
            Err(_) => {
                self.metrics.write("error");
                self.metrics.error("apply");
                tracing::warn!(report = %self.cfg.name, "writing the policy report took longer than {CALL_TIMEOUT:?}; retrying with backoff");
                self.retry_later(t);
            }
        }
    }

    fn retry_later(&self, t: &mut Term) {
        let wait = t.backoff.map_or(MIN_BACKOFF, |b| (b * 2).min(MAX_BACKOFF));
        t.backoff = Some(wait);
        t.retry_at = Some(Instant::now() + wait);
    }
}

/// Sets the results gauges to 0 when a term's work ends or is dropped.
struct ZeroOnDrop<'a>(&'a ReportMetrics);

impl Drop for ZeroOnDrop<'_> {
    fn drop(&mut self) {
        self.0.judged(None, 0);
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
