//! The policy report (`serve --report`, docs/report.md): while this replica leads the garbage
//! collector's election, keep one OpenReports `ClusterReport` (`openreports.io/v1alpha1`) with a
//! result per finding of `audit` (StorageVersions, and CRDs with `--crd-migrate`), bounded in size, updated within a second or so
//! of a change and at every resync.
//!
//! - [`types`]: the ClusterReport wire types.
//! - [`build`]: the pure mapping of `audit`'s judgement to results (order, bounds, summary).
//! - [`writer`]: the work while leading (inputs, debounce, server-side apply, backoff).
//! - [`args`], [`metrics`].

pub mod args;
pub mod build;
pub mod metrics;
pub mod types;
pub mod writer;

use std::time::Duration;

use prometheus_client::registry::Registry;

pub use args::ReportArgs;
pub use metrics::ReportMetrics;
pub use writer::{ReportConfig, Reporter};

/// The running (or disabled) report.
pub type ReportHandle = crate::leader_task::LeaderTaskHandle;

/// What [`spawn`] needs from the rest of `serve`.
pub struct ReportInputs<'a> {
    pub gc: &'a crate::gc::GcArgs,
    pub leader: &'a crate::gc::GcHandle,
    pub leases: crate::leases::LeaseStore,
    pub migrate: &'a crate::migrate::MigrateArgs,
    pub crd: &'a crate::crd::CrdArgs,
    pub lease_skew_allowance: Duration,
}

/// Starts the report (if `--report`) while the garbage collector's election leads. Registers
/// its metrics in any case. Fails when `--report` is given without the leader election
/// (`--no-gc`).
pub fn spawn(
    client: kube::Client,
    args: &ReportArgs,
    inputs: ReportInputs<'_>,
    registry: &mut Registry,
) -> anyhow::Result<ReportHandle> {
    let metrics = ReportMetrics::register(registry);
    crate::leader_task::start("--report", args.report, inputs.gc, inputs.leader, || {
        let cfg = ReportConfig {
            name: args.report_name.clone(),
            max_results: args.report_max_results,
            resync_interval: args.report_resync_interval,
            lease_skew_allowance: inputs.lease_skew_allowance,
            gc_expired_lease_grace: inputs.gc.gc_expired_lease_grace,
            migrate_state: inputs.migrate.migrate.then(|| {
                (
                    inputs.gc.leader_lease_namespace(),
                    inputs.migrate.migrate_state_configmap.clone(),
                )
            }),
            crd_state: inputs.crd.crd_migrate.then(|| {
                (
                    inputs.gc.leader_lease_namespace(),
                    inputs.crd.crd_migrate_state_configmap.clone(),
                )
            }),
        };
        tracing::info!(
            report = %cfg.name,
            max_results = cfg.max_results,
            resync_interval = ?cfg.resync_interval,
            migration_findings = cfg.migrate_state.is_some(),
            crd_findings = cfg.crd_state.is_some(),
            "policy report enabled (ClusterReport openreports.io/v1alpha1; written while this replica leads)"
        );
        Reporter::new(
            client,
            cfg,
            metrics,
            inputs.leases,
            inputs.leader.storage_versions(),
        )
    })
}
