//! `serve` flags and the plain configuration the server is built from.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::admission::{Enforcement, ReviewLimits};
use crate::duration::{parse_duration, parse_positive_duration};

/// The apiserver's own request body limit.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 3 * 1024 * 1024;
/// Default of `--large-body-budget-bytes`: 32 MiB, ten bodies at that limit.
pub const DEFAULT_LARGE_BODY_BUDGET_BYTES: usize = 32 * 1024 * 1024;
/// Default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default of `--admin-max-connections`.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;

/// Flags of `storageversion-webhook serve`.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {
    /// Address of the HTTPS admission listener (serves `POST /validate`).
    #[arg(long, env = "SVW_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,

    /// Serving certificate chain (PEM, leaf first). Re-read every --tls-reload-interval.
    #[arg(long, env = "SVW_TLS_CERT_FILE")]
    pub tls_cert_file: PathBuf,

    /// Private key of the serving certificate (PEM: PKCS#1, PKCS#8 or SEC1).
    #[arg(long, env = "SVW_TLS_KEY_FILE")]
    pub tls_key_file: PathBuf,

    /// CA bundle (PEM) for client certificates. When given, every client must present a
    /// certificate signed by one of these CAs (mutual TLS). Read once at start-up.
    #[arg(long, env = "SVW_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,

    /// Offer HTTP/2 (ALPN `h2`) besides HTTP/1.1. kube-apiserver calls webhooks over HTTP/1.1.
    #[arg(long, env = "SVW_HTTP2")]
    pub http2: bool,

    /// How often the certificate and key files are read again to pick up a rotation.
    #[arg(long, env = "SVW_TLS_RELOAD_INTERVAL", default_value = "1s", value_parser = parse_positive_duration)]
    pub tls_reload_interval: Duration,

    /// Longest a client may take to complete the TLS handshake before it is disconnected.
    #[arg(long, env = "SVW_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub tls_handshake_timeout: Duration,

    /// Address of the plain-HTTP admin listener (`/livez`, `/readyz`, `/metrics`).
    #[arg(long, env = "SVW_ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    pub admin_listen: SocketAddr,

    /// Largest accepted request body, in bytes; larger ones get 413.
    #[arg(long, env = "SVW_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES,
          value_parser = parse_max_bytes)]
    pub max_request_bytes: usize,

    /// Bytes of request bodies larger than 64 KiB held at once across all connections; a large
    /// body that does not fit gets 503 (Retry-After: 1) at once. Every review kube-apiserver sends
    /// for a StorageVersion is a few KiB and never counts. Never less than --max-request-bytes.
    #[arg(long, env = "SVW_LARGE_BODY_BUDGET_BYTES", default_value_t = DEFAULT_LARGE_BODY_BUDGET_BYTES,
          value_parser = parse_max_bytes)]
    pub large_body_budget_bytes: usize,

    /// Longest a request body may take to arrive once its headers have. kube-apiserver sends
    /// the whole body with the headers, and gives up on the webhook after its timeoutSeconds (3 s
    /// in the chart): a body slower than this could not be answered in time anyway. A connection
    /// waiting for its body is also the first to be dropped when every slot is taken.
    #[arg(long, env = "SVW_BODY_READ_TIMEOUT", default_value = "2s", value_parser = parse_positive_duration)]
    pub body_read_timeout: Duration,

    /// Longest wait for a request's headers (HTTP/1.1), so a slow client cannot hold a
    /// connection forever. hyper also applies it to an idle keep-alive connection waiting for its
    /// next request, so the default is longer than kube-apiserver's 90 s idle-connection timeout:
    /// the client, not the server, closes idle connections, and a request is never sent on a
    /// connection the server is closing.
    #[arg(long, env = "SVW_HEADER_READ_TIMEOUT", default_value = "120s", value_parser = parse_positive_duration)]
    pub header_read_timeout: Duration,

    /// Most connections open at once on the admission listener. When all are taken, the oldest
    /// one with no request in progress is closed to make room; if every one is busy, new
    /// connections wait. kube-apiserver keeps a few connections per replica.
    #[arg(long, env = "SVW_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: usize,

    /// An admission connection (HTTP/1.1 or HTTP/2) with no request in progress for this long is
    /// closed. Longer than kube-apiserver's 90 s idle-connection timeout, like
    /// --header-read-timeout; HTTP/2 connections are also pinged every 30 s.
    #[arg(long, env = "SVW_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_positive_duration)]
    pub idle_timeout: Duration,

    /// Most connections open at once on the admin listener (same rule as --max-connections).
    #[arg(long, env = "SVW_ADMIN_MAX_CONNECTIONS", default_value_t = DEFAULT_ADMIN_MAX_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub admin_max_connections: usize,

    /// On the admin listener: longest wait for a request's headers, and longest a connection may
    /// stay open with no request in progress. Probes and scrapes send their request at once.
    #[arg(long, env = "SVW_ADMIN_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub admin_timeout: Duration,

    /// On SIGTERM/SIGINT: how long to keep serving after /readyz turns 503, before the listener
    /// stops accepting (time for endpoints to drop this pod).
    #[arg(long, env = "SVW_SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    /// On SIGTERM/SIGINT: how long in-flight requests may take to finish once the listener
    /// stopped accepting; connections still open after it are closed.
    #[arg(long, env = "SVW_SHUTDOWN_GRACE", default_value = "25s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// What a rule violation does: deny the write, or allow it with warnings.
    #[arg(long, env = "SVW_ENFORCEMENT", value_enum, default_value = "deny")]
    pub enforcement: Enforcement,

    /// Clock skew tolerated before an identity lease counts as expired.
    #[arg(long, env = "SVW_LEASE_SKEW_ALLOWANCE", default_value = "30s", value_parser = parse_duration)]
    pub lease_skew_allowance: Duration,

    /// kubeconfig file; without it, the in-cluster service account, then $KUBECONFIG or
    /// ~/.kube/config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// How long the lease watch may be broken before the lease view stops reporting ready.
    #[arg(long, env = "SVW_LEASE_VIEW_MAX_STALENESS", default_value = "60s", value_parser = parse_positive_duration)]
    pub lease_view_max_staleness: Duration,

    /// Live lease lookups per second, all reviews together (a lease not in the watch cache, or
    /// one that looks expired, is confirmed with a GET). A lookup over the budget is not made:
    /// the review gets `lease-lookup-failed`, a warning that never denies. A quarter of the
    /// rate and burst is kept for kube-apiserver's own reviews (`system:apiserver`).
    #[arg(long, env = "SVW_LEASE_LOOKUP_RATE", default_value = "20", value_parser = parse_rate)]
    pub lease_lookup_rate: f64,

    /// Live lease lookups that may be made at once after a quiet spell (the token bucket's
    /// size). At least 2: one for kube-apiserver's share, one for the rest.
    #[arg(long, env = "SVW_LEASE_LOOKUP_BURST", default_value = "40",
          value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(2..=1_000_000))]
    pub lease_lookup_burst: u32,

    #[command(flatten)]
    pub gc: crate::gc::GcArgs,

    #[command(flatten)]
    pub migrate: crate::migrate::MigrateArgs,

    #[command(flatten)]
    pub report: crate::report::ReportArgs,

    #[command(flatten)]
    pub crd: crate::crd::CrdArgs,
}

