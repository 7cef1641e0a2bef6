//! Property tests of the admission rules:
//! - an object whose common version and condition were recomputed by
//!   `set_common_encoding_version` never breaks the common-version or condition-agreement rules;
//! - the verdict does not depend on the order of `status.storageVersions`.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use proptest::sample::select;
use storageversion_webhook::model::{
    LeaseLookup, LeaseRecord, ServerStorageVersion, StorageVersion, StorageVersionCondition,
    ALL_ENCODING_VERSIONS_EQUAL,
};
use storageversion_webhook::rules::{
    common, evaluate, violations, Code, Evaluation, LeaseFacts, RuleOptions, Severity,
};

const NOW: &str = "2026-01-01T00:00:00Z";
const IDS: &[&str] = &["apiserver-a", "apiserver-b", "apiserver-c", "Bad_ID", ""];
const VERSIONS: &[&str] = &["v1", "v2", "apps/v1", "events.k8s.io/v1", "/v3", "v1/x/y"];
const NAMES: &[&str] = &["core.pods", "apps.deployments", "core.events", "pods"];

fn opts() -> RuleOptions {
    RuleOptions {
        now: NOW.parse().unwrap(),
        lease_skew_allowance: Duration::from_secs(30),
    }
}

fn version() -> impl Strategy<Value = String> {
    select(VERSIONS).prop_map(str::to_owned)
}

fn entry() -> impl Strategy<Value = ServerStorageVersion> {
    (
        select(IDS),
        version(),
        prop::collection::vec(version(), 0..4),
        prop::collection::vec(version(), 0..3),
    )
        .prop_map(|(id, enc, decodable, served)| ServerStorageVersion {
            api_server_id: id.to_owned(),
            encoding_version: enc,
            decodable_versions: decodable,
            served_versions: served,
        })
}

fn entries() -> impl Strategy<Value = Vec<ServerStorageVersion>> {
    prop::collection::vec(entry(), 0..6)
}

fn condition() -> impl Strategy<Value = StorageVersionCondition> {
    (
        select(&[ALL_ENCODING_VERSIONS_EQUAL, "Other", "-x"][..]),
        select(&["True", "False", "Unknown", "Maybe", "-True", ""][..]),
        select(&["", "r"][..]),
        select(&["", "m"][..]),
    )
        .prop_map(|(t, s, r, m)| StorageVersionCondition {
            type_: t.to_owned(),
            status: s.to_owned(),
            reason: r.to_owned(),
            message: m.to_owned(),
            ..Default::default()
        })
}

fn object() -> impl Strategy<Value = StorageVersion> {
    (
        select(NAMES),
        entries(),
        prop::option::of(version()),
        prop::collection::vec(condition(), 0..3),
    )
        .prop_map(|(name, entries, common, conditions)| {
            let mut sv = StorageVersion::default();
            sv.metadata.name = Some(name.to_owned());
            sv.status.storage_versions = entries;
            sv.status.common_encoding_version = common;
            sv.status.conditions = conditions;
            sv
        })
}

fn lease_lookup(id: &'static str) -> impl Strategy<Value = Option<LeaseLookup>> {
    let now = NOW.parse::<Timestamp>().unwrap().as_second();
    let record = move |label: Option<&str>, renewed_ago: Option<i64>, duration: Option<i32>| {
        LeaseLookup::Found(LeaseRecord {
            name: id.to_owned(),
            identity_label: label.map(str::to_owned),
            renew_time: renewed_ago.map(|ago| Timestamp::from_second(now - ago).unwrap()),
            lease_duration_seconds: duration,
        })
    };
    prop_oneof![
        Just(None),
        Just(Some(LeaseLookup::Unknown)),
        Just(Some(LeaseLookup::NotFound)),
        Just(Some(LeaseLookup::Failed("timeout".into()))),
        Just(Some(record(Some("kube-apiserver"), Some(10), Some(3600)))),
        Just(Some(record(Some("kube-apiserver"), Some(7200), Some(3600)))),
        Just(Some(record(Some("kube-apiserver"), None, Some(3600)))),
        Just(Some(record(Some("other"), Some(10), Some(3600)))),
        Just(Some(record(None, Some(10), Some(3600)))),
    ]
}

