//! Shared pieces of the end-to-end tests: a real control plane per test (etcd + kube-apiserver,
//! started by `tests/controlplane/run` in a private state directory), the real
//! `storageversion-webhook serve` process, certificates, webhook registration, polling.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use storageversion_webhook::model::{StorageVersion, IDENTITY_LABEL_KEY, IDENTITY_LABEL_VALUE};

pub const WEBHOOK_NAME: &str = "storageversions.storageversion-webhook.test";

/// Control planes are heavy on a 2-core machine: tests that start one run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Hold the returned guard for the whole test: `let _serial = serial().await;`.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn bin_dir() -> PathBuf {
    std::env::var_os("SVW_CONTROLPLANE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".controlplane/bin"))
}

/// A private control plane, stopped (every process, by PID) when dropped.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub client: kube::Client,
}

impl ControlPlane {
    pub async fn up() -> ControlPlane {
        ControlPlane::up_with(&[]).await
    }

    /// `run up <args>` (e.g. `--apiservers 3 --version 1.36`).
    pub async fn up_with(args: &[&str]) -> ControlPlane {
        ControlPlane::up_with_env(args, &[]).await
    }

    /// `run up <args>` with `env` (e.g. `SVW_APISERVER_EXTRA_ARGS`).
    /// A control plane whose kube-apiserver has no StorageVersion API (the gate off and the
    /// group not served), as most clusters run it.
    pub async fn without_storageversion_api() -> ControlPlane {
        ControlPlane::up_with_env(
            &[],
            &[(
                "SVW_APISERVER_EXTRA_ARGS",
                "--feature-gates=StorageVersionAPI=false --runtime-config=internal.apiserver.k8s.io/v1alpha1=false",
            )],
        )
        .await
    }

    pub async fn up_with_env(args: &[&str], env: &[(&str, &str)]) -> ControlPlane {
        let dir = tempfile::Builder::new()
            .prefix("svw-cp-")
            .tempdir()
            .expect("temp dir for the control plane");
        let cp = ControlPlaneDir(dir.path().to_path_buf());
        let mut all = vec!["up"];
        all.extend_from_slice(args);
        cp.run_with_env(&all, env);
        let kubeconfig = dir.path().join("kubeconfig");
        let client = storageversion_webhook::kubeclient::client(Some(&kubeconfig))
            .await
            .expect("client for the test control plane");
        ControlPlane {
            dir,
            kubeconfig,
            client,
        }
    }

    pub fn state_dir(&self) -> &Path {
        self.dir.path()
    }

    fn script(&self) -> ControlPlaneDir {
        ControlPlaneDir(self.dir.path().to_path_buf())
    }

    /// Runs `tests/controlplane/run <args>` against this control plane; panics with its output
    /// on failure.
    pub fn run(&self, args: &[&str]) {
        self.script().run(args)
    }

    pub fn run_with_env(&self, args: &[&str], env: &[(&str, &str)]) {
        self.script().run_with_env(args, env)
    }

    pub fn restart_apiserver(&self) {
        self.run(&["restart-apiserver"]);
    }

