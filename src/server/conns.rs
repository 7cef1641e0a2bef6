//! What a connection may cost: a bound on open connections per listener, an idle timeout, and
//! the bookkeeping both need.
//!
//! A listener holds at most `max` connections. When a new one arrives while all slots are taken,
//! the oldest connection with no request in progress is asked to close (an idle keep-alive
//! connection, or one still in its TLS handshake), so idle clients can never lock out the
//! apiserver or a probe. If none is idle, the connection that has waited longest for a request
//! body is dropped at once (its client has not finished sending, so it has no answer to lose;
//! kube-apiserver sends its whole body with the headers), so slow senders cannot lock anyone out
//! either. Only when every connection has a request being answered does the new one wait
//! (unaccepted work stays in the kernel's backlog) until a slot frees. A request whose body has
//! arrived is never cut off.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use hyper_util::server::graceful::GracefulConnection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// How often a new connection waiting for a slot asks another idle connection to close.
const EVICT_RETRY: Duration = Duration::from_millis(50);

/// A connection becomes a candidate for dropping only once it has waited this long for a
/// request body: kube-apiserver's body arrives with its headers, within microseconds, so it is
/// never caught between the two.
const BODY_WAIT_BEFORE_DROP: Duration = Duration::from_millis(100);

/// How long a connection asked to close (evicted or idle) may take to finish before it is
/// dropped.
const CLOSE_DEADLINE: Duration = Duration::from_secs(5);

/// The open connections of one listener.
pub struct ConnLimit {
    max: usize,
    permits: Arc<Semaphore>,
    open: Mutex<BTreeMap<u64, Arc<ConnState>>>,
    next_id: AtomicU64,
    /// Cancelled when the listener drains: every connection closes gracefully.
    drain: CancellationToken,
}

/// One open connection: how many requests are in progress and since when it is idle.
pub struct ConnState {
    started: Instant,
    requests: AtomicUsize,
    /// Milliseconds after `started` when the last request ended (or the connection opened).
    idle_since_ms: AtomicU64,
    /// Requests whose body has not fully arrived.
    bodies: AtomicUsize,
    /// Milliseconds after `started` since when `bodies` is above zero ([`NO_BODY`] when it is not).
    body_since_ms: AtomicU64,
    close: CancellationToken,
    /// Cancelled to drop the connection at once (it waits for a body and a slot is needed).
    abort: CancellationToken,
}

const NO_BODY: u64 = u64::MAX;

/// Marks a request whose body is still arriving, until dropped. Put into the request's
/// extensions by the listener; the handler takes it out and drops it once it has the body.
#[derive(Clone)]
pub struct AwaitingBody {
    _mark: Arc<BodyMark>,
}

struct BodyMark(Arc<ConnState>);

impl Drop for BodyMark {
    fn drop(&mut self) {
        if self.0.bodies.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.body_since_ms.store(NO_BODY, Ordering::SeqCst);
        }
    }
}

impl ConnState {
    /// Marks a request's body as still arriving until the returned mark is dropped.
    pub fn awaiting_body(self: &Arc<Self>) -> AwaitingBody {
        if self.bodies.fetch_add(1, Ordering::SeqCst) == 0 {
            let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(NO_BODY - 1);
            self.body_since_ms.store(now, Ordering::SeqCst);
        }
        AwaitingBody {
            _mark: Arc::new(BodyMark(Arc::clone(self))),
        }
    }

    /// Since when the connection has waited for a request body, if it has.
    fn awaiting_body_since(&self) -> Option<Instant> {
        match self.body_since_ms.load(Ordering::SeqCst) {
            NO_BODY => None,
            ms => Some(self.started + Duration::from_millis(ms)),
        }
    }

    /// Marks a request in progress until the guard is dropped.
    pub fn begin_request(self: &Arc<Self>) -> RequestGuard {
        self.requests.fetch_add(1, Ordering::SeqCst);
        RequestGuard(Arc::clone(self))
    }

    /// Resolves when the connection is asked to close (evicted, or the listener drains).
    pub async fn closing(&self) {
        self.close.cancelled().await;
    }

    fn is_idle(&self) -> bool {
        self.requests.load(Ordering::SeqCst) == 0
    }

