//! `selftest`: what the chart's `helm test` pod runs. It calls the webhook the way kube-apiserver
//! does, then runs `audit`:
//!
//! 1. reads the ValidatingWebhookConfiguration: its Service reference and its `caBundle` (the CA
//!    kube-apiserver verifies the webhook with, whichever way the chart's certificate was made:
//!    Helm's, an existing Secret's, or injected by cert-manager);
//! 2. resolves the Service to its ready endpoints (EndpointSlices), as kube-apiserver does with
//!    `--enable-aggregator-routing` (no DNS or kube-proxy needed, and every replica is tried, not
//!    one the Service happens to pick);
//! 3. sends every endpoint an AdmissionReview it builds itself, over TLS verified with that CA for
//!    the name `<service>.<namespace>.svc` (the name kube-apiserver verifies), and expects
//!    `allowed: true`; then a review of an object that breaks `name-format`, and expects the answer
//!    to name that rule (denied with `--enforcement deny`, a warning with `warn`): the thing that
//!    answers judges with this webhook's rules;
//! 4. runs `audit` (the same report as `storageversion-webhook audit`). Its findings are printed;
//!    they fail the test only with `--fail-on-audit-findings` (stale entries on a live cluster are
//!    data the collector acts on, not a broken install).
//!
//! Every failure is one line that says what is wrong; exit 0 when all passed, 1 otherwise.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use rustls::pki_types::ServerName;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::duration::parse_positive_duration;
use crate::migrate::audit::AuditMigrateArgs;

/// Exit status when a check failed.
const EXIT_FAILED: u8 = 1;
/// The largest answer read from the webhook.
const MAX_ANSWER_BYTES: usize = 1 << 20;
/// The object of the review that must be allowed: no entries, so no lease is looked up.
pub const PROBE_NAME: &str = "selftest.storageversion-webhook.example.com.probes";
/// The object of the review that must be judged by the rules: its name breaks `name-format`.
pub const INVALID_PROBE_NAME: &str = "Selftest_Not_A_Group.Not_A_Resource";
/// The rule [`INVALID_PROBE_NAME`] breaks.
pub const INVALID_PROBE_RULE: &str = "name-format";

#[derive(Clone, Debug, clap::Args)]
#[command(after_help = "\
What the chart's `helm test` pod runs (its ServiceAccount needs: get the \
ValidatingWebhookConfiguration, get the Service and list EndpointSlices in its namespace, and what \
`audit` reads). Exit status: 0 when every check passed, 1 when one failed (each failure is one \
line starting with FAIL).")]
pub struct SelftestArgs {
    /// kubeconfig file; without it, the in-cluster configuration, $KUBECONFIG or ~/.kube/config.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The ValidatingWebhookConfiguration to test: its Service and caBundle are what
    /// kube-apiserver uses.
    #[arg(long, value_name = "NAME")]
    pub webhook_configuration: String,
    /// The webhook entry in it [default: its only entry].
    #[arg(long, value_name = "NAME")]
    pub webhook: Option<String>,
    /// How long each call may take (an API read, a connection, a review).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_positive_duration)]
    pub timeout: Duration,
    /// Do not run `audit`.
    #[arg(long)]
    pub no_audit: bool,
    /// Fail when `audit` reports anything (by default its findings are printed and do not fail).
    #[arg(long)]
    pub fail_on_audit_findings: bool,
    #[command(flatten)]
    pub migrate: AuditMigrateArgs,
}

/// `storageversion-webhook selftest`.
pub fn run(args: SelftestArgs) -> ExitCode {
    super::block_on(async move {
        let failures = selftest(&args).await;
        if failures.is_empty() {
            println!("PASS: the webhook answers as kube-apiserver would call it");
            ExitCode::SUCCESS
        } else {
            println!("selftest failed ({} problem(s)):", failures.len());
            for f in &failures {
                println!("FAIL: {f}");
            }
            ExitCode::from(EXIT_FAILED)
        }
    })
}

