//! Storage migration trigger (`serve --migrate`): once every apiserver encodes a resource in a
//! new version, and has for `--migrate-settle`, create a `storagemigration.k8s.io/v1`
//! `StorageVersionMigration` for it, so kube-controller-manager's
//! `storage-version-migrator-controller` rewrites its stored objects; then follow it and report
//! the outcome. Only the replica leading the garbage collector's election does this.
//!
//! - [`decide`]: the pure rule (agreement, settle time, last agreed version -> what to do).
//! - [`svm`]: the migration object, its deterministic name, its phase.
//! - [`state`]: the ConfigMap remembering each resource's last agreed version.
//! - [`trigger`]: the work while leading (lists, creates, reports).
//! - [`audit`]: what `audit` says about resources that may still be stored in an older version.
//! - [`args`], [`metrics`].

pub mod args;
pub mod audit;
pub mod decide;
pub mod metrics;
pub mod state;
pub mod svm;
pub mod trigger;

use prometheus_client::registry::Registry;

pub use args::MigrateArgs;
pub use metrics::MigrateMetrics;
pub use trigger::{Trigger, TriggerConfig};

/// The running (or disabled) trigger.
pub type MigrateHandle = crate::leader_task::LeaderTaskHandle;

/// Starts the trigger (if `--migrate`) while `leader` (the garbage collector's election, see
/// [`crate::gc::GcHandle::terms`]) leads. Registers its metrics in any case. Fails when
/// `--migrate` is given without the leader election (`--no-gc`).
pub fn spawn(
    client: kube::Client,
    args: &MigrateArgs,
    gc: &crate::gc::GcArgs,
    leader: &crate::gc::GcHandle,
    registry: &mut Registry,
) -> anyhow::Result<MigrateHandle> {
    let metrics = MigrateMetrics::register(registry);
    crate::leader_task::start("--migrate", args.migrate, gc, leader, || {
        let cfg = TriggerConfig {
            settle: args.migrate_settle,
            interval: args.migrate_interval,
            namespace: gc.leader_lease_namespace(),
            configmap: args.migrate_state_configmap.clone(),
        };
        tracing::info!(
            settle = ?cfg.settle,
            interval = ?cfg.interval,
            state = %format!("{}/{}", cfg.namespace, cfg.configmap),
            "storage migration trigger enabled (runs while this replica leads)"
        );
        let identity = leader.identity().unwrap_or("serve");
        Trigger::new(client, cfg, metrics, identity)
    })
}
