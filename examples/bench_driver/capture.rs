//! `capture-review`: records one AdmissionReview exactly as kube-apiserver sends it, for the
//! benchmark's second body. Serves HTTPS on loopback with the given certificate, registers
//! itself as a validating webhook (failurePolicy Ignore) for storageversions/status, deletes
//! every StorageVersion so that a restarted kube-apiserver creates them again, and waits for a
//! status UPDATE from `system:apiserver` with an object of one entry and an oldObject. It answers
//! every review `allowed: true`, removes its registration and writes the review's JSON.
//!
//! Used once by hand (the fixture is committed):
//! `bench_driver capture-review --kubeconfig K --cert tls.crt --key tls.key --ca ca.crt --out F &`
//! then `tests/controlplane/run restart-apiserver`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, DeleteParams, PostParams};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use storageversion_webhook::model::StorageVersion;
use tokio::sync::mpsc;

const NAME: &str = "svw-bench-capture";

#[derive(clap::Args)]
pub struct CaptureArgs {
    #[arg(long)]
    kubeconfig: PathBuf,
    #[arg(long)]
    cert: PathBuf,
    #[arg(long)]
    key: PathBuf,
    #[arg(long)]
    ca: PathBuf,
    #[arg(long)]
    out: PathBuf,
    /// Longest wait for the review, in seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

/// The review wanted: a status UPDATE by kube-apiserver itself, one entry, with oldObject.
fn wanted(review: &Value) -> bool {
    let r = &review["request"];
    r["operation"] == "UPDATE"
        && r["subResource"] == "status"
        && r["userInfo"]["username"] == "system:apiserver"
        && r["object"]["status"]["storageVersions"]
            .as_array()
            .is_some_and(|e| e.len() == 1)
        && r["oldObject"].is_object()
}

pub async fn run(args: &CaptureArgs) -> anyhow::Result<()> {
    let chain = CertificateDer::pem_file_iter(&args.cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&args.key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (found, mut got) = mpsc::channel::<Value>(1);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let found = found.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |req: Request<Incoming>| {
                    let found = found.clone();
                    async move {
                        let body = req.into_body().collect().await?.to_bytes();
                        let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let uid = review["request"]["uid"].clone();
                        if wanted(&review) {
                            let _ = found.try_send(review);
                        }
                        let answer = json!({
                            "apiVersion": "admission.k8s.io/v1",
                            "kind": "AdmissionReview",
                            "response": {"uid": uid, "allowed": true},
                        });
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(
                            answer.to_string(),
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });

    let client = storageversion_webhook::kubeclient::client(Some(&args.kubeconfig)).await?;
    let ca = std::fs::read(&args.ca).with_context(|| format!("read {}", args.ca.display()))?;
    let vwc: ValidatingWebhookConfiguration =
        serde_json::from_value(svw_testkit::webhook_configuration(
            NAME,
            "capture.storageversion-webhook.example.com",
            &format!("https://{addr}/validate"),
            &ca,
            "Ignore",
        ))?;
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let _ = vwcs.delete(NAME, &DeleteParams::default()).await;
    vwcs.create(&PostParams::default(), &vwc).await?;
    let svs: Api<StorageVersion> = Api::all(client);
    svs.delete_collection(&DeleteParams::default(), &Default::default())
        .await?;
    eprintln!("capture: listening on {addr}; restart kube-apiserver now");

    let review = tokio::time::timeout(Duration::from_secs(args.timeout), got.recv()).await;
    let _ = vwcs.delete(NAME, &DeleteParams::default()).await;
    let review = review
        .map_err(|_| {
            anyhow!(
                "no status UPDATE from system:apiserver within {}s",
                args.timeout
            )
        })?
        .ok_or_else(|| anyhow!("capture server stopped"))?;
    std::fs::write(&args.out, serde_json::to_vec_pretty(&review)?)?;
    eprintln!("capture: wrote {}", args.out.display());
    Ok(())
}
