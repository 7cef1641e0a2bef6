//! Helpers for the storage-migration end-to-end tests: `serve --migrate` replicas, the state
//! ConfigMap, our StorageVersionMigrations, Events, and the bytes kube-apiserver stored in etcd
//! (read with the pinned `etcdctl`).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, ListParams};
use storageversion_webhook::migrate::state::{parse as parse_record, Record};
use storageversion_webhook::migrate::svm::{self, StorageVersionMigration};

use super::{bin_dir, metric_sum, poll_until, Certs, ControlPlane, Webhook};

/// Namespace of the leader Lease and of the state ConfigMap in these tests.
pub const NAMESPACE: &str = "default";
pub const STATE_CONFIGMAP: &str = "storageversion-webhook-migrate";

/// `serve --migrate` flags for tests: quick leader election and passes, the given settle time.
pub fn migrate_flags(settle: &str) -> Vec<String> {
    [
        "--migrate".to_string(),
        format!("--migrate-settle={settle}"),
        "--migrate-interval=300ms".to_string(),
        format!("--gc-leader-lease-namespace={NAMESPACE}"),
        "--gc-leader-lease-name=svw-migrate-test".to_string(),
        "--gc-leader-lease-duration=6s".to_string(),
        "--gc-leader-lease-grace=2s".to_string(),
    ]
    .to_vec()
}

/// Starts a `serve --migrate` replica and waits until it is ready.
pub async fn start_replica(cp: &ControlPlane, certs: &Certs, settle: &str) -> Webhook {
    let flags = migrate_flags(settle);
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    Webhook::start(cp, certs, &refs).await
}

pub fn leads(metrics: &str) -> bool {
    metric_sum(metrics, "storageversion_webhook_gc_leader", &[]) == 1.0
}

/// Sum of a `storageversion_webhook_migration_<name>` metric over lines with all `labels`.
pub fn migration_metric(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metric_sum(
        metrics,
        &format!("storageversion_webhook_migration_{name}"),
        labels,
    )
}

