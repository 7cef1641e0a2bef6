//! Storage-migration metrics (prefix `storageversion_webhook_migration`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use crate::gc::metrics::OperationLabels;
pub use crate::metrics::ResultLabels;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// pending, running, succeeded, failed
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// up_to_date, settling, disagree, not_decodable
    pub state: &'static str,
}

/// Every migration metric. Cheap to clone.
#[derive(Clone)]
pub struct MigrateMetrics {
    /// Migrations created (result=created) or found already there (result=exists).
    pub created: Family<ResultLabels, Counter>,
    /// Final outcomes reported (result=succeeded, failed), once per migration.
    pub outcomes: Family<ResultLabels, Counter>,
    /// The migrations this program created, by phase, as last listed.
    pub migrations: Family<PhaseLabels, Gauge>,
    /// StorageVersions by what the trigger thinks of them, as last checked.
    pub resources: Family<StateLabels, Gauge>,
    pub errors: Family<OperationLabels, Counter>,
    /// Creation to final condition, of the migrations whose outcome was reported.
    pub duration: Histogram,
    pub checks: Counter,
}

const DURATION_BUCKETS: &[f64] = &[0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 7200.0];

impl MigrateMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = MigrateMetrics {
            created: Family::default(),
            outcomes: Family::default(),
            migrations: Family::default(),
            resources: Family::default(),
            errors: Family::default(),
            duration: Histogram::new(DURATION_BUCKETS.iter().copied()),
            checks: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("storageversion_webhook_migration");
        r.register(
            "created",
            "StorageVersionMigrations created (result=created) or found already created (result=exists)",
            m.created.clone(),
        );
        r.register(
            "outcomes",
            "Final outcomes of our StorageVersionMigrations, reported once each (result=succeeded, failed)",
            m.outcomes.clone(),
        );
        r.register(
            "migrations",
            "Our StorageVersionMigrations by phase, as last listed by the leader",
            m.migrations.clone(),
        );
        r.register(
            "resources",
            "StorageVersions by migration state (up_to_date, settling, disagree, not_decodable), as last checked by the leader",
            m.resources.clone(),
        );
        r.register(
            "errors",
            "Failed API calls of the migration trigger, by operation",
            m.errors.clone(),
        );
        r.register(
            "duration_seconds",
            "Time from a migration's creation to its final condition",
            m.duration.clone(),
        );
        r.register(
            "checks",
            "Passes over every StorageVersion and migration",
            m.checks.clone(),
        );
        m
    }

    pub fn error(&self, operation: &'static str) {
        self.errors
            .get_or_create(&OperationLabels { operation })
            .inc();
    }
}
