//! Garbage-collector metrics (prefix `storageversion_webhook_gc`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use crate::metrics::ResultLabels;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// lease-missing, lease-not-apiserver, lease-expired
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// update_status or delete
    pub operation: &'static str,
    /// ok, conflict, not_found, error
    pub result: &'static str,
}

crate::metrics::declare! {
    /// Every GC metric. Cheap to clone.
    #[derive(Clone)]
    pub struct GcMetrics in "storageversion_webhook_gc" {
        /// Entries whose apiserver's identity lease is missing, not an apiserver's, or expired, as
        /// the leader sees them in its stores (0 on a replica that does not lead).
        pub stale_entries: Gauge => "stale_entries", "StorageVersion entries whose apiserver's identity lease is missing, not an apiserver's, or expired, as the leader's stores show them now (before any grace; 0 on replicas that do not lead)";
        /// 1 while the leader's StorageVersion list answers 404 (the API is not served).
        pub storageversion_api_missing: Gauge => "storageversion_api_missing", "1 while the leader finds the StorageVersion API (internal.apiserver.k8s.io/v1alpha1) not served: a cluster without the StorageVersionAPI gate, where built-in storage versions are not visible (the CRD migrator works regardless), else 0";
        /// StorageVersions being checked or written right now.
        pub in_flight: Gauge => "in_flight", "StorageVersions being checked or written right now";
        /// The most StorageVersions ever checked or written at once (bounded by `--gc-concurrency`).
        pub in_flight_peak: Gauge => "in_flight_peak", "The most StorageVersions checked or written at once since start (at most --gc-concurrency)";
        pub entries_removed: Family<ReasonLabels, Counter> => "entries_removed", "StorageVersion entries removed, by why their apiserver counts as gone";
        pub objects_deleted: Counter => "objects_deleted", "StorageVersions deleted because no entry was left";
        pub writes: Family<WriteLabels, Counter> => "writes", "Writes sent to the API server (status updates and deletes), by result";
        pub errors: Family<OperationLabels, Counter> => "errors", "Failed API calls and watch errors, by operation";
        pub leader: Gauge => "leader", "1 while this replica holds the GC leader Lease and collects, else 0";
        pub leadership_changes: Family<ResultLabels, Counter> => "leadership_changes", "Leadership gained (result=acquired) and given up (result=lost, released)";
        pub sweep_duration: Histogram = Histogram::new(SWEEP_BUCKETS.iter().copied()) => "sweep_duration_seconds", "Time for one full sweep of every StorageVersion";
        pub sweeps: Counter => "sweeps", "Full sweeps completed";
        pub checks: Family<ResultLabels, Counter> => "checks", "StorageVersion checks by result (unchanged, rewritten, deleted, waiting, would_rewrite, would_delete, gone, given_back, error, cancelled)";
        pub lease_checks: Family<ResultLabels, Counter> => "lease_checks", "Identity lease deletions (and expiries) followed up, by what the live GET found (present, absent, error)";
        pub dry_run_changes: Family<ResultLabels, Counter> => "dry_run_changes", "Changes --gc-dry-run did not make (result=rewrite, delete)";
        pub lease_events: Family<EventLabels, Counter> => "lease_events", "Identity lease watch events the leader saw: deleted, vanished (gone at a relist), listed (a full list)";
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// deleted (watch event), vanished (missing after a relist), listed (relist done)
    pub event: &'static str,
}

const SWEEP_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

impl GcMetrics {
    /// Creates the metrics and registers them in `registry` under `storageversion_webhook_gc`.
    pub fn register(registry: &mut Registry) -> Self {
        Self::declared(registry)
    }

    pub fn lease_event(&self, event: &'static str) {
        self.lease_events
            .get_or_create(&EventLabels { event })
            .inc();
    }

    pub fn error(&self, operation: &'static str) {
        self.errors
            .get_or_create(&OperationLabels { operation })
            .inc();
    }

    pub fn check(&self, result: &'static str) {
        self.checks.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn lease_check(&self, result: &'static str) {
        self.lease_checks
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    pub fn write(&self, operation: &'static str, result: &'static str) {
        self.writes
            .get_or_create(&WriteLabels { operation, result })
            .inc();
    }
}

/// Counts one StorageVersion in flight while it lives (see [`GcMetrics::in_flight`]).
pub struct InFlight(Gauge);

impl InFlight {
    pub fn start(metrics: &GcMetrics) -> InFlight {
        let now = metrics.in_flight.inc() + 1;
        metrics
            .in_flight_peak
            .inner()
            .fetch_max(now, std::sync::atomic::Ordering::Relaxed);
        InFlight(metrics.in_flight.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
