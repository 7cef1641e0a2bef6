use std::time::Duration;

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::crd::decide::Migration;

const STATE: &str = "svw/storageversion-webhook-crd";

/// A CRD with these (name, served, storage) versions, storedVersions and generation.
fn crd(versions: &[(&str, bool, bool)], stored: &[&str], generation: i64) -> Crd {
    let versions: Vec<_> = versions
        .iter()
        .map(|(name, served, storage)| {
            json!({"name": name, "served": served, "storage": storage,
                   "schema": {"openAPIV3Schema": {"type": "object"}}})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com", "uid": "uid-1", "generation": generation},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "widgets", "kind": "Widget"}, "versions": versions},
        "status": {"storedVersions": stored,
                   "conditions": [{"type": "Established", "status": "True"}]}
    }))
    .expect("crd")
}

/// Stored in v1beta1, now v1 (the flip a migration is running for).
fn migrating() -> Crd {
    crd(
        &[
            ("v1beta1", true, false),
            ("v1", true, true),
            ("v2", true, false),
        ],
        &["v1beta1", "v1"],
        2,
    )
}

/// `migrating()` with the storage version moved to v2.
fn flipped_to_v2() -> Crd {
    crd(
        &[
            ("v1beta1", true, false),
            ("v1", true, false),
            ("v2", true, true),
        ],
        &["v1beta1", "v1"],
        3,
    )
}

fn record(uid: &str, phase: Phase, generation: i64) -> Record {
    Record {
        uid: uid.into(),
        sequence: 1,
        failures: 0,
        migration: Some(Migration {
            name: "widgets.example.com-uid1-v1-1".into(),
            sequence: 1,
            method: Method::Rewrite,
            storage: "v1".into(),
            generation,
            stored: vec!["v1beta1".into(), "v1".into()],
            phase,
            message: String::new(),
        }),
    }
}

fn cx(record: Option<&Record>, mode: GuardMode) -> Context<'_> {
    Context {
        record,
        migrator: Some(Duration::from_secs(120)),
        mode,
        state: STATE,
    }
}

#[test]
fn an_update_that_keeps_the_storage_version_passes_untouched() {
    let old = migrating();
    let running = record("uid-1", Phase::Running, 2);
    // v2 no longer served, and a schema change: the storage version stays v1.
    let new = crd(
        &[
            ("v1beta1", true, false),
            ("v1", true, true),
            ("v2", false, false),
        ],
        &["v1beta1", "v1"],
        3,
    );
    for new in [&old, &new] {
        let v = judge(&old, new, &cx(Some(&running), GuardMode::Deny));
        assert_eq!(
            v,
            Verdict {
                code: "unchanged",
                ..Verdict::default()
            }
        );
    }
}

