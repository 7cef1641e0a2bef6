//! The Helm chart (`charts/storageversion-webhook`), checked with the pinned helm binary
//! (`.controlplane/bin/helm`) and, where it matters, against a real control plane:
//!
//! - `helm lint --strict` and the values schema (no cluster);
//! - what the chart renders by default and in each certificate mode (no cluster);
//! - every flag the chart renders is accepted by the real `serve` (no cluster);
//! - every rendered object, in every certificate mode and with every option on, is accepted by
//!   kube-apiserver (`kubectl apply --dry-run=server`; CRD-backed kinds validated against minimal
//!   CRDs from tests/fixtures/chart/crds);
//! - Helm-made certificates survive `helm upgrade` (install/upgrade/uninstall on the cluster);
//! - the chart's RBAC is enough for `serve` (lease view, leader election, garbage collection) run
//!   with a token of the chart's ServiceAccount, and the real authorizer refuses that identity
//!   everything else;
//! - the chart's ValidatingWebhookConfiguration, pointed at the local process, denies a write.
//!
//! Run one alone: `cargo test --test chart -- helm_certificates_survive_upgrade --nocapture`.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde::Deserialize;
use serde_json::{json, Value};
use support::gc::{create_lease, delete_lease, wait_collected};
use support::*;

const CHART: &str = "charts/storageversion-webhook";
const RELEASE: &str = "svw";
const NS: &str = "svw-system";
/// `<release>-<chart>`: the name of every object of a default install.
const FULLNAME: &str = "svw-storageversion-webhook";

// ------------------------------------------------------------------------------- helpers --

/// The name of the chart's webhook in its ValidatingWebhookConfiguration.
fn webhook() -> String {
    format!("storageversions.{FULLNAME}.{NS}.svc")
}

fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/chart").join(name)
}

use support::ops::{helm, helm_on, ok, run, text};

/// One way to configure the chart: extra `helm` arguments (values files, --set).
struct Mode {
    name: &'static str,
    args: Vec<String>,
}

fn values_file(name: &str) -> Vec<String> {
    vec!["-f".into(), fixture(name).display().to_string()]
}

/// Each certificate mode, and every option on. `ca_file` is the CA given in `secret` mode.
fn modes(ca_file: &Path) -> Vec<Mode> {
    let mut secret = values_file("values-secret.yaml");
    secret.extend([
        "--set-file".to_string(),
        format!("certificates.secret.caBundle={}", ca_file.display()),
    ]);
    vec![
        Mode {
            name: "helm-made certificates (default values)",
            args: vec![],
        },
        Mode {
            name: "cert-manager with the chart's own CA",
            args: values_file("values-cert-manager.yaml"),
        },
        Mode {
            name: "cert-manager with a named ClusterIssuer",
            args: values_file("values-cert-manager-issuer.yaml"),
        },
        Mode {
            name: "existing Secret and caBundle",
            args: secret,
        },
        Mode {
            name: "every option on",
            args: values_file("values-all.yaml"),
        },
    ]
}

/// `helm template` of the chart as release `svw` in `svw-system`: the YAML stream.
fn template(args: &[String]) -> String {
    ok(
        helm()
            .args(["template", RELEASE, CHART, "--namespace", NS])
            .args(args),
        None,
    )
}

/// `helm template` that must fail: its error text.
fn template_error(args: &[&str]) -> String {
    let out = run(
        helm()
            .args(["template", RELEASE, CHART, "--namespace", NS])
            .args(args),
        None,
    );
    assert!(
        !out.status.success(),
        "helm template {args:?} should have failed; it rendered:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The documents of a YAML stream, as JSON values (empty documents dropped).
fn docs(yaml: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

fn render(args: &[String]) -> Vec<Value> {
    docs(&template(args))
}

fn kind_of(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

fn name_of(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

fn all_of<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| kind_of(d) == kind).collect()
}

/// The one object of `kind` (panics if there is not exactly one).
fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = all_of(docs, kind);
    assert_eq!(
        found.len(),
        1,
        "expected exactly one {kind}, found {}",
        found.len()
    );
    found[0]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The `app.kubernetes.io/component` of a rendered object (`test`, `cleanup` for the helm test
/// pod and the post-delete cleanup, with their RBAC), or "".
fn component_of(doc: &Value) -> &str {
    doc["metadata"]["labels"]["app.kubernetes.io/component"]
        .as_str()
        .unwrap_or_default()
}

/// The objects that run the webhook: everything but the `helm test` and cleanup objects.
fn webhook_objects(docs: &[Value]) -> Vec<Value> {
    docs.iter()
        .filter(|d| !matches!(component_of(d), "test" | "cleanup"))
        .cloned()
        .collect()
}

/// The objects of one hook component (`test` or `cleanup`).
fn component<'a>(docs: &'a [Value], name: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| component_of(d) == name).collect()
}

/// The webhook container's args in the rendered Deployment.
fn container_args(docs: &[Value]) -> Vec<String> {
    strings(&one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"])
}

/// The rendered args, made runnable on this machine: listeners on loopback ephemeral ports, the
/// test's certificate files, JSON logs (the test reads the listen addresses from them), and the
/// kubeconfig. Every other flag is passed exactly as rendered.
fn local_args(rendered: &[String], certs: &Certs, kubeconfig: &Path) -> Vec<String> {
    let mut args: Vec<String> = rendered
        .iter()
        .map(|a| {
            let flag = a.split_once('=').map_or(a.as_str(), |(f, _)| f);
            match flag {
                "--listen" | "--admin-listen" => format!("{flag}=127.0.0.1:0"),
                "--tls-cert-file" => format!("{flag}={}", certs.cert_file.display()),
                "--tls-key-file" => format!("{flag}={}", certs.key_file.display()),
                "--client-ca-file" => format!("{flag}={}", certs.ca_file.display()),
                "--log-format" => "--log-format=json".to_string(),
                _ => a.clone(),
            }
        })
        .collect();
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    args
}

/// Applies the chart's ServiceAccount and RBAC from `docs` and runs `serve` locally with the
/// chart's container arguments, as that ServiceAccount (a token kubeconfig, in the returned
/// directory) and as pod `pod`; returns once it is ready.
async fn serve_as_the_chart(
    cp: &ControlPlane,
    docs: &[Value],
    certs: &Certs,
    pod: &str,
) -> (Webhook, tempfile::TempDir) {
    let identity: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            matches!(
                kind_of(d),
                "ServiceAccount" | "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding"
            )
        })
        .collect();
    let out = kubectl_apply(cp, &identity, false);
    assert!(out.status.success(), "apply RBAC:\n{}", text(&out));
    let token = ok(
        cp.kubectl().args([
            "create",
            "token",
            FULLNAME,
            "--namespace",
            NS,
            "--duration=2h",
        ]),
        None,
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    token_kubeconfig(cp, token.trim(), &kubeconfig);
    let args = local_args(&container_args(docs), certs, &kubeconfig);
    let hook = Webhook::spawn(&args, &[("POD_NAME", pod)]);
    hook.wait_ready(Duration::from_secs(60)).await;
    (hook, dir)
}

/// A kubeconfig for the control plane's API server (address and CA from the admin kubeconfig)
/// that authenticates with `token`.
fn token_kubeconfig(cp: &ControlPlane, token: &str, path: &Path) {
    let admin: Value = serde_norway::from_str(
        &std::fs::read_to_string(&cp.kubeconfig).expect("read admin kubeconfig"),
    )
    .expect("admin kubeconfig parses");
    let cluster = &admin["clusters"][0]["cluster"];
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "svw-test", "cluster": {
            "server": cluster["server"],
            "certificate-authority-data": cluster["certificate-authority-data"],
        }}],
        "users": [{"name": "chart-sa", "user": {"token": token}}],
        "contexts": [{"name": "chart-sa", "context": {"cluster": "svw-test", "user": "chart-sa"}}],
        "current-context": "chart-sa",
    });
    std::fs::write(path, serde_json::to_string_pretty(&kubeconfig).unwrap()).expect("write");
}

/// `kubectl apply -f -` of `objects` as one List; `dry_run` makes it `--dry-run=server`.
fn kubectl_apply(cp: &ControlPlane, objects: &[&Value], dry_run: bool) -> Output {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let mut cmd = cp.kubectl();
    cmd.args(["apply", "-f", "-"]);
    if dry_run {
        cmd.arg("--dry-run=server");
    }
    run(&mut cmd, Some(&list.to_string()))
}

