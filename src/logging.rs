//! Log set-up: tracing to stderr, text or JSON, level from `--log-level` or `RUST_LOG`.

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

/// Installs the global subscriber. Returns an error naming the bad filter.
pub fn init(args: &LogArgs) -> anyhow::Result<()> {
    let filter = match &args.log_level {
        Some(level) => EnvFilter::try_new(level)
            .map_err(|e| anyhow::anyhow!("--log-level {level:?} is not a valid filter: {e}"))?,
        None => match std::env::var("RUST_LOG") {
            Ok(v) if !v.is_empty() => EnvFilter::try_new(&v)
                .map_err(|e| anyhow::anyhow!("RUST_LOG {v:?} is not a valid filter: {e}"))?,
            _ => EnvFilter::new("info"),
        },
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot install the log subscriber: {e}"))
}
