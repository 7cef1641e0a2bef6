//! `audit`'s flags.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::gc::args::parse_duration;

#[derive(Clone, Debug, clap::Args)]
#[command(after_help = "\
Read-only: LISTs StorageVersions and the Leases in kube-system (in pages of 500), and writes nothing.

Exit status: 0 when nothing is reported, 1 when an entry's lease is missing, unlabelled or \
expired, an object breaks a rule, or the garbage collector would change something, 2 on error.")]
pub struct AuditArgs {
    /// kubeconfig file; without it, $KUBECONFIG, ~/.kube/config or the in-cluster configuration.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Report format.
    #[arg(long, value_enum, default_value_t = AuditOutput::Text)]
    pub output: AuditOutput,
    /// The time leases are judged against (RFC 3339) [default: the current time].
    #[arg(long, value_name = "RFC3339", value_parser = parse_now)]
    pub now: Option<Timestamp>,
    /// How long after renewTime + leaseDurationSeconds a lease still counts as live when
    /// reporting expiry (as the webhook judges it).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub lease_skew_allowance: Duration,
    /// Say what a collector run with this `--gc-expired-lease-grace` would do (without it, the
    /// collector, like upstream, keeps entries of expired leases).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub gc_expired_lease_grace: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuditOutput {
    /// For people.
    Text,
    /// One JSON document, for programs.
    Json,
}

fn parse_now(s: &str) -> Result<Timestamp, String> {
    s.parse::<Timestamp>()
        .map_err(|e| format!("{s:?} is not an RFC 3339 time like 2026-01-02T03:04:05Z: {e}"))
}