fn create_namespace(cp: &ControlPlane, ns: &str) {
    ok(cp.kubectl().args(["create", "namespace", ns]), None);
}

/// Names of the DNS SANs of the first certificate in `pem`.
fn dns_sans(pem: &[u8]) -> Vec<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).expect("PEM certificate");
    let cert = pem.parse_x509().expect("X.509 certificate");
    let san = cert
        .subject_alternative_name()
        .expect("SAN extension parses")
        .expect("certificate has SANs");
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
            _ => None,
        })
        .collect()
}

/// `openssl verify`: is the certificate `leaf` (PEM) signed by a CA in `ca` (PEM)?
fn signed_by(leaf: &str, ca: &str) -> bool {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("leaf.pem"), leaf).expect("write");
    std::fs::write(dir.path().join("ca.pem"), ca).expect("write");
    Command::new("openssl")
        .args(["verify", "-CAfile", "ca.pem", "leaf.pem"])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run openssl")
        .success()
}

fn pem_certificates(pem: &str) -> usize {
    pem.matches("-----BEGIN CERTIFICATE-----").count()
}

// ------------------------------------------------------------------ lint and schema --

/// `helm lint --strict` passes with the default values, in each certificate mode and with every
/// option on. helm lint does not stop at the chart's own `fail` checks (it logs them as
/// `[INFO] Fail`), so the test refuses those lines too.
#[test]
fn chart_lints_strictly_in_every_mode() {
    let certs = Certs::generate();
    for mode in modes(&certs.ca_file) {
        let out = run(
            helm()
                .args(["lint", "--strict", CHART, "--namespace", NS])
                .args(&mode.args),
            None,
        );
        let output = text(&out);
        assert!(
            out.status.success(),
            "helm lint --strict, {}:\n{output}",
            mode.name
        );
        for bad in [
            "[INFO] Fail",
            "Missing required value",
            "[WARNING]",
            "[ERROR]",
        ] {
            assert!(
                !output.contains(bad),
                "helm lint, {}: {bad:?} in:\n{output}",
                mode.name
            );
        }
        assert!(output.contains("1 chart(s) linted, 0 chart(s) failed"));
    }
}

/// values.schema.json rejects unknown keys (top level, nested, inside Kubernetes objects the
/// chart passes through), wrong types, values out of range and bad durations; and the chart's
/// own checks refuse an incomplete `secret` mode. Each rejected value has a valid twin that
/// renders, so the rejection is about the value and nothing else.
#[test]
fn values_schema_rejects_unknown_keys_and_wrong_types() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "crdGuard.mode=bogus",
            "crdGuard.mode=warn",
            &["/crdGuard/mode", "value must be one of"],
        ),
        (
            "crdGuard.failurepolicy=Fail",
            "crdGuard.failurePolicy=Fail",
            &[
                "/crdGuard",
                "additional properties 'failurepolicy' not allowed",
            ],
        ),
        (
            "replicas=2",
            "replicaCount=2",
            &["additional properties 'replicas' not allowed"],
        ),
        (
            "gc.leaderElection.renewDeadline=10s",
            "gc.leaderElection.leaseGrace=10s",
            &[
                "/gc/leaderElection",
                "additional properties 'renewDeadline' not allowed",
            ],
        ),
        (
            "securityContext.privilegd=false",
            "securityContext.privileged=false",
            &[
                "/securityContext",
                "additional properties 'privilegd' not allowed",
            ],
        ),
        (
            "replicaCount=two",
            "replicaCount=3",
            &["/replicaCount", "want integer"],
        ),
        (
            "server.http2=yes",
            "server.http2=true",
            &["/server/http2", "want boolean"],
        ),
        (
            "webhook.failurePolicy=Maybe",
            "webhook.failurePolicy=Fail",
            &["/webhook/failurePolicy"],
        ),
        (
            "webhook.timeoutSeconds=31",
            "webhook.timeoutSeconds=30",
            &["/webhook/timeoutSeconds"],
        ),
        (
            "gc.resyncInterval=soon",
            "gc.resyncInterval=90s",
            &["/gc/resyncInterval"],
        ),
        (
            "gc.leaderElection.leaseDuration=1500ms",
            "gc.leaderElection.leaseDuration=20s",
            &["/gc/leaderElection/leaseDuration"],
        ),
        (
            "gc.concurrency=0",
            "gc.concurrency=256",
            &["/gc/concurrency"],
        ),
        (
            "certificates.mode=vault",
            "certificates.mode=certManager",
            &["/certificates/mode"],
        ),
        (
            "admission.enforcement=audit",
            "admission.enforcement=warn",
            &["/admission/enforcement"],
        ),
        (
            "extraArgs={serve}",
            "extraArgs={--http2}",
            &["/extraArgs/0"],
        ),
        (
            "report.maxResults=0",
            "report.maxResults=50",
            &["/report/maxResults"],
        ),
        (
            "report.resyncInterval=often",
            "report.resyncInterval=30s",
            &["/report/resyncInterval"],
        ),
    ];
    for (bad, good, expect) in cases {
        let err = template_error(&["--set", bad]);
        for want in *expect {
            assert!(
                err.contains(want),
                "--set {bad}: expected {want:?} in:\n{err}"
            );
        }
        template(&["--set".to_string(), good.to_string()]);
    }
    // --set-string gives a string where a number belongs.
    let err = template_error(&["--set-string", "server.port=8443"]);
    assert!(err.contains("/server/port"), "{err}");

    // The chart's own checks, which the schema cannot express.
    let err = template_error(&["--set", "report.enabled=true", "--set", "gc.enabled=false"]);
    assert!(err.contains("report.enabled needs gc.enabled"), "{err}");
    let err = template_error(&["--set", "certificates.mode=secret"]);
    assert!(
        err.contains("certificates.mode=secret needs certificates.secret.caBundle"),
        "{err}"
    );
    let err = template_error(&[
        "--set",
        "certificates.mode=secret",
        "--set",
        "certificates.secret.caBundle=Zm9v",
    ]);
    assert!(
        err.contains("certificates.mode=secret needs certificates.secretName"),
        "{err}"
    );
}

// ---------------------------------------------------------------- rendered objects --

