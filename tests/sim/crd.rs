//! The custom-resource side of the simulated world (issue 31): two CustomResourceDefinitions
//! whose storage version users flip among three versions, whose spec they change otherwise (a
//! new generation), which they delete (the objects go, then the CRD) and create again (a new
//! uid); objects written, rewritten and deleted through apiservers that see a CRD change up to
//! [`WRITER_LAG`] late (so a write just after a flip may still be stored in the old version,
//! as on a real HA control plane); kube-controller-manager's migrator running the
//! StorageVersionMigrations made for CRDs (ours and, now and then, a user's), failing some
//! while the chaos lasts, and pruning `storedVersions` after a success as 1.36 and later do
//! (or, per seed, never, as 1.35). The replicas run the real CRD migrator (`crd::spawn`), by
//! StorageVersionMigration or by their own rewrite, per seed.
//!
//! Invariants (docs/crd.md):
//! - **I7** at every commit of a CRD or a custom object (`Cluster::check_i7`): no object is
//!   stored in a version its CRD's `storedVersions` does not list.
//! - **I8** at most one migration per CRD object at a time, and never two creators for one need:
//!   every write of the state ConfigMap is read; a migration begun while the CRD's previous one
//!   is recorded `running`, a second migration for the same need (uid, generation, storage
//!   version, storedVersions) unless the earlier one failed, or a number not above every
//!   earlier one, is a violation; and no StorageVersionMigration of ours is created while
//!   another of ours for the same CRD object has not ended.
//! - **I7/I8 at quiescence** (liveness): every CRD's `storedVersions` is exactly its storage
//!   version and every object is stored in it (unless a failed migration's retry is still
//!   waiting its backoff), and `audit`'s CRD judgement agrees.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use storageversion_webhook::crd::decide::{retry_wait, Phase, Record};
use storageversion_webhook::crd::{self, CrdArgs};

use super::api::{
    self, cr_table, crd_name, storage_of, stored_versions_of, Cluster, CRDS, CRD_STATE, CR_GROUP,
    SVMS,
};
use super::rng::Rng;

pub const PLURALS: [&str; 2] = ["widgets", "gadgets"];
pub const VERSIONS: [&str; 3] = ["v1beta1", "v1", "v2"];
/// The CRD migrator's settle time, interval and first retry wait here.
pub const CRD_SETTLE: Duration = Duration::from_secs(60);
pub const CRD_INTERVAL: Duration = Duration::from_secs(10);
pub const CRD_RETRY: Duration = Duration::from_secs(60);
/// An apiserver sees a CRD change at most this late (a write through it in that time is stored
/// in the storage version it still has).
pub const WRITER_LAG: Duration = Duration::from_secs(8);
/// Objects per CRD at most.
const OBJECTS: u64 = 24;
/// I6: calls allowed for each migration begun in the last two minutes, plus per object of its CRD.
pub const I6_PER_MIGRATION: usize = 12;
pub const I6_PER_MIGRATED_OBJECT: usize = 3;

/// What the CRD world does next (scheduled on the world's agenda).
#[derive(Clone, Debug)]
pub enum CrdAction {
    /// A user changes one CRD: flips its storage version, changes its spec otherwise, deletes it,
    /// or creates a StorageVersionMigration for it.
    Change,
    /// An object of a CRD written, rewritten or deleted through some apiserver.
    Write,
    /// The deletion of CRD `plural` (object `uid`) finishes: its objects go, then the CRD.
    Gone { plural: String, uid: String },
    /// CRD `plural` is created (again).
    Create { plural: String },
}

/// One migration seen begun in the state ConfigMap (I8).
struct Begun {
    uid: String,
    need: (i64, String, Vec<String>),
    phase: Phase,
}