/// Waits until the replica's trigger has made `passes` more passes than now.
pub async fn wait_passes(hook: &Webhook, passes: f64) {
    let start = migration_metric(&hook.metrics().await, "checks_total", &[]);
    poll_until(Duration::from_secs(60), "more migration passes", || async {
        migration_metric(&hook.metrics().await, "checks_total", &[]) >= start + passes
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
}

/// The state ConfigMap's data (empty when it does not exist).
pub async fn state(cp: &ControlPlane) -> BTreeMap<String, String> {
    let api: Api<ConfigMap> = Api::namespaced(cp.client.clone(), NAMESPACE);
    api.get_opt(STATE_CONFIGMAP)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.data)
        .unwrap_or_default()
}

/// What the state remembers about StorageVersion `name`.
pub async fn record(cp: &ControlPlane, name: &str) -> Option<Record> {
    state(cp).await.get(name).map(|v| parse_record(v))
}

/// Waits until the state remembers `version` as agreed for StorageVersion `name`.
pub async fn wait_remembered(cp: &ControlPlane, name: &str, version: &str) {
    poll_until(
        Duration::from_secs(60),
        &format!("the state to remember {name} = {version}"),
        || async { record(cp, name).await.and_then(|r| r.agreed).as_deref() == Some(version) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Every StorageVersionMigration in the cluster, in the API version it serves (None when it
/// serves none of ours or the list fails).
pub async fn migrations(cp: &ControlPlane) -> Option<Vec<StorageVersionMigration>> {
    let v = svm::ApiVersion::discover(&cp.client).await.ok().flatten()?;
    let api: Api<StorageVersionMigration> = Api::all_with(cp.client.clone(), &v);
    api.list(&ListParams::default()).await.ok().map(|l| l.items)
}

/// The migrations for API group `group` and `resource`.
pub async fn migrations_of(
    cp: &ControlPlane,
    group: &str,
    resource: &str,
) -> Vec<StorageVersionMigration> {
    migrations(cp)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.spec.resource.group == group && m.spec.resource.resource == resource)
        .collect()
}

/// Waits for migration `name` to reach `phase` and returns it.
pub async fn wait_phase(
    cp: &ControlPlane,
    name: &str,
    phase: svm::Phase,
    deadline: Duration,
) -> StorageVersionMigration {
    let api: Api<StorageVersionMigration> = Api::all(cp.client.clone());
    let end = Instant::now() + deadline;
    loop {
        let got = api.get_opt(name).await.ok().flatten();
        if let Some(m) = &got {
            if m.phase() == phase {
                return m.clone();
            }
        }
        assert!(
            Instant::now() < end,
            "migration {name} not {phase:?} after {deadline:?}: {got:#?}\nkube-controller-manager log:\n{}",
            tail(&cp.log("kube-controller-manager"), 40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Events (events.k8s.io/v1, namespace `default`) about the object named `name`.
pub async fn events_about(cp: &ControlPlane, name: &str) -> Vec<K8sEvent> {
    let api: Api<K8sEvent> = Api::namespaced(cp.client.clone(), "default");
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .and_then(|r| r.name.as_deref())
                .is_some_and(|n| n == name)
        })
        .collect()
}

/// [`events_about`] `name` with `reason`.
pub async fn events(cp: &ControlPlane, name: &str, reason: &str) -> Vec<K8sEvent> {
    let mut all = events_about(cp, name).await;
    all.retain(|e| e.reason.as_deref() == Some(reason));
    all
}

/// How many times Events about `name` with `reason` occurred (a repeated Event is one object
/// with a series count).
pub async fn event_count(cp: &ControlPlane, name: &str, reason: &str) -> i32 {
    events(cp, name, reason)
        .await
        .iter()
        .map(|e| e.series.as_ref().map(|s| s.count).unwrap_or(1))
        .sum()
}

/// The `SVW_*` values of the control plane's `ports.env`.
fn ports_env(cp: &ControlPlane) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(cp.state_dir().join("ports.env")).expect("ports.env");
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The apiVersion each object under etcd key prefix `prefix` (e.g.
/// `/registry/mutatingadmissionpolicies/`) is stored in, read from etcd with `etcdctl`: the
/// `TypeMeta.apiVersion` of kube-apiserver's protobuf envelope (`k8s\0` + runtime.Unknown), or
/// the `apiVersion` of a JSON value.
pub fn stored_versions(cp: &ControlPlane, prefix: &str) -> BTreeMap<String, String> {
    let env = ports_env(cp);
    let endpoint = env.get("SVW_ETCD_URL").expect("SVW_ETCD_URL in ports.env");
    let out = Command::new(bin_dir().join("etcdctl"))
        .args([
            &format!("--endpoints={endpoint}"),
            "--command-timeout=10s",
            "get",
            "--prefix",
            prefix,
            "-w",
            "json",
        ])
        .output()
        .expect("run etcdctl (tests/controlplane/build etcdctl)");
    assert!(
        out.status.success(),
        "etcdctl get failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("etcdctl JSON");
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut result = BTreeMap::new();
    for kv in v["kvs"].as_array().cloned().unwrap_or_default() {
        let key = b64
            .decode(kv["key"].as_str().unwrap_or_default())
            .expect("base64 key");
        let value = b64
            .decode(kv["value"].as_str().unwrap_or_default())
            .expect("base64 value");
        let key = String::from_utf8_lossy(&key).into_owned();
        let version = stored_api_version(&value)
            .unwrap_or_else(|| panic!("cannot read the apiVersion of {key}: {value:?}"));
        result.insert(key, version);
    }
    result
}

/// The apiVersion of one stored value (protobuf envelope or JSON).
pub fn stored_api_version(value: &[u8]) -> Option<String> {
    if let Some(rest) = value.strip_prefix(b"k8s\0") {
        // runtime.Unknown: field 1 (TypeMeta, bytes) -> field 1 (apiVersion, string).
        let (tag, rest) = rest.split_first()?;
        if *tag != 0x0a {
            return None;
        }
        let (_, rest) = varint(rest)?;
        let (tag, rest) = rest.split_first()?;
        if *tag != 0x0a {
            return None;
        }
        let (len, rest) = varint(rest)?;
        let s = rest.get(..usize::try_from(len).ok()?)?;
        return String::from_utf8(s.to_vec()).ok();
    }
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    v["apiVersion"].as_str().map(str::to_string)
}

fn varint(data: &[u8]) -> Option<(u64, &[u8])> {
    let mut n: u64 = 0;
    for (i, b) in data.iter().enumerate().take(10) {
        n |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((n, &data[i + 1..]));
        }
    }
    None
}

/// `storageversion-webhook audit --output json` against `cp`: (exit code, parsed report).
pub fn audit_json(cp: &ControlPlane) -> (i32, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_storageversion-webhook"))
        .arg("audit")
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .args(["--output", "json", "--migrate-state-namespace", NAMESPACE])
        .output()
        .expect("run audit");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "audit printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}