/// The default render: two hardened replicas spread across nodes with a PDB, probes on the admin
/// port, the certificate Secret mounted as files, least-privilege RBAC, and the webhook
/// configuration the issue asks for (fail open, 3 s, matching the Secret's CA).
#[test]
fn default_render_is_hardened_and_least_privilege() {
    // The helm test and cleanup objects have their own test (hooks_render_hardened_...).
    let docs = webhook_objects(&render(&[]));
    let kinds: BTreeSet<&str> = docs.iter().map(kind_of).collect();
    for opt_in in ["NetworkPolicy", "ServiceMonitor", "Certificate", "Issuer"] {
        assert!(!kinds.contains(opt_in), "{opt_in} rendered by default");
    }
    for doc in &docs {
        if !matches!(
            kind_of(doc),
            "ClusterRole" | "ClusterRoleBinding" | "ValidatingWebhookConfiguration"
        ) {
            assert!(
                doc["metadata"]["namespace"].is_string(),
                "{} {} has no namespace (needed for helm template | kubectl apply)",
                kind_of(doc),
                name_of(doc)
            );
        }
    }

    // Deployment.
    let deploy = one(&docs, "Deployment");
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(
        deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    let selector = &deploy["spec"]["selector"]["matchLabels"];
    let pod = &deploy["spec"]["template"]["spec"];
    let spread = &pod["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(spread["maxSkew"], 1);
    assert_eq!(spread["labelSelector"]["matchLabels"], *selector);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["serviceAccountName"], FULLNAME);
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());
    let ports: Vec<(&str, i64)> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap(),
                p["containerPort"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ports, [("https", 8443), ("admin", 8080)]);
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/livez", "port": "admin"})
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "admin"})
    );
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"],
        format!("{FULLNAME}-tls")
    );
    assert_eq!(c["volumeMounts"][0]["readOnly"], true);
    let args = container_args(&docs);
    for want in [
        "serve",
        "--listen=0.0.0.0:8443",
        "--admin-listen=0.0.0.0:8080",
        "--tls-cert-file=/etc/storageversion-webhook/tls/tls.crt",
        "--tls-key-file=/etc/storageversion-webhook/tls/tls.key",
        "--enforcement=deny",
        "--gc",
        &format!("--gc-leader-lease-name={FULLNAME}-gc"),
        &format!("--gc-leader-lease-namespace={NS}"),
    ] {
        assert!(args.iter().any(|a| a == want), "{want} not in {args:?}");
    }

    // PDB and Service.
    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], *selector);
    let svc = one(&docs, "Service");
    assert_eq!(svc["spec"]["selector"], *selector);
    assert_eq!(
        svc["spec"]["ports"][0],
        json!({"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"})
    );

    // ValidatingWebhookConfiguration, with the CA of the Helm-made Secret.
    let vwc = one(&docs, "ValidatingWebhookConfiguration");
    let hook = &vwc["webhooks"][0];
    assert_eq!(vwc["webhooks"].as_array().unwrap().len(), 2);
    assert_eq!(hook["name"], webhook());
    assert_eq!(
        hook["rules"],
        json!([{
            "apiGroups": ["internal.apiserver.k8s.io"],
            "apiVersions": ["v1alpha1"],
            "resources": ["storageversions", "storageversions/status"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Cluster",
        }])
    );
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
    assert_eq!(hook["matchPolicy"], "Equivalent");
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["timeoutSeconds"], 3);
    assert_eq!(
        hook["clientConfig"]["service"],
        json!({"name": FULLNAME, "namespace": NS, "path": "/validate", "port": 443})
    );
    let secret = one(&docs, "Secret");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(name_of(secret), format!("{FULLNAME}-tls"));
    assert_eq!(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    // The CRD guard: UPDATEs of CRDs whose versions change, on its own path, failing open.
    let guard = &vwc["webhooks"][1];
    assert_eq!(guard["name"], format!("crds.{FULLNAME}.{NS}.svc"));
    assert_eq!(
        guard["rules"],
        json!([{
            "apiGroups": ["apiextensions.k8s.io"],
            "apiVersions": ["v1"],
            "resources": ["customresourcedefinitions"],
            "operations": ["UPDATE"],
            "scope": "Cluster",
        }])
    );
    assert_eq!(
        guard["matchConditions"],
        json!([{"name": "versions-changed",
                "expression": storageversion_webhook::crd::guard::MATCH_CONDITION}])
    );
    assert_eq!(guard["failurePolicy"], "Ignore");
    assert_eq!(guard["timeoutSeconds"], 3);
    assert_eq!(guard["sideEffects"], "None");
    assert_eq!(
        guard["clientConfig"]["service"],
        json!({"name": FULLNAME, "namespace": NS, "path": "/validate-crd", "port": 443})
    );
    assert_eq!(guard["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    assert!(container_args(&docs).contains(&"--crd-guard=deny".to_string()));
    let without = render(&["--set".into(), "crdGuard.enabled=false".into()]);
    let vwc_without = one(&without, "ValidatingWebhookConfiguration");
    assert_eq!(vwc_without["webhooks"].as_array().unwrap().len(), 1);
    assert!(!container_args(&without)
        .iter()
        .any(|a| a.starts_with("--crd-guard")));
    let warn = render(&["--set".into(), "crdGuard.mode=warn".into()]);
    assert!(container_args(&warn).contains(&"--crd-guard=warn".to_string()));

    // RBAC: exactly these rules, bound to the chart's ServiceAccount.
    let rules: Vec<(String, String, Value)> = docs
        .iter()
        .filter(|d| matches!(kind_of(d), "Role" | "ClusterRole"))
        .map(|d| {
            (
                kind_of(d).to_string(),
                d["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                d["rules"].clone(),
            )
        })
        .collect();
    let expected = [
        (
            "Role",
            "kube-system",
            json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "verbs": ["get", "list", "watch"]}]),
        ),
        (
            "ClusterRole",
            "",
            json!([
                {"apiGroups": ["internal.apiserver.k8s.io"], "resources": ["storageversions"],
                 "verbs": ["get", "list", "watch", "delete", "create"]},
                {"apiGroups": ["internal.apiserver.k8s.io"], "resources": ["storageversions/status"],
                 "verbs": ["update"]},
            ]),
        ),
        (
            "Role",
            NS,
            json!([
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                 "resourceNames": [format!("{FULLNAME}-gc")],
                 "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["configmaps"],
                 "resourceNames": [format!("{FULLNAME}-gc-journal")], "verbs": ["get", "patch"]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
            ]),
        ),
        (
            "Role",
            "default",
            json!([{"apiGroups": ["", "events.k8s.io"], "resources": ["events"],
                    "verbs": ["create", "patch"]}]),
        ),
        // The CRD migrator (crdMigrate.enabled, on by default): docs/crd.md.
        (
            "ClusterRole",
            "",
            json!([
                {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                 "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["apiextensions.k8s.io"],
                 "resources": ["customresourcedefinitions/status"], "verbs": ["patch"]},
                {"apiGroups": ["storagemigration.k8s.io"], "resources": ["storageversionmigrations"],
                 "verbs": ["get", "list", "create"]},
            ]),
        ),
        (
            "Role",
            NS,
            json!([
                {"apiGroups": [""], "resources": ["configmaps"],
                 "resourceNames": [format!("{FULLNAME}-crd")], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
            ]),
        ),
    ];
    assert_eq!(rules.len(), expected.len(), "roles: {rules:#?}");
    for (kind, ns, want) in &expected {
        assert!(
            rules
                .iter()
                .any(|(k, n, r)| k == kind && n == ns && r == want),
            "no {kind} in {ns:?} with rules {want}; roles: {rules:#?}"
        );
    }
    for binding in docs
        .iter()
        .filter(|d| matches!(kind_of(d), "RoleBinding" | "ClusterRoleBinding"))
    {
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NS}])
        );
    }
    assert_eq!(all_of(&docs, "RoleBinding").len(), 4);
    assert_eq!(all_of(&docs, "ClusterRoleBinding").len(), 2);

    // With the collector off, only the identity-lease read access is left.
    let no_gc = webhook_objects(&render(&["--set".into(), "gc.enabled=false".into()]));
    assert!(container_args(&no_gc).iter().any(|a| a == "--no-gc"));
    assert!(!container_args(&no_gc).iter().any(|a| a.starts_with("--gc")));
    let roles: Vec<&Value> = no_gc
        .iter()
        .filter(|d| kind_of(d).contains("Role"))
        .collect();
    assert_eq!(roles.len(), 2, "{roles:#?}");
    assert!(roles
        .iter()
        .all(|r| r["metadata"]["namespace"] == "kube-system"));
}

/// The CRD migrator (`crdMigrate.enabled`): on by default with its flags and RBAC; off, or with
/// the collector off (no leader election), neither; `resourceRules` narrows the rewrite's grant.
#[test]
fn crd_migrator_is_on_by_default_and_its_rbac_goes_with_it() {
    let crd_rules = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .filter(|d| name_of(d) == format!("{FULLNAME}-crd") && kind_of(d) == "ClusterRole")
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let on = render(&[]);
    let args = container_args(&on);
    for want in [
        "--crd-migrate".to_string(),
        format!("--crd-migrate-state-configmap={FULLNAME}-crd"),
    ] {
        assert!(args.contains(&want), "{want} not in {args:?}");
    }
    // No custom resource rights unless crdMigrate.resourceRules names them.
    assert_eq!(crd_rules(&on).len(), 3);
    for off in [
        render(&["--set".into(), "crdMigrate.enabled=false".into()]),
        render(&["--set".into(), "gc.enabled=false".into()]),
    ] {
        assert!(!container_args(&off)
            .iter()
            .any(|a| a.starts_with("--crd-migrate")));
        assert!(crd_rules(&off).is_empty());
        assert!(!off
            .iter()
            .any(|d| name_of(d).starts_with(&format!("{FULLNAME}-crd"))));
    }
    let tuned = render(&[
        "--set".into(),
        "crdMigrate.settle=30s".into(),
        "--set".into(),
        "crdMigrate.retry=1h".into(),
        "--set".into(),
        "crdMigrate.rate=200".into(),
        "--set".into(),
        "crdMigrate.method=rewrite".into(),
        "--set-json".into(),
        r#"crdMigrate.resourceRules=[{"apiGroups":["example.com"],"resources":["widgets"],"verbs":["get","list","update"]}]"#.into(),
    ]);
    let args = container_args(&tuned);
    for want in [
        "--crd-migrate-settle=30s",
        "--crd-migrate-retry=1h",
        "--crd-migrate-rate=200",
        "--crd-migrate-method=rewrite",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} not in {args:?}");
    }
    assert_eq!(
        crd_rules(&tuned)[3],
        json!({"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get", "list", "update"]})
    );
}

