//! Step 3 of a pass: one live GET per due lease ([`Term::confirm`]), right before the writes
//! that act on it, and the GETs again after a conflict's re-read ([`Term::reconfirm`]).
//!
//! Invariant I1 (docs/gc.md): an entry written by an apiserver after its lease's latest creation
//! is never removed while that lease exists. The GET is a quorum read sent after the pass took
//! its snapshot of the store, so every entry of the copies acted on was written before it; a
//! lease that exists later was created after the GET, so after those entries. A copy refused with
//! 409 is read again and its leases are confirmed again after that read. A lookup that fails, or
//! a lease that is back, removes nothing.
//!
//! Invariant I6 (API calls per event): one GET per due lease; after a 409, one GET per confirmed
//! lease the fresh copy still names.

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::{backoff, lock, Term};
use crate::gc::plan::{self, LeaseState, Reason};
use crate::gc::stored::StoredSv;
use crate::leases::could_be_lease_name;
use crate::model::{LeaseLookup, LeaseRecord, IDENTITY_LEASE_NAMESPACE};

impl Term {
    /// Step 3: one live GET per due lease. Returns the IDs still gone, with why; forgets the
    /// ones that are back; backs off the ones whose lookup failed.
    pub(super) async fn confirm(&self, due: &[String]) -> Option<BTreeMap<String, Reason>> {
        let concurrency = self.c.cfg.concurrency.max(1);
        let looked: Vec<(String, LeaseLookup)> = futures::stream::iter(due.iter().cloned())
            .map(|id| async move {
                let lookup = self.lookup(&id).await;
                lookup.map(|l| (id, l))
            })
            .buffer_unordered(concurrency)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Option<_>>()?;
        let now = Timestamp::now();
        let mut confirmed = BTreeMap::new();
        for (id, lookup) in looked {
            let state = plan::judge_lease(&lookup, now, self.c.cfg.expired_grace);
            match (&state, state.reason()) {
                (LeaseState::Unknown(e), _) => {
                    tracing::warn!(apiserver = %id, error = %e, "cannot judge identity lease; entries kept");
                    for _ in self.names_of(&id) {
                        self.c.metrics.check("error");
                    }
                    self.retry_later(&id);
                }
                (_, Some(reason)) => {
                    confirmed.insert(id, reason);
                }
                (_, None) => {
                    // Back (or never gone): keep every entry.
                    lock(&self.state).suspects.remove(&id);
                }
            }
        }
        Some(confirmed)
    }

    /// A live GET of lease `id` (`None` if the term ended).
    pub(super) async fn lookup(&self, id: &str) -> Option<LeaseLookup> {
        if !could_be_lease_name(id) {
            self.c.metrics.lease_check("absent");
            return Some(LeaseLookup::NotFound);
        }
        let got = self
            .call("GET lease", self.c.leases.api().get_opt(id))
            .await?;
        Some(match got {
            Ok(Some(lease)) => {
                self.c.metrics.lease_check("present");
                LeaseLookup::Found(LeaseRecord::from_lease(&lease))
            }
            Ok(None) => {
                self.c.metrics.lease_check("absent");
                LeaseLookup::NotFound
            }
            Err(e) => {
                self.c.metrics.lease_check("error");
                self.c.metrics.error("get_lease");
                LeaseLookup::Failed(format!("GET lease {IDENTITY_LEASE_NAMESPACE}/{id}: {e}"))
            }
        })
    }

    pub(super) fn retry_later(&self, id: &str) {
        let now = Instant::now();
        if let Some(s) = lock(&self.state).suspects.get_mut(id) {
            s.failures = s.failures.saturating_add(1);
            s.retry_at = Some(now + backoff(s.failures));
        }
    }

    /// Names of the stored objects with an entry of `id`.
    fn names_of(&self, id: &str) -> Vec<String> {
        self.svs
            .state()
            .iter()
            .filter(|sv| {
                sv.status
                    .known
                    .storage_versions
                    .iter()
                    .any(|e| e.api_server_id == id)
            })
            .map(|sv| sv.name().to_string())
            .collect()
    }

    /// After a re-read: one live GET per confirmed lease that `fresh` still names, each after
    /// the read. Returns those still gone (`Some(None)`: a lookup failed, try at a later pass;
    /// `None`: the term ended). A lease that is back is no longer a suspect.
    pub(super) async fn reconfirm(
        &self,
        fresh: &StoredSv,
        confirmed: &BTreeMap<String, Reason>,
    ) -> Option<Option<BTreeMap<String, Reason>>> {
        let named: BTreeSet<&str> = fresh
            .status
            .known
            .storage_versions
            .iter()
            .map(|e| e.api_server_id.as_str())
            .filter(|id| confirmed.contains_key(*id))
            .collect();
        let mut still = BTreeMap::new();
        for id in named {
            let lookup = self.lookup(id).await?;
            let state = plan::judge_lease(&lookup, Timestamp::now(), self.c.cfg.expired_grace);
            match (&state, state.reason()) {
                (LeaseState::Unknown(e), _) => {
                    tracing::warn!(apiserver = %id, error = %e, "cannot judge identity lease after a conflict; entries kept");
                    return Some(None);
                }
                (_, Some(reason)) => {
                    still.insert(id.to_string(), reason);
                }
                (_, None) => {
                    tracing::info!(apiserver = %id, storageversion = fresh.name(), "identity lease is back; its entries are kept");
                    lock(&self.state).suspects.remove(id);
                }
            }
        }
        Some(Some(still))
    }
}
