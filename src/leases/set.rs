//! The identity leases a watch has seen: one place that folds kube-runtime watcher events
//! (including the relist after a broken watch) into a map, used by the lease view and by the
//! garbage collector.

use std::collections::HashMap;

use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::watcher;

use crate::model::LeaseRecord;

#[derive(Debug, Default)]
pub struct LeaseSet {
    leases: HashMap<String, LeaseRecord>,
    /// Leases being listed after an `Init`, swapped in at `InitDone`.
    relist: Option<HashMap<String, LeaseRecord>>,
    synced: bool,
}

/// What one watcher event changed.
#[derive(Debug, PartialEq, Eq)]
pub enum LeaseChange {
    /// Nothing visible yet (a relist in progress).
    None,
    /// A full list completed. `vanished` are leases present before that the relist no longer
    /// has: deleted while the watch was down, so their deletion event was never seen (only after
    /// the first list; empty on the first one).
    Listed { vanished: Vec<String> },
    /// A lease was added or modified.
    Applied(String),
    /// A lease was deleted, or stopped matching the watch's label selector.
    Deleted(String),
}

impl LeaseSet {
    /// True once a full list has completed.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    pub fn get(&self, name: &str) -> Option<&LeaseRecord> {
        self.leases.get(name)
    }

    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    pub fn records(&self) -> impl Iterator<Item = &LeaseRecord> {
        self.leases.values()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.leases.keys().map(String::as_str)
    }

    /// Folds one watcher event in.
    pub fn apply(&mut self, event: watcher::Event<Lease>) -> LeaseChange {
        match event {
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                LeaseChange::None
            }
            watcher::Event::InitApply(lease) => {
                let record = LeaseRecord::from_lease(&lease);
                match self.relist.as_mut() {
                    Some(relist) => {
                        relist.insert(record.name.clone(), record);
                        LeaseChange::None
                    }
                    None => {
                        let name = record.name.clone();
                        self.leases.insert(name.clone(), record);
                        LeaseChange::Applied(name)
                    }
                }
            }
            watcher::Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.leases, listed);
                let vanished = if self.synced {
                    old.into_keys()
                        .filter(|k| !self.leases.contains_key(k))
                        .collect()
                } else {
                    Vec::new()
                };
                self.synced = true;
                LeaseChange::Listed { vanished }
            }
            watcher::Event::Apply(lease) => {
                let record = LeaseRecord::from_lease(&lease);
                let name = record.name.clone();
                self.leases.insert(name.clone(), record);
                LeaseChange::Applied(name)
            }
            watcher::Event::Delete(lease) => match lease.metadata.name {
                Some(name) => {
                    self.leases.remove(&name);
                    LeaseChange::Deleted(name)
                }
                None => LeaseChange::None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some(name.to_string());
        l
    }

    #[test]
    fn relist_swaps_in_and_reports_what_vanished() {
        let mut set = LeaseSet::default();
        assert_eq!(set.apply(watcher::Event::Init), LeaseChange::None);
        assert_eq!(
            set.apply(watcher::Event::InitApply(lease("a"))),
            LeaseChange::None
        );
        assert!(
            !set.is_synced() && set.is_empty(),
            "nothing visible before InitDone"
        );
        assert_eq!(
            set.apply(watcher::Event::InitDone),
            LeaseChange::Listed { vanished: vec![] }
        );
        assert!(set.is_synced() && set.get("a").is_some());
        assert_eq!(
            set.apply(watcher::Event::Apply(lease("b"))),
            LeaseChange::Applied("b".into())
        );
        // The watch broke; the relist no longer has "a".
        set.apply(watcher::Event::Init);
        set.apply(watcher::Event::InitApply(lease("b")));
        assert!(set.get("a").is_some(), "old view kept while relisting");
        assert_eq!(
            set.apply(watcher::Event::InitDone),
            LeaseChange::Listed {
                vanished: vec!["a".to_string()]
            }
        );
        assert_eq!(set.len(), 1);
        assert_eq!(
            set.apply(watcher::Event::Delete(lease("b"))),
            LeaseChange::Deleted("b".into())
        );
        assert!(set.is_empty());
    }
}