    /// `kubectl` from the built control plane, with this cluster's admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(bin_dir().join("kubectl"));
        cmd.env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    pub fn log(&self, component: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{component}.log")))
            .unwrap_or_default()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("tests/controlplane/run"))
            .arg("down")
            .env("SVW_CP_DIR", self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

struct ControlPlaneDir(PathBuf);

impl ControlPlaneDir {
    fn run(&self, args: &[&str]) {
        self.run_with_env(args, &[])
    }

    fn run_with_env(&self, args: &[&str], env: &[(&str, &str)]) {
        let mut cmd = controlplane_script(&self.0, args);
        cmd.env("SVW_CP_OWNER_PID", std::process::id().to_string());
        for (k, v) in env {
            cmd.env(k, v);
        }
        run_script_ok(&mut cmd, args);
    }
}

/// `tests/controlplane/run` with `args` for the control plane in `dir`.
pub fn controlplane_script<S: AsRef<std::ffi::OsStr>>(dir: &Path, args: &[S]) -> Command {
    let mut cmd = Command::new(repo_root().join("tests/controlplane/run"));
    cmd.args(args).env("SVW_CP_DIR", dir);
    cmd
}

/// Runs a [`controlplane_script`] command; on failure panics with its `args` and output.
pub fn run_script_ok<S: std::fmt::Debug>(cmd: &mut Command, args: &[S]) {
    let out = cmd.output().expect("tests/controlplane/run can be started");
    assert!(
        out.status.success(),
        "tests/controlplane/run {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `storageversion_webhook_admission_reviews_total` with `labels`, summed, in `metrics`.
pub fn reviews_total(metrics: &str, labels: &[&str]) -> f64 {
    metric_sum(
        metrics,
        "storageversion_webhook_admission_reviews_total",
        labels,
    )
}

/// `storageversion_webhook_admission_findings_total` with `labels`, summed, in `metrics`.
pub fn findings_total(metrics: &str, labels: &[&str]) -> f64 {
    metric_sum(
        metrics,
        "storageversion_webhook_admission_findings_total",
        labels,
    )
}

/// `storageversion_webhook_lease_lookups_total` with `labels`, summed, in `metrics`.
pub fn lease_lookups_total(metrics: &str, labels: &[&str]) -> f64 {
    metric_sum(
        metrics,
        "storageversion_webhook_lease_lookups_total",
        labels,
    )
}

/// Starts `serve` with `extra` arguments and registers it as `cp`'s webhook with
/// `failure_policy`. Keep the certificates while the webhook runs (`let (_certs, hook)`).
pub async fn registered_webhook(
    cp: &ControlPlane,
    extra: &[&str],
    failure_policy: &str,
) -> (Certs, Webhook) {
    let certs = Certs::generate();
    let hook = Webhook::start(cp, &certs, extra).await;
    register_webhook(cp, &hook.url(), &certs.ca_pem, failure_policy).await;
    (certs, hook)
}

/// A CA and a serving certificate for 127.0.0.1, as PEM files in a temp dir.
pub struct Certs {
    pub dir: tempfile::TempDir,
    pub ca_pem: String,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_file: PathBuf,
}

impl Certs {
    pub fn generate() -> Certs {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
        let dir = tempfile::tempdir().expect("temp dir for certificates");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "storageversion-webhook test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("serving key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_string()]).expect("serving params");
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
        let cert = params
            .signed_by(&key, &issuer)
            .expect("serving certificate");
        let cert_file = dir.path().join("tls.crt");
        let key_file = dir.path().join("tls.key");
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&cert_file, cert.pem()).expect("write tls.crt");
        std::fs::write(&key_file, key.serialize_pem()).expect("write tls.key");
        std::fs::write(&ca_file, ca_cert.pem()).expect("write ca.crt");
        Certs {
            ca_pem: ca_cert.pem(),
            dir,
            cert_file,
            key_file,
            ca_file,
        }
    }
}

/// A running `storageversion-webhook serve` process; killed when dropped.
pub struct Webhook {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Webhook {
    /// Starts `serve` on loopback with ephemeral ports against `cp` and waits for /readyz.
    pub async fn start(cp: &ControlPlane, certs: &Certs, extra: &[&str]) -> Webhook {
        Webhook::start_with_kubeconfig(&cp.kubeconfig, certs, extra).await
    }

