//! Tests of the rules: every upstream case of docs/upstream.md §2 (messages compared through `Violation`'s
//! apimachinery-style `Display`), the rules beyond upstream, the lease rule and ratcheting.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::model::{
    LeaseRecord, ServerStorageVersion, StorageVersionCondition, StorageVersionStatus,
};

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

// ---------------------------------------------------------------------------------------------
// docs/upstream.md §2.1 TestValidateStorageVersionName

#[test]
fn name_table() {
    let cases: Vec<(String, Option<&str>)> = vec![
        (
            "".into(),
            Some("name must be in the form of <group>.<resource>"),
        ),
        (
            "pods".into(),
            Some("name must be in the form of <group>.<resource>"),
        ),
        ("core.pods".into(), None),
        ("authentication.k8s.io.tokenreviews".into(), None),
        (format!("{}.tokenreviews", "x".repeat(253)), None),
        (
            format!("{}.tokenreviews", "x".repeat(254)),
            Some("the group segment must be no more than 253 characters"),
        ),
        (format!("authentication.k8s.io.{}", "x".repeat(63)), None),
        (
            format!("authentication.k8s.io.{}", "x".repeat(64)),
            Some("the resource segment must be no more than 63 characters"),
        ),
    ];
    for (name, expected) in cases {
        let out = name_violations(&name);
        match expected {
            None => assert!(out.is_empty(), "{name}: {:?}", rendered(&out)),
            Some(msg) => {
                assert!(
                    out.iter().any(|v| v.message == msg),
                    "{name}: want {msg:?}, got {:?}",
                    rendered(&out)
                );
                assert!(out.iter().all(|v| v.code == Code::NameFormat));
                assert!(out.iter().all(|v| v.path == "metadata.name"));
            }
        }
    }
}

#[test]
fn name_segments_get_their_prefixes_and_render_like_apimachinery() {
    let out = name_violations(".pods");
    assert_eq!(
        rendered(&out),
        vec![
            r#"metadata.name: Invalid value: ".pods": the group segment a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"#
        ]
    );
    let out = name_violations("apps.");
    assert_eq!(
        rendered(&out),
        vec![
            r#"metadata.name: Invalid value: "apps.": the resource segment a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"#
        ]
    );
    // Split at the LAST dot: the resource cannot hold a dot, the group can.
    let out = name_violations("apps.1deployments");
    assert_eq!(out.len(), 1);
    assert!(out[0]
        .message
        .starts_with("the resource segment a DNS-1035 label"));
    // Length and pattern are independent.
    let out = name_violations(&format!("{}-.pods", "x".repeat(254)));
    assert_eq!(out.len(), 2, "{:?}", rendered(&out));
}

// ---------------------------------------------------------------------------------------------
// docs/upstream.md §2.2 TestValidateStorageVersionStatus

#[test]
fn duplicate_api_server_id() {
    let mut sv = pods(vec![
        entry("1", "v1alpha1", &["v1alpha1", "v1"], &[]),
        entry("1", "v1beta1", &["v1alpha1", "v1"], &[]),
    ]);
    sv.status.common_encoding_version = Some("v1alpha1".into());
    let out = upstream_only(&sv);
    assert_has(
        &out,
        r#"storageVersions[1].apiServerID: Duplicate value: "1""#,
    );
    assert_has(
        &out,
        r#"status.storageVersions[1].apiServerID: Duplicate value: "1""#,
    );
    let dups: Vec<_> = out
        .iter()
        .filter(|v| v.code == Code::ApiServerIdDuplicate)
        .collect();
    assert_eq!(dups.len(), 1, "only the later one is reported");
    assert_eq!(dups[0].entry_id.as_deref(), Some("1"));
    // The entries disagree while common is set.
    assert!(codes(&out).contains(&Code::CommonVersionMismatch));
    // Order: the duplicate comes before that entry's own checks.
    let dup_at = out
        .iter()
        .position(|v| v.code == Code::ApiServerIdDuplicate);
    let enc_at = out
        .iter()
        .position(|v| v.code == Code::EncodingNotDecodable);
    assert!(dup_at < enc_at, "{:?}", rendered(&out));
}

// ---------------------------------------------------------------------------------------------
// docs/upstream.md §2.3 / §2.6 TestValidateServerStorageVersion

const SUBDOMAIN_MSG: &str = r"a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const API_VERSION_MSG: &str = "an apiVersion is a DNS-1035 label, which must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyVersion')";

