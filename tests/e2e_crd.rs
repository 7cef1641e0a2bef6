//! `serve --crd-migrate` against a real control plane: a CRD whose objects are stored in
//! v1beta1 has its storage version flipped to v1; the migrator writes every object again, so
//! etcd holds each as v1 (read with etcdctl), and storedVersions becomes `[v1]`, after which
//! removing v1beta1 from spec.versions succeeds (it failed before). Twice: with our own rewrite
//! (we prune), and with a StorageVersionMigration run by kube-controller-manager's migrator
//! (it prunes; we only verify, and never write storedVersions).

mod support;

use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use storageversion_webhook::crd::decide::{Method, Phase};
use storageversion_webhook::crd::types::Crd;
use storageversion_webhook::migrate::svm::{self, StorageVersionMigration};
use support::gc::kcm_start;
use support::migrate::{stored_versions, NAMESPACE};
use support::{metric_sum, poll_until, serial, Certs, ControlPlane, Webhook};

const CRD: &str = "widgets.example.com";
const GROUP: &str = "example.com";
const PREFIX: &str = "/registry/example.com/widgets/";
/// How many Widgets the test stores.
const OBJECTS: usize = 500;
const STATE_CONFIGMAP: &str = "storageversion-webhook-crd";
/// The migrator controller needs the garbage collector's dependency graph.
const KCM_MIGRATOR: &str =
    "--controllers=storage-version-migrator-controller,garbage-collector-controller";

fn version(name: &str, storage: bool) -> serde_json::Value {
    serde_json::json!({
        "name": name, "served": true, "storage": storage,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
    })
}

fn crd(versions: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": versions,
        },
    })
}

