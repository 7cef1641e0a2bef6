//! Log set-up: tracing to stderr, text or JSON, level from `--log-level` or `RUST_LOG`.
//!
//! Lines are formatted by the thread that logs and written by a dedicated thread
//! (`tracing-appender`'s non-blocking writer, see [`writer`]): a review never waits for a
//! `write(2)` to stderr. The writer thread writes through a [`WRITE_BUFFER_BYTES`] buffer that it
//! flushes whenever no line is waiting, so under load many lines go out in one `write(2)`. It
//! never drops a line: when [`MAX_QUEUED_LINES`] are waiting, logging waits. Keep the
//! [`LogGuard`] until the process ends; dropping it writes out what is still queued.

use std::io::IsTerminal;

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

/// Lines queued for the writer thread before logging waits (lossless). A line is one event,
/// bounded by what its fields carry (a review's line is, see `admission::message`), so this
/// bounds the queue's memory.
pub const MAX_QUEUED_LINES: usize = 4096;

/// The writer thread's buffer in front of stderr, flushed whenever the queue is empty.
pub const WRITE_BUFFER_BYTES: usize = 64 * 1024;

/// Writes out the queued log lines when dropped.
#[must_use = "log lines still queued are lost unless the guard lives until the process ends"]
pub struct LogGuard {
    _worker: tracing_appender::non_blocking::WorkerGuard,
}

/// The non-blocking, lossless writer in front of `out`, and the guard of its thread.
pub fn writer<W: std::io::Write + Send + 'static>(
    out: W,
    thread: &str,
) -> (
    tracing_appender::non_blocking::NonBlocking,
    tracing_appender::non_blocking::WorkerGuard,
) {
    tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(MAX_QUEUED_LINES)
        .thread_name(thread)
        .finish(std::io::BufWriter::with_capacity(WRITE_BUFFER_BYTES, out))
}

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
    let (writer, worker) = writer(std::io::stderr(), "log-writer");
    // Colour codes only for a person at a terminal: in a pod, stderr goes to the container log,
    // where escape sequences are noise to every reader and log pipeline (and cost time per line).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    let result = match args.log_format {
        LogFormat::Text => builder.fmt_fields(text::TextFields).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot install the log subscriber: {e}"))?;
    Ok(LogGuard { _worker: worker })
}

pub mod text {
    //! The fields of a text log line: `message name="value" count=3`, as tracing-subscriber's
    //! default formatter writes them, but faster for the common case and stricter with what a
    //! client sent.
    //!
    //! - A string without control characters, quotes or backslashes is written between quotes as
    //!   it is; any other string is written as Rust's `{:?}` writes it (the default's way for
    //!   every string, which escapes char by char and was 60% of a review line's formatting).
    //! - Every control character in any field, the message included, is written escaped
    //!   (`\n`, `\u{1b}`), so no value can start a new line or reach a terminal as a command.
    //!   The default escapes only some of them, and only in the message.

    use std::fmt::{self, Write};

    use tracing::field::{Field, Visit};
    use tracing_subscriber::field::RecordFields;
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::FormatFields;

    /// The text format's [`FormatFields`].
    pub struct TextFields;

