//! The product as users run it: the container image built by `scripts/image` (the README's
//! Install section), installed with `helm install` on a control plane with a real node (kubelet,
//! containerd + runc, CNI bridge; `tests/controlplane/run up --node`, docs/node.md).
//!
//! - the image: static, small, non-root, the binary as entrypoint, `--help` served;
//! - helm-made certificates: pods Running and Ready (probes through the kubelet), kube-apiserver
//!   calling the webhook through its Service (a denied write names the webhook), a leader
//!   elected among the replicas, `helm test` passing, and failing with its message once the
//!   Service has no endpoints (deployment scaled to 0), `helm uninstall` leaving nothing behind
//!   (its post-delete Job deletes the leader Lease, the migration state ConfigMap and the test
//!   pod);
//! - an existing Secret, with writes going on all the time (failurePolicy Fail, so a write fails
//!   whenever no webhook answers): the Secret replaced (the kubelet's atomic symlink swap) and
//!   the new certificate served with no failed write; the leader pod deleted and the other
//!   replica taking over and collecting a lease deleted afterwards; the PodDisruptionBudget
//!   refusing a second eviction; `helm upgrade` rolling the pods with no failed write; `helm test`
//!   passing in this certificate mode too; `helm uninstall` with the pods running leaving nothing.
//!
//! Run: `cargo test --test node_chart -- --nocapture` (root; builds the image and the node).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, PostParams};
use serde_json::Value;
use support::gc::{create_lease, delete_lease, wait_collected};
use support::node::{image, output, text};
use support::ops::helm_on;
use support::*;

const CHART: &str = "charts/storageversion-webhook";
const RELEASE: &str = "svw";
const FULLNAME: &str = "svw-storageversion-webhook";
const SELECTOR: &str =
    "app.kubernetes.io/instance=svw,app.kubernetes.io/name=storageversion-webhook";
const GROUP: &str = "node.example.com";

fn webhook_name(ns: &str) -> String {
    format!("storageversions.{FULLNAME}.{ns}.svc")
}

