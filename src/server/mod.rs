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
pub mod conns;
pub mod listener;
pub mod shutdown;
pub mod tls;
pub mod validate;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, Context};
use axum::Router;
use futures::future::BoxFuture;
use futures::FutureExt;
use hyper_util::service::TowerToHyperService;
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
    /// Answers `/validate-crd` (without it, every CRD review is allowed untouched).
    pub crd_guard: Option<crate::admission::CrdGuard>,
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
    validate: validate::ValidateService,
    admin_router: Router,
    background: Vec<(&'static str, BoxFuture<'static, String>)>,
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
        )
        .with_limits(config.review_limits);
        let validate = validate::ValidateService::new(
            review,
            deps.crd_guard,
            deps.metrics,
            config.max_request_bytes,
            config.large_body_budget_bytes,
            config.body_read_timeout,
        );
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
            validate,
            admin_router,
            background: Vec::new(),
        })
    }

    /// Watches a background task the server cannot do without (e.g. the lease view's watch, the
    /// garbage collector): if `task` ever resolves, `/readyz` fails and [`Server::serve`] returns
    /// an error naming it (with the text `task` resolved to), so the process exits and is
    /// restarted instead of running on silently without it.
    pub fn watch_task(
        &mut self,
        name: &'static str,
        task: impl Future<Output = String> + Send + 'static,
    ) {
        self.background.push((name, task.boxed()));
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
            validate,
            admin_router,
            mut background,
        } = self;
        tracing::info!(
            listen = %admission_addr,
            admin_listen = %admin_addr,
            enforcement = config.enforcement.as_str(),
            alpn = if config.tls.http2 { "h2,http/1.1" } else { "http/1.1" },
            mtls = config.tls.client_ca_file.is_some(),
            max_request_bytes = config.max_request_bytes,
            max_connections = config.max_connections,
            admin_max_connections = config.admin_max_connections,
            max_lease_lookups = config.review_limits.max_lease_lookups,
            max_findings = config.review_limits.max_findings,
            "serving admission reviews"
        );

        let mut reloader = AbortOnDrop(certs.spawn_reloader(config.tls.reload_interval));
        background.push((
            "certificate reloader",
            async move {
                match (&mut reloader.0).await {
                    Ok(()) => "it returned".to_string(),
                    Err(e) => e.to_string(),
                }
            }
            .boxed(),
        ));

        let admin_settings = Arc::new(listener::ConnSettings::new(
            "admin",
            None,
            config.admin_timeout,
            config.admin_timeout,
            config.admin_timeout,
            config.admin_max_connections,
        ));
        let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let mut admin_task = AbortOnDrop(tokio::spawn(listener::accept_loop(
            admin,
            TowerToHyperService::new(admin_router),
            admin_settings,
            async move {
                let _ = admin_stopped.await;
            },
            ADMIN_CLOSE_TIMEOUT,
        )));

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
            "admission",
            Some(acceptor),
            config.tls.handshake_timeout,
            config.header_read_timeout,
            config.idle_timeout,
            config.max_connections,
        ));
        // The one route, served without a router (validate.rs matches the path itself).
        let handler = hyper::service::service_fn(move |req| {
            let validate = validate.clone();
            async move { Ok::<_, std::convert::Infallible>(validate.handle(req).await) }
        });
        let accept =
            listener::accept_loop(admission, handler, settings, stop, config.shutdown_grace);

        let background_ended = async move {
            if background.is_empty() {
                return futures::future::pending().await;
            }
            let names: Vec<&'static str> = background.iter().map(|(name, _)| *name).collect();
            let tasks = background.into_iter().map(|(_, task)| task);
            let (why, i, _) = futures::future::select_all(tasks).await;
            (names[i], why)
        };

        tokio::select! {
            () = accept => {}
            ended = &mut admin_task.0 => {
                health.set_shutting_down();
                return Err(match ended {
                    Ok(()) => anyhow!("admin listener on {admin_addr} stopped unexpectedly"),
                    Err(e) => anyhow!("admin listener on {admin_addr} failed: {e}"),
                });
            }
            (name, why) = background_ended => {
                health.set_shutting_down();
                tracing::error!(task = name, reason = %why, "a background task ended; exiting so that the process is restarted");
                return Err(anyhow!("background task {name} ended: {why}"));
            }
        }

        let _ = admin_stop.send(());
        // Dropping the task handle aborts what is left of the admin listener.
        let _ = tokio::time::timeout(ADMIN_CLOSE_TIMEOUT * 2, &mut admin_task.0).await;
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
    let view = KubeLeaseView::on_store_with_budget(
        leases.clone(),
        metrics.clone(),
        args.lease_view_max_staleness,
        crate::leases::budget::LookupBudget::new(args.lease_lookup_rate, args.lease_lookup_burst),
    );
    let ready = Arc::clone(&view);
    let readiness: Arc<dyn Readiness> = Arc::new(move || ready.is_ready());
    let gc = crate::gc::spawn_sharing(
        client.clone(),
        args.gc.clone(),
        &mut registry,
        leases.clone(),
    )?;
    let migrate =
        crate::migrate::spawn(client.clone(), &args.migrate, &args.gc, &gc, &mut registry)?;
    let crd = crate::crd::spawn(client.clone(), &args.crd, &args.gc, &gc, &mut registry)?;
    let report = crate::report::spawn(
        client.clone(),
        &args.report,
        crate::report::ReportInputs {
            gc: &args.gc,
            leader: &gc,
            leases,
            migrate: &args.migrate,
            crd: &args.crd,
            lease_skew_allowance: args.lease_skew_allowance,
        },
        &mut registry,
    )?;
    // The CRD guard reads the migrator's records only where there is a migrator.
    let (namespace, state) = (
        args.gc.leader_lease_namespace(),
        &args.crd.crd_migrate_state_configmap,
    );
    let (records, records_watch) = if args.crd.crd_migrate {
        let (store, run) = crate::crd::state::watch(client.clone(), &namespace, state);
        (store, Some(run))
    } else {
        (kube::runtime::reflector::store().0, None)
    };
    let crd_guard = crate::admission::CrdGuard::new(
        records,
        args.crd.crd_guard,
        args.crd.crd_migrate.then_some(args.crd.crd_migrate_settle),
        format!("{namespace}/{state}"),
        metrics.clone(),
    );
    let mut server = Server::bind(
        ServerConfig::from(&args),
        Deps {
            leases: Arc::new(crate::leases::coalesce::Coalescing::new(view)),
            readiness,
            metrics,
            registry: Arc::new(registry),
            crd_guard: Some(crd_guard),
        },
    )
    .await?;
    if let Some(run) = records_watch {
        server.watch_task("the CRD guard's watch of the migrator's state", run);
    }

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
            report.shutdown().await;
            crd.shutdown().await;
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
