//! `report`: the Markdown report (BENCHMARKS.md) from the result files of one `bench/run`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

#[derive(clap::Args)]
pub struct ReportArgs {
    /// The results directory of the run.
    #[arg(long)]
    dir: PathBuf,
    /// criterion's output directory (target/criterion).
    #[arg(long)]
    criterion: PathBuf,
    #[arg(long)]
    out: PathBuf,
    /// A hand-written analysis (Markdown) to include after the figures.
    #[arg(long)]
    notes: Option<PathBuf>,
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// The two bodies of section 1, each with its validate and limit endpoints.
const BODIES: [(&str, &str, &str); 2] = [
    ("synthetic", "validate", "limit"),
    ("real", "validate-real", "limit-real"),
];

/// For each body measured in `eps`: its name, the validate runs and the limit runs.
fn body_pairs<T>(eps: &BTreeMap<String, T>) -> impl Iterator<Item = (&'static str, &T, &T)> {
    BODIES
        .into_iter()
        .filter_map(move |(body, v, l)| Some((body, eps.get(v)?, eps.get(l)?)))
}

pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.retain(|x| x.is_finite());
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// Nearest-rank percentile (`p` in 0..=100).
pub fn percentile(mut xs: Vec<f64>, p: f64) -> f64 {
    xs.retain(|x| x.is_finite());
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

fn verdict(met: bool) -> &'static str {
    if met {
        "**met**"
    } else {
        "**not met**"
    }
}

pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let env: BTreeMap<String, String> = std::fs::read_to_string(args.dir.join("env.txt"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let quick = env.get("quick").is_some_and(|v| v == "1");
    let mut md = String::new();
    let mut goals: Vec<(String, String, bool)> = Vec::new();

    writeln!(md, "# Benchmarks\n")?;
    writeln!(
        md,
        "Written by `bench/run{}` on {} (commit `{}`). Regenerate with `bench/run` on a quiet \
         machine; `bench/run --quick` is a smoke run of the same scripts with tiny sizes and \
         figures that mean nothing.\n",
        if quick { " --quick" } else { "" },
        env.get("date").map_or("?", String::as_str),
        env.get("commit").map_or("?", String::as_str),
    )?;
    if quick {
        writeln!(
            md,
            "> **Quick run**: sizes and durations are cut down; do not quote these figures.\n"
        )?;
    }
    writeln!(md, "## Machine\n")?;
    writeln!(md, "| what | value |\n|---|---|")?;
    for key in [
        "nproc",
        "memory",
        "cpu",
        "kernel",
        "rustc",
        "oha",
        "kube-apiserver",
    ] {
        if let Some(v) = env.get(key) {
            writeln!(md, "| {key} | {v} |")?;
        }
    }
    if let Some(v) = env.get("load_before") {
        writeln!(md, "| /proc/loadavg at start | {v} |")?;
    }
    writeln!(md)?;

    let summary_at = md.len();

    admission(
        &mut md,
        &mut goals,
        &lines(&args.dir.join("admission.jsonl")),
    )?;
    rules(&mut md, &args.criterion)?;
    bounds(
        &mut md,
        &mut goals,
        &lines(&args.dir.join("bounds.jsonl")),
        &lines(&args.dir.join("admission.jsonl")),
    )?;
    writes(&mut md, &mut goals, &lines(&args.dir.join("writes.jsonl")))?;
    gc(
        &mut md,
        &mut goals,
        &lines(&args.dir.join("gc.jsonl")),
        &env,
    )?;
    startup(&mut md, &mut goals, &lines(&args.dir.join("startup.jsonl")))?;
    flood(
        &mut md,
        &mut goals,
        &lines(&args.dir.join("flood.jsonl")),
        &std::fs::read_to_string(args.dir.join("flood-lookups.txt")).unwrap_or_default(),
    )?;

    if let Some(notes) = &args.notes {
        if let Ok(text) = std::fs::read_to_string(notes) {
            writeln!(md, "{}\n", text.trim_end())?;
        }
    }
    if let Ok(cmds) = std::fs::read_to_string(args.dir.join("commands.txt")) {
        writeln!(md, "## Exact commands\n")?;
        writeln!(md, "Every measuring command of this run, in order (paths shortened: `$W` is the run's work directory, `$BIN` the release binaries).\n")?;
        writeln!(md, "```sh\n{}```\n", cmds)?;
    }

    let mut summary = String::new();
    writeln!(summary, "## Goals\n")?;
    writeln!(summary, "| goal | figure | verdict |\n|---|---|---|")?;
    for (goal, figure, met) in &goals {
        writeln!(summary, "| {goal} | {figure} | {} |", verdict(*met))?;
    }
    writeln!(summary)?;
    md.insert_str(summary_at, &summary);
    std::fs::write(&args.out, md).with_context(|| format!("write {}", args.out.display()))?;
    Ok(())
}

/// Goal 1: `validate` at least this share of the echo limit's throughput (both bodies).
const VALIDATE_GOAL: f64 = 0.6;
/// Goal 1: the cheapest path at least this share of the limit's throughput.
const CHEAPEST_GOAL: f64 = 0.9;
/// Goal 1: validate's p99 at 1,000 req/s at most this multiple of the limit's p99.
const P99_GOAL: f64 = 1.5;

/// Median over repetitions of `a[k] / b[k]`, paired by repetition (clean pairs when any).
fn paired_median(a: &BTreeMap<String, &Value>, b: &BTreeMap<String, &Value>, k: &str) -> f64 {
    let pairs: Vec<(&Value, &Value)> = a
        .iter()
        .filter_map(|(rep, x)| b.get(rep).map(|y| (*x, *y)))
        .collect();
    let clean: Vec<f64> = pairs
        .iter()
        .filter(|(x, y)| x["noisy"] != Value::Bool(true) && y["noisy"] != Value::Bool(true))
        .map(|(x, y)| f(x, k) / f(y, k))
        .collect();
    if clean.is_empty() {
        median(pairs.iter().map(|(x, y)| f(x, k) / f(y, k)).collect())
    } else {
        median(clean)
    }
}

/// The median of `k` over an endpoint's clean runs, or over all of them if none is clean.
fn clean_median(reps: &BTreeMap<String, &Value>, k: &str) -> f64 {
    let clean: Vec<f64> = reps
        .values()
        .filter(|r| r["noisy"] != Value::Bool(true))
        .map(|r| f(r, k))
        .collect();
    if clean.is_empty() {
        median(reps.values().map(|r| f(r, k)).collect())
    } else {
        median(clean)
    }
}

/// (mode, connections, rate) -> endpoint -> repetition -> result line.
type Groups<'a> = BTreeMap<(String, u32, String), BTreeMap<String, BTreeMap<String, &'a Value>>>;

fn admission(
    md: &mut String,
    goals: &mut Vec<(String, String, bool)>,
    rows: &[Value],
) -> anyhow::Result<()> {
    writeln!(md, "## 1. Admission over TLS on loopback\n")?;
    if rows.is_empty() {
        writeln!(md, "No results.\n")?;
        return Ok(());
    }
    writeln!(md, "`oha` (HTTP/1.1 keep-alive, TLS, POST of the {}-byte review) against three endpoints, \
        one after the other and repeated (A B C A B C ...), each run {} s:\n\n\
        - **validate**: `POST /validate` of `storageversion-webhook serve` with a `/status` UPDATE of \
          `apps.deployments` (three entries, old and new object with managedFields, all three \
          identity leases live in the cluster, answered *allowed*).\n\
        - **cheapest**: the same server and port, `POST /validate` with a body of the same size that is \
          JSON but not an AdmissionReview: read, scanned and answered 400 before any review (no \
          rules, no lease lookups, no log line). The cheapest thing the admission listener does \
          with a full-size body; the admin listener's `/livez` is plain HTTP and not comparable.\n\
        - **limit**: `examples/bench_echo.rs`, a minimal rustls + hyper server (same provider, TLS \
          1.3/1.2, ALPN http/1.1, same ECDSA P-256 certificate, same Tokio runtime) that reads the \
          body and answers a fixed 133-byte JSON.\n\
        - **validate-real** and **limit-real**: the same two servers with the second body, a \
          review captured from kube-apiserver (`bench/fixtures/real-review.json`: a status UPDATE \
          by `system:apiserver` with object and oldObject, one entry, its apiServerID replaced by \
          a live fixture lease's).\n\n\
        Goals (pinned, 16 and 64 connections, paired ratios of this run): validate ≥ {VALIDATE_GOAL} \
        × the limit's throughput with each body, cheapest ≥ {CHEAPEST_GOAL} ×, and at 1,000 req/s \
        validate's p99 ≤ {P99_GOAL} × the limit's p99 with the same body.\n\n\
        **pinned**: each server on CPU 1 (`taskset -c 1`, so one Tokio worker), `oha \
        --worker-threads 1` on CPU 0. **unpinned**: no affinity, default threads. \
        Server CPU per request is the server's threads' on-CPU time \
        (`/proc/PID/task/*/schedstat`) over the run divided by responses. *outside* is the CPU \
        (% of one core) that everything but the server and oha used during the run, sampled once \
        a second; runs above 5% are marked noisy and left out of the medians when at least one \
        clean run remains. Ratios are paired (same repetition) and then the median is taken.\n",
        rows.first().map(|r| s(r, "body_bytes")).unwrap_or("?"),
        rows.first().map(|r| s(r, "duration")).unwrap_or("?"),
    )?;

    let mut groups: Groups<'_> = BTreeMap::new();
    for r in rows {
        let key = (
            s(r, "mode").to_string(),
            s(r, "conc").parse().unwrap_or(0),
            s(r, "rate").to_string(),
        );
        groups
            .entry(key)
            .or_default()
            .entry(s(r, "endpoint").to_string())
            .or_default()
            .insert(s(r, "rep").to_string(), r);
    }
    writeln!(md, "| mode | conns | rate | endpoint | runs (clean) | req/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/req | outside CPU % |")?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    let mut ratio_lines = Vec::new();
    for ((mode, conc, rate), eps) in &groups {
        let calibration = eps.keys().filter(|ep| ep.starts_with(CALIBRATION_PREFIX));
        for ep in [
            "limit",
            "cheapest",
            "validate",
            "limit-real",
            "validate-real",
        ]
        .into_iter()
        .chain(calibration.map(String::as_str))
        {
            let Some(reps) = eps.get(ep) else { continue };
            let all: Vec<&Value> = reps.values().copied().collect();
            let clean = all
                .iter()
                .filter(|r| r["noisy"] != Value::Bool(true))
                .count();
            let m = |k: &str| clean_median(reps, k);
            writeln!(
                md,
                "| {mode} | {conc} | {} | {ep} | {} ({}) | {:.0} | {:.3} | {:.3} | {:.3} | {:.1} | {:.1} |",
                if rate.is_empty() { "max".to_string() } else { format!("{rate}/s") },
                all.len(),
                clean,
                m("rps"),
                m("p50_ms"),
                m("p99_ms"),
                m("p999_ms"),
                m("server_cpu_us_per_req"),
                m("outside_cpu_pct"),
            )?;
        }
        // Paired ratios over repetitions where both runs are clean (or all, if none are), for
        // each body: the synthetic one and the review captured from kube-apiserver.
        if !rate.is_empty() {
            continue;
        }
        for (body, v, l) in body_pairs(eps) {
            let pair = |clean_only: bool, k: &str, inv: bool| -> (f64, usize) {
                let xs: Vec<f64> = v
                    .iter()
                    .filter_map(|(rep, a)| l.get(rep).map(|b| (a, b)))
                    .filter(|(a, b)| {
                        !clean_only
                            || (a["noisy"] != Value::Bool(true) && b["noisy"] != Value::Bool(true))
                    })
                    .map(|(a, b)| {
                        if inv {
                            f(b, k) / f(a, k)
                        } else {
                            f(a, k) / f(b, k)
                        }
                    })
                    .collect();
                let n = xs.len();
                (median(xs), n)
            };
            let (mut rps_ratio, mut n) = pair(true, "rps", false);
            let (mut cpu_ratio, _) = pair(true, "server_cpu_us_per_req", true);
            if n == 0 {
                (rps_ratio, n) = pair(false, "rps", false);
                (cpu_ratio, _) = pair(false, "server_cpu_us_per_req", true);
            }
            ratio_lines.push((mode.clone(), *conc, body, rps_ratio, cpu_ratio, n));
        }
    }
    writeln!(md)?;
    writeln!(md, "Ratio validate / limit (median of paired ratios). *req/s* is what the load generator saw; \
        *CPU* is limit µs/req ÷ validate µs/req, the throughput ratio if the server alone were the bottleneck:\n")?;
    writeln!(
        md,
        "| mode | conns | body | req/s ratio | CPU ratio | pairs |\n|---|---|---|---|---|---|"
    )?;
    for (mode, conc, body, r, c, n) in &ratio_lines {
        writeln!(md, "| {mode} | {conc} | {body} | {r:.2} | {c:.2} | {n} |")?;
    }
    writeln!(md)?;
    calibration(md, &groups)?;
    // The goals (issue 13): pinned, 16 and 64 connections, paired ratios of one run.
    for (mode, conc, body, r, _, _) in ratio_lines.iter().filter(|l| l.0 == "pinned" && l.1 >= 16) {
        goals.push((
            format!(
                "1. validate ≥ {VALIDATE_GOAL} × limit throughput ({mode}, {conc} connections, {body} body)"
            ),
            format!("{r:.2}"),
            *r >= VALIDATE_GOAL,
        ));
    }
    for ((mode, conc, rate), eps) in &groups {
        if !rate.is_empty() || mode != "pinned" || *conc < 16 {
            continue;
        }
        if let (Some(c), Some(l)) = (eps.get("cheapest"), eps.get("limit")) {
            let r = paired_median(c, l, "rps");
            goals.push((
                format!(
                    "1. cheapest ≥ {CHEAPEST_GOAL} × limit throughput ({mode}, {conc} connections)"
                ),
                format!("{r:.2}"),
                r >= CHEAPEST_GOAL,
            ));
        }
    }
    for ((mode, conc, rate), eps) in &groups {
        if rate.is_empty() || mode != "pinned" {
            continue;
        }
        for (body, v, l) in body_pairs(eps) {
            let p99 = |reps: &BTreeMap<String, &Value>| {
                median(reps.values().map(|r| f(r, "p99_ms")).collect())
            };
            let (vp, lp) = (p99(v), p99(l));
            let r = vp / lp;
            goals.push((
                format!(
                    "1. validate p99 ≤ {P99_GOAL} × limit's p99 at {rate} req/s ({conc} connections, pinned, {body} body)"
                ),
                format!("{r:.2} (p99 {vp:.3} ms vs {lp:.3} ms)"),
                r <= P99_GOAL,
            ));
        }
    }
    Ok(())
}

/// Endpoints `limit-busy<N>`: the limit with N µs of busy CPU added to each request.
const CALIBRATION_PREFIX: &str = "limit-busy";

/// What a known amount of extra CPU per request does to the limit's throughput in this run, set
/// beside what validate adds: the yardstick for the validate goal on the machine at hand.
fn calibration(md: &mut String, groups: &Groups<'_>) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for ((mode, conc, rate), eps) in groups {
        if !rate.is_empty() || mode != "pinned" {
            continue;
        }
        let Some(limit) = eps.get("limit") else {
            continue;
        };
        for (ep, busy) in eps
            .iter()
            .filter(|(ep, _)| ep.starts_with(CALIBRATION_PREFIX))
        {
            let micros = &ep[CALIBRATION_PREFIX.len()..];
            let added = |reps: &BTreeMap<String, &Value>| {
                clean_median(reps, "server_cpu_us_per_req")
                    - clean_median(limit, "server_cpu_us_per_req")
            };
            let validate = eps.get("validate").map(|v| {
                format!(
                    "{:.0} µs, {:.2} ×",
                    added(v),
                    paired_median(v, limit, "rps")
                )
            });
            rows.push(format!(
                "| {conc} | {micros} µs | {:.0} µs | {:.2} | {} |",
                added(busy),
                paired_median(busy, limit, "rps"),
                validate.unwrap_or_else(|| "–".to_string()),
            ));
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(
        md,
        "**Calibration.** `limit-busy<N>` is the limit with N µs of busy CPU added to each \
        request (a spin on the clock: no memory, no allocation, no system call). Its throughput \
        against the limit's, paired in this run, shows how much work per request a ratio leaves on \
        this machine; *added CPU* is the endpoint's server CPU per request minus the limit's \
        (medians of the clean runs, as in the table above), beside validate's with the synthetic body:\n"
    )?;
    writeln!(md, "| conns (pinned) | busy per request | added CPU | req/s ratio to the limit | validate: added CPU, req/s ratio |")?;
    writeln!(md, "|---|---|---|---|---|")?;
    for row in rows {
        writeln!(md, "{row}")?;
    }
    writeln!(md)?;
    Ok(())
}

fn rules(md: &mut String, dir: &Path) -> anyhow::Result<()> {
    writeln!(md, "## 2. Rules alone (criterion)\n")?;
    writeln!(md, "`cargo bench --bench rules` (`benches/rules.rs`): the realistic object of §1 \
        (three entries, judged against its old object with all leases live) and the same with 60 \
        entries. Median time per call. `rules_evaluate` is every rule with ratcheting (what a review \
        runs); `rules_violations` the lease-free rules only; `decode_object` one StorageVersion from \
        JSON; `admission_review` the whole in-process review of the §1 body (decode the review and \
        its object, lease lookups in a static view, rules, response JSON; the old object is only \
        decoded when the new one has findings, and these have none; no log subscriber installed); \
        `real-review` is that with §1's second body, the review captured from kube-apiserver; \
        `decode_review` the one-pass decode of the review and its object alone, on each body.\n")?;
    writeln!(md, "| object | benchmark | median |\n|---|---|---|")?;
    let mut found = false;
    for group in ["3-entries", "60-entries", "real-review"] {
        for bench in [
            "rules_evaluate",
            "rules_violations",
            "decode_object",
            "decode_review",
            "admission_review",
        ] {
            let path = dir.join(group).join(bench).join("new/estimates.json");
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            let ns = v["median"]["point_estimate"].as_f64().unwrap_or(f64::NAN);
            found = true;
            writeln!(md, "| {group} | {bench} | {:.2} µs |", ns / 1000.0)?;
        }
    }
    if !found {
        writeln!(md, "| – | no criterion results | – |")?;
    }
    writeln!(md)?;
    Ok(())
}

/// Goal 1: the bounds of issue 13 cost at most this share of a review's server CPU.
const BOUNDS_GOAL_PCT: f64 = 2.0;

/// The bounds' cost (`bench_driver bounds-cost`): per body, what the bounds add to the
/// in-process review plus the per-request guard, as a share of validate's server CPU per request
/// in section 1 (pinned, 16 connections, median).
fn bounds(
    md: &mut String,
    goals: &mut Goals,
    rows: &[Value],
    admission: &[Value],
) -> anyhow::Result<()> {
    if !heading(md, "### What the bounds cost (in process)", rows)? {
        return Ok(());
    }
    writeln!(
        md,
        "`bench_driver bounds-cost` (`examples/bench_driver/bounds.rs`): the in-process \
        review of each §1 body as `serve` runs it (lease view behind the coalescing wrapper, the \
        default lookup and findings caps) against the same review without them, alternating in \
        slices of 500 reviews, median of the paired differences; and, per request, the guard of \
        the connection limit and the body mark (a connection waiting for its body may be dropped \
        when the listener is full). The loopback runs of §1 vary by far more than 2% from run to run, so the \
        cost is measured here and set against validate's server CPU per request in §1 (pinned, \
        16 connections).\n"
    )?;
    writeln!(md, "| body | with bounds | without | added per review | + request guard | + body mark | share of validate's server CPU |\n|---|---|---|---|---|---|---|")?;
    let per_request = |name: &str| {
        rows.iter()
            .find(|r| s(r, "body") == name)
            .map_or(f64::NAN, |r| f(r, "extra_ns"))
    };
    let guard = per_request("request_guard");
    let mark = per_request("body_mark");
    for (body, endpoint, _) in BODIES {
        let Some(r) = rows.iter().find(|r| s(r, "body") == body) else {
            continue;
        };
        let server_us = median(
            admission
                .iter()
                .filter(|a| {
                    s(a, "mode") == "pinned"
                        && s(a, "conc") == "16"
                        && s(a, "rate").is_empty()
                        && s(a, "endpoint") == endpoint
                })
                .map(|a| f(a, "server_cpu_us_per_req"))
                .collect(),
        );
        let extra = f(r, "extra_ns").max(0.0) + guard + mark;
        let pct = 100.0 * extra / (server_us * 1000.0);
        let share = if pct.is_finite() {
            format!("{pct:.2}% of {server_us:.1} µs")
        } else {
            "– (no §1 run)".to_string()
        };
        writeln!(
            md,
            "| {body} | {:.2} µs | {:.2} µs | {:.0} ns | {guard:.0} ns | {mark:.0} ns | {share} |",
            f(r, "bounded_ns") / 1000.0,
            f(r, "unbounded_ns") / 1000.0,
            f(r, "extra_ns"),
        )?;
        if !pct.is_finite() {
            continue;
        }
        goals.push((
            format!("1. the bounds cost ≤ {BOUNDS_GOAL_PCT}% ({body} body; in process, set against validate's server CPU per request)"),
            format!("{pct:.2}% ({extra:.0} ns of {server_us:.1} µs)"),
            pct <= BOUNDS_GOAL_PCT,
        ));
    }
    writeln!(md)?;
    let miss = per_request("lookup_budget_on_a_miss");
    if miss.is_finite() {
        writeln!(
            md,
            "Only on a lease-cache miss (never on a review whose IDs the watch holds), beside a live \
            GET of about a millisecond: the negative cache asked and a token taken from the lookup \
            budget, {miss:.0} ns.\n"
        )?;
    }
    Ok(())
}

/// Each goal: what it asks, what was measured, whether it is met.
type Goals = Vec<(String, String, bool)>;

/// Writes a section's heading; with no `rows`, also "No results." and returns false.
fn heading(md: &mut String, title: &str, rows: &[Value]) -> anyhow::Result<bool> {
    writeln!(md, "{title}\n")?;
    if rows.is_empty() {
        writeln!(md, "No results.\n")?;
    }
    Ok(!rows.is_empty())
}

fn writes(md: &mut String, goals: &mut Goals, rows: &[Value]) -> anyhow::Result<()> {
    if !heading(md, "## 3. Through kube-apiserver", rows)? {
        return Ok(());
    }
    writeln!(md, "`PUT .../storageversions/<name>/status` of a StorageVersion with three entries (each write \
        changes one entry's servedVersions), one at a time, timed by the client (kube-rs) from \
        request to response. The webhook (`serve`, failurePolicy Fail) is registered for \
        storageversions and storageversions/status, then unregistered, alternately in blocks; \
        after each switch, probe writes (not counted) wait until kube-apiserver has picked it up, \
        and the webhook's review counter confirms it was called for every write of a registered \
        block and for none of the others.\n")?;
    writeln!(
        md,
        "| arm | writes | webhook calls | median ms | p90 ms | p99 ms |\n|---|---|---|---|---|---|"
    )?;
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in rows {
        let lat: Vec<f64> = r["latency_ms"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        writeln!(
            md,
            "| {} | {} | {:.0} | {:.3} | {:.3} | {:.3} |",
            s(r, "arm"),
            lat.len(),
            r["webhook_calls"].as_f64().unwrap_or(f64::NAN),
            median(lat.clone()),
            percentile(lat.clone(), 90.0),
            percentile(lat.clone(), 99.0)
        )?;
        by.entry(s(r, "arm").to_string()).or_default().extend(lat);
    }
    if let (Some(a), Some(b)) = (by.get("registered"), by.get("not_registered")) {
        let added_median = median(a.clone()) - median(b.clone());
        let added_p99 = percentile(a.clone(), 99.0) - percentile(b.clone(), 99.0);
        writeln!(md, "\nAdded by the webhook: **{added_median:.3} ms at the median**, {added_p99:.3} ms at p99.\n")?;
        goals.push((
            "3. webhook adds < 2 ms to a `/status` write at the median".into(),
            format!("{added_median:.3} ms (p99 {added_p99:.3} ms)"),
            added_median < 2.0,
        ));
    }
    Ok(())
}

fn gc(
    md: &mut String,
    goals: &mut Goals,
    rows: &[Value],
    env: &BTreeMap<String, String>,
) -> anyhow::Result<()> {
    if !heading(md, "## 4. Garbage collection versus upstream", rows)? {
        return Ok(());
    }
    writeln!(md, "Three identity leases; {} StorageVersions, each with an entry of all three \
        apiservers (**strip**), or with only the entry of the apiserver that goes away \
        (**delete**). One lease is deleted and a watch on the objects times until every object \
        is clean (entry removed, or object deleted). Collectors, one at a time, alternating run by run:\n\n\
        - **ours**: `storageversion-webhook serve --gc-lease-deletion-grace 0s` (default is 30 s \
          by design, docs/design.md §5; upstream has no grace, so it is set to 0 for this race; \
          the re-check of the lease before every write stays on), concurrency {} (default); \
          started, then the lease deleted once it leads and finished its first sweep.\n\
        - **kcm**: kube-controller-manager {} running only `--controllers=storage-version-gc`, \
          default client QPS (20, burst 30), and **kcm-qps1000** with `--kube-api-qps 1000 \
          --kube-api-burst 1000`; the lease deleted 3 s after `/healthz` is ok.\n",
        rows.first().map(|r| r["objects"].to_string()).unwrap_or_default(),
        env.get("gc_concurrency").map_or("8", String::as_str),
        env.get("kube-apiserver").map_or("", String::as_str),
    )?;
    let mut by: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    let mut cost: BTreeMap<(String, String), Vec<[f64; 5]>> = BTreeMap::new();
    for r in rows {
        let key = (s(r, "mode").to_string(), s(r, "gc").to_string());
        by.entry(key.clone()).or_default().push(f(r, "seconds"));
        let objects = f(r, "objects").max(1.0);
        cost.entry(key).or_default().push([
            f(r, "sv_requests") / objects,
            f(r, "sv_writes") / objects,
            f(r, "lease_gets"),
            f(r, "events") / objects,
            f(r, "events_seconds"),
        ]);
    }
    writeln!(
        md,
        "API requests as kube-apiserver counted them (`apiserver_request_total` before and after \
         each run; StorageVersion GET/PUT/PATCH/DELETE per object, lease GETs in all, Event \
         POST/PATCH per object; medians). Goal for ours: 1 write per object plus one GET per lease. \
         Ours records its Events after the writes of a batch: for ours, the requests are counted \
         once every Event is recorded, and *Events done s* says when that was (not part of the \
         collection time).\n"
    )?;
    writeln!(
        md,
        "| case | collector | runs | median s | runs (s) | SV requests/object | SV writes/object | lease GETs | Events/object | Events done s |\n|---|---|---|---|---|---|---|---|---|---|"
    )?;
    for ((mode, gc), xs) in &by {
        let c = cost
            .get(&(mode.clone(), gc.clone()))
            .cloned()
            .unwrap_or_default();
        let med = |i: usize| median(c.iter().map(|x| x[i]).collect());
        writeln!(
            md,
            "| {mode} | {gc} | {} | {:.2} | {} | {:.2} | {:.2} | {:.0} | {:.2} | {} |",
            xs.len(),
            median(xs.clone()),
            xs.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            med(0),
            med(1),
            med(2),
            med(3),
            Some(med(4))
                .filter(|x| x.is_finite())
                .map_or("–".to_string(), |x| format!("{x:.2}")),
        )?;
    }
    writeln!(md)?;
    for mode in ["strip", "delete"] {
        let m = |gc: &str| {
            by.get(&(mode.to_string(), gc.to_string()))
                .map(|x| median(x.clone()))
        };
        if let (Some(ours), Some(def), Some(fast)) = (m("ours"), m("kcm"), m("kcm-qps1000")) {
            writeln!(md, "{mode}: upstream at defaults / ours = **{:.1}×**; upstream with QPS 1000 / ours = **{:.2}×**.\n", def / ours, fast / ours)?;
            if let Some(c) = cost.get(&(mode.to_string(), "ours".to_string())) {
                let writes = median(c.iter().map(|x| x[1]).collect());
                let requests = median(c.iter().map(|x| x[0]).collect());
                goals.push((
                    format!("4. GC API cost ({mode}): 1 write per object, no per-object read"),
                    format!("{requests:.2} StorageVersion requests, {writes:.2} writes per object"),
                    writes <= 1.05 && requests <= 1.05,
                ));
            }
            if mode == "strip" {
                goals.push((
                    "4. GC ≥ 10× faster than upstream at its defaults (strip, 500 objects)".into(),
                    format!("{:.1}× ({ours:.2} s vs {def:.2} s)", def / ours),
                    def / ours >= 10.0,
                ));
                goals.push((
                    "4. GC ≥ 1.5× faster than upstream with QPS 1000 (strip)".into(),
                    format!("{:.2}× ({ours:.2} s vs {fast:.2} s)", fast / ours),
                    fast / ours >= 1.5,
                ));
            } else {
                goals.push((
                    "4. (only entry: objects deleted) ≥ 10× faster than upstream at defaults"
                        .into(),
                    format!("{:.1}× ({ours:.2} s vs {def:.2} s)", def / ours),
                    def / ours >= 10.0,
                ));
                goals.push((
                    "4. (only entry: objects deleted) ≥ 1.5× faster than upstream with QPS 1000"
                        .into(),
                    format!("{:.2}× ({ours:.2} s vs {fast:.2} s)", fast / ours),
                    fast / ours >= 1.5,
                ));
            }
        }
    }
    Ok(())
}

fn startup(md: &mut String, goals: &mut Goals, rows: &[Value]) -> anyhow::Result<()> {
    if !heading(md, "## 5. Memory and start-up", rows)? {
        return Ok(());
    }
    writeln!(
        md,
        "`storageversion-webhook serve` with its defaults (garbage collector on, so it also leads \
        and sweeps) started repeatedly against the cluster; time from spawn to the first `200` \
        from `/readyz` (polled every 5 ms), resident memory (`VmRSS`) at that moment and after it \
        settled, and the peak (`VmHWM`).\n"
    )?;
    writeln!(md, "| cluster | runs | ready s (median) | ready s (max) | RSS at ready MiB | RSS settled MiB | peak RSS MiB (max) |\n|---|---|---|---|---|---|---|")?;
    let mut by: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for r in rows {
        by.entry(s(r, "cluster").to_string()).or_default().push(r);
    }
    for (cluster, rs) in &by {
        let col = |k: &str| rs.iter().map(|r| f(r, k)).collect::<Vec<_>>();
        let ready = median(col("ready_seconds"));
        let ready_max = col("ready_seconds").into_iter().fold(0.0, f64::max);
        let peak = col("rss_peak_mib").into_iter().fold(0.0, f64::max);
        writeln!(
            md,
            "| {cluster} | {} | {ready:.3} | {ready_max:.3} | {:.1} | {:.1} | {peak:.1} |",
            rs.len(),
            median(col("rss_ready_mib")),
            median(col("rss_settled_mib")),
        )?;
        let settled = median(col("rss_settled_mib"));
        // The collector's goals: idle < 20 MiB; with 10,000 leases and 2,000 StorageVersions,
        // GC on and leading, peak < 40 MiB and settled < 32 MiB; ready in under 1 s.
        let (peak_goal, settled_goal) = if cluster == "idle" {
            (20.0, 20.0)
        } else {
            (40.0, 32.0)
        };
        goals.push((
            format!("5. resident memory: peak < {peak_goal:.0} MiB, settled < {settled_goal:.0} MiB ({cluster})"),
            format!("peak {peak:.1} MiB, settled {settled:.1} MiB"),
            peak < peak_goal && settled < settled_goal,
        ));
        goals.push((
            format!("5. start to /readyz < 1 s ({cluster})"),
            format!("median {ready:.3} s, max {ready_max:.3} s"),
            ready_max < 1.0,
        ));
    }
    writeln!(md)?;
    Ok(())
}

/// Goal 6: kube-apiserver-like reviews' p99 under a flood at most this multiple of their p99
/// without it.
const FLOOD_P99_GOAL: f64 = 2.0;
/// Goal 6, with the webhook's core saturated: every review answered and the p99 at most this,
/// a third of the 3 s the chart gives kube-apiserver's webhook call.
const SATURATED_P99_GOAL_MS: f64 = 1000.0;

fn flood(md: &mut String, goals: &mut Goals, rows: &[Value], lookups: &str) -> anyhow::Result<()> {
    if !heading(
        md,
        "## 6. kube-apiserver's reviews under a hostile flood",
        rows,
    )? {
        return Ok(());
    }
    let rate = rows
        .iter()
        .map(|r| s(r, "flood_rate"))
        .find(|r| !r.is_empty())
        .unwrap_or("–");
    writeln!(
        md,
        "Reviews like kube-apiserver's (the captured body when present), 100 req/s on 4 \
         connections of their own (oha `-q 100 --latency-correction`), alone and while a flood \
         of hostile reviews (the synthetic body with its 16 apiServerIDs renamed to ones without \
         a lease, 64 connections) runs against the same `serve`: once as fast as oha can (the \
         webhook's core saturated) and once at {rate} req/s in all. `serve` runs alone on CPU 0, \
         every oha on CPU 1. The flood keeps the synthetic review's `userInfo` \
         (`system:apiserver`), the worst case: it also spends the share of the lookup budget kept \
         for kube-apiserver and never uses the negative cache, so its live lookups are bounded by \
         `--lease-lookup-rate` (default 20/s) alone; what remains is CPU. Medians over \
         repetitions.\n"
    )?;
    writeln!(
        md,
        "| case | reps | req/s | p50 ms | p99 ms | non-200 |\n|---|---|---|---|---|---|"
    )?;
    let mut p99 = BTreeMap::new();
    let mut failed = BTreeMap::new();
    for case in [
        "alone",
        "flood",
        "hostile",
        "flood-bounded",
        "hostile-bounded",
    ] {
        let reps: Vec<&Value> = rows.iter().filter(|r| s(r, "case") == case).collect();
        if reps.is_empty() {
            continue;
        }
        let col = |k: &str| median(reps.iter().map(|r| f(r, k)).collect());
        let label = match case {
            "alone" => "kube-apiserver-like, alone".to_string(),
            "flood" => "kube-apiserver-like, during the flood at full speed".to_string(),
            "hostile" => "the flood itself, full speed (64 connections)".to_string(),
            "flood-bounded" => format!("kube-apiserver-like, during a flood of {rate} req/s"),
            _ => format!("the flood itself, {rate} req/s (64 connections)"),
        };
        writeln!(
            md,
            "| {label} | {} | {:.0} | {:.3} | {:.3} | {:.0} |",
            reps.len(),
            col("rps"),
            col("p50_ms"),
            col("p99_ms"),
            col("non_200")
        )?;
        p99.insert(case, col("p99_ms"));
        failed.insert(case, reps.iter().map(|r| f(r, "non_200")).sum::<f64>());
    }
    writeln!(md)?;
    if !lookups.trim().is_empty() {
        writeln!(
            md,
            "The webhook's lease lookups after the runs:\n\n```\n{}\n```\n",
            lookups.trim_end()
        )?;
    }
    let alone = p99.get("alone").copied();
    if let (Some(alone), Some(flood)) = (alone, p99.get("flood-bounded")) {
        let ratio = flood / alone;
        goals.push((
            format!("6. kube-apiserver-like p99 during a flood of {rate} req/s ≤ {FLOOD_P99_GOAL}× without"),
            format!("{flood:.3} ms vs {alone:.3} ms ({ratio:.2}×)"),
            ratio <= FLOOD_P99_GOAL,
        ));
    }
    if let Some(flood) = p99.get("flood").copied() {
        let lost = failed.get("flood").copied().unwrap_or(0.0);
        goals.push((
            format!(
                "6. a flood saturating the webhook's core: every kube-apiserver-like review answered, p99 ≤ {SATURATED_P99_GOAL_MS:.0} ms"
            ),
            match alone {
                Some(a) => format!("p99 {flood:.3} ms ({:.2}× alone), {lost:.0} not answered 200", flood / a),
                None => format!("p99 {flood:.3} ms, {lost:.0} not answered 200"),
            },
            flood <= SATURATED_P99_GOAL_MS && lost == 0.0,
        ));
    }
    Ok(())
}
