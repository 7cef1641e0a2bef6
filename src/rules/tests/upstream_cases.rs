//! Every upstream case of docs/upstream.md §2, in its order.

use super::*;

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
