//! CRD migrator metrics (prefix `storageversion_webhook_crd_migration`). Every label value is
//! one of a fixed set: no CRD names in labels, so the series count does not grow with the cluster.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use crate::gc::metrics::OperationLabels;
pub use crate::metrics::ResultLabels;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// svm, rewrite
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub method: &'static str,
    /// succeeded, failed, abandoned
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// not_ready, up_to_date, settling, migrating, prune_pending, failed, no_method
    pub state: &'static str,
}

/// Every CRD migrator metric. Cheap to clone.
#[derive(Clone)]
pub struct CrdMetrics {
    pub started: Family<MethodLabels, Counter>,
    pub outcomes: Family<OutcomeLabels, Counter>,
    /// Objects of our own rewrites, by result: rewritten, gone (deleted since the list),
    /// conflict (changed since the list, so already written in the storage version), failed.
    pub objects: Family<ResultLabels, Counter>,
    /// storedVersions writes: pruned, conflict (the CRD changed since it was read), failed.
    pub prunes: Family<ResultLabels, Counter>,
    pub crds: Family<StateLabels, Gauge>,
    /// Rewrites running now.
    pub running: Gauge,
    pub errors: Family<OperationLabels, Counter>,
    pub checks: Counter,
}

impl CrdMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = CrdMetrics {
            started: Family::default(),
            outcomes: Family::default(),
            objects: Family::default(),
            prunes: Family::default(),
            crds: Family::default(),
            running: Gauge::default(),
            errors: Family::default(),
            checks: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("storageversion_webhook_crd_migration");
        r.register(
            "started",
            "CRD migrations begun, by method (svm, rewrite)",
            m.started.clone(),
        );
        r.register(
            "outcomes",
            "CRD migrations ended, by method and result (succeeded, failed, abandoned)",
            m.outcomes.clone(),
        );
        r.register(
            "objects",
            "Custom resources handled by our own rewrite, by result (rewritten, gone, conflict, failed)",
            m.objects.clone(),
        );
        r.register(
            "prunes",
            "Writes of a CRD's status.storedVersions, by result (pruned, conflict, failed)",
            m.prunes.clone(),
        );
        r.register(
            "crds",
            "CRDs by migration state, as last looked at by the leader",
            m.crds.clone(),
        );
        r.register("running", "Our own rewrites running now", m.running.clone());
        r.register(
            "errors",
            "Failed API calls of the CRD migrator, by operation",
            m.errors.clone(),
        );
        r.register("checks", "Passes over every CRD", m.checks.clone());
        m
    }

    pub fn error(&self, operation: &'static str) {
        self.errors
            .get_or_create(&OperationLabels { operation })
            .inc();
    }

    pub fn object(&self, result: &'static str) {
        self.objects.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn prune(&self, result: &'static str) {
        self.prunes.get_or_create(&ResultLabels { result }).inc();
    }
}
