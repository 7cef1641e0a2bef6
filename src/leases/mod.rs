//! The lease view (docs/design.md §4): what the live-lease rule knows about identity Leases.
//!
//! [`LeaseView`] is the small seam between admission and the cluster. The cluster-backed view is
//! [`kube_view::KubeLeaseView`], reading the process's one identity-lease watch
//! ([`store::LeaseStore`], shared with the garbage collector); [`StaticLeases`] is an in-memory store for unit tests and `check`.

use std::collections::BTreeMap;

use futures::future::BoxFuture;

use crate::model::{LeaseLookup, LeaseRecord};

/// Answers "what is the identity lease of this apiServerID?".
pub trait LeaseView: Send + Sync {
    /// Looks up the lease named `id` in `kube-system`. Must not fail: errors are
    /// [`LeaseLookup::Failed`], which never leads to a denial.
    fn lookup<'a>(&'a self, id: &'a str) -> BoxFuture<'a, LeaseLookup>;

    /// [`LeaseView::lookup`] on behalf of `who`: a view with a budget for live lookups keeps a
    /// share of it for kube-apiserver's own reviews ([`budget::LookupBudget`]). The default
    /// ignores who asks.
    fn lookup_as<'a>(&'a self, id: &'a str, who: Requester) -> BoxFuture<'a, LeaseLookup> {
        let _ = who;
        self.lookup(id)
    }

    /// The answer [`LeaseView::lookup`] would give, when the view has it at hand without I/O (a
    /// hit in a synced cache); `None` when only `lookup` can answer. Reviews ask this first, so
    /// the common case costs no boxed future.
    fn cached(&self, _id: &str) -> Option<LeaseLookup> {
        None
    }
}

/// A fixed set of leases, keyed by name. Anything absent is `NotFound`.
#[derive(Clone, Debug, Default)]
pub struct StaticLeases {
    leases: BTreeMap<String, LeaseRecord>,
}

impl StaticLeases {
    pub fn new(records: impl IntoIterator<Item = LeaseRecord>) -> Self {
        StaticLeases {
            leases: records.into_iter().map(|r| (r.name.clone(), r)).collect(),
        }
    }

    pub fn get(&self, id: &str) -> LeaseLookup {
        match self.leases.get(id) {
            Some(r) => LeaseLookup::Found(r.clone()),
            None => LeaseLookup::NotFound,
        }
    }
}

impl LeaseView for StaticLeases {
    fn lookup<'a>(&'a self, id: &'a str) -> BoxFuture<'a, LeaseLookup> {
        let found = self.get(id);
        Box::pin(async move { found })
    }

    fn cached(&self, id: &str) -> Option<LeaseLookup> {
        Some(self.get(id))
    }
}

pub mod budget;
pub mod coalesce;
/// Lease names are DNS-1123 subdomains: anything else cannot exist (and is never put in a URL).
pub use crate::rules::names::is_dns1123_subdomain as could_be_lease_name;
pub use budget::Requester;

mod kube_view;
mod set;
pub mod store;
pub use kube_view::{KubeLeaseView, DEFAULT_LOOKUP_BURST, DEFAULT_LOOKUP_RATE};
pub use set::{LeaseChange, LeaseSet};
pub use store::{LeaseStore, StoreEvent};
