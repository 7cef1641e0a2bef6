//! Identical lookups in flight at once share one: concurrent reviews that need the same lease
//! the cache cannot answer make one live GET between them, not one each.
//!
//! [`Coalescing`] wraps any [`LeaseView`]. A lookup for an ID with a live lookup already in
//! flight waits for that one's answer; otherwise it asks the inner view, and if that does not
//! answer at once (a cache miss: a live GET starts), it lets later callers join it. Cache hits
//! ([`LeaseView::cached`]) go straight to the inner view and never touch the map. At
//! most [`MAX_IN_FLIGHT`] distinct IDs are tracked; past that, lookups are not shared, so a flood
//! of distinct IDs costs no memory here. If the caller driving a shared lookup gives up (its
//! review was cancelled), the ones waiting on it look up for themselves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use futures::channel::oneshot;
use futures::future::{BoxFuture, FutureExt, Shared};

use super::{LeaseView, Requester};
use crate::model::LeaseLookup;

/// Most distinct IDs with a shared lookup in flight at once.
pub const MAX_IN_FLIGHT: usize = 1024;

type SharedLookup = Shared<oneshot::Receiver<LeaseLookup>>;

/// A [`LeaseView`] that shares identical lookups in flight.
pub struct Coalescing {
    inner: std::sync::Arc<dyn LeaseView>,
    /// By ID: the token of the caller driving the lookup, and its answer to come.
    in_flight: Mutex<HashMap<String, (u64, SharedLookup)>>,
    next_token: AtomicU64,
}

/// Forgets a registered lookup when its driver finishes or gives up.
struct Registered<'a> {
    view: &'a Coalescing,
    id: &'a str,
    token: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Ok(mut in_flight) = self.view.in_flight.lock() {
            if in_flight
                .get(self.id)
                .is_some_and(|(t, _)| *t == self.token)
            {
                in_flight.remove(self.id);
            }
        }
    }
}

impl Coalescing {
    pub fn new(inner: std::sync::Arc<dyn LeaseView>) -> Self {
        Coalescing {
            inner,
            in_flight: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(0),
        }
    }

    /// IDs with a shared lookup in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.lock().map_or(0, |m| m.len())
    }

    fn joinable(&self, id: &str) -> Option<SharedLookup> {
        let in_flight = self.in_flight.lock().ok()?;
        in_flight.get(id).map(|(_, lookup)| lookup.clone())
    }

    /// Makes `answer` joinable for `id`, unless another lookup got there first or too many are
    /// in flight.
    fn register<'a>(&'a self, id: &'a str, answer: SharedLookup) -> Option<Registered<'a>> {
        let mut in_flight = self.in_flight.lock().ok()?;
        if in_flight.len() >= MAX_IN_FLIGHT || in_flight.contains_key(id) {
            return None;
        }
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        in_flight.insert(id.to_string(), (token, answer));
        Some(Registered {
            view: self,
            id,
            token,
        })
    }
}

impl LeaseView for Coalescing {
    fn lookup<'a>(&'a self, id: &'a str) -> BoxFuture<'a, LeaseLookup> {
        self.lookup_as(id, Requester::Other)
    }

    /// Joining a lookup in flight is the same for every requester (it is a live GET under way,
    /// never an answer refused for lack of budget: those are ready at once and never shared).
    fn lookup_as<'a>(&'a self, id: &'a str, who: Requester) -> BoxFuture<'a, LeaseLookup> {
        Box::pin(async move {
            if let Some(joined) = self.joinable(id) {
                if let Ok(found) = joined.await {
                    return found;
                }
            }
            let mut own = self.inner.lookup_as(id, who);
            if let Some(found) = (&mut own).now_or_never() {
                return found;
            }
            let (tx, rx) = oneshot::channel();
            let registered = self.register(id, rx.shared());
            let found = own.await;
            drop(registered);
            let _ = tx.send(found.clone());
            found
        })
    }

    /// A cache hit needs no sharing: the inner view's.
    fn cached(&self, id: &str) -> Option<LeaseLookup> {
        self.inner.cached(id)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// Counts lookups; each takes a while, like a live GET.
    struct Slow {
        calls: AtomicUsize,
    }

    impl LeaseView for Slow {
        fn lookup<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, LeaseLookup> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                LeaseLookup::NotFound
            })
        }
    }

    #[tokio::test]
    async fn concurrent_identical_lookups_make_one_inner_lookup() {
        let slow = Arc::new(Slow {
            calls: AtomicUsize::new(0),
        });
        let view = Coalescing::new(Arc::clone(&slow) as Arc<dyn LeaseView>);
        let lookups = (0..50).map(|i| view.lookup(if i % 2 == 0 { "a" } else { "b" }));
        let found = futures::future::join_all(lookups).await;
        assert!(found.iter().all(|f| *f == LeaseLookup::NotFound));
        assert_eq!(slow.calls.load(Ordering::SeqCst), 2);
        assert_eq!(view.in_flight(), 0, "finished lookups are forgotten");
        // A later lookup is a new one.
        view.lookup("a").await;
        assert_eq!(slow.calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_cancelled_driver_leaves_its_joiners_to_look_up_for_themselves() {
        let slow = Arc::new(Slow {
            calls: AtomicUsize::new(0),
        });
        let view = Coalescing::new(Arc::clone(&slow) as Arc<dyn LeaseView>);
        let mut driver = view.lookup("a");
        assert!(
            (&mut driver).now_or_never().is_none(),
            "a live lookup is in flight"
        );
        assert_eq!(view.in_flight(), 1);
        let mut joiner = view.lookup("a");
        assert!((&mut joiner).now_or_never().is_none(), "the joiner waits");
        assert_eq!(
            slow.calls.load(Ordering::SeqCst),
            1,
            "and did not look up itself"
        );
        drop(driver);
        assert_eq!(view.in_flight(), 0, "a cancelled lookup is forgotten");
        assert_eq!(joiner.await, LeaseLookup::NotFound);
        assert_eq!(slow.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn ready_answers_stay_ready_on_first_poll() {
        let leases = crate::leases::StaticLeases::new([]);
        let view = Coalescing::new(Arc::new(leases));
        assert_eq!(view.lookup("x").now_or_never(), Some(LeaseLookup::NotFound));
        assert_eq!(view.in_flight(), 0);
    }
}
