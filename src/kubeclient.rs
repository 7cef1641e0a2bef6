//! Building a Kubernetes client from `--kubeconfig`, or in-cluster config, or the usual
//! kubeconfig lookup (`KUBECONFIG`, `~/.kube/config`).
//!
//! The client's HTTP stack is our own (kube's [`ConfigExt`] layers for the base URI, auth and
//! headers over a hyper client), because kube's default stack speaks HTTP/1.1 only and has no way
//! to notice a connection that went dead without a reset (a load balancer restarted, a partition):
//! a pooled connection or a watch on it then hangs until a read timeout of minutes, and the lease
//! view silently stops following the cluster. Here, like client-go since kubernetes/client-go#374:
//!
//! - HTTP/2 (ALPN `h2`, HTTP/1.1 as fallback) with keep-alive pings every [`H2_PING_INTERVAL`],
//!   also while idle: a ping not answered within [`H2_PING_TIMEOUT`] closes the connection, every
//!   request and watch on it fails at once (the watch re-lists, `/readyz` counts it stale), and
//!   the next request opens a new connection;
//! - a connect deadline covering the TCP connect and the TLS handshake ([`CONNECT_TIMEOUT`]): a
//!   blackholed apiserver fails a new connection instead of hanging it;
//! - idle pooled connections are dropped after [`POOL_IDLE_TIMEOUT`];
//! - a read timeout ([`READ_TIMEOUT`], reset by every write) for an HTTP/1.1 fallback connection.
//!
//! Every user of the process's one client benefits: the lease watch, admission's live lookups,
//! the leader Lease and the collector.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::{BoxError, ServiceBuilder};

/// How long a response may stay silent on an HTTP/1.1 connection (HTTP/2 ones are pinged).
/// Longer than the 290 s a kube-runtime watch asks the API server to keep it open (a quiet
/// cluster sends nothing on a watch for minutes). Unary calls carry their own, shorter deadlines
/// (admission's live lookup, the collector's calls, `audit`'s pages).
pub const READ_TIMEOUT: Duration = Duration::from_secs(295);
/// TCP connect and TLS handshake together.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// An HTTP/2 connection with nothing received for this long is pinged.
pub const H2_PING_INTERVAL: Duration = Duration::from_secs(5);
/// A ping not answered within this is a dead connection: closed, its requests fail. Longer than
/// the round trip of a slow apiserver (the tests use 4 s of latency each way).
pub const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle pooled connections are closed after this.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A client for the cluster of `kubeconfig` (a file path), or, when `None`, of the in-cluster
/// service account, falling back to the usual kubeconfig lookup (`$KUBECONFIG`, `~/.kube/config`).
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {} is not usable", path.display()))?
        }
        None => match kube::Config::incluster() {
            Ok(config) => config,
            Err(in_cluster) => kube::Config::from_kubeconfig(&KubeConfigOptions::default())
                .await
                .map_err(|kubeconfig| {
                    anyhow::anyhow!(
                        "no cluster configuration: not in a pod ({in_cluster}) and no usable kubeconfig ({kubeconfig}); pass --kubeconfig"
                    )
                })?,
        },
    };
    from_config(config)
}

/// A client for `config` on the stack described in the module documentation.
pub fn from_config(mut config: kube::Config) -> anyhow::Result<kube::Client> {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.reset_reader_on_write = true;
    if config.proxy_url.is_some() {
        // kube's own stack knows the proxy protocols; it has no keep-alive pings.
        tracing::warn!(
            "the kubeconfig names a proxy: using kube's HTTP/1.1 client, which notices a dead API connection only by its {READ_TIMEOUT:?} read timeout"
        );
        return kube::Client::try_from(config).context("cannot build a Kubernetes client");
    }

    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    // For a peer that vanished without a reset, on any connection (the kernel's probes).
    http.set_keepalive(Some(Duration::from_secs(15)));
    let tls = config
        .rustls_client_config()
        .context("TLS settings of the kubeconfig")?;
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let https = match &config.tls_server_name {
        Some(name) => {
            let name = rustls_pki_types::ServerName::try_from(name.clone())
                .with_context(|| format!("tls-server-name {name:?} in the kubeconfig"))?;
            https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => https,
    };
    let https = https.enable_all_versions().wrap_connector(http);
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector.set_read_timeout(Some(READ_TIMEOUT));
    connector.set_reset_reader_on_write(true);

    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .http2_keep_alive_interval(H2_PING_INTERVAL)
        .http2_keep_alive_timeout(H2_PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .auth_layer()
                .context("credentials of the kubeconfig")?,
        )
        .layer(
            config
                .extra_headers_layer()
                .context("headers of the kubeconfig")?,
        )
        .map_err(BoxError::from)
        .service(client);
    Ok(kube::client::ClientBuilder::new(service, config.default_namespace.clone()).build())
}