    /// Like [`Webhook::start`], talking to the API server `kubeconfig` names (a fault proxy's).
    pub async fn start_with_kubeconfig(
        kubeconfig: &Path,
        certs: &Certs,
        extra: &[&str],
    ) -> Webhook {
        let mut args: Vec<String> = [
            "--log-format",
            "json",
            "--log-level",
            "info",
            "serve",
            "--listen=127.0.0.1:0",
            "--admin-listen=127.0.0.1:0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (flag, path) in [
            ("--tls-cert-file", certs.cert_file.as_path()),
            ("--tls-key-file", certs.key_file.as_path()),
            ("--kubeconfig", kubeconfig),
        ] {
            args.push(flag.to_string());
            args.push(path.display().to_string());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let hook = Webhook::spawn(&args, &[]);
        hook.wait_ready(Duration::from_secs(60)).await;
        hook
    }

    pub fn url(&self) -> String {
        format!("https://{}/validate", self.addr)
    }

    pub async fn wait_ready(&self, deadline: Duration) {
        let admin = self.admin;
        poll_until(deadline, "webhook /readyz to be ok", || async move {
            http_get(admin, "/readyz")
                .await
                .map(|(s, _)| s == 200)
                .unwrap_or(false)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}; logs:\n{}", self.logs_text()));
    }

    pub async fn metrics(&self) -> String {
        match http_get(self.admin, "/metrics").await {
            Some((200, body)) => body,
            other => panic!("GET /metrics failed: {other:?}"),
        }
    }

    pub fn logs_text(&self) -> String {
        self.logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }

    /// SIGTERM, then wait for exit with a deadline.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "serve did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Parses the start-up log line `{"message":"serving admission reviews", "listen":"ip:port",
/// "admin_listen":"ip:port", ...}`.
fn listening_addrs(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let addr = v.get("listen")?.as_str()?.parse().ok()?;
    let admin = v.get("admin_listen")?.as_str()?.parse().ok()?;
    Some((addr, admin))
}

// Shared with the benchmarks and the bench driver: the test kit (testkit/).
#[allow(unused_imports)] // each test binary uses a different subset
pub use svw_testkit::{base64, http_get, metric_sum, poll_until};

/// Registers the webhook as the issue describes: URL on loopback, CA bundle, storageversions and
/// storageversions/status, CREATE and UPDATE.
pub async fn register_webhook(cp: &ControlPlane, url: &str, ca_pem: &str, failure_policy: &str) {
    let vwc: ValidatingWebhookConfiguration =
        serde_json::from_value(svw_testkit::webhook_configuration(
            "storageversion-webhook",
            WEBHOOK_NAME,
            url,
            ca_pem.as_bytes(),
            failure_policy,
        ))
        .expect("webhook configuration");
    let api: Api<ValidatingWebhookConfiguration> = Api::all(cp.client.clone());
    let _ = api
        .delete("storageversion-webhook", &DeleteParams::default())
        .await;
    api.create(&PostParams::default(), &vwc)
        .await
        .expect("create ValidatingWebhookConfiguration");
}

pub async fn unregister_webhook(cp: &ControlPlane) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(cp.client.clone());
    let _ = api
        .delete("storageversion-webhook", &DeleteParams::default())
        .await;
}

/// An identity lease as kube-apiserver writes it, renewed `renewed_ago` before now.
pub fn identity_lease(name: &str, label: Option<&str>, renewed_ago: Duration) -> Lease {
    let renew = Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::try_from(renewed_ago).expect("duration"))
        .expect("time");
    let mut labels = std::collections::BTreeMap::new();
    if let Some(v) = label {
        labels.insert(IDENTITY_LABEL_KEY.to_string(), v.to_string());
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-system", "labels": labels},
        "spec": {
            "holderIdentity": format!("{name}_test"),
            "leaseDurationSeconds": 3600,
            "renewTime": renew.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
            "acquireTime": renew.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        }
    }))
    .expect("lease")
}

pub fn live_identity_lease(name: &str) -> Lease {
    identity_lease(name, Some(IDENTITY_LABEL_VALUE), Duration::ZERO)
}

/// `storageversion-webhook audit --kubeconfig <the control plane's> EXTRA`, run as the real
/// binary: its exit status, stdout and stderr.
pub fn audit(cp: &ControlPlane, extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_storageversion-webhook"))
        .arg("audit")
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .args(extra)
        .output()
        .expect("run audit");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn leases(cp: &ControlPlane) -> Api<Lease> {
    Api::namespaced(cp.client.clone(), "kube-system")
}

pub fn storage_versions(cp: &ControlPlane) -> Api<StorageVersion> {
    Api::all(cp.client.clone())
}

/// An entry as kube-apiserver would write it for group `apps`.
pub fn entry(id: &str, enc: &str, decodable: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "apiServerID": id,
        "encodingVersion": enc,
        "decodableVersions": decodable,
    })
}

