//! Tests of the rules: every upstream case of docs/upstream.md §2 (messages compared through `Violation`'s
//! apimachinery-style `Display`), the rules beyond upstream, the lease rule and ratcheting.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::model::{
    LeaseRecord, ServerStorageVersion, StorageVersionCondition, StorageVersionStatus,
};

mod beyond_cases;
mod lease_cases;
mod ratchet_cases;
mod upstream_cases;

// ---------------------------------------------------------------------------------------------
// fixtures

const NOW: &str = "2026-01-01T00:00:00Z";

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn entry(id: &str, enc: &str, decodable: &[&str], served: &[&str]) -> ServerStorageVersion {
    ServerStorageVersion {
        api_server_id: id.into(),
        encoding_version: enc.into(),
        decodable_versions: strings(decodable),
        served_versions: strings(served),
    }
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> StorageVersionCondition {
    StorageVersionCondition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        ..Default::default()
    }
}

/// The object `core.pods` with `entries`.
fn pods(entries: Vec<ServerStorageVersion>) -> StorageVersion {
    object("core.pods", entries)
}

/// The object `core.pods` without entries, with the one condition `c`.
fn with_condition(c: StorageVersionCondition) -> StorageVersion {
    let mut sv = pods(vec![]);
    sv.status.conditions = vec![c];
    sv
}

/// `sv` with `e` appended to its entries.
fn with_entry(sv: &StorageVersion, e: ServerStorageVersion) -> StorageVersion {
    let mut new = sv.clone();
    new.status.storage_versions.push(e);
    new
}

fn object(name: &str, entries: Vec<ServerStorageVersion>) -> StorageVersion {
    let mut sv = StorageVersion::default();
    sv.metadata.name = Some(name.into());
    sv.status.storage_versions = entries;
    sv.status.common_encoding_version =
        common::actual_common_encoding_version(&sv.status.storage_versions).map(str::to_owned);
    sv
}

/// A valid object on which the apiservers `ids` all encode, decode and serve `version`, with its
/// common version and condition set.
fn agreed(name: &str, version: &str, ids: &[&str]) -> StorageVersion {
    let entries = ids
        .iter()
        .map(|id| entry(id, version, &[version], &[version]))
        .collect();
    let mut sv = object(name, entries);
    common::set_common_encoding_version(&mut sv, NOW);
    sv
}

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn opts() -> RuleOptions {
    RuleOptions {
        now: now(),
        lease_skew_allowance: Duration::from_secs(30),
    }
}

fn lease(
    id: &str,
    label: Option<&str>,
    renewed_ago_s: Option<i64>,
    duration_s: Option<i32>,
) -> LeaseLookup {
    LeaseLookup::Found(LeaseRecord {
        name: id.into(),
        identity_label: label.map(str::to_owned),
        renew_time: renewed_ago_s.map(|s| Timestamp::from_second(now().as_second() - s).unwrap()),
        lease_duration_seconds: duration_s,
    })
}

fn live(id: &str) -> LeaseLookup {
    lease(id, Some("kube-apiserver"), Some(10), Some(3600))
}

fn facts(items: Vec<(&str, LeaseLookup)>) -> LeaseFacts {
    items.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Facts in which `id`'s lease is missing.
fn gone(id: &str) -> LeaseFacts {
    facts(vec![(id, LeaseLookup::NotFound)])
}

fn live_facts(sv: &StorageVersion) -> LeaseFacts {
    sv.status
        .storage_versions
        .iter()
        .map(|e| (e.api_server_id.clone(), live(&e.api_server_id)))
        .collect()
}

fn rendered(vs: &[Violation]) -> Vec<String> {
    vs.iter().map(|v| v.to_string()).collect()
}

fn assert_has(vs: &[Violation], needle: &str) {
    let all = rendered(vs);
    assert!(
        all.iter().any(|s| s.contains(needle)),
        "no violation contains {needle:?}; got {all:#?}"
    );
}

/// Each violation as `"<code> at <path>"`.
fn code_paths(vs: &[Violation]) -> Vec<String> {
    vs.iter()
        .map(|v| format!("{} at {}", v.code, v.path))
        .collect()
}

fn codes(vs: &[Violation]) -> Vec<Code> {
    vs.iter().map(|v| v.code).collect()
}

fn name_violations(name: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    upstream::check_name(name, &mut out);
    out
}

fn upstream_only(sv: &StorageVersion) -> Vec<Violation> {
    let mut out = Vec::new();
    upstream::check(sv, &mut out);
    out
}

/// Judges the update from `old` to `new` with every lease live and asserts its findings (as
/// [`finding_summary`] writes them).
#[track_caller]
fn assert_update(new: &StorageVersion, old: &StorageVersion, want: &[&str]) -> Evaluation {
    assert_update_with(new, old, &live_facts(new), want)
}

/// [`assert_update`] with the lease facts `f`.
#[track_caller]
fn assert_update_with(
    new: &StorageVersion,
    old: &StorageVersion,
    f: &LeaseFacts,
    want: &[&str],
) -> Evaluation {
    let e = evaluate(new, Some(old), f, &opts());
    assert_eq!(finding_summary(&e), want, "{:#?}", e.findings);
    e
}

/// Each finding as `"<severity> [<code>] <entry>"` (no entry for findings outside entries).
fn finding_summary(e: &Evaluation) -> Vec<String> {
    e.findings
        .iter()
        .map(|f| {
            let severity = match f.severity {
                Severity::Deny => "deny",
                Severity::Warn => "warn",
            };
            match &f.violation.entry_id {
                Some(id) => format!("{severity} [{}] {id}", f.violation.code),
                None => format!("{severity} [{}]", f.violation.code),
            }
        })
        .collect()
}

fn one_entry(id: &str) -> StorageVersion {
    pods(vec![entry(id, "v1", &["v1"], &["v1"])])
}

fn only_finding(e: &Evaluation) -> &Finding {
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    &e.findings[0]
}

/// The only finding, asserted to be `code` with `severity`.
#[track_caller]
fn the_finding(e: &Evaluation, code: Code, severity: Severity) -> &Finding {
    let f = only_finding(e);
    assert_eq!((f.violation.code, f.severity), (code, severity), "{f:#?}");
    f
}