#[test]
fn server_storage_version_table() {
    type Row<'a> = (
        &'a str,
        &'a str,
        &'a [&'a str],
        &'a [&'a str],
        Option<String>,
    );
    let rows: Vec<Row> = vec![
        ("-fea", "v1alpha1", &["v1alpha1", "v1"], &["v1alpha1", "v1"], Some("apiServerID: Invalid value".into())),
        ("fea", "v1alpha1", &["v1beta1", "v1"], &["v1beta1", "v1"], Some("decodableVersions must include encodingVersion".into())),
        ("fea", "v1alpha1", &["v1alpha1", "v1", "-fea"], &["v1alpha1", "v1", "-fea"], Some("decodableVersions[2]: Invalid value".into())),
        ("fea", "v1alpha1", &["v1alpha1", "v1"], &["v1alpha1", "v1"], None),
        ("fea", "v1alpha1", &["v1alpha1", "v1"], &["v1alpha1", "v1"], None),
        ("fea", "mygroup.com/v2", &["v1alpha1", "v1", "mygroup.com/v2"], &["v1alpha1", "v1", "mygroup.com/v2"], None),
        ("fea", "v1alpha1", &["v1alpha1", "v1"], &["/v3"], Some(r#"servedVersions[0]: Invalid value: "/v3": group part: must be non-empty"#.into())),
        ("fea", "mygroup.com/v2", &["mygroup.com/v2", "/v3"], &["mygroup.com/v2", "/v3"], Some(r#"decodableVersions[1]: Invalid value: "/v3": group part: must be non-empty"#.into())),
        ("fea", "mygroup.com/v2", &["mygroup.com/v2", "/v3"], &["mygroup.com/"], Some(r#"servedVersions[0]: Invalid value: "mygroup.com/": version part: must be non-empty"#.into())),
        ("fea", "mygroup.com/v2", &["mygroup.com/v2", "mygroup.com/"], &["mygroup.com/v2", "mygroup.com/"], Some(r#"decodableVersions[1]: Invalid value: "mygroup.com/": version part: must be non-empty"#.into())),
        ("fea", "/v3", &["mygroup.com/v2", "/v3"], &["mygroup.com/v2", "/v3"], Some(r#"encodingVersion: Invalid value: "/v3": group part: must be non-empty"#.into())),
        ("fea", "v1", &["v1", "mygroup_com/v2"], &["v1", "mygroup_com/v2"], Some(format!(r#"decodableVersions[1]: Invalid value: "mygroup_com/v2": group part: {SUBDOMAIN_MSG}"#))),
        ("fea", "v1", &["v1", "mygroup.com/v2"], &["v1", "mygroup_com/v2"], Some(format!(r#"servedVersions[1]: Invalid value: "mygroup_com/v2": group part: {SUBDOMAIN_MSG}"#))),
        ("fea", "v1", &["v1", "mygroup.com/v2_"], &["v1", "mygroup.com/v2_"], Some(format!(r#"decodableVersions[1]: Invalid value: "mygroup.com/v2_": version part: {DNS1035_MSG}"#))),
        ("fea", "v1", &["v1", "mygroup.com/v2"], &["v1", "mygroup.com/v2_"], Some(format!(r#"servedVersions[1]: Invalid value: "mygroup.com/v2_": version part: {DNS1035_MSG}"#))),
        ("fea", "v1", &["v1", "mygroup.com/v2/myresource"], &["v1", "mygroup.com/v2/myresource"], Some(format!(r#"decodableVersions[1]: Invalid value: "mygroup.com/v2/myresource": {API_VERSION_MSG}"#))),
        ("fea", "v1", &["v1", "mygroup.com/v2"], &["v1", "mygroup.com/v2/myresource"], Some(format!(r#"servedVersions[1]: Invalid value: "mygroup.com/v2/myresource": {API_VERSION_MSG}"#))),
        ("fea", "v1alpha1", &["v1alpha1", "v1"], &["v2"], Some(r#"servedVersions[0]: Invalid value: "v2": individual served version : v2 must be included in decodableVersions : [v1alpha1 v1]"#.into())),
    ];
    for (id, enc, decodable, served, expected) in rows {
        let e = entry(id, enc, decodable, served);
        let mut out = Vec::new();
        upstream::check_entry(0, &e, &mut out);
        match expected {
            None => assert!(out.is_empty(), "{e:?}: {:#?}", rendered(&out)),
            Some(needle) => {
                assert_has(&out, &needle);
                if needle.contains(": Invalid value") {
                    // The needle starts with a field: it follows our full path prefix.
                    assert_has(&out, &format!("status.storageVersions[0].{needle}"));
                }
                assert!(out.iter().all(|v| v.entry_id.as_deref() == Some(id)));
            }
        }
    }
}

#[test]
fn entry_checks_in_order_with_codes_and_paths() {
    let e = entry("Bad", "v1/x/y", &["", "v2"], &["v3", "v2"]);
    let mut out = Vec::new();
    upstream::check_entry(4, &e, &mut out);
    assert_eq!(
        code_paths(&out),
        [
            "apiserverid-invalid at status.storageVersions[4].apiServerID",
            "version-invalid at status.storageVersions[4].encodingVersion",
            "version-invalid at status.storageVersions[4].decodableVersions[0]",
            "encoding-not-decodable at status.storageVersions[4].decodableVersions",
            "served-not-decodable at status.storageVersions[4].servedVersions[0]"
        ]
    );
    assert_eq!(
        out[3].message,
        "decodableVersions must include encodingVersion v1/x/y"
    );
    // An invalid served version that is also not decodable gets both errors.
    let e = entry("a", "v1", &["v1"], &["/x"]);
    let mut out = Vec::new();
    upstream::check_entry(0, &e, &mut out);
    assert_eq!(
        codes(&out),
        vec![Code::VersionInvalid, Code::ServedNotDecodable]
    );
}

#[test]
fn version_messages_are_comma_joined() {
    let e = entry("a", "/", &["/"], &[]);
    let mut out = Vec::new();
    upstream::check_entry(0, &e, &mut out);
    assert_has(
        &out,
        r#"status.storageVersions[0].encodingVersion: Invalid value: "/": group part: must be non-empty,version part: must be non-empty"#,
    );
    assert_eq!(
        out.iter()
            .filter(|v| v.code == Code::VersionInvalid)
            .count(),
        2
    );
}

#[test]
fn empty_decodable_list_fails_and_empty_id_fails() {
    let e = entry("", "v1", &[], &[]);
    let mut out = Vec::new();
    upstream::check_entry(0, &e, &mut out);
    assert_eq!(
        codes(&out),
        vec![Code::ApiServerIdInvalid, Code::EncodingNotDecodable]
    );
    assert_has(
        &out,
        r#"apiServerID: Invalid value: "": a lowercase RFC 1123 subdomain"#,
    );
}

// ---------------------------------------------------------------------------------------------
// docs/upstream.md §2.5 TestValidateCommonVersion

fn common_violations(encs: &[&str], common: Option<&str>) -> Vec<Violation> {
    let status = StorageVersionStatus {
        storage_versions: encs
            .iter()
            .enumerate()
            .map(|(i, enc)| entry(&i.to_string(), enc, &[enc], &[]))
            .collect(),
        common_encoding_version: common.map(str::to_owned),
        conditions: vec![],
    };
    let mut out = Vec::new();
    upstream::check_common(&status, &mut out);
    assert!(out.iter().all(|v| v.code == Code::CommonVersionMismatch));
    assert!(out.iter().all(|v| v.path == "status.commonEncodingVersion"));
    out
}

#[test]
fn common_version_cases() {
    let nil_msg = "should be nil if servers do not agree on the same encoding version, or if there is no server reporting the supported versions yet";
    let out = common_violations(&[], Some("v1alpha1"));
    assert_eq!(
        rendered(&out),
        vec![format!(
            r#"status.commonEncodingVersion: Invalid value: "v1alpha1": {nil_msg}"#
        )]
    );
    let out = common_violations(&["v1alpha1", "v1"], Some("v1alpha1"));
    assert_has(&out, nil_msg);
    let out = common_violations(&["v1alpha1", "v1alpha1"], None);
    assert_eq!(
        rendered(&out),
        vec![
            r#"status.commonEncodingVersion: Invalid value: "null": the common encoding version is v1alpha1"#
        ]
    );
    let out = common_violations(&["v1alpha1", "v1alpha1"], Some("v1"));
    assert_eq!(
        rendered(&out),
        vec![
            r#"status.commonEncodingVersion: Invalid value: "v1": the actual common encoding version is v1alpha1"#
        ]
    );
    assert!(common_violations(&["v1alpha1", "v1alpha1"], Some("v1alpha1")).is_empty());
    assert!(common_violations(&["v1alpha1"], Some("v1alpha1")).is_empty());
    assert!(common_violations(&[], None).is_empty());
    assert!(common_violations(&["v1", "v2"], None).is_empty());
    // Entry validity does not matter: an empty string counts as a version.
    assert!(common_violations(&["", ""], Some("")).is_empty());
    assert_eq!(common_violations(&["", ""], None).len(), 1);
}

// ---------------------------------------------------------------------------------------------
// docs/upstream.md §2.4 TestValidateStorageVersionCondition

fn condition_violations(conditions: Vec<StorageVersionCondition>) -> Vec<Violation> {
    let mut out = Vec::new();
    upstream::check_conditions(&conditions, &mut out);
    out
}

#[test]
fn condition_cases() {
    let cases = [
        (
            condition("-fea", "True", "unknown", "unknown"),
            vec![
                "type: Invalid value",
                r#"status.conditions[0].type: Invalid value: "-fea": name part must consist of"#,
            ],
            Code::ConditionTypeInvalid,
        ),
        (
            condition("fea", "-True", "unknown", "unknown"),
            vec![
                "status: Invalid value",
                r#"status.conditions[0].status: Invalid value: "-True": name part"#,
            ],
            Code::ConditionStatusInvalid,
        ),
        (
            condition("fea", "True", "", "unknown"),
            vec!["Required value: reason cannot be empty"],
            Code::ConditionReasonEmpty,
        ),
        (
            condition("fea", "True", "unknown", ""),
            vec!["Required value: message cannot be empty"],
            Code::ConditionMessageEmpty,
        ),
    ];
    for (c, needles, code) in cases {
        let out = condition_violations(vec![c.clone()]);
        for needle in needles {
            assert_has(&out, needle);
        }
        assert_eq!(codes(&out), vec![code], "{c:?}");
    }
    assert_eq!(
        rendered(&condition_violations(vec![condition(
            "fea", "True", "", "unknown"
        )])),
        vec!["status.conditions[0].reason: Required value: reason cannot be empty"]
    );

    let out = condition_violations(vec![
        condition("fea", "True", "unknown", "unknown"),
        condition("fea", "True", "unknown", "unknown"),
    ]);
    assert_has(
        &out,
        r#""fea": the type of the condition is not unique, it also appears in conditions[0]"#,
    );
    assert_eq!(out[0].path, "status.conditions[1].type");
    assert_eq!(codes(&out), vec![Code::ConditionTypeDuplicate]);

    assert!(condition_violations(vec![condition("fea", "True", "unknown", "unknown")]).is_empty());
}

#[test]
fn third_duplicate_condition_points_at_the_second() {
    let c = condition("fea", "True", "r", "m");
    let out = condition_violations(vec![c.clone(), c.clone(), c]);
    assert_eq!(
        rendered(&out),
        vec![
            r#"status.conditions[1].type: Invalid value: "fea": the type of the condition is not unique, it also appears in conditions[0]"#,
            r#"status.conditions[2].type: Invalid value: "fea": the type of the condition is not unique, it also appears in conditions[1]"#,
        ]
    );
}

#[test]
fn condition_checks_in_order() {
    let out = condition_violations(vec![
        condition("a", "True", "r", "m"),
        condition("a", "", "", ""),
    ]);
    assert_eq!(
        codes(&out),
        vec![
            Code::ConditionTypeDuplicate,
            Code::ConditionStatusInvalid,
            Code::ConditionStatusInvalid,
            Code::ConditionReasonEmpty,
            Code::ConditionMessageEmpty,
        ]
    );
    // An empty status gets both qualified-name messages, value "".
    assert_has(
        &out,
        r#"status.conditions[1].status: Invalid value: "": name part must be non-empty"#,
    );
}

// ---------------------------------------------------------------------------------------------
// docs/upstream.md §2.8 strategy-test object

#[test]
fn strategy_test_object_is_valid() {
    let mut sv = pods(vec![
        entry("1", "v1", &["v1", "v2"], &[]),
        entry("2", "v1", &["v1", "v2"], &[]),
        entry("3", "v2", &["v1", "v2"], &[]),
    ]);
    sv.status.common_encoding_version = None;
    assert!(
        upstream_only(&sv).is_empty(),
        "{:?}",
        rendered(&upstream_only(&sv))
    );
    assert!(violations(&sv).is_empty());
}

#[test]
fn whole_object_order_is_name_entries_common_conditions() {
    let mut sv = object("pods", vec![entry("a", "v1", &["v2"], &[])]);
    sv.status.common_encoding_version = Some("v9".into());
    sv.status.conditions = vec![condition("t", "True", "", "m")];
    assert_eq!(
        codes(&violations(&sv)),
        vec![
            Code::NameFormat,
            Code::EncodingNotDecodable,
            Code::CommonVersionMismatch,
            Code::ConditionReasonEmpty,
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// beyond upstream

fn group_mismatches(name: &str, enc: &str, decodable: &[&str]) -> Vec<Violation> {
    let sv = object(name, vec![entry("a", enc, decodable, &[])]);
    violations(&sv)
        .into_iter()
        .filter(|v| v.code == Code::EncodingGroupMismatch)
        .collect()
}

#[test]
fn encoding_group_must_match_the_name() {
    assert!(group_mismatches("core.pods", "v1", &["v1"]).is_empty());
    assert!(group_mismatches("apps.deployments", "apps/v1", &["apps/v1"]).is_empty());
    assert!(group_mismatches("core.events", "v1", &["v1", "events.k8s.io/v1"]).is_empty());
    assert!(group_mismatches(
        "networking.k8s.io.ingresses",
        "networking.k8s.io/v1",
        &["networking.k8s.io/v1", "extensions/v1beta1"]
    )
    .is_empty());

    let out = group_mismatches("core.pods", "apps/v1", &["apps/v1"]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].path, "status.storageVersions[0].encodingVersion");
    assert_eq!(out[0].entry_id.as_deref(), Some("a"));
    assert!(
        out[0].message.contains("API group \"apps\""),
        "{}",
        out[0].message
    );
    assert!(
        out[0].message.contains("the core group"),
        "{}",
        out[0].message
    );
    assert!(
        out[0].message.contains("a bare version"),
        "{}",
        out[0].message
    );

    let out = group_mismatches("apps.deployments", "v1", &["v1"]);
    assert_eq!(out.len(), 1);
    assert!(
        out[0].message.contains("\"apps/<version>\""),
        "{}",
        out[0].message
    );

    // "core/v1" is not how the core group is spelled in a version.
    assert_eq!(
        group_mismatches("core.pods", "core/v1", &["core/v1"]).len(),
        1
    );
}

#[test]
fn encoding_group_is_not_judged_on_malformed_input() {
    assert!(group_mismatches("pods", "apps/v1", &["apps/v1"]).is_empty());
    assert!(group_mismatches("core.pods", "/v1", &["/v1"]).is_empty());
    assert!(group_mismatches("core.pods", "apps/v1/x", &["apps/v1/x"]).is_empty());
}

#[test]
fn repeated_versions_are_reported_at_each_later_index() {
    let sv = pods(vec![entry(
        "a",
        "v1",
        &["v1", "v2", "v1", "v1"],
        &["v2", "v2"],
    )]);
    let out = violations(&sv);
    assert_eq!(
        code_paths(&out),
        [
            "decodable-duplicate at status.storageVersions[0].decodableVersions[2]",
            "decodable-duplicate at status.storageVersions[0].decodableVersions[3]",
            "served-duplicate at status.storageVersions[0].servedVersions[1]"
        ]
    );
    assert_eq!(
        out[0].to_string(),
        r#"status.storageVersions[0].decodableVersions[2]: Duplicate value: "v1""#
    );
    assert!(out[0].message.contains("remove the repeat"));
    assert!(out.iter().all(|v| v.entry_id.as_deref() == Some("a")));
}

#[test]
fn condition_status_must_be_a_defined_value() {
    let status_codes = |status: &str| {
        let mut sv = pods(vec![]);
        sv.status.conditions = vec![condition("Other", status, "r", "m")];
        codes(&violations(&sv))
    };
    assert!(status_codes("True").is_empty());
    assert!(status_codes("False").is_empty());
    assert!(status_codes("Unknown").is_empty());
    assert_eq!(
        status_codes("Maybe"),
        vec![Code::ConditionStatusUnknownValue]
    );
    assert_eq!(
        status_codes("true"),
        vec![Code::ConditionStatusUnknownValue]
    );
    // Not a qualified name: reported once, by the upstream rule.
    assert_eq!(status_codes("-True"), vec![Code::ConditionStatusInvalid]);
}

#[test]
fn all_encoding_versions_equal_must_agree_with_common() {
    let judge = |entries: Vec<ServerStorageVersion>, status: &str| {
        let mut sv = pods(entries);
        sv.status.conditions = vec![condition(ALL, status, "r", "m")];
        violations(&sv)
    };
    const ALL: &str = crate::model::ALL_ENCODING_VERSIONS_EQUAL;
    // `a` encodes v1; `b` encodes `b_version`.
    let entries = |b_version: &str| {
        vec![
            entry("a", "v1", &["v1"], &[]),
            entry("b", b_version, &[b_version], &[]),
        ]
    };
    let agree = || entries("v1");
    let disagree = || entries("v2");
    assert!(judge(agree(), "True").is_empty());
    assert!(judge(disagree(), "False").is_empty());
    assert!(judge(disagree(), "Unknown").is_empty());

    let out = judge(disagree(), "True");
    assert_eq!(codes(&out), vec![Code::ConditionDisagreesWithCommon]);
    assert_eq!(out[0].path, "status.conditions[0].status");
    assert!(out[0].message.contains("is not set"), "{}", out[0].message);

    let out = judge(agree(), "False");
    assert_eq!(codes(&out), vec![Code::ConditionDisagreesWithCommon]);
    assert!(out[0].message.contains("\"v1\""), "{}", out[0].message);

    // Other condition types are not compared.
    let mut sv = pods(disagree());
    sv.status.conditions = vec![condition("Other", "True", "r", "m")];
    assert!(violations(&sv).is_empty());
}

// ---------------------------------------------------------------------------------------------
// lease rule

fn one_entry(id: &str) -> StorageVersion {
    pods(vec![entry(id, "v1", &["v1"], &["v1"])])
}

fn judge_create(lookup: Option<LeaseLookup>) -> Evaluation {
    let sv = one_entry("apiserver-a");
    let facts = match lookup {
        Some(l) => facts(vec![("apiserver-a", l)]),
        None => LeaseFacts::new(),
    };
    evaluate(&sv, None, &facts, &opts())
}

/// A create judged with `apiserver-a`'s lease as given.
fn judge_lease(
    label: Option<&str>,
    renewed_ago_s: Option<i64>,
    duration_s: Option<i32>,
) -> Evaluation {
    judge_create(Some(lease("apiserver-a", label, renewed_ago_s, duration_s)))
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

#[test]
fn live_lease_gives_nothing() {
    let e = judge_create(Some(live("apiserver-a")));
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
    assert!(!e.lease_rule_skipped);
    assert!(!e.is_denied());
}

#[test]
fn missing_lease_denies() {
    let e = judge_create(Some(LeaseLookup::NotFound));
    let f = the_finding(&e, Code::LeaseMissing, Severity::Deny);
    assert_eq!(f.note, None);
    assert_eq!(f.violation.path, "status.storageVersions[0].apiServerID");
    assert_eq!(f.violation.entry_id.as_deref(), Some("apiserver-a"));
    assert!(f.violation.message.contains("kube-system/apiserver-a"));
    assert!(e.is_denied());
}

#[test]
fn lease_with_another_identity_denies() {
    let e = judge_lease(Some("kube-controller-manager"), Some(10), Some(3600));
    let f = the_finding(&e, Code::LeaseNotApiserver, Severity::Deny);
    let m = &f.violation.message;
    assert!(m.contains("apiserver.kubernetes.io/identity"), "{m}");
    assert!(m.contains("kube-controller-manager"), "{m}");
}

#[test]
fn lease_without_identity_label_denies() {
    let e = judge_lease(None, Some(10), Some(3600));
    let f = only_finding(&e);
    assert_eq!(f.violation.code, Code::LeaseNotApiserver);
    assert!(f
        .violation
        .message
        .contains("has no label apiserver.kubernetes.io/identity"));
}

#[test]
fn expired_lease_denies_and_says_when() {
    // Renewed 2 hours ago with a 1 hour duration: expired at 23:00 the day before.
    let e = judge_lease(Some("kube-apiserver"), Some(7200), Some(3600));
    let f = the_finding(&e, Code::LeaseExpired, Severity::Deny);
    assert!(
        f.violation
            .message
            .contains("expired at 2025-12-31T23:00:00Z"),
        "{}",
        f.violation.message
    );
}

#[test]
fn lease_without_renew_time_or_duration_is_expired() {
    let e = judge_lease(Some("kube-apiserver"), None, Some(3600));
    let f = only_finding(&e);
    assert_eq!(f.violation.code, Code::LeaseExpired);
    assert!(f.violation.message.contains("renewTime"));

    let e = judge_lease(Some("kube-apiserver"), Some(1), None);
    let f = only_finding(&e);
    assert_eq!(f.violation.code, Code::LeaseExpired);
    assert!(f.violation.message.contains("leaseDurationSeconds"));
}

#[test]
fn skew_allowance_is_honoured_up_to_its_edge() {
    // Expired 10s ago, allowance 30s: still live.
    let e = judge_lease(Some("kube-apiserver"), Some(3610), Some(3600));
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
    // Expired exactly 30s ago: renewTime + duration + allowance <= now, so expired.
    let e = judge_lease(Some("kube-apiserver"), Some(3630), Some(3600));
    assert_eq!(only_finding(&e).violation.code, Code::LeaseExpired);
    // One second inside the allowance: live.
    let e = judge_lease(Some("kube-apiserver"), Some(3629), Some(3600));
    assert!(e.findings.is_empty());
}

#[test]
fn failed_lookup_only_warns() {
    let e = judge_create(Some(LeaseLookup::Failed("timeout".into())));
    let f = the_finding(&e, Code::LeaseLookupFailed, Severity::Warn);
    assert!(f.violation.message.contains("not denying"));
    assert!(f.violation.message.contains("timeout"));
    assert!(!e.is_denied());
    assert!(!e.lease_rule_skipped);
}

#[test]
fn unknown_lease_skips_the_rule() {
    let e = judge_create(Some(LeaseLookup::Unknown));
    assert!(e.findings.is_empty());
    assert!(e.lease_rule_skipped);
    let e = judge_create(None);
    assert!(e.findings.is_empty());
    assert!(e.lease_rule_skipped);
}

#[test]
fn invalid_ids_are_not_looked_up_or_lease_judged() {
    let sv = pods(vec![
        entry("", "v1", &["v1"], &[]),
        entry("b", "v1", &["v1"], &[]),
        entry("Bad_ID", "v1", &["v1"], &[]),
        entry("b", "v1", &["v1"], &[]),
        entry("a", "v1", &["v1"], &[]),
    ]);
    assert_eq!(lease_ids(&sv, None), vec!["b", "a"]);
    let e = evaluate(&sv, None, &LeaseFacts::new(), &opts());
    assert!(e.findings.iter().all(|f| !matches!(
        f.violation.code,
        Code::LeaseMissing | Code::LeaseLookupFailed
    )));
    assert!(e.lease_rule_skipped);
}

#[test]
fn lease_ids_include_unchanged_entries() {
    let old = one_entry("x");
    let new = with_entry(&old, entry("y", "v1", &["v1"], &[]));
    assert_eq!(lease_ids(&new, Some(&old)), vec!["x", "y"]);
}

// ---------------------------------------------------------------------------------------------
// ratcheting

#[test]
fn unchanged_entry_with_stale_lease_only_warns() {
    let old = one_entry("gone");
    let new = old.clone();
    let e = evaluate(&new, Some(&old), &gone("gone"), &opts());
    let f = the_finding(&e, Code::LeaseMissing, Severity::Warn);
    assert_eq!(f.note, Some("unchanged from the stored object"));
}

#[test]
fn changed_entry_with_stale_lease_denies() {
    let old = one_entry("gone");
    let mut new = old.clone();
    new.status.storage_versions[0]
        .decodable_versions
        .push("v2".into());
    let e = evaluate(&new, Some(&old), &gone("gone"), &opts());
    let f = the_finding(&e, Code::LeaseMissing, Severity::Deny);
    assert_eq!(f.note, None);
}

#[test]
fn added_entry_with_stale_lease_denies_next_to_unchanged_ones() {
    let old = one_entry("a");
    let new = with_entry(&old, entry("b", "v1", &["v1"], &["v1"]));
    let f = facts(vec![
        ("a", LeaseLookup::NotFound),
        ("b", LeaseLookup::NotFound),
    ]);
    assert_update_with(
        &new,
        &old,
        &f,
        &["warn [lease-missing] a", "deny [lease-missing] b"],
    );
}

#[test]
fn reordered_entries_still_ratchet() {
    let a = entry("a", "v1", &["v1", "v1"], &["v1"]);
    let b = entry("b", "v1", &["v1"], &["v1"]);
    let old = pods(vec![a.clone(), b.clone()]);
    let mut a_reordered = a;
    a_reordered.decodable_versions.reverse();
    let new = pods(vec![b, a_reordered]);
    let f = facts(vec![("a", LeaseLookup::NotFound), ("b", live("b"))]);
    let e = assert_update_with(
        &new,
        &old,
        &f,
        &["warn [decodable-duplicate] a", "warn [lease-missing] a"],
    );
    assert!(!e.is_denied());
}

#[test]
fn served_versions_in_another_order_are_unchanged() {
    let old = pods(vec![entry("a", "v1", &["v1", "v2"], &["v1", "v2"])]);
    let new = pods(vec![entry("a", "v1", &["v1", "v2"], &["v2", "v1"])]);
    let e = evaluate(&new, Some(&old), &gone("a"), &opts());
    assert_eq!(only_finding(&e).severity, Severity::Warn);
}

#[test]
fn a_bad_name_denies_on_create_and_warns_on_update() {
    let sv = object("pods", vec![]);
    let e = evaluate(&sv, None, &LeaseFacts::new(), &opts());
    assert_eq!(finding_summary(&e), vec!["deny [name-format]"]);
    let e = evaluate(&sv, Some(&sv), &LeaseFacts::new(), &opts());
    assert_eq!(finding_summary(&e), vec!["warn [name-format]"]);
    assert_eq!(e.findings[0].note, Some("unchanged from the stored object"));
}

#[test]
fn create_denies_everything() {
    let sv = pods(vec![entry("a", "apps/v1", &["v1"], &[])]);
    let e = evaluate(
        &sv,
        None,
        &facts(vec![("a", LeaseLookup::NotFound)]),
        &opts(),
    );
    assert_eq!(
        finding_summary(&e),
        vec![
            "deny [encoding-not-decodable] a",
            "deny [encoding-group-mismatch] a",
            "deny [lease-missing] a",
        ]
    );
}

#[test]
fn removing_entries_is_allowed() {
    let a = entry("a", "v1", &["v1"], &["v1"]);
    let gone = entry("gone", "v2", &["v2", "v2"], &["v2"]);
    let mut old = pods(vec![a.clone(), gone]);
    common::set_common_encoding_version(&mut old, NOW);
    let mut new = old.clone();
    new.status
        .storage_versions
        .retain(|e| e.api_server_id == "a");
    common::set_common_encoding_version(&mut new, NOW);
    let f = facts(vec![("a", live("a")), ("gone", LeaseLookup::NotFound)]);
    let e = evaluate(&new, Some(&old), &f, &opts());
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
    // Removing every entry too.
    let mut empty = old.clone();
    empty.status.storage_versions.clear();
    common::set_common_encoding_version(&mut empty, NOW);
    let e = evaluate(&empty, Some(&old), &f, &opts());
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
}

#[test]
fn an_old_violation_at_the_same_place_excuses_a_changed_entry() {
    // Entry "a" changes (new served version) but its bad decodableVersions[1] was already there,
    // with the same value (a changed bad value is a new violation: see
    // ratchet_carries_a_violation_over_only_when_its_value_is_unchanged).
    let old = pods(vec![entry("a", "v1", &["v1", "/x"], &[])]);
    let new = pods(vec![entry("a", "v1", &["v1", "/x", "V3"], &["v1"])]);
    let e = evaluate(&new, Some(&old), &live_facts(&new), &opts());
    let got: Vec<(&str, Severity)> = e
        .findings
        .iter()
        .map(|f| (f.violation.path.as_str(), f.severity))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "status.storageVersions[0].decodableVersions[1]",
                Severity::Warn
            ),
            (
                "status.storageVersions[0].decodableVersions[2]",
                Severity::Deny
            ),
        ]
    );
    // The same violation in another entry (another ID) is not excused.
    let new = pods(vec![
        entry("a", "v1", &["v1", "/x"], &[]),
        entry("b", "v1", &["v1", "/x"], &[]),
    ]);
    assert_update(
        &new,
        &old,
        &["warn [version-invalid] a", "deny [version-invalid] b"],
    );
}

#[test]
fn duplicate_ids_ratchet_by_count() {
    let a = entry("a", "v1", &["v1"], &[]);
    let a2 = entry("a", "v1", &["v1", "v2"], &[]);
    let a3 = entry("a", "v1", &["v1", "v3"], &[]);
    // A repeat of an unchanged entry is still a new duplicate.
    let old = pods(vec![a.clone()]);
    let new = pods(vec![a.clone(), a.clone()]);
    assert_update(&new, &old, &["deny [apiserverid-duplicate] a"]);
    // One duplicate already stored, one added.
    let old = pods(vec![a.clone(), a2.clone()]);
    let new = pods(vec![a, a2, a3]);
    assert_update(
        &new,
        &old,
        &[
            "warn [apiserverid-duplicate] a",
            "deny [apiserverid-duplicate] a",
        ],
    );
}

#[test]
fn conditions_ratchet_by_path() {
    let old = with_condition(condition("x", "True", "", "m"));
    let mut new = old.clone();
    assert_update(&new, &old, &["warn [condition-reason-empty]"]);
    new.status.conditions[0].message.clear();
    assert_update(
        &new,
        &old,
        &[
            "warn [condition-reason-empty]",
            "deny [condition-message-empty]",
        ],
    );
}

#[test]
fn kube_apiserver_periodic_rewrite_is_allowed() {
    // Three live apiservers, one stale: the 10-minute no-op rewrite is not denied.
    let sv = agreed(
        "apps.deployments",
        "apps/v1",
        &["apiserver-a", "apiserver-b", "apiserver-gone"],
    );
    let mut f = live_facts(&sv);
    f.insert("apiserver-gone".into(), LeaseLookup::NotFound);
    let e = evaluate(&sv, Some(&sv), &f, &opts());
    assert!(!e.is_denied());
    assert_eq!(e.warnings().count(), 1);
    assert!(violations(&sv).is_empty());
}

#[test]
fn valid_write_has_no_findings() {
    let ids = ["apiserver-a", "apiserver-b", "apiserver-c"];
    let sv = agreed("core.pods", "v1", &ids);
    let f = live_facts(&sv);
    assert_eq!(evaluate(&sv, None, &f, &opts()), Evaluation::default());
    assert_eq!(evaluate(&sv, Some(&sv), &f, &opts()), Evaluation::default());
}

#[test]
fn ratchet_carries_a_violation_over_only_when_its_value_is_unchanged() {
    // Outside entries: a bad condition type stays a warning while unchanged...
    let old = with_condition(condition("bad type!", "True", "r", "m"));
    let mut new = old.clone();
    assert_update(&new, &old, &["warn [condition-type-invalid]"]);
    // ...but changing it into another bad value is a new violation.
    new.status.conditions[0].type_ = "other bad!".into();
    assert_update(&new, &old, &["deny [condition-type-invalid]"]);
    // Inside an entry: the same place, another bad version.
    let old = pods(vec![entry("a", "v1", &["v1", "x/y/z"], &[])]);
    let new = pods(vec![entry("a", "v1", &["v1", "p/q/r"], &[])]);
    assert_update(&new, &old, &["deny [version-invalid] a"]);
}