/// The policy report (`report.enabled`): off by default, with no flag and no RBAC for it; on,
/// the flags and one ClusterRole (get/patch of the one ClusterReport by name, create) bound to
/// the ServiceAccount, and nothing else more than the default render.
#[test]
fn report_rbac_only_when_enabled() {
    let reports = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .filter(|d| kind_of(d) == "ClusterRole")
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .filter(|r| r["apiGroups"] == json!(["openreports.io"]))
            .collect()
    };
    let off = render(&[]);
    assert!(reports(&off).is_empty());
    assert!(!container_args(&off)
        .iter()
        .any(|a| a.starts_with("--report")));

    let on = render(&[
        "--set".into(),
        "report.enabled=true".into(),
        "--set".into(),
        "report.maxResults=50".into(),
        "--set".into(),
        "report.resyncInterval=30s".into(),
    ]);
    let args = container_args(&on);
    for want in [
        "--report",
        &format!("--report-name={FULLNAME}"),
        "--report-max-results=50",
        "--report-resync-interval=30s",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} not in {args:?}");
    }
    assert_eq!(
        reports(&on),
        [
            json!({"apiGroups": ["openreports.io"], "resources": ["clusterreports"],
                   "resourceNames": [FULLNAME], "verbs": ["get", "patch"]}),
            json!({"apiGroups": ["openreports.io"], "resources": ["clusterreports"],
                   "verbs": ["create"]}),
        ]
    );
    let binding = all_of(&on, "ClusterRoleBinding")
        .into_iter()
        .find(|b| b["roleRef"]["name"] == format!("{FULLNAME}-report"))
        .expect("a ClusterRoleBinding for the report role");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NS}])
    );
    let names = |docs: &[Value]| -> BTreeSet<String> {
        docs.iter()
            .map(|d| format!("{}/{}", kind_of(d), name_of(d)))
            .collect()
    };
    let added: Vec<String> = names(&on).difference(&names(&off)).cloned().collect();
    assert_eq!(
        added,
        [
            format!("ClusterRole/{FULLNAME}-report"),
            format!("ClusterRoleBinding/{FULLNAME}-report"),
        ]
    );
    // A name of its own is used in the flag and the RBAC alike.
    let named = render(&[
        "--set".into(),
        "report.enabled=true".into(),
        "--set".into(),
        "report.name=storageversions".into(),
    ]);
    assert!(container_args(&named)
        .iter()
        .any(|a| a == "--report-name=storageversions"));
    assert_eq!(
        reports(&named)[0]["resourceNames"],
        json!(["storageversions"])
    );
}

/// The certificate modes render what each needs: cert-manager objects and the CA-injection
/// annotation instead of a caBundle; or the user's Secret and caBundle (PEM or base64).
#[test]
fn certificate_modes_render_their_objects() {
    let certs = Certs::generate();

    let own = render(&values_file("values-cert-manager.yaml"));
    assert!(all_of(&own, "Secret").is_empty());
    let vwc = one(&own, "ValidatingWebhookConfiguration");
    assert_eq!(
        vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!("{NS}/{FULLNAME}-tls")
    );
    for hook in vwc["webhooks"].as_array().unwrap() {
        assert!(hook["clientConfig"]["caBundle"].is_null());
    }
    let issuers: BTreeSet<&str> = all_of(&own, "Issuer").into_iter().map(name_of).collect();
    assert_eq!(
        issuers,
        BTreeSet::from([
            format!("{FULLNAME}-selfsigned").as_str(),
            format!("{FULLNAME}-ca").as_str()
        ])
    );
    let certificates = all_of(&own, "Certificate");
    assert_eq!(certificates.len(), 2);
    let ca = certificates
        .iter()
        .find(|c| c["spec"]["isCA"] == true)
        .expect("a CA Certificate");
    assert_eq!(
        ca["spec"]["issuerRef"]["name"],
        format!("{FULLNAME}-selfsigned")
    );
    let serving = certificates
        .iter()
        .find(|c| name_of(c) == format!("{FULLNAME}-tls"))
        .expect("the serving Certificate");
    assert_eq!(serving["spec"]["secretName"], format!("{FULLNAME}-tls"));
    assert_eq!(
        serving["spec"]["issuerRef"]["name"],
        format!("{FULLNAME}-ca")
    );
    assert!(strings(&serving["spec"]["dnsNames"]).contains(&format!("{FULLNAME}.{NS}.svc")));

    let named = render(&values_file("values-cert-manager-issuer.yaml"));
    assert!(all_of(&named, "Issuer").is_empty());
    let serving = one(&named, "Certificate");
    assert_eq!(
        serving["spec"]["issuerRef"],
        json!({"name": "platform-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
    );
    assert_eq!(serving["spec"]["duration"], "720h");

    let want_bundle = base64(certs.ca_pem.as_bytes());
    let mut pem_args = values_file("values-secret.yaml");
    pem_args.extend([
        "--set-file".into(),
        format!("certificates.secret.caBundle={}", certs.ca_file.display()),
    ]);
    let mut b64_args = values_file("values-secret.yaml");
    b64_args.extend([
        "--set".into(),
        format!("certificates.secret.caBundle={want_bundle}"),
    ]);
    for args in [pem_args, b64_args] {
        let given = render(&args);
        assert!(all_of(&given, "Secret").is_empty());
        assert!(all_of(&given, "Certificate").is_empty());
        for hook in one(&given, "ValidatingWebhookConfiguration")["webhooks"]
            .as_array()
            .unwrap()
        {
            assert_eq!(hook["clientConfig"]["caBundle"], want_bundle.as_str());
        }
        let pod = &one(&given, "Deployment")["spec"]["template"]["spec"];
        assert_eq!(
            pod["volumes"][0]["secret"]["secretName"],
            "storageversion-webhook-serving"
        );
    }
}

/// Every flag the chart renders, in every mode, is accepted by the real binary: `serve` starts
/// with exactly those args (listen addresses, certificate paths and log format adjusted for
/// this machine) and binds its listeners. The cluster it is pointed at does not answer; no
/// control plane is needed to parse flags.
#[test]
fn every_rendered_flag_is_accepted_by_serve() {
    let certs = Certs::generate();
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9"}}],
            "users": [{"name": "nobody", "user": {"token": "none"}}],
            "contexts": [{"name": "nowhere", "context": {"cluster": "nowhere", "user": "nobody"}}],
            "current-context": "nowhere",
        })
        .to_string(),
    )
    .expect("write kubeconfig");
    for mode in modes(&certs.ca_file) {
        let rendered = container_args(&render(&mode.args));
        for a in &rendered {
            if let Some(addr) = a
                .strip_prefix("--listen=")
                .or_else(|| a.strip_prefix("--admin-listen="))
            {
                addr.parse::<std::net::SocketAddr>()
                    .unwrap_or_else(|e| panic!("{}: {a} is not a socket address: {e}", mode.name));
            }
        }
        let args = local_args(&rendered, &certs, &kubeconfig);
        let mut hook = Webhook::spawn(&args, &[]);
        assert!(
            hook.child.try_wait().expect("try_wait").is_none(),
            "{}: serve exited; logs:\n{}",
            mode.name,
            hook.logs_text()
        );
        hook.kill();
    }
}

/// One annotation of a rendered object ("" when it has none).
fn annotation<'a>(doc: &'a Value, key: &str) -> &'a str {
    doc["metadata"]["annotations"][key]
        .as_str()
        .unwrap_or_default()
}

/// The one object of `kind` among `docs`.
fn one_ref<'a>(docs: &[&'a Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .copied()
        .filter(|d| kind_of(d) == kind)
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind}: {found:#?}");
    found[0]
}

