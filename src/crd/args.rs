//! Flags of the CRD migrator, flattened into `serve`.

use std::time::Duration;

use super::guard::GuardMode;
use crate::duration::{parse_duration, parse_positive_duration};

/// Default name of the ConfigMap that records each CRD's last migration.
pub const DEFAULT_STATE_CONFIGMAP: &str = "storageversion-webhook-crd";

/// How the CRD migrator rewrites objects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MethodChoice {
    /// A StorageVersionMigration where storagemigration.k8s.io v1 or v1beta1 is served, else
    /// our own rewrite.
    #[default]
    Auto,
    /// Only StorageVersionMigrations (kube-controller-manager runs them and prunes).
    Svm,
    /// Always our own rewrite, also where the StorageVersionMigration API is served (for
    /// clusters whose kube-controller-manager does not run its storage-version-migrator).
    Rewrite,
}

#[derive(Clone, Debug, clap::Args)]
pub struct CrdArgs {
    /// Migrate the objects of every CustomResourceDefinition whose status.storedVersions lists a
    /// version other than its storage version, then prune storedVersions (leader only; needs the
    /// garbage collector's leader election, so not with --no-gc). See docs/crd.md.
    #[arg(long, env = "SVW_CRD_MIGRATE")]
    pub crd_migrate: bool,

    /// How long a CRD (its generation, storage version and storedVersions) must stay unchanged
    /// before its objects are migrated.
    #[arg(long, env = "SVW_CRD_MIGRATE_SETTLE", default_value = "2m", value_parser = parse_duration)]
    pub crd_migrate_settle: Duration,

    /// How long after a failed migration of a CRD the leader tries it again (a new migration);
    /// the wait doubles with each failure in a row, up to 6 hours. A change of the CRD's spec
    /// tries again sooner: after the settle time.
    #[arg(long, env = "SVW_CRD_MIGRATE_RETRY", default_value = "10m",
          value_parser = parse_positive_duration)]
    pub crd_migrate_retry: Duration,

    /// How often the leader looks at every CRD again besides the watch's changes (follows
    /// StorageVersionMigrations, ends settle times).
    #[arg(long, env = "SVW_CRD_MIGRATE_INTERVAL", default_value = "10s",
          value_parser = parse_positive_duration)]
    pub crd_migrate_interval: Duration,

    /// Objects rewritten per second at most, over all CRDs (our own rewrite only).
    #[arg(long, env = "SVW_CRD_MIGRATE_RATE", default_value_t = 50.0,
          value_parser = parse_rate)]
    pub crd_migrate_rate: f64,

    /// How the objects are rewritten.
    #[arg(long, env = "SVW_CRD_MIGRATE_METHOD", value_enum, default_value_t = MethodChoice::Auto)]
    pub crd_migrate_method: MethodChoice,

    /// What the webhook's CRD guard (`/validate-crd`) does with a change of a CRD's storage
    /// version while our migration of that CRD runs: deny it, or allow it with a warning.
    #[arg(long, env = "SVW_CRD_GUARD", value_enum, default_value_t = GuardMode::Deny)]
    pub crd_guard: GuardMode,

    /// ConfigMap (in the leader Lease's namespace) that records each CRD's last migration.
    /// Every replica reads it for the CRD guard.
    #[arg(long, env = "SVW_CRD_MIGRATE_STATE_CONFIGMAP", default_value = DEFAULT_STATE_CONFIGMAP)]
    pub crd_migrate_state_configmap: String,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let r: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if r.is_finite() && (0.1..=10_000.0).contains(&r) {
        Ok(r)
    } else {
        Err("must be a number of objects per second from 0.1 to 10000".to_string())
    }
}

impl Default for CrdArgs {
    fn default() -> Self {
        CrdArgs {
            crd_migrate: false,
            crd_migrate_settle: Duration::from_secs(120),
            crd_migrate_retry: Duration::from_secs(600),
            crd_migrate_interval: Duration::from_secs(10),
            crd_migrate_rate: 50.0,
            crd_migrate_method: MethodChoice::Auto,
            crd_guard: GuardMode::Deny,
            crd_migrate_state_configmap: DEFAULT_STATE_CONFIGMAP.to_string(),
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
        c: CrdArgs,
    }

    #[test]
    fn defaults_and_flags() {
        let d = Cli::try_parse_from(["x"]).expect("parse").c;
        assert!(!d.crd_migrate);
        assert_eq!(d.crd_migrate_settle, Duration::from_secs(120));
        assert_eq!(d.crd_migrate_retry, Duration::from_secs(600));
        assert_eq!(d.crd_migrate_method, MethodChoice::Auto);
        assert_eq!(format!("{d:?}"), format!("{:?}", CrdArgs::default()));
        let c = Cli::try_parse_from([
            "x",
            "--crd-migrate",
            "--crd-migrate-method=rewrite",
            "--crd-migrate-rate=500",
            "--crd-guard=warn",
        ])
        .expect("parse")
        .c;
        assert!(c.crd_migrate);
        assert_eq!(c.crd_migrate_method, MethodChoice::Rewrite);
        assert_eq!(c.crd_migrate_rate, 500.0);
        assert_eq!(
            (d.crd_guard, c.crd_guard),
            (GuardMode::Deny, GuardMode::Warn)
        );
        for bad in [
            "--crd-migrate-rate=0",
            "--crd-migrate-rate=nan",
            "--crd-migrate-interval=0s",
            "--crd-migrate-retry=0s",
        ] {
            assert!(Cli::try_parse_from(["x", bad]).is_err(), "{bad}");
        }
    }
}
