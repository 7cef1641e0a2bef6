//! CRD migrator metrics (prefix `storageversion_webhook_crd_migration`). Every label value is
//! one of a fixed set: no CRD names in labels, so the series count does not grow with the cluster.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use crate::gc::metrics::OperationLabels;
pub use crate::metrics::{ResultLabels, StateLabels};

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

crate::metrics::declare! {
    /// Every CRD migrator metric. Cheap to clone.
    #[derive(Clone)]
    pub struct CrdMetrics in "storageversion_webhook_crd_migration" {
        pub started: Family<MethodLabels, Counter> => "started", "CRD migrations begun, by method (svm, rewrite)";
        pub outcomes: Family<OutcomeLabels, Counter> => "outcomes", "CRD migrations ended, by method and result (succeeded, failed, abandoned)";
        /// Objects of our own rewrites, by result: rewritten, gone (deleted since the list),
        /// conflict (changed since the list, so already written in the storage version), failed.
        pub objects: Family<ResultLabels, Counter> => "objects", "Custom resources handled by our own rewrite, by result (rewritten, gone, conflict, failed)";
        /// storedVersions writes: pruned, conflict (the CRD changed since it was read), failed.
        pub prunes: Family<ResultLabels, Counter> => "prunes", "Writes of a CRD's status.storedVersions, by result (pruned, conflict, failed)";
        /// CRDs by state: not_ready, up_to_date, settling, migrating, prune_pending, failed,
        /// no_method.
        pub crds: Family<StateLabels, Gauge> => "crds", "CRDs by migration state, as last looked at by the leader";
        /// Rewrites running now.
        pub running: Gauge => "running", "Our own rewrites running now";
        pub errors: Family<OperationLabels, Counter> => "errors", "Failed API calls of the CRD migrator, by operation";
        pub checks: Counter => "checks", "Passes over every CRD";
    }
}

impl CrdMetrics {
    /// Creates the metrics and registers them in `registry` under
    /// `storageversion_webhook_crd_migration`.
    pub fn register(registry: &mut Registry) -> Self {
        Self::declared(registry)
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
