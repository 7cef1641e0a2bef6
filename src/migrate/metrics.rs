//! Storage-migration metrics (prefix `storageversion_webhook_migration`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use crate::gc::metrics::OperationLabels;
pub use crate::metrics::{ResultLabels, StateLabels};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// pending, running, succeeded, failed
    pub phase: &'static str,
}

crate::metrics::declare! {
    /// Every migration metric. Cheap to clone.
    #[derive(Clone)]
    pub struct MigrateMetrics in "storageversion_webhook_migration" {
        /// Migrations created (result=created) or found already there (result=exists).
        pub created: Family<ResultLabels, Counter> => "created", "StorageVersionMigrations created (result=created) or found already created (result=exists)";
        /// Final outcomes reported (result=succeeded, failed), once per migration.
        pub outcomes: Family<ResultLabels, Counter> => "outcomes", "Final outcomes of our StorageVersionMigrations, reported once each (result=succeeded, failed)";
        /// The migrations this program created, by phase, as last listed.
        pub migrations: Family<PhaseLabels, Gauge> => "migrations", "Our StorageVersionMigrations by phase, as last listed by the leader";
        /// StorageVersions by what the trigger thinks of them, as last checked.
        pub resources: Family<StateLabels, Gauge> => "resources", "StorageVersions by migration state (up_to_date, settling, disagree, not_decodable), as last checked by the leader";
        pub errors: Family<OperationLabels, Counter> => "errors", "Failed API calls of the migration trigger, by operation";
        /// Creation to final condition, of the migrations whose outcome was reported.
        pub duration: Histogram = Histogram::new(DURATION_BUCKETS.iter().copied()) => "duration_seconds", "Time from a migration's creation to its final condition";
        pub checks: Counter => "checks", "Passes over every StorageVersion and migration";
    }
}

const DURATION_BUCKETS: &[f64] = &[0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 7200.0];

impl MigrateMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        Self::declared(registry)
    }

    pub fn error(&self, operation: &'static str) {
        self.errors
            .get_or_create(&OperationLabels { operation })
            .inc();
    }
}
