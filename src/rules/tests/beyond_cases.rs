//! The rules beyond upstream.

use super::*;

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