/// The identity of the control plane's own kube-apiserver (the one identity lease it has).
pub async fn own_apiserver_id(cp: &ControlPlane) -> String {
    let api = leases(cp);
    let lp = kube::api::ListParams::default()
        .labels(&format!("{IDENTITY_LABEL_KEY}={IDENTITY_LABEL_VALUE}"));
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(list) = api.list(&lp).await {
            if let Some(name) = list.items.into_iter().find_map(|l| l.metadata.name) {
                return name;
            }
        }
        assert!(
            Instant::now() < end,
            "no kube-apiserver identity lease after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates StorageVersion `name` (the server empties its status on create).
pub async fn create_sv(cp: &ControlPlane, name: &str) -> StorageVersion {
    let sv: StorageVersion = serde_json::from_value(serde_json::json!({
        "apiVersion": "internal.apiserver.k8s.io/v1alpha1",
        "kind": "StorageVersion",
        "metadata": {"name": name},
        "spec": {},
    }))
    .expect("storage version");
    storage_versions(cp)
        .create(&PostParams::default(), &sv)
        .await
        .expect("create StorageVersion")
}

/// Replaces the status of StorageVersion `name` through `/status` (GET for the resourceVersion,
/// then PUT), the way kube-apiserver writes it.
pub async fn put_status(
    cp: &ControlPlane,
    name: &str,
    status: serde_json::Value,
) -> Result<StorageVersion, kube::Error> {
    let api = storage_versions(cp);
    let mut sv = api.get(name).await?;
    sv.status = serde_json::from_value(status).expect("status");
    sv.api_version = Some("internal.apiserver.k8s.io/v1alpha1".into());
    sv.kind = Some("StorageVersion".into());
    api.replace_status(name, &PostParams::default(), &sv).await
}

/// A status for the named group `group` with one entry per id, all at `<group>/v1`, and the
/// common version and condition kube-apiserver would write.
pub fn status_for(group: &str, ids: &[&str]) -> serde_json::Value {
    let v = format!("{group}/v1");
    let entries = ids.iter().map(|id| entry(id, &v, &[&v])).collect();
    svw_testkit::fixtures::agreed_status(entries, &v, "2026-01-01T00:00:00Z")
}

/// The text of an API error (kube's error message), or "" for success.
pub fn api_error_text<T>(result: &Result<T, kube::Error>) -> String {
    match result {
        Ok(_) => String::new(),
        Err(kube::Error::Api(status)) => format!("{} ({})", status.message, status.code),
        Err(e) => e.to_string(),
    }
}

/// Installs the OpenReports CRDs (ClusterReport, Report) that component `openreports` of
/// tests/controlplane/build copies out of the pinned Go module, and waits until they are served.
pub fn install_openreports_crds(cp: &ControlPlane) {
    for crd in [
        "openreports.io_clusterreports.yaml",
        "openreports.io_reports.yaml",
    ] {
        let path = bin_dir().join(crd);
        assert!(
            path.exists(),
            "{} is missing: run tests/controlplane/build openreports",
            path.display()
        );
        let out = cp
            .kubectl()
            .args(["apply", "--server-side", "-f"])
            .arg(&path)
            .output()
            .expect("kubectl apply");
        assert!(
            out.status.success(),
            "installing {crd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = cp
        .kubectl()
        .args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/clusterreports.openreports.io",
            "crd/reports.openreports.io",
        ])
        .output()
        .expect("kubectl wait");
    assert!(
        out.status.success(),
        "CRDs not established: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Webhook {
    /// Starts the real binary with exactly `args` (everything after the program name; the log
    /// format must be json so the listen addresses can be read) and extra environment `env`,
    /// and waits until it reports its listen addresses. It does not wait for /readyz: call
    /// [`Webhook::wait_ready`] for that.
    pub fn spawn(args: &[String], env: &[(&str, &str)]) -> Webhook {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_storageversion-webhook"));
        cmd.args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start storageversion-webhook");
        let stderr = child.stderr.take().expect("piped stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let logs = Arc::clone(&logs);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(addrs) = listening_addrs(&line) {
                        let _ = tx.send(addrs);
                    }
                    logs.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                }
            });
        }
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok((addr, admin)) => Webhook {
                child,
                addr,
                admin,
                logs,
            },
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().ok();
                // Let the reader thread drain what the process wrote before it exited.
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "storageversion-webhook {args:?} did not report its listen addresses within \
                     30 s (exit: {status:?}); logs:\n{}",
                    logs.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
                )
            }
        }
    }
}

pub mod gc;
pub mod ha;
pub mod migrate;
pub mod node;
pub mod ops;