    /// How long the connection has had no request in progress (zero while it has one).
    fn idle_for(&self) -> Duration {
        if !self.is_idle() {
            return Duration::ZERO;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::SeqCst));
        self.started.elapsed().saturating_sub(since)
    }
}

/// A request in progress on a connection.
pub struct RequestGuard(Arc<ConnState>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let now = u64::try_from(self.0.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.idle_since_ms.store(now, Ordering::SeqCst);
        self.0.requests.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A held connection slot; dropping it frees the slot.
pub struct Slot {
    id: u64,
    limit: Arc<ConnLimit>,
    pub state: Arc<ConnState>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.limit.open.lock() {
            open.remove(&self.id);
        }
    }
}

impl ConnLimit {
    pub fn new(max: usize) -> Arc<Self> {
        let max = max.max(1);
        Arc::new(ConnLimit {
            max,
            permits: Arc::new(Semaphore::new(max)),
            open: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            drain: CancellationToken::new(),
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    /// Asks every connection to close gracefully (requests in progress finish first).
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// A slot for a new connection: at once when one is free; else the oldest idle connection
    /// is asked to close and this waits for a slot to free.
    pub async fn acquire(self: &Arc<Self>) -> Slot {
        loop {
            if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
                return self.register(permit);
            }
            if !self.evict_oldest_idle() {
                self.abort_slowest_body();
            }
            tokio::select! {
                permit = Arc::clone(&self.permits).acquire_owned() => {
                    if let Ok(permit) = permit {
                        return self.register(permit);
                    }
                }
                () = tokio::time::sleep(EVICT_RETRY) => {}
            }
        }
    }

    fn register(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let state = Arc::new(ConnState {
            started: Instant::now(),
            requests: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            bodies: AtomicUsize::new(0),
            body_since_ms: AtomicU64::new(NO_BODY),
            close: self.drain.child_token(),
            abort: CancellationToken::new(),
        });
        if let Ok(mut open) = self.open.lock() {
            open.insert(id, Arc::clone(&state));
        }
        Slot {
            id,
            limit: Arc::clone(self),
            state,
            _permit: permit,
        }
    }

    /// Asks the oldest idle connection not yet asked to close. Returns whether there was one.
    fn evict_oldest_idle(&self) -> bool {
        let Ok(open) = self.open.lock() else {
            return false;
        };
        match open
            .values()
            .find(|c| c.is_idle() && !c.close.is_cancelled())
        {
            Some(c) => {
                c.close.cancel();
                true
            }
            None => false,
        }
    }

    /// Drops the connection that has waited longest for a request body (at least
    /// [`BODY_WAIT_BEFORE_DROP`]), if one has and none is being dropped already (one at a time:
    /// each frees a slot). Returns whether it did.
    fn abort_slowest_body(&self) -> bool {
        let Ok(open) = self.open.lock() else {
            return false;
        };
        if open.values().any(|c| c.abort.is_cancelled()) {
            // One is on its way out; its slot frees within moments.
            return true;
        }
        let slowest = open
            .values()
            .filter_map(|c| c.awaiting_body_since().map(|since| (since, c)))
            .filter(|(since, _)| since.elapsed() >= BODY_WAIT_BEFORE_DROP)
            .min_by_key(|(since, _)| *since);
        match slowest {
            Some((since, c)) => {
                tracing::debug!(
                    waited = ?since.elapsed(),
                    "every connection slot is taken: dropping the connection that waited longest for its request body"
                );
                c.abort.cancel();
                true
            }
            None => false,
        }
    }
}

/// Why a connection ended besides the peer closing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The connection finished (the peer closed it, or it closed after a graceful shutdown).
    Done,
    /// It was asked to close and did not within [`CLOSE_DEADLINE`]; it was dropped.
    Dropped,
}

/// Serves `conn` until it ends, closing it gracefully when the slot is asked to (eviction or
/// drain) or when it has had no request in progress for `idle_timeout`.
pub async fn drive<C>(
    conn: C,
    state: &ConnState,
    idle_timeout: Duration,
) -> (Ended, Result<(), C::Error>)
where
    C: GracefulConnection,
{
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => return (Ended::Done, result),
        () = state.abort.cancelled() => return (Ended::Dropped, Ok(())),
        () = state.close.cancelled() => {}
        () = idle(state, idle_timeout) => {
            tracing::debug!(idle_timeout = ?idle_timeout, "closing an idle connection");
        }
    }
    conn.as_mut().graceful_shutdown();
    tokio::select! {
        done = tokio::time::timeout(CLOSE_DEADLINE, conn) => match done {
            Ok(result) => (Ended::Done, result),
            Err(_) => (Ended::Dropped, Ok(())),
        },
        () = state.abort.cancelled() => (Ended::Dropped, Ok(())),
    }
}

/// Resolves once the connection has had no request in progress for `timeout`.
async fn idle(state: &ConnState, timeout: Duration) {
    loop {
        let idle_for = state.idle_for();
        if idle_for >= timeout {
            return;
        }
        tokio::time::sleep(timeout - idle_for).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_limit_evicts_the_oldest_idle_connection_and_never_a_busy_one() {
        let limit = ConnLimit::new(2);
        let busy = limit.acquire().await;
        let _request = busy.state.begin_request();
        let idle = limit.acquire().await;
        assert_eq!(limit.open(), 2);
        let close = idle.state.close.clone();
        let waiting = tokio::spawn({
            let limit = Arc::clone(&limit);
            async move { limit.acquire().await }
        });
        tokio::time::timeout(Duration::from_secs(5), close.cancelled())
            .await
            .expect("the idle connection is asked to close");
        assert!(
            !busy.state.close.is_cancelled(),
            "a busy connection is never evicted"
        );
        drop(idle);
        let third = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting connection gets the freed slot")
            .expect("task");
        assert_eq!(limit.open(), 2);
        drop(third);
        assert_eq!(limit.open(), 1);
    }

    #[tokio::test]
    async fn a_full_limit_of_busy_connections_drops_the_one_waiting_longest_for_its_body() {
        let limit = ConnLimit::new(3);
        let answering = limit.acquire().await;
        let _answering = answering.state.begin_request();
        let slow = limit.acquire().await;
        let _slow_request = slow.state.begin_request();
        let _slow_body = slow.state.awaiting_body();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let slower_later = limit.acquire().await;
        let _later_request = slower_later.state.begin_request();
        let _later_body = slower_later.state.awaiting_body();
        // Neither has waited long enough for its body: nothing is dropped yet.
        assert!(!limit.abort_slowest_body());
        assert!(!slow.state.abort.is_cancelled() && !slower_later.state.abort.is_cancelled());
        tokio::time::sleep(BODY_WAIT_BEFORE_DROP).await;
        let waiting = tokio::spawn({
            let limit = Arc::clone(&limit);
            async move { limit.acquire().await }
        });
        tokio::time::timeout(Duration::from_secs(5), slow.state.abort.cancelled())
            .await
            .expect("the connection waiting longest for its body is dropped");
        assert!(!answering.state.abort.is_cancelled() && !answering.state.close.is_cancelled());
        assert!(!slower_later.state.abort.is_cancelled(), "one at a time");
        drop(slow);
        let fourth = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting connection gets the freed slot")
            .expect("task");
        drop(fourth);
    }

    #[tokio::test]
    async fn a_body_mark_counts_until_the_last_one_is_dropped() {
        let limit = ConnLimit::new(1);
        let slot = limit.acquire().await;
        assert!(slot.state.awaiting_body_since().is_none());
        let a = slot.state.awaiting_body();
        let b = a.clone();
        let c = slot.state.awaiting_body();
        drop(a);
        drop(b);
        assert!(slot.state.awaiting_body_since().is_some(), "c still waits");
        drop(c);
        assert!(slot.state.awaiting_body_since().is_none());
    }

    #[tokio::test]
    async fn drain_asks_every_connection_to_close() {
        let limit = ConnLimit::new(4);
        let a = limit.acquire().await;
        let b = limit.acquire().await;
        limit.drain();
        assert!(a.state.close.is_cancelled() && b.state.close.is_cancelled());
    }

    #[tokio::test]
    async fn idle_time_counts_from_the_last_request() {
        let limit = ConnLimit::new(1);
        let slot = limit.acquire().await;
        let guard = slot.state.begin_request();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(slot.state.idle_for(), Duration::ZERO, "busy is never idle");
        drop(guard);
        assert!(slot.state.idle_for() < Duration::from_millis(250));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(slot.state.idle_for() >= Duration::from_millis(300));
    }
}
