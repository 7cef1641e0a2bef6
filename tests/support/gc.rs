//! Helpers for the garbage-collector end-to-end tests: the collector run in-process against a
//! test control plane, upstream-style leases, seeding StorageVersions, reading GC metrics.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, PostParams};
use prometheus_client::registry::Registry;
use storageversion_webhook::gc::{self, GcArgs, GcHandle};
use storageversion_webhook::model::StorageVersion;

use super::{
    create_sv, leases, metric_sum, poll_until, put_status, storage_versions, ControlPlane,
};

/// GC flags for tests: short grace, leader Lease in `default`, a sweep only at start (unless
/// changed), quick leader election.
pub fn test_gc_args(lease_name: &str) -> GcArgs {
    GcArgs {
        gc_leader_lease_name: lease_name.to_string(),
        gc_leader_lease_namespace: Some("default".to_string()),
        gc_leader_lease_duration: Duration::from_secs(4),
        gc_leader_lease_grace: Duration::from_secs(1),
        gc_lease_deletion_grace: Duration::from_secs(2),
        gc_resync_interval: Duration::from_secs(3600),
        gc_concurrency: 4,
        ..GcArgs::default()
    }
}

/// The collector running in this test process, with its own metrics registry.
pub struct InProcessGc {
    pub handle: Option<GcHandle>,
    pub registry: Registry,
}

impl InProcessGc {
    /// Starts the collector with `args` and waits until it leads.
    pub async fn start(client: kube::Client, args: GcArgs) -> InProcessGc {
        init_test_logs();
        let mut registry = Registry::default();
        let handle = gc::spawn(client, args, &mut registry).expect("valid GC flags");
        let gc = InProcessGc {
            handle: Some(handle),
            registry,
        };
        gc.wait_leading(Duration::from_secs(30)).await;
        gc
    }

    pub async fn wait_leading(&self, deadline: Duration) {
        let handle = self.handle.as_ref().expect("running");
        poll_until(deadline, "the in-process GC to lead", || async {
            handle.is_leading()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    pub fn metrics(&self) -> String {
        storageversion_webhook::metrics::encode(&self.registry)
    }

    /// Sum of a `storageversion_webhook_gc_<name>` metric over the lines with all `labels`.
    /// Asserts that the collector has written nothing (status updates and deletes).
    #[track_caller]
    pub fn assert_no_writes(&self) {
        assert_eq!(
            self.metric("writes_total", &[]),
            0.0,
            "the GC wrote:\n{}",
            self.metrics()
        );
    }

    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        metric_sum(
            &self.metrics(),
            &format!("storageversion_webhook_gc_{name}"),
            labels,
        )
    }

    /// Waits until `metric(name, labels) >= at_least`.
    pub async fn wait_metric(
        &self,
        name: &str,
        labels: &[&str],
        at_least: f64,
        deadline: Duration,
    ) {
        let what = format!("GC metric {name}{labels:?} >= {at_least}");
        poll_until(deadline, &what, || async {
            self.metric(name, labels) >= at_least
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", self.metrics()));
    }

    /// Stops collecting and releases the leader Lease.
    pub async fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown().await;
        }
    }
}

/// A lease as upstream's unit-test helper builds it: name = holder, label set, no renewTime and
/// no duration (docs/upstream.md §5).
pub fn upstream_lease(name: &str) -> Lease {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver"},
        },
        "spec": {"holderIdentity": name},
    }))
    .expect("lease")
}

pub async fn create_lease(cp: &ControlPlane, lease: &Lease) {
    leases(cp)
        .create(&PostParams::default(), lease)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "create lease {:?}: {e}",
                lease.metadata.name.as_deref().unwrap_or("")
            )
        });
}

pub async fn delete_lease(cp: &ControlPlane, name: &str) {
    leases(cp)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete lease {name}: {e}"));
}

/// Creates StorageVersion `name` and writes `status` through `/status`.
pub async fn seed_sv(cp: &ControlPlane, name: &str, status: serde_json::Value) -> StorageVersion {
    create_sv(cp, name).await;
    put_status(cp, name, status)
        .await
        .unwrap_or_else(|e| panic!("seed status of {name}: {e}"))
}

/// An entry `(id, enc, [decodable...])`.
pub fn gc_entry(id: &str, enc: &str, decodable: &[&str]) -> serde_json::Value {
    serde_json::json!({"apiServerID": id, "encodingVersion": enc, "decodableVersions": decodable})
}

pub async fn get_sv(cp: &ControlPlane, name: &str) -> Option<StorageVersion> {
    storage_versions(cp)
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("GET storageversion {name}: {e}"))
}

pub fn ids(sv: &StorageVersion) -> Vec<String> {
    sv.status
        .storage_versions
        .iter()
        .map(|e| e.api_server_id.clone())
        .collect()
}