/// TLS settings of the admission listener.
#[derive(Clone, Debug)]
pub struct TlsSettings {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// When set, client certificates are required and verified against this CA bundle.
    pub client_ca_file: Option<PathBuf>,
    /// Offer ALPN `h2` besides `http/1.1`.
    pub http2: bool,
    pub reload_interval: Duration,
    pub handshake_timeout: Duration,
}

/// Everything [`super::Server::bind`] needs besides its collaborators.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub tls: TlsSettings,
    pub max_request_bytes: usize,
    pub large_body_budget_bytes: usize,
    pub body_read_timeout: Duration,
    pub header_read_timeout: Duration,
    pub max_connections: usize,
    pub idle_timeout: Duration,
    pub admin_max_connections: usize,
    pub admin_timeout: Duration,
    /// What one review may cost.
    pub review_limits: ReviewLimits,
    pub shutdown_delay: Duration,
    pub shutdown_grace: Duration,
    pub enforcement: Enforcement,
    pub lease_skew_allowance: Duration,
}

impl ServerConfig {
    /// The defaults of the `serve` flags (as `--help` prints them), with the given certificate
    /// and key files.
    pub fn new(cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> Self {
        let files = [
            "--tls-cert-file".into(),
            cert_file.into().into_os_string(),
            "--tls-key-file".into(),
            key_file.into().into_os_string(),
        ];
        // Only the two required flags are given, and the defaults are constants (a test parses
        // them), so this cannot fail at run time.
        let args: ServeArgs =
            crate::cli::defaults(&files).expect("the serve flags' defaults parse");
        ServerConfig::from(&args)
    }
}

impl From<&ServeArgs> for ServerConfig {
    fn from(a: &ServeArgs) -> Self {
        ServerConfig {
            listen: a.listen,
            admin_listen: a.admin_listen,
            tls: TlsSettings {
                cert_file: a.tls_cert_file.clone(),
                key_file: a.tls_key_file.clone(),
                client_ca_file: a.client_ca_file.clone(),
                http2: a.http2,
                reload_interval: a.tls_reload_interval,
                handshake_timeout: a.tls_handshake_timeout,
            },
            max_request_bytes: a.max_request_bytes,
            large_body_budget_bytes: a.large_body_budget_bytes,
            body_read_timeout: a.body_read_timeout,
            header_read_timeout: a.header_read_timeout,
            max_connections: a.max_connections,
            idle_timeout: a.idle_timeout,
            admin_max_connections: a.admin_max_connections,
            admin_timeout: a.admin_timeout,
            review_limits: ReviewLimits::default(),
            shutdown_delay: a.shutdown_delay,
            shutdown_grace: a.shutdown_grace,
            enforcement: a.enforcement,
            lease_skew_allowance: a.lease_skew_allowance,
        }
    }
}

fn parse_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of lookups per second"))?;
    if !rate.is_finite() || rate <= 0.0 || rate > 1_000_000.0 {
        return Err("must be more than 0 and at most 1000000 per second".to_string());
    }
    Ok(rate)
}

