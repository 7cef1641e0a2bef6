use std::process::ExitCode;

use clap::{Parser, Subcommand};

use storageversion_webhook::{audit, catalog, check, hooks, logging, plugin, server};

/// Validating admission webhook and garbage collector for Kubernetes StorageVersion objects.
#[derive(Parser, Debug)]
#[command(name = "storageversion-webhook", version, about)]
struct Cli {
    #[command(flatten)]
    log: logging::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the validating admission webhook over HTTPS (and collect garbage when leading).
    Serve(Box<server::ServeArgs>),
    /// Check StorageVersion objects or AdmissionReviews in files against the rules, offline.
    Check(check::CheckArgs),
    /// Report stale entries and rule violations in a live cluster, and what GC would do (read-only).
    Audit(audit::AuditArgs),
    /// List every rule code with what it requires and whether kube-apiserver enforces it too.
    Rules(catalog::RulesArgs),
    /// Call the webhook as kube-apiserver does and run audit (the Helm chart's `helm test` pod).
    Selftest(hooks::selftest::SelftestArgs),
    /// Delete the leader Lease, migration state ConfigMap and pods named (the chart's post-delete hook).
    Cleanup(hooks::cleanup::CleanupArgs),
}

fn main() -> ExitCode {
    // Before any thread starts (the log writer is one): see src/memory.rs.
    storageversion_webhook::memory::limit_arenas();
    // As `kubectl-storageversions` it is the kubectl plugin (src/plugin.rs).
    let cli: Cli = plugin::parse();
    // Every subcommand takes the --log-* flags; held until `main` returns, so that queued log
    // lines are written out.
    let _log = match logging::init(&cli.log) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Check(args) => check::run(args),
        Command::Audit(args) => audit::run(args),
        Command::Rules(args) => catalog::run(args),
        Command::Selftest(args) => hooks::selftest::run(args),
        Command::Cleanup(args) => hooks::cleanup::run(args),
        Command::Serve(args) => {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(server::run(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "serve failed");
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