/// Runs every check; the failures, each one line.
async fn selftest(args: &SelftestArgs) -> Vec<String> {
    let mut failures = Vec::new();
    let client = match crate::kubeclient::client(args.kubeconfig.as_deref()).await {
        Ok(c) => c,
        Err(e) => return vec![format!("no Kubernetes client: {e:#}")],
    };
    match webhook_checks(&client, args).await {
        Ok(mut f) => failures.append(&mut f),
        Err(e) => failures.push(format!("{e:#}")),
    }
    if !args.no_audit {
        if let Err(e) = audit(&client, args).await {
            failures.push(format!("{e:#}"));
        }
    }
    failures
}

/// Where and how kube-apiserver calls the webhook, read from its configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub webhook: String,
    pub namespace: String,
    pub service: String,
    pub port: i32,
    pub path: String,
    pub ca_bundle: Vec<u8>,
}

impl Target {
    /// The name kube-apiserver verifies the serving certificate for.
    pub fn server_name(&self) -> String {
        format!("{}.{}.svc", self.service, self.namespace)
    }
}

/// The webhook `wanted` (or the only one) of `vwc`, with its Service and caBundle. Pure.
pub fn target_of(
    vwc: &ValidatingWebhookConfiguration,
    wanted: Option<&str>,
) -> Result<Target, String> {
    let cfg = vwc.metadata.name.as_deref().unwrap_or("?");
    let hooks = vwc.webhooks.as_deref().unwrap_or_default();
    let hook = match wanted {
        Some(w) => hooks.iter().find(|h| h.name == w).ok_or_else(|| {
            let names: Vec<&str> = hooks.iter().map(|h| h.name.as_str()).collect();
            format!("ValidatingWebhookConfiguration {cfg} has no webhook {w} (it has {names:?})")
        })?,
        None => match hooks {
            [one] => one,
            _ => {
                return Err(format!(
                    "ValidatingWebhookConfiguration {cfg} has {} webhooks; name one with --webhook",
                    hooks.len()
                ))
            }
        },
    };
    let cc = &hook.client_config;
    let Some(svc) = cc.service.as_ref() else {
        return Err(format!(
            "webhook {} of ValidatingWebhookConfiguration {cfg} calls a URL, not a Service; selftest tests Service webhooks only",
            hook.name
        ));
    };
    let ca_bundle = cc
        .ca_bundle
        .as_ref()
        .map(|b| b.0.clone())
        .unwrap_or_default();
    if ca_bundle.iter().all(u8::is_ascii_whitespace) {
        return Err(format!(
            "webhook {} of ValidatingWebhookConfiguration {cfg} has no caBundle: kube-apiserver cannot verify the webhook's certificate (with certificates.mode=certManager, cert-manager's CA injector has not filled it in)",
            hook.name
        ));
    }
    Ok(Target {
        webhook: hook.name.clone(),
        namespace: svc.namespace.clone(),
        service: svc.name.clone(),
        port: svc.port.unwrap_or(443),
        path: svc.path.clone().unwrap_or_else(|| "/".to_string()),
        ca_bundle,
    })
}

