//! The CRD migrator (`serve --crd-migrate`, docs/crd.md): for every Established
//! CustomResourceDefinition whose `status.storedVersions` lists a version besides its storage
//! version, once the CRD has held still for `--crd-migrate-settle`, migrate its objects to the
//! storage version (a StorageVersionMigration where the API is served, else our own rewrite),
//! then make storedVersions exactly `[storage version]`. Only the replica leading the garbage
//! collector's election does this.
//!
//! - [`decide`]: the pure decision (invariants I7, I8).
//! - [`types`]: the slice of a CRD we decode. [`state`]: the record ConfigMap.
//! - [`rewrite`]: our own rewrite (paginated, paced, 404/409 handled).
//! - [`prune`]: the preconditioned write of storedVersions.
//! - [`migrator`]: the term's work (watch, passes, starts, follow-up).
//! - [`audit`]: what `audit` and `--report` say about CRDs.
//! - [`guard`]: what the webhook's CRD guard says about a CRD update (`/validate-crd`).
//! - [`upgrade`]: what applying a CRD leaves in storedVersions (`check crd.yaml`).
//! - [`args`], [`metrics`].

pub mod args;
pub mod audit;
pub mod decide;
pub mod guard;
pub mod metrics;
pub mod migrator;
pub mod prune;
pub mod rewrite;
pub mod state;
pub mod types;
pub mod upgrade;

use prometheus_client::registry::Registry;

pub use args::CrdArgs;
pub use metrics::CrdMetrics;
pub use migrator::{Migrator, MigratorConfig};

/// Annotation on our StorageVersionMigrations: the uid of the CRD object it migrates.
pub const ANNOTATION_CRD_UID: &str = "storageversion-webhook.io/crd-uid";

/// The name of migration number `sequence` of CRD `name` (object `uid`) to `storage`:
/// `<name>-<first 8 characters of the uid>-<storage>-<sequence>`, made a valid name if needed.
/// The uid part keeps a CRD deleted and created again from reusing a name; the number, above
/// every earlier one recorded or found, keeps each need's name new.
pub fn migration_name(name: &str, uid: &str, storage: &str, sequence: u64) -> String {
    let short: String = uid
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(8)
        .collect();
    crate::migrate::svm::migration_name(&format!("{name}-{short}"), storage, sequence)
}

/// The running (or disabled) CRD migrator.
pub type CrdHandle = crate::leader_task::LeaderTaskHandle;

/// Starts the migrator (if `--crd-migrate`) while `leader` leads; registers its metrics in any
/// case. Fails when `--crd-migrate` is given without the leader election (`--no-gc`).
pub fn spawn(
    client: kube::Client,
    args: &CrdArgs,
    gc: &crate::gc::GcArgs,
    leader: &crate::gc::GcHandle,
    registry: &mut Registry,
) -> anyhow::Result<CrdHandle> {
    let metrics = CrdMetrics::register(registry);
    crate::leader_task::start("--crd-migrate", args.crd_migrate, gc, leader, || {
        let cfg = MigratorConfig {
            timing: decide::Timing {
                settle: args.crd_migrate_settle,
                retry: args.crd_migrate_retry,
            },
            interval: args.crd_migrate_interval,
            rate: args.crd_migrate_rate,
            method: args.crd_migrate_method,
            namespace: gc.leader_lease_namespace(),
            configmap: args.crd_migrate_state_configmap.clone(),
        };
        tracing::info!(
            settle = ?cfg.timing.settle,
            retry = ?cfg.timing.retry,
            rate = cfg.rate,
            method = ?cfg.method,
            state = %format!("{}/{}", cfg.namespace, cfg.configmap),
            "CRD migrator enabled (runs while this replica leads)"
        );
        Migrator::new(client, cfg, metrics)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_uid_and_the_number() {
        assert_eq!(
            migration_name("widgets.example.com", "1a2b3c4d-0000-1111", "v1", 1),
            "widgets.example.com-1a2b3c4d-v1-1"
        );
        assert_ne!(
            migration_name("widgets.example.com", "1a2b3c4d-0000", "v1", 1),
            migration_name("widgets.example.com", "9f8e7d6c-0000", "v1", 1)
        );
        assert_ne!(
            migration_name("w.example.com", "u", "v1", 1),
            migration_name("w.example.com", "u", "v1", 2)
        );
    }
}
