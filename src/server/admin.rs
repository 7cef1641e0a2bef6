//! The plain-HTTP admin listener: `/livez`, `/readyz` and `/metrics`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::tls::CertStore;

/// Something whose readiness gates `/readyz`, e.g. the lease view (initial list done, watch
/// fresh). Closures `Fn() -> bool` are readiness sources too.
pub trait Readiness: Send + Sync {
    fn is_ready(&self) -> bool;
}

impl<F> Readiness for F
where
    F: Fn() -> bool + Send + Sync,
{
    fn is_ready(&self) -> bool {
        self()
    }
}

/// A readiness source that is switched by hand.
#[derive(Debug, Default)]
pub struct ReadyFlag(AtomicBool);

impl ReadyFlag {
    pub fn new(ready: bool) -> Self {
        ReadyFlag(AtomicBool::new(ready))
    }

    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
}

impl Readiness for ReadyFlag {
    fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What `/readyz` reports on.
pub struct Health {
    certs: Arc<CertStore>,
    lease_view: Arc<dyn Readiness>,
    shutting_down: AtomicBool,
}

impl Health {
    pub fn new(certs: Arc<CertStore>, lease_view: Arc<dyn Readiness>) -> Self {
        Health {
            certs,
            lease_view,
            shutting_down: AtomicBool::new(false),
        }
    }

    /// From now on `/readyz` answers 503.
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// `Ok(())` when ready, else what is not.
    pub fn check(&self) -> Result<(), Vec<&'static str>> {
        let mut not_ready = Vec::new();
        if self.is_shutting_down() {
            not_ready.push("shutting down");
        }
        if !self.certs.is_loaded() {
            not_ready.push("serving certificate not loaded");
        }
        if !self.lease_view.is_ready() {
            not_ready.push("lease view not ready (initial list not done or watch stale)");
        }
        if not_ready.is_empty() {
            Ok(())
        } else {
            Err(not_ready)
        }
    }
}

struct AdminState {
    health: Arc<Health>,
    registry: Arc<Registry>,
    /// `storageversion_webhook_ready`: what `/readyz` would answer, computed at each scrape (for
    /// the not-ready and unavailable alerts).
    ready_registry: Registry,
    ready: Gauge,
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The admin router.
pub fn router(health: Arc<Health>, registry: Arc<Registry>) -> Router {
    let ready = Gauge::default();
    let mut ready_registry = Registry::default();
    ready_registry.register(
        "storageversion_webhook_ready",
        "1 when /readyz would answer ok (certificate loaded, lease view fresh, not shutting down)",
        ready.clone(),
    );
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(Arc::new(AdminState {
            health,
            registry,
            ready_registry,
            ready,
        }))
}

async fn livez() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<Arc<AdminState>>) -> Response {
    match state.health.check() {
        Ok(()) => "ok".into_response(),
        Err(not_ready) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", not_ready.join("; ")),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<Arc<AdminState>>) -> Response {
    state.ready.set(i64::from(state.health.check().is_ok()));
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode_registry(&mut text, &state.registry);
    let _ = encode_registry(&mut text, &state.ready_registry);
    let _ = encode_eof(&mut text);
    ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response()
}
