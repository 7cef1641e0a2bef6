//! The ValidatingAdmissionPolicy companion (chart option `policy.enabled`, docs/policy.md), on a
//! real kube-apiserver:
//!
//! * it covers exactly the rules that need no lookups and that kube-apiserver does not enforce
//!   itself (the rule codes in its messages against the rule definitions);
//! * for the cases of those rules' unit tests (src/rules/tests.rs, made valid for upstream
//!   validation, which runs before admission), plus ratcheting cases, the policy and the webhook
//!   give the same verdict through the same apiserver (the webhook with every rule code, the
//!   policy with the first failing one, as kube-apiserver reports it), and both agree
//!   with the rules library;
//! * bound in Deny mode (failurePolicy Fail), it never denies kube-apiserver's own start-up
//!   writes: every StorageVersion is written again after a restart, the policy is still in
//!   force after it, and the apiserver's own metrics show no denial and no CEL error by it.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::PostParams;
use regex::Regex;
use serde_json::{json, Value};

use storageversion_webhook::model::StorageVersion;
use storageversion_webhook::rules::{self, Code};
use support::gc::create_lease;
use support::ops::{self, ok, render, run};
use support::{
    live_identity_lease, poll_until, registered_webhook, serial, storage_versions, ControlPlane,
};

/// The rules the policy must cover: no lease lookup, not enforced by kube-apiserver itself.
fn covered_codes() -> BTreeSet<&'static str> {
    Code::ALL
        .iter()
        .filter(|c| !c.is_upstream() && !c.as_str().starts_with("lease-"))
        .map(|c| c.as_str())
        .collect()
}

fn codes_in(text: &str) -> BTreeSet<String> {
    Regex::new(r"\[([a-z]+(?:-[a-z]+)+)\]")
        .expect("regex")
        .captures_iter(text)
        .map(|c| c[1].to_string())
        .collect()
}

/// The policy and binding the chart renders with `extra` values.
fn policy_objects(extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["--set", "policy.enabled=true"];
    args.extend_from_slice(extra);
    render(&args)
        .into_iter()
        .filter(|d| {
            [
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ]
            .contains(&ops::kind_of(d))
        })
        .collect()
}

