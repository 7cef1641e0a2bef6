//! Flags of the garbage collector, flattened into `serve` (and partly reused by `audit`).

use std::time::Duration;

use crate::duration::{parse_duration, parse_positive_duration, parse_whole_seconds};

/// Where a pod's service account namespace is mounted.
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Default name of the leader-election Lease.
pub const DEFAULT_LEADER_LEASE_NAME: &str = "storageversion-webhook-gc";

/// Garbage-collector flags (docs/design.md §5). Flatten into a subcommand with `#[command(flatten)]`.
#[derive(Clone, Debug, clap::Args)]
pub struct GcArgs {
    /// Run the StorageVersion garbage collector (on by default; only the replica holding the
    /// leader Lease collects, every replica serves admission).
    #[arg(long = "gc", overrides_with = "no_gc", default_value_t = true,
          action = clap::ArgAction::SetTrue)]
    pub gc: bool,

    /// Do not run the garbage collector (admission-only replica).
    #[arg(long = "no-gc", env = "SVW_NO_GC", overrides_with = "gc")]
    pub no_gc: bool,

    /// Name of the coordination.k8s.io/v1 Lease used to elect the one replica that collects.
    #[arg(long, env = "SVW_GC_LEADER_LEASE_NAME", default_value = DEFAULT_LEADER_LEASE_NAME)]
    pub gc_leader_lease_name: String,

    /// Namespace of the leader Lease [default: the pod's service-account namespace, else
    /// `default`].
    #[arg(long, env = "SVW_GC_LEADER_LEASE_NAMESPACE")]
    pub gc_leader_lease_namespace: Option<String>,

    /// How long a leader Lease stays valid after its last renewal (whole seconds, at least 2s).
    /// A replica that dies without releasing the Lease is replaced after about this long.
    #[arg(long, env = "SVW_GC_LEADER_LEASE_DURATION", default_value = "15s",
          value_parser = parse_whole_seconds)]
    pub gc_leader_lease_duration: Duration,

    /// The leader renews its Lease this long before it would expire (whole seconds, at least 1s,
    /// less than the duration). It also stops collecting this long before an expiry it could not
    /// renew, so two replicas never collect at once.
    #[arg(long, env = "SVW_GC_LEADER_LEASE_GRACE", default_value = "5s",
          value_parser = parse_whole_seconds)]
    pub gc_leader_lease_grace: Duration,

    /// Identity of this replica in the leader Lease [default: POD_NAME or the hostname, plus a
    /// random suffix].
    #[arg(long, env = "SVW_GC_IDENTITY")]
    pub gc_identity: Option<String>,

    /// An apiserver's entries are removed only once its identity lease has been seen absent (or
    /// without the identity label) for at least this long, and it is still absent in a live GET
    /// right before the write. kube-apiserver deletes its own lease when it starts and stops, and
    /// re-creates a lease deleted by someone else within about 10 s.
    #[arg(long, env = "SVW_GC_LEASE_DELETION_GRACE", default_value = "30s",
          value_parser = parse_duration)]
    pub gc_lease_deletion_grace: Duration,

    /// How often the leader sweeps every StorageVersion (also done on gaining leadership).
    #[arg(long, env = "SVW_GC_RESYNC_INTERVAL", default_value = "5m",
          value_parser = parse_positive_duration)]
    pub gc_resync_interval: Duration,

    /// How many StorageVersions are checked and written at once.
    #[arg(long, env = "SVW_GC_CONCURRENCY", default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub gc_concurrency: u16,

    /// Also treat an identity lease as gone when it expired (renewTime + leaseDurationSeconds)
    /// longer than this ago. Off by default, like upstream, where a crashed apiserver's entries
    /// stay until kube-apiserver's lease GC deletes its lease (up to about 2 h).
    #[arg(long, env = "SVW_GC_EXPIRED_LEASE_GRACE", value_parser = parse_duration)]
    pub gc_expired_lease_grace: Option<Duration>,

    /// Log (and count) what the collector would change, and change nothing.
    #[arg(long, env = "SVW_GC_DRY_RUN")]
    pub gc_dry_run: bool,
}

impl Default for GcArgs {
    /// The clap defaults (as `--help` prints them).
    fn default() -> Self {
        // No flag of GcArgs is required and the defaults are constants (a test parses them).
        crate::cli::defaults(&[]).expect("the gc flags' defaults parse")
    }
}

impl GcArgs {
    /// True unless `--no-gc` (the last of `--gc`/`--no-gc` wins).
    pub fn enabled(&self) -> bool {
        self.gc && !self.no_gc
    }

