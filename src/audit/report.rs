//! The pure part of `audit`: judges StorageVersions against the Leases of `kube-system` with the
//! same functions as the collector ([`crate::gc::plan`]) and the webhook ([`crate::rules`]).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::gc::plan::{self, Plan, Removal};
use crate::model::{LeaseLookup, LeaseRecord, StorageVersion};
use crate::rules::lease::LeaseJudgement;
use crate::rules::{self, RuleOptions};

/// What `audit` found.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditReport {
    pub now: String,
    pub storage_versions: usize,
    pub identity_leases: usize,
    /// Entries whose lease is missing, not an apiserver identity lease, or expired.
    pub stale_entries: Vec<StaleEntry>,
    /// Rule violations of stored objects (rules of docs/design.md §3 that need no lease data).
    pub violations: Vec<ObjectViolation>,
    /// What the garbage collector would do.
    pub gc_actions: Vec<GcAction>,
    /// Resources whose stored objects may still be in an older version (see docs/migration.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stale_storage: Vec<crate::migrate::audit::StaleStorage>,
    /// False when the cluster does not serve the StorageVersion API (the gate off): nothing
    /// above was judged, and only the CRDs were.
    pub storage_version_api: bool,
    /// CRDs whose storedVersions is not yet just the storage version (docs/crd.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub crds: Vec<crate::crd::audit::CrdFinding>,
    pub clean: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StaleEntry {
    pub storage_version: String,
    #[serde(rename = "apiServerID")]
    pub api_server_id: String,
    /// lease-missing, lease-not-apiserver or lease-expired.
    pub problem: String,
    pub message: String,
    /// Whether the collector removes this entry (after its deletion grace for missing and
    /// unlabelled leases; for expired ones only with `--gc-expired-lease-grace`).
    pub gc_removes: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectViolation {
    pub storage_version: String,
    pub code: String,
    pub path: String,
    pub message: String,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GcAction {
    pub storage_version: String,
    /// `rewrite` (status written with the kept entries) or `delete` (no entry left).
    pub action: &'static str,
    pub removed: Vec<Removal>,
    /// After a rewrite: the recomputed commonEncodingVersion (None: unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub common_encoding_version_after: Option<Option<String>>,
}

/// Options of the pure part.
#[derive(Clone, Debug)]
pub struct AuditOptions {
    pub now: Timestamp,
    pub lease_skew_allowance: Duration,
    pub gc_expired_lease_grace: Option<Duration>,
}

/// Judges `svs` against `leases` (every Lease in kube-system, labelled or not). Pure.
pub fn build_report(
    svs: &[StorageVersion],
    leases: &[LeaseRecord],
    opts: &AuditOptions,
) -> AuditReport {
    let by_name: HashMap<&str, &LeaseRecord> =
        leases.iter().map(|l| (l.name.as_str(), l)).collect();
    let rule_opts = RuleOptions {
        now: opts.now,
        lease_skew_allowance: opts.lease_skew_allowance,
    };
    let now_text = plan::format_time(opts.now);
    let mut report = AuditReport {
        now: opts.now.to_string(),
        storage_versions: svs.len(),
        identity_leases: leases.iter().filter(|l| l.is_apiserver()).count(),
        storage_version_api: true,
        ..AuditReport::default()
    };
    for sv in svs {
        let mut remove = BTreeMap::new();
        for id in plan::entry_ids(sv) {
            let lookup = match by_name.get(id) {
                Some(r) => LeaseLookup::Found((*r).clone()),
                None => LeaseLookup::NotFound,
            };
            let state = plan::judge_lease(&lookup, opts.now, opts.gc_expired_lease_grace);
            let gc_reason = state.reason();
            if let Some(reason) = &gc_reason {
                remove.insert(id.to_string(), reason.clone());
            }
            if let LeaseJudgement::Problem { code, message } =
                rules::lease::judge(id, Some(&lookup), &rule_opts)
            {
                report.stale_entries.push(StaleEntry {
                    storage_version: sv.name().to_string(),
                    api_server_id: id.to_string(),
                    problem: code.as_str().to_string(),
                    message,
                    gc_removes: gc_reason.is_some(),
                });
            } else if let Some(reason) = gc_reason {
                // Live for the webhook (within its skew allowance) but gone for the collector.
                report.stale_entries.push(StaleEntry {
                    storage_version: sv.name().to_string(),
                    api_server_id: id.to_string(),
                    problem: reason.code().to_string(),
                    message: reason.to_string(),
                    gc_removes: true,
                });
            }
        }
        for v in rules::violations(sv) {
            report.violations.push(ObjectViolation {
                storage_version: sv.name().to_string(),
                code: v.code.as_str().to_string(),
                path: v.path.clone(),
                message: v.to_string(),
            });
        }
        match plan::plan(sv, &remove, &now_text) {
            Plan::Nothing => {}
            Plan::Rewrite { object, removed } => report.gc_actions.push(GcAction {
                storage_version: sv.name().to_string(),
                action: "rewrite",
                removed,
                common_encoding_version_after: Some(object.status.common_encoding_version.clone()),
            }),
            Plan::Delete { removed } => report.gc_actions.push(GcAction {
                storage_version: sv.name().to_string(),
                action: "delete",
                removed,
                common_encoding_version_after: None,
            }),
        }
    }
    report.clean = report.stale_entries.is_empty()
        && report.violations.is_empty()
        && report.gc_actions.is_empty();
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::render::render_text;
    use crate::model::ServerStorageVersion;

    fn sv(name: &str, ids: &[&str]) -> StorageVersion {
        let mut sv = StorageVersion::default();
        sv.metadata.name = Some(name.into());
        sv.status.storage_versions = ids
            .iter()
            .map(|id| ServerStorageVersion {
                api_server_id: id.to_string(),
                encoding_version: "apps/v1".into(),
                decodable_versions: vec!["apps/v1".into()],
                served_versions: vec![],
            })
            .collect();
        let now = "2026-03-01T12:00:00Z";
        crate::rules::common::set_common_encoding_version(&mut sv, now);
        sv
    }

    fn lease(name: &str, label: Option<&str>, renew: &str) -> LeaseRecord {
        LeaseRecord {
            name: name.into(),
            identity_label: label.map(String::from),
            renew_time: Some(renew.parse().unwrap()),
            lease_duration_seconds: Some(3600),
        }
    }

    fn opts(grace: Option<Duration>) -> AuditOptions {
        AuditOptions {
            now: "2026-03-01T12:00:00Z".parse().unwrap(),
            lease_skew_allowance: Duration::from_secs(30),
            gc_expired_lease_grace: grace,
        }
    }

    #[test]
    fn clean_cluster() {
        let leases = [lease(
            "apiserver-a",
            Some("kube-apiserver"),
            "2026-03-01T11:59:50Z",
        )];
        let r = build_report(
            &[sv("apps.deployments", &["apiserver-a"])],
            &leases,
            &opts(None),
        );
        assert!(r.clean, "{r:?}");
        assert!(render_text(&r).contains("clean"));
    }

    #[test]
    fn stale_entries_and_actions() {
        let leases = [
            lease(
                "apiserver-a",
                Some("kube-apiserver"),
                "2026-03-01T11:59:50Z",
            ),
            lease("apiserver-u", None, "2026-03-01T11:59:50Z"),
            lease(
                "apiserver-e",
                Some("kube-apiserver"),
                "2026-03-01T09:00:00Z",
            ),
        ];
        let svs = [
            sv("apps.deployments", &["apiserver-a", "apiserver-gone"]),
            sv("apps.statefulsets", &["apiserver-u"]),
            sv("apps.daemonsets", &["apiserver-a", "apiserver-e"]),
        ];
        let r = build_report(&svs, &leases, &opts(None));
        assert!(!r.clean);
        let problems: Vec<_> = r
            .stale_entries
            .iter()
            .map(|e| (e.api_server_id.as_str(), e.problem.as_str(), e.gc_removes))
            .collect();
        assert_eq!(
            problems,
            [
                ("apiserver-gone", "lease-missing", true),
                ("apiserver-u", "lease-not-apiserver", true),
                ("apiserver-e", "lease-expired", false),
            ]
        );
        let actions: Vec<_> = r
            .gc_actions
            .iter()
            .map(|a| (a.storage_version.as_str(), a.action))
            .collect();
        assert_eq!(
            actions,
            [
                ("apps.deployments", "rewrite"),
                ("apps.statefulsets", "delete")
            ]
        );
        let text = render_text(&r);
        assert!(text.contains("delete apps.statefulsets"), "{text}");
        assert!(text.contains("GC keeps it"), "{text}");

        // With the expired-lease grace the expired entry goes too.
        let r = build_report(&svs, &leases, &opts(Some(Duration::from_secs(60))));
        assert_eq!(r.gc_actions.len(), 3);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["gcActions"][2]["removed"][0]["reason"],
            "lease-expired"
        );
    }
}
