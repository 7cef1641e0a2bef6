//! `serve --migrate` against a real control plane: the upgrade of kube-apiserver from an
//! emulated 1.36 (stores MutatingAdmissionPolicies as v1beta1) to 1.37 (v1) ends with the
//! objects in etcd rewritten as v1 by kube-controller-manager's storage-version-migrator
//! (read from etcd with etcdctl); an apiserver rolled back and objects written through it, then
//! upgraded again, end the same way with a second migration; no migration while apiservers
//! disagree, to a version a rollback abandoned, for an undecodable version, or twice (restart,
//! two replicas); a failed migration is reported once (metrics, Event, audit) and not
//! re-created.

mod support;

use std::time::{Duration, Instant};

use storageversion_webhook::migrate::svm::{self, Phase};
use support::gc::{create_lease, kcm_start, kubectl_apply, seed_sv};
use support::migrate::*;
use support::{
    live_identity_lease, poll_until, put_status, serial, storage_versions, Certs, ControlPlane,
    Webhook,
};

const MINUTE: Duration = Duration::from_secs(60);
const MAP_SV: &str = "admissionregistration.k8s.io.mutatingadmissionpolicies";
/// Its bindings: no objects here, but their entries disagree with the policies' during the
/// rollback, so they get a migration each time too.
const MAPB_SV: &str = "admissionregistration.k8s.io.mutatingadmissionpolicybindings";
const MAP_GROUP: &str = "admissionregistration.k8s.io";
const MAP_PREFIX: &str = "/registry/mutatingadmissionpolicies/";
/// The migrator controller needs the garbage collector's dependency graph.
const KCM_MIGRATOR: &str =
    "--controllers=storage-version-migrator-controller,garbage-collector-controller";

/// A value that differs from call to call.
fn rand_probe() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

fn map_policy(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["limitranges"],
            }]},
            "mutations": [{
                "patchType": "ApplyConfiguration",
                "applyConfiguration": {
                    "expression": "Object{metadata: Object.metadata{labels: {\"svw-e2e\": \"yes\"}}}"
                },
            }],
        },
    })
}

async fn common_version(cp: &ControlPlane, name: &str) -> Option<String> {
    storage_versions(cp)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|sv| sv.status.common_encoding_version)
}

/// Creates live leases for `A` and `B`, and `W_SV` with their entries agreeing on v1 (and
/// decoding v1 and v2).
async fn seed_agreeing_on_v1(cp: &ControlPlane) {
    for id in [A, B] {
        create_lease(cp, &live_identity_lease(id)).await;
    }
    seed_sv(
        cp,
        W_SV,
        two_entries("v1", "v1", &["v1", "v2"], &["v1", "v2"]),
    )
    .await;
}

