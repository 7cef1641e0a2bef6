//! The pure part of the report: `audit`'s judgement ([`crate::audit::build_report`], plus the
//! migration findings of [`crate::migrate::audit::judge`]) mapped to ClusterReport results, one
//! per finding, in a stable order, bounded in number, in bytes and per string.
//!
//! No second judge: every result is one finding of an [`AuditReport`], with its rule code and
//! message as `audit` prints them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::types::{
    ClusterReport, Configuration, Limits, ReportResult, Severity, Status, Summary, API_VERSION,
    KIND,
};
use crate::audit::codes::FindingCode;
use crate::audit::AuditReport;
use crate::model::StorageVersion;
use crate::rules::Code;

/// `policy` of every result, and the report's `source`.
pub const POLICY: &str = "storageversion-webhook";
/// Annotation: how many findings are not listed in `results` (they are counted in `summary`).
pub const OMITTED_ANNOTATION: &str = "storageversion-webhook.io/omitted-results";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "storageversion-webhook";

/// Longest message, in bytes (longer ones are cut on a character boundary, with "…").
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// Longest property value, in bytes.
pub const MAX_PROPERTY_BYTES: usize = 512;
/// Most bytes the listed results may take as JSON: half a ConfigMap's 1 MiB, far under etcd's
/// 1.5 MiB object limit, whatever `--report-max-results` says.
pub const MAX_RESULTS_BYTES: usize = 512 * 1024;

/// What the report says at one moment: everything that goes into the object.
#[derive(Clone, Debug, PartialEq)]
pub struct Content {
    pub summary: Summary,
    /// The listed results, in [`order`].
    pub results: Vec<ReportResult>,
    /// Findings left out of `results` (over the count or the byte bound).
    pub omitted: usize,
    pub max_results: usize,
}

impl Content {
    /// The same findings (rules, subjects, statuses, severities, properties, counts) as `other`,
    /// whatever their messages say. A message can change with nothing else changing (the
    /// expired-lease message names the time it was judged at); such a change alone is written
    /// only at the periodic resync, not on every event.
    pub fn same_findings(&self, other: &Content) -> bool {
        let strip = |r: &ReportResult| ReportResult {
            message: None,
            ..r.clone()
        };
        self.summary == other.summary
            && self.omitted == other.omitted
            && self.max_results == other.max_results
            && self.results.len() == other.results.len()
            && self
                .results
                .iter()
                .zip(&other.results)
                .all(|(a, b)| strip(a) == strip(b))
    }

    /// The object a server-side apply sends.
    pub fn to_object(&self, name: &str) -> ClusterReport {
        ClusterReport {
            api_version: Some(API_VERSION.to_string()),
            kind: Some(KIND.to_string()),
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_LABEL.to_string(),
                    MANAGED_BY.to_string(),
                )])),
                annotations: Some(BTreeMap::from([(
                    OMITTED_ANNOTATION.to_string(),
                    self.omitted.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            source: Some(POLICY.to_string()),
            configuration: Some(Configuration {
                limits: Limits {
                    max_results: Some(i64::try_from(self.max_results).unwrap_or(i64::MAX)),
                    status_filter: Vec::new(),
                },
            }),
            summary: Some(self.summary),
            results: self.results.clone(),
        }
    }
}

/// Whether `stored` (the report as read back) says what `content` says: the same results,
/// summary, limits, source and omitted count (metadata the API server adds does not count).
pub fn matches(stored: &ClusterReport, content: &Content) -> bool {
    let want = content.to_object("");
    let omitted = |r: &ClusterReport| {
        r.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(OMITTED_ANNOTATION).cloned())
    };
    stored.results == want.results
        && stored.summary == want.summary
        && stored.configuration == want.configuration
        && stored.source == want.source
        && omitted(stored) == omitted(&want)
}