/// The addresses kube-apiserver may call for `target`'s Service port: every ready, not
/// terminating endpoint of the Service's EndpointSlices, on the slice port named like the
/// Service port. Pure; the error says why there is none.
pub fn ready_endpoints(
    target: &Target,
    svc: &Service,
    slices: &[EndpointSlice],
) -> Result<Vec<SocketAddr>, String> {
    let who = format!(
        "the webhook Service {}/{}",
        target.namespace, target.service
    );
    let ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    let Some(port) = ports.iter().find(|p| p.port == target.port) else {
        return Err(format!(
            "{who} has no port {} (the port the webhook configuration calls)",
            target.port
        ));
    };
    let port_name = port.name.as_deref().unwrap_or("");
    let mut ready = Vec::new();
    let mut not_ready = 0usize;
    for slice in slices {
        let Some(number) = slice
            .ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|p| p.name.as_deref().unwrap_or("") == port_name)
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for ep in slice.endpoints.as_deref().unwrap_or_default() {
            let c = ep.conditions.as_ref();
            // An unknown readiness counts as ready (the API's advice to consumers).
            let is_ready = c.and_then(|c| c.ready).unwrap_or(true)
                && !c.and_then(|c| c.terminating).unwrap_or(false);
            for a in &ep.addresses {
                match (is_ready, a.parse::<IpAddr>()) {
                    (true, Ok(ip)) => ready.push(SocketAddr::new(ip, number)),
                    _ => not_ready += 1,
                }
            }
        }
    }
    ready.sort();
    ready.dedup();
    if ready.is_empty() {
        return Err(format!(
            "{who} has no ready endpoints ({not_ready} not ready): no webhook pod is ready to answer kube-apiserver; see `kubectl -n {} get pods,endpointslices` and the pods' logs",
            target.namespace
        ));
    }
    Ok(ready)
}

/// An AdmissionReview of a CREATE of a StorageVersion named `name` with no entries.
pub fn review(uid: &str, name: &str) -> Value {
    let gvk = json!({"group": "internal.apiserver.k8s.io", "version": "v1alpha1", "kind": "StorageVersion"});
    let gvr = json!({"group": "internal.apiserver.k8s.io", "version": "v1alpha1", "resource": "storageversions"});
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": name,
            "operation": "CREATE",
            "userInfo": {"username": "storageversion-webhook-selftest"},
            "object": {
                "apiVersion": "internal.apiserver.k8s.io/v1alpha1",
                "kind": "StorageVersion",
                "metadata": {"name": name},
                "spec": {},
                "status": {},
            },
            "oldObject": null,
            "dryRun": true,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    })
}

/// What a webhook answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub allowed: bool,
    pub message: String,
    pub warnings: Vec<String>,
}

#[derive(Deserialize)]
struct ReviewOut {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
    response: Option<ResponseOut>,
}

#[derive(Deserialize)]
struct ResponseOut {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    allowed: bool,
    #[serde(default)]
    status: Option<StatusOut>,
    #[serde(default)]
    warnings: Vec<String>,
}

#[derive(Deserialize)]
struct StatusOut {
    #[serde(default)]
    message: String,
}

/// `s` cut to at most `max` bytes (on a character boundary), for messages.
fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Reads an HTTP answer to the review with `uid` as kube-apiserver would. Pure.
pub fn read_answer(uid: &str, http_status: u16, body: &[u8]) -> Result<Answer, String> {
    let text = || cut(&String::from_utf8_lossy(body), 300).to_string();
    if http_status != 200 {
        return Err(format!("answered HTTP {http_status}: {}", text()));
    }
    let out: ReviewOut = serde_json::from_slice(body).map_err(|e| {
        format!(
            "answered with something that is not an AdmissionReview ({e}): {}",
            text()
        )
    })?;
    if out.api_version.as_deref() != Some("admission.k8s.io/v1")
        || out.kind.as_deref() != Some("AdmissionReview")
    {
        return Err(format!(
            "answered apiVersion {:?} kind {:?}, not an admission.k8s.io/v1 AdmissionReview",
            out.api_version, out.kind
        ));
    }
    let Some(r) = out.response else {
        return Err("answered an AdmissionReview without a response".to_string());
    };
    if r.uid != uid {
        return Err(format!(
            "answered uid {:?} to the review with uid {uid:?}",
            cut(&r.uid, 64)
        ));
    }
    Ok(Answer {
        allowed: r.allowed,
        message: r.status.map(|s| s.message).unwrap_or_default(),
        warnings: r.warnings,
    })
}

