//! `load`: one run of the load generator with the measurements around it.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use serde_json::{json, Map, Value};

use crate::procfs;

#[derive(clap::Args)]
pub struct LoadArgs {
    /// Results file (JSON lines); one line is appended.
    #[arg(long)]
    out: PathBuf,
    /// The server under load (its threads' CPU time is measured).
    #[arg(long)]
    server_pid: u32,
    /// Labels for the result line, `key=value` (repeatable).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Above this much CPU used outside the rig (% of one core, mean over the run), the run is
    /// marked noisy.
    #[arg(long, default_value_t = 5.0)]
    noisy_above: f64,
    /// The load generator command (oha with `--output-format json`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub fn run(args: &LoadArgs) -> anyhow::Result<()> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| anyhow!("no load generator command"))?;
    let children0 = procfs::children_cpu();
    let server0 = procfs::task_cpu(args.server_pid);
    let busy0 = procfs::machine_busy();
    let started = Instant::now();
    let mut child = Command::new(program)
        .args(rest)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {program}"))?;
    let gen_pid = child.id();
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let reader = std::thread::spawn(move || -> String {
        use std::io::Read;
        let mut s = String::new();
        let mut r = stdout;
        let _ = r.read_to_string(&mut s);
        s
    });

    // Once a second: what did the machine spend outside the server and the generator?
    let mut outside: Vec<f64> = Vec::new();
    let mut last = (
        Instant::now(),
        procfs::machine_busy(),
        procfs::task_cpu(args.server_pid),
        procfs::process_cpu(gen_pid),
    );
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
        if last.0.elapsed() >= Duration::from_secs(1) {
            let now = (
                Instant::now(),
                procfs::machine_busy(),
                procfs::task_cpu(args.server_pid),
                procfs::process_cpu(gen_pid),
            );
            if let (Some(g0), Some(g1)) = (last.3, now.3) {
                let wall = now.0.duration_since(last.0).as_secs_f64();
                let other = now.1.as_secs_f64()
                    - last.1.as_secs_f64()
                    - (now.2.as_secs_f64() - last.2.as_secs_f64())
                    - (g1.as_secs_f64() - g0.as_secs_f64());
                outside.push((other / wall * 100.0).max(0.0));
            }
            last = now;
        }
    };
    let wall = started.elapsed().as_secs_f64();
    let server_cpu = procfs::task_cpu(args.server_pid)
        .saturating_sub(server0)
        .as_secs_f64();
    let gen_cpu = procfs::children_cpu()
        .saturating_sub(children0)
        .as_secs_f64();
    let busy = procfs::machine_busy().saturating_sub(busy0).as_secs_f64();
    let text = reader.join().map_err(|_| anyhow!("reader thread failed"))?;
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        return Err(anyhow!("{program} failed ({status}): {err}"));
    }
    let oha: Value = serde_json::from_str(&text)
        .with_context(|| format!("{program} did not print JSON: {text:.300}"))?;

    let codes = oha["statusCodeDistribution"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let responses: u64 = codes.values().filter_map(Value::as_u64).sum();
    let ok: u64 = codes.get("200").and_then(Value::as_u64).unwrap_or(0);
    let errors: u64 = oha["errorDistribution"]
        .as_object()
        .map(|m| {
            m.iter()
                // Requests cut off by the end of a timed run are not failures.
                .filter(|(k, _)| !k.contains("aborted due to deadline"))
                .filter_map(|(_, v)| v.as_u64())
                .sum()
        })
        .unwrap_or(0);
    let ms = |key: &str| oha["latencyPercentiles"][key].as_f64().map(|s| s * 1000.0);
    let outside_mean = if outside.is_empty() {
        // Too short to sample per second: use the whole run.
        ((busy - server_cpu - gen_cpu) / wall * 100.0).max(0.0)
    } else {
        outside.iter().sum::<f64>() / outside.len() as f64
    };
    let outside_max = outside.iter().copied().fold(outside_mean, f64::max);

    let mut line = Map::new();
    for label in &args.labels {
        let (k, v) = label
            .split_once('=')
            .ok_or_else(|| anyhow!("label {label:?} is not key=value"))?;
        line.insert(k.to_string(), Value::String(v.to_string()));
    }
    let rps = oha["summary"]["requestsPerSec"].as_f64().unwrap_or(0.0);
    line.insert("rps".into(), json!(rps));
    line.insert("p50_ms".into(), json!(ms("p50")));
    line.insert("p99_ms".into(), json!(ms("p99")));
    line.insert("p999_ms".into(), json!(ms("p99.9")));
    line.insert("responses".into(), json!(responses));
    line.insert("non_200".into(), json!(responses - ok));
    line.insert("errors".into(), json!(errors));
    line.insert(
        "server_cpu_us_per_req".into(),
        json!(if responses > 0 {
            server_cpu * 1e6 / responses as f64
        } else {
            0.0
        }),
    );
    line.insert("server_cpu_pct".into(), json!(server_cpu / wall * 100.0));
    line.insert("generator_cpu_pct".into(), json!(gen_cpu / wall * 100.0));
    line.insert("outside_cpu_pct".into(), json!(outside_mean));
    line.insert("outside_cpu_pct_max".into(), json!(outside_max));
    line.insert("noisy".into(), json!(outside_mean > args.noisy_above));
    line.insert("seconds".into(), json!(wall));
    let line = Value::Object(line);
    eprintln!(
        "  {}: {:.0} req/s, p50 {:.3} ms, p99 {:.3} ms, server {:.1} us/req, outside {:.1}%{}",
        args.labels.join(" "),
        rps,
        ms("p50").unwrap_or(0.0),
        ms("p99").unwrap_or(0.0),
        line["server_cpu_us_per_req"].as_f64().unwrap_or(0.0),
        outside_mean,
        if responses - ok > 0 || errors > 0 {
            format!(" ({} non-200, {errors} errors)", responses - ok)
        } else {
            String::new()
        }
    );
    crate::append_jsonl(&args.out, &line)
}
