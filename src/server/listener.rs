//! The admission listener's accept loop: TCP accept, TLS handshake under a deadline, then HTTP/1.1
//! (or HTTP/2 when negotiated by ALPN) on one tokio task per connection, each watched for
//! graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::tls::ALPN_H2;

/// How connections are served.
pub struct ConnSettings {
    pub handshake_timeout: Duration,
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

impl ConnSettings {
    pub fn new(handshake_timeout: Duration, header_read_timeout: Duration) -> Self {
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .keep_alive(true);
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new());
        ConnSettings {
            handshake_timeout,
            http1: h1,
            http2: h2,
        }
    }
}

/// Accepts until `stop` resolves, then drains: in-flight requests finish, idle keep-alive
/// connections close, all bounded by `grace`; whatever is still open after it is dropped.
pub async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    settings: Arc<ConnSettings>,
    stop: impl Future<Output = ()>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            () = &mut stop => break,
            Some(done) = conns.join_next(), if !conns.is_empty() => {
                if let Err(e) = done {
                    if e.is_panic() {
                        tracing::error!(error = %e, "a connection task panicked");
                    }
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    // Subscribed here, before the drain can start, so no connection is missed.
                    let watcher = graceful.watcher();
                    conns.spawn(serve_connection(
                        tcp,
                        peer,
                        acceptor.clone(),
                        router.clone(),
                        Arc::clone(&settings),
                        watcher,
                    ));
                }
                Err(e) => {
                    // Usually out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let open = conns.len();
    tracing::info!(
        connections = open,
        grace = ?grace,
        "admission listener closed; draining connections"
    );
    match tokio::time::timeout(grace, graceful.shutdown()).await {
        Ok(()) => tracing::info!("all admission connections closed"),
        Err(_) => tracing::warn!(
            connections = conns.len(),
            "shutdown grace period over; closing the remaining connections"
        ),
    }
    conns.shutdown().await;
}

async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    router: Router,
    settings: Arc<ConnSettings>,
    watcher: Watcher,
) {
    let _ = tcp.set_nodelay(true);
    let tls = match tokio::time::timeout(settings.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, timeout = ?settings.handshake_timeout, "TLS handshake timed out");
            return;
        }
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(ALPN_H2);
    let io = TokioIo::new(tls);
    let service = TowerToHyperService::new(router);
    let result = if h2 {
        watcher
            .watch(settings.http2.serve_connection(io, service))
            .await
    } else {
        watcher
            .watch(settings.http1.serve_connection(io, service))
            .await
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}
