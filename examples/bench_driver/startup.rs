//! `startup`: start `serve` several times; time from spawn to `/readyz` ok, resident memory once
//! ready and after it settled.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde_json::json;

use crate::procfs;
use svw_testkit::http_get;

#[derive(clap::Args)]
pub struct StartupArgs {
    #[arg(long)]
    out: PathBuf,
    /// Labels for the result lines, `key=value` (repeatable).
    #[arg(long = "label")]
    labels: Vec<String>,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Seconds to leave it running after ready before reading the memory again.
    #[arg(long, default_value_t = 10)]
    settle: u64,
    /// Where the server's output goes (appended).
    #[arg(long)]
    log: PathBuf,
    /// The server command; `{listen}` and `{admin}` are replaced by free loopback addresses.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

pub async fn run(args: &StartupArgs) -> anyhow::Result<()> {
    for rep in 0..args.reps {
        let listen = free_addr()?;
        let admin = free_addr()?;
        let cmd: Vec<String> = args
            .command
            .iter()
            .map(|a| {
                a.replace("{listen}", &listen.to_string())
                    .replace("{admin}", &admin.to_string())
            })
            .collect();
        let (program, rest) = cmd.split_first().ok_or_else(|| anyhow!("no command"))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&args.log)?;
        let t0 = Instant::now();
        let mut child = Command::new(program)
            .args(rest)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {program}"))?;
        let pid = child.id();
        let ready = loop {
            if let Some((200, _)) = http_get(admin, "/readyz").await {
                break t0.elapsed();
            }
            if let Some(status) = child.try_wait()? {
                bail!(
                    "{program} exited before it was ready ({status}); see {}",
                    args.log.display()
                );
            }
            if t0.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                bail!("not ready within 120 s; see {}", args.log.display());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let rss_ready = procfs::status_kib(pid, "VmRSS").unwrap_or(0);
        tokio::time::sleep(Duration::from_secs(args.settle)).await;
        let rss_settled = procfs::status_kib(pid, "VmRSS").unwrap_or(0);
        let hwm = procfs::status_kib(pid, "VmHWM").unwrap_or(0);
        // SAFETY: kill(2) on our own child's PID.
        unsafe {
            libc::kill(pid as i32, libc::SIGTERM);
        }
        let end = Instant::now() + Duration::from_secs(40);
        loop {
            if child.try_wait()?.is_some() {
                break;
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut line = crate::cluster::labelled(&args.labels)?;
        line.insert("rep".into(), json!(rep));
        line.insert("ready_seconds".into(), json!(ready.as_secs_f64()));
        line.insert("rss_ready_mib".into(), json!(rss_ready as f64 / 1024.0));
        line.insert("rss_settled_mib".into(), json!(rss_settled as f64 / 1024.0));
        line.insert("rss_peak_mib".into(), json!(hwm as f64 / 1024.0));
        eprintln!(
            "  {} #{rep}: ready after {:.3}s, RSS {:.1} MiB at ready, {:.1} MiB after {}s, peak {:.1} MiB",
            args.labels.join(" "),
            ready.as_secs_f64(),
            rss_ready as f64 / 1024.0,
            rss_settled as f64 / 1024.0,
            args.settle,
            hwm as f64 / 1024.0
        );
        crate::append_jsonl(&args.out, &serde_json::Value::Object(line))?;
    }
    Ok(())
}