/// The `helm test` pod and the post-delete cleanup Job: the chart's own image, the Deployment's
/// hardened security context, resources, the hook annotations; their RBAC is exactly what
/// `selftest` and `cleanup` use; they are never selected as webhook pods.
#[test]
fn hooks_render_hardened_and_least_privilege() {
    let docs = render(&[]);
    let deploy = one(&docs, "Deployment");
    let dpod = &deploy["spec"]["template"]["spec"];
    let dcontainer = &dpod["containers"][0];
    let selector = deploy["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("selector")
        .clone();
    let hardened = |what: &str, pod: &Value| {
        let c = &pod["containers"][0];
        assert_eq!(
            c["image"], dcontainer["image"],
            "{what}: not the chart's image"
        );
        assert_eq!(pod["securityContext"], dpod["securityContext"], "{what}");
        assert_eq!(
            c["securityContext"], dcontainer["securityContext"],
            "{what}"
        );
        assert_eq!(
            c["securityContext"]["readOnlyRootFilesystem"], true,
            "{what}"
        );
        assert_eq!(
            c["securityContext"]["capabilities"]["drop"],
            json!(["ALL"]),
            "{what}"
        );
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{what}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{what}"
        );
        assert!(c["resources"]["limits"]["memory"].is_string(), "{what}");
        assert!(c["resources"]["requests"]["cpu"].is_string(), "{what}");
        assert_eq!(pod["restartPolicy"], "Never", "{what}");
        strings(&c["args"])
    };
    let not_selected = |what: &str, labels: &Value| {
        let labels = labels.as_object().expect("labels");
        assert!(
            !selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "{what} carries the Service's selector {selector:?}: it would receive admission traffic"
        );
    };

    // helm test: only the pod is a hook; its RBAC is ordinary release objects.
    let test = component(&docs, "test");
    let pod = one_ref(&test, "Pod");
    assert_eq!(name_of(pod), format!("{FULLNAME}-test"));
    assert_eq!(annotation(pod, "helm.sh/hook"), "test");
    assert_eq!(
        annotation(pod, "helm.sh/hook-delete-policy"),
        "before-hook-creation"
    );
    not_selected("the test pod", &pod["metadata"]["labels"]);
    assert_eq!(
        pod["spec"]["serviceAccountName"],
        format!("{FULLNAME}-test")
    );
    let args = hardened("test pod", &pod["spec"]);
    for want in [
        "selftest".to_string(),
        format!("--webhook-configuration={FULLNAME}"),
        format!("--webhook={}", webhook()),
        format!("--migrate-state-namespace={NS}"),
        format!("--migrate-state-configmap={FULLNAME}-migrate"),
        format!("--crd-state-configmap={FULLNAME}-crd"),
    ] {
        assert!(args.contains(&want), "{want} not in {args:?}");
    }
    assert!(!args.iter().any(|a| a == "--fail-on-audit-findings"));
    for d in &test {
        if kind_of(d) != "Pod" {
            assert_eq!(
                annotation(d, "helm.sh/hook"),
                "",
                "{} is a hook",
                kind_of(d)
            );
        }
    }
    let rules = |docs: &[&Value], kind: &str, ns: &str| -> Value {
        docs.iter()
            .find(|d| kind_of(d) == kind && d["metadata"]["namespace"].as_str().unwrap_or("") == ns)
            .map(|d| d["rules"].clone())
            .unwrap_or_else(|| panic!("no {kind} in {ns:?}"))
    };
    assert_eq!(
        rules(&test, "ClusterRole", ""),
        json!([
            {"apiGroups": ["admissionregistration.k8s.io"],
             "resources": ["validatingwebhookconfigurations"],
             "resourceNames": [FULLNAME], "verbs": ["get"]},
            {"apiGroups": ["internal.apiserver.k8s.io"], "resources": ["storageversions"],
             "verbs": ["list"]},
            {"apiGroups": ["storagemigration.k8s.io"], "resources": ["storageversionmigrations"],
             "verbs": ["list"]},
            {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
             "verbs": ["list"]},
        ])
    );
    assert_eq!(
        rules(&test, "Role", NS),
        json!([
            {"apiGroups": [""], "resources": ["services"], "resourceNames": [FULLNAME],
             "verbs": ["get"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
             "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["configmaps"],
             "resourceNames": [format!("{FULLNAME}-migrate"), format!("{FULLNAME}-crd")],
             "verbs": ["get"]},
        ])
    );
    assert_eq!(
        rules(&test, "Role", "kube-system"),
        json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]}])
    );
    let test_sa =
        json!([{"kind": "ServiceAccount", "name": format!("{FULLNAME}-test"), "namespace": NS}]);
    for b in test
        .iter()
        .filter(|d| matches!(kind_of(d), "RoleBinding" | "ClusterRoleBinding"))
    {
        assert_eq!(b["subjects"], test_sa);
    }
    assert_eq!(test.len(), 8, "{test:#?}");

    // Cleanup: post-delete hooks, RBAC first and deleted afterwards.
    let cleanup = component(&docs, "cleanup");
    assert_eq!(cleanup.len(), 4, "{cleanup:#?}");
    for d in &cleanup {
        assert_eq!(
            annotation(d, "helm.sh/hook"),
            "post-delete",
            "{}",
            kind_of(d)
        );
        let policy = annotation(d, "helm.sh/hook-delete-policy");
        assert!(
            policy.contains("hook-succeeded") && policy.contains("before-hook-creation"),
            "{} {policy}",
            kind_of(d)
        );
    }
    let weight = |kind: &str| -> i64 {
        annotation(one_ref(&cleanup, kind), "helm.sh/hook-weight")
            .parse()
            .expect("weight")
    };
    assert!(weight("ServiceAccount") < weight("Job") && weight("Role") < weight("Job"));
    assert!(weight("RoleBinding") < weight("Job"));
    let job = one_ref(&cleanup, "Job");
    assert_eq!(
        annotation(job, "helm.sh/hook-output-log-policy"),
        "hook-failed"
    );
    let jpod = &job["spec"]["template"]["spec"];
    not_selected(
        "the cleanup pod",
        &job["spec"]["template"]["metadata"]["labels"],
    );
    assert_eq!(jpod["serviceAccountName"], format!("{FULLNAME}-cleanup"));
    let args = hardened("cleanup Job", jpod);
    for want in [
        "cleanup".to_string(),
        format!("--namespace={NS}"),
        format!("--leader-lease={FULLNAME}-gc"),
        format!("--migrate-state-configmap={FULLNAME}-migrate"),
        format!("--crd-state-configmap={FULLNAME}-crd"),
        format!("--pod={FULLNAME}-test"),
    ] {
        assert!(args.contains(&want), "{want} not in {args:?}");
    }
    // It waits for exactly the webhook's pods: the Deployment's selector.
    let waits_for: BTreeSet<String> = args
        .iter()
        .find_map(|a| a.strip_prefix("--wait-for-pods="))
        .unwrap_or_else(|| panic!("no --wait-for-pods in {args:?}"))
        .split(',')
        .map(String::from)
        .collect();
    let selected: BTreeSet<String> = selector
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    assert_eq!(waits_for, selected);
    assert_eq!(
        one_ref(&cleanup, "Role")["rules"],
        json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": [format!("{FULLNAME}-gc")], "verbs": ["get", "delete"]},
            {"apiGroups": [""], "resources": ["configmaps"],
             "resourceNames": [format!("{FULLNAME}-migrate"), format!("{FULLNAME}-gc-journal"), format!("{FULLNAME}-crd")],
             "verbs": ["get", "delete"]},
            {"apiGroups": [""], "resources": ["pods"],
             "resourceNames": [format!("{FULLNAME}-test")], "verbs": ["get", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ])
    );

    // Switches: test.enabled, test.failOnAuditFindings, cleanup.enabled, rbac.create.
    let set = |kv: &[&str]| -> Vec<Value> {
        render(
            &kv.iter()
                .flat_map(|s| ["--set".to_string(), s.to_string()])
                .collect::<Vec<_>>(),
        )
    };
    let off = set(&["test.enabled=false", "cleanup.enabled=false"]);
    assert!(component(&off, "test").is_empty() && component(&off, "cleanup").is_empty());
    let strict = set(&["test.failOnAuditFindings=true"]);
    let pod = one_ref(&component(&strict, "test"), "Pod");
    assert!(strings(&pod["spec"]["containers"][0]["args"])
        .contains(&"--fail-on-audit-findings".to_string()));
    let no_rbac = set(&["rbac.create=false"]);
    assert!(component(&no_rbac, "cleanup").is_empty());
    let test = component(&no_rbac, "test");
    assert_eq!(test.len(), 1, "{test:#?}");
    assert_eq!(test[0]["spec"]["serviceAccountName"], FULLNAME);
}

