//! What live lease lookups may cost the API server, whatever reviews arrive: a process-wide
//! token bucket (a rate with a burst, like client-go's QPS and burst) and a short cache of
//! NotFound answers.
//!
//! - [`LookupBudget`]: every live GET takes a token; without one the lookup is not made and the
//!   review gets `lease-lookup-failed` (a warning, never a denial). A quarter of the budget is
//!   reserved for kube-apiserver's own reviews (`system:apiserver`): they take from their share
//!   first, then from the shared rest, so other clients' lookups can never spend it all. Nothing
//!   ever waits for a token: a review over the budget is answered at once.
//! - [`FoundCache`]: a lease a live lookup found answers lookups of it for a few seconds, so the
//!   burst of reviews kube-apiserver sends at its start, all naming its new lease before the
//!   watch delivers it, costs one GET, not one per review.
//! - [`NegativeCache`]: a live NotFound is remembered for a few seconds, so a flood naming the
//!   same missing IDs costs one GET per ID per TTL. The view consults it only for other
//!   requesters, only when the lease is absent from the watch cache, and only while the watch is
//!   healthy (docs/limits.md says why that cannot deny a lease created meanwhile).
//!
//! A token bucket is a few lines over a mutex; a crate (`governor`) was not used because its
//! clock cannot be driven by tokio's paused time in the unit tests, and the reserved share needs
//! two buckets drawn in order anyway.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Share of the lookup budget (rate and burst) kept for kube-apiserver's own reviews.
pub const RESERVED_FOR_APISERVER: f64 = 0.25;
/// How long a live NotFound is remembered.
pub const NEGATIVE_CACHE_TTL: Duration = Duration::from_secs(5);
/// Most IDs remembered as NotFound at once. The budget bounds the inserts to
/// burst + rate × TTL within one TTL (240 with the defaults); this bound holds whatever the flags.
pub const NEGATIVE_CACHE_MAX: usize = 4096;
/// How long a lease found by a live lookup answers later lookups of it (as a watch event that
/// arrives late would: a lease deleted meanwhile can be taken for live this long, never the
/// other way round).
pub const FOUND_CACHE_TTL: Duration = Duration::from_secs(5);
/// Most leases remembered as found at once (bounded by the budget like the NotFounds).
pub const FOUND_CACHE_MAX: usize = 4096;

/// Who asks for a lookup: kube-apiserver's own review, or anyone else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requester {
    /// `userInfo.username` is `system:apiserver`.
    ApiServer,
    Other,
}

impl Requester {
    pub fn from_username(username: &str) -> Requester {
        if username == crate::metrics::APISERVER_USERNAME {
            Requester::ApiServer
        } else {
            Requester::Other
        }
    }
}

/// A token bucket: `rate` tokens per second, at most `burst` held.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: f64, burst: f64) -> Self {
        let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
        let burst = if burst.is_finite() {
            burst.max(0.0)
        } else {
            0.0
        };
        TokenBucket {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes one token if there is one; never waits.
    pub fn try_take(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (tokens, last) = *state;
        let refilled = (tokens + now.saturating_duration_since(last).as_secs_f64() * self.rate)
            .min(self.burst);
        if refilled >= 1.0 {
            *state = (refilled - 1.0, now);
            true
        } else {
            *state = (refilled, now);
            false
        }
    }
}

/// The process-wide budget of live lease lookups.
#[derive(Debug)]
pub struct LookupBudget {
    reserved: TokenBucket,
    shared: TokenBucket,
}

impl LookupBudget {
    /// `rate` lookups per second on average, `burst` at once, a quarter of each reserved for
    /// kube-apiserver's reviews (at least one token of burst).
    pub fn new(rate: f64, burst: u32) -> Self {
        let burst = f64::from(burst);
        let reserved_burst = (burst * RESERVED_FOR_APISERVER)
            .ceil()
            .clamp(1.0, burst.max(1.0));
        let reserved_rate = rate * RESERVED_FOR_APISERVER;
        LookupBudget {
            reserved: TokenBucket::new(reserved_rate, reserved_burst),
            shared: TokenBucket::new(rate - reserved_rate, burst - reserved_burst),
        }
    }

    /// Takes a token for one live lookup by `who`; false when the budget is spent.
    pub fn try_take(&self, who: Requester) -> bool {
        match who {
            Requester::ApiServer => self.reserved.try_take() || self.shared.try_take(),
            Requester::Other => self.shared.try_take(),
        }
    }
}

/// Answers of live lookups, each remembered for a TTL: IDs found missing ([`NegativeCache`]) or
/// leases found ([`FoundCache`]). Bounded: when full, expired entries are dropped first; if it is
/// still full, a new ID is not remembered (its next lookup is live).
pub struct RecentCache<V> {
    ttl: Duration,
    max: usize,
    entries: Mutex<HashMap<String, (Instant, V)>>,
}

