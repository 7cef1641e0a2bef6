//! Leader election for the garbage collector, on a `coordination.k8s.io/v1` Lease managed by
//! `kube-lease-manager`.
//!
//! The crate acquires, renews and releases the Lease. Around it we add what it does not give:
//! - a *term*: a [`CancellationToken`] handed to the collector when leadership is gained and
//!   cancelled the moment it is lost, so GC work stops at once;
//! - a fence: we watch the Lease ourselves. The leader stands down if the Lease shows another
//!   holder (confirmed by a live GET), or if it could not see its own renewal by half the grace
//!   before expiry (renewals are plain patches without a resourceVersion condition, so we do not
//!   trust a renewal we have not seen);
//! - fast hand-over: a follower that sees the holder cleared (the leader released it on
//!   shutdown) starts a fresh manager at once instead of sleeping until the old expiry;
//! - panic isolation: the crate has a few internal `unwrap`s; the election runs in its own task
//!   and a panic ends the term and restarts the election.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::{GcMetrics, ResultLabels};

/// Where and as whom to run for leader.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    pub lease_name: String,
    pub namespace: String,
    pub identity: String,
    /// Whole seconds, more than `grace`.
    pub duration: Duration,
    /// Whole seconds, at least 1.
    pub grace: Duration,
}

/// How long a term's work may take to stop once its token is cancelled before it is aborted.
const TERM_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long releasing the Lease on shutdown may take.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What we last saw of the leader Lease.
#[derive(Clone, Debug, Default)]
struct Observed {
    /// At least one list or event has been seen.
    seen: bool,
    holder: Option<String>,
    /// When the holder's claim runs out, on our monotonic clock.
    expiry: Option<Instant>,
}

/// What a replica's leadership looks like to the work that needs it: the token of the term that
/// is running (`None` between terms). The token is cancelled the moment the term ends, by the
/// election itself, before it says so on this channel; every leader-only task is fenced by it,
/// the way the collector is.
pub type Terms = watch::Receiver<Option<CancellationToken>>;

/// The leader-term runner of every other leader-only task lives in [`crate::leader_task`].
pub use crate::leader_task::each_term;

