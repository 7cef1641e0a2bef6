//! The inputs of a term: the StorageVersion watch that feeds the store, the lease store's
//! changes, and the sweep timer. Each wakes the pass loop; none makes an API call but the watch.
//!
//! Invariant I2 (docs/gc.md), the grace counts from the latest absence: a suspect whose lease
//! the lease watch delivers back is forgotten at once ([`Term::follow_leases`]), so its next
//! absence waits the whole grace again, even if it goes before the next pass. A lease deletion is
//! followed up even when no object names it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector;
use kube::runtime::{watcher, WatchStreamExt};
use tokio::time::Instant;

use super::observe::Suspect;
use super::{lock, Term};
use crate::gc::stored::StoredSv;
use crate::leases::{LeaseChange, StoreEvent};

impl Term {
    /// Feeds the StorageVersion store (a paginated list, then watch events) and wakes the loop.
    pub(super) async fn watch_storage_versions(
        self: Arc<Self>,
        writer: reflector::store::Writer<StoredSv>,
    ) {
        let events = watcher(self.c.svs.clone(), watcher::Config::default())
            .modify(|sv| *sv = std::mem::take(sv).trim())
            .default_backoff()
            .reflect(writer);
        let mut events = std::pin::pin!(events);
        // Said once per term: a cluster without the StorageVersion API is a normal cluster.
        let mut said_missing = false;
        while let Some(Some(event)) = self.cancellable(events.next()).await {
            match event {
                Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) if s.code == 404 => {
                    self.c.metrics.storageversion_api_missing.set(1);
                    if !said_missing {
                        said_missing = true;
                        // The store holds what the cluster serves, nothing: the report may
                        // judge from it (its CRD findings still count).
                        self.changes.send_modify(|n| *n = n.wrapping_add(1));
                        tracing::warn!(
                            "the StorageVersion API (internal.apiserver.k8s.io/v1alpha1) is not \
                             served: built-in storage versions are not visible on this cluster \
                             (kube-apiserver needs --feature-gates=StorageVersionAPI=true and \
                             --runtime-config=internal.apiserver.k8s.io/v1alpha1=true); nothing \
                             to collect until it is; the CRD migrator works regardless"
                        );
                    }
                }
                Ok(watcher::Event::Init) | Ok(watcher::Event::InitApply(_)) => {}
                Ok(watcher::Event::InitDone) => {
                    self.c.metrics.storageversion_api_missing.set(0);
                    // The list's pages are decoded and dropped: hand their memory back.
                    crate::memory::release_free();
                    self.wake.notify_one();
                    self.changes.send_modify(|n| *n = n.wrapping_add(1));
                }
                Ok(_) => {
                    self.wake.notify_one();
                    self.changes.send_modify(|n| *n = n.wrapping_add(1));
                }
                Err(e) => {
                    self.c.metrics.error("watch_storage_versions");
                    tracing::warn!(error = %e, "StorageVersion watch failed; retrying");
                }
            }
        }
    }

    /// Lease deletions become suspects to follow up; a lease that is back wakes the loop.
    pub(super) async fn follow_leases(
        self: Arc<Self>,
        mut changes: tokio::sync::broadcast::Receiver<StoreEvent>,
    ) {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            let event = match self.cancellable(changes.recv()).await {
                None | Some(Err(RecvError::Closed)) => return,
                Some(Err(RecvError::Lagged(_))) => {
                    // Missed changes: the next pass reads the whole store anyway.
                    self.wake.notify_one();
                    continue;
                }
                Some(Ok(event)) => event,
            };
            match event {
                StoreEvent::WatchFailed(_) => self.c.metrics.error("watch_leases"),
                StoreEvent::Changed(change) => match &*change {
                    LeaseChange::Deleted(name) => {
                        self.c.metrics.lease_event("deleted");
                        self.follow_up(name);
                    }
                    LeaseChange::Listed { vanished } => {
                        self.c.metrics.lease_event("listed");
                        for name in vanished {
                            self.c.metrics.lease_event("vanished");
                            self.follow_up(name);
                        }
                        self.wake.notify_one();
                    }
                    LeaseChange::Applied(name) => {
                        // A suspect that is back is forgotten now, so that its next absence
                        // waits the whole grace again (even if it goes before the next pass).
                        // With the expired-lease grace, any change of a lease may move when it
                        // expires (a renewTime set back), so the next pass recomputes its
                        // wake-up from the store.
                        let was_suspect = lock(&self.state).suspects.contains_key(name);
                        if was_suspect && self.looks_live(name) {
                            lock(&self.state).suspects.remove(name);
                        }
                        if self.c.cfg.expired_grace.is_some() || was_suspect {
                            self.wake.notify_one();
                        }
                    }
                    LeaseChange::None => {}
                },
            }
        }
    }

    fn follow_up(&self, name: &str) {
        let now = Instant::now();
        lock(&self.state)
            .suspects
            .entry(name.to_string())
            .or_insert_with(|| Suspect::new(now))
            .follow_up = true;
        self.wake.notify_one();
    }

    /// Asks for a full sweep on gaining leadership (set at start) and every resync interval.
    pub(super) async fn sweeper(self: Arc<Self>) {
        loop {
            let sleep = tokio::time::sleep(self.c.cfg.resync_interval);
            if self.cancellable(sleep).await.is_none() {
                return;
            }
            self.sweep_due.store(true, Ordering::Release);
            self.wake.notify_one();
        }
    }
}
