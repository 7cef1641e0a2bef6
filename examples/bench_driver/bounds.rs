//! `bounds-cost`: what issue 13's bounds cost a review, measured in process.
//!
//! End to end, the loopback benchmark varies by ±10-20% from run to run on this kind of machine,
//! far more than the 2% the bounds may cost, so their cost is measured where it can be resolved:
//! the whole review of a body as `serve` runs it (the lease view behind `Coalescing`, the default
//! `ReviewLimits`: lookup cap, findings cap) against the same review without them (the lease view
//! itself, no caps), alternating in short slices so that drift hits both alike; and the
//! per-request guard of the connection limit (a request marked in progress on its connection,
//! then done). The per-connection parts (the slot taken at accept, the idle timer) are not per
//! request; `bench/notes.md` gives their share of a profile.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use prometheus_client::registry::Registry;
use serde_json::json;
use storageversion_webhook::admission::{Admission, Enforcement, ReviewLimits};
use storageversion_webhook::leases::budget::{LookupBudget, NegativeCache, Requester};
use storageversion_webhook::leases::coalesce::Coalescing;
use storageversion_webhook::leases::{LeaseView, StaticLeases};
use storageversion_webhook::metrics::Metrics;
use storageversion_webhook::model::LeaseRecord;
use storageversion_webhook::server::conns::ConnLimit;
use svw_testkit::fixtures;

use crate::report::median;

#[derive(clap::Args)]
pub struct BoundsArgs {
    /// Results file (JSON lines); one line per body and one for the guard.
    #[arg(long)]
    out: PathBuf,
    /// `label=path` of a review body (repeatable), e.g. `synthetic=validate.json`.
    #[arg(long = "body", required = true)]
    bodies: Vec<String>,
    /// Alternations of the two reviews; the paired ratios' median is reported.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
    /// Reviews per slice.
    #[arg(long, default_value_t = 500)]
    slice: usize,
}

/// The in-process review as `serve` builds it (`bounded`), or without issue 13's bounds.
fn admission(bounded: bool) -> Admission {
    let records = fixtures::apiserver_ids(3)
        .into_iter()
        .map(LeaseRecord::live_apiserver);
    let leases = Arc::new(StaticLeases::new(records));
    let view: Arc<dyn LeaseView> = if bounded {
        Arc::new(Coalescing::new(leases))
    } else {
        leases
    };
    let mut registry = Registry::default();
    let admission = Admission::new(
        view,
        Enforcement::Deny,
        Duration::from_secs(30),
        Metrics::register(&mut registry),
    );
    if bounded {
        admission
    } else {
        admission.with_limits(ReviewLimits {
            max_lease_lookups: usize::MAX,
            max_findings: usize::MAX,
        })
    }
}

/// Nanoseconds per review over one slice.
fn slice(admission: &Admission, body: &[u8], n: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    for _ in 0..n {
        let out = futures::executor::block_on(admission.review(black_box(body)));
        ensure!(out.is_ok(), "the benchmark body is not a review: {out:?}");
        black_box(out.ok());
    }
    Ok(started.elapsed().as_nanos() as f64 / n as f64)
}

pub fn run(args: &BoundsArgs) -> anyhow::Result<()> {
    let bounded = admission(true);
    let unbounded = admission(false);
    for spec in &args.bodies {
        let (label, path) = spec
            .split_once('=')
            .with_context(|| format!("--body {spec:?}: want label=path"))?;
        let body = std::fs::read(path).with_context(|| format!("read {path}"))?;
        // Warm up both, then alternate (which goes first alternates too).
        slice(&bounded, &body, args.slice)?;
        slice(&unbounded, &body, args.slice)?;
        let (mut with, mut without, mut diffs) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..args.rounds {
            let (a, b) = if round % 2 == 0 {
                let a = slice(&bounded, &body, args.slice)?;
                (a, slice(&unbounded, &body, args.slice)?)
            } else {
                let b = slice(&unbounded, &body, args.slice)?;
                (slice(&bounded, &body, args.slice)?, b)
            };
            with.push(a);
            without.push(b);
            diffs.push(a - b);
        }
        let line = json!({
            "body": label,
            "rounds": args.rounds,
            "bounded_ns": median(with),
            "unbounded_ns": median(without),
            "extra_ns": median(diffs),
        });
        println!("{line}");
        crate::append_jsonl(&args.out, &line)?;
    }
    let limit = ConnLimit::new(1);
    let slot = futures::executor::block_on(limit.acquire());
    let n = 1_000_000u32;
    let mut per_call = Vec::new();
    for _ in 0..21 {
        let started = Instant::now();
        for _ in 0..n {
            drop(black_box(slot.state.begin_request()));
        }
        per_call.push(started.elapsed().as_nanos() as f64 / f64::from(n));
    }
    let line = json!({"body": "request_guard", "extra_ns": median(per_call)});
    println!("{line}");
    crate::append_jsonl(&args.out, &line)?;

    // The body mark: every POST marks its connection as waiting for a body and drops the mark
    // once the body is in (so a full listener can drop the slowest sender).
    let per_call = per_call_ns(|| drop(black_box(slot.state.awaiting_body())));
    let line = json!({"body": "body_mark", "extra_ns": per_call});
    println!("{line}");
    crate::append_jsonl(&args.out, &line)?;

    // The lookup budget, on a miss only (a review whose IDs are all in the watch cache never
    // reaches it): a token taken (or refused) and the negative cache asked. The bucket is far
    // larger than the calls, so every take is the common, granted one.
    let budget = LookupBudget::new(1e12, u32::MAX);
    let negative = NegativeCache::new(Duration::from_secs(5), 4096);
    let per_call = per_call_ns(|| {
        black_box(negative.is_missing(black_box("apiserver-0123456789abcdef")));
        black_box(budget.try_take(black_box(Requester::Other)));
    });
    let line = json!({"body": "lookup_budget_on_a_miss", "extra_ns": per_call});
    println!("{line}");
    crate::append_jsonl(&args.out, &line)?;
    Ok(())
}

/// Median nanoseconds per call of `f` over 21 runs of a million calls.
fn per_call_ns(mut f: impl FnMut()) -> f64 {
    let n = 1_000_000u32;
    let mut per_call = Vec::new();
    for _ in 0..21 {
        let started = Instant::now();
        for _ in 0..n {
            f();
        }
        per_call.push(started.elapsed().as_nanos() as f64 / f64::from(n));
    }
    median(per_call)
}