pub struct CrdWorld {
    rng: Rng,
    /// `--crd-migrate-method` of every replica this seed.
    method: crd::args::MethodChoice,
    /// kube-controller-manager prunes after a success (1.36 and later) or not (1.35).
    kcm_prunes: bool,
    /// plural -> the storage versions of the current CRD object, with since when.
    history: BTreeMap<String, Vec<(Duration, String)>>,
    /// Migration name -> what it was begun for, and its last recorded phase.
    begun: BTreeMap<String, Begun>,
    /// CRD name -> the migration its record last named.
    recorded: BTreeMap<String, String>,
    /// Highest number begun per CRD object.
    numbers: BTreeMap<String, u64>,
    state_checked: usize,
    created_checked: usize,
    /// When each migration began, with its CRD's object count then (I6's allowance).
    pub begins: Vec<(Duration, usize)>,
    user_svms: u64,
    note: u64,
}

impl CrdWorld {
    pub fn new(seed: u64) -> CrdWorld {
        // Its own stream: the StorageVersion world's draws are the same with or without CRDs.
        let mut rng = Rng::new(seed ^ 0xC4D0_0C4D_0C4D_0C4D);
        let method = if rng.chance(50) {
            crd::args::MethodChoice::Auto
        } else {
            crd::args::MethodChoice::Rewrite
        };
        let kcm_prunes = rng.chance(75);
        CrdWorld {
            rng,
            method,
            kcm_prunes,
            history: BTreeMap::new(),
            begun: BTreeMap::new(),
            recorded: BTreeMap::new(),
            numbers: BTreeMap::new(),
            state_checked: 0,
            created_checked: 0,
            begins: Vec::new(),
            user_svms: 0,
            note: 0,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "CRD migrator method {:?}, kube-controller-manager {}",
            self.method,
            if self.kcm_prunes {
                "prunes (1.36+)"
            } else {
                "never prunes (1.35)"
            }
        )
    }

    /// The flags of a replica's CRD migrator.
    pub fn args(&self) -> CrdArgs {
        CrdArgs {
            crd_migrate: true,
            crd_migrate_settle: CRD_SETTLE,
            crd_migrate_interval: CRD_INTERVAL,
            crd_migrate_retry: CRD_RETRY,
            crd_migrate_method: self.method,
            ..CrdArgs::default()
        }
    }

    pub fn secs(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_secs(self.rng.range(lo, hi))
    }