/// Every flag the chart renders for `selftest` and `cleanup` is accepted by the binary (its
/// parser runs each flag and value before `--help` ends it; an unknown flag or a bad value fails).
#[test]
fn hook_flags_are_accepted_by_the_binary() {
    for args in [
        vec![],
        vec![
            "--set",
            "test.failOnAuditFindings=true",
            "--set",
            "logging.level=debug",
        ],
    ] {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let docs = render(&args);
        let pods = [
            one_ref(&component(&docs, "test"), "Pod")["spec"].clone(),
            one_ref(&component(&docs, "cleanup"), "Job")["spec"]["template"]["spec"].clone(),
        ];
        for pod in pods {
            let mut argv = strings(&pod["containers"][0]["args"]);
            argv.push("--help".into());
            let out = run(
                Command::new(env!("CARGO_BIN_EXE_storageversion-webhook")).args(&argv),
                None,
            );
            assert!(
                out.status.success(),
                "the binary refuses {argv:?}:\n{}",
                text(&out)
            );
        }
    }
}

// ------------------------------------------------------------ against the apiserver --

/// Every object the chart renders, in each certificate mode and with every option on, passes
/// kube-apiserver's validation (`kubectl apply --dry-run=server`). cert-manager's and the
/// Prometheus Operator's kinds are checked against minimal CRDs (tests/fixtures/chart/crds):
/// group, version, kind and scope are real, their fields are not validated.
#[tokio::test(flavor = "multi_thread")]
async fn rendered_objects_pass_server_side_dry_run() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    every_mode_passes_a_server_side_dry_run(&cp);
}

/// The same on a kube-apiserver without the StorageVersion API (the gate off and the group not
/// served, as on most clusters): the chart installs there as it is.
#[tokio::test(flavor = "multi_thread")]
async fn rendered_objects_pass_server_side_dry_run_without_the_storageversion_api() {
    let _serial = serial().await;
    let cp = ControlPlane::without_storageversion_api().await;
    let svs = cp
        .kubectl()
        .args(["get", "--raw", "/apis/internal.apiserver.k8s.io/v1alpha1"])
        .output()
        .expect("kubectl");
    assert!(!svs.status.success(), "the StorageVersion API is served");
    every_mode_passes_a_server_side_dry_run(&cp);
}

fn every_mode_passes_a_server_side_dry_run(cp: &ControlPlane) {
    let certs = Certs::generate();
    ok(
        cp.kubectl().args(["apply", "-f"]).arg(fixture("crds")),
        None,
    );
    ok(
        cp.kubectl().args([
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ]),
        None,
    );
    create_namespace(cp, NS);
    for mode in modes(&certs.ca_file) {
        let docs = render(&mode.args);
        // A Pod (the helm test hook) passes admission only if its ServiceAccount exists; a dry
        // run creates nothing, so it is made for real (once: a repeat says AlreadyExists).
        for pod in all_of(&docs, "Pod") {
            let sa = pod["spec"]["serviceAccountName"]
                .as_str()
                .unwrap_or_default();
            run(
                cp.kubectl()
                    .args(["-n", NS, "create", "serviceaccount", sa]),
                None,
            );
        }
        let refs: Vec<&Value> = docs.iter().collect();
        let out = kubectl_apply(cp, &refs, true);
        let output = text(&out);
        assert!(
            out.status.success(),
            "server-side dry run refused objects of mode '{}':\n{output}",
            mode.name
        );
        for doc in &docs {
            let line = format!("/{} ", name_of(doc));
            assert!(
                output
                    .lines()
                    .any(|l| l.contains(&line) && l.contains("(server dry run)")),
                "{}: {} {} not confirmed by the dry run:\n{output}",
                mode.name,
                kind_of(doc),
                name_of(doc)
            );
        }
        eprintln!("{}: {} objects accepted", mode.name, docs.len());
    }
    let all = render(&values_file("values-all.yaml"));
    let kinds: BTreeSet<&str> = all.iter().map(kind_of).collect();
    for kind in [
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingWebhookConfiguration",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceMonitor",
        "Certificate",
        "Issuer",
    ] {
        assert!(kinds.contains(kind), "values-all.yaml renders no {kind}");
    }
}

/// Helm-made certificates: `helm install` makes a CA and a serving certificate for the Service
/// and puts the CA in caBundle; `helm upgrade` keeps both unchanged; an upgrade within
/// renewBeforeDays of expiry makes new ones and keeps the old CA in caBundle for one upgrade;
/// `helm uninstall` removes them. Also checks what NOTES.txt tells the user.
#[tokio::test(flavor = "multi_thread")]
async fn helm_certificates_survive_upgrade() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let secrets: Api<Secret> = Api::namespaced(cp.client.clone(), NS);
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(cp.client.clone());
    let deployments: Api<Deployment> = Api::namespaced(cp.client.clone(), NS);
    let state = || async {
        let secret = secrets
            .get(&format!("{FULLNAME}-tls"))
            .await
            .expect("the Helm-made Secret");
        let data = secret.data.expect("Secret data");
        let get = |k: &str| data.get(k).unwrap_or_else(|| panic!("no {k}")).0.clone();
        let vwc = vwcs.get(FULLNAME).await.expect("the webhook configuration");
        let bundle = vwc.webhooks.expect("webhooks")[0]
            .client_config
            .ca_bundle
            .clone()
            .expect("caBundle")
            .0;
        let text = |b: Vec<u8>| String::from_utf8(b).expect("PEM is text");
        (
            text(get("ca.crt")),
            text(get("tls.crt")),
            text(get("tls.key")),
            text(bundle),
        )
    };

    let notes = ok(
        helm_on(&cp).args([
            "install",
            RELEASE,
            CHART,
            "--namespace",
            NS,
            "--create-namespace",
        ]),
        None,
    );
    for want in [
        "failurePolicy:  Ignore",
        "timeoutSeconds: 3",
        &format!("kubectl -n {NS} rollout status deployment/{FULLNAME}"),
        &format!("kubectl delete validatingwebhookconfiguration {FULLNAME}"),
    ] {
        assert!(notes.contains(want), "NOTES lack {want:?}:\n{notes}");
    }
    let (ca, crt, key, bundle) = state().await;
    assert_eq!(bundle, ca, "caBundle is not the Secret's CA");
    assert!(signed_by(&crt, &ca), "tls.crt is not signed by ca.crt");
    let sans = dns_sans(crt.as_bytes());
    for want in [
        FULLNAME.to_string(),
        format!("{FULLNAME}.{NS}"),
        format!("{FULLNAME}.{NS}.svc"),
        format!("{FULLNAME}.{NS}.svc.cluster.local"),
    ] {
        assert!(sans.contains(&want), "{want} not in the SANs {sans:?}");
    }
    assert!(key.contains("PRIVATE KEY"));

    let upgrade = |extra: &[&str]| {
        let args = ["upgrade", RELEASE, CHART, "--namespace", NS];
        ok(helm_on(&cp).args(args).args(extra), None)
    };
    // An upgrade that changes something else keeps the certificates exactly.
    upgrade(&["--set", "replicaCount=3"]);
    let replicas = deployments.get(FULLNAME).await.expect("Deployment");
    assert_eq!(
        replicas.spec.and_then(|s| s.replicas),
        Some(3),
        "upgrade not applied"
    );
    assert_eq!(
        state().await,
        (ca.clone(), crt.clone(), key.clone(), bundle.clone())
    );

    // Within renewBeforeDays of expiry: new certificates; caBundle trusts the new and old CA.
    upgrade(&["--set", "certificates.helm.renewBeforeDays=36500"]);
    let (ca2, crt2, key2, bundle2) = state().await;
    assert_ne!(ca2, ca);
    assert_ne!(crt2, crt);
    assert_ne!(key2, key);
    assert!(signed_by(&crt2, &ca2));
    assert_eq!(pem_certificates(&bundle2), 2);
    assert!(bundle2.starts_with(&ca2) && bundle2.ends_with(&ca));

    // The next upgrade keeps the renewed certificates and drops the old CA. (--reset-values:
    // helm upgrade without values would reuse the last release's renewBeforeDays.)
    upgrade(&["--reset-values"]);
    assert_eq!(state().await, (ca2.clone(), crt2, key2, ca2));

    // --no-hooks: no node runs the post-delete cleanup Job here (tests/node_chart.rs runs it).
    ok(
        helm_on(&cp).args([
            "uninstall",
            RELEASE,
            "--namespace",
            NS,
            "--wait",
            "--no-hooks",
        ]),
        None,
    );
    assert!(secrets
        .get_opt(&format!("{FULLNAME}-tls"))
        .await
        .expect("get")
        .is_none());
    assert!(vwcs.get_opt(FULLNAME).await.expect("get").is_none());
}