    impl<'w> FormatFields<'w> for TextFields {
        fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
            let mut visitor = TextVisitor {
                out: Escaping(writer),
                first: true,
                result: Ok(()),
            };
            fields.record(&mut visitor);
            visitor.result
        }
    }

    struct TextVisitor<'w> {
        out: Escaping<Writer<'w>>,
        first: bool,
        result: fmt::Result,
    }

    impl TextVisitor<'_> {
        /// Writes the separator and `name=` (nothing for the message); `false` for a field
        /// that is not written (the `log.` metadata of events from the `log` crate).
        fn start(&mut self, field: &Field) -> Result<bool, fmt::Error> {
            let name = field.name();
            if name.starts_with("log.") {
                return Ok(false);
            }
            if !std::mem::take(&mut self.first) {
                self.out.0.write_char(' ')?;
            }
            if name != "message" {
                self.out
                    .0
                    .write_str(name.strip_prefix("r#").unwrap_or(name))?;
                self.out.0.write_char('=')?;
            }
            Ok(true)
        }
    }

    impl Visit for TextVisitor<'_> {
        fn record_str(&mut self, field: &Field, value: &str) {
            if self.result.is_err() {
                return;
            }
            self.result = self.start(field).and_then(|written| match written {
                false => Ok(()),
                true if field.name() == "message" => self.out.write_str(value),
                true if is_plain(value) => {
                    let w = &mut self.out.0;
                    w.write_char('"')?;
                    w.write_str(value)?;
                    w.write_char('"')
                }
                true => write!(self.out.0, "{value:?}"),
            });
        }

        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            if self.result.is_err() {
                return;
            }
            self.result = self.start(field).and_then(|written| match written {
                false => Ok(()),
                true => write!(self.out, "{value:?}"),
            });
        }
    }

    /// Printable ASCII other than `"` and `\`: written between quotes unchanged.
    fn is_plain(s: &str) -> bool {
        s.bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    }

    /// Writes control characters escaped, everything else as it is.
    struct Escaping<W>(W);

    impl<W: Write> Write for Escaping<W> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            if !s.chars().any(char::is_control) {
                return self.0.write_str(s);
            }
            for ch in s.chars() {
                if ch.is_control() {
                    write!(self.0, "{}", ch.escape_debug())?;
                } else {
                    self.0.write_char(ch)?;
                }
            }
            Ok(())
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::sync::{Arc, Mutex};

        /// The fields part of the line each formatter writes for the events `emit` logs.
        fn lines(ours: bool, emit: fn()) -> Vec<String> {
            let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
            let sink = Arc::clone(&buf);
            let make = move || SinkLine(Arc::clone(&sink));
            let builder = tracing_subscriber::fmt()
                .without_time()
                .with_target(false)
                .with_level(false)
                .with_ansi(false)
                .with_writer(make);
            if ours {
                tracing::subscriber::with_default(builder.fmt_fields(TextFields).finish(), emit);
            } else {
                tracing::subscriber::with_default(builder.finish(), emit);
            }
            let text = String::from_utf8(buf.lock().map(|b| b.clone()).unwrap_or_default())
                .unwrap_or_default();
            text.lines().map(str::to_string).collect()
        }

        struct SinkLine(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for SinkLine {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                if let Ok(mut v) = self.0.lock() {
                    v.extend_from_slice(b);
                }
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }

        #[test]
        fn ordinary_lines_read_as_the_default_formatter_writes_them() {
            fn emit() {
                tracing::info!(
                    uid = "9b2c4d6e-8f0a",
                    name = "apps.deployments",
                    user = "system:apiserver",
                    empty = "",
                    verdict = "allowed",
                    findings = 0u64,
                    delta = -3i64,
                    ok = true,
                    codes = %"a,b",
                    timeout = ?std::time::Duration::from_secs(3),
                    "review"
                );
                tracing::info!(r#type = "x", "raw name");
                tracing::info!(quoted = "say \"hi\" \\ é", "unicode and quotes");
                tracing::warn!("message only, {} formatted", 42);
            }
            let ours = lines(true, emit);
            assert_eq!(ours.len(), 4, "{ours:?}");
            assert_eq!(ours, lines(false, emit));
        }

        #[test]
        fn control_characters_from_a_client_never_break_a_line() {
            fn emit() {
                let hostile = "a\nINFO forged line\u{1b}[31m\u{85}";
                tracing::info!(user = hostile, "review");
                tracing::info!(error = %hostile, "display field");
                tracing::info!("message {hostile}");
            }
            let ours = lines(true, emit);
            assert_eq!(ours.len(), 3, "one line per event: {ours:?}");
            assert_eq!(
                ours[0],
                r#"review user="a\nINFO forged line\u{1b}[31m\u{85}""#
            );
            assert_eq!(
                ours[1],
                r"display field error=a\nINFO forged line\u{1b}[31m\u{85}"
            );
            assert_eq!(ours[2], r"message a\nINFO forged line\u{1b}[31m\u{85}");
            for line in ours {
                assert!(!line.contains('\u{1b}'), "{line:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Four threads log far more lines than the queue holds: none is lost or torn, each thread's
    /// come in its order, and the guard writes out the rest.
    #[test]
    fn every_line_arrives_whole_and_in_order_and_the_guard_flushes() {
        let sink = Sink::default();
        let (writer, guard) = super::writer(sink.clone(), "test-log-writer");
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..5_000 {
                        let line = format!("thread {t} line {i:05} {}\n", "x".repeat(200));
                        writer
                            .make_writer()
                            .write_all(line.as_bytes())
                            .expect("write");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        drop(guard);
        let text = String::from_utf8(sink.0.lock().expect("sink").clone()).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 20_000, "no line lost");
        for t in 0..4 {
            let mine: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| l.starts_with(&format!("thread {t} ")))
                .collect();
            assert_eq!(mine.len(), 5_000);
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "in order per thread");
            assert!(mine
                .iter()
                .all(|l| l.len() == 200 + "thread 0 line 00000 ".len()));
        }
    }
}
