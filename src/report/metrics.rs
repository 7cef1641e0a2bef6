//! Report metrics (prefix `storageversion_webhook_report`). Every label value comes from a fixed
//! set.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use crate::gc::metrics::OperationLabels;
pub use crate::metrics::ResultLabels;

use super::types::{Status, Summary};

crate::metrics::declare! {
    /// Every report metric. Cheap to clone.
    #[derive(Clone)]
    pub struct ReportMetrics in "storageversion_webhook_report" {
        /// Applies of the report: result=applied, crd_missing, error.
        pub writes: Family<ResultLabels, Counter> => "writes", "Server-side applies of the ClusterReport (result=applied, crd_missing, error)";
        /// Failed API calls by operation (apply, list_leases, read_migrations).
        pub errors: Family<OperationLabels, Counter> => "errors", "Failed API calls of the report, by operation (apply, list_leases, read_migrations)";
        /// Findings by status (pass: StorageVersions without any), as last judged by the leader;
        /// 0 on other replicas.
        pub results: Family<ResultLabels, Gauge> => "results", "Findings by result (pass counts StorageVersions without one), as last judged by the leader; 0 elsewhere";
        /// Findings left out of the report's results, as last judged.
        pub omitted: Gauge => "omitted_results", "Findings counted in the summary but not listed (over --report-max-results or the size bound)";
        /// Judgements made (each may or may not write).
        pub judgements: Counter => "judgements", "Judgements of every StorageVersion made for the report (a write follows only a change)";
    }
}

impl ReportMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::declared(registry);
        for s in Status::ALL {
            m.results
                .get_or_create(&ResultLabels { result: s.as_str() })
                .set(0);
        }
        m
    }

    pub fn error(&self, operation: &'static str) {
        self.errors
            .get_or_create(&OperationLabels { operation })
            .inc();
    }

    pub fn write(&self, result: &'static str) {
        self.writes.get_or_create(&ResultLabels { result }).inc();
    }

    /// Sets the results gauges (`None`: not leading, all 0).
    pub fn judged(&self, summary: Option<&Summary>, omitted: usize) {
        let s = summary.copied().unwrap_or_default();
        for (status, n) in [
            (Status::Pass, s.pass),
            (Status::Fail, s.fail),
            (Status::Warn, s.warn),
            (Status::Error, s.error),
            (Status::Skip, s.skip),
        ] {
            self.results
                .get_or_create(&ResultLabels {
                    result: status.as_str(),
                })
                .set(n);
        }
        self.omitted.set(i64::try_from(omitted).unwrap_or(i64::MAX));
    }
}