/// The report's content: one result per finding of `audit` (about `svs`, the StorageVersions it
/// judged), the first `max_results` of them in [`order`] (fewer if they would take more than
/// [`MAX_RESULTS_BYTES`]), and a summary counting every finding and, as `pass`, every
/// StorageVersion without one.
pub fn content(audit: &AuditReport, svs: &[StorageVersion], max_results: usize) -> Content {
    let uids: HashMap<&str, &str> = svs
        .iter()
        .filter_map(|s| Some((s.name(), s.metadata.uid.as_deref()?)))
        .collect();
    let mut all = findings(audit, &uids);
    all.sort_by(order);
    let mut summary = Summary::default();
    let mut flagged = BTreeSet::new();
    for r in &all {
        match r.result {
            Some(Status::Fail) => summary.fail += 1,
            Some(Status::Warn) => summary.warn += 1,
            Some(Status::Error) => summary.error += 1,
            Some(Status::Skip) => summary.skip += 1,
            Some(Status::Pass) | None => summary.pass += 1,
        }
        if let Some(name) = r.resources.first().and_then(|o| o.name.as_deref()) {
            flagged.insert(name);
        }
    }
    let clean = svs.iter().filter(|s| !flagged.contains(s.name())).count();
    summary.pass += i64::try_from(clean).unwrap_or(i64::MAX);
    let total = all.len();
    let mut bytes = 0;
    let mut results = Vec::new();
    for r in all.into_iter().take(max_results) {
        let size = serde_json::to_vec(&r).map_or(MAX_RESULTS_BYTES, |v| v.len() + 1);
        if bytes + size > MAX_RESULTS_BYTES {
            break;
        }
        bytes += size;
        results.push(r);
    }
    Content {
        summary,
        omitted: total - results.len(),
        results,
        max_results,
    }
}

/// The order of results: fails first, then by severity, StorageVersion, rule, properties and
/// message. Total, so the same findings always give the same list (and no write).
pub fn order(a: &ReportResult, b: &ReportResult) -> std::cmp::Ordering {
    let subject = |r: &ReportResult| {
        r.resources
            .first()
            .and_then(|o| o.name.clone())
            .unwrap_or_default()
    };
    (
        a.result,
        a.severity,
        subject(a),
        &a.rule,
        &a.properties,
        &a.message,
    )
        .cmp(&(
            b.result,
            b.severity,
            subject(b),
            &b.rule,
            &b.properties,
            &b.message,
        ))
}

/// Every finding of `audit` as a result (unordered, unbounded in number).
fn findings(audit: &AuditReport, uids: &HashMap<&str, &str>) -> Vec<ReportResult> {
    let mut out = Vec::new();
    for e in &audit.stale_entries {
        let severity = if e.problem == Code::LeaseExpired.as_str() {
            Severity::Medium
        } else {
            Severity::High
        };
        let gc = if e.gc_removes {
            "removes the entry"
        } else {
            "keeps the entry (expired leases count as gone only with --gc-expired-lease-grace)"
        };
        out.push(result(
            sv_ref(&e.storage_version, uids),
            &e.problem,
            "stale entry",
            Status::Fail,
            severity,
            &e.message,
            [("apiServerID", e.api_server_id.as_str()), ("gc", gc)],
        ));
    }
    for v in &audit.violations {
        // A rule kube-apiserver enforces itself too: the object got past it somehow.
        let upstream = Code::ALL
            .iter()
            .any(|c| c.as_str() == v.code && c.is_upstream());
        let severity = if upstream {
            Severity::High
        } else {
            Severity::Medium
        };
        out.push(result(
            sv_ref(&v.storage_version, uids),
            &v.code,
            "rule violation",
            Status::Fail,
            severity,
            &v.message,
            [("path", v.path.as_str())],
        ));
    }
    for s in &audit.stale_storage {
        let (status, severity) = if s.phase == Some("failed") {
            (Status::Fail, Severity::High)
        } else {
            (Status::Warn, Severity::Medium)
        };
        let mut props = vec![("fix", s.fix.as_str())];
        if let Some(v) = &s.encoding_version {
            props.push(("encodingVersion", v));
        }
        if !s.other_versions.is_empty() {
            props.push(("otherVersions", &s.other_versions));
        }
        if let Some(m) = &s.migration {
            props.push(("migration", m));
        }
        if let Some(p) = s.phase {
            props.push(("phase", p));
        }
        out.push(result(
            sv_ref(&s.storage_version, uids),
            FindingCode::StaleStorage.as_str(),
            "storage migration",
            status,
            severity,
            &s.problem,
            props,
        ));
    }
    for c in &audit.crds {
        let (status, severity) = match c.code {
            FindingCode::CrdMigrationFailed => (Status::Fail, Severity::High),
            FindingCode::CrdStoredVersions => (Status::Warn, Severity::Medium),
            _ => (Status::Warn, Severity::Low),
        };
        let stored = c.stored_versions.join(", ");
        let mut props = vec![
            ("fix", c.fix.as_str()),
            ("storageVersion", c.storage_version.as_str()),
            ("storedVersions", stored.as_str()),
        ];
        if let Some(m) = &c.migration {
            props.push(("migration", m));
        }
        if let Some(m) = c.method {
            props.push(("method", m));
        }
        let resource = ObjectReference {
            api_version: Some(crate::crd::types::API_VERSION.to_string()),
            kind: Some(crate::crd::types::KIND.to_string()),
            name: Some(c.crd.clone()),
            uid: (!c.uid.is_empty()).then(|| c.uid.clone()),
            ..ObjectReference::default()
        };
        out.push(result(
            resource,
            c.code.as_str(),
            "CRD storage migration",
            status,
            severity,
            &c.problem,
            props,
        ));
    }
    out
}