/// The chart's ServiceAccount and RBAC, applied to a real cluster, are enough for `serve` run
/// with that ServiceAccount's token: the lease view lists identity leases (/readyz), the leader
/// Lease is acquired, the collector removes the entry of an apiserver whose lease was deleted
/// (and records an Event), and no request is forbidden. The real authorizer then refuses that
/// identity everything the chart does not mean to grant.
#[tokio::test(flavor = "multi_thread")]
async fn chart_rbac_is_enough_for_serve_and_nothing_more() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let certs = Certs::generate();
    create_namespace(&cp, NS);
    // Fast collector timings, set through the chart's own values.
    let docs = render(&[
        "--set".into(),
        "gc.leaseDeletionGrace=1s".into(),
        "--set".into(),
        "gc.resyncInterval=2s".into(),
    ]);
    // Readiness waits for the lease view's first list of kube-system identity leases.
    let (hook, _kubeconfig) = serve_as_the_chart(&cp, &docs, &certs, "chart-rbac-pod").await;

    // Leader election on the chart's leader Lease, in the release namespace.
    let leader_leases: Api<Lease> = Api::namespaced(cp.client.clone(), NS);
    let lease_name = format!("{FULLNAME}-gc");
    poll_until(
        Duration::from_secs(60),
        "the leader Lease to be held",
        || {
            let api = leader_leases.clone();
            let name = lease_name.clone();
            async move {
                api.get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|l| l.spec?.holder_identity)
                    .is_some_and(|h| h.starts_with("chart-rbac-pod"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));

    // Garbage collection: an entry whose apiserver's lease is deleted goes away.
    let own = own_apiserver_id(&cp).await;
    let gone = "apiserver-chartrbacgone0000000000";
    create_lease(&cp, &live_identity_lease(gone)).await;
    let sv_name = "chart.example.com.widgets";
    create_sv(&cp, sv_name).await;
    put_status(&cp, sv_name, status_for("chart.example.com", &[&own, gone]))
        .await
        .expect("write both entries");
    delete_lease(&cp, gone).await;
    // The collector removes the stale entry.
    wait_collected(&cp, sv_name, gone, &own, Duration::from_secs(90))
        .await
        .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    poll_until(
        Duration::from_secs(30),
        "an Event about the collected StorageVersion",
        || async {
            let out = cp
                .kubectl()
                .args(["get", "events", "--namespace", "default", "-o", "json"])
                .output()
                .expect("kubectl get events");
            let list: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            list["items"]
                .as_array()
                .is_some_and(|items| items.iter().any(|e| e["involvedObject"]["name"] == sv_name))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));

    // The batch wrote its journal before its writes and cleared it after (docs/gc.md).
    let out = cp
        .kubectl()
        .args([
            "get",
            "configmap",
            &format!("{FULLNAME}-gc-journal"),
            "-n",
            NS,
        ])
        .args(["-o", "jsonpath={.data.removals}"])
        .output()
        .expect("kubectl get configmap");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[]",
        "the journal exists and is clear: {}",
        text(&out)
    );

    let logs = hook.logs_text().to_lowercase();
    assert!(
        !logs.contains("forbidden"),
        "serve was refused a request with the chart's RBAC:\n{}",
        hook.logs_text()
    );

    // What the authorizer says about that identity.
    let who = format!("--as=system:serviceaccount:{NS}:{FULLNAME}");
    let can = |verb: &str, resource: &str, extra: &[&str]| -> bool {
        let out = cp
            .kubectl()
            .args(["auth", "can-i", verb, resource, &who])
            .args(extra)
            .output()
            .expect("kubectl auth can-i");
        match String::from_utf8_lossy(&out.stdout).trim() {
            "yes" => true,
            "no" => false,
            other => panic!(
                "can-i {verb} {resource} {extra:?}: {other:?} {}",
                text(&out)
            ),
        }
    };
    let sv = "storageversions.internal.apiserver.k8s.io";
    let leader = format!("leases/{FULLNAME}-gc");
    let journal = format!("configmaps/{FULLNAME}-gc-journal");
    let crd_state = format!("configmaps/{FULLNAME}-crd");
    let yes: &[(&str, &str, &[&str])] = &[
        ("list", "leases", &["-n", "kube-system"]),
        ("watch", "leases", &["-n", "kube-system"]),
        ("get", "leases/apiserver-any", &["-n", "kube-system"]),
        ("list", sv, &[]),
        ("watch", sv, &[]),
        ("delete", sv, &[]),
        // The give-back creates an object again that the collector just deleted (docs/gc.md).
        ("create", sv, &[]),
        ("update", sv, &["--subresource=status"]),
        ("get", &leader, &["-n", NS]),
        ("patch", &leader, &["-n", NS]),
        ("create", "leases", &["-n", NS]),
        // The collector's journal (docs/gc.md, I1 across terms), by name; server-side apply
        // creates it the first time.
        ("get", &journal, &["-n", NS]),
        ("patch", &journal, &["-n", NS]),
        ("create", "configmaps", &["-n", NS]),
        ("create", "events", &["-n", "default"]),
        ("create", "events.events.k8s.io", &["-n", "default"]),
        ("patch", "events.events.k8s.io", &["-n", "default"]),
        // The CRD migrator (on by default): docs/crd.md.
        (
            "watch",
            "customresourcedefinitions.apiextensions.k8s.io",
            &[],
        ),
        (
            "patch",
            "customresourcedefinitions.apiextensions.k8s.io",
            &["--subresource=status"],
        ),
        (
            "create",
            "storageversionmigrations.storagemigration.k8s.io",
            &[],
        ),
        ("patch", &crd_state, &["-n", NS]),
        // Every replica's CRD guard watches it (a metadata.name field selector).
        ("watch", &crd_state, &["-n", NS]),
        ("list", &crd_state, &["-n", NS]),
        // Server-side apply creates the state ConfigMap the first time (create cannot be
        // limited by name).
        ("create", "configmaps", &["-n", NS]),
    ];
    let no: &[(&str, &str, &[&str])] = &[
        // Identity leases belong to kube-apiserver.
        ("create", "leases", &["-n", "kube-system"]),
        ("update", "leases/apiserver-any", &["-n", "kube-system"]),
        ("patch", "leases/apiserver-any", &["-n", "kube-system"]),
        ("delete", "leases/apiserver-any", &["-n", "kube-system"]),
        // Only the one leader Lease in the release namespace, and never its deletion.
        ("list", "leases", &["-n", NS]),
        ("patch", "leases/some-other-lease", &["-n", NS]),
        ("delete", &leader, &["-n", NS]),
        ("list", "leases", &["--all-namespaces"]),
        // The collector never changes StorageVersions other than through /status, patches
        // status, or deletes them wholesale.
        ("update", sv, &[]),
        ("patch", sv, &[]),
        ("patch", sv, &["--subresource=status"]),
        ("deletecollection", sv, &[]),
        // Events only where events about cluster-scoped objects go.
        ("create", "events", &["-n", "kube-system"]),
        ("create", "events", &["-n", NS]),
        ("delete", "events", &["-n", "default"]),
        // CRDs themselves are never changed, only their status; custom resources only with
        // crdMigrate.resourceRules.
        (
            "update",
            "customresourcedefinitions.apiextensions.k8s.io",
            &[],
        ),
        (
            "patch",
            "customresourcedefinitions.apiextensions.k8s.io",
            &[],
        ),
        (
            "delete",
            "customresourcedefinitions.apiextensions.k8s.io",
            &[],
        ),
        (
            "delete",
            "storageversionmigrations.storagemigration.k8s.io",
            &[],
        ),
        ("patch", "configmaps/other", &["-n", NS]),
        // Nothing else.
        ("get", "secrets", &["-n", NS]),
        ("list", "secrets", &["--all-namespaces"]),
        ("get", "configmaps/some-other-configmap", &["-n", NS]),
        ("patch", "configmaps/some-other-configmap", &["-n", NS]),
        ("delete", &journal, &["-n", NS]),
        ("create", "configmaps", &["-n", "kube-system"]),
        ("create", "pods", &["-n", NS]),
        ("update", "deployments.apps", &["-n", NS]),
        (
            "update",
            "validatingwebhookconfigurations.admissionregistration.k8s.io",
            &[],
        ),
        (
            "delete",
            "validatingwebhookconfigurations.admissionregistration.k8s.io",
            &[],
        ),
        (
            "create",
            "clusterrolebindings.rbac.authorization.k8s.io",
            &[],
        ),
        ("impersonate", "serviceaccounts", &["-n", NS]),
        ("create", "serviceaccounts/token", &["-n", NS]),
    ];
    for (verb, resource, extra) in yes {
        assert!(
            can(verb, resource, extra),
            "should be allowed: {verb} {resource} {extra:?}"
        );
    }
    for (verb, resource, extra) in no {
        assert!(
            !can(verb, resource, extra),
            "should be refused: {verb} {resource} {extra:?}"
        );
    }
}