/// A TLS failure said so that the cause is plain: which name, which CA. Pure.
pub fn tls_problem(e: &std::io::Error, target: &Target, cfg: &str) -> String {
    use rustls::CertificateError as C;
    let name = target.server_name();
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::InvalidCertificate(c)) => match c {
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                format!("TLS: the served certificate is not valid for {name} ({c:?})")
            }
            C::UnknownIssuer => format!(
                "TLS: the served certificate is not signed by a CA in the caBundle of ValidatingWebhookConfiguration {cfg} (UnknownIssuer)"
            ),
            C::Expired | C::ExpiredContext { .. } => {
                format!("TLS: the served certificate has expired ({c:?})")
            }
            C::NotValidYet | C::NotValidYetContext { .. } => {
                format!("TLS: the served certificate is not valid yet ({c:?})")
            }
            other => format!("TLS: the served certificate was refused: {other:?}"),
        },
        Some(other) => format!("TLS: {other}"),
        None => format!("TLS: {e}"),
    }
}

/// A rustls client configuration that trusts exactly the certificates in `pem`.
pub fn tls_config(pem: &[u8], cfg: &str) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    let mut bad = 0usize;
    for cert in CertificateDer::pem_slice_iter(pem) {
        match cert.map(|c| roots.add(c)) {
            Ok(Ok(())) => {}
            _ => bad += 1,
        }
    }
    if roots.is_empty() {
        return Err(format!(
            "the caBundle of ValidatingWebhookConfiguration {cfg} holds no usable CA certificate ({bad} unreadable)"
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
        .map_err(|e| format!("TLS configuration: {e}"))
}

/// POSTs `body` to `path` at `addr` over TLS for `name`; the HTTP status and body.
async fn post(
    tls: Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    target: &Target,
    cfg: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), String> {
    let name = target.server_name();
    let tcp = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| format!("no TCP connection within {timeout:?}"))?
        .map_err(|e| format!("cannot connect: {e}"))?;
    let server_name =
        ServerName::try_from(name.clone()).map_err(|e| format!("bad server name {name}: {e}"))?;
    let stream = tokio::time::timeout(
        timeout,
        tokio_rustls::TlsConnector::from(tls).connect(server_name, tcp),
    )
    .await
    .map_err(|_| format!("no TLS handshake within {timeout:?}"))?
    .map_err(|e| tls_problem(&e, target, cfg))?;
    let call = async {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let driver = tokio::spawn(conn);
        let req = hyper::Request::post(target.path.as_str())
            .header(hyper::header::HOST, name.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("HTTP request: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let status = resp.status().as_u16();
        let bytes = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        driver.abort();
        Ok::<_, String>((status, bytes.to_vec()))
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
}

/// Steps 1-3 of the module documentation. Errors that stop the checks are returned; the
/// failures of single endpoints are collected.
async fn webhook_checks(client: &kube::Client, args: &SelftestArgs) -> anyhow::Result<Vec<String>> {
    let cfg = args.webhook_configuration.as_str();
    let t = args.timeout;
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let vwc = tokio::time::timeout(t, vwcs.get(cfg))
        .await
        .map_err(|_| anyhow::anyhow!("reading ValidatingWebhookConfiguration {cfg} took longer than {t:?}"))?
        .map_err(|e| match &e {
            kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!(
                "ValidatingWebhookConfiguration {cfg} does not exist: kube-apiserver does not call the webhook at all"
            ),
            _ => anyhow::Error::new(e).context(format!("cannot read ValidatingWebhookConfiguration {cfg}")),
        })?;
    let target = target_of(&vwc, args.webhook.as_deref()).map_err(anyhow::Error::msg)?;
    println!(
        "webhook {} of ValidatingWebhookConfiguration {cfg}: Service {}/{} port {} path {}, TLS name {}",
        target.webhook,
        target.namespace,
        target.service,
        target.port,
        target.path,
        target.server_name()
    );
    let svcs: Api<Service> = Api::namespaced(client.clone(), &target.namespace);
    let svc = tokio::time::timeout(t, svcs.get_opt(&target.service))
        .await
        .map_err(|_| anyhow::anyhow!("reading the Service took longer than {t:?}"))?
        .with_context(|| {
            format!(
                "cannot read Service {}/{}",
                target.namespace, target.service
            )
        })?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "the webhook Service {}/{} does not exist",
                target.namespace,
                target.service
            )
        })?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &target.namespace);
    let lp =
        ListParams::default().labels(&format!("kubernetes.io/service-name={}", target.service));
    let slices = tokio::time::timeout(t, slices.list(&lp))
        .await
        .map_err(|_| anyhow::anyhow!("listing EndpointSlices took longer than {t:?}"))?
        .with_context(|| {
            format!(
                "cannot list the EndpointSlices of Service {}/{}",
                target.namespace, target.service
            )
        })?
        .items;
    let endpoints = ready_endpoints(&target, &svc, &slices).map_err(anyhow::Error::msg)?;
    let tls = Arc::new(tls_config(&target.ca_bundle, cfg).map_err(anyhow::Error::msg)?);

    let mut failures = Vec::new();
    let mut n = 0u32;
    for addr in endpoints {
        for (name, must_allow) in [(PROBE_NAME, true), (INVALID_PROBE_NAME, false)] {
            n += 1;
            let uid = format!("selftest-{}-{n}", std::process::id());
            let body = serde_json::to_vec(&review(&uid, name)).unwrap_or_default();
            let at = format!(
                "endpoint {addr} of Service {}/{}",
                target.namespace, target.service
            );
            let answer = post(tls.clone(), addr, &target, cfg, body, t)
                .await
                .and_then(|(status, body)| read_answer(&uid, status, &body));
            match (answer, must_allow) {
                (Err(e), _) => failures.push(format!("{at}: {e}")),
                (Ok(a), true) if a.allowed => println!("ok: {at} allowed a valid StorageVersion"),
                (Ok(a), true) => failures.push(format!(
                    "{at}: review answered denied: {}",
                    cut(&a.message, 500)
                )),
                (Ok(a), false) => {
                    let said = format!("{} {}", a.message, a.warnings.join(" "));
                    if said.contains(INVALID_PROBE_RULE) {
                        let how = if a.allowed { "warned about" } else { "denied" };
                        println!("ok: {at} {how} an object breaking {INVALID_PROBE_RULE}");
                    } else {
                        failures.push(format!(
                            "{at}: an object breaking {INVALID_PROBE_RULE} was answered allowed={} without naming the rule: {}",
                            a.allowed,
                            cut(&said, 300)
                        ));
                    }
                }
            }
        }
    }
    Ok(failures)
}

/// Step 4: `audit`, printed; its findings fail only with `--fail-on-audit-findings`.
async fn audit(client: &kube::Client, args: &SelftestArgs) -> anyhow::Result<()> {
    let defaults: crate::audit::AuditArgs =
        crate::cli::defaults(&[]).map_err(|e| anyhow::anyhow!("audit's defaults: {e}"))?;
    let opts = crate::audit::AuditOptions {
        now: k8s_openapi::jiff::Timestamp::now(),
        lease_skew_allowance: defaults.lease_skew_allowance,
        gc_expired_lease_grace: None,
    };
    let report = crate::audit::everything(client.clone(), &opts, &args.migrate)
        .await
        .context("audit failed")?;
    println!("audit:");
    for line in crate::audit::render_text(&report).lines() {
        println!("  {line}");
    }
    if report.clean {
        println!("ok: audit reports nothing");
    } else if args.fail_on_audit_findings {
        anyhow::bail!("audit reported findings (above), and --fail-on-audit-findings is set");
    } else {
        println!(
            "note: audit reported findings (above); they do not fail this test: the collector removes stale entries on its own, and rule violations are in what was already stored"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