#[test]
fn a_storage_change_during_our_migration_is_denied_and_says_when_it_is_allowed() {
    let running = record("uid-1", Phase::Running, 2);
    let v = judge(
        &migrating(),
        &flipped_to_v2(),
        &cx(Some(&running), GuardMode::Deny),
    );
    let message = v.denied.expect("denied");
    assert_eq!(v.code, "storage_change_during_migration");
    for part in [
        "widgets.example.com",
        "from v1 to v2",
        "widgets.example.com-uid1-v1-1",
        "its own rewrite",
        "Allowed once the migration has finished",
        STATE,
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    assert!(v.warnings.is_empty());
    // --crd-guard=warn: the same text, as a warning.
    let w = judge(
        &migrating(),
        &flipped_to_v2(),
        &cx(Some(&running), GuardMode::Warn),
    );
    assert_eq!(w.denied, None);
    assert_eq!(w.warnings, vec![message]);
}

#[test]
fn a_record_that_is_not_a_running_migration_of_this_crd_denies_nothing() {
    let others = [
        record("uid-2", Phase::Running, 2), // another CRD object of the same name
        record("uid-1", Phase::Succeeded, 2), // finished
        record("uid-1", Phase::Failed, 2),
        record("uid-1", Phase::Abandoned, 2),
        record("uid-1", Phase::Running, 1), // began on an older generation: abandoned anyway
        Record {
            uid: "uid-1".into(),
            sequence: 1,
            failures: 0,
            migration: None,
        },
    ];
    for r in others.iter().map(Some).chain([None]) {
        let v = judge(&migrating(), &flipped_to_v2(), &cx(r, GuardMode::Deny));
        assert_eq!(v.denied, None, "{r:?}");
        assert_eq!(v.code, "storage_change", "{r:?}");
        assert_eq!(v.warnings.len(), 1);
        assert!(
            v.warnings[0].contains("held still for 120s"),
            "{:?}",
            v.warnings
        );
        assert!(v.warnings[0].contains("storedVersions"), "{:?}", v.warnings);
    }
}

#[test]
fn a_storage_change_without_the_migrator_says_how_to_finish_it() {
    let old = crd(
        &[("v1beta1", true, true), ("v1", true, false)],
        &["v1beta1"],
        1,
    );
    let new = crd(
        &[("v1beta1", true, false), ("v1", true, true)],
        &["v1beta1"],
        2,
    );
    let without = Context {
        migrator: None,
        ..cx(None, GuardMode::Deny)
    };
    let v = judge(&old, &new, &without);
    assert_eq!(v.denied, None);
    let w = &v.warnings[0];
    for part in [
        "from v1beta1 to v1",
        "stay stored in v1beta1",
        "serve --crd-migrate",
        "StorageVersionMigration of widgets.example.com",
        "status.storedVersions to [v1]",
    ] {
        assert!(w.contains(part), "{part:?} not in {w:?}");
    }
}

#[test]
fn messages_stay_bounded_whatever_the_names() {
    let long = "v".repeat(100_000);
    let old = migrating();
    let new = crd(&[(long.as_str(), true, true)], &["v1beta1", "v1"], 3);
    let running = record("uid-1", Phase::Running, 2);
    for mode in [GuardMode::Deny, GuardMode::Warn] {
        let v = judge(&old, &new, &cx(Some(&running), mode));
        let text = v
            .denied
            .iter()
            .chain(&v.warnings)
            .map(String::len)
            .sum::<usize>();
        assert!(text < 2 * 1024, "{text} bytes");
    }
}

fn arb_crd() -> impl Strategy<Value = Crd> {
    let names = ["v1alpha1", "v1beta1", "v1", "v2"];
    (
        proptest::collection::vec((0..4usize, any::<bool>(), any::<bool>()), 0..5),
        proptest::collection::vec(0..4usize, 0..4),
        1..4i64,
    )
        .prop_map(move |(versions, stored, generation)| {
            let versions: Vec<(&str, bool, bool)> = versions
                .into_iter()
                .map(|(n, served, storage)| (names[n], served, storage))
                .collect();
            let stored: Vec<&str> = stored.into_iter().map(|n| names[n]).collect();
            crd(&versions, &stored, generation)
        })
}

fn arb_record() -> impl Strategy<Value = Option<Record>> {
    let phases = [
        Phase::Running,
        Phase::Succeeded,
        Phase::Failed,
        Phase::Abandoned,
    ];
    proptest::option::of((any::<bool>(), 0..4usize, 1..4i64)).prop_map(move |r| {
        r.map(|(same_uid, phase, generation)| {
            record(
                if same_uid { "uid-1" } else { "uid-2" },
                phases[phase],
                generation,
            )
        })
    })
}

proptest! {
    /// I9: whatever the two objects and the record, a denial is always of a storage-version
    /// change while a migration of ours runs and still covers the CRD.
    #[test]
    fn only_a_storage_flip_during_a_migration_is_ever_denied(
        old in arb_crd(), new in arb_crd(), record in arb_record(), warn in any::<bool>()
    ) {
        let mode = if warn { GuardMode::Warn } else { GuardMode::Deny };
        let v = judge(&old, &new, &cx(record.as_ref(), mode));
        if v.denied.is_some() {
            prop_assert!(mode == GuardMode::Deny);
            prop_assert!(new.storage_version().is_some());
            prop_assert_ne!(old.storage_version(), new.storage_version());
            let m = record.as_ref().and_then(|r| r.migration.as_ref()).expect("a record");
            prop_assert_eq!(m.phase, Phase::Running);
            prop_assert!(m.covers(&old.snapshot()));
        }
        if old.storage_version() == new.storage_version() {
            prop_assert_eq!(v, Verdict { code: "unchanged", ..Verdict::default() });
        }
    }
}
