//! A fault-injecting TCP proxy on loopback, to put between a client and a server (the webhook
//! and kube-apiserver) and make the network misbehave:
//!
//! - [`FaultProxy::set_latency`]: every chunk of bytes, either way, is delivered this much later
//!   (in order; a slow link, not a slow server);
//! - [`FaultProxy::cut`]: every open connection is closed at once, both sides (a load balancer
//!   restart); new connections work;
//! - [`FaultProxy::partition`]: nothing gets through: open connections go silent (bytes are
//!   dropped, sockets stay open, nothing is closed or reset), new connections are accepted and
//!   then stay silent (no upstream connection is made);
//! - [`FaultProxy::heal`]: new connections work again. Connections that were silenced stay silent
//!   for good, like a middlebox that lost their state and drops their packets: only a client that
//!   notices a dead connection by itself recovers.
//!
//! It counts accepted connections. Tokio only, no privileges (unlike `tc netem`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One proxied connection, as the proxy controls it.
struct Conn {
    silenced: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

#[derive(Default)]
struct State {
    latency_ms: std::sync::atomic::AtomicU64,
    partitioned: AtomicBool,
    accepted: AtomicUsize,
    conns: Mutex<Vec<Conn>>,
}

/// A running proxy; stops (and closes every connection) when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1 (an ephemeral port) and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::default());
        let accept = tokio::spawn(accept_loop(listener, upstream, Arc::clone(&state)));
        Ok(FaultProxy {
            addr,
            state,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Delays every chunk, both ways, by `latency` from now on.
    pub fn set_latency(&self, latency: Duration) {
        let ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        self.state.latency_ms.store(ms, Ordering::SeqCst);
    }

    /// Closes every open connection, both sides.
    pub fn cut(&self) {
        let conns = std::mem::take(&mut *self.lock_conns());
        for conn in conns {
            for task in conn.tasks {
                task.abort();
            }
        }
    }

    /// Silences every open connection for good and every new one until [`FaultProxy::heal`].
    pub fn partition(&self) {
        self.state.partitioned.store(true, Ordering::SeqCst);
        for conn in self.lock_conns().iter() {
            conn.silenced.store(true, Ordering::SeqCst);
        }
    }

    /// New connections go through again (silenced ones stay silent).
    pub fn heal(&self) {
        self.state.partitioned.store(false, Ordering::SeqCst);
    }

    fn lock_conns(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        self.state.conns.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, state: Arc<State>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        state.accepted.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_nodelay(true);
        let silenced = Arc::new(AtomicBool::new(false));
        if state.partitioned.load(Ordering::SeqCst) {
            // Accepted, then silent: read and drop whatever the client sends.
            silenced.store(true, Ordering::SeqCst);
            let task = tokio::spawn(async move {
                let mut client = client;
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = client.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                }
            });
            push(&state, silenced, vec![task]);
            continue;
        }
        let server = match TcpStream::connect(upstream).await {
            Ok(server) => server,
            Err(_) => continue, // dropping the client closes it
        };
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let tasks = vec![
            tokio::spawn(pump(
                client_read,
                server_write,
                Arc::clone(&silenced),
                Arc::clone(&state),
            )),
            tokio::spawn(pump(
                server_read,
                client_write,
                Arc::clone(&silenced),
                Arc::clone(&state),
            )),
        ];
        push(&state, silenced, tasks);
    }
}

fn push(state: &State, silenced: Arc<AtomicBool>, tasks: Vec<JoinHandle<()>>) {
    let mut conns = state.conns.lock().unwrap_or_else(|e| e.into_inner());
    // Forget connections whose both directions ended.
    conns.retain(|c| c.tasks.iter().any(|t| !t.is_finished()));
    conns.push(Conn { silenced, tasks });
}

/// Copies one direction, each chunk delivered the current latency after it was read, dropping
/// what arrives while the connection is silenced. Ends when either side closes.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silenced: Arc<AtomicBool>,
    state: Arc<State>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if silenced.load(Ordering::SeqCst) {
                        continue;
                    }
                    let latency = Duration::from_millis(state.latency_ms.load(Ordering::SeqCst));
                    if tx
                        .send((Instant::now() + latency, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    // One task for both halves, so that aborting it (a cut) closes the whole connection. The
    // reader ending drops the queue: the writer delivers what is queued, then closes its side.
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, within: Duration) -> Option<Duration> {
        let started = Instant::now();
        s.write_all(b"ping").await.ok()?;
        let mut buf = [0u8; 4];
        match tokio::time::timeout(within, s.read_exact(&mut buf)).await {
            Ok(Ok(_)) if &buf == b"ping" => Some(started.elapsed()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn latency_cut_partition_and_heal() {
        let proxy = FaultProxy::start(echo_server().await).await.expect("proxy");
        let mut a = TcpStream::connect(proxy.addr()).await.expect("connect");
        assert!(round_trip(&mut a, Duration::from_secs(5)).await.is_some());

        proxy.set_latency(Duration::from_millis(200));
        let took = round_trip(&mut a, Duration::from_secs(5))
            .await
            .expect("slow echo");
        assert!(
            took >= Duration::from_millis(400),
            "{took:?}: 200 ms each way"
        );
        proxy.set_latency(Duration::ZERO);

        proxy.cut();
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(5), a.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "cut closes: {closed:?}"
        );

        let mut b = TcpStream::connect(proxy.addr()).await.expect("connect");
        assert!(round_trip(&mut b, Duration::from_secs(5)).await.is_some());
        proxy.partition();
        assert!(round_trip(&mut b, Duration::from_millis(300))
            .await
            .is_none());
        let mut c = TcpStream::connect(proxy.addr())
            .await
            .expect("accepted while partitioned");
        assert!(round_trip(&mut c, Duration::from_millis(300))
            .await
            .is_none());
        proxy.heal();
        assert!(
            round_trip(&mut b, Duration::from_millis(300))
                .await
                .is_none(),
            "a silenced connection stays silent"
        );
        let mut d = TcpStream::connect(proxy.addr()).await.expect("connect");
        assert!(round_trip(&mut d, Duration::from_secs(5)).await.is_some());
        assert_eq!(proxy.accepted(), 4);
    }
}
