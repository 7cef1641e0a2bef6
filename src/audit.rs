//! `audit`: read-only, against a live cluster. One LIST of StorageVersions and one of the Leases
//! in `kube-system`; for every entry whose lease is missing, unlabelled or expired, and every
//! object that breaks a rule, it says so and what the garbage collector would do. The decisions
//! come from the same pure functions as the collector ([`crate::gc::plan`]) and the webhook
//! ([`crate::rules`]).
//!
//! Exit status: 0 clean, 1 something is reported (a stale entry, a rule violation, or a change
//! GC would make), 2 on error (nothing judged).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::duration::{parse_duration, parse_now};
use crate::gc::plan::{self, Plan, Removal};
use crate::model::{
    LeaseLookup, LeaseRecord, StorageVersion, IDENTITY_LABEL_VALUE, IDENTITY_LEASE_NAMESPACE,
};
use crate::rules::lease::LeaseJudgement;
use crate::rules::{self, RuleOptions};

const EXIT_FINDINGS: u8 = 1;
const EXIT_ERROR: u8 = 2;

#[derive(Clone, Debug, clap::Args)]
#[command(after_help = "\
Read-only: makes one LIST of StorageVersions and one of Leases in kube-system, and writes nothing.

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
    #[command(flatten)]
    pub migrate: crate::migrate::audit::AuditMigrateArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuditOutput {
    /// For people.
    Text,
    /// One JSON document, for programs.
    Json,
}

