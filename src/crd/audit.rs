//! What `audit` and `serve --report` say about CRDs: each Established CRD whose
//! `status.storedVersions` lists a version besides its storage version, and where its migration
//! stands by our record ([`judge`], pure; the same [`Migration::covers`] the migrator prunes on),
//! plus the reads ([`read`]: one paginated LIST of CRDs, schemas skipped, and the state
//! ConfigMap). One finding per CRD at most.

use serde::Serialize;

use super::decide::{Method, Migration, Phase, Record, Snapshot};
use super::state::Memory;
use super::types::Crd;
use crate::audit::codes::FindingCode;

/// One CRD that is not done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdFinding {
    pub crd: String,
    /// The CRD object's uid (the report's resource reference).
    #[serde(skip)]
    pub uid: String,
    pub code: FindingCode,
    pub storage_version: String,
    pub stored_versions: Vec<String>,
    /// Our last migration of it (its name), when the record has one for this CRD object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<&'static str>,
    /// What is going on, for people.
    pub problem: String,
    /// What to do (or how to follow it).
    pub fix: String,
}

/// Judges every CRD against our record of it. Not judged (nothing to say): a CRD not
/// Established, being deleted, without a single storage version, or whose storedVersions lists
/// only its storage version. Pure.
pub fn judge(crds: &[Snapshot], memory: &Memory) -> Vec<CrdFinding> {
    let mut out: Vec<CrdFinding> = crds.iter().filter_map(|c| one(c, memory)).collect();
    out.sort_by(|a, b| a.crd.cmp(&b.crd));
    out
}

fn one(crd: &Snapshot, memory: &Memory) -> Option<CrdFinding> {
    let storage = crd.storage.clone()?;
    if !crd.established || crd.terminating || crd.up_to_date() {
        return None;
    }
    let others: Vec<&str> = crd
        .stored
        .iter()
        .map(String::as_str)
        .filter(|v| *v != storage)
        .collect();
    let others = others.join(", ");
    let record = Record::of(memory.get(&crd.name), crd);
    let migration = record.and_then(|r| r.migration.as_ref());
    let finding = |code, m: Option<&Migration>, problem: String, fix: String| CrdFinding {
        crd: crd.name.clone(),
        uid: crd.uid.clone(),
        code,
        storage_version: storage.clone(),
        stored_versions: crd.stored.clone(),
        migration: m.map(|m| m.name.clone()),
        method: m.map(|m| m.method.as_str()),
        problem,
        fix,
    };
    let follow = |m: &Migration| match m.method {
        Method::Rewrite => {
            "follow it: storageversion_webhook_crd_migration_objects_total and the leader's log"
                .to_string()
        }
        Method::Svm => format!(
            "follow it: kubectl get storageversionmigration {} -o yaml",
            m.name
        ),
    };
    if let Some(m) = migration.filter(|m| m.phase == Phase::Running) {
        let problem = if m.covers(crd) {
            format!(
                "migration {} ({}) of its objects to {storage} is running; storedVersions becomes [{storage}] when it succeeds, and {others} can then leave spec.versions",
                m.name,
                m.method.as_str()
            )
        } else {
            format!(
                "migration {} ({}) to {} is running, but the CRD changed since it began: nothing is pruned on it, and a new migration begins after the settle time",
                m.name,
                m.method.as_str(),
                m.storage
            )
        };
        return Some(finding(
            FindingCode::CrdMigrationRunning,
            Some(m),
            problem,
            follow(m),
        ));
    }
    if let Some(m) = migration.filter(|m| m.covers(crd)) {
        match (m.phase, m.method) {
            (Phase::Succeeded, Method::Rewrite) => {
                return Some(finding(
                    FindingCode::CrdPrunePending,
                    Some(m),
                    format!(
                        "migration {} rewrote every object in {storage}; the leader sets storedVersions to [{storage}] at its next pass",
                        m.name
                    ),
                    "nothing: serve --crd-migrate prunes it (if this stays, see the leader's log and storageversion_webhook_crd_migration_prunes_total)".to_string(),
                ))
            }
            (Phase::Succeeded, Method::Svm) => {
                return Some(finding(
                    FindingCode::CrdPrunePending,
                    Some(m),
                    format!(
                        "StorageVersionMigration {} succeeded; kube-controller-manager's migrator sets storedVersions to [{storage}] (where it has not within a minute, as 1.35's never does, the leader does)",
                        m.name
                    ),
                    "nothing (if this stays: does kube-controller-manager run storage-version-migrator-controller? else use --crd-migrate-method=rewrite)".to_string(),
                ))
            }
            (Phase::Failed, _) => {
                return Some(finding(
                    FindingCode::CrdMigrationFailed,
                    Some(m),
                    format!(
                        "migration {} ({}) to {storage} failed: {}; storedVersions is left as it is ({}), so {others} cannot leave spec.versions",
                        m.name,
                        m.method.as_str(),
                        if m.message.is_empty() { "no reason recorded" } else { &m.message },
                        crd.stored.join(", ")
                    ),
                    format!("fix the cause the message names (for a rewrite, often the RBAC of crdMigrate.resourceRules): the leader tries again by itself after --crd-migrate-retry (10m by default, doubling with each failure in a row: {} so far, at most 6h), or after the settle time once the CRD's spec changes", record.map_or(1, |r| r.failures.max(1))),
                ))
            }
            (Phase::Running, _) | (Phase::Abandoned, _) => {}
        }
    }
    let problem = match migration {
        Some(m) if m.phase == Phase::Abandoned => format!(
            "storedVersions lists {others} besides the storage version {storage}; migration {} was abandoned ({}), and a new one begins once the CRD holds still for the settle time",
            m.name, m.message
        ),
        _ => format!(
            "storedVersions lists {others} besides the storage version {storage}: objects may still be stored in {others}, which cannot leave spec.versions until they are migrated"
        ),
    };
    Some(finding(
        FindingCode::CrdStoredVersions,
        None,
        problem,
        "serve --crd-migrate (on by default in the chart) migrates the objects and prunes storedVersions once the CRD has held still for --crd-migrate-settle".to_string(),
    ))
}

