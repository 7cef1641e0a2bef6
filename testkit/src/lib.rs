//! The test kit of storageversion-webhook: what its integration tests (`tests/`), benchmarks
//! (`benches/`) and benchmark driver (`examples/bench_driver`) share, written once. Dev-only: the
//! main crate lists it under `[dev-dependencies]`.
//!
//! - [`certs`]: a test PKI (CA, serving and client certificates, rustls client configurations);
//! - [`fixtures`]: realistic StorageVersions and AdmissionReviews as kube-apiserver writes them;
//! - [`proxy`]: a fault-injecting TCP proxy (latency, cut connections, partition, heal);
//! - [`http_get`], [`metric_sum`], [`poll_until`], [`base64`]: talking to the admin listener,
//!   reading Prometheus text, waiting with a deadline, encoding a caBundle.
//!
//! The control-plane harness (starting etcd, kube-apiserver and `serve`) stays in
//! `tests/support`, next to the tests that use it.

pub mod certs;
pub mod fixtures;
pub mod proxy;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A plain HTTP/1.1 GET (for the admin listener): `(status, body)`, or `None` when the
/// connection or the answer fails.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Polls `cond` every 100 ms until it holds or `deadline` passes.
pub async fn poll_until<F, Fut>(deadline: Duration, what: &str, mut cond: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + deadline;
    loop {
        if cond().await {
            return Ok(());
        }
        if Instant::now() > end {
            return Err(format!("timed out after {deadline:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of a metric line `name{labels} value` summed over every line that starts with
/// `name` and contains all of `labels` (each like `verdict="denied"`; none: every series).
pub fn metric_sum(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next().is_some_and(|n| n == name))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A `ValidatingWebhookConfiguration` (as JSON) sending every CREATE and UPDATE of
/// `storageversions` and `storageversions/status` to `url`, trusting `ca_pem`.
pub fn webhook_configuration(
    name: &str,
    webhook_name: &str,
    url: &str,
    ca_pem: &[u8],
    failure_policy: &str,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": webhook_name,
            "clientConfig": {"url": url, "caBundle": base64(ca_pem)},
            "rules": [{
                "apiGroups": ["internal.apiserver.k8s.io"],
                "apiVersions": ["v1alpha1"],
                "resources": ["storageversions", "storageversions/status"],
                "operations": ["CREATE", "UPDATE"],
                "scope": "Cluster"
            }],
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": failure_policy,
            "matchPolicy": "Equivalent",
            "timeoutSeconds": 5
        }]
    })
}

/// Standard base64 with padding (for caBundle), without pulling in a crate for it.
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_pads_like_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn metric_sum_matches_name_and_labels() {
        let text =
            "# HELP x\nx_total{a=\"1\",b=\"2\"} 3\nx_total{a=\"1\"} 4\nx_total_more 9\ny 1\n";
        assert_eq!(metric_sum(text, "x_total", &[]), 7.0);
        assert_eq!(metric_sum(text, "x_total", &["b=\"2\""]), 3.0);
        assert_eq!(metric_sum(text, "z", &[]), 0.0);
    }
}