/// What `audit` found.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditReport {
    pub now: String,
    pub storage_versions: usize,
    pub identity_leases: usize,
    /// Entries whose lease is missing, not an apiserver identity lease, or expired.
    pub stale_entries: Vec<StaleEntry>,
    /// Rule violations of stored objects (rules of docs/design.md §3 that need no lease data).
    pub violations: Vec<ObjectViolation>,
    /// What the garbage collector would do.
    pub gc_actions: Vec<GcAction>,
    /// Resources whose stored objects may still be in an older version (see docs/migration.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stale_storage: Vec<crate::migrate::audit::StaleStorage>,
    pub clean: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StaleEntry {
    pub storage_version: String,
    #[serde(rename = "apiServerID")]
    pub api_server_id: String,
    /// lease-missing, lease-not-apiserver or lease-expired.
    pub problem: String,
    pub message: String,
    /// Whether the collector removes this entry (after its deletion grace for missing and
    /// unlabelled leases; for expired ones only with `--gc-expired-lease-grace`).
    pub gc_removes: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectViolation {
    pub storage_version: String,
    pub code: String,
    pub path: String,
    pub message: String,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GcAction {
    pub storage_version: String,
    /// `rewrite` (status written with the kept entries) or `delete` (no entry left).
    pub action: &'static str,
    pub removed: Vec<Removal>,
    /// After a rewrite: the recomputed commonEncodingVersion (None: unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub common_encoding_version_after: Option<Option<String>>,
}

/// Options of the pure part.
#[derive(Clone, Debug)]
pub struct AuditOptions {
    pub now: Timestamp,
    pub lease_skew_allowance: Duration,
    pub gc_expired_lease_grace: Option<Duration>,
}

/// Judges `svs` against `leases` (every Lease in kube-system, labelled or not). Pure.
pub fn build_report(
    svs: &[StorageVersion],
    leases: &[LeaseRecord],
    opts: &AuditOptions,
) -> AuditReport {
    let by_name: HashMap<&str, &LeaseRecord> =
        leases.iter().map(|l| (l.name.as_str(), l)).collect();
    let rule_opts = RuleOptions {
        now: opts.now,
        lease_skew_allowance: opts.lease_skew_allowance,
    };
    let now_text = plan::format_time(opts.now);
    let mut report = AuditReport {
        now: opts.now.to_string(),
        storage_versions: svs.len(),
        identity_leases: leases
            .iter()
            .filter(|l| l.identity_label.as_deref() == Some(IDENTITY_LABEL_VALUE))
            .count(),
        ..AuditReport::default()
    };
    for sv in svs {
        let mut remove = BTreeMap::new();
        for id in plan::entry_ids(sv) {
            let lookup = match by_name.get(id) {
                Some(r) => LeaseLookup::Found((*r).clone()),
                None => LeaseLookup::NotFound,
            };
            let state = plan::judge_lease(&lookup, opts.now, opts.gc_expired_lease_grace);
            let gc_reason = state.reason();
            if let Some(reason) = &gc_reason {
                remove.insert(id.to_string(), reason.clone());
            }
            if let LeaseJudgement::Problem { code, message } =
                rules::lease::judge(id, Some(&lookup), &rule_opts)
            {
                report.stale_entries.push(StaleEntry {
                    storage_version: sv.name().to_string(),
                    api_server_id: id.to_string(),
                    problem: code.as_str().to_string(),
                    message,
                    gc_removes: gc_reason.is_some(),
                });
            } else if let Some(reason) = gc_reason {
                // Live for the webhook (within its skew allowance) but gone for the collector.
                report.stale_entries.push(StaleEntry {
                    storage_version: sv.name().to_string(),
                    api_server_id: id.to_string(),
                    problem: reason.code().to_string(),
                    message: reason.to_string(),
                    gc_removes: true,
                });
            }
        }
        for v in rules::violations(sv) {
            report.violations.push(ObjectViolation {
                storage_version: sv.name().to_string(),
                code: v.code.as_str().to_string(),
                path: v.path.clone(),
                message: v.to_string(),
            });
        }
        match plan::plan(sv, &remove, &now_text) {
            Plan::Nothing => {}
            Plan::Rewrite { object, removed } => report.gc_actions.push(GcAction {
                storage_version: sv.name().to_string(),
                action: "rewrite",
                removed,
                common_encoding_version_after: Some(object.status.common_encoding_version.clone()),
            }),
            Plan::Delete { removed } => report.gc_actions.push(GcAction {
                storage_version: sv.name().to_string(),
                action: "delete",
                removed,
                common_encoding_version_after: None,
            }),
        }
    }
    report.clean = report.stale_entries.is_empty()
        && report.violations.is_empty()
        && report.gc_actions.is_empty();
    report
}

/// Lists StorageVersions and the Leases in kube-system, then judges them.
pub async fn audit(client: kube::Client, opts: &AuditOptions) -> anyhow::Result<AuditReport> {
    let svs: Api<StorageVersion> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client, IDENTITY_LEASE_NAMESPACE);
    let svs = svs
        .list(&ListParams::default())
        .await
        .context("cannot list storageversions.internal.apiserver.k8s.io (is the internal.apiserver.k8s.io/v1alpha1 API enabled, and may we list it?)")?;
    let leases = leases
        .list(&ListParams::default())
        .await
        .with_context(|| format!("cannot list leases in {IDENTITY_LEASE_NAMESPACE}"))?;
    let records: Vec<LeaseRecord> = leases.items.iter().map(LeaseRecord::from_lease).collect();
    Ok(build_report(&svs.items, &records, opts))
}

/// Renders the report for people.
pub fn render_text(r: &AuditReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} StorageVersions, {} identity leases in {IDENTITY_LEASE_NAMESPACE}, judged at {}",
        r.storage_versions, r.identity_leases, r.now
    );
    if r.clean {
        let _ = writeln!(
            out,
            "clean: every entry names a live apiserver, no rule is broken, GC would change nothing"
        );
        return out;
    }
    if !r.stale_entries.is_empty() {
        let _ = writeln!(out, "\nstale entries ({}):", r.stale_entries.len());
        for e in &r.stale_entries {
            let gc = if e.gc_removes {
                "GC removes it"
            } else {
                "GC keeps it (expired leases count as gone only with --gc-expired-lease-grace)"
            };
            let _ = writeln!(
                out,
                "  {} {}: {} [{}]; {gc}",
                e.storage_version, e.api_server_id, e.message, e.problem
            );
        }
    }
    if !r.violations.is_empty() {
        let _ = writeln!(out, "\nrule violations ({}):", r.violations.len());
        for v in &r.violations {
            let _ = writeln!(out, "  {}: {} [{}]", v.storage_version, v.message, v.code);
        }
    }
    if !r.gc_actions.is_empty() {
        let _ = writeln!(out, "\nGC would ({} objects):", r.gc_actions.len());
        for a in &r.gc_actions {
            let removed = crate::gc::collector::describe(&a.removed);
            match (&a.action, &a.common_encoding_version_after) {
                (&"delete", _) => {
                    let _ = writeln!(
                        out,
                        "  delete {} (no entry left after removing {removed})",
                        a.storage_version
                    );
                }
                (_, common) => {
                    let common = common
                        .as_ref()
                        .and_then(|c| c.as_deref())
                        .unwrap_or("unset");
                    let _ = writeln!(
                        out,
                        "  rewrite {}: remove {removed}; commonEncodingVersion becomes {common}",
                        a.storage_version
                    );
                }
            }
        }
    }
    out.push_str(&crate::migrate::audit::render_text(&r.stale_storage));
    let _ = writeln!(
        out,
        "\n{} stale entries, {} rule violations, {} objects GC would change",
        r.stale_entries.len(),
        r.violations.len(),
        r.gc_actions.len()
    );
    out
}

