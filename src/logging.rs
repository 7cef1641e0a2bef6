//! Log set-up: tracing to stderr, text or JSON, level from `--log-level` or `RUST_LOG`.
//!
//! Lines are formatted by the thread that logs and written by a dedicated thread
//! (`tracing-appender`'s non-blocking writer), so a review never waits for a `write(2)` to
//! stderr, and under load many lines go out in one write. It never drops a line: when the
//! queue is full, logging waits. Keep the [`LogGuard`] until the process ends; dropping it
//! writes out what is still queued.

use std::io::BufWriter;

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug, clap::Args)]
pub struct LogArgs {
    /// Log line format.
    #[arg(
        long,
        value_enum,
        default_value = "text",
        global = true,
        env = "SVW_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// Log filter (e.g. `info`, `debug`, `storageversion_webhook=debug,kube=info`). Overrides
    /// `RUST_LOG`; without either, `info`.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
}

/// Writes out the queued log lines when dropped.
#[must_use = "log lines still queued are lost unless the guard lives until the process ends"]
pub struct LogGuard {
    _worker: WorkerGuard,
}

/// Lines queued for the writer thread before logging waits (the queue is allocated up front:
/// tracing-appender's default of 128,000 lines costs 4 MiB of resident memory).
const QUEUED_LINES: usize = 8 * 1024;

/// How much the writer thread gathers before a write; it also writes whenever the queue is empty.
const WRITE_BUFFER_BYTES: usize = 64 * 1024;

/// Installs the global subscriber. Returns an error naming the bad filter.
pub fn init(args: &LogArgs) -> anyhow::Result<LogGuard> {
    let filter = match &args.log_level {
        Some(level) => EnvFilter::try_new(level)
            .map_err(|e| anyhow::anyhow!("--log-level {level:?} is not a valid filter: {e}"))?,
        None => match std::env::var("RUST_LOG") {
            Ok(v) if !v.is_empty() => EnvFilter::try_new(&v)
                .map_err(|e| anyhow::anyhow!("RUST_LOG {v:?} is not a valid filter: {e}"))?,
            _ => EnvFilter::new("info"),
        },
    };
    // The worker flushes the buffer each time it has emptied its queue.
    let (writer, worker) = NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(QUEUED_LINES)
        .thread_name("log-writer")
        .finish(BufWriter::with_capacity(
            WRITE_BUFFER_BYTES,
            std::io::stderr(),
        ));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let result = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot install the log subscriber: {e}"))?;
    Ok(LogGuard { _worker: worker })
}
