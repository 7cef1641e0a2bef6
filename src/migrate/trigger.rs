//! The I/O edge: while this replica leads, every `--migrate-interval` it lists the
//! StorageVersions and the migrations it created, applies [`super::decide`] to each resource,
//! creates the migrations that are due, and reports the outcome of each migration once
//! (metrics, a log line, an Event on the StorageVersion).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Resource;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::decide::{self, Decision, Seen};
use super::metrics::{MigrateMetrics, PhaseLabels, ResultLabels, StateLabels};
use super::state::{self, Memory, Record};
use super::svm::{self, Phase, StorageVersionMigration};
use crate::model::{self, StorageVersion};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Event notes are cut to this many bytes (the API limit is 1 kB).
const MAX_NOTE: usize = 1000;

/// Plain configuration of the trigger.
#[derive(Clone, Debug)]
pub struct TriggerConfig {
    pub settle: Duration,
    pub interval: Duration,
    /// Namespace and name of the state ConfigMap.
    pub namespace: String,
    pub configmap: String,
}

pub struct Trigger {
    client: kube::Client,
    cfg: TriggerConfig,
    metrics: MigrateMetrics,
    recorder: Recorder,
}

/// The StorageVersionMigration API version asked for is not served (any more).
struct NotServed;

/// What one leadership term remembers between passes.
#[derive(Default)]
struct Term {
    /// None until the state ConfigMap was read.
    memory: Option<Memory>,
    /// The memory has changes not yet written.
    dirty: bool,
    seen: HashMap<String, Seen>,
    /// Migrations whose outcome this process has reported.
    reported: HashSet<String>,
    /// Last phase logged per migration.
    phases: HashMap<String, Phase>,
    /// Last decision kind logged per StorageVersion (to log changes only).
    logged: HashMap<String, String>,
    /// The StorageVersionMigration API version found by the last discovery (outer None: not
    /// asked yet; inner None: not served), to log changes only.
    api: Option<Option<svm::ApiVersion>>,
}

impl crate::leader_task::LeaderTask for Trigger {
    const NAME: &'static str = "migration trigger";

    async fn lead(self: Arc<Self>, term: CancellationToken) {
        self.lead_term(term).await;
    }
}

