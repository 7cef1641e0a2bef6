//! `serve`: the HTTPS admission listener and the plain-HTTP admin listener (docs/design.md §6).
//!
//! [`Server::bind`] loads the certificate, binds both listeners and returns their addresses;
//! [`Server::serve`] runs until the given shutdown future resolves and then drains. Tests drive
//! these directly with any [`LeaseView`]; [`run`] adds the cluster lease view and the signals.
//!
//! Modules: [`args`] (flags and config), [`tls`] (certificate loading, reload, rustls config),
//! [`validate`] (`POST /validate`), [`admin`] (`/livez`, `/readyz`, `/metrics`), [`listener`]
//! (accept loop, handshakes, per-connection HTTP) and [`shutdown`] (signals).

pub mod admin;
pub mod args;
pub mod listener;
pub mod shutdown;
pub mod tls;
pub mod validate;

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, Context};
use axum::Router;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use crate::leases::{KubeLeaseView, LeaseView};
use crate::metrics::Metrics;

pub use admin::{Health, Readiness, ReadyFlag};
pub use args::{ServeArgs, ServerConfig, TlsSettings, DEFAULT_MAX_REQUEST_BYTES};
pub use tls::{CertStore, ReloadOutcome};

/// How long the admin listener may take to close once the admission listener has drained.
const ADMIN_CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// What the server needs from the rest of the process.
pub struct Deps {
    /// Answers identity lease lookups for the live-lease rule.
    pub leases: Arc<dyn LeaseView>,
    /// Whether the lease view is ready (gates `/readyz`).
    pub readiness: Arc<dyn Readiness>,
    /// The metrics handles; must be registered in `registry`.
    pub metrics: Metrics,
    /// Served on `/metrics`.
    pub registry: Arc<Registry>,
}

/// Both listeners, bound, with the certificate loaded: nothing can fail on configuration any more.
pub struct Server {
    config: ServerConfig,
    admission: TcpListener,
    admin: TcpListener,
    admission_addr: SocketAddr,
    admin_addr: SocketAddr,
    acceptor: TlsAcceptor,
    certs: Arc<CertStore>,
    health: Arc<Health>,
    router: Router,
    admin_router: Router,
}

impl Server {
    /// Loads the certificate and key (and client CA), then binds both listeners. Errors name the
    /// file or address at fault.
    pub async fn bind(config: ServerConfig, deps: Deps) -> anyhow::Result<Server> {
        let provider = tls::provider();
        let certs = CertStore::load(
            &config.tls.cert_file,
            &config.tls.key_file,
            Arc::clone(&provider),
            deps.metrics.clone(),
        )?;
        let tls_config = tls::server_config(&config.tls, &certs, provider)?;
        let admission = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {} (--listen)", config.listen))?;
        let admin = TcpListener::bind(config.admin_listen)
            .await
            .with_context(|| {
                format!("cannot listen on {} (--admin-listen)", config.admin_listen)
            })?;
        let admission_addr = admission
            .local_addr()
            .context("admission listener address")?;
        let admin_addr = admin.local_addr().context("admin listener address")?;

        let health = Arc::new(Health::new(Arc::clone(&certs), deps.readiness));
        let review = Admission::new(
            deps.leases,
            config.enforcement,
            config.lease_skew_allowance,
            deps.metrics.clone(),
        );
        let router = validate::router(review, deps.metrics, config.max_request_bytes);
        let admin_router = admin::router(Arc::clone(&health), deps.registry);
        Ok(Server {
            config,
            admission,
            admin,
            admission_addr,
            admin_addr,
            acceptor: TlsAcceptor::from(tls_config),
            certs,
            health,
            router,
            admin_router,
        })
    }

    /// Where the HTTPS admission listener is bound.
    pub fn admission_addr(&self) -> SocketAddr {
        self.admission_addr
    }

    /// Where the plain-HTTP admin listener is bound.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// What `/readyz` reports on.
    pub fn health(&self) -> Arc<Health> {
        Arc::clone(&self.health)
    }

    /// The serving certificate store.
    pub fn cert_store(&self) -> Arc<CertStore> {
        Arc::clone(&self.certs)
    }

