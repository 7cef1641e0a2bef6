//! Ratcheting: what a write leaves unchanged only warns.

use super::*;

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