/// Stops `hook` (it must exit cleanly), starts a new replica with `settle`, waits until it leads
/// and has made five passes, and asserts that it created and reported nothing again. Returns
/// the new replica and its metrics.
async fn restart_quietly(
    cp: &ControlPlane,
    mut hook: Webhook,
    certs: &Certs,
    settle: &str,
) -> (Webhook, String) {
    let status = hook.terminate();
    assert!(status.success(), "serve exited with {status}");
    let hook = start_replica(cp, certs, settle).await;
    poll_until(MINUTE, "the restarted replica to lead", || async {
        leads(&hook.metrics().await)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    wait_passes(&hook, 5.0).await;
    let m = hook.metrics().await;
    assert_eq!(migration_metric(&m, "created_total", &[]), 0.0, "{m}");
    assert_eq!(migration_metric(&m, "outcomes_total", &[]), 0.0, "{m}");
    (hook, m)
}

/// The upgrade this feature is for, on two real kube-apiservers sharing one etcd: objects written
/// while both emulated 1.36 are stored as v1beta1. The first is upgraded to 1.37: the entries
/// disagree, and no migration is created however long that lasts. The second is upgraded: after
/// the settle time one migration is created and kube-controller-manager rewrites the objects:
/// etcd holds v1. A restarted webhook creates and reports nothing more, and `audit` finds
/// nothing left to migrate. Then one apiserver is rolled back to 1.36 and objects are created
/// through it (stored as v1beta1; `audit` reports the resource), and it is upgraded again: the
/// entries agree on v1, the version already migrated to, and a second migration (a new name)
/// leaves every object in etcd as v1; `audit` is clean again.
#[tokio::test(flavor = "multi_thread")]
async fn upgrade_rewrites_stored_objects_in_the_agreed_version() {
    let _serial = serial().await;
    let t_test = Instant::now();
    let cp = ControlPlane::up_with(&["--apiservers", "2", "--emulated-version", "1.36"]).await;
    let v1beta1 = format!("{MAP_GROUP}/v1beta1");
    let v1 = format!("{MAP_GROUP}/v1");
    poll_until(
        MINUTE,
        "the 1.36 apiserver to store MutatingAdmissionPolicies as v1beta1",
        || async { common_version(&cp, MAP_SV).await.as_deref() == Some(v1beta1.as_str()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<String> = (0..3).map(|i| format!("svw-e2e-policy-{i}")).collect();
    for n in &names {
        kubectl_apply(&cp, &map_policy(n));
    }
    let before = stored_versions(&cp, MAP_PREFIX);
    assert_eq!(before.len(), names.len(), "{before:?}");
    assert!(
        before.values().all(|v| *v == v1beta1),
        "stored before: {before:?}"
    );

    let certs = Certs::generate();
    let settle = Duration::from_secs(4);
    let hook = start_replica(&cp, &certs, "4s").await;
    wait_remembered(&cp, MAP_SV, &v1beta1).await;

    // Upgrade apiserver 1 (the webhook and kubectl talk to 0): a mixed control plane.
    cp.run(&["upgrade-apiserver", "1", "--version", "1.37"]);
    poll_until(
        MINUTE,
        "the entries of 1.36 and 1.37 to disagree",
        || async {
            storage_versions(&cp)
                .get_opt(MAP_SV)
                .await
                .ok()
                .flatten()
                .is_some_and(|sv| {
                    sv.status.common_encoding_version.is_none()
                        && sv
                            .status
                            .storage_versions
                            .iter()
                            .any(|e| e.encoding_version == v1)
                })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(settle * 2).await;
    wait_passes(&hook, 3.0).await;
    assert!(
        migrations_of(&cp, MAP_GROUP, "mutatingadmissionpolicies")
            .await
            .is_empty(),
        "a migration while the apiservers disagree"
    );
    let m = hook.metrics().await;
    assert!(
        migration_metric(&m, "resources", &["state=\"disagree\""]) >= 1.0,
        "{m}"
    );
    // Not even tried (an emulated 1.36 does not serve storagemigration.k8s.io/v1).
    assert_eq!(migration_metric(&m, "created_total", &[]), 0.0, "{m}");
    assert_eq!(
        migration_metric(&m, "errors_total", &["operation=\"create_migration\""]),
        0.0,
        "{m}"
    );

    // Upgrade apiserver 0, then run the migrator.
    cp.run(&["upgrade-apiserver", "0", "--version", "1.37"]);
    kcm_start(&cp, &[KCM_MIGRATOR]);
    let migration = svm::migration_name(MAP_SV, &v1, 1);
    let end = Instant::now() + 2 * MINUTE;
    let created = loop {
        let found = migrations_of(&cp, MAP_GROUP, "mutatingadmissionpolicies").await;
        if let Some(m) = found.first() {
            assert_eq!(found.len(), 1, "{found:#?}");
            assert_eq!(m.name(), migration);
            break m.clone();
        }
        assert!(
            Instant::now() < end,
            "no migration after the upgrade; logs:\n{}",
            hook.logs_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Not before the settle time: kube-apiserver set AllEncodingVersionsEqual to True when the
    // entries came to agree (both timestamps have whole seconds).
    let sv = storage_versions(&cp)
        .get(MAP_SV)
        .await
        .expect("the StorageVersion");
    assert_eq!(
        sv.status.common_encoding_version.as_deref(),
        Some(v1.as_str())
    );
    let agreed_at: k8s_openapi::jiff::Timestamp = sv
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "AllEncodingVersionsEqual" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_deref())
        .expect("AllEncodingVersionsEqual=True with a lastTransitionTime")
        .parse()
        .expect("an RFC 3339 lastTransitionTime");
    let created_at = created
        .metadata
        .creation_timestamp
        .as_ref()
        .expect("creationTimestamp")
        .0;
    let waited = created_at.duration_since(agreed_at);
    assert!(
        waited.as_secs_f64() + 1.0 >= settle.as_secs_f64(),
        "migration created {waited:?} after v1 was agreed; the settle time is {settle:?}"
    );
    eprintln!("migration created {waited:?} after the apiservers agreed (settle {settle:?})");

    let t_migrate = Instant::now();
    let done = wait_phase(&cp, &migration, Phase::Succeeded, 2 * MINUTE).await;
    eprintln!(
        "migration of {} MutatingAdmissionPolicies: Succeeded {:?} after creation (seen {:?} after we saw it), {:?}",
        names.len(),
        done.duration_seconds(),
        t_migrate.elapsed(),
        done.phase_message()
    );
    let after = stored_versions(&cp, MAP_PREFIX);
    assert_eq!(after.len(), names.len(), "{after:?}");
    assert!(
        after.values().all(|v| *v == v1),
        "stored after the migration: {after:?}"
    );

    // Reported: metrics, an Event on the StorageVersion, the ConfigMap.
    poll_until(MINUTE, "the success to be reported", || async {
        let m = hook.metrics().await;
        migration_metric(&m, "outcomes_total", &["result=\"succeeded\""]) >= 1.0
            && event_count(&cp, MAP_SV, "MigrationSucceeded").await == 1
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    let m = hook.metrics().await;
    assert_eq!(
        migration_metric(&m, "created_total", &["result=\"created\""]),
        {
            // Every resource whose version changed with the upgrade got its migration.
            migrations(&cp).await.unwrap_or_default().len() as f64
        }
    );
    assert_eq!(event_count(&cp, MAP_SV, "MigrationCreated").await, 1);
    let remembered = record(&cp, MAP_SV)
        .await
        .expect("the state of the resource");
    assert_eq!(remembered.agreed.as_deref(), Some(v1.as_str()));
    assert_eq!(remembered.migration.as_deref(), Some(migration.as_str()));

    // A restarted webhook creates no second migration and reports nothing again.
    let (hook, _) = restart_quietly(&cp, hook, &certs, "4s").await;
    assert_eq!(
        migrations_of(&cp, MAP_GROUP, "mutatingadmissionpolicies")
            .await
            .len(),
        1
    );
    assert_eq!(event_count(&cp, MAP_SV, "MigrationSucceeded").await, 1);

    let (_, report) = audit_json(&cp);
    assert!(report.get("staleStorage").is_none(), "{report:#}");
    eprintln!("upgrade took {:?}", t_test.elapsed());

    // Rollback: apiserver 0 (the one kubectl talks to) back to 1.36, and objects created
    // through it, stored as v1beta1 although a migration to v1 has succeeded.
    cp.run(&["upgrade-apiserver", "0", "--emulated-version", "1.36"]);
    let rolled: Vec<String> = (3..5).map(|i| format!("svw-e2e-policy-{i}")).collect();
    for n in &rolled {
        kubectl_apply(&cp, &map_policy(n));
    }
    let mixed = stored_versions(&cp, MAP_PREFIX);
    for n in &rolled {
        let stored = mixed.iter().find(|(k, _)| k.ends_with(n.as_str()));
        assert_eq!(
            stored.map(|(_, v)| v.as_str()),
            Some(v1beta1.as_str()),
            "{n} stored during the rollback: {mixed:?}"
        );
    }
    // In between, audit reports the leftover (the entries disagree now).
    let (code, report) = audit_json(&cp);
    assert_ne!(code, 0, "audit clean during the rollback: {report:#}");
    assert!(
        stale_storage_names(&report).contains(&MAP_SV.to_string()),
        "{report:#}"
    );

    // Upgraded again: the entries agree on v1, the version already migrated to. Objects written
    // in v1beta1 since that migration make a second one, with a new name.
    cp.run(&["upgrade-apiserver", "0", "--version", "1.37"]);
    poll_until(MINUTE, "the entries to agree on v1 again", || async {
        common_version(&cp, MAP_SV).await.as_deref() == Some(v1.as_str())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let (code, report) = audit_json(&cp);
    assert_ne!(
        code, 0,
        "audit clean before the second migration succeeded: {report:#}"
    );
    assert!(
        stale_storage_names(&report).contains(&MAP_SV.to_string()),
        "{report:#}"
    );
    let second = svm::migration_name(MAP_SV, &v1, 2);
    wait_phase(&cp, &second, Phase::Succeeded, 3 * MINUTE).await;
    let after = stored_versions(&cp, MAP_PREFIX);
    assert_eq!(after.len(), names.len() + rolled.len(), "{after:?}");
    assert!(
        after.values().all(|v| *v == v1),
        "stored after the re-upgrade's migration: {after:?}"
    );
    assert_eq!(
        migrations_of(&cp, MAP_GROUP, "mutatingadmissionpolicies")
            .await
            .len(),
        2,
        "exactly one more migration"
    );
    // The bindings' second migration too (kube-controller-manager finishes one of a resource
    // without objects only once its informer has seen a resourceVersion past the migration's,
    // which for a quiet resource can take a watch bookmark interval).
    let t_bindings = Instant::now();
    wait_phase(
        &cp,
        &svm::migration_name(MAPB_SV, &v1, 2),
        Phase::Succeeded,
        3 * MINUTE,
    )
    .await;
    eprintln!(
        "the bindings' second migration succeeded {:?} after the policies'",
        t_bindings.elapsed()
    );
    if let Err(e) = poll_until(MINUTE, "audit to find nothing left", || async {
        audit_json(&cp).1.get("staleStorage").is_none()
    })
    .await
    {
        let phases: Vec<(String, Phase)> = migrations(&cp)
            .await
            .unwrap_or_default()
            .iter()
            .map(|m| (m.name().to_string(), m.phase()))
            .collect();
        panic!(
            "{e}; audit:\n{:#}\nmigrations: {phases:?}\nkube-controller-manager log:\n{}\nlogs:\n{}",
            audit_json(&cp).1,
            tail(&cp.log("kube-controller-manager"), 40),
            hook.logs_text()
        );
    }
    eprintln!(
        "upgrade, rollback and re-upgrade took {:?}",
        t_test.elapsed()
    );
}

/// The StorageVersion names `audit --output json` lists under `staleStorage`.
fn stale_storage_names(report: &serde_json::Value) -> Vec<String> {
    report["staleStorage"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["storageVersion"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

const W_GROUP: &str = "svw.example.com";
const W_SV: &str = "svw.example.com.widgets";
const A: &str = "apiserver-e2emigrateaaaaaaaaaaaaaa";
const B: &str = "apiserver-e2emigratebbbbbbbbbbbbbb";

/// A status with entry A encoding `va` and B encoding `vb`, both decoding `dec`, and the common
/// version and condition kube-apiserver would write.
fn two_entries(va: &str, vb: &str, dec_a: &[&str], dec_b: &[&str]) -> serde_json::Value {
    let q = |v: &str| format!("{W_GROUP}/{v}");
    let qs = |d: &[&str]| d.iter().map(|v| q(v)).collect::<Vec<_>>();
    let same = va == vb;
    let mut status = serde_json::json!({
        "storageVersions": [
            {"apiServerID": A, "encodingVersion": q(va), "decodableVersions": qs(dec_a)},
            {"apiServerID": B, "encodingVersion": q(vb), "decodableVersions": qs(dec_b)},
        ],
        "conditions": [{
            "type": "AllEncodingVersionsEqual",
            "status": if same { "True" } else { "False" },
            "reason": if same { "CommonEncodingVersionSet" } else { "CommonEncodingVersionUnset" },
            "message": if same { "Common encoding version set" } else { "Common encoding version unset" },
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }],
    });
    if same {
        status["commonEncodingVersion"] = serde_json::json!(q(va));
    }
    status
}

async fn set(cp: &ControlPlane, status: serde_json::Value) {
    put_status(cp, W_SV, status)
        .await
        .expect("write the StorageVersion status");
}

async fn widget_migrations(cp: &ControlPlane) -> Vec<String> {
    migrations_of(cp, W_GROUP, "widgets")
        .await
        .iter()
        .map(|m| m.name().to_string())
        .collect()
}

/// Two apiservers' entries (with live identity leases) driven by the test, two `serve
/// --migrate` replicas: nothing while they disagree, nothing to the new version after a
/// rollback within the settle time (but one back to the old version, since objects may have
/// been written in the new one meanwhile); exactly one migration, with the next number, once
/// they agree on the new version for the settle time, and none more when the leader stops and
/// the other replica takes over.
#[tokio::test(flavor = "multi_thread")]
async fn migrates_once_and_only_after_agreement_settles() {
    let _serial = serial().await;
    let t_test = Instant::now();
    let cp = ControlPlane::up().await;
    seed_agreeing_on_v1(&cp).await;
    let certs = Certs::generate();
    let settle = Duration::from_secs(5);
    let mut a = start_replica(&cp, &certs, "5s").await;
    let mut b = start_replica(&cp, &certs, "5s").await;
    poll_until(MINUTE, "one replica to lead", || async {
        leads(&a.metrics().await) != leads(&b.metrics().await)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    wait_remembered(&cp, W_SV, &format!("{W_GROUP}/v1")).await;
    let a_leads = leads(&a.metrics().await);
    let (leader, follower) = if a_leads {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };

    // Disagreement for twice the settle time.
    set(&cp, two_entries("v2", "v1", &["v1", "v2"], &["v1", "v2"])).await;
    tokio::time::sleep(settle * 2).await;
    wait_passes(leader, 2.0).await;
    assert!(widget_migrations(&cp).await.is_empty());
    assert!(
        migration_metric(
            &leader.metrics().await,
            "resources",
            &["state=\"disagree\""]
        ) >= 1.0
    );

    // Upgrade finished, then rolled back before the settle time ended.
    set(&cp, two_entries("v2", "v2", &["v1", "v2"], &["v1", "v2"])).await;
    poll_until(
        MINUTE,
        "the leader to see the new agreement settling",
        || async {
            migration_metric(
                &leader.metrics().await,
                "resources",
                &["state=\"settling\""],
            ) >= 1.0
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", leader.logs_text()));
    assert!(
        widget_migrations(&cp).await.is_empty(),
        "a migration to v2 before the settle time"
    );
    set(&cp, two_entries("v1", "v2", &["v1", "v2"], &["v1", "v2"])).await;
    set(&cp, two_entries("v1", "v1", &["v1", "v2"], &["v1", "v2"])).await;
    // Rolled back to v1: nothing went to v2. Objects may have been written in v2 meanwhile, so
    // once v1 has held for the settle time they are migrated back to v1: one migration.
    let back = svm::migration_name(W_SV, &format!("{W_GROUP}/v1"), 1);
    poll_until(MINUTE, "the migration back to v1", || async {
        widget_migrations(&cp).await == vec![back.clone()]
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", leader.logs_text()));
    wait_passes(leader, 2.0).await;
    assert_eq!(widget_migrations(&cp).await, vec![back.clone()]);

    // (An agreed version some entry cannot decode is refused by kube-apiserver's own validation
    // of StorageVersions, so it cannot be staged here; the unit tests of decide cover it.)

    // Agreed on v2 by both, for the settle time: one migration, with the next number.
    set(&cp, two_entries("v2", "v2", &["v1", "v2"], &["v1", "v2"])).await;
    let name = svm::migration_name(W_SV, &format!("{W_GROUP}/v2"), 2);
    let both = {
        let mut b = vec![back.clone(), name.clone()];
        b.sort();
        b
    };
    poll_until(MINUTE, "the migration to be created", || async {
        let mut got = widget_migrations(&cp).await;
        got.sort();
        got == both
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", leader.logs_text()));
    wait_remembered(&cp, W_SV, &format!("{W_GROUP}/v2")).await;
    let lm = leader.metrics().await;
    assert_eq!(
        migration_metric(&lm, "created_total", &["result=\"created\""]),
        2.0
    );
    assert_eq!(
        migration_metric(&follower.metrics().await, "created_total", &[]),
        0.0
    );

    // The leader stops; the follower takes over and creates nothing.
    let status = leader.terminate();
    assert!(status.success(), "serve exited with {status}");
    poll_until(MINUTE, "the follower to take over", || async {
        leads(&follower.metrics().await)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    wait_passes(follower, 5.0).await;
    let mut got = widget_migrations(&cp).await;
    got.sort();
    assert_eq!(got, both);
    assert_eq!(
        migration_metric(&follower.metrics().await, "created_total", &[]),
        0.0
    );
    assert_eq!(event_count(&cp, W_SV, "MigrationCreated").await, 2);
    eprintln!("agreement test took {:?}", t_test.elapsed());
}

/// A migration kube-controller-manager cannot complete (a ValidatingAdmissionPolicy denies
/// every update of the resource's objects) is reported once, in metrics and a Warning Event,
/// listed by `audit` with a fix, and not re-created, also not by a restarted webhook.
#[tokio::test(flavor = "multi_thread")]
async fn failed_migration_is_reported_once_and_not_recreated() {
    let _serial = serial().await;
    let t_test = Instant::now();
    let cp = ControlPlane::up().await;
    kubectl_apply(
        &cp,
        &serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.svw.example.com"},
            "spec": {
                "group": W_GROUP,
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
            },
        }),
    );
    poll_until(MINUTE, "the Widget API to be served", || async {
        cp.kubectl()
            .args(["get", "widgets", "-A"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    for i in 0..2 {
        kubectl_apply(
            &cp,
            &serde_json::json!({
                "apiVersion": "svw.example.com/v1", "kind": "Widget",
                "metadata": {"name": format!("w{i}"), "namespace": "default"},
            }),
        );
    }
    // Every update of a Widget is refused: a policy and its binding, in one List.
    kubectl_apply(
        &cp,
        &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": "svw-e2e-no-widget-updates"},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [{
                        "apiGroups": [W_GROUP], "apiVersions": ["*"], "operations": ["UPDATE"],
                        "resources": ["widgets"],
                    }]},
                    "validations": [{"expression": "false", "message": "widgets are frozen (svw e2e)"}],
                },
            },
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": "svw-e2e-no-widget-updates"},
                "spec": {"policyName": "svw-e2e-no-widget-updates", "validationActions": ["Deny"]},
            },
        ]}),
    );
    // The policy is in force once a plain update is denied.
    poll_until(MINUTE, "the policy to deny widget updates", || async {
        cp.kubectl()
            .args([
                "label",
                "widget",
                "w0",
                "-n",
                "default",
                // A new value each time: kubectl sends nothing for an unchanged label.
                &format!("probe={}", rand_probe()),
                "--overwrite",
            ])
            .output()
            .is_ok_and(|o| {
                !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("frozen")
            })
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    kcm_start(&cp, &[KCM_MIGRATOR]);

    seed_agreeing_on_v1(&cp).await;
    let certs = Certs::generate();
    let hook = start_replica(&cp, &certs, "1s").await;
    wait_remembered(&cp, W_SV, &format!("{W_GROUP}/v1")).await;
    set(&cp, two_entries("v2", "v2", &["v1", "v2"], &["v1", "v2"])).await;
    let name = svm::migration_name(W_SV, &format!("{W_GROUP}/v2"), 1);
    let failed = wait_phase(&cp, &name, Phase::Failed, 2 * MINUTE).await;
    assert!(
        failed.phase_message().contains("frozen"),
        "{}",
        failed.phase_message()
    );

    poll_until(MINUTE, "the failure to be reported", || async {
        migration_metric(
            &hook.metrics().await,
            "outcomes_total",
            &["result=\"failed\""],
        ) == 1.0
            && event_count(&cp, W_SV, "MigrationFailed").await == 1
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    let ev = events(&cp, W_SV, "MigrationFailed").await;
    assert_eq!(ev[0].type_.as_deref(), Some("Warning"));
    assert!(
        ev[0].note.as_deref().is_some_and(|n| n.contains("frozen")),
        "{ev:?}"
    );
    assert!(
        hook.logs_text().contains("StorageVersionMigration failed"),
        "no failure log line"
    );
    // Not re-created, not reported again: many passes later, and after a restart.
    wait_passes(&hook, 10.0).await;
    let m = hook.metrics().await;
    assert_eq!(migration_metric(&m, "created_total", &[]), 1.0, "{m}");
    assert_eq!(migration_metric(&m, "outcomes_total", &[]), 1.0, "{m}");
    assert_eq!(
        migration_metric(&m, "migrations", &["phase=\"failed\""]),
        1.0,
        "{m}"
    );
    let (_hook, m) = restart_quietly(&cp, hook, &certs, "1s").await;
    assert_eq!(
        migration_metric(&m, "migrations", &["phase=\"failed\""]),
        1.0,
        "{m}"
    );
    assert_eq!(widget_migrations(&cp).await, vec![name.clone()]);
    assert_eq!(event_count(&cp, W_SV, "MigrationFailed").await, 1);

    // audit lists it, with the command that creates a fresh migration.
    let (code, report) = audit_json(&cp);
    assert_eq!(code, 1, "{report:#}");
    let stale = report["staleStorage"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(stale.len(), 1, "{report:#}");
    assert_eq!(stale[0]["storageVersion"], W_SV);
    assert_eq!(stale[0]["phase"], "failed");
    let fix = stale[0]["fix"].as_str().unwrap_or_default();
    assert!(
        fix.contains("kind: StorageVersionMigration") && fix.contains("resource: widgets"),
        "{fix}"
    );
    eprintln!("failure test took {:?}", t_test.elapsed());
}

/// Kubernetes 1.35 and 1.36 serve StorageVersionMigration only as
/// `storagemigration.k8s.io/v1beta1`, and only when the operator turns it on (the
/// StorageVersionMigrator feature gate and the API; v1 is GA from 1.37). On a real kube-apiserver
/// 1.36 with it on, the trigger finds the version by discovery and creates the migration there;
/// the apiserver restarted without it, the trigger begins nothing and says why in its log, every
/// pass, without an error.
#[tokio::test(flavor = "multi_thread")]
async fn on_kubernetes_1_36_migrations_are_made_in_v1beta1_when_it_is_served() {
    let _serial = serial().await;
    let beta_on = "--runtime-config=storagemigration.k8s.io/v1beta1=true --feature-gates=StorageVersionMigrator=true";
    let cp = ControlPlane::up_with_env(
        &["--version", "1.36"],
        &[("SVW_APISERVER_EXTRA_ARGS", beta_on)],
    )
    .await;
    assert_eq!(
        svm::ApiVersion::discover(&cp.client)
            .await
            .expect("discovery"),
        Some(svm::ApiVersion::V1beta1),
        "kube-apiserver 1.36 with the beta API on should serve v1beta1 and not v1"
    );
    seed_agreeing_on_v1(&cp).await;
    let certs = Certs::generate();
    let hook = start_replica(&cp, &certs, "1s").await;
    poll_until(MINUTE, "the replica to lead", || async {
        leads(&hook.metrics().await)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    wait_remembered(&cp, W_SV, &format!("{W_GROUP}/v1")).await;

    // Both entries move to v2: after the settle time, one migration, in v1beta1.
    set(&cp, two_entries("v2", "v2", &["v1", "v2"], &["v1", "v2"])).await;
    poll_until(MINUTE, "a migration of the widgets", || async {
        !widget_migrations(&cp).await.is_empty()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    let made = widget_migrations(&cp).await;
    assert_eq!(made.len(), 1, "{made:?}");
    let raw = cp
        .kubectl()
        .args([
            "get",
            "--raw",
            "/apis/storagemigration.k8s.io/v1beta1/storageversionmigrations",
        ])
        .output()
        .expect("kubectl get --raw");
    let raw = String::from_utf8_lossy(&raw.stdout);
    assert!(
        raw.contains(&made[0]),
        "{} not listed in v1beta1: {raw}",
        made[0]
    );
    let logs = hook.logs_text();
    assert!(
        logs.contains("storagemigration.k8s.io/v1beta1"),
        "the trigger did not say which API version it uses:\n{logs}"
    );

    // The apiserver restarted without the beta API: discovery finds neither version; nothing
    // is begun for a new agreement (v3), and the log says why once.
    cp.run_with_env(&["restart-apiserver"], &[("SVW_APISERVER_EXTRA_ARGS", "")]);
    assert_eq!(
        svm::ApiVersion::discover(&cp.client)
            .await
            .expect("discovery"),
        None
    );
    set(
        &cp,
        two_entries("v3", "v3", &["v1", "v2", "v3"], &["v1", "v2", "v3"]),
    )
    .await;
    poll_until(
        MINUTE,
        "the trigger to say the API is not served",
        || async {
            hook.logs_text()
                .contains("serves neither storagemigration.k8s.io/v1")
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    wait_remembered(&cp, W_SV, &format!("{W_GROUP}/v3")).await;
    wait_passes(&hook, 5.0).await;
    let m = hook.metrics().await;
    assert_eq!(
        migration_metric(&m, "created_total", &[]),
        1.0,
        "only the v1beta1 migration is created:\n{m}"
    );
    assert_eq!(
        hook.logs_text()
            .matches("serves neither storagemigration.k8s.io/v1")
            .count(),
        1,
        "the warning is logged once, not every pass"
    );
}