/// Runs the election until `shutdown` is cancelled, then releases the Lease if held. While this
/// replica leads, `lead(term)` runs in its own task; `term` is cancelled when leadership ends.
/// `leading` carries the running term's token ([`Terms`]).
pub async fn run<F, Fut>(
    client: kube::Client,
    cfg: LeaderConfig,
    metrics: GcMetrics,
    shutdown: CancellationToken,
    leading: watch::Sender<Option<CancellationToken>>,
    lead: F,
) where
    F: Fn(CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let lead = std::sync::Arc::new(lead);
    loop {
        let election = Election {
            client: client.clone(),
            cfg: cfg.clone(),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
            leading: leading.clone(),
        };
        let lead = std::sync::Arc::clone(&lead);
        let task = tokio::spawn(async move { election.run(move |t| lead(t)).await });
        match task.await {
            Ok(()) => return,
            Err(e) => {
                let _ = leading.send(None);
                metrics.leader.set(0);
                metrics.error("leader_election");
                tracing::error!(error = %e, "GC leader election task failed; restarting it in 1s");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

struct Election {
    client: kube::Client,
    cfg: LeaderConfig,
    metrics: GcMetrics,
    shutdown: CancellationToken,
    leading: watch::Sender<Option<CancellationToken>>,
}

/// A running term. Dropping it (also while unwinding) cancels its work.
struct Term {
    token: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    /// Stand down at this instant unless a renewal is seen first.
    deadline: Instant,
}

impl Drop for Term {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// Why the inner loop of one manager ended.
enum Exit {
    Shutdown,
    /// Rebuild the manager after a backoff (error, or we stood down on our own evidence).
    Retry,
    /// Rebuild the manager now (the Lease was released by its holder).
    Now,
}

impl Election {
    fn lease_api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    async fn run<F, Fut>(self, lead: F)
    where
        F: Fn(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (obs_tx, mut obs) = watch::channel(Observed::default());
        let observer = tokio::spawn(observe(
            self.lease_api(),
            self.cfg.lease_name.clone(),
            self.metrics.clone(),
            obs_tx,
        ));
        let _abort_observer = AbortOnDrop(observer);
        let mut backoff = MIN_BACKOFF;
        tracing::info!(
            lease = %format!("{}/{}", self.cfg.namespace, self.cfg.lease_name),
            identity = %self.cfg.identity,
            "GC leader election started"
        );
        loop {
            let manager = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                m = self.build() => m,
            };
            let manager = match manager {
                Ok(m) => m,
                Err(e) => {
                    self.metrics.error("leader_lease");
                    tracing::warn!(
                        error = %e,
                        lease = %format!("{}/{}", self.cfg.namespace, self.cfg.lease_name),
                        retry_in = ?backoff,
                        "cannot set up the GC leader Lease"
                    );
                    if self.pause(&mut backoff).await {
                        return;
                    }
                    continue;
                }
            };
            // The manager's `changed()` renews the Lease and must never be cancelled half-way
            // (a renewal whose reply is dropped leaves the manager believing its claim is old,
            // so it renews again at once: a tight renewal loop). It runs in its own task; the
            // election only reads what it reports.
            let manager = std::sync::Arc::new(manager);
            let (changes_tx, mut changes) = tokio::sync::mpsc::channel(1);
            let driver = AbortOnDrop(tokio::spawn({
                let manager = std::sync::Arc::clone(&manager);
                async move {
                    loop {
                        let changed = manager.changed().await;
                        let failed = changed.is_err();
                        if changes_tx.send(changed).await.is_err() || failed {
                            return;
                        }
                    }
                }
            }));
            let mut term: Option<Term> = None;
            let exit = self.elect(&mut changes, &mut term, &mut obs, &lead).await;
            drop(driver);
            let was_leading = term.is_some();
            if let Some(t) = term.take() {
                let why = if matches!(exit, Exit::Shutdown) {
                    "released"
                } else {
                    "lost"
                };
                self.stop(t, why).await;
            }
            match exit {
                Exit::Shutdown => {
                    self.release(manager, was_leading).await;
                    return;
                }
                Exit::Now => {
                    backoff = MIN_BACKOFF;
                }
                Exit::Retry => {
                    drop(manager);
                    if was_leading {
                        backoff = MIN_BACKOFF;
                    }
                    if self.pause(&mut backoff).await {
                        return;
                    }
                }
            }
        }
    }

    async fn build(&self) -> kube_lease_manager::Result<LeaseManager> {
        let client = super::release_guard::client(
            self.client.clone(),
            &self.cfg.namespace,
            &self.cfg.lease_name,
            &self.cfg.identity,
        );
        LeaseManagerBuilder::new(client, &self.cfg.lease_name)
            .with_namespace(&self.cfg.namespace)
            .with_identity(&self.cfg.identity)
            .with_duration(self.cfg.duration.as_secs())
            .with_grace(self.cfg.grace.as_secs())
            .with_field_manager(format!("storageversion-webhook-gc-{}", self.cfg.identity))
            .build()
            .await
    }

    /// Sleeps `backoff` (doubling it up to the cap); true if shut down meanwhile.
    async fn pause(&self, backoff: &mut Duration) -> bool {
        let wait = *backoff;
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
        tokio::select! {
            _ = self.shutdown.cancelled() => true,
            _ = tokio::time::sleep(wait) => false,
        }
    }

    /// Follows one manager until it must be rebuilt or we shut down.
    async fn elect<F, Fut>(
        &self,
        changes: &mut tokio::sync::mpsc::Receiver<kube_lease_manager::Result<bool>>,
        term: &mut Option<Term>,
        obs: &mut watch::Receiver<Observed>,
        lead: &F,
    ) -> Exit
    where
        F: Fn(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        // Half the grace: the manager renews `grace` before expiry, and we give that renewal
        // half the grace to be seen before we stop trusting our claim.
        let margin = self.cfg.grace / 2;
        // What the manager last reported: that it holds the Lease. A term starts only on a claim
        // that runs beyond now + margin ([`Self::claim_until`]).
        let mut manager_holds = false;
        loop {
            let deadline = term.as_ref().map(|t| t.deadline);
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Exit::Shutdown,
                _ = sleep_until_opt(deadline) => {
                    // Our watch may be down: ask the API server before giving up the claim.
                    match self.confirm_claim(margin).await {
                        Some(until) if until > Instant::now() => {
                            if let Some(t) = term.as_mut() {
                                t.deadline = until;
                            }
                        }
                        _ => {
                            tracing::warn!(
                                identity = %self.cfg.identity,
                                "GC leader Lease renewal not confirmed in time; standing down"
                            );
                            return Exit::Retry;
                        }
                    }
                }
                changed = changes.recv() => match changed {
                    None => return Exit::Retry,
                    Some(Ok(true)) => {
                        manager_holds = true;
                        if term.is_none() {
                            // Not "the manager just renewed": a manager built anew reports a
                            // Lease that still names us even when that claim has run out.
                            if let Some(deadline) = self.claim_until(obs, margin).await {
                                *term = Some(self.start(deadline, lead));
                            }
                        }
                    }
                    Some(Ok(false)) => {
                        manager_holds = false;
                        if let Some(t) = term.take() {
                            self.stop(t, "lost").await;
                        }
                    }
                    Some(Err(e)) => {
                        self.metrics.error("leader_lease");
                        tracing::warn!(error = %e, "GC leader Lease error; standing down and retrying");
                        return Exit::Retry;
                    }
                },
                changed = obs.changed() => {
                    if changed.is_err() {
                        return Exit::Retry;
                    }
                    let seen = obs.borrow_and_update().clone();
                    if !seen.seen {
                        continue;
                    }
                    match term.as_mut() {
                        Some(t) => {
                            if seen.holder.as_deref() == Some(self.cfg.identity.as_str()) {
                                if let Some(expiry) = seen.expiry {
                                    t.deadline = expiry.checked_sub(margin).unwrap_or(expiry);
                                }
                            } else if !self.still_holder().await {
                                tracing::warn!(
                                    identity = %self.cfg.identity,
                                    holder = ?seen.holder,
                                    "GC leader Lease is held by someone else; standing down"
                                );
                                return Exit::Retry;
                            }
                        }
                        None => {
                            if seen.holder.is_none() {
                                // Released (graceful hand-over) or deleted: try at once rather
                                // than when the old claim would have expired.
                                return Exit::Now;
                            }
                            if manager_holds {
                                // The renewal of a claim that had run out: lead now.
                                if let Some(deadline) = self.claim_until(obs, margin).await {
                                    *term = Some(self.start(deadline, lead));
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Until when (less `margin`) a claim of ours holds beyond now, from the watched Lease or,
    /// failing that, a live GET; `None` when it does not (the claim ran out: wait for the
    /// manager's renewal, which the watch delivers).
    async fn claim_until(
        &self,
        obs: &watch::Receiver<Observed>,
        margin: Duration,
    ) -> Option<Instant> {
        let seen = obs.borrow().clone();
        let now = Instant::now();
        if seen.holder.as_deref() == Some(self.cfg.identity.as_str()) {
            if let Some(until) = seen.expiry.map(|e| e.checked_sub(margin).unwrap_or(e)) {
                if until > now {
                    return Some(until);
                }
            }
        }
        self.confirm_claim(margin)
            .await
            .filter(|until| *until > now)
    }

    /// A live GET: if the Lease names us as holder, until when (less `margin`) our claim holds.
    async fn confirm_claim(&self, margin: Duration) -> Option<Instant> {
        let got = tokio::time::timeout(
            margin.max(Duration::from_millis(200)),
            self.lease_api().get_opt(&self.cfg.lease_name),
        )
        .await;
        let lease = match got {
            Ok(Ok(Some(lease))) => lease,
            _ => return None,
        };
        let seen = observed(&lease);
        if seen.holder.as_deref() != Some(self.cfg.identity.as_str()) {
            return None;
        }
        seen.expiry.map(|e| e.checked_sub(margin).unwrap_or(e))
    }

    /// A live GET: does the Lease still name us as holder? Errors count as no.
    async fn still_holder(&self) -> bool {
        let got = tokio::time::timeout(
            Duration::from_secs(2),
            self.lease_api().get_opt(&self.cfg.lease_name),
        )
        .await;
        match got {
            Ok(Ok(Some(lease))) => {
                lease.spec.and_then(|s| s.holder_identity).as_deref()
                    == Some(self.cfg.identity.as_str())
            }
            _ => false,
        }
    }

    fn start<F, Fut>(&self, deadline: Instant, lead: &F) -> Term
    where
        F: Fn(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let token = self.shutdown.child_token();
        let task = tokio::spawn(lead(token.clone()));
        self.metrics.leader.set(1);
        self.metrics
            .leadership_changes
            .get_or_create(&ResultLabels { result: "acquired" })
            .inc();
        let _ = self.leading.send(Some(token.clone()));
        tracing::info!(identity = %self.cfg.identity, "acquired the GC leader Lease; collecting");
        Term {
            token,
            task: Some(task),
            deadline,
        }
    }

    async fn stop(&self, mut term: Term, why: &'static str) {
        term.token.cancel();
        self.metrics.leader.set(0);
        self.metrics
            .leadership_changes
            .get_or_create(&ResultLabels { result: why })
            .inc();
        let _ = self.leading.send(None);
        tracing::info!(identity = %self.cfg.identity, reason = why, "no longer the GC leader; collection stopped");
        if let Some(mut task) = term.task.take() {
            if tokio::time::timeout(TERM_STOP_TIMEOUT, &mut task)
                .await
                .is_err()
            {
                tracing::warn!("GC work did not stop within {TERM_STOP_TIMEOUT:?}; aborting it");
                task.abort();
            }
        }
    }

    /// Releases the Lease so another replica takes over without waiting for expiry. Runs in its
    /// own task, bounded in time.
    async fn release(&self, manager: std::sync::Arc<LeaseManager>, was_leading: bool) {
        if !was_leading {
            return;
        }
        let task = tokio::spawn(async move { manager.release().await });
        match tokio::time::timeout(RELEASE_TIMEOUT, task).await {
            Ok(Ok(Ok(()))) => tracing::info!(
                lease = %format!("{}/{}", self.cfg.namespace, self.cfg.lease_name),
                "released the GC leader Lease"
            ),
            Ok(Ok(Err(e))) => {
                self.metrics.error("leader_release");
                tracing::warn!(error = %e, "could not release the GC leader Lease; it expires on its own");
            }
            Ok(Err(e)) => {
                self.metrics.error("leader_release");
                tracing::warn!(error = %e, "releasing the GC leader Lease failed");
            }
            Err(_) => {
                self.metrics.error("leader_release");
                tracing::warn!("releasing the GC leader Lease took longer than {RELEASE_TIMEOUT:?}; it expires on its own");
            }
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Watches the leader Lease and publishes who holds it and until when.
async fn observe(api: Api<Lease>, name: String, metrics: GcMetrics, tx: watch::Sender<Observed>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    let mut in_init = false;
    let mut init_seen = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => {
                in_init = true;
                init_seen = false;
            }
            Ok(watcher::Event::InitApply(lease)) => {
                init_seen = true;
                let _ = tx.send(observed(&lease));
            }
            Ok(watcher::Event::InitDone) => {
                if in_init && !init_seen {
                    let _ = tx.send(Observed {
                        seen: true,
                        ..Default::default()
                    });
                }
                in_init = false;
            }
            Ok(watcher::Event::Apply(lease)) => {
                let _ = tx.send(observed(&lease));
            }
            Ok(watcher::Event::Delete(_)) => {
                let _ = tx.send(Observed {
                    seen: true,
                    ..Default::default()
                });
            }
            Err(e) => {
                metrics.error("leader_watch");
                tracing::debug!(error = %e, "GC leader Lease watch failed; retrying");
            }
        }
    }
}

fn observed(lease: &Lease) -> Observed {
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty());
    let expiry = spec.and_then(|s| {
        let renew = s.renew_time.as_ref()?.0;
        let duration = s.lease_duration_seconds?;
        let at = renew
            .checked_add(SignedDuration::from_secs(i64::from(duration)))
            .ok()?;
        Some(instant_of(at))
    });
    Observed {
        seen: true,
        holder,
        expiry,
    }
}

/// A wall-clock time as an instant on the monotonic clock.
fn instant_of(at: Timestamp) -> Instant {
    let now = Instant::now();
    let ahead = at.duration_since(Timestamp::now());
    if ahead.is_negative() {
        let behind = Duration::try_from(ahead.abs()).unwrap_or(Duration::ZERO);
        now.checked_sub(behind).unwrap_or(now)
    } else {
        now + Duration::try_from(ahead).unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed_ago_s: i64, duration: Option<i32>) -> Lease {
        let renew = Timestamp::now()
            .checked_sub(SignedDuration::from_secs(renewed_ago_s))
            .unwrap();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "l", "namespace": "default"},
            "spec": {
                "holderIdentity": holder,
                "renewTime": renew.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
                "leaseDurationSeconds": duration,
            }
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn observing_the_leader_lease() {
        let o = observed(&lease(Some("me"), 5, Some(15)));
        assert!(o.seen);
        assert_eq!(o.holder.as_deref(), Some("me"));
        let left = o.expiry.unwrap().saturating_duration_since(Instant::now());
        assert!(
            left > Duration::from_secs(8) && left <= Duration::from_secs(10),
            "{left:?}"
        );

        // Expired a while ago: an instant in the past.
        let o = observed(&lease(Some("me"), 60, Some(15)));
        assert!(o.expiry.unwrap() <= Instant::now());

        // Released: no holder (an empty holder counts as none), no expiry without a duration.
        let o = observed(&lease(Some(""), 1, None));
        assert_eq!(o.holder, None);
        assert_eq!(o.expiry, None);
    }
}
