//! The accept loop of both listeners: TCP accept under a connection limit, the TLS handshake
//! under a deadline (admission listener), then HTTP/1.1 (or HTTP/2 when negotiated by ALPN) on
//! one tokio task per connection, closed when idle, when evicted for a new connection, or on
//! graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body, Bytes, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
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
/// Requests in progress at once on one HTTP/2 connection (hyper's default is 200): with
/// `--max-connections` this bounds the request bodies held in memory at once.
pub const H2_MAX_CONCURRENT_STREAMS: u32 = 32;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a listener serves: a hyper service that never fails (every error is a response), cheap
/// to clone. The admission listener's is a plain `service_fn` over
/// [`super::validate::ValidateService`]; the admin listener's an axum router.
pub trait Handler: Clone + Send + Sync + 'static {
    type Body: Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static;
    type Future: Future<Output = Result<Response<Self::Body>, Infallible>> + Send + 'static;
    fn call(&self, req: Request<Incoming>) -> Self::Future;
}

impl<S, B> Handler for S
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static,
{
    type Body = B;
    type Future = S::Future;
    fn call(&self, req: Request<Incoming>) -> S::Future {
        Service::call(self, req)
    }
}

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
            .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT)
            .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS);
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
pub async fn accept_loop<H: Handler>(
    listener: TcpListener,
    handler: H,
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
                        handler.clone(),
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
    let drained =
        tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
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

async fn serve_connection<H: Handler>(
    tcp: TcpStream,
    peer: SocketAddr,
    handler: H,
    settings: Arc<ConnSettings>,
    slot: Slot,
) {
    let _ = tcp.set_nodelay(true);
    let Some(acceptor) = &settings.tls else {
        serve_http(TokioIo::new(tcp), false, peer, handler, &settings, &slot).await;
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
    serve_http(TokioIo::new(tls), h2, peer, handler, &settings, &slot).await;
}

async fn serve_http<I, H: Handler>(
    io: TokioIo<I>,
    h2: bool,
    peer: SocketAddr,
    handler: H,
    settings: &ConnSettings,
    slot: &Slot,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = counted(handler, Arc::clone(&slot.state));
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

/// The handler as a hyper service that marks each request in progress on its connection.
fn counted<H: Handler>(
    handler: H,
    state: Arc<ConnState>,
) -> impl Service<
    Request<Incoming>,
    Response = Response<H::Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<H::Body>, Infallible>> + Send + 'static,
> + Clone {
    hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let guard = state.begin_request();
        if !req.body().is_end_stream() {
            // Until the handler has read the body, this connection may be dropped for a new one.
            let awaiting = state.awaiting_body();
            req.extensions_mut().insert(awaiting);
        }
        let call = handler.call(req);
        async move {
            let response = call.await;
            drop(guard);
            response
        }
    })
}