/// Every CRD (one paginated LIST, schemas skipped while decoding) and our record ConfigMap
/// `namespace/configmap` (missing: no record).
pub async fn read(
    client: kube::Client,
    namespace: &str,
    configmap: &str,
) -> anyhow::Result<(Vec<Snapshot>, Memory)> {
    let api: kube::Api<Crd> = kube::Api::all(client.clone());
    let crds = crate::audit::fetch::list_all(
        &api,
        "customresourcedefinitions.apiextensions.k8s.io",
        |c: Crd| c.snapshot(),
    )
    .await?;
    let memory = super::state::load(&client, namespace, configmap).await?;
    Ok((crds, memory))
}

/// The text section of `audit` (empty when there is nothing to say).
pub fn render_text(findings: &[CrdFinding]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if findings.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\nCRDs whose storedVersions is not yet just the storage version ({}):",
        findings.len()
    );
    for f in findings {
        let _ = writeln!(out, "  {} [{}]: {}", f.crd, f.code, f.problem);
        let _ = writeln!(out, "    fix: {}", f.fix);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::decide::Record;

    fn crd(stored: &[&str], storage: &str, generation: i64) -> Snapshot {
        Snapshot {
            name: "widgets.example.com".into(),
            uid: "u".into(),
            generation,
            established: true,
            storage: Some(storage.into()),
            served: vec!["v1beta1".into(), "v1".into()],
            stored: stored.iter().map(|s| s.to_string()).collect(),
            ..Snapshot::default()
        }
    }

    fn memory(c: &Snapshot, method: Method, phase: Phase, message: &str) -> Memory {
        let mut r = Record::begin(c, "m-1", 1, method).expect("storage");
        if let Some(m) = r.migration.as_mut() {
            m.phase = phase;
            m.message = message.into();
        }
        [(c.name.clone(), r)].into_iter().collect()
    }

    fn code(c: &Snapshot, m: &Memory) -> Option<FindingCode> {
        judge(std::slice::from_ref(c), m).first().map(|f| f.code)
    }

    #[test]
    fn each_state_of_a_crd_has_its_code_and_a_done_crd_none() {
        let c = crd(&["v1beta1", "v1"], "v1", 2);
        let none = Memory::new();
        assert_eq!(code(&c, &none), Some(FindingCode::CrdStoredVersions));
        let running = memory(&c, Method::Rewrite, Phase::Running, "");
        assert_eq!(code(&c, &running), Some(FindingCode::CrdMigrationRunning));
        let failed = memory(&c, Method::Rewrite, Phase::Failed, "403 on update");
        let f = judge(std::slice::from_ref(&c), &failed);
        assert_eq!(f[0].code, FindingCode::CrdMigrationFailed);
        assert!(f[0].problem.contains("403 on update"), "{}", f[0].problem);
        assert_eq!(f[0].migration.as_deref(), Some("m-1"));
        for method in [Method::Rewrite, Method::Svm] {
            let done = memory(&c, method, Phase::Succeeded, "");
            assert_eq!(code(&c, &done), Some(FindingCode::CrdPrunePending));
        }
        let abandoned = memory(&c, Method::Rewrite, Phase::Abandoned, "generation changed");
        assert_eq!(code(&c, &abandoned), Some(FindingCode::CrdStoredVersions));
        // Pruned: nothing to say, whatever the record.
        let pruned = crd(&["v1"], "v1", 2);
        for m in [&none, &running, &failed] {
            assert_eq!(code(&pruned, m), None);
        }
        // Not ours to judge: not established, being deleted, no storage version.
        let mut not_ready = c.clone();
        not_ready.established = false;
        assert_eq!(code(&not_ready, &none), None);
        let mut deleting = c.clone();
        deleting.terminating = true;
        assert_eq!(code(&deleting, &running), None);
        let mut no_storage = c.clone();
        no_storage.storage = None;
        assert_eq!(code(&no_storage, &none), None);
    }

    #[test]
    fn a_record_that_no_longer_covers_the_crd_is_not_a_pending_prune() {
        let began = crd(&["v1beta1", "v1"], "v1", 2);
        let done = memory(&began, Method::Rewrite, Phase::Succeeded, "");
        let failed = memory(&began, Method::Rewrite, Phase::Failed, "x");
        // A spec change since (generation 3), or the CRD deleted and created again (other uid).
        let changed = crd(&["v1beta1", "v1"], "v1", 3);
        let mut recreated = began.clone();
        recreated.uid = "other".into();
        for c in [&changed, &recreated] {
            assert_eq!(code(c, &done), Some(FindingCode::CrdStoredVersions));
            assert_eq!(code(c, &failed), Some(FindingCode::CrdStoredVersions));
        }
        // A running one that no longer covers is still running (it is being stopped).
        let running = memory(&began, Method::Rewrite, Phase::Running, "");
        let f = judge(std::slice::from_ref(&changed), &running);
        assert_eq!(f[0].code, FindingCode::CrdMigrationRunning);
        assert!(
            f[0].problem.contains("changed since it began"),
            "{}",
            f[0].problem
        );
    }

    #[test]
    fn findings_come_sorted_by_crd_one_each() {
        let mut a = crd(&["v1beta1", "v1"], "v1", 1);
        a.name = "b.example.com".into();
        let mut b = a.clone();
        b.name = "a.example.com".into();
        let f = judge(&[a, b], &Memory::new());
        let names: Vec<&str> = f.iter().map(|f| f.crd.as_str()).collect();
        assert_eq!(names, ["a.example.com", "b.example.com"]);
    }
}