/// Polls until StorageVersion `name` has exactly the entries `want` (in order).
pub async fn wait_entries(
    cp: &ControlPlane,
    name: &str,
    want: &[&str],
    deadline: Duration,
) -> StorageVersion {
    let end = std::time::Instant::now() + deadline;
    loop {
        let sv = get_sv_opt(cp, name).await;
        if let Some(sv) = &sv {
            if ids(sv) == want {
                return sv.clone();
            }
        }
        assert!(
            std::time::Instant::now() < end,
            "timed out after {deadline:?} waiting for {name} to have entries {want:?}; last seen: {:?}",
            sv.map(|s| s.status)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls until the StorageVersion `name` has no entry for `gone` and one for `kept`, for at
/// most `deadline`; the error says what was awaited.
pub async fn wait_collected(
    cp: &ControlPlane,
    name: &str,
    gone: &str,
    kept: &str,
    deadline: Duration,
) -> Result<(), String> {
    let what = format!("{name} to lose the entry of {gone} and keep {kept}'s");
    poll_until(deadline, &what, || async {
        get_sv_opt(cp, name)
            .await
            .is_some_and(|sv| sv.entry(gone).is_none() && sv.entry(kept).is_some())
    })
    .await
}

async fn get_sv_opt(cp: &ControlPlane, name: &str) -> Option<StorageVersion> {
    storage_versions(cp).get_opt(name).await.ok().flatten()
}

/// Polls until StorageVersion `name` is gone.
pub async fn wait_deleted(cp: &ControlPlane, name: &str, deadline: Duration) {
    poll_until(deadline, &format!("{name} to be deleted"), || async {
        matches!(storage_versions(cp).get_opt(name).await, Ok(None))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A client for `kubeconfig` that impersonates `user` (for RBAC-limited scenarios).
pub async fn impersonating_client(kubeconfig: &Path, user: &str) -> kube::Client {
    client_as(kubeconfig, user, None).await
}

/// A client for `kubeconfig` that impersonates `user` (and `group`, if any).
async fn client_as(kubeconfig: &Path, user: &str, group: Option<&str>) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("kubeconfig config");
    config.auth_info.impersonate = Some(user.to_string());
    config.auth_info.impersonate_groups = group.map(|g| vec![g.to_string()]);
    config.read_timeout = Some(storageversion_webhook::kubeclient::READ_TIMEOUT);
    kube::Client::try_from(config).expect("client")
}

/// A client for `kubeconfig` whose StorageVersion writes (PUT, DELETE) each wait `delay` before
/// they go out: a collector on a slow link, so that its batch lasts long enough for something
/// to happen in the middle of it. Everything else is sent at once.
pub async fn slow_writes_client(kubeconfig: &Path, delay: Duration) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("kubeconfig config");
    config.read_timeout = Some(storageversion_webhook::kubeclient::READ_TIMEOUT);
    kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&SlowWrites(delay))
        .build()
}

/// The layer of [`slow_writes_client`].
#[derive(Clone, Copy)]
struct SlowWrites(Duration);

struct SlowWritesService<S> {
    inner: S,
    delay: Duration,
}

impl<S> tower::Layer<S> for SlowWrites {
    type Service = SlowWritesService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        SlowWritesService {
            inner,
            delay: self.0,
        }
    }
}

impl<S, B> tower::Service<http::Request<B>> for SlowWritesService<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let write = req.method() == http::Method::PUT || req.method() == http::Method::DELETE;
        let delay = if write && req.uri().path().contains("/storageversions/") {
            self.delay
        } else {
            Duration::ZERO
        };
        let sent = self.inner.call(req);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            sent.await
        })
    }
}

/// Applies a JSON object through kubectl (create or replace).
pub fn kubectl_apply(cp: &ControlPlane, obj: &serde_json::Value) {
    use std::io::Write;
    let mut child = cp
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(obj.to_string().as_bytes())
        .expect("write manifest");
    let out = child.wait_with_output().expect("kubectl apply");
    assert!(
        out.status.success(),
        "kubectl apply failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every StorageVersion, by name.
pub async fn all_svs(cp: &ControlPlane) -> Option<Vec<StorageVersion>> {
    storage_versions(cp)
        .list(&Default::default())
        .await
        .ok()
        .map(|l| l.items)
}

pub fn lease_api_in(cp: &ControlPlane, ns: &str) -> Api<Lease> {
    Api::namespaced(cp.client.clone(), ns)
}

/// The collector's logs in the test output (shown for failing tests, or with --nocapture).
/// `RUST_LOG` overrides the default `storageversion_webhook=info`.
pub fn init_test_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("storageversion_webhook=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// `tests/controlplane/run kcm-start <args>`: kube-controller-manager against `cp`.
pub fn kcm_start(cp: &ControlPlane, args: &[&str]) {
    let mut all = vec!["kcm-start"];
    all.extend_from_slice(args);
    cp.run(&all);
}

/// A client for `kubeconfig` that acts as `user` in `system:masters` (all rights), so the
/// apiserver's audit log can tell its requests from the test's own.
pub async fn counted_client(kubeconfig: &Path, user: &str) -> kube::Client {
    client_as(kubeconfig, user, Some("system:masters")).await
}

/// Restarts kube-apiserver writing an audit log (metadata of every request, one line per
/// request) to the returned path.
pub fn enable_audit_log(cp: &ControlPlane) -> std::path::PathBuf {
    let policy = cp.state_dir().join("audit-policy.yaml");
    let log = cp.state_dir().join("audit.log");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\nrules:\n- level: Metadata\n",
    )
    .expect("write the audit policy");
    let args = format!(
        "--audit-policy-file={} --audit-log-path={} --audit-log-maxsize=0",
        policy.display(),
        log.display()
    );
    cp.run_with_env(
        &["restart-apiserver"],
        &[("SVW_APISERVER_EXTRA_ARGS", &args)],
    );
    log
}

/// One request in the apiserver's audit log.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Audited {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

/// The requests `user` (impersonated) made, as the apiserver logged them.
pub fn audited_requests(log: &Path, user: &str) -> Vec<Audited> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["impersonatedUser"]["username"] == user)
        .map(|e| {
            let r = &e["objectRef"];
            let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
            Audited {
                verb: s(&e["verb"]),
                resource: s(&r["resource"]),
                subresource: s(&r["subresource"]),
                namespace: s(&r["namespace"]),
                name: s(&r["name"]),
            }
        })
        .collect()
}