/// `storageversion-webhook audit`.
pub fn run(args: AuditArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let opts = AuditOptions {
        now: args.now.unwrap_or_else(Timestamp::now),
        lease_skew_allowance: args.lease_skew_allowance,
        gc_expired_lease_grace: args.gc_expired_lease_grace,
    };
    let result = runtime.block_on(async {
        let client = crate::kubeclient::client(args.kubeconfig.as_deref()).await?;
        let mut report = audit(client.clone(), &opts).await?;
        crate::migrate::audit::extend(client, &args.migrate, &mut report).await?;
        anyhow::Ok(report)
    });
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: audit failed: {e:#}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let text = match args.output {
        AuditOutput::Text => render_text(&report),
        AuditOutput::Json => match serde_json::to_string_pretty(&report) {
            Ok(j) => j + "\n",
            Err(e) => {
                eprintln!("error: cannot encode the report as JSON: {e}");
                return ExitCode::from(EXIT_ERROR);
            }
        },
    };
    print!("{text}");
    if report.clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FINDINGS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ServerStorageVersion;

    fn sv(name: &str, ids: &[&str]) -> StorageVersion {
        let mut sv = StorageVersion::default();
        sv.metadata.name = Some(name.into());
        sv.status.storage_versions = ids
            .iter()
            .map(|id| ServerStorageVersion {
                api_server_id: id.to_string(),
                encoding_version: "apps/v1".into(),
                decodable_versions: vec!["apps/v1".into()],
                served_versions: vec![],
            })
            .collect();
        let now = "2026-03-01T12:00:00Z";
        crate::rules::common::set_common_encoding_version(&mut sv, now);
        sv
    }

    fn lease(name: &str, label: Option<&str>, renew: &str) -> LeaseRecord {
        LeaseRecord {
            name: name.into(),
            identity_label: label.map(String::from),
            renew_time: Some(renew.parse().unwrap()),
            lease_duration_seconds: Some(3600),
        }
    }

    fn opts(grace: Option<Duration>) -> AuditOptions {
        AuditOptions {
            now: "2026-03-01T12:00:00Z".parse().unwrap(),
            lease_skew_allowance: Duration::from_secs(30),
            gc_expired_lease_grace: grace,
        }
    }

    #[test]
    fn clean_cluster() {
        let leases = [lease(
            "apiserver-a",
            Some("kube-apiserver"),
            "2026-03-01T11:59:50Z",
        )];
        let r = build_report(
            &[sv("apps.deployments", &["apiserver-a"])],
            &leases,
            &opts(None),
        );
        assert!(r.clean, "{r:?}");
        assert!(render_text(&r).contains("clean"));
    }

    #[test]
    fn stale_entries_and_actions() {
        let leases = [
            lease(
                "apiserver-a",
                Some("kube-apiserver"),
                "2026-03-01T11:59:50Z",
            ),
            lease("apiserver-u", None, "2026-03-01T11:59:50Z"),
            lease(
                "apiserver-e",
                Some("kube-apiserver"),
                "2026-03-01T09:00:00Z",
            ),
        ];
        let svs = [
            sv("apps.deployments", &["apiserver-a", "apiserver-gone"]),
            sv("apps.statefulsets", &["apiserver-u"]),
            sv("apps.daemonsets", &["apiserver-a", "apiserver-e"]),
        ];
        let r = build_report(&svs, &leases, &opts(None));
        assert!(!r.clean);
        let problems: Vec<_> = r
            .stale_entries
            .iter()
            .map(|e| (e.api_server_id.as_str(), e.problem.as_str(), e.gc_removes))
            .collect();
        assert_eq!(
            problems,
            [
                ("apiserver-gone", "lease-missing", true),
                ("apiserver-u", "lease-not-apiserver", true),
                ("apiserver-e", "lease-expired", false),
            ]
        );
        let actions: Vec<_> = r
            .gc_actions
            .iter()
            .map(|a| (a.storage_version.as_str(), a.action))
            .collect();
        assert_eq!(
            actions,
            [
                ("apps.deployments", "rewrite"),
                ("apps.statefulsets", "delete")
            ]
        );
        let text = render_text(&r);
        assert!(text.contains("delete apps.statefulsets"), "{text}");
        assert!(text.contains("GC keeps it"), "{text}");

        // With the expired-lease grace the expired entry goes too.
        let r = build_report(&svs, &leases, &opts(Some(Duration::from_secs(60))));
        assert_eq!(r.gc_actions.len(), 3);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["gcActions"][2]["removed"][0]["reason"],
            "lease-expired"
        );
    }
}