    /// Serves until `shutdown` resolves, then: `/readyz` turns 503, the admission listener keeps
    /// accepting for the shutdown delay, stops accepting, lets in-flight requests finish and
    /// closes idle connections (bounded by the shutdown grace), and finally closes the admin
    /// listener. Returns an error only if the admin listener fails.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let Server {
            config,
            admission,
            admin,
            admission_addr,
            admin_addr,
            acceptor,
            certs,
            health,
            router,
            admin_router,
        } = self;
        tracing::info!(
            listen = %admission_addr,
            admin_listen = %admin_addr,
            enforcement = config.enforcement.as_str(),
            alpn = if config.tls.http2 { "h2,http/1.1" } else { "http/1.1" },
            mtls = config.tls.client_ca_file.is_some(),
            max_request_bytes = config.max_request_bytes,
            "serving admission reviews"
        );

        let reloader = certs.spawn_reloader(config.tls.reload_interval);
        let _reloader = AbortOnDrop(reloader);

        let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let mut admin_task = tokio::spawn(
            axum::serve(admin, admin_router)
                .with_graceful_shutdown(async move {
                    let _ = admin_stopped.await;
                })
                .into_future(),
        );

        let delay = config.shutdown_delay;
        let stop = {
            let health = Arc::clone(&health);
            async move {
                shutdown.await;
                health.set_shutting_down();
                tracing::info!(delay = ?delay, "shutdown requested: /readyz now fails");
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
            }
        };
        let settings = Arc::new(listener::ConnSettings::new(
            config.tls.handshake_timeout,
            config.header_read_timeout,
        ));
        let accept = listener::accept_loop(
            admission,
            acceptor,
            router,
            settings,
            stop,
            config.shutdown_grace,
        );

        tokio::select! {
            () = accept => {}
            ended = &mut admin_task => {
                health.set_shutting_down();
                return Err(match ended {
                    Ok(Ok(())) => anyhow!("admin listener on {admin_addr} stopped unexpectedly"),
                    Ok(Err(e)) => anyhow!("admin listener on {admin_addr} failed: {e}"),
                    Err(e) => anyhow!("admin listener on {admin_addr} failed: {e}"),
                });
            }
        }

        let _ = admin_stop.send(());
        if tokio::time::timeout(ADMIN_CLOSE_TIMEOUT, &mut admin_task)
            .await
            .is_err()
        {
            admin_task.abort();
        }
        tracing::info!("shut down");
        Ok(())
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `storageversion-webhook serve`: the cluster lease view, the garbage collector (when enabled),
/// both listeners, and graceful shutdown on SIGTERM/SIGINT: `/readyz` fails, in-flight reviews
/// finish, and the collector stops and releases its leader Lease at once so another replica
/// takes over without waiting for expiry.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let client = crate::kubeclient::client(args.kubeconfig.as_deref()).await?;
    let leases = crate::leases::LeaseStore::spawn(client.clone());
    let view = KubeLeaseView::on_store(
        leases.clone(),
        metrics.clone(),
        args.lease_view_max_staleness,
    );
    let ready = Arc::clone(&view);
    let readiness: Arc<dyn Readiness> = Arc::new(move || ready.is_ready());
    let gc = crate::gc::spawn_sharing(client.clone(), args.gc.clone(), &mut registry, leases)?;
    let migrate = crate::migrate::spawn(client, &args.migrate, &args.gc, &gc, &mut registry)?;
    let server = Server::bind(
        ServerConfig::from(&args),
        Deps {
            leases: view,
            readiness,
            metrics,
            registry: Arc::new(registry),
        },
    )
    .await?;

    let stop = CancellationToken::new();
    let signals = {
        let stop = stop.clone();
        tokio::spawn(async move {
            shutdown::signal().await;
            stop.cancel();
        })
    };
    let gc_stopped = {
        let stop = stop.clone();
        tokio::spawn(async move {
            stop.cancelled().await;
            migrate.shutdown().await;
            gc.shutdown().await;
        })
    };
    let served = server.serve(stop.clone().cancelled_owned()).await;
    stop.cancel();
    signals.abort();
    let _ = gc_stopped.await;
    served
}