impl Trigger {
    pub fn new(
        client: kube::Client,
        cfg: TriggerConfig,
        metrics: MigrateMetrics,
        identity: &str,
    ) -> Trigger {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "storageversion-webhook-migrate".to_string(),
                instance: Some(identity.to_string()),
            },
        );
        Trigger {
            client,
            cfg,
            metrics,
            recorder,
        }
    }

    /// One term: a pass every `--migrate-interval`.
    async fn lead_term(self: Arc<Self>, term: CancellationToken) {
        let mut t = Term::default();
        loop {
            // The pass is dropped the moment leadership ends: a replica that no longer leads
            // sends no further write (a request already on the wire is the one exception; the
            // leader Lease's grace is there for it).
            tokio::select! {
                biased;
                () = term.cancelled() => return,
                () = self.pass(&mut t, &term) => {}
            }
            tokio::select! {
                () = term.cancelled() => return,
                () = tokio::time::sleep(self.cfg.interval) => {}
            }
        }
    }

    /// One pass over every StorageVersion and every migration we created.
    async fn pass(&self, t: &mut Term, term: &CancellationToken) {
        if t.memory.is_none() {
            match state::load(&self.client, &self.cfg.namespace, &self.cfg.configmap).await {
                Ok(m) => t.memory = Some(m),
                Err(e) => {
                    self.metrics.error("read_state");
                    tracing::warn!(error = %format!("{e:#}"), "cannot read the migration state; nothing is decided until it can be read");
                    return;
                }
            }
        }
        let svs: Api<StorageVersion> = Api::all(self.client.clone());
        let svs = match self
            .list_within(&svs, &ListParams::default(), "list_storageversions")
            .await
        {
            Ok(items) => items,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list StorageVersions");
                return;
            }
        };
        // Our migrations, before deciding: a new one's number must be above every existing one's.
        // Without a served API version nothing is begun (decisions are still remembered).
        let api = self.discover(t).await;
        let ours = match api {
            Some(v) => match self.list_ours(v).await {
                Ok(list) => list.map(|list| (v, list)),
                Err(NotServed) => {
                    // Asked again at the next pass.
                    t.api = None;
                    None
                }
            },
            None => None,
        };
        let now = Instant::now();
        let mut counts: HashMap<&'static str, i64> = HashMap::new();
        let present: HashSet<&str> = svs.iter().map(|s| s.name()).collect();
        t.seen.retain(|k, _| present.contains(k.as_str()));
        for sv in &svs {
            if term.is_cancelled() {
                return;
            }
            let name = sv.name().to_string();
            let previous = t.memory.as_ref().and_then(|m| m.get(&name)).cloned();
            let mut record =
                Record::observe(previous.as_ref(), sv.metadata.uid.as_deref(), &sv.status);
            if let (Some((v, list)), Some(m)) = (&ours, record.migration.clone()) {
                match list.iter().find(|o| o.name() == m) {
                    Some(o) => {
                        record.created = true;
                        record.succeeded |= o.phase() == Phase::Succeeded;
                    }
                    None if !record.created => {
                        // Begun (recorded) by a leader that stopped before creating it.
                        let to = record.agreed.clone().unwrap_or_default();
                        record.created = self
                            .create(*v, sv, &m, record.sequence, "unknown", &to)
                            .await;
                    }
                    None => {}
                }
            }
            let seen = Seen::observe(t.seen.get(&name), decide::agreement(&sv.status), now);
            let decision = decide::decide(&record, &seen, now, self.cfg.settle);
            t.seen.insert(name.clone(), seen);
            *counts.entry(state_label(&decision)).or_default() += 1;
            self.log_decision(t, &name, &decision);
            if let (Decision::Migrate { from, to }, Some((v, list))) = (&decision, &ours) {
                record = self.begin(t, *v, sv, record, list, from, to).await;
            }
            if previous.as_ref() != Some(&record) {
                if let Some(m) = t.memory.as_mut() {
                    m.insert(name, record);
                    t.dirty = true;
                }
            }
        }
        for s in ["up_to_date", "settling", "disagree", "not_decodable"] {
            self.metrics
                .resources
                .get_or_create(&StateLabels { state: s })
                .set(counts.get(s).copied().unwrap_or(0));
        }
        self.save_if_dirty(t).await;
        if let Some((v, list)) = ours {
            self.follow_migrations(t, v, &list, &svs).await;
        }
        self.metrics.checks.inc();
    }

    /// Begins migration number n+1 of `sv`: records it in the state ConfigMap first (so that no
    /// leader ever begins a second one for the same need, nor reuses a name), then creates it.
    /// Returns the record to keep: begun, or as it was if the state could not be written.
    #[allow(clippy::too_many_arguments)]
    async fn begin(
        &self,
        t: &mut Term,
        v: svm::ApiVersion,
        sv: &StorageVersion,
        record: Record,
        ours: &[StorageVersionMigration],
        from: &str,
        to: &str,
    ) -> Record {
        let name = sv.name();
        let highest = ours
            .iter()
            .filter(|m| m.annotation(svm::ANNOTATION_STORAGEVERSION) == Some(name))
            .filter_map(|m| m.annotation(svm::ANNOTATION_SEQUENCE)?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let sequence = record.sequence.max(highest).saturating_add(1);
        let mname = svm::migration_name(name, to, sequence);
        let mut begun = record.begin(to, &mname, sequence);
        let Some(memory) = t.memory.as_mut() else {
            return record;
        };
        memory.insert(name.to_string(), begun.clone());
        t.dirty = true;
        if !self.save_if_dirty(t).await {
            if let Some(memory) = t.memory.as_mut() {
                memory.insert(name.to_string(), record.clone());
            }
            return record;
        }
        begun.created = self.create(v, sv, &mname, sequence, from, to).await;
        begun
    }

    /// Writes the memory if it changed; true when it is saved.
    async fn save_if_dirty(&self, t: &mut Term) -> bool {
        state::map(&self.cfg.namespace, &self.cfg.configmap)
            .save_if_dirty(&self.client, &mut t.dirty, t.memory.as_ref(), state::data, |e| {
                self.metrics.error("write_state");
                tracing::warn!(error = %format!("{e:#}"), "cannot write the migration state; retrying next pass");
            })
            .await
    }

    fn log_decision(&self, t: &mut Term, name: &str, d: &Decision) {
        let kind = format!("{d:?}")
            .split([' ', '{', '('])
            .next()
            .unwrap_or_default()
            .to_string();
        let key = match d {
            Decision::WaitSettle { to, .. } => format!("{kind}:{to}"),
            Decision::BlockedNotDecodable { version, apiserver } => {
                format!("{kind}:{version}:{apiserver}")
            }
            _ => kind,
        };
        if t.logged.get(name) == Some(&key) {
            return;
        }
        match d {
            Decision::WaitSettle {
                from,
                to,
                remaining,
            } => tracing::info!(
                storageversion = name, from = %from, to = %to, remaining = ?remaining,
                "objects may be stored in other versions; migrating once the agreement has held for the settle time"
            ),
            Decision::BlockedNotDecodable { version, apiserver } => tracing::warn!(
                storageversion = name, version = %version, apiserver = %apiserver,
                "apiservers agree on a version one of them cannot decode; no migration"
            ),
            Decision::WaitDisagree if t.logged.contains_key(name) => tracing::info!(
                storageversion = name,
                "apiservers disagree on the encoding version; no migration while they do"
            ),
            _ => {}
        }
        t.logged.insert(name.to_string(), key);
    }

    /// Creates migration `mname` (number `sequence`) of `sv` to `to`; true when it exists
    /// afterwards (created now or before, by us or another replica).
    async fn create(
        &self,
        v: svm::ApiVersion,
        sv: &StorageVersion,
        mname: &str,
        sequence: u64,
        from: &str,
        to: &str,
    ) -> bool {
        let name = sv.name();
        let Some(gr) = svm::group_resource(name) else {
            self.metrics.error("create_migration");
            tracing::warn!(
                storageversion = name,
                "StorageVersion name is not <group>.<resource>; cannot migrate it"
            );
            return false;
        };
        let obj: StorageVersionMigration = match serde_json::from_value(serde_json::json!({
            "apiVersion": v.api_version(),
            "kind": svm::KIND,
            "metadata": {
                "name": mname,
                "labels": {svm::MANAGED_BY_LABEL: svm::MANAGED_BY_VALUE},
                "annotations": {
                    svm::ANNOTATION_STORAGEVERSION: name,
                    svm::ANNOTATION_VERSION: to,
                    svm::ANNOTATION_PREVIOUS: from,
                    svm::ANNOTATION_SEQUENCE: sequence.to_string(),
                },
            },
            "spec": {"resource": gr},
        })) {
            Ok(o) => o,
            Err(e) => {
                self.metrics.error("create_migration");
                tracing::warn!(storageversion = name, error = %e, "cannot build the migration");
                return false;
            }
        };
        let api: Api<StorageVersionMigration> = Api::all_with(self.client.clone(), &v);
        let created =
            tokio::time::timeout(CALL_TIMEOUT, api.create(&PostParams::default(), &obj)).await;
        let result = match created {
            Ok(Ok(_)) => "created",
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => "exists",
            Ok(Err(e)) => {
                self.metrics.error("create_migration");
                tracing::warn!(storageversion = name, migration = %mname, error = %e, "cannot create the StorageVersionMigration");
                return false;
            }
            Err(_) => {
                self.metrics.error("create_migration");
                tracing::warn!(storageversion = name, migration = %mname, "creating the StorageVersionMigration timed out");
                return false;
            }
        };
        self.metrics
            .created
            .get_or_create(&ResultLabels { result })
            .inc();
        if result == "created" {
            tracing::info!(storageversion = name, migration = %mname, from = %from, to = %to, "created StorageVersionMigration");
            self.event(
                &sv.object_ref(&()),
                EventType::Normal,
                "MigrationCreated",
                format!("Every apiserver encodes {name} as {to} for the settle time, and objects may be stored as {from}: created StorageVersionMigration {mname}"),
            )
            .await;
        } else {
            tracing::info!(storageversion = name, migration = %mname, "StorageVersionMigration already exists; not creating another");
        }
        true
    }

    /// Lists `api` within [`CALL_TIMEOUT`]; a failure (or the timeout) is counted as an error of
    /// `operation` and returned as text.
    async fn list_within<K>(
        &self,
        api: &Api<K>,
        lp: &ListParams,
        operation: &'static str,
    ) -> Result<Vec<K>, String>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let result = match tokio::time::timeout(CALL_TIMEOUT, api.list(lp)).await {
            Ok(Ok(list)) => return Ok(list.items),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("timed out after {CALL_TIMEOUT:?}"),
        };
        self.metrics.error(operation);
        Err(result)
    }

    /// Which StorageVersionMigration API version to use this pass (None: the cluster serves
    /// neither, or discovery failed); a change is logged once. The version found is kept for the
    /// term, and discovery asked again only while none is served (so turning the API on, or an
    /// upgrade to 1.37, is noticed at the next pass) or after a list answered 404 (the version
    /// was turned off or removed).
    async fn discover(&self, t: &mut Term) -> Option<svm::ApiVersion> {
        if let Some(Some(v)) = t.api {
            return Some(v);
        }
        let found = match tokio::time::timeout(
            CALL_TIMEOUT,
            svm::ApiVersion::discover(&self.client),
        )
        .await
        {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                self.metrics.error("discover_api");
                tracing::debug!(error = %e, "cannot discover the storagemigration.k8s.io API; no migration is begun this pass");
                return None;
            }
            Err(_) => {
                self.metrics.error("discover_api");
                tracing::debug!("discovering the storagemigration.k8s.io API timed out; no migration is begun this pass");
                return None;
            }
        };
        if t.api != Some(found) {
            match found {
                Some(v) => tracing::info!(
                    api_version = v.api_version(),
                    "StorageVersionMigrations will be created in this API version"
                ),
                None => tracing::warn!(
                    "the cluster serves neither storagemigration.k8s.io/v1 (Kubernetes 1.37 and later) \
                     nor v1beta1 (1.35 and 1.36 with the StorageVersionMigrator feature gate and \
                     --runtime-config=storagemigration.k8s.io/v1beta1=true): no migration can be begun; \
                     agreements are still followed and remembered"
                ),
            }
            t.api = Some(found);
        }
        found
    }

    /// Lists our migrations (None: the list failed; `Err`: the version is not served).
    async fn list_ours(
        &self,
        v: svm::ApiVersion,
    ) -> Result<Option<Vec<StorageVersionMigration>>, NotServed> {
        let api: Api<StorageVersionMigration> = Api::all_with(self.client.clone(), &v);
        let lp = ListParams::default().labels(&format!(
            "{}={}",
            svm::MANAGED_BY_LABEL,
            svm::MANAGED_BY_VALUE
        ));
        let error = match tokio::time::timeout(CALL_TIMEOUT, api.list(&lp)).await {
            Ok(Ok(list)) => return Ok(Some(list.items)),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => return Err(NotServed),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("timed out after {CALL_TIMEOUT:?}"),
        };
        self.metrics.error("list_migrations");
        tracing::debug!(error = %error, "cannot list StorageVersionMigrations; no migration is begun this pass");
        Ok(None)
    }

    /// Sets the phase gauges from our migrations and reports each final outcome once.
    async fn follow_migrations(
        &self,
        t: &mut Term,
        v: svm::ApiVersion,
        list: &[StorageVersionMigration],
        svs: &[StorageVersion],
    ) {
        let mut by_phase: HashMap<Phase, i64> = HashMap::new();
        for m in list {
            let phase = m.phase();
            *by_phase.entry(phase).or_default() += 1;
            let name = m.name().to_string();
            if t.phases.get(&name) != Some(&phase) && !phase.is_final() {
                tracing::info!(migration = %name, phase = phase.as_str(), message = m.phase_message(), "StorageVersionMigration progress");
            }
            t.phases.insert(name.clone(), phase);
            if !phase.is_final()
                || t.reported.contains(&name)
                || m.annotation(svm::ANNOTATION_REPORTED).is_some()
            {
                continue;
            }
            self.report(v, m, phase, svs).await;
            t.reported.insert(name);
        }
        for p in Phase::ALL {
            self.metrics
                .migrations
                .get_or_create(&PhaseLabels { phase: p.as_str() })
                .set(by_phase.get(&p).copied().unwrap_or(0));
        }
    }

    async fn report(
        &self,
        v: svm::ApiVersion,
        m: &StorageVersionMigration,
        phase: Phase,
        svs: &[StorageVersion],
    ) {
        let name = m.name();
        let sv_name = m.annotation(svm::ANNOTATION_STORAGEVERSION).unwrap_or("");
        let to = m.annotation(svm::ANNOTATION_VERSION).unwrap_or("?");
        let message = m.phase_message();
        let seconds = m.duration_seconds();
        self.metrics
            .outcomes
            .get_or_create(&ResultLabels {
                result: phase.as_str(),
            })
            .inc();
        if let Some(s) = seconds {
            self.metrics.duration.observe(s);
        }
        let took = seconds
            .map(|s| format!(" after {s:.0} s"))
            .unwrap_or_default();
        let (type_, reason, note) = if phase == Phase::Failed {
            tracing::warn!(
                migration = name,
                storageversion = sv_name,
                version = to,
                message = message,
                "StorageVersionMigration failed; not re-creating it (see docs/migration.md)"
            );
            (
                EventType::Warning,
                "MigrationFailed",
                format!("StorageVersionMigration {name} to {to} failed{took}: {message}. Not retried; run `storageversion-webhook audit` for the fix"),
            )
        } else {
            tracing::info!(migration = name, storageversion = sv_name, version = to, seconds = ?seconds, "StorageVersionMigration succeeded");
            (
                EventType::Normal,
                "MigrationSucceeded",
                format!("StorageVersionMigration {name} rewrote every stored object in {to}{took}"),
            )
        };
        let reference = svs
            .iter()
            .find(|s| s.name() == sv_name)
            .map(|s| s.object_ref(&()))
            .unwrap_or_else(|| ObjectReference {
                api_version: Some(model::API_VERSION.to_string()),
                kind: Some(model::KIND.to_string()),
                name: Some(sv_name.to_string()),
                ..ObjectReference::default()
            });
        self.event(&reference, type_, reason, note).await;
        // Mark it reported, so a restart or the next leader does not report it again.
        let api: Api<StorageVersionMigration> = Api::all_with(self.client.clone(), &v);
        let patch = serde_json::json!({"metadata": {"annotations": {svm::ANNOTATION_REPORTED: phase.as_str()}}});
        match tokio::time::timeout(
            CALL_TIMEOUT,
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                self.metrics.error("mark_reported");
                tracing::warn!(migration = name, error = %e, "cannot mark the migration reported");
            }
            Err(_) => {
                self.metrics.error("mark_reported");
                tracing::warn!(migration = name, "marking the migration reported timed out");
            }
        }
    }

    async fn event(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(note, MAX_NOTE)),
            action: "Migrate".to_string(),
            secondary: None,
        };
        match tokio::time::timeout(CALL_TIMEOUT, self.recorder.publish(&event, reference)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.metrics.error("event");
                tracing::warn!(reason, error = %e, "cannot record Event");
            }
            Err(_) => {
                self.metrics.error("event");
                tracing::warn!(reason, "recording an Event timed out");
            }
        }
    }
}

fn state_label(d: &Decision) -> &'static str {
    match d {
        Decision::UpToDate | Decision::Migrate { .. } => "up_to_date",
        Decision::WaitSettle { .. } => "settling",
        Decision::WaitDisagree => "disagree",
        Decision::BlockedNotDecodable { .. } => "not_decodable",
    }
}

fn truncate(mut s: String, max: usize) -> String {
    // The last character boundary at or before `max` (0 always is one).
    let end = (0..=max.min(s.len()))
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    s.truncate(end);
    s
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn truncate_cuts_on_a_character_boundary() {
        assert_eq!(truncate("short".into(), 10), "short");
        assert_eq!(truncate("exactly".into(), 7), "exactly");
        // "é" is two bytes (4..6): a cut at 5 falls inside it and goes back to 4.
        assert_eq!(truncate("abcdéf".into(), 5), "abcd");
        assert_eq!(truncate("abcdéf".into(), 6), "abcdé");
        assert_eq!(truncate("éé".into(), 1), "");
    }
}
