//! Flags of the report (`serve --report`), flattened into `serve`.

use std::time::Duration;

use crate::duration::parse_positive_duration;

/// Report flags. Flatten into a subcommand with `#[command(flatten)]`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReportArgs {
    /// Keep an OpenReports ClusterReport (openreports.io/v1alpha1) with one result per
    /// StorageVersion finding of `audit` (leader only; needs the garbage collector's leader
    /// election, so not with --no-gc). The CRD must be installed; without it the leader logs
    /// once and retries with backoff.
    #[arg(long, env = "SVW_REPORT")]
    pub report: bool,

    /// Name of the ClusterReport.
    #[arg(long, env = "SVW_REPORT_NAME", default_value = "storageversion-webhook",
          value_parser = parse_report_name)]
    pub report_name: String,

    /// Most results listed in the report; the findings beyond (and any beyond 512 KiB of
    /// results) are counted in its summary and in the annotation
    /// storageversion-webhook.io/omitted-results.
    #[arg(long, env = "SVW_REPORT_MAX_RESULTS", default_value_t = 1000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    pub report_max_results: usize,

    /// How often the leader judges everything again and writes the report even when no event
    /// came (catches leases that expire without an event, and a report deleted by someone).
    #[arg(long, env = "SVW_REPORT_RESYNC_INTERVAL", default_value = "1m",
          value_parser = parse_positive_duration)]
    pub report_resync_interval: Duration,
}

impl Default for ReportArgs {
    /// The clap defaults (as `--help` prints them).
    fn default() -> Self {
        // No flag is required and the defaults are constants (a test parses them).
        crate::cli::defaults(&[]).expect("the report flags' defaults parse")
    }
}

/// A ClusterReport name: a DNS-1123 subdomain.
fn parse_report_name(s: &str) -> Result<String, String> {
    let problems = crate::rules::names::dns1123_subdomain(s);
    if problems.is_empty() {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a valid object name: {}",
            problems.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        r: ReportArgs,
    }

    #[test]
    fn defaults_and_flags() {
        let d = ReportArgs::default();
        assert!(!d.report);
        assert_eq!(d.report_name, "storageversion-webhook");
        assert_eq!(d.report_max_results, 1000);
        assert_eq!(d.report_resync_interval, Duration::from_secs(60));
        let r = Cli::try_parse_from([
            "x",
            "--report",
            "--report-name=svw",
            "--report-max-results=50",
            "--report-resync-interval=5s",
        ])
        .expect("parse")
        .r;
        assert!(r.report);
        assert_eq!(r.report_name, "svw");
        assert_eq!(r.report_max_results, 50);
        assert_eq!(r.report_resync_interval, Duration::from_secs(5));
        for bad in [
            "--report-max-results=0",
            "--report-max-results=10001",
            "--report-name=Not_A_Name",
            "--report-resync-interval=0s",
        ] {
            assert!(Cli::try_parse_from(["x", bad]).is_err(), "{bad}");
        }
    }
}