/// The StorageVersion a result is about.
fn sv_ref(storage_version: &str, uids: &HashMap<&str, &str>) -> ObjectReference {
    ObjectReference {
        api_version: Some(crate::model::API_VERSION.to_string()),
        kind: Some(crate::model::KIND.to_string()),
        name: Some(storage_version.to_string()),
        uid: uids.get(storage_version).map(|u| u.to_string()),
        ..ObjectReference::default()
    }
}

fn result<'a>(
    resource: ObjectReference,
    rule: &str,
    category: &str,
    status: Status,
    severity: Severity,
    message: &str,
    properties: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> ReportResult {
    ReportResult {
        policy: POLICY.to_string(),
        rule: Some(rule.to_string()),
        category: Some(category.to_string()),
        severity: Some(severity),
        result: Some(status),
        message: Some(cut(message, MAX_MESSAGE_BYTES)),
        scored: None,
        resources: vec![resource],
        properties: properties
            .into_iter()
            .map(|(k, v)| (k.to_string(), cut(v, MAX_PROPERTY_BYTES)))
            .collect(),
    }
}

/// `s` cut to at most `max` bytes on a character boundary, ending in "…" when cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    const MARK: &str = "…";
    let mut end = max.saturating_sub(MARK.len());
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{ObjectViolation, StaleEntry};
    use crate::migrate::audit::StaleStorage;

    fn sv(name: &str, uid: &str) -> StorageVersion {
        let mut sv = StorageVersion::default();
        sv.metadata.name = Some(name.into());
        sv.metadata.uid = Some(uid.into());
        sv
    }

    fn stale(sv: &str, id: &str, problem: &str, message: &str) -> StaleEntry {
        StaleEntry {
            storage_version: sv.into(),
            api_server_id: id.into(),
            problem: problem.into(),
            message: message.into(),
            gc_removes: problem != "lease-expired",
        }
    }

    fn audit() -> AuditReport {
        AuditReport {
            stale_entries: vec![
                stale("apps.deployments", "gone", "lease-missing", "lease gone"),
                stale(
                    "apps.daemonsets",
                    "old",
                    "lease-expired",
                    "expired at 1; now is 2",
                ),
            ],
            violations: vec![
                ObjectViolation {
                    storage_version: "apps.deployments".into(),
                    code: "decodable-duplicate".into(),
                    path: "status.storageVersions[0].decodableVersions[1]".into(),
                    message: "duplicate".into(),
                },
                ObjectViolation {
                    storage_version: "apps.deployments".into(),
                    code: "encoding-not-decodable".into(),
                    path: "status.storageVersions[0].encodingVersion".into(),
                    message: "not decodable".into(),
                },
            ],
            stale_storage: vec![StaleStorage {
                storage_version: "batch.jobs".into(),
                encoding_version: Some("batch/v1".into()),
                other_versions: "batch/v1beta1".into(),
                migration: None,
                phase: None,
                problem: "not migrated".into(),
                fix: "kubectl create -f -".into(),
            }],
            ..AuditReport::default()
        }
    }

    fn svs() -> Vec<StorageVersion> {
        vec![
            sv("apps.deployments", "u1"),
            sv("apps.daemonsets", "u2"),
            sv("batch.jobs", "u3"),
            sv("core.pods", "u4"),
            sv("core.secrets", "u5"),
        ]
    }

    #[test]
    fn one_result_per_finding_in_a_stable_order() {
        let c = content(&audit(), &svs(), 1000);
        let got: Vec<_> = c
            .results
            .iter()
            .map(|r| {
                (
                    r.result.map(Status::as_str),
                    r.rule.as_deref(),
                    r.resources[0].name.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    Some("fail"),
                    Some("encoding-not-decodable"),
                    Some("apps.deployments")
                ),
                (
                    Some("fail"),
                    Some("lease-missing"),
                    Some("apps.deployments")
                ),
                (Some("fail"), Some("lease-expired"), Some("apps.daemonsets")),
                (
                    Some("fail"),
                    Some("decodable-duplicate"),
                    Some("apps.deployments")
                ),
                (Some("warn"), Some("stale-storage"), Some("batch.jobs")),
            ]
        );
        // Two clean StorageVersions pass; every finding is counted.
        assert_eq!(
            c.summary,
            Summary {
                pass: 2,
                fail: 4,
                warn: 1,
                ..Summary::default()
            }
        );
        assert_eq!(c.omitted, 0);
        let first = &c.results[0];
        assert_eq!(first.policy, POLICY);
        assert_eq!(first.severity, Some(Severity::High));
        assert_eq!(first.resources[0].uid.as_deref(), Some("u1"));
        assert_eq!(
            first.resources[0].api_version.as_deref(),
            Some("internal.apiserver.k8s.io/v1alpha1")
        );
        assert_eq!(first.resources[0].kind.as_deref(), Some("StorageVersion"));
        assert_eq!(
            first.properties["path"],
            "status.storageVersions[0].encodingVersion"
        );
        let lease = &c.results[1];
        assert_eq!(lease.message.as_deref(), Some("lease gone"));
        assert_eq!(lease.properties["apiServerID"], "gone");
        assert_eq!(lease.properties["gc"], "removes the entry");

        // The input order does not matter.
        let mut shuffled = audit();
        shuffled.stale_entries.reverse();
        shuffled.violations.reverse();
        let mut rev = svs();
        rev.reverse();
        assert_eq!(content(&shuffled, &rev, 1000), c);
    }

    #[test]
    fn the_object_matches_the_crd() {
        let c = content(&audit(), &svs(), 3);
        let obj = serde_json::to_value(c.to_object("storageversion-webhook")).unwrap();
        assert_eq!(obj["apiVersion"], "openreports.io/v1alpha1");
        assert_eq!(obj["kind"], "ClusterReport");
        assert_eq!(obj["metadata"]["name"], "storageversion-webhook");
        assert_eq!(obj["metadata"]["annotations"][OMITTED_ANNOTATION], "2");
        assert_eq!(obj["configuration"]["limits"]["maxResults"], 3);
        assert_eq!(obj["summary"]["fail"], 4);
        assert_eq!(obj["summary"]["error"], 0);
        assert_eq!(obj["results"].as_array().unwrap().len(), 3);
        let r = &obj["results"][0];
        assert_eq!(r["policy"], POLICY);
        assert_eq!(r["result"], "fail");
        assert_eq!(r["severity"], "high");
        assert_eq!(r["resources"][0]["name"], "apps.deployments");
        // Round trip: what the API server returns decodes to the same content.
        let mut back: ClusterReport = serde_json::from_value(obj).unwrap();
        assert_eq!(back.results, c.results);
        back.metadata.resource_version = Some("7".into());
        back.metadata.uid = Some("u".into());
        assert!(matches(&back, &c));
        // Edited by someone: no longer what we wrote.
        back.results.pop();
        assert!(!matches(&back, &c));
        assert!(!matches(&ClusterReport::default(), &c));
    }

    #[test]
    fn bounded_in_count_bytes_and_strings() {
        let make = |n: usize| {
            let mut a = AuditReport::default();
            let mut many = Vec::new();
            for i in 0..n {
                let name = format!("g{i:04}.things");
                a.stale_entries
                    .push(stale(&name, "gone", "lease-missing", &"x".repeat(5000)));
                many.push(sv(&name, &format!("u{i}")));
            }
            (a, many)
        };
        let (a, many) = make(300);
        let c = content(&a, &many, 50);
        assert_eq!(c.results.len(), 50);
        assert_eq!(c.omitted, 250);
        assert_eq!(c.summary.fail, 300);
        assert_eq!(c.summary.pass, 0);
        // The first 50 in order, each message cut.
        assert_eq!(
            c.results[0].resources[0].name.as_deref(),
            Some("g0000.things")
        );
        assert_eq!(
            c.results[49].resources[0].name.as_deref(),
            Some("g0049.things")
        );
        for r in &c.results {
            let m = r.message.as_deref().unwrap();
            assert!(
                m.len() <= MAX_MESSAGE_BYTES && m.ends_with('…'),
                "{}",
                m.len()
            );
        }
        // Without a count bound, the byte bound holds.
        let (a, many) = make(1000);
        let c = content(&a, &many, 100_000);
        let bytes = serde_json::to_vec(&c.results).unwrap().len();
        assert!(bytes <= MAX_RESULTS_BYTES, "{bytes}");
        assert_eq!(c.results.len() + c.omitted, 1000);
        assert!(c.omitted > 0);
        // Properties are cut too.
        let mut long = AuditReport::default();
        long.violations.push(ObjectViolation {
            storage_version: "a.b".into(),
            code: "version-invalid".into(),
            path: "é".repeat(1000),
            message: String::new(),
        });
        let c = content(&long, &[], 10);
        assert!(c.results[0].properties["path"].len() <= MAX_PROPERTY_BYTES);
    }

    #[test]
    fn cut_on_a_character_boundary() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("exactly", 7), "exactly");
        assert_eq!(cut("abcdéfgh", 7), "abcd…");
        assert!(cut(&"é".repeat(100), 11).len() <= 11);
    }

    #[test]
    fn unchanged_findings_need_no_write() {
        let c = content(&audit(), &svs(), 1000);
        // Judged again a moment later: the expired-lease message names the new time.
        let mut later = audit();
        later.stale_entries[1].message = "expired at 1; now is 3".into();
        let d = content(&later, &svs(), 1000);
        assert_ne!(c, d);
        assert!(c.same_findings(&d));
        // A finding gone, or another status, is a change.
        let mut fixed = audit();
        fixed.stale_entries.remove(0);
        assert!(!c.same_findings(&content(&fixed, &svs(), 1000)));
        let mut failed = audit();
        failed.stale_storage[0].phase = Some("failed");
        assert!(!c.same_findings(&content(&failed, &svs(), 1000)));
        // A bound that changes is a change.
        assert!(!c.same_findings(&content(&audit(), &svs(), 2)));
    }

    #[test]
    fn crd_findings_are_results_about_the_crd() {
        use crate::crd::decide::{Method, Record, Snapshot};
        let crd = |name: &str| Snapshot {
            name: name.into(),
            uid: format!("uid-{name}"),
            generation: 1,
            established: true,
            storage: Some("v1".into()),
            stored: vec!["v1beta1".into(), "v1".into()],
            ..Snapshot::default()
        };
        let (a, b) = (crd("a.example.com"), crd("b.example.com"));
        let mut failed = Record::begin(&b, "b-1", 1, Method::Rewrite).expect("storage");
        if let Some(m) = failed.migration.as_mut() {
            m.phase = crate::crd::decide::Phase::Failed;
            m.message = "forbidden".into();
        }
        let memory = [("b.example.com".to_string(), failed)]
            .into_iter()
            .collect();
        let report = AuditReport {
            crds: crate::crd::audit::judge(&[a, b], &memory),
            ..AuditReport::default()
        };
        let c = content(&report, &[], 100);
        assert_eq!((c.summary.fail, c.summary.warn, c.summary.pass), (1, 1, 0));
        // Fails first: the failed migration, then the CRD still to migrate.
        let rules: Vec<_> = c.results.iter().map(|r| r.rule.as_deref()).collect();
        assert_eq!(
            rules,
            [Some("crd-migration-failed"), Some("crd-stored-versions")]
        );
        let failed = &c.results[0];
        let about = &failed.resources[0];
        assert_eq!(about.kind.as_deref(), Some("CustomResourceDefinition"));
        assert_eq!(
            about.api_version.as_deref(),
            Some("apiextensions.k8s.io/v1")
        );
        assert_eq!(about.name.as_deref(), Some("b.example.com"));
        assert_eq!(about.uid.as_deref(), Some("uid-b.example.com"));
        assert_eq!(
            failed.properties.get("migration").map(String::as_str),
            Some("b-1")
        );
        assert_eq!(
            failed.properties.get("storedVersions").map(String::as_str),
            Some("v1beta1, v1")
        );
        assert!(failed
            .message
            .as_deref()
            .is_some_and(|m| m.contains("forbidden")));
    }
}
