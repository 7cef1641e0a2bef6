//! Identical lookups in flight at once share one: concurrent reviews that need the same lease
//! the cache cannot answer make one live GET between them, not one each.
//!
//! [`Coalescing`] wraps any [`LeaseView`]. A lookup for an ID with a lookup already in flight
//! waits for that one's answer; otherwise it starts one that later callers can join. Lookups the
//! inner view answers at once (cache hits) are answered at once here too. At most
//! [`MAX_IN_FLIGHT`] distinct IDs are tracked; past that, lookups go straight to the inner view,
//! so a flood of distinct IDs costs no memory here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt, Shared};

use super::LeaseView;
use crate::model::LeaseLookup;

/// Most distinct IDs with a shared lookup in flight at once.
pub const MAX_IN_FLIGHT: usize = 1024;

type SharedLookup = Shared<BoxFuture<'static, LeaseLookup>>;

/// A [`LeaseView`] that shares identical lookups in flight.
pub struct Coalescing {
    inner: Arc<dyn LeaseView>,
    in_flight: Mutex<HashMap<String, SharedLookup>>,
}

impl Coalescing {
    pub fn new(inner: Arc<dyn LeaseView>) -> Self {
        Coalescing {
            inner,
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// IDs with a lookup in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.lock().map_or(0, |m| m.len())
    }

    /// The shared lookup for `id`: the one in flight, or a new one (`None` when too many are
    /// in flight to track another).
    fn shared(&self, id: &str) -> Option<SharedLookup> {
        let mut in_flight = self.in_flight.lock().ok()?;
        if let Some(lookup) = in_flight.get(id) {
            return Some(lookup.clone());
        }
        if in_flight.len() >= MAX_IN_FLIGHT {
            return None;
        }
        let inner = Arc::clone(&self.inner);
        let owned = id.to_string();
        let lookup = async move { inner.lookup(&owned).await }.boxed().shared();
        in_flight.insert(id.to_string(), lookup.clone());
        Some(lookup)
    }

    fn finished(&self, id: &str, lookup: &SharedLookup) {
        if let Ok(mut in_flight) = self.in_flight.lock() {
            if in_flight.get(id).is_some_and(|l| l.ptr_eq(lookup)) {
                in_flight.remove(id);
            }
        }
    }
}

impl LeaseView for Coalescing {
    fn lookup<'a>(&'a self, id: &'a str) -> BoxFuture<'a, LeaseLookup> {
        Box::pin(async move {
            let Some(lookup) = self.shared(id) else {
                return self.inner.lookup(id).await;
            };
            let found = lookup.clone().await;
            self.finished(id, &lookup);
            found
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
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
    async fn ready_answers_stay_ready_on_first_poll() {
        let leases = crate::leases::StaticLeases::new([]);
        let view = Coalescing::new(Arc::new(leases));
        assert_eq!(view.lookup("x").now_or_never(), Some(LeaseLookup::NotFound));
        assert_eq!(view.in_flight(), 0);
    }
}