    /// Creates CRD `plural` (storage a random version, every version served) with a few
    /// objects.
    pub fn create(&mut self, c: &mut Cluster, plural: &str) {
        let storage = VERSIONS[self.rng.range(0, 2) as usize];
        let kind = format!(
            "{}{}",
            plural[..1].to_uppercase(),
            &plural[1..plural.len() - 1]
        );
        let versions: Vec<Value> = VERSIONS
            .iter()
            .map(|v| json!({"name": v, "served": true, "storage": *v == storage}))
            .collect();
        let obj = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": crd_name(plural), "generation": 1},
            "spec": {"group": CR_GROUP, "scope": "Cluster",
                     "names": {"plural": plural, "kind": kind}, "versions": versions},
            "status": {"storedVersions": [storage],
                       "conditions": [{"type": "Established", "status": "True"}]},
        });
        c.commit(CRDS, &crd_name(plural), Some(obj));
        let at = c.at();
        self.history
            .insert(plural.to_string(), vec![(at, storage.to_string())]);
        let n = self.rng.range(3, OBJECTS);
        for k in 0..n {
            self.put_object(c, plural, &format!("o-{k}"), storage);
        }
        c.note(format!(
            "W created CRD {} stored in {storage}, {n} objects",
            crd_name(plural)
        ));
    }

    fn put_object(&mut self, c: &mut Cluster, plural: &str, name: &str, version: &str) {
        let table = cr_table(plural);
        let mut obj = c
            .get(&table, name)
            .cloned()
            .unwrap_or_else(|| json!({"metadata": {"name": name}, "spec": {"n": 0}}));
        let n = obj["spec"]["n"].as_u64().unwrap_or(0) + 1;
        obj["spec"]["n"] = json!(n);
        obj["apiVersion"] = json!(format!("{CR_GROUP}/{version}"));
        c.cr_stored
            .entry(plural.to_string())
            .or_default()
            .insert(name.to_string(), version.to_string());
        c.commit(&table, name, Some(obj));
    }

    /// A CRD change as kube-apiserver applies a spec update: a new generation, and the
    /// storage version added to storedVersions if it is not there.
    fn update_spec(&mut self, c: &mut Cluster, plural: &str, change: impl FnOnce(&mut Value)) {
        let Some(mut crd) = c.get(CRDS, &crd_name(plural)).cloned() else {
            return;
        };
        let before = crd["spec"].clone();
        change(&mut crd["spec"]);
        if crd["spec"] == before {
            return;
        }
        let generation = crd["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
        crd["metadata"]["generation"] = json!(generation);
        if let Some(storage) = storage_of(&crd) {
            let mut stored = stored_versions_of(&crd);
            if !stored.contains(&storage) {
                stored.push(storage.clone());
                crd["status"]["storedVersions"] = json!(stored);
            }
            let at = c.at();
            let h = self.history.entry(plural.to_string()).or_default();
            if h.last().map(|x| &x.1) != Some(&storage) {
                h.push((at, storage));
            }
        }
        c.commit(CRDS, &crd_name(plural), Some(crd));
    }

    fn live(c: &Cluster, plural: &str) -> Option<Value> {
        c.get(CRDS, &crd_name(plural))
            .filter(|crd| crd["metadata"]["deletionTimestamp"].is_null())
            .cloned()
    }

    /// Applies `action`; returns what to schedule next (delay, action).
    pub fn apply(
        &mut self,
        c: &mut Cluster,
        action: CrdAction,
        quiet: bool,
    ) -> Vec<(Duration, CrdAction)> {
        let mut next = Vec::new();
        match action {
            CrdAction::Change => {
                if quiet {
                    return next;
                }
                let plural = PLURALS[self.rng.range(0, 1) as usize];
                next.push((self.secs(30, 300), CrdAction::Change));
                let Some(crd) = Self::live(c, plural) else {
                    return next;
                };
                let roll = self.rng.range(0, 99);
                match roll {
                    // Flip the storage version.
                    0..=44 => {
                        let current = storage_of(&crd).unwrap_or_default();
                        let others: Vec<&str> =
                            VERSIONS.iter().copied().filter(|v| *v != current).collect();
                        let to = others[self.rng.range(0, 1) as usize].to_string();
                        c.note(format!("W {plural}: storage {current} -> {to}"));
                        self.update_spec(c, plural, |spec| {
                            if let Some(vs) = spec["versions"].as_array_mut() {
                                for v in vs {
                                    let storage = v["name"] == to.as_str();
                                    v["storage"] = json!(storage);
                                }
                            }
                        });
                    }
                    // Another spec change (a printer column): a new generation.
                    45..=69 => {
                        self.note += 1;
                        let n = self.note;
                        c.note(format!("W {plural}: spec change (generation)"));
                        self.update_spec(c, plural, |spec| {
                            spec["versions"][0]["additionalPrinterColumns"] = json!([
                                {"name": format!("n{n}"), "type": "string", "jsonPath": ".spec.n"}
                            ]);
                        });
                    }
                    // Deleted: the objects go a few seconds later, then the CRD.
                    70..=84 => {
                        let mut crd = crd;
                        crd["metadata"]["deletionTimestamp"] = json!(api::now_text());
                        if let Some(cs) = crd["status"]["conditions"].as_array_mut() {
                            cs.push(json!({"type": "Terminating", "status": "True"}));
                        }
                        let uid = crd["metadata"]["uid"].as_str().unwrap_or("").to_string();
                        c.note(format!("W {plural}: CRD deleted"));
                        c.commit(CRDS, &crd_name(plural), Some(crd));
                        next.push((
                            self.secs(2, 15),
                            CrdAction::Gone {
                                plural: plural.to_string(),
                                uid,
                            },
                        ));
                    }
                    // A user's StorageVersionMigration (not ours): kube-controller-manager runs
                    // it, and prunes after it as after ours. Not within a writer's lag of a
                    // flip (kube-controller-manager does not settle; that race is upstream's).
                    _ => {
                        let since = self
                            .history
                            .get(plural)
                            .and_then(|h| h.last())
                            .map_or(Duration::ZERO, |x| x.0);
                        if c.at() < since + WRITER_LAG * 2 {
                            return next;
                        }
                        self.user_svms += 1;
                        let name = format!("user-{plural}-{}", self.user_svms);
                        c.note(format!("W a user creates StorageVersionMigration {name}"));
                        c.commit(
                            SVMS,
                            &name,
                            Some(json!({
                                "apiVersion": "storagemigration.k8s.io/v1",
                                "kind": "StorageVersionMigration",
                                "metadata": {"name": name},
                                "spec": {"resource": {"group": CR_GROUP, "resource": plural}},
                            })),
                        );
                    }
                }
            }
            CrdAction::Write => {
                next.push((self.secs(3, 40), CrdAction::Write));
                let plural = PLURALS[self.rng.range(0, 1) as usize];
                if Self::live(c, plural).is_none() {
                    return next;
                }
                let name = format!("o-{}", self.rng.range(0, OBJECTS - 1));
                let exists = c.get(&cr_table(plural), &name).is_some();
                if exists && self.rng.chance(20) {
                    c.cr_stored.get_mut(plural).map(|m| m.remove(&name));
                    c.note(format!("W {plural}/{name} deleted"));
                    c.commit(&cr_table(plural), &name, None);
                    return next;
                }
                // Through an apiserver that may not have seen the CRD's last change yet.
                let lag = Duration::from_millis(500 * self.rng.range(0, 16)).min(WRITER_LAG);
                let seen_at = c.at().saturating_sub(lag);
                let version = self
                    .history
                    .get(plural)
                    .and_then(|h| h.iter().rev().find(|(t, _)| *t <= seen_at).or(h.first()))
                    .map(|x| x.1.clone())
                    .unwrap_or_default();
                c.note(format!(
                    "W {plural}/{name} written in {version} (lag {lag:?})"
                ));
                self.put_object(c, plural, &name, &version);
            }
            CrdAction::Gone { plural, uid } => {
                let table = cr_table(&plural);
                let names: Vec<String> = c
                    .table(&table)
                    .map(|t| t.keys().cloned().collect())
                    .unwrap_or_default();
                for n in names {
                    c.cr_stored.get_mut(&plural).map(|m| m.remove(&n));
                    c.commit(&table, &n, None);
                }
                let same = c
                    .get(CRDS, &crd_name(&plural))
                    .is_some_and(|crd| crd["metadata"]["uid"] == uid.as_str());
                if same {
                    c.commit(CRDS, &crd_name(&plural), None);
                }
                self.history.remove(&plural);
                c.note(format!("W {plural}: CRD and its objects gone"));
                next.push((self.secs(20, 600), CrdAction::Create { plural }));
            }
            CrdAction::Create { plural } => {
                if c.get(CRDS, &crd_name(&plural)).is_none() {
                    self.create(c, &plural);
                }
            }
        }
        next
    }

    /// kube-controller-manager's migrator on a StorageVersionMigration of a custom resource,
    /// when it starts running it: it marks the CRD (`StorageMigrating`, which moves the CRD's
    /// resourceVersion) and remembers the generation.
    pub fn kcm_start(&mut self, c: &mut Cluster, svm: &mut Value) {
        let plural = svm["spec"]["resource"]["resource"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let Some(mut crd) = c.get(CRDS, &crd_name(&plural)).cloned() else {
            return;
        };
        let generation = crd["metadata"]["generation"].as_i64().unwrap_or(0);
        svm["metadata"]["annotations"]["sim/generation"] = json!(generation.to_string());
        let mut conds: Vec<Value> = crd["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conds.retain(|c| c["type"] != "StorageMigrating");
        conds.push(json!({"type": "StorageMigrating", "status": "True",
                          "observedGeneration": generation}));
        crd["status"]["conditions"] = json!(conds);
        c.commit(CRDS, &crd_name(&plural), Some(crd));
    }

    /// ... and when it ends: every object rewritten in the storage version (or, while the chaos
    /// lasts, now and then a failure), then, where it prunes, storedVersions set to the storage
    /// version if the CRD's generation is still the one it began with.
    pub fn kcm_finish(&mut self, c: &mut Cluster, name: &str, svm: &mut Value, quiet: bool) {
        let plural = svm["spec"]["resource"]["resource"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let crd = Self::live(c, &plural);
        let began: Option<i64> = svm["metadata"]["annotations"]["sim/generation"]
            .as_str()
            .and_then(|g| g.parse().ok());
        let fail = |svm: &mut Value, why: &str| {
            svm["status"]["conditions"] = json!([
                {"type": "Running", "status": "False", "lastTransitionTime": api::now_text(), "reason": "Done", "message": "done"},
                {"type": "Failed", "status": "True", "lastTransitionTime": api::now_text(), "reason": "Failed", "message": why}]);
        };
        let Some(mut crd) = crd else {
            c.note(format!("W migrator: {name} failed, {plural} is gone"));
            fail(svm, "the resource is not served");
            return;
        };
        if !quiet && self.rng.chance(12) {
            c.note(format!("W migrator: {name} failed (injected)"));
            fail(svm, "injected by the simulation");
            return;
        }
        let storage = storage_of(&crd).unwrap_or_default();
        let table = cr_table(&plural);
        let names: Vec<String> = c
            .table(&table)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        for n in &names {
            self.put_object(c, &plural, n, &storage);
        }
        c.note(format!(
            "W migrator: {name} rewrote {} objects of {plural} in {storage}",
            names.len()
        ));
        svm["status"]["conditions"] = json!([
            {"type": "Running", "status": "False", "lastTransitionTime": api::now_text(), "reason": "Done", "message": "done"},
            {"type": "Succeeded", "status": "True", "lastTransitionTime": api::now_text(), "reason": "Succeeded", "message": "migrated"}]);
        let generation = crd["metadata"]["generation"].as_i64();
        if let Some(cs) = crd["status"]["conditions"].as_array_mut() {
            cs.retain(|c| c["type"] != "StorageMigrating");
        }
        if self.kcm_prunes && began.is_some() && generation == began {
            c.note(format!(
                "W migrator: prunes {plural} storedVersions to [{storage}]"
            ));
            crd["status"]["storedVersions"] = json!([storage]);
        }
        c.commit(CRDS, &crd_name(&plural), Some(crd));
    }

    /// I7 (found at commits) and I8, since the last check.
    pub fn check(&mut self, c: &Cluster) -> Vec<String> {
        let mut found: Vec<String> = c.i7.iter().take(3).cloned().collect();
        for (at, data) in &c.crd_state_log[self.state_checked..] {
            for (crd, value) in data.as_object().into_iter().flatten() {
                let Some(record) = value.as_str().and_then(crd::state::parse) else {
                    found.push(format!("I8: unreadable record of {crd} at {at:?}: {value}"));
                    continue;
                };
                let Some(m) = record.migration.as_ref() else {
                    continue;
                };
                if !self.begun.contains_key(&m.name) {
                    let need = (m.generation, m.storage.clone(), m.stored.clone());
                    if let Some(prev) = self.recorded.get(crd).and_then(|p| self.begun.get(p)) {
                        if prev.uid == record.uid && prev.phase == Phase::Running {
                            found.push(format!(
                                "I8: migration {} of {crd} begun at {at:?} while {} is recorded running",
                                m.name,
                                self.recorded.get(crd).cloned().unwrap_or_default()
                            ));
                        }
                    }
                    for (other, b) in &self.begun {
                        if b.uid == record.uid && b.need == need && b.phase != Phase::Failed {
                            found.push(format!(
                                "I8: migration {} of {crd} begun at {at:?} for the same need as {other} (generation {}, to {}, from {:?}), which did not fail ({:?})",
                                m.name, need.0, need.1, need.2, b.phase
                            ));
                        }
                    }
                    let highest = self.numbers.get(&record.uid).copied().unwrap_or(0);
                    if m.sequence <= highest {
                        found.push(format!(
                            "I8: migration {} of {crd} has number {}, not above {highest}",
                            m.name, m.sequence
                        ));
                    }
                    self.numbers
                        .insert(record.uid.clone(), m.sequence.max(highest));
                    let objects = PLURALS
                        .iter()
                        .find(|p| crd_name(p) == *crd)
                        .and_then(|p| c.table(&cr_table(p)))
                        .map_or(0, |t| t.len());
                    self.begins.push((*at, objects));
                    self.begun.insert(
                        m.name.clone(),
                        Begun {
                            uid: record.uid.clone(),
                            need,
                            phase: m.phase,
                        },
                    );
                } else if let Some(b) = self.begun.get_mut(&m.name) {
                    b.phase = m.phase;
                }
                self.recorded.insert(crd.clone(), m.name.clone());
            }
        }
        self.state_checked = c.crd_state_log.len();
        for m in &c.created[self.created_checked..] {
            if !m.crd.is_empty() && !m.unfinished.is_empty() {
                found.push(format!(
                    "I8: StorageVersionMigration {} of {} created at {:?} while ours {:?} of the same CRD object had not ended",
                    m.name, m.crd, m.at, m.unfinished
                ));
            }
        }
        self.created_checked = c.created.len();
        found
    }

    /// Liveness once the world has been quiet: every CRD finished.
    pub fn check_quiescence(&self, c: &Cluster, memory: &crd::state::Memory) -> Vec<String> {
        let mut found = Vec::new();
        let mut snapshots = Vec::new();
        for plural in PLURALS {
            let Some(crd) = Self::live(c, plural) else {
                continue;
            };
            if let Ok(typed) = serde_json::from_value::<crd::types::Crd>(crd.clone()) {
                snapshots.push(typed.snapshot());
            }
            let storage = storage_of(&crd).unwrap_or_default();
            let stored = stored_versions_of(&crd);
            let old: Vec<String> = c
                .cr_stored
                .get(plural)
                .into_iter()
                .flatten()
                .filter(|(_, v)| **v != storage)
                .map(|(o, v)| format!("{o} in {v}"))
                .collect();
            if stored == [storage.clone()] && old.is_empty() {
                continue;
            }
            let record: Option<&Record> = memory.get(&crd_name(plural));
            let waiting = record.is_some_and(|r| {
                r.migration
                    .as_ref()
                    .is_some_and(|m| m.phase == Phase::Failed)
                    && retry_wait(CRD_RETRY, r.failures) > Duration::from_secs(10 * 60)
            });
            if waiting {
                // The designed backoff (`--crd-migrate-retry`, doubling) outlasts the quiet.
                continue;
            }
            found.push(format!(
                "I7/I8 liveness: at quiescence {} stores in {storage}, storedVersions {stored:?}, objects in other versions [{}], record {record:?}",
                crd_name(plural),
                old.join(", ")
            ));
        }
        let listed = crd::audit::judge(&snapshots, memory);
        if found.is_empty() && !listed.is_empty() {
            found.push(format!(
                "I7/I8 liveness: every CRD finished at quiescence, yet audit lists {:?}",
                listed.iter().map(|f| (&f.crd, f.code)).collect::<Vec<_>>()
            ));
        }
        found
    }

    /// I6's allowance for the CRD migrations begun in the two minutes before `now`.
    pub fn allowance(&self, now: Duration) -> usize {
        let since = now.saturating_sub(Duration::from_secs(120));
        self.begins
            .iter()
            .filter(|(t, _)| *t >= since)
            .map(|(_, n)| I6_PER_MIGRATION + I6_PER_MIGRATED_OBJECT * n)
            .sum()
    }
}

/// The CRD migrator's state ConfigMap as the product reads it.
pub fn memory(c: &Cluster) -> crd::state::Memory {
    let cms = format!("/api/v1/namespaces/{}/configmaps", api::LEADER_NS);
    c.get(&cms, CRD_STATE)
        .and_then(|cm| cm["data"].as_object().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| Some((k, crd::state::parse(v.as_str()?)?)))
        .collect()
}