fn lease_facts() -> impl Strategy<Value = LeaseFacts> {
    IDS.iter()
        .map(|id| lease_lookup(id))
        .collect::<Vec<_>>()
        .prop_map(|lookups| {
            IDS.iter()
                .zip(lookups)
                .filter_map(|(id, l)| l.map(|l| (id.to_string(), l)))
                .collect()
        })
}

/// A stored object `new` could be an update of: `new` with only some of its entries (so that
/// the others count as added and the kept ones as unchanged).
fn stored_version_of(new: StorageVersion) -> impl Strategy<Value = StorageVersion> {
    let entries = new.status.storage_versions.clone();
    let n = entries.len();
    prop::sample::subsequence(entries, 0..=n).prop_map(move |kept| {
        let mut old = new.clone();
        old.status.storage_versions = kept;
        old
    })
}

/// Findings as a sorted multiset of (code, denies?, entry id), then denied?, then skipped?.
type Verdict = (Vec<(Code, bool, Option<String>)>, bool, bool);

fn verdict(e: &Evaluation) -> Verdict {
    let mut findings: Vec<_> = e
        .findings
        .iter()
        .map(|f| {
            (
                f.violation.code,
                f.severity == Severity::Deny,
                f.violation.entry_id.clone(),
            )
        })
        .collect();
    findings.sort();
    (findings, e.is_denied(), e.lease_rule_skipped)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn recomputed_common_version_is_always_consistent(
        mut sv in object().prop_map(|mut sv| {
            // At most one condition of the type that set_common_encoding_version owns.
            let mut seen = false;
            sv.status.conditions.retain(|c| {
                let keep = c.type_ != ALL_ENCODING_VERSIONS_EQUAL || !seen;
                seen |= c.type_ == ALL_ENCODING_VERSIONS_EQUAL;
                keep
            });
            sv
        }),
        facts in lease_facts(),
    ) {
        common::set_common_encoding_version(&mut sv, NOW);
        let bad = |code: Code| code == Code::CommonVersionMismatch
            || code == Code::ConditionDisagreesWithCommon;
        for v in violations(&sv) {
            prop_assert!(!bad(v.code), "{v}");
        }
        let e = evaluate(&sv, None, &facts, &opts());
        for f in &e.findings {
            prop_assert!(!bad(f.violation.code), "{}", f.violation);
        }
        // Exactly one condition of the type, agreeing with the common version.
        let owned: Vec<_> = sv.status.encoding_conditions().collect();
        prop_assert_eq!(owned.len(), 1);
        let want = if sv.status.common_encoding_version.is_some() { "True" } else { "False" };
        prop_assert_eq!(owned[0].status.as_str(), want);
    }

    #[test]
    fn entry_order_does_not_change_the_verdict(
        (new, shuffled, old) in object().prop_flat_map(|sv| {
            let entries = sv.status.storage_versions.clone();
            (
                Just(sv.clone()),
                Just(entries).prop_shuffle(),
                prop::option::of(prop_oneof![object(), stored_version_of(sv)]),
            )
        }),
        facts in lease_facts(),
    ) {
        let mut reordered = new.clone();
        reordered.status.storage_versions = shuffled;
        let a = evaluate(&new, old.as_ref(), &facts, &opts());
        let b = evaluate(&reordered, old.as_ref(), &facts, &opts());
        prop_assert_eq!(verdict(&a), verdict(&b));
    }

    #[test]
    fn reordering_the_stored_object_changes_nothing_either(
        new in object(),
        (old, shuffled) in object().prop_flat_map(|sv| {
            let entries = sv.status.storage_versions.clone();
            (Just(sv), Just(entries).prop_shuffle())
        }),
        facts in lease_facts(),
    ) {
        let mut old_reordered = old.clone();
        old_reordered.status.storage_versions = shuffled;
        let a = evaluate(&new, Some(&old), &facts, &opts());
        let b = evaluate(&new, Some(&old_reordered), &facts, &opts());
        prop_assert_eq!(verdict(&a), verdict(&b));
    }

    #[test]
    fn an_unchanged_write_is_never_denied(
        sv in object(),
        facts in lease_facts(),
    ) {
        let e = evaluate(&sv, Some(&sv), &facts, &opts());
        prop_assert!(!e.is_denied(), "{:#?}", e.findings);
    }
}