/// Runs `cmd`; on failure panics with its output and the node's state; returns stdout.
fn ok(cp: &ControlPlane, cmd: &mut Command) -> String {
    let out = output(cmd);
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n{}\n{}",
            out.status,
            text(&out),
            diagnostics(cp)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the cluster and the node say, for a failure message.
fn diagnostics(cp: &ControlPlane) -> String {
    let mut s = String::new();
    for args in [
        &["get", "nodes,pods,endpoints", "-A", "-o", "wide"][..],
        &["get", "events", "-A", "--sort-by=.lastTimestamp"][..],
    ] {
        let out = output(cp.kubectl().args(args));
        s.push_str(&format!("$ kubectl {}\n{}\n", args.join(" "), text(&out)));
    }
    let out = output(
        cp.kubectl()
            .args(["logs", "-A", "-l", SELECTOR, "--tail=30", "--prefix"]),
    );
    s.push_str(&format!("webhook logs:\n{}\n", text(&out)));
    for c in ["kubelet", "containerd"] {
        let log = cp.node_log(c);
        let tail: Vec<&str> = log.lines().rev().take(25).collect();
        s.push_str(&format!(
            "last lines of {c}.log:\n{}\n",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    s
}

/// `helm install|upgrade` arguments for the image under test, a fast leader election and
/// garbage collection, and failurePolicy Fail (a write fails when no webhook answers).
fn chart_args(ns: &str, extra: &[&str]) -> Vec<String> {
    let img = image();
    let mut args: Vec<String> = [RELEASE, CHART, "-n", ns, "--wait", "--timeout", "180s"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for set in [
        format!("image.repository={}", img.repository),
        format!("image.tag={}", img.tag),
        "image.pullPolicy=Never".into(),
        "webhook.failurePolicy=Fail".into(),
        "gc.leaderElection.leaseDuration=6s".into(),
        "gc.leaderElection.leaseGrace=2s".into(),
        "gc.leaseDeletionGrace=1s".into(),
        "server.shutdownDelay=3s".into(),
    ] {
        args.push("--set".into());
        args.push(set);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The release's pods: (name, IP, ready), with a deadline for `want` ready pods that are not
/// being deleted.
async fn ready_pods(cp: &ControlPlane, ns: &str, want: usize) -> Vec<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), ns);
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let list = pods
            .list(&ListParams::default().labels(SELECTOR))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let ready: Vec<(String, String)> = list
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                let st = p.status.as_ref();
                st.and_then(|s| s.phase.as_deref()) == Some("Running")
                    && st.and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                        cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                    })
            })
            .filter_map(|p| Some((p.metadata.name.clone()?, p.status.as_ref()?.pod_ip.clone()?)))
            .collect();
        if ready.len() == want && list.len() == want {
            return ready;
        }
        assert!(
            Instant::now() < end,
            "{want} ready pods not there after 120 s (have {ready:?} of {})\n{}",
            list.len(),
            diagnostics(cp)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The holder of the garbage collector's leader Lease (`<fullname>-gc`), once there is one.
async fn leader(cp: &ControlPlane, ns: &str, not: Option<&str>) -> String {
    let leases: Api<Lease> = Api::namespaced(cp.client.clone(), ns);
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(l) = leases.get(&format!("{FULLNAME}-gc")).await {
            if let Some(h) = l.spec.and_then(|s| s.holder_identity) {
                if !h.is_empty() && Some(h.as_str()) != not {
                    return h;
                }
            }
        }
        assert!(
            Instant::now() < end,
            "no new leader (other than {not:?}) after 90 s\n{}",
            diagnostics(cp)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// SHA-256 fingerprint of the certificate served at `ip:8443` for the Service's name, as seen by
/// a real TLS client (openssl), or None.
fn served_fingerprint(ip: &str, ns: &str) -> Option<String> {
    let script = format!(
        "openssl s_client -connect {ip}:8443 -servername {FULLNAME}.{ns}.svc </dev/null 2>/dev/null \
         | openssl x509 -noout -fingerprint -sha256"
    );
    let out = Command::new("timeout")
        .args(["10", "bash", "-c", &script])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn file_fingerprint(pem: &Path) -> String {
    let out = output(
        Command::new("openssl")
            .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
            .arg(pem),
    );
    assert!(out.status.success(), "openssl x509: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A CA and a serving certificate for the chart's Service name.
struct ServiceCerts {
    dir: tempfile::TempDir,
    ca: rcgen::Issuer<'static, rcgen::KeyPair>,
    ca_pem: String,
}

impl ServiceCerts {
    fn new() -> ServiceCerts {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "node test CA");
        let ca_pem = params.self_signed(&key).expect("CA").pem();
        ServiceCerts {
            dir: tempfile::tempdir().expect("temp dir"),
            ca: rcgen::Issuer::new(params, key),
            ca_pem,
        }
    }

    /// A new leaf for the Service in `ns`: (cert file, key file).
    fn leaf(&self, ns: &str, n: u32) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec![
            format!("{FULLNAME}.{ns}.svc"),
            format!("{FULLNAME}.{ns}.svc.cluster.local"),
        ])
        .expect("params");
        let cert = params.signed_by(&key, &self.ca).expect("leaf");
        let crt = self.dir.path().join(format!("tls-{n}.crt"));
        let kf = self.dir.path().join(format!("tls-{n}.key"));
        std::fs::write(&crt, cert.pem()).expect("write cert");
        std::fs::write(&kf, key.serialize_pem()).expect("write key");
        (crt, kf)
    }
}

/// Allowed writes (the live apiserver's own entry) to one StorageVersion, back to back, until
/// stopped: how many succeeded and the errors of those that failed.
struct Writer {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    async fn start(cp: &ControlPlane, name: &str, own_id: &str) -> Writer {
        create_sv(cp, name).await;
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let (s, d, f) = (stop.clone(), done.clone(), failures.clone());
        let api = storage_versions(cp);
        let (name, id) = (name.to_string(), own_id.to_string());
        let task = tokio::spawn(async move {
            let mut gen = 0u32;
            while !s.load(Ordering::Relaxed) {
                gen += 1;
                // A different decodable list each time, so every write is a real change.
                let mut status = status_for(GROUP, &[&id]);
                status["storageVersions"][0]["decodableVersions"] =
                    serde_json::json!([format!("{GROUP}/v1"), format!("{GROUP}/v{}", 2 + gen % 2)]);
                let res = async {
                    let mut sv = api.get(&name).await?;
                    sv.status = serde_json::from_value(status).expect("status");
                    api.replace_status(&name, &PostParams::default(), &sv).await
                }
                .await;
                match res {
                    Ok(_) => {
                        d.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => f
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(api_error_text::<()>(&Err(e))),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Writer {
            stop,
            done,
            failures,
            task,
        }
    }

    fn count(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Waits for `n` more successful writes (the writer is not stuck).
    async fn progress(&self, n: u64, what: &str) {
        let start = self.count();
        poll_until(Duration::from_secs(60), what, || async {
            self.count() >= start + n
        })
        .await
        .unwrap_or_else(|e| panic!("{e}; failures: {:?}", self.failures()));
    }

    fn failures(&self) -> Vec<String> {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let n = self.done.load(Ordering::Relaxed);
        let f = self
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        (n, f)
    }
}

/// Names of objects the release left in `ns` or cluster-wide (the namespace's own defaults and
/// `keep` excepted).
fn leftovers(cp: &ControlPlane, ns: &str, keep: &[&str]) -> Vec<String> {
    let mut left = Vec::new();
    let namespaced = ok(
        cp,
        cp.kubectl().args([
            "get",
            "deployments,replicasets,pods,jobs,services,endpoints,endpointslices,secrets,configmaps,serviceaccounts,roles,rolebindings,leases,poddisruptionbudgets,networkpolicies",
            "-n",
            ns,
            "-o",
            "name",
        ]),
    );
    for n in namespaced.lines() {
        let defaults = ["serviceaccount/default", "configmap/kube-root-ca.crt"];
        if !defaults.contains(&n) && !keep.contains(&n) {
            left.push(format!("{ns}/{n}"));
        }
    }
    let cluster = ok(
        cp,
        cp.kubectl().args([
            "get",
            "validatingwebhookconfigurations,clusterroles,clusterrolebindings",
            "-o",
            "name",
        ]),
    );
    left.extend(
        cluster
            .lines()
            .filter(|n| n.contains(FULLNAME))
            .map(String::from),
    );
    left
}

/// `helm uninstall` (waiting up to 120 s), then [`uninstalled`].
async fn uninstall(cp: &ControlPlane, ns: &str, keep: &[&str]) {
    let args = [
        "uninstall",
        RELEASE,
        "-n",
        ns,
        "--wait",
        "--timeout",
        "120s",
    ];
    ok(cp, helm_on(cp).args(args));
    uninstalled(cp, ns, keep).await;
}

/// After `helm uninstall`: nothing of the release is left once its pods have terminated, not
/// even what the pods made and Helm does not know about (the garbage collector's leader Lease,
/// the migration state ConfigMap), nor the last `helm test` pod: the chart's post-delete Job
/// deletes them (`storageversion-webhook cleanup`).
async fn uninstalled(cp: &ControlPlane, ns: &str, keep: &[&str]) {
    let mut left = Vec::new();
    let end = Instant::now() + Duration::from_secs(90);
    while Instant::now() < end {
        left = leftovers(cp, ns, keep);
        if left.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!(
        "helm uninstall left {left:?} after 90 s\n{}",
        diagnostics(cp)
    );
}

/// `helm test <release> --logs`: its exit status and everything it printed (the test pod's log
/// included).
fn helm_test(cp: &ControlPlane, ns: &str) -> (bool, String) {
    let out = output(helm_on(cp).args(["test", RELEASE, "-n", ns, "--logs", "--timeout", "150s"]));
    (out.status.success(), text(&out))
}

/// `helm test` passes: every ready replica allowed the valid review and judged the invalid one,
/// and audit ran.
fn helm_test_passes(cp: &ControlPlane, ns: &str, replicas: usize) -> String {
    let (passed, said) = helm_test(cp, ns);
    assert!(passed, "helm test failed:\n{said}\n{}", diagnostics(cp));
    assert!(
        said.contains("PASS: the webhook answers as kube-apiserver would call it"),
        "{said}"
    );
    assert_eq!(
        said.matches("allowed a valid StorageVersion").count(),
        replicas,
        "not every replica was called: {said}"
    );
    assert_eq!(
        said.matches("denied an object breaking name-format")
            .count(),
        replicas,
        "{said}"
    );
    assert!(
        said.contains("audit:") && said.contains("StorageVersions,"),
        "{said}"
    );
    said
}

/// The migration state ConfigMap as `serve --migrate` writes it (its name, namespace and label),
/// so that the cleanup is seen deleting it without running a migration.
fn create_state_configmap(cp: &ControlPlane, ns: &str) {
    let (k, v) = storageversion_webhook::migrate::state::STATE_LABEL;
    let cm = format!("{FULLNAME}-migrate");
    ok(
        cp,
        cp.kubectl()
            .args(["-n", ns, "create", "configmap", &cm, "--from-literal=x=y"]),
    );
    ok(
        cp,
        cp.kubectl()
            .args(["-n", ns, "label", "configmap", &cm, &format!("{k}={v}")]),
    );
}

#[test]
fn image_is_static_small_non_root_and_serves_help() {
    let img = image();
    let out = output(Command::new("podman").args(["image", "inspect", &img.reference()]));
    assert!(out.status.success(), "podman image inspect: {}", text(&out));
    let inspect: Value = serde_json::from_slice(&out.stdout).expect("inspect JSON");
    let i = &inspect[0];
    let size = i["Size"].as_u64().expect("Size");
    eprintln!("image {}: {size} bytes", img.reference());
    assert!(size < 30_000_000, "image is {size} bytes, over 30 MB");
    assert_eq!(i["Config"]["User"], "65532:65532", "image user: {i}");
    assert_eq!(
        i["Config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/storageversion-webhook"]),
        "entrypoint: {i}"
    );
    // Nothing but the binary: the image has one layer.
    assert_eq!(
        i["RootFS"]["Layers"].as_array().map(Vec::len),
        Some(1),
        "layers: {i}"
    );
    let out = output(Command::new("podman").args([
        "--runtime",
        "runc",
        "run",
        "--rm",
        "--read-only",
        "--network",
        "none",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        &img.reference(),
        "--help",
    ]));
    let said = text(&out);
    assert!(out.status.success(), "--help in the image failed: {said}");
    for cmd in ["serve", "check", "audit"] {
        assert!(said.contains(cmd), "--help does not list `{cmd}`: {said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_runs_on_a_real_node() {
    let t0 = Instant::now();
    let img = image();
    eprintln!("image ready after {:?}", t0.elapsed());
    let cp = ControlPlane::up_with_node(&[img.archive.as_path()]).await;
    eprintln!("control plane and node up after {:?}", t0.elapsed());
    let own_id = own_apiserver_id(&cp).await;

    // --- helm-made certificates: install, serve, deny, elect, uninstall.
    let ns = "svw-helm";
    let mut install = helm_on(&cp);
    install
        .arg("install")
        .args(chart_args(ns, &["--create-namespace"]));
    ok(&cp, &mut install);
    let pods = ready_pods(&cp, ns, 2).await;
    eprintln!("helm mode: pods {pods:?} ready after {:?}", t0.elapsed());
    let sv = "node.example.com.deny";
    create_sv(&cp, sv).await;
    let denied = put_status(
        &cp,
        sv,
        status_for(GROUP, &["apiserver-nodetest-nolease0000000"]),
    )
    .await;
    let msg = api_error_text(&denied);
    assert!(
        denied.is_err(),
        "a write naming an apiserver with no lease was admitted"
    );
    assert!(
        msg.contains(&webhook_name(ns)) && msg.contains("lease-missing"),
        "the denial does not name the webhook and the rule: {msg}"
    );
    let allowed = put_status(&cp, sv, status_for(GROUP, &[&own_id])).await;
    assert!(
        allowed.is_ok(),
        "the live apiserver's entry was denied: {}",
        api_error_text(&allowed)
    );
    let holder = leader(&cp, ns, None).await;
    assert!(
        pods.iter()
            .any(|(name, _)| holder.starts_with(name.as_str())),
        "leader {holder} is none of the pods {pods:?}"
    );

    // helm test: the chart's own image calls both replicas through the Service's endpoints with
    // the caBundle of the webhook configuration, then runs audit.
    let said = helm_test_passes(&cp, ns, 2);
    eprintln!("helm test passed after {:?}:\n{said}", t0.elapsed());

    // No endpoints: helm test fails, and says why.
    ok(
        &cp,
        cp.kubectl()
            .args(["-n", ns, "scale", "deployment", FULLNAME, "--replicas=0"]),
    );
    let pod_api: Api<Pod> = Api::namespaced(cp.client.clone(), ns);
    poll_until(
        Duration::from_secs(90),
        "the webhook pods to go",
        || async {
            pod_api
                .list(&ListParams::default().labels(SELECTOR))
                .await
                .is_ok_and(|l| l.items.is_empty())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&cp)));
    let (passed, said) = helm_test(&cp, ns);
    assert!(!passed, "helm test passed with no webhook pod:\n{said}");
    let want = format!("FAIL: the webhook Service {ns}/{FULLNAME} has no ready endpoints");
    assert!(
        said.contains(&want),
        "helm test did not say {want:?}:\n{said}"
    );
    eprintln!("helm test with no endpoints failed as it should:\n{said}");

    // helm uninstall: the post-delete Job deletes the leader Lease (made by the pods, released
    // but left when they stopped), the migration state ConfigMap and the test pod.
    let leases: Api<Lease> = Api::namespaced(cp.client.clone(), ns);
    assert!(
        leases
            .get_opt(&format!("{FULLNAME}-gc"))
            .await
            .expect("get lease")
            .is_some(),
        "no leader Lease before the uninstall: the cleanup would prove nothing"
    );
    create_state_configmap(&cp, ns);
    uninstall(&cp, ns, &[]).await;
    eprintln!("helm mode done after {:?}", t0.elapsed());

    // --- an existing Secret, with writes going on throughout.
    let ns = "svw-secret";
    let certs = ServiceCerts::new();
    let ca_file = certs.dir.path().join("ca.crt");
    std::fs::write(&ca_file, &certs.ca_pem).expect("write ca");
    let (crt1, key1) = certs.leaf(ns, 1);
    ok(&cp, cp.kubectl().args(["create", "namespace", ns]));
    ok(
        &cp,
        cp.kubectl()
            .args(["-n", ns, "create", "secret", "tls", "svw-serving", "--cert"])
            .arg(&crt1)
            .arg("--key")
            .arg(&key1),
    );
    let mut install = helm_on(&cp);
    install.arg("install").args(chart_args(
        ns,
        &[
            "--set",
            "certificates.mode=secret",
            "--set",
            "certificates.secretName=svw-serving",
            "--set-file",
            &format!("certificates.secret.caBundle={}", ca_file.display()),
        ],
    ));
    ok(&cp, &mut install);
    let pods = ready_pods(&cp, ns, 2).await;
    // helm test with the CA given in certificates.secret.caBundle.
    helm_test_passes(&cp, ns, 2);
    let writer = Writer::start(&cp, "node.example.com.writes", &own_id).await;
    writer.progress(20, "20 writes through the webhook").await;

    // The Secret replaced: the kubelet swaps the volume's files, each pod serves the new leaf.
    let (crt2, key2) = certs.leaf(ns, 2);
    let new_fp = file_fingerprint(&crt2);
    let replacement = ok(
        &cp,
        cp.kubectl()
            .args([
                "-n",
                ns,
                "create",
                "secret",
                "tls",
                "svw-serving",
                "--dry-run=client",
                "-o",
                "yaml",
                "--cert",
            ])
            .arg(&crt2)
            .arg("--key")
            .arg(&key2),
    );
    let yaml = certs.dir.path().join("secret-2.yaml");
    std::fs::write(&yaml, replacement).expect("write secret");
    ok(
        &cp,
        cp.kubectl().args(["-n", ns, "replace", "-f"]).arg(&yaml),
    );
    let rotated = Instant::now();
    for (name, ip) in &pods {
        poll_until(
            Duration::from_secs(120),
            &format!("{name} to serve the new certificate"),
            || async { served_fingerprint(ip, ns).as_deref() == Some(new_fp.as_str()) },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}; served: {:?}", served_fingerprint(ip, ns)));
    }
    eprintln!(
        "new certificate served by every pod {:?} after the Secret was replaced",
        rotated.elapsed()
    );
    writer.progress(20, "writes after the rotation").await;

    // The leader pod deleted: the other replica takes over and collects a lease deleted later.
    let gone_id = "apiserver-nodetest-collected00000";
    create_lease(&cp, &live_identity_lease(gone_id)).await;
    let collected = "node.example.com.collected";
    create_sv(&cp, collected).await;
    put_status(&cp, collected, status_for(GROUP, &[&own_id, gone_id]))
        .await
        .unwrap_or_else(|e| panic!("write with two live entries denied: {e}"));
    let first = leader(&cp, ns, None).await;
    let first_pod = pods
        .iter()
        .find(|(name, _)| first.starts_with(name.as_str()))
        .map(|(n, _)| n.clone())
        .unwrap_or_else(|| panic!("leader {first} is none of the pods {pods:?}"));
    let pod_api: Api<Pod> = Api::namespaced(cp.client.clone(), ns);
    pod_api
        .delete(&first_pod, &DeleteParams::default())
        .await
        .expect("delete the leader pod");
    let second = leader(&cp, ns, Some(&first)).await;
    eprintln!("leader {first} deleted; {second} took over");
    delete_lease(&cp, gone_id).await;
    // The new leader collects the deleted lease's entry.
    wait_collected(&cp, collected, gone_id, &own_id, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&cp)));
    let pods = ready_pods(&cp, ns, 2).await;

    // The PodDisruptionBudget (maxUnavailable 1) is computed by the real disruption controller
    // from the real pods: with both ready it allows exactly one disruption, and an eviction
    // through it succeeds and is replaced. (A second eviction right after the first was admitted
    // in the one run that tried it; see docs/node.md.)
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(cp.client.clone(), ns);
    poll_until(
        Duration::from_secs(60),
        "the PodDisruptionBudget to allow exactly one disruption of two healthy pods",
        || async {
            pdbs.get(FULLNAME)
                .await
                .ok()
                .and_then(|p| p.status)
                .is_some_and(|st| {
                    st.current_healthy == Some(2)
                        && st.expected_pods == Some(2)
                        && st.disruptions_allowed == Some(1)
                })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&cp)));
    let end = Instant::now() + Duration::from_secs(60);
    while let Err(e) = pod_api.evict(&pods[0].0, &EvictParams::default()).await {
        assert!(
            Instant::now() < end,
            "the first eviction was refused for 60 s: {e}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let pods = ready_pods(&cp, ns, 2).await;

    // helm upgrade with a new value: the pods roll, writes keep succeeding.
    let mut upgrade = helm_on(&cp);
    upgrade.arg("upgrade").args(chart_args(
        ns,
        &["--reuse-values", "--set", "podAnnotations.rolled=yes"],
    ));
    ok(&cp, &mut upgrade);
    let rolled = ready_pods(&cp, ns, 2).await;
    assert!(
        rolled.iter().all(|p| !pods.contains(p)),
        "helm upgrade did not replace the pods: before {pods:?}, after {rolled:?}"
    );
    writer.progress(20, "writes after the upgrade").await;
    let (writes, failures) = writer.finish().await;
    eprintln!(
        "{writes} writes through the webhook, {} failed",
        failures.len()
    );
    assert!(failures.is_empty(), "writes failed: {failures:?}");

    // Uninstalled with the pods running: the cleanup waits for them to go before it deletes the
    // leader Lease, so no replica makes it again.
    uninstall(&cp, ns, &["secret/svw-serving"]).await;
    eprintln!("done after {:?}", t0.elapsed());
}
