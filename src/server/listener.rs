//! The accept loop of both listeners: TCP accept under a connection limit, the TLS handshake
//! under a deadline (admission listener), then HTTP/1.1 (or HTTP/2 when negotiated by ALPN) on
//! one tokio task per connection, closed when idle, when evicted for a new connection, or on
//! graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::conns::{self, ConnLimit, ConnState, Ended, Slot};
use super::tls::ALPN_H2;

/// Interval of HTTP/2 keep-alive pings, so a dead peer's connection is noticed and closed.
pub const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a keep-alive ping may go unanswered before the connection is closed.
pub const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How connections are served.
pub struct ConnSettings {
    /// `None` for the plain-HTTP admin listener.
    pub tls: Option<TlsAcceptor>,
    pub handshake_timeout: Duration,
    /// A connection with no request in progress for this long is closed.
    pub idle_timeout: Duration,
    pub limit: Arc<ConnLimit>,
    /// What the listener is called in logs.
    pub name: &'static str,
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

impl ConnSettings {
    pub fn new(
        name: &'static str,
        tls: Option<TlsAcceptor>,
        handshake_timeout: Duration,
        header_read_timeout: Duration,
        idle_timeout: Duration,
        max_connections: usize,
    ) -> Self {
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .keep_alive(true);
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .keep_alive_interval(Some(H2_KEEP_ALIVE_INTERVAL))
            .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT);
        ConnSettings {
            tls,
            handshake_timeout,
            idle_timeout,
            limit: ConnLimit::new(max_connections),
            name,
            http1: h1,
            http2: h2,
        }
    }
}

/// Accepts until `stop` resolves, then drains: in-flight requests finish, idle keep-alive
/// connections close, all bounded by `grace`; whatever is still open after it is dropped.
pub async fn accept_loop(
    listener: TcpListener,
    router: Router,
    settings: Arc<ConnSettings>,
    stop: impl Future<Output = ()>,
    grace: Duration,
) {
    let mut conns = JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            () = &mut stop => break,
            Some(done) = conns.join_next(), if !conns.is_empty() => {
                if let Err(e) = done {
                    if e.is_panic() {
                        tracing::error!(listener = settings.name, error = %e, "a connection task panicked");
                    }
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let slot = tokio::select! {
                        biased;
                        () = &mut stop => break,
                        slot = settings.limit.acquire() => slot,
                    };
                    conns.spawn(serve_connection(
                        tcp,
                        peer,
                        router.clone(),
                        Arc::clone(&settings),
                        slot,
                    ));
                }
                Err(e) => {
                    // Usually out of file descriptors: back off instead of spinning.
                    tracing::warn!(listener = settings.name, error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    tracing::info!(
        listener = settings.name,
        connections = conns.len(),
        grace = ?grace,
        "listener closed; draining connections"
    );
    settings.limit.drain();
    let drained = tokio::time::timeout(grace, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    match drained {
        Ok(()) => tracing::info!(listener = settings.name, "all connections closed"),
        Err(_) => tracing::warn!(
            listener = settings.name,
            connections = conns.len(),
            "shutdown grace period over; closing the remaining connections"
        ),
    }
    conns.shutdown().await;
}

async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    router: Router,
    settings: Arc<ConnSettings>,
    slot: Slot,
) {
    let _ = tcp.set_nodelay(true);
    let Some(acceptor) = &settings.tls else {
        serve_http(TokioIo::new(tcp), false, peer, router, &settings, &slot).await;
        return;
    };
    let handshake = tokio::time::timeout(settings.handshake_timeout, acceptor.accept(tcp));
    // A connection still in its handshake has no request in progress: it may be evicted.
    let tls = tokio::select! {
        done = handshake => match done {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, timeout = ?settings.handshake_timeout, "TLS handshake timed out");
                return;
            }
        },
        () = slot.state.closing() => return,
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(ALPN_H2);
    serve_http(TokioIo::new(tls), h2, peer, router, &settings, &slot).await;
}

async fn serve_http<I>(
    io: TokioIo<I>,
    h2: bool,
    peer: SocketAddr,
    router: Router,
    settings: &ConnSettings,
    slot: &Slot,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = counted(router, Arc::clone(&slot.state));
    let (ended, result) = if h2 {
        conns::drive(
            settings.http2.serve_connection(io, service),
            &slot.state,
            settings.idle_timeout,
        )
        .await
    } else {
        conns::drive(
            settings.http1.serve_connection(io, service),
            &slot.state,
            settings.idle_timeout,
        )
        .await
    };
    if ended == Ended::Dropped {
        tracing::debug!(%peer, listener = settings.name, "connection did not close in time; dropped");
    }
    if let Err(e) = result {
        tracing::debug!(%peer, listener = settings.name, error = %e, "connection ended with an error");
    }
}

/// The router as a hyper service that marks each request in progress on its connection.
fn counted(
    router: Router,
    state: Arc<ConnState>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>>
                 + Send
                 + 'static,
> + Clone {
    let inner = TowerToHyperService::new(router);
    hyper::service::service_fn(move |req: Request<Incoming>| {
        let guard = state.begin_request();
        let call = hyper::service::Service::call(&inner, req);
        async move {
            let response = call.await;
            drop(guard);
            response
        }
    })
}