/// IDs a live lookup found missing, for [`NEGATIVE_CACHE_TTL`].
pub type NegativeCache = RecentCache<()>;

/// Leases a live lookup found, for [`FOUND_CACHE_TTL`]: kube-apiserver's own reviews at its
/// start all name its new lease, before the watch (broken by the restart) delivers it; without
/// this each of them cost a live GET and the burst ran out on kube-apiserver's own writes.
pub type FoundCache = RecentCache<crate::model::LeaseRecord>;

impl<V: Clone> RecentCache<V> {
    pub fn new(ttl: Duration, max: usize) -> Self {
        RecentCache {
            ttl,
            max,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, V)>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What was remembered of `id` less than the TTL ago.
    pub fn get(&self, id: &str) -> Option<V> {
        self.lock()
            .get(id)
            .filter(|(seen, _)| seen.elapsed() < self.ttl)
            .map(|(_, v)| v.clone())
    }

    /// Remembers `value` for `id` from now.
    pub fn remember(&self, id: &str, value: V) {
        let mut entries = self.lock();
        if entries.len() >= self.max && !entries.contains_key(id) {
            let ttl = self.ttl;
            entries.retain(|_, (seen, _)| seen.elapsed() < ttl);
            if entries.len() >= self.max {
                return;
            }
        }
        entries.insert(id.to_string(), (Instant::now(), value));
    }

    /// Forgets `id`.
    pub fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Entries held now (some may have expired and not been dropped yet).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RecentCache<()> {
    /// True when a live lookup found `id` missing less than the TTL ago.
    pub fn is_missing(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    /// Remembers that a live lookup found `id` missing now.
    pub fn insert(&self, id: &str) {
        self.remember(id, ());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_bucket_gives_its_burst_then_its_rate() {
        let bucket = TokenBucket::new(10.0, 5.0);
        let taken = (0..100).filter(|_| bucket.try_take()).count();
        assert_eq!(taken, 5, "the burst");
        tokio::time::advance(Duration::from_secs(1)).await;
        let taken = (0..100).filter(|_| bucket.try_take()).count();
        assert_eq!(taken, 5, "refilled to the burst, not past it");
        tokio::time::advance(Duration::from_millis(300)).await;
        let taken = (0..100).filter(|_| bucket.try_take()).count();
        assert_eq!(taken, 3, "10 per second for 0.3 s");
    }

    #[tokio::test(start_paused = true)]
    async fn others_can_never_spend_the_apiservers_share() {
        let budget = LookupBudget::new(20.0, 40);
        let others = (0..1000)
            .filter(|_| budget.try_take(Requester::Other))
            .count();
        assert_eq!(others, 30, "three quarters of the burst");
        let apiserver = (0..1000)
            .filter(|_| budget.try_take(Requester::ApiServer))
            .count();
        assert_eq!(apiserver, 10, "its quarter is still there");
        // Ten seconds of a flood: at most the rate, in all.
        let mut total = 0;
        for i in 0..100 {
            tokio::time::advance(Duration::from_millis(100)).await;
            total += (0..1000)
                .filter(|_| budget.try_take(Requester::Other))
                .count();
            if i % 2 == 1 {
                assert!(
                    budget.try_take(Requester::ApiServer),
                    "the apiserver gets a token every 200 ms (its 5 per second) during the flood"
                );
            }
        }
        assert!(
            total <= 150 + 1,
            "{total} lookups by others in 10 s at 15/s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_apiserver_also_draws_on_the_shared_rest() {
        let budget = LookupBudget::new(4.0, 8);
        let apiserver = (0..100)
            .filter(|_| budget.try_take(Requester::ApiServer))
            .count();
        assert_eq!(apiserver, 8);
        assert!(!budget.try_take(Requester::Other));
    }

    #[tokio::test(start_paused = true)]
    async fn the_negative_cache_forgets_after_its_ttl_and_stays_bounded() {
        let cache = NegativeCache::new(Duration::from_secs(5), 3);
        cache.insert("a");
        assert!(cache.is_missing("a"));
        assert!(!cache.is_missing("b"));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!cache.is_missing("a"), "expired");
        cache.insert("b");
        cache.insert("c");
        cache.insert("d"); // "a" expired: dropped to make room
        assert_eq!(cache.len(), 3);
        cache.insert("e"); // full of fresh entries: not remembered
        assert!(!cache.is_missing("e"));
        assert_eq!(cache.len(), 3);
        cache.forget("b");
        assert!(!cache.is_missing("b"));
    }
}
