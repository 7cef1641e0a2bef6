//! The benchmark driver behind `bench/run`: everything that is easier in Rust than in bash.
//!
//! - `review`: writes the AdmissionReview bodies of the admission benchmark.
//! - `leases`, `populate`: create identity Leases (and StorageVersions) in a cluster.
//! - `load`: runs the load generator (oha) once and measures around it: the server's CPU per
//!   request from `/proc/<pid>/task/*/schedstat`, the generator's CPU, and the CPU used by anything
//!   else on the machine, sampled once a second.
//! - `writes`: `/status` write latency through kube-apiserver, webhook registered vs not,
//!   alternating blocks.
//! - `gc-reset`, `gc-time`, `wait-metric`: the garbage-collection race.
//! - `startup`: time from start to `/readyz` ok, and resident memory.
//! - `bounds-cost`: what issue 13's bounds cost a review, in process (paired, alternating).
//! - `report`: the Markdown report from the result files.
//!
//! Each measuring subcommand appends one JSON object per result line to `--out`.

mod bounds;
mod capture;
mod cluster;
mod load;
mod procfs;
mod report;
mod startup;

use std::path::PathBuf;

use svw_testkit::fixtures;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "bench_driver")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write the admission benchmark bodies: a realistic review and a same-size non-review.
    Review {
        /// Entries in the StorageVersion (one per apiserver).
        #[arg(long, default_value_t = 3)]
        entries: usize,
        #[arg(long)]
        out_validate: PathBuf,
        #[arg(long)]
        out_cheapest: PathBuf,
        /// A review captured from kube-apiserver (`capture-review`): written to --out-real with
        /// its apiServerIDs replaced by the first fixture apiserver's, whose lease exists.
        #[arg(long, requires = "out_real")]
        real: Option<PathBuf>,
        #[arg(long)]
        out_real: Option<PathBuf>,
    },
    /// Create (or renew) live identity leases for the fixture apiservers.
    Leases {
        #[arg(long)]
        kubeconfig: PathBuf,
        /// The first N fixture apiserver IDs (those the review names).
        #[arg(long, default_value_t = 3)]
        count: usize,
    },
    /// Run the load generator once and measure around it.
    Load(load::LoadArgs),
    /// Records one AdmissionReview as kube-apiserver sends it (the second benchmark body).
    CaptureReview(capture::CaptureArgs),
    /// `/status` write latency through kube-apiserver with and without the webhook.
    Writes(cluster::WritesArgs),
    /// Put the GC scenario's leases and StorageVersions (back) in place.
    GcReset(cluster::GcArgs),
    /// Delete the scenario's lease and time until every StorageVersion is clean.
    GcTime(cluster::GcTimeArgs),
    /// Wait until a Prometheus metric (summed over label sets) reaches a value.
    WaitMetric(cluster::WaitMetricArgs),
    /// Create many identity leases and StorageVersions (memory / start-up benchmark).
    Populate(cluster::PopulateArgs),
    /// Start `serve` repeatedly; time to /readyz and resident memory.
    Startup(startup::StartupArgs),
    /// What the bounds cost a review, in process: with against without, alternating.
    BoundsCost(bounds::BoundsArgs),
    /// Write the Markdown report from a results directory.
    Report(report::ReportArgs),
    /// Print N free loopback TCP ports, one per line.
    FreePorts {
        #[arg(default_value_t = 1)]
        n: usize,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Review {
            entries,
            out_validate,
            out_cheapest,
            real,
            out_real,
        } => write_reviews(entries, &out_validate, &out_cheapest).and_then(|()| {
            match (real, out_real) {
                (Some(real), Some(out)) => write_real_review(&real, &out),
                _ => Ok(()),
            }
        }),
        Command::Leases { kubeconfig, count } => {
            runtime().and_then(|rt| rt.block_on(cluster::fixture_leases(&kubeconfig, count)))
        }
        Command::Load(args) => load::run(&args),
        Command::CaptureReview(args) => runtime().and_then(|rt| rt.block_on(capture::run(&args))),
        Command::Writes(args) => runtime().and_then(|rt| rt.block_on(cluster::writes(&args))),
        Command::GcReset(args) => runtime().and_then(|rt| rt.block_on(cluster::gc_reset(&args))),
        Command::GcTime(args) => runtime().and_then(|rt| rt.block_on(cluster::gc_time(&args))),
        Command::WaitMetric(args) => {
            runtime().and_then(|rt| rt.block_on(cluster::wait_metric(&args)))
        }
        Command::Populate(args) => runtime().and_then(|rt| rt.block_on(cluster::populate(&args))),
        Command::Startup(args) => runtime().and_then(|rt| rt.block_on(startup::run(&args))),
        Command::BoundsCost(args) => bounds::run(&args),
        Command::Report(args) => report::run(&args),
        Command::FreePorts { n } => free_ports(n),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_driver: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn write_reviews(
    entries: usize,
    validate: &std::path::Path,
    cheapest: &std::path::Path,
) -> anyhow::Result<()> {
    let ids = fixtures::apiserver_ids(entries);
    let body = serde_json::to_vec(&fixtures::status_update_review(&ids))?;
    std::fs::write(validate, &body)?;
    std::fs::write(cheapest, fixtures::not_a_review(body.len()))?;
    println!("review body: {} bytes", body.len());
    Ok(())
}

fn write_real_review(captured: &std::path::Path, out: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let text = std::fs::read(captured).with_context(|| format!("read {}", captured.display()))?;
    let body = fixtures::real_review_body(&text)
        .with_context(|| format!("{} is not JSON", captured.display()))?;
    std::fs::write(out, &body)?;
    println!("real review body: {} bytes", body.len());
    Ok(())
}

fn free_ports(n: usize) -> anyhow::Result<()> {
    // Hold them all open at once so that they differ.
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    for l in &held {
        println!("{}", l.local_addr()?.port());
    }
    Ok(())
}

/// Appends one JSON value as a line to `path`.
pub fn append_jsonl(path: &std::path::Path, value: &serde_json::Value) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    writeln!(f, "{value}")?;
    Ok(())
}