fn parse_max_bytes(text: &str) -> Result<usize, String> {
    let n: usize = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of bytes"))?;
    if n == 0 {
        return Err("must be at least 1 byte".to_string());
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn flag_defaults_match_server_config_defaults() {
        let cli = Cli::try_parse_from(["x", "--tls-cert-file", "c.pem", "--tls-key-file", "k.pem"])
            .expect("parse");
        let from_flags = ServerConfig::from(&cli.serve);
        let built = ServerConfig::new("c.pem", "k.pem");
        assert_eq!(format!("{from_flags:?}"), format!("{built:?}"));
        assert_eq!(cli.serve.lease_view_max_staleness, Duration::from_secs(60));
        assert_eq!(cli.serve.kubeconfig, None);
        assert_eq!(
            cli.serve.lease_lookup_rate,
            crate::leases::DEFAULT_LOOKUP_RATE
        );
        assert_eq!(
            cli.serve.lease_lookup_burst,
            crate::leases::DEFAULT_LOOKUP_BURST
        );
        for bad in [
            "--lease-lookup-rate=0",
            "--lease-lookup-rate=nan",
            "--lease-lookup-burst=1",
        ] {
            assert!(
                Cli::try_parse_from(["x", "--tls-cert-file=c", "--tls-key-file=k", bad]).is_err(),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "x",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            "--http2",
            "--enforcement=warn",
            "--max-request-bytes=1024",
            "--header-read-timeout=500ms",
            "--client-ca-file=ca.pem",
        ])
        .expect("parse");
        assert!(cli.serve.http2);
        assert_eq!(cli.serve.enforcement, Enforcement::Warn);
        assert_eq!(cli.serve.max_request_bytes, 1024);
        assert_eq!(cli.serve.header_read_timeout, Duration::from_millis(500));
        assert!(Cli::try_parse_from(["x", "--tls-cert-file=c"]).is_err());
        assert!(Cli::try_parse_from([
            "x",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            "--tls-reload-interval=0s"
        ])
        .is_err());
    }
}