    /// Checks what one flag alone cannot; the message names the flags.
    pub fn validate(&self) -> Result<(), String> {
        let duration = self.gc_leader_lease_duration.as_secs();
        let grace = self.gc_leader_lease_grace.as_secs();
        if duration < 2 {
            return Err(format!(
                "--gc-leader-lease-duration must be at least 2s, got {duration}s"
            ));
        }
        if grace < 1 || grace >= duration {
            return Err(format!(
                "--gc-leader-lease-grace ({grace}s) must be at least 1s and less than --gc-leader-lease-duration ({duration}s)"
            ));
        }
        if self.gc_leader_lease_name.is_empty() {
            return Err("--gc-leader-lease-name must not be empty".to_string());
        }
        Ok(())
    }

    /// The leader Lease namespace: the flag, else the service-account namespace, else `default`.
    pub fn leader_lease_namespace(&self) -> String {
        if let Some(ns) = &self.gc_leader_lease_namespace {
            return ns.clone();
        }
        std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".to_string())
    }

    /// This replica's identity: the flag, else `POD_NAME`/hostname plus a random suffix.
    pub fn identity(&self) -> String {
        if let Some(id) = &self.gc_identity {
            return id.clone();
        }
        let base = std::env::var("POD_NAME")
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|s| s.trim().to_string())
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "storageversion-webhook".to_string());
        format!("{base}_{}", random_suffix())
    }
}

/// Eight hex digits from the process's randomly seeded hasher.
fn random_suffix() -> String {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let h = std::collections::hash_map::RandomState::new().hash_one((nanos, std::process::id()));
    format!("{:08x}", h as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        gc: GcArgs,
    }

    fn parse(args: &[&str]) -> Result<GcArgs, clap::Error> {
        let mut v = vec!["x"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).map(|c| c.gc)
    }

    #[test]
    fn defaults() {
        let a = parse(&[]).unwrap();
        assert!(a.enabled());
        assert_eq!(a.gc_lease_deletion_grace, Duration::from_secs(30));
        assert_eq!(a.gc_resync_interval, Duration::from_secs(300));
        assert_eq!(a.gc_concurrency, 8);
        assert_eq!(a.gc_expired_lease_grace, None);
        assert!(!a.gc_dry_run);
        assert_eq!(a.gc_leader_lease_name, DEFAULT_LEADER_LEASE_NAME);
        assert!(a.validate().is_ok());
        let d = GcArgs::default();
        assert_eq!(d.gc_lease_deletion_grace, a.gc_lease_deletion_grace);
        assert_eq!(d.gc_leader_lease_duration, a.gc_leader_lease_duration);
    }

    #[test]
    fn no_gc_and_last_wins() {
        assert!(!parse(&["--no-gc"]).unwrap().enabled());
        assert!(parse(&["--no-gc", "--gc"]).unwrap().enabled());
        assert!(!parse(&["--gc", "--no-gc"]).unwrap().enabled());
    }

    #[test]
    fn durations() {
        let a = parse(&[
            "--gc-lease-deletion-grace=500ms",
            "--gc-resync-interval=2s",
            "--gc-expired-lease-grace=1m",
            "--gc-leader-lease-duration=3s",
            "--gc-leader-lease-grace=1s",
        ])
        .unwrap();
        assert_eq!(a.gc_lease_deletion_grace, Duration::from_millis(500));
        assert_eq!(a.gc_resync_interval, Duration::from_secs(2));
        assert_eq!(a.gc_expired_lease_grace, Some(Duration::from_secs(60)));
        assert!(a.validate().is_ok());
        assert!(parse(&["--gc-resync-interval=0"]).is_err());
        assert!(parse(&["--gc-leader-lease-duration=1500ms"]).is_err());
        assert!(parse(&["--gc-lease-deletion-grace=soon"]).is_err());
        assert!(parse(&["--gc-concurrency=0"]).is_err());
    }

    #[test]
    fn grace_must_be_below_duration() {
        let a = parse(&[
            "--gc-leader-lease-duration=5s",
            "--gc-leader-lease-grace=5s",
        ])
        .unwrap();
        let e = a.validate().unwrap_err();
        assert!(e.contains("--gc-leader-lease-grace"), "{e}");
    }

    #[test]
    fn identity_has_a_random_suffix() {
        let a = parse(&[]).unwrap();
        let (x, y) = (a.identity(), a.identity());
        assert_ne!(x, y);
        let b = parse(&["--gc-identity=me"]).unwrap();
        assert_eq!(b.identity(), "me");
    }
}
