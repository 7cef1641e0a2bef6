//! The limit for the admission benchmark (`bench/run`): a minimal rustls + hyper HTTP/1.1 server
//! that reads each request body and answers a fixed small JSON body. Same TLS set-up as `serve`:
//! the *ring* provider, TLS 1.3 and 1.2, ALPN `http/1.1`, the same certificate, TCP_NODELAY,
//! keep-alive, and the same Tokio runtime (multi-threaded, one worker per CPU it may run on).
//!
//! `cargo run --release --example bench_echo -- <listen addr> <cert.pem> <key.pem> [busy µs]`;
//! prints `listening on <addr>` once bound.
//!
//! With `busy µs`, each request also keeps the CPU busy for that long before the answer (a spin
//! on the clock: no memory, no allocation, no system call). `bench/run` runs one such server as
//! a calibration: it shows what a fixed amount of extra work per request does to throughput on
//! the machine at hand, which is the yardstick for the goal "validate ≥ 0.6 × the limit".

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

const ANSWER: &[u8] = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"9b2c4d6e-8f0a-4b1c-9d3e-5f7a9b1c3d5e","allowed":true}}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (listen, cert, key, busy) = match args.as_slice() {
        [_, listen, cert, key] => (listen, cert, key, Duration::ZERO),
        [_, listen, cert, key, busy] => {
            let micros: u64 = busy
                .parse()
                .map_err(|e| format!("busy µs {busy:?} is not a whole number of µs: {e}"))?;
            (listen, cert, key, Duration::from_micros(micros))
        }
        _ => return Err("usage: bench_echo <listen addr> <cert.pem> <key.pem> [busy µs]".into()),
    };
    let listen: SocketAddr = listen.parse()?;
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        println!("listening on {}", listener.local_addr()?);
        loop {
            let (tcp, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(_) => continue,
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(|req: Request<Incoming>| async move {
                    // Read the whole body, as a real handler must.
                    let _ = req.into_body().collect().await;
                    if !busy.is_zero() {
                        let start = Instant::now();
                        while start.elapsed() < busy {
                            std::hint::spin_loop();
                        }
                    }
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(ANSWER)))
                            .unwrap_or_default(),
                    )
                });
                let _ = http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    })
}
