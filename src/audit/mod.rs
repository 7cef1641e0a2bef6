//! `audit`: read-only, against a live cluster. Paginated LISTs of StorageVersions and of the
//! Leases in `kube-system`; for every entry whose lease is missing, unlabelled or expired, and
//! every object that breaks a rule, it says so and what the garbage collector would do. Then
//! every CRD whose storedVersions is not yet just its storage version ([`crate::crd::audit`]).
//! On a cluster that does not serve the StorageVersion API it says so and judges the CRDs only.
//!
//! Split like `check`: [`args`] (flags), [`report`] (the pure judgement), [`fetch`] (the LISTs),
//! [`render`] (text), and `run` here.
//!
//! Exit status: 0 clean, 1 something is reported (a stale entry, a rule violation, a change GC
//! would make, a migration finding), 2 on error (nothing judged).

pub mod args;
pub mod codes;
pub mod fetch;
pub mod render;
pub mod report;

use std::process::ExitCode;

use k8s_openapi::jiff::Timestamp;

pub use args::{AuditArgs, AuditOutput};
pub use fetch::{audit, everything};
pub use render::render_text;
pub use report::{build_report, AuditOptions, AuditReport, GcAction, ObjectViolation, StaleEntry};

const EXIT_FINDINGS: u8 = 1;
const EXIT_ERROR: u8 = 2;

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
        everything(client, &opts, &args.migrate).await
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