#[test]
fn policy_covers_exactly_the_rules_that_need_no_lookup_and_upstream_lacks() {
    let docs = policy_objects(&[]);
    assert_eq!(docs.len(), 2, "policy and binding");
    let policy = ops::one(&docs, "ValidatingAdmissionPolicy");
    let mut codes = BTreeSet::new();
    for v in policy["spec"]["validations"]
        .as_array()
        .expect("validations")
    {
        let message = v["message"].as_str().expect("message");
        let found = codes_in(message);
        assert_eq!(found.len(), 1, "one rule code per validation: {message}");
        codes.extend(found);
    }
    let codes: BTreeSet<&str> = codes.iter().map(String::as_str).collect();
    assert_eq!(codes, covered_codes());
    assert_eq!(policy["spec"]["failurePolicy"], "Ignore");
    let binding = ops::one(&docs, "ValidatingAdmissionPolicyBinding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));

    // The schema refuses what kube-apiserver would.
    let refused: [(&[&str], &str); 2] = [
        (
            &[
                "policy.enabled=true",
                "policy.validationActions={Deny,Warn}",
            ],
            "Deny and Warn together accepted",
        ),
        (
            &["policy.failurePolicy=Sometimes"],
            "a bad failurePolicy accepted",
        ),
    ];
    for (values, what) in refused {
        let mut helm = ops::helm();
        helm.args(["template", "svw", "charts/storageversion-webhook"]);
        for v in values {
            helm.args(["--set", v]);
        }
        assert!(!run(&mut helm, None).status.success(), "{what}");
    }
}

// ----------------------------------------------------------------------------- cases --

struct Case {
    what: &'static str,
    /// StorageVersion name; each case has its own object.
    name: &'static str,
    /// The status stored before the judged write (none: the object has the empty status it was
    /// created with).
    stored: Option<Value>,
    /// The status the judged write sets.
    status: Value,
}

fn entry(id: &str, enc: &str, decodable: &[&str], served: &[&str]) -> Value {
    let mut e = json!({"apiServerID": id, "encodingVersion": enc, "decodableVersions": decodable});
    if !served.is_empty() {
        e["servedVersions"] = json!(served);
    }
    e
}

fn condition(type_: &str, status: &str) -> Value {
    json!({"type": type_, "status": status, "reason": "r", "message": "m",
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Entries, with commonEncodingVersion set exactly when they agree (upstream requires it).
fn status(entries: Vec<Value>, conditions: Vec<Value>) -> Value {
    let encs: BTreeSet<&str> = entries
        .iter()
        .filter_map(|e| e["encodingVersion"].as_str())
        .collect();
    let mut s = json!({"storageVersions": entries, "conditions": conditions});
    if encs.len() == 1 {
        s["commonEncodingVersion"] = json!(encs.iter().next().expect("one"));
    }
    s
}

const ALL: &str = "AllEncodingVersionsEqual";

/// The cases of the unit tests of the covered rules (src/rules/tests.rs:
/// encoding_group_must_match_the_name, repeated_versions_are_reported_at_each_later_index,
/// condition_status_must_be_a_defined_value, all_encoding_versions_equal_must_agree_with_common)
/// and of ratcheting. Entries use the apiserver IDs `a` and `b`, whose leases the test creates.
fn cases() -> Vec<Case> {
    let one = |name, enc, dec: &[&str]| Case {
        what: "encoding group",
        name,
        stored: None,
        status: status(vec![entry("a", enc, dec, &[])], vec![]),
    };
    let agree = || {
        vec![
            entry("a", "v1", &["v1"], &[]),
            entry("b", "v1", &["v1"], &[]),
        ]
    };
    let disagree = || {
        vec![
            entry("a", "v1", &["v1"], &[]),
            entry("b", "v2", &["v2"], &[]),
        ]
    };
    let cond = |name, status_value: &str, type_: &str, entries: Vec<Value>| Case {
        what: "conditions",
        name,
        stored: None,
        status: status(entries, vec![condition(type_, status_value)]),
    };
    let dup_stored = status(vec![entry("a", "v1", &["v1", "v1"], &[])], vec![]);
    vec![
        one("core.h11c01", "v1", &["v1"]),
        one("apps.h11c02", "apps/v1", &["apps/v1"]),
        one("core.h11c03", "v1", &["v1", "events.k8s.io/v1"]),
        one(
            "networking.k8s.io.h11c04",
            "networking.k8s.io/v1",
            &["networking.k8s.io/v1", "extensions/v1beta1"],
        ),
        one("core.h11c05", "apps/v1", &["apps/v1"]),
        one("apps.h11c06", "v1", &["v1"]),
        one("core.h11c07", "core/v1", &["core/v1"]),
        Case {
            what: "repeated versions",
            name: "core.h11c08",
            stored: None,
            status: status(
                vec![entry("a", "v1", &["v1", "v2", "v1", "v1"], &["v2", "v2"])],
                vec![],
            ),
        },
        cond("core.h11c09", "True", "Other", vec![]),
        cond("core.h11c10", "False", "Other", vec![]),
        cond("core.h11c11", "Unknown", "Other", vec![]),
        cond("core.h11c12", "Maybe", "Other", vec![]),
        cond("core.h11c13", "true", "Other", vec![]),
        cond("core.h11c14", "True", ALL, agree()),
        cond("core.h11c15", "False", ALL, disagree()),
        cond("core.h11c16", "Unknown", ALL, disagree()),
        cond("core.h11c17", "True", ALL, disagree()),
        cond("core.h11c18", "False", ALL, agree()),
        cond("core.h11c19", "True", "Other", disagree()),
        // Ratcheting: an unchanged entry with a violation next to a new valid one is allowed; a
        // changed entry keeping a violation it already had is allowed; a new violation in a
        // changed entry is denied.
        Case {
            what: "ratchet: unchanged entry",
            name: "core.h11c20",
            stored: Some(dup_stored.clone()),
            status: status(
                vec![
                    entry("a", "v1", &["v1", "v1"], &[]),
                    entry("b", "v1", &["v1"], &[]),
                ],
                vec![],
            ),
        },
        Case {
            what: "ratchet: old violation at the same place",
            name: "core.h11c21",
            stored: Some(dup_stored),
            status: status(vec![entry("a", "v1", &["v1", "v1", "v2"], &[])], vec![]),
        },
        Case {
            what: "ratchet: new violation",
            name: "core.h11c22",
            stored: Some(status(vec![entry("a", "v1", &["v1"], &[])], vec![])),
            status: status(vec![entry("a", "v1", &["v1", "v1"], &[])], vec![]),
        },
        Case {
            what: "ratchet: condition already wrong",
            name: "core.h11c23",
            stored: Some(status(disagree(), vec![condition(ALL, "True")])),
            status: status(
                vec![
                    entry("a", "v1", &["v1"], &[]),
                    entry("b", "v2", &["v2", "v1"], &[]),
                ],
                vec![condition(ALL, "True")],
            ),
        },
    ]
}

fn sv(name: &str, status: &Value) -> StorageVersion {
    serde_json::from_value(json!({
        "apiVersion": "internal.apiserver.k8s.io/v1alpha1",
        "kind": "StorageVersion",
        "metadata": {"name": name},
        "status": status,
    }))
    .expect("StorageVersion")
}

/// The rule codes the rules library denies for `case` (with ratcheting against the stored
/// object; lease data not given, so the lease rules are skipped). Asserts the written object
/// passes upstream validation, so admission sees it.
fn library_denials(case: &Case) -> BTreeSet<String> {
    let new = sv(case.name, &case.status);
    let upstream: Vec<_> = rules::violations(&new)
        .into_iter()
        .filter(|v| v.code.is_upstream())
        .collect();
    assert!(
        upstream.is_empty(),
        "{}: not valid upstream: {upstream:?}",
        case.name
    );
    let old = sv(case.name, case.stored.as_ref().unwrap_or(&json!({})));
    let opts = rules::RuleOptions {
        now: k8s_openapi::jiff::Timestamp::now(),
        lease_skew_allowance: Duration::from_secs(30),
    };
    rules::evaluate(&new, Some(&old), &rules::LeaseFacts::new(), &opts)
        .denials()
        .map(|f| f.violation.code.as_str().to_string())
        .collect()
}

/// Dry-run write of the case's status: Ok, or the denial text.
async fn judge(cp: &ControlPlane, case: &Case) -> Result<(), String> {
    let api = storage_versions(cp);
    let mut current = api.get(case.name).await.map_err(|e| e.to_string())?;
    current.status = serde_json::from_value(case.status.clone()).expect("status");
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match api.replace_status(case.name, &pp, &current).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err(format!("{} ({})", s.message, s.code)),
        Err(e) => Err(format!("not an admission verdict: {e}")),
    }
}

/// What one write got: allowed, or denied with these rule codes.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Allowed,
    Denied(BTreeSet<String>),
}

fn verdict(result: &Result<(), String>) -> Verdict {
    match result {
        Ok(()) => Verdict::Allowed,
        Err(text) => Verdict::Denied(codes_in(text)),
    }
}

/// The case that must be denied once the policy or the webhook is in force.
fn probe(cases: &[Case]) -> &Case {
    cases
        .iter()
        .find(|c| c.name == "core.h11c05")
        .expect("probe case")
}

/// `kubectl apply` (for real) of the chart's policy and binding with `extra` values.
fn apply_policy(cp: &ControlPlane, extra: &[&str]) {
    let docs = policy_objects(extra);
    let list = json!({"apiVersion": "v1", "kind": "List", "items": docs});
    ok(
        cp.kubectl().args(["apply", "-f", "-"]),
        Some(&list.to_string()),
    );
}

fn delete_policy(cp: &ControlPlane) {
    ok(
        cp.kubectl().args([
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            "svw-storageversion-webhook",
        ]),
        None,
    );
}

/// Waits up to a minute until the write of `probe` is denied (`denied`) or admitted.
async fn wait_for_probe(cp: &ControlPlane, probe: &Case, denied: bool, what: &str) {
    poll_until(Duration::from_secs(60), what, move || async move {
        judge(cp, probe).await.is_err() == denied
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_and_webhook_agree_and_the_policy_never_denies_apiserver_writes() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    for id in ["a", "b"] {
        create_lease(&cp, &live_identity_lease(id)).await;
    }
    let cases = cases();
    let probe_case = probe(&cases);
    for case in &cases {
        support::create_sv(&cp, case.name).await;
        if let Some(stored) = &case.stored {
            support::put_status(&cp, case.name, stored.clone())
                .await
                .unwrap_or_else(|e| panic!("{}: store: {e}", case.name));
        }
    }

    // 1. The policy alone (failurePolicy Fail, so a CEL error shows up as a denial here).
    apply_policy(&cp, &["--set", "policy.failurePolicy=Fail"]);
    wait_for_probe(&cp, probe_case, true, "the policy to be in force").await;
    let mut by_policy = Vec::new();
    for case in &cases {
        by_policy.push(judge(&cp, case).await);
    }
    delete_policy(&cp);
    wait_for_probe(&cp, probe_case, false, "the policy to be gone").await;

    // 2. The webhook alone.
    let (_certs, hook) = registered_webhook(&cp, &["--no-gc"], "Fail").await;
    wait_for_probe(&cp, probe_case, true, "the webhook to be called").await;
    let mut by_webhook = Vec::new();
    for case in &cases {
        by_webhook.push(judge(&cp, case).await);
    }
    support::unregister_webhook(&cp).await;

    let mut report = Vec::new();
    let mut denied = 0;
    for ((case, p), w) in cases.iter().zip(&by_policy).zip(&by_webhook) {
        let expected = library_denials(case);
        let want = if expected.is_empty() {
            Verdict::Allowed
        } else {
            Verdict::Denied(expected)
        };
        let (vp, vw) = (verdict(p), verdict(w));
        if want != Verdict::Allowed {
            denied += 1;
        }
        // kube-apiserver reports only the first validation of a policy that fails, so the
        // policy's codes are a non-empty part of the library's.
        let policy_agrees = match (&vp, &want) {
            (Verdict::Allowed, Verdict::Allowed) => true,
            (Verdict::Denied(got), Verdict::Denied(all)) => !got.is_empty() && got.is_subset(all),
            _ => false,
        };
        if !policy_agrees || vw != want {
            report.push(format!(
                "{} ({}): library {want:?}, policy {vp:?} {p:?}, webhook {vw:?} {w:?}",
                case.name, case.what
            ));
        }
        if let Err(text) = p {
            assert!(
                text.contains("ValidatingAdmissionPolicy"),
                "{}: {text}",
                case.name
            );
        }
        if let Err(text) = w {
            assert!(text.contains("admission webhook"), "{}: {text}", case.name);
        }
    }
    assert!(report.is_empty(), "verdicts differ:\n{}", report.join("\n"));
    assert!(
        denied >= 8 && denied < cases.len(),
        "{denied} of {} cases denied",
        cases.len()
    );
    let covered: BTreeSet<String> = cases.iter().flat_map(library_denials).collect();
    let covered: BTreeSet<&str> = covered.iter().map(String::as_str).collect();
    assert_eq!(
        covered,
        covered_codes(),
        "every covered rule has a denied case"
    );

    // 3. Bound in Deny mode, the policy never denies kube-apiserver's own writes: remove every
    // StorageVersion and restart the apiserver; it must write all of them again.
    drop(hook);
    apply_policy(&cp, &["--set", "policy.failurePolicy=Fail"]);
    wait_for_probe(&cp, probe_case, true, "the policy to be in force").await;
    let own: Vec<String> = storage_versions(&cp)
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter(|sv| {
            !sv.status.storage_versions.is_empty()
                && !sv.metadata.name.as_deref().unwrap_or("").contains("h11c")
        })
        .filter_map(|sv| sv.metadata.name)
        .collect();
    assert!(
        own.len() > 40,
        "only {} StorageVersions written by the apiserver",
        own.len()
    );
    ok(
        cp.kubectl()
            .args(["delete", "storageversions", "--all", "--wait=true"]),
        None,
    );
    cp.restart_apiserver();
    let api = storage_versions(&cp);
    let own_ref = &own;
    poll_until(
        Duration::from_secs(120),
        "kube-apiserver to write every StorageVersion again",
        move || {
            let api = api.clone();
            async move {
                let Ok(list) = api.list(&Default::default()).await else {
                    return false;
                };
                let written: BTreeSet<String> = list
                    .items
                    .into_iter()
                    .filter(|sv| !sv.status.storage_versions.is_empty())
                    .filter_map(|sv| sv.metadata.name)
                    .collect();
                own_ref.iter().all(|n| written.contains(n))
            }
        },
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}; kube-apiserver log:\n{}",
            tail(&cp.log("kube-apiserver"), 40)
        )
    });
    // kube-apiserver's own counter (since its restart) shows no denial and no CEL error by the
    // policy; and the policy was in force all along (kube-apiserver holds admission until its
    // policies are loaded) and still is.
    let after = policy_checks(&cp);
    assert_eq!(
        after.denied, 0.0,
        "the policy denied kube-apiserver writes: {after:?}"
    );
    assert_eq!(
        after.errors, 0.0,
        "CEL errors on kube-apiserver writes: {after:?}"
    );
    support::create_sv(&cp, probe(&cases).name).await;
    let still = judge(&cp, probe(&cases)).await;
    assert!(
        still
            .as_ref()
            .is_err_and(|e| e.contains("ValidatingAdmissionPolicy")),
        "the policy is not in force after the restart: {still:?}"
    );
    assert!(
        !cp.log("kube-apiserver")
            .contains("ValidatingAdmissionPolicy 'svw-storageversion-webhook'"),
        "kube-apiserver logged a denial by the policy"
    );
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[derive(Debug, Default)]
struct PolicyChecks {
    denied: f64,
    errors: f64,
}

/// kube-apiserver's `apiserver_validating_admission_policy_check_total` for the chart's policy,
/// by enforcement action (since the apiserver's start).
fn policy_checks(cp: &ControlPlane) -> PolicyChecks {
    let metrics = ok(cp.kubectl().args(["get", "--raw", "/metrics"]), None);
    let mut out = PolicyChecks::default();
    for line in metrics.lines() {
        if !line.starts_with("apiserver_validating_admission_policy_check_total{")
            || !line.contains(r#"policy="svw-storageversion-webhook""#)
        {
            continue;
        }
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if !line.contains(r#"error_type="no_error""#) {
            out.errors += value;
        }
        if !line.contains(r#"enforcement_action="allow""#) {
            out.denied += value;
        }
    }
    out
}
