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

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

pub use args::MigrateArgs;
pub use metrics::MigrateMetrics;
pub use trigger::{Trigger, TriggerConfig};

const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);

/// The running (or disabled) trigger.
pub struct MigrateHandle {
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Starts the trigger (if `--migrate`) while `leader` (the garbage collector's election, see
/// [`crate::gc::GcHandle::leading`]) leads. Registers its metrics in any case. Fails when
/// `--migrate` is given without the leader election (`--no-gc`).
pub fn spawn(
    client: kube::Client,
    args: &MigrateArgs,
    gc: &crate::gc::GcArgs,
    leader: &crate::gc::GcHandle,
    registry: &mut Registry,
) -> anyhow::Result<MigrateHandle> {
    let metrics = MigrateMetrics::register(registry);
    let shutdown = CancellationToken::new();
    if !args.migrate {
        return Ok(MigrateHandle {
            shutdown,
            task: None,
        });
    }
    if !gc.enabled() || !leader.is_enabled() {
        anyhow::bail!(
            "--migrate needs the leader election of the garbage collector: drop --no-gc \
             (or use --gc-dry-run to collect nothing)"
        );
    }
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
    let identity = leader.identity().unwrap_or("serve").to_string();
    let trigger = Arc::new(Trigger::new(client, cfg, metrics, &identity));
    let task = tokio::spawn(trigger.run(leader.terms(), shutdown.clone()));
    Ok(MigrateHandle {
        shutdown,
        task: Some(task),
    })
}

impl MigrateHandle {
    /// Stops the trigger (bounded in time).
    pub fn shutdown(mut self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.shutdown.cancel();
        crate::task::join_within(
            self.task.take(),
            SHUTDOWN_TIMEOUT,
            "storage migration trigger",
        )
    }
}

impl Drop for MigrateHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