fn widgets(cp: &ControlPlane, version: &str) -> Api<DynamicObject> {
    let ar = kube::api::ApiResource {
        group: GROUP.into(),
        version: version.into(),
        api_version: format!("{GROUP}/{version}"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    Api::namespaced_with(cp.client.clone(), "default", &ar)
}

/// The CRD; a failed GET (the apiserver busy on this 2-core machine) is asked again, for up to
/// 30 s.
async fn get_crd(cp: &ControlPlane) -> Crd {
    let api: Api<Crd> = Api::all(cp.client.clone());
    let got = std::sync::Mutex::new(None);
    poll_until(Duration::from_secs(30), "a GET of the CRD", || async {
        match api.get(CRD).await {
            Ok(c) => {
                *got.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
                true
            }
            Err(e) => {
                eprintln!("get the CRD: {e}; asking again");
                false
            }
        }
    })
    .await
    .expect("get the CRD");
    got.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .expect("the CRD")
}

async fn replace_versions(
    cp: &ControlPlane,
    versions: Vec<serde_json::Value>,
) -> Result<Crd, kube::Error> {
    let api: Api<Crd> = Api::all(cp.client.clone());
    let patch = serde_json::json!({"spec": {"versions": versions}});
    api.patch(CRD, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// The apiVersion of every Widget in etcd, counted.
fn stored_counts(cp: &ControlPlane) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for v in stored_versions(cp, PREFIX).values() {
        *counts.entry(v.clone()).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_version_flip_is_finished_by_our_own_rewrite() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    flip_and_migrate(&cp, Method::Rewrite, OBJECTS).await;
}

/// Kubernetes 1.37 serves storagemigration.k8s.io/v1: `auto` creates a StorageVersionMigration,
/// kube-controller-manager's storage-version-migrator rewrites the objects and prunes
/// storedVersions itself (its `StorageMigrating` condition says so); we write no storedVersions.
/// On the support matrix's other minors (`SVW_KUBE_VERSION`): 1.35 and 1.36 with the beta API
/// turned on as an operator would (`storagemigration.k8s.io/v1beta1`, the
/// `StorageVersionMigrator` gate on kube-apiserver and kube-controller-manager), the same in
/// v1beta1, but 1.35's migrator does not prune storedVersions, so we do after
/// `KCM_PRUNE_GRACE`; 1.34, whose API is not one we use, our own rewrite with kube-controller-manager's
/// migrator running beside it: the two never fight there either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_version_flip_is_finished_by_kube_controller_managers_migrator() {
    let _serial = serial().await;
    let minor = support::ha::tested_minor();
    let gate = "--feature-gates=StorageVersionMigrator=true";
    let beta = matches!(minor.as_str(), "1.35" | "1.36");
    let cp = if beta {
        let on = format!("--runtime-config=storagemigration.k8s.io/v1beta1=true {gate}");
        ControlPlane::up_with_env(&[], &[("SVW_APISERVER_EXTRA_ARGS", on.as_str())]).await
    } else {
        ControlPlane::up().await
    };
    let served = svm::ApiVersion::discover(&cp.client)
        .await
        .expect("discovery");
    let method = match minor.as_str() {
        "1.34" => {
            assert_eq!(
                served, None,
                "1.34 serves no StorageVersionMigration API of ours"
            );
            Method::Rewrite
        }
        _ => {
            assert!(served.is_some(), "{minor} serves StorageVersionMigrations");
            Method::Svm
        }
    };
    if beta {
        kcm_start(&cp, &[KCM_MIGRATOR, gate]);
    } else {
        kcm_start(&cp, &[KCM_MIGRATOR]);
    }
    flip_and_migrate(&cp, method, 50).await;
}

/// `objects` Widgets written in v1beta1, then the storage version flipped to v1 (storedVersions
/// lists both).
async fn widgets_then_flip(cp: &ControlPlane, objects: usize) {
    create_widgets(cp, objects).await;
    replace_versions(cp, vec![version("v1beta1", false), version("v1", true)])
        .await
        .expect("flip the storage version");
}

/// The flags of a replica that migrates CRDs (settle time, pass interval, then `more`), in the
/// tests' own leader election (6 s leases).
fn migrator_flags(settle: &str, interval: &str, more: &[&str]) -> Vec<String> {
    let mut flags = vec![
        "--crd-migrate".to_string(),
        format!("--crd-migrate-settle={settle}"),
        format!("--crd-migrate-interval={interval}"),
    ];
    flags.extend(more.iter().map(|s| s.to_string()));
    flags.extend([
        format!("--gc-leader-lease-namespace={NAMESPACE}"),
        "--gc-leader-lease-name=svw-crd-test".to_string(),
        "--gc-leader-lease-duration=6s".to_string(),
        "--gc-leader-lease-grace=2s".to_string(),
    ]);
    flags
}

fn strs(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

/// Creates the CRD (v1beta1 storage, v1 served) and `objects` Widgets, stored as v1beta1.
async fn create_widgets(cp: &ControlPlane, objects: usize) {
    // Created whole (our Crd type drops the schemas on decoding).
    let ar = kube::api::ApiResource {
        group: "apiextensions.k8s.io".into(),
        version: "v1".into(),
        api_version: "apiextensions.k8s.io/v1".into(),
        kind: "CustomResourceDefinition".into(),
        plural: "customresourcedefinitions".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(cp.client.clone(), &ar);
    let created: DynamicObject =
        serde_json::from_value(crd(vec![version("v1beta1", true), version("v1", false)]))
            .expect("crd");
    api.create(&PostParams::default(), &created)
        .await
        .expect("create the CRD");
    poll_until(
        Duration::from_secs(60),
        "the CRD to be Established",
        || async { get_crd(cp).await.snapshot().established },
    )
    .await
    .expect("established");
    // The objects, stored as v1beta1 (8 creates at a time).
    let w = widgets(cp, "v1beta1");
    let started = std::time::Instant::now();
    futures::stream::iter(0..objects)
        .map(|i| {
            let w = w.clone();
            async move {
                let obj: DynamicObject = serde_json::from_value(serde_json::json!({
                    "apiVersion": "example.com/v1beta1", "kind": "Widget",
                    "metadata": {"name": format!("w-{i:04}")},
                    "spec": {"size": i},
                }))
                .expect("widget");
                // Established can come a moment before the resource is served on every path.
                for _ in 0..50 {
                    match w.create(&PostParams::default(), &obj).await {
                        Ok(_) => return,
                        Err(kube::Error::Api(s)) if s.code == 404 => {
                            tokio::task::yield_now().await;
                        }
                        Err(e) => panic!("create widget {i}: {e}"),
                    }
                }
                panic!("widget {i}: the resource was never served");
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    eprintln!("created {objects} widgets in {:?}", started.elapsed());
    assert_eq!(
        stored_counts(cp),
        [("example.com/v1beta1".to_string(), objects)]
            .into_iter()
            .collect()
    );
}

async fn flip_and_migrate(cp: &ControlPlane, method: Method, objects: usize) {
    widgets_then_flip(cp, objects).await;
    poll_until(
        Duration::from_secs(30),
        "storedVersions [v1beta1, v1]",
        || async { get_crd(cp).await.status.stored_versions == ["v1beta1", "v1"] },
    )
    .await
    .expect("storedVersions after the flip");
    // v1beta1 cannot be dropped yet: it is still in storedVersions.
    let refused = replace_versions(cp, vec![version("v1", true)]).await;
    let text = match &refused {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.is_err() && text.contains("storedVersions"),
        "dropping v1beta1 before the migration: {text}"
    );

    let certs = Certs::generate();
    let hook = Webhook::start(
        cp,
        &certs,
        &strs(&migrator_flags(
            "2s",
            "300ms",
            &[
                &format!(
                    "--crd-migrate-method={}",
                    if method == Method::Rewrite {
                        "rewrite"
                    } else {
                        "auto"
                    }
                ),
                "--crd-migrate-rate=1000",
            ],
        )),
    )
    .await;
    let flipped = std::time::Instant::now();
    // 1.35's migrator takes about 2 minutes, then we wait a minute for a prune it never makes.
    poll_until(Duration::from_secs(300), "storedVersions [v1]", || async {
        get_crd(cp).await.status.stored_versions == ["v1"]
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    eprintln!("pruned {:?} after the webhook started", flipped.elapsed());

    // Every object was written again, in v1; the prune came after.
    assert_eq!(
        stored_counts(cp),
        [("example.com/v1".to_string(), objects)]
            .into_iter()
            .collect()
    );
    let metrics = hook.metrics().await;
    let m = |name: &str, labels: &[&str]| {
        metric_sum(
            &metrics,
            &format!("storageversion_webhook_crd_migration_{name}"),
            labels,
        )
    };
    let (rewritten, pruned) = match method {
        Method::Rewrite => (objects as f64, 1.0),
        // kube-controller-manager rewrote; 1.35's migrator does not prune, so we did, after
        // KCM_PRUNE_GRACE.
        Method::Svm if support::ha::tested_minor() == "1.35" => (0.0, 1.0),
        // kube-controller-manager did both.
        Method::Svm => (0.0, 0.0),
    };
    let label = format!("method=\"{}\"", method.as_str());
    assert_eq!(
        m("objects_total", &["result=\"rewritten\""]),
        rewritten,
        "{metrics}"
    );
    assert_eq!(m("prunes_total", &[]), pruned, "{metrics}");
    assert_eq!(m("started_total", &[&label]), 1.0, "{metrics}");
    if method == Method::Svm {
        // Our migration, named as recorded, and succeeded.
        // In the version the cluster serves them in (v1, or v1beta1 on 1.35 and 1.36).
        let served = svm::ApiVersion::discover(&cp.client)
            .await
            .expect("discovery")
            .expect("a StorageVersionMigration API");
        let svms: Api<StorageVersionMigration> = Api::all_with(cp.client.clone(), &served);
        let ours = svms
            .list(&kube::api::ListParams::default().labels(&format!(
                "{}={}",
                svm::MANAGED_BY_LABEL,
                storageversion_webhook::crd::migrator::MANAGED_BY_VALUE
            )))
            .await
            .expect("list migrations")
            .items;
        assert_eq!(ours.len(), 1, "{ours:?}");
        assert_eq!(ours[0].phase(), svm::Phase::Succeeded);
        poll_until(
            Duration::from_secs(30),
            "our record of the SVM's success",
            || async { record(cp).await.migration.map(|m| m.phase) == Some(Phase::Succeeded) },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
        assert_eq!(
            record(cp).await.migration.map(|m| m.name),
            ours[0].metadata.name.clone()
        );
    }
    assert_eq!(
        metric_sum(
            &hook.metrics().await,
            "storageversion_webhook_crd_migration_outcomes_total",
            &[&label, "result=\"succeeded\""]
        ),
        1.0
    );
    // The record names the migration and its outcome.
    let migration = record(cp).await.migration.expect("its migration");
    assert_eq!(migration.method, method);
    assert_eq!(
        (
            migration.phase,
            migration.storage.as_str(),
            migration.sequence
        ),
        (Phase::Succeeded, "v1", 1)
    );
    assert!(
        migration.name.starts_with("widgets.example.com-"),
        "{}",
        migration.name
    );

    // Now v1beta1 can go.
    replace_versions(cp, vec![version("v1", true)])
        .await
        .expect("drop v1beta1 after the migration");
    // And nothing more happens: the CRD is up to date.
    let passes = metric_sum(
        &hook.metrics().await,
        "storageversion_webhook_crd_migration_checks_total",
        &[],
    );
    poll_until(Duration::from_secs(30), "two more passes", || async {
        metric_sum(
            &hook.metrics().await,
            "storageversion_webhook_crd_migration_checks_total",
            &[],
        ) >= passes + 2.0
    })
    .await
    .expect("passes");
    let metrics = hook.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "storageversion_webhook_crd_migration_started_total",
            &[]
        ),
        1.0
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "storageversion_webhook_crd_migration_crds",
            &["state=\"up_to_date\""]
        ),
        1.0
    );
}

/// Waits (up to 2 minutes) for storedVersions to be `[v1]`; the webhook's log on a timeout.
async fn wait_pruned(cp: &ControlPlane, hook: &Webhook) {
    poll_until(Duration::from_secs(120), "storedVersions [v1]", || async {
        get_crd(cp).await.status.stored_versions == ["v1"]
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
}

/// Our record of the CRD in the state ConfigMap.
async fn record(cp: &ControlPlane) -> storageversion_webhook::crd::decide::Record {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(cp.client.clone(), NAMESPACE);
    let cm = cms.get(STATE_CONFIGMAP).await.expect("state ConfigMap");
    cm.data
        .unwrap_or_default()
        .get(CRD)
        .and_then(|v| storageversion_webhook::crd::state::parse(v))
        .expect("a record of the CRD")
}

fn crd_metric(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metric_sum(
        metrics,
        &format!("storageversion_webhook_crd_migration_{name}"),
        labels,
    )
}

async fn wait_metric(hook: &Webhook, what: &str, name: &str, labels: &[&str], at_least: f64) {
    poll_until(Duration::from_secs(120), what, || async {
        crd_metric(&hook.metrics().await, name, labels) >= at_least
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
}

/// `objects` Widgets stored in v1beta1, the storage flipped to v1, and a replica migrating them
/// with our own rewrite at `rate` objects per second (settle 1 s). Keep the certificates.
async fn rewriting(cp: &ControlPlane, objects: usize, rate: &str) -> (Certs, Webhook) {
    widgets_then_flip(cp, objects).await;
    let certs = Certs::generate();
    let rate = format!("--crd-migrate-rate={rate}");
    let flags = migrator_flags("1s", "300ms", &["--crd-migrate-method=rewrite", &rate]);
    let hook = Webhook::start(cp, &certs, &strs(&flags)).await;
    (certs, hook)
}

/// Registers `hook` as the CRD guard: UPDATEs of CRDs, the product's `matchConditions`,
/// `failurePolicy: Fail` (so a denial the test sees is the guard's, never a timeout's Ignore).
async fn register_guard(cp: &ControlPlane, hook: &Webhook, certs: &Certs) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "storageversion-webhook-crd-guard"},
        "webhooks": [{
            "name": "crd-guard.storageversion-webhook.io",
            "clientConfig": {"url": format!("https://{}/validate-crd", hook.addr),
                             "caBundle": support::base64(certs.ca_pem.as_bytes())},
            "rules": [{"apiGroups": ["apiextensions.k8s.io"], "apiVersions": ["v1"],
                       "resources": ["customresourcedefinitions"], "operations": ["UPDATE"],
                       "scope": "Cluster"}],
            "matchConditions": [{"name": "versions-changed",
                                 "expression": storageversion_webhook::crd::guard::MATCH_CONDITION}],
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "timeoutSeconds": 5
        }]
    }))
    .expect("guard configuration");
    let api: Api<ValidatingWebhookConfiguration> = Api::all(cp.client.clone());
    api.create(&PostParams::default(), &vwc)
        .await
        .expect("register the CRD guard");
}

fn guard_reviews(metrics: &str, result: &str) -> f64 {
    let label = format!("result=\"{result}\"");
    let labels: Vec<&str> = if result.is_empty() {
        vec![]
    } else {
        vec![label.as_str()]
    };
    metric_sum(
        metrics,
        "storageversion_webhook_crd_guard_reviews_total",
        &labels,
    )
}

/// The guard on real components, while our rewrite runs (I9): a storage change is denied with a
/// message that names the migration and says when it is allowed; an update that leaves the
/// versions alone is never sent to us (`matchConditions`); a version dropped while still in
/// storedVersions is refused by kube-apiserver before any webhook is called (so the guard
/// explains the version change at its storage flip instead); once the migration has finished,
/// the same storage change is allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_denies_a_storage_change_during_our_rewrite_and_nothing_else() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    // 200 objects take 20 s.
    let (certs, hook) = rewriting(&cp, 200, "10").await;
    register_guard(&cp, &hook, &certs).await;
    wait_metric(
        &hook,
        "the rewrite to be under way",
        "objects_total",
        &[],
        5.0,
    )
    .await;

    // The storage version back to v1beta1 while the rewrite to v1 runs: denied.
    let back = vec![version("v1beta1", true), version("v1", false)];
    // kube-apiserver may call before the guard has read the record: poll for the denial.
    let denied = std::sync::Mutex::new(String::new());
    poll_until(
        Duration::from_secs(30),
        "the storage change denied",
        || async {
            match replace_versions(&cp, back.clone()).await {
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    *denied.lock().unwrap_or_else(|e| e.into_inner()) = s.message;
                    true
                }
                other => panic!("the storage change was not denied: {other:?}"),
            }
        },
    )
    .await
    .expect("denied");
    let message = denied.into_inner().unwrap_or_else(|e| e.into_inner());
    for part in [
        "from v1 to v1beta1",
        "widgets.example.com-",
        "Allowed once the migration has finished",
        STATE_CONFIGMAP,
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    let crd = get_crd(&cp).await;
    assert_eq!(
        crd.storage_version(),
        Some("v1"),
        "the denied change was not applied"
    );

    // A label on the CRD, and a version dropped while still stored: neither reaches the guard.
    let before = guard_reviews(&hook.metrics().await, "");
    let api: Api<Crd> = Api::all(cp.client.clone());
    let label = serde_json::json!({"metadata": {"labels": {"team": "widgets"}}});
    api.patch(CRD, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("a label change passes");
    let dropped = replace_versions(&cp, vec![version("v1", true)]).await;
    match dropped {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 422 && s.message.contains("storedVersions"),
            "refused by kube-apiserver's validation: {s:?}"
        ),
        other => panic!("dropping a stored version must fail: {other:?}"),
    }
    assert_eq!(
        guard_reviews(&hook.metrics().await, ""),
        before,
        "no review for updates the guard does not judge"
    );

    // Once the migration has finished (storedVersions pruned), the change is allowed.
    wait_pruned(&cp, &hook).await;
    poll_until(
        Duration::from_secs(30),
        "the storage change allowed",
        || async { replace_versions(&cp, back.clone()).await.is_ok() },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    let metrics = hook.metrics().await;
    assert!(guard_reviews(&metrics, "denied") >= 1.0, "{metrics}");
    assert!(
        guard_reviews(&metrics, "storage_change") >= 1.0,
        "{metrics}"
    );
}

/// I7 and the deleted CRD on real components: a generation change in the middle of our rewrite
/// stops it (abandoned, no prune on it) and a second migration, begun after the settle time,
/// prunes; a storage flip back starts a third, and the CRD deleted in its middle leaves no
/// record, no running rewrite, and a webhook that is still ready and calm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_changed_or_deleted_during_the_rewrite() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let objects = 300;
    // 300 objects take 15 s: time to change the CRD in the middle.
    let (_certs, hook) = rewriting(&cp, objects, "20").await;
    wait_metric(
        &hook,
        "the rewrite to be under way",
        "objects_total",
        &[],
        20.0,
    )
    .await;
    // A generation change (a printer column) with the same storage version.
    let mut v1 = version("v1", true);
    v1["additionalPrinterColumns"] =
        serde_json::json!([{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}]);
    let changed = replace_versions(&cp, vec![version("v1beta1", false), v1.clone()])
        .await
        .expect("change the CRD");
    assert!(changed.metadata.generation.unwrap_or(0) >= 3);
    wait_metric(
        &hook,
        "the first migration abandoned",
        "outcomes_total",
        &["result=\"abandoned\""],
        1.0,
    )
    .await;
    let metrics = hook.metrics().await;
    assert_eq!(
        crd_metric(&metrics, "prunes_total", &[]),
        0.0,
        "no prune on it"
    );
    assert!(crd_metric(&metrics, "objects_total", &[]) < objects as f64);
    // The second migration, begun after the settle time on the new generation, prunes.
    wait_pruned(&cp, &hook).await;
    let m = record(&cp).await.migration.expect("the second migration");
    assert_eq!(
        (m.sequence, m.phase, m.generation),
        (
            2,
            Phase::Succeeded,
            changed.metadata.generation.unwrap_or(0)
        )
    );
    assert_eq!(
        stored_counts(&cp),
        [("example.com/v1".to_string(), objects)]
            .into_iter()
            .collect()
    );
    let metrics = hook.metrics().await;
    assert_eq!(
        crd_metric(&metrics, "prunes_total", &["result=\"pruned\""]),
        1.0
    );
    assert_eq!(crd_metric(&metrics, "started_total", &[]), 2.0);

    // The storage version back to v1beta1: a third migration; the CRD deleted in its middle.
    let before = crd_metric(&metrics, "objects_total", &[]);
    replace_versions(
        &cp,
        vec![version("v1beta1", true), {
            let mut v = v1.clone();
            v["storage"] = serde_json::json!(false);
            v
        }],
    )
    .await
    .expect("flip back");
    wait_metric(
        &hook,
        "the third rewrite under way",
        "objects_total",
        &[],
        before + 20.0,
    )
    .await;
    let api: Api<Crd> = Api::all(cp.client.clone());
    api.delete(CRD, &Default::default())
        .await
        .expect("delete the CRD");
    poll_until(Duration::from_secs(120), "the CRD gone", || async {
        api.get_opt(CRD).await.ok().flatten().is_none()
    })
    .await
    .expect("CRD deleted");
    poll_until(
        Duration::from_secs(60),
        "its record gone, no rewrite running",
        || async {
            let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
                Api::namespaced(cp.client.clone(), NAMESPACE);
            let gone = cms
                .get(STATE_CONFIGMAP)
                .await
                .ok()
                .and_then(|cm| cm.data)
                .is_none_or(|d| !d.contains_key(CRD));
            gone && crd_metric(&hook.metrics().await, "running", &[]) == 0.0
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    hook.wait_ready(Duration::from_secs(10)).await;
    let metrics = hook.metrics().await;
    assert_eq!(crd_metric(&metrics, "started_total", &[]), 3.0);
    assert_eq!(crd_metric(&metrics, "prunes_total", &[]), 1.0);
    let logs = hook.logs_text();
    assert!(!logs.contains("panicked"), "{logs}");
}

/// I8 across leaders: the leader killed in the middle of its rewrite; the other replica takes
/// the leader Lease, resumes the recorded migration under the same name (it begins none of its
/// own), finishes it and prunes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_resumes_the_rewrite_under_the_same_name() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let objects = 300;
    widgets_then_flip(&cp, objects).await;
    let certs = Certs::generate();
    let flags = migrator_flags(
        "1s",
        "300ms",
        &["--crd-migrate-method=rewrite", "--crd-migrate-rate=20"],
    );
    let flags = strs(&flags);
    let mut replicas = [
        Webhook::start(&cp, &certs, &flags).await,
        Webhook::start(&cp, &certs, &flags).await,
    ];
    let leader = std::sync::Mutex::new(None);
    poll_until(Duration::from_secs(60), "a leader under way", || async {
        for (i, r) in replicas.iter().enumerate() {
            let m = r.metrics().await;
            if support::migrate::leads(&m) && crd_metric(&m, "objects_total", &[]) >= 20.0 {
                *leader.lock().unwrap_or_else(|e| e.into_inner()) = Some(i);
                return true;
            }
        }
        false
    })
    .await
    .expect("leader");
    let leader = leader
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .expect("leader index");
    let begun = record(&cp).await.migration.expect("recorded");
    assert_eq!((begun.sequence, begun.phase), (1, Phase::Running));
    replicas[leader].kill();
    let other = &replicas[1 - leader];
    wait_pruned(&cp, other).await;
    let done = record(&cp).await.migration.expect("recorded");
    assert_eq!(
        (done.name.as_str(), done.sequence, done.phase),
        (begun.name.as_str(), 1, Phase::Succeeded)
    );
    let metrics = other.metrics().await;
    assert_eq!(
        crd_metric(&metrics, "started_total", &[]),
        0.0,
        "it began none of its own"
    );
    assert_eq!(
        crd_metric(&metrics, "prunes_total", &["result=\"pruned\""]),
        1.0
    );
    assert!(other.logs_text().contains("resuming the CRD rewrite"));
    assert_eq!(
        stored_counts(&cp),
        [("example.com/v1".to_string(), objects)]
            .into_iter()
            .collect()
    );
}

/// The walk-through `scripts/run` prints and the README shows, with its very files
/// (`tests/fixtures/crd/`), through `kubectl`: a CRD stored in v1beta1, one Widget, the storage
/// flipped to v1; dropping v1beta1 is refused; the migrator finishes the change with no command
/// of the user's; then dropping v1beta1 goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_walkthrough_of_a_crd_version_change() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let kubectl = |verb: &str, file: &str| {
        let path = support::repo_root().join("tests/fixtures/crd").join(file);
        let out = cp
            .kubectl()
            .args([verb, "-f"])
            .arg(&path)
            .output()
            .expect("run kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = kubectl("apply", "widgets-v1beta1.yaml");
    assert!(ok, "{err}");
    poll_until(Duration::from_secs(30), "the CRD established", || async {
        get_crd(&cp).await.snapshot().established
    })
    .await
    .expect("established");
    poll_until(Duration::from_secs(30), "the Widget created", || async {
        kubectl("create", "widget.yaml").0
    })
    .await
    .expect("create the Widget");
    let (ok, err) = kubectl("apply", "widgets-v1-storage.yaml");
    assert!(ok, "{err}");
    let (ok, err) = kubectl("apply", "widgets-v1-only.yaml");
    assert!(
        !ok && err.contains(r#"status.storedVersions[0]: Invalid value: "v1beta1""#),
        "dropping v1beta1 before the migration: {err}"
    );
    assert_eq!(
        stored_counts(&cp),
        [("example.com/v1beta1".to_string(), 1)]
            .into_iter()
            .collect()
    );

    let certs = Certs::generate();
    // As scripts/run starts it: no kube-controller-manager there, so our own rewrite.
    let flags = migrator_flags("1s", "300ms", &["--crd-migrate-method=rewrite"]);
    let hook = Webhook::start(&cp, &certs, &strs(&flags)).await;
    wait_pruned(&cp, &hook).await;
    assert_eq!(
        stored_counts(&cp),
        [("example.com/v1".to_string(), 1)].into_iter().collect()
    );
    let (ok, err) = kubectl("apply", "widgets-v1-only.yaml");
    assert!(ok, "dropping v1beta1 after the migration: {err}");
}

/// A rewrite every write of which is refused (a ValidatingAdmissionPolicy freezes Widget
/// updates): the migration fails after its retries, storedVersions is left as it was, nothing
/// is pruned, and `audit` lists the CRD (before: `crd-stored-versions`; after:
/// `crd-migration-failed`, naming the migration and why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_migration_leaves_stored_versions_alone_and_is_tried_again() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    widgets_then_flip(&cp, 20).await;
    let state = [
        "--output",
        "json",
        "--migrate-state-namespace",
        NAMESPACE,
        "--crd-state-configmap",
        STATE_CONFIGMAP,
    ];
    let (code, out, err) = support::audit(&cp, &state);
    assert_eq!(code, 1, "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("audit json");
    assert_eq!(report["crds"][0]["crd"], CRD, "{out}");
    assert_eq!(report["crds"][0]["code"], "crd-stored-versions", "{out}");

    let policy: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "freeze-widgets"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [GROUP], "apiVersions": ["*"], "resources": ["widgets"],
                "operations": ["UPDATE"]}]},
            "validations": [{"expression": "false", "message": "Widgets are frozen (test)"}],
        },
    }))
    .expect("policy");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "freeze-widgets"},
        "spec": {"policyName": "freeze-widgets", "validationActions": ["Deny"]},
    }))
    .expect("binding");
    Api::<ValidatingAdmissionPolicy>::all(cp.client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    Api::<ValidatingAdmissionPolicyBinding>::all(cp.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the binding");
    let api = widgets(&cp, "v1");
    // Probed with dry runs (admission runs, nothing is stored).
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    poll_until(Duration::from_secs(60), "the policy in force", || async {
        let Ok(list) = api.list(&kube::api::ListParams::default().limit(1)).await else {
            return false;
        };
        let Some(w) = list.items.into_iter().next() else {
            return false;
        };
        let name = w.metadata.name.clone().unwrap_or_default();
        matches!(
            api.replace(&name, &dry_run, &w).await,
            Err(kube::Error::Api(s)) if s.message.contains("Widgets are frozen")
        )
    })
    .await
    .expect("the policy denies Widget updates");

    let certs = Certs::generate();
    let flags = migrator_flags("1s", "300ms", &["--crd-migrate-method=rewrite"]);
    let mut hook = Webhook::start(&cp, &certs, &strs(&flags)).await;
    wait_metric(
        &hook,
        "the migration failed",
        "outcomes_total",
        &["result=\"failed\""],
        1.0,
    )
    .await;
    // The outcome is counted when the rewrite ends and written at the end of that pass.
    poll_until(
        Duration::from_secs(30),
        "the failure in the record",
        || async {
            record(&cp)
                .await
                .migration
                .is_some_and(|m| m.phase != Phase::Running)
        },
    )
    .await
    .expect("the migration's end is recorded");
    let r = record(&cp).await;
    let m = r.migration.expect("the migration is recorded");
    assert_eq!(m.phase, Phase::Failed, "{m:?}");
    assert!(m.message.contains("Widgets are frozen"), "{m:?}");
    assert_eq!(get_crd(&cp).await.status.stored_versions, ["v1beta1", "v1"]);
    assert_eq!(
        stored_counts(&cp),
        [("example.com/v1beta1".to_string(), 20)]
            .into_iter()
            .collect()
    );
    let metrics = hook.metrics().await;
    assert_eq!(crd_metric(&metrics, "prunes_total", &[]), 0.0, "{metrics}");

    let (code, out, err) = support::audit(&cp, &state);
    assert_eq!(code, 1, "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("audit json");
    let finding = &report["crds"][0];
    assert_eq!(finding["code"], "crd-migration-failed", "{out}");
    assert_eq!(finding["migration"], m.name.as_str(), "{out}");
    assert_eq!(finding["method"], "rewrite", "{out}");
    assert!(
        finding["problem"]
            .as_str()
            .is_some_and(|p| p.contains("Widgets are frozen")),
        "{out}"
    );
    let (_, text, _) = support::audit(&cp, &state[2..]);
    assert!(
        text.contains(&format!("{CRD} [crd-migration-failed]")),
        "{text}"
    );

    // The cause removed, a new leader (retry 1 s) tries the same need again by itself, under
    // the next number, with no change to the CRD; the failures in a row go back to 0.
    let generation = get_crd(&cp).await.metadata.generation;
    hook.kill();
    Api::<ValidatingAdmissionPolicyBinding>::all(cp.client.clone())
        .delete("freeze-widgets", &Default::default())
        .await
        .expect("delete the binding");
    Api::<ValidatingAdmissionPolicy>::all(cp.client.clone())
        .delete("freeze-widgets", &Default::default())
        .await
        .expect("delete the policy");
    let flags = migrator_flags(
        "1s",
        "300ms",
        &["--crd-migrate-method=rewrite", "--crd-migrate-retry=1s"],
    );
    let hook = Webhook::start(&cp, &certs, &strs(&flags)).await;
    wait_pruned(&cp, &hook).await;
    assert_eq!(get_crd(&cp).await.metadata.generation, generation);
    assert_eq!(
        stored_counts(&cp),
        [("example.com/v1".to_string(), 20)].into_iter().collect()
    );
    let r = record(&cp).await;
    let retried = r.migration.expect("the retry is recorded");
    assert_eq!(
        (retried.phase, retried.sequence, r.failures),
        (Phase::Succeeded, m.sequence + 1, 0),
        "{retried:?}"
    );
    assert_ne!(retried.name, m.name);
}

/// A control plane without the StorageVersion API (the gate off and the API group not served,
/// as on most clusters): `serve` starts, becomes ready, migrates CRDs all the same, and says once
/// (a log line, `gc_storageversion_api_missing 1`) that built-in storage versions are not
/// visible, with no error loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_storageversion_api_migrates_crds() {
    let _serial = serial().await;
    let cp = ControlPlane::without_storageversion_api().await;
    let svs = support::storage_versions(&cp)
        .list(&Default::default())
        .await;
    assert!(
        matches!(&svs, Err(kube::Error::Api(s)) if s.code == 404),
        "the StorageVersion API is not served: {svs:?}"
    );
    widgets_then_flip(&cp, 50).await;
    let certs = Certs::generate();
    let hook = Webhook::start(
        &cp,
        &certs,
        &strs(&migrator_flags(
            "1s",
            "300ms",
            &["--crd-migrate-method=rewrite"],
        )),
    )
    .await;
    wait_pruned(&cp, &hook).await;
    assert_eq!(
        stored_counts(&cp),
        [("example.com/v1".to_string(), 50)].into_iter().collect()
    );
    hook.wait_ready(Duration::from_secs(10)).await;
    // Said once, and no error loop: the collector's retries of the list are quiet.
    poll_until(
        Duration::from_secs(30),
        "the missing API in the metrics",
        || async {
            metric_sum(
                &hook.metrics().await,
                "storageversion_webhook_gc_storageversion_api_missing",
                &[],
            ) == 1.0
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    let logs = hook.logs_text();
    assert_eq!(
        logs.matches("is not served: built-in storage versions")
            .count(),
        1,
        "{logs}"
    );
    assert!(!logs.contains("StorageVersion watch failed"), "{logs}");
    // `audit` there: the API said to be missing, the CRDs judged (pruned: clean).
    let (code, out, err) = support::audit(&cp, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with(
            "the StorageVersion API (internal.apiserver.k8s.io/v1alpha1) is not served"
        ) && out.contains("clean: every CRD's storedVersions is its storage version"),
        "{out}"
    );
    assert_eq!(
        metric_sum(
            &hook.metrics().await,
            "storageversion_webhook_gc_errors_total",
            &["operation=\"watch_storage_versions\""]
        ),
        0.0
    );
}

/// The scale run (a measurement, not a timed test; `cargo test --test e2e_crd scale --
/// --ignored --nocapture`): `SVW_CRD_SCALE_OBJECTS` Widgets (default 10,000) rewritten at
/// `SVW_CRD_SCALE_RATE` per second (default 1000); prints the time, the API calls per object
/// and the webhook's peak resident memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: minutes and a loaded machine"]
async fn scale_many_objects_of_one_crd() {
    let _serial = serial().await;
    let env_num = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let objects = env_num("SVW_CRD_SCALE_OBJECTS", 10_000);
    let rate = env_num("SVW_CRD_SCALE_RATE", 1000);
    let cp = ControlPlane::up().await;
    widgets_then_flip(&cp, objects).await;
    let certs = Certs::generate();
    let hook = Webhook::start(
        &cp,
        &certs,
        &strs(&migrator_flags(
            "1s",
            "1s",
            &[
                "--crd-migrate-method=rewrite",
                &format!("--crd-migrate-rate={rate}"),
            ],
        )),
    )
    .await;
    let started = std::time::Instant::now();
    poll_until(Duration::from_secs(1800), "storedVersions [v1]", || async {
        get_crd(&cp).await.status.stored_versions == ["v1"]
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    let took = started.elapsed();
    let peak_kib: u64 = std::fs::read_to_string(format!("/proc/{}/status", hook.child.id()))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let metrics = hook.metrics().await;
    let puts = crd_metric(&metrics, "objects_total", &[]);
    let lists = objects.div_ceil(storageversion_webhook::crd::rewrite::PAGE as usize);
    assert_eq!(
        stored_counts(&cp),
        [("example.com/v1".to_string(), objects)]
            .into_iter()
            .collect()
    );
    eprintln!(
        "scale: {objects} objects at {rate}/s: pruned {took:?} after the webhook started; \
         {puts} PUTs + {lists} LISTs ({:.3} calls per object); at the default 50/s: {:.0} s; \
         webhook peak RSS {} MiB",
        (puts + lists as f64) / objects as f64,
        objects as f64 / 50.0,
        peak_kib / 1024
    );
}