/// With `report.enabled`, the chart's RBAC is enough for the policy report and no more: with
/// the ServiceAccount's token, the leader creates the ClusterReport (the real OpenReports CRD),
/// updates it on a finding, reads it back at resyncs and creates it again after someone deleted
/// it, with no request forbidden; the authorizer refuses it any other ClusterReport.
#[tokio::test(flavor = "multi_thread")]
async fn chart_report_rbac_is_enough() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    install_openreports_crds(&cp);
    let certs = Certs::generate();
    create_namespace(&cp, NS);
    let docs = render(&[
        "--set".into(),
        "report.enabled=true".into(),
        "--set".into(),
        "report.resyncInterval=1s".into(),
        "--set".into(),
        "gc.dryRun=true".into(),
    ]);
    let (hook, _kubeconfig) = serve_as_the_chart(&cp, &docs, &certs, "chart-report-pod").await;

    let reports: Api<storageversion_webhook::report::types::ClusterReport> =
        Api::all(cp.client.clone());
    let has = |want: &'static str| {
        let reports = reports.clone();
        move || {
            let reports = reports.clone();
            async move {
                reports
                    .get_opt(FULLNAME)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|r| {
                        want.is_empty()
                            || r.results.iter().any(|x| {
                                x.properties.get("apiServerID").map(String::as_str) == Some(want)
                            })
                    })
            }
        }
    };
    let minute = Duration::from_secs(60);
    poll_until(minute, "the report to be created", has(""))
        .await
        .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    let own = own_apiserver_id(&cp).await;
    let sv_name = "chart.example.com.widgets";
    create_sv(&cp, sv_name).await;
    put_status(
        &cp,
        sv_name,
        status_for("chart.example.com", &[&own, "apiserver-chart-gone"]),
    )
    .await
    .expect("write a stale entry");
    poll_until(
        minute,
        "the finding in the report",
        has("apiserver-chart-gone"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    reports
        .delete(FULLNAME, &Default::default())
        .await
        .expect("delete the report");
    poll_until(minute, "the report to be back", has("apiserver-chart-gone"))
        .await
        .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    // A few resyncs (each reads the report back).
    let judged = |m: &str| metric_sum(m, "storageversion_webhook_report_judgements_total", &[]);
    let before = judged(&hook.metrics().await);
    poll_until(minute, "three more judgements", || async {
        judged(&hook.metrics().await) >= before + 3.0
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    let m = hook.metrics().await;
    assert_eq!(
        metric_sum(&m, "storageversion_webhook_report_errors_total", &[]),
        0.0,
        "{m}"
    );
    assert!(
        !hook.logs_text().to_lowercase().contains("forbidden"),
        "serve was refused a request with the chart's RBAC:\n{}",
        hook.logs_text()
    );

    let who = format!("--as=system:serviceaccount:{NS}:{FULLNAME}");
    let can = |verb: &str, resource: &str| -> bool {
        let out = cp
            .kubectl()
            .args(["auth", "can-i", verb, resource, &who])
            .output()
            .expect("kubectl auth can-i");
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    let ours = format!("clusterreports.openreports.io/{FULLNAME}");
    for (verb, resource, want) in [
        ("get", ours.as_str(), true),
        ("patch", ours.as_str(), true),
        ("create", "clusterreports.openreports.io", true),
        ("delete", ours.as_str(), false),
        ("update", ours.as_str(), false),
        ("list", "clusterreports.openreports.io", false),
        ("get", "clusterreports.openreports.io/someone-elses", false),
        (
            "patch",
            "clusterreports.openreports.io/someone-elses",
            false,
        ),
        ("create", "reports.openreports.io", false),
    ] {
        assert_eq!(can(verb, resource), want, "can-i {verb} {resource}");
    }
}

/// The chart's ValidatingWebhookConfiguration, with only its clientConfig pointed at the local
/// `serve` (URL and test CA; rules, failurePolicy, matchPolicy, sideEffects, timeout exactly as
/// rendered), makes kube-apiserver deny a status write that adds an entry for an apiserver with
/// no identity lease, and admit the apiserver's own entry.
#[tokio::test(flavor = "multi_thread")]
async fn chart_webhook_configuration_denies_entries_without_a_lease() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let certs = Certs::generate();
    let hook = Webhook::start(&cp, &certs, &[]).await;

    let docs = render(&[]);
    let rendered = one(&docs, "ValidatingWebhookConfiguration");
    let mut vwc = rendered.clone();
    vwc["webhooks"][0]["clientConfig"] =
        json!({"url": hook.url(), "caBundle": base64(certs.ca_pem.as_bytes())});
    // The CRD guard's entry too: kube-apiserver compiles its matchConditions on this create.
    vwc["webhooks"][1]["clientConfig"] = json!({"url": format!("https://{}/validate-crd", hook.addr),
                                                "caBundle": base64(certs.ca_pem.as_bytes())});
    let out = kubectl_apply(&cp, &[&vwc], false);
    assert!(
        out.status.success(),
        "apply the chart's webhook configuration:\n{}",
        text(&out)
    );
    let stored = kubectl_json(&cp, &["get", "validatingwebhookconfiguration", FULLNAME]);
    for (i, field) in (0..2).flat_map(|i| {
        [
            "name",
            "rules",
            "failurePolicy",
            "matchPolicy",
            "sideEffects",
            "timeoutSeconds",
            "admissionReviewVersions",
            "matchConditions",
        ]
        .map(|f| (i, f))
    }) {
        assert_eq!(
            stored["webhooks"][i][field], rendered["webhooks"][i][field],
            "webhook {i}: {field} differs from the rendered configuration"
        );
    }

    let sv_name = "chart.example.com.gadgets";
    create_sv(&cp, sv_name).await;
    let stale = "apiserver-chartnolease000000000000";
    let denied = put_status(&cp, sv_name, status_for("chart.example.com", &[stale])).await;
    let message = api_error_text(&denied);
    assert!(
        message.contains(&format!(
            "admission webhook \"{}\" denied the request",
            webhook()
        )),
        "expected a denial by {}, got: {message:?}; logs:\n{}",
        webhook(),
        hook.logs_text()
    );
    assert!(message.contains("lease-missing"), "{message}");

    let own = own_apiserver_id(&cp).await;
    let admitted = put_status(&cp, sv_name, status_for("chart.example.com", &[&own])).await;
    assert!(
        admitted.is_ok(),
        "own entry denied: {}",
        api_error_text(&admitted)
    );
}

fn kubectl_json(cp: &ControlPlane, args: &[&str]) -> Value {
    let out = ok(cp.kubectl().args(args).args(["-o", "json"]), None);
    serde_json::from_str(&out).expect("kubectl JSON")
}
