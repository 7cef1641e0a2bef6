//! The live-lease rule.

use super::*;

// ---------------------------------------------------------------------------------------------
// lease rule

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
