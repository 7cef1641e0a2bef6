//! Flags of the storage migration trigger, flattened into `serve` (and partly reused by `audit`).

use std::time::Duration;

use crate::duration::{parse_duration, parse_positive_duration};

/// Default name of the ConfigMap that remembers each resource's last agreed version.
pub const DEFAULT_STATE_CONFIGMAP: &str = "storageversion-webhook-migrate";

/// Storage-migration flags. Flatten into a subcommand with `#[command(flatten)]`.
#[derive(Clone, Debug, clap::Args)]
pub struct MigrateArgs {
    /// Create a storagemigration.k8s.io/v1 StorageVersionMigration when every apiserver has
    /// agreed on a new encoding version of a resource for --migrate-settle (leader only; needs
    /// the garbage collector's leader election, so not with --no-gc).
    #[arg(long, env = "SVW_MIGRATE")]
    pub migrate: bool,

    /// How long a new common encoding version must hold, unchanged, before its migration is
    /// created: longer than a rolling upgrade takes to restart every apiserver, so that a
    /// rollback in the middle migrates nothing.
    #[arg(long, env = "SVW_MIGRATE_SETTLE", default_value = "5m", value_parser = parse_duration)]
    pub migrate_settle: Duration,

    /// How often the leader re-reads the StorageVersions and its migrations.
    #[arg(long, env = "SVW_MIGRATE_INTERVAL", default_value = "10s",
          value_parser = parse_positive_duration)]
    pub migrate_interval: Duration,

    /// ConfigMap (in the leader Lease's namespace) that remembers, per StorageVersion, the
    /// encoding version last agreed on.
    #[arg(long, env = "SVW_MIGRATE_STATE_CONFIGMAP", default_value = DEFAULT_STATE_CONFIGMAP)]
    pub migrate_state_configmap: String,
}

impl Default for MigrateArgs {
    fn default() -> Self {
        MigrateArgs {
            migrate: false,
            migrate_settle: Duration::from_secs(300),
            migrate_interval: Duration::from_secs(10),
            migrate_state_configmap: DEFAULT_STATE_CONFIGMAP.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        m: MigrateArgs,
    }

    #[test]
    fn defaults_and_flags() {
        let d = Cli::try_parse_from(["x"]).expect("parse").m;
        assert!(!d.migrate);
        assert_eq!(d.migrate_settle, Duration::from_secs(300));
        assert_eq!(format!("{d:?}"), format!("{:?}", MigrateArgs::default()));
        let m = Cli::try_parse_from(["x", "--migrate", "--migrate-settle=2s"])
            .expect("parse")
            .m;
        assert!(m.migrate);
        assert_eq!(m.migrate_settle, Duration::from_secs(2));
        assert!(Cli::try_parse_from(["x", "--migrate-settle=soon"]).is_err());
        assert!(Cli::try_parse_from(["x", "--migrate-interval=0s"]).is_err());
    }
}
