//! Log set-up: tracing to stderr, text or JSON, level from `--log-level` or `RUST_LOG`.
//!
//! Lines are formatted by the thread that logs and written by a dedicated thread that batches
//! its wake-ups ([`batch`]): a review never waits for a `write(2)` to stderr, and the writer
//! wakes at most once per [`batch::FLUSH_INTERVAL`] however many lines arrive. It never drops a
//! line: when too much is buffered, logging waits. Keep the [`LogGuard`] until the process ends;
//! dropping it writes out what is still buffered.

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

/// Writes out the queued log lines when dropped.
#[must_use = "log lines still queued are lost unless the guard lives until the process ends"]
pub struct LogGuard {
    _worker: batch::BatchGuard,
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
    let (writer, worker) = batch::batch_writer(std::io::stderr, "log-writer")
        .map_err(|e| anyhow::anyhow!("cannot start the log writer thread: {e}"))?;
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

pub mod batch {
    //! A log writer that batches its wake-ups: lines are appended to a shared buffer by the threads
    //! that log, and one writer thread writes the buffer out at most every [`FLUSH_INTERVAL`] after
    //! the first line of a batch arrives. At 1,000 reviews per second that is one wake-up and one
    //! `write(2)` per few milliseconds instead of one per line; under heavy load a batch is many lines.
    //!
    //! It never drops a line: when [`MAX_BUFFERED_BYTES`] are waiting, logging waits for the writer.
    //! Each line is appended whole (tracing formats a line and writes it in one call), so lines never
    //! interleave. Dropping the [`BatchGuard`] writes out what is buffered and stops the thread.

    use std::io::Write;
    use std::sync::{Arc, Condvar, Mutex, MutexGuard};
    use std::thread::JoinHandle;
    use std::time::Duration;

    /// Longest time a line waits in the buffer before it is written.
    pub const FLUSH_INTERVAL: Duration = Duration::from_millis(5);

    /// Bytes buffered before logging waits for the writer thread.
    pub const MAX_BUFFERED_BYTES: usize = 1 << 20;

    struct State {
        buf: Vec<u8>,
        stopped: bool,
    }

    struct Shared {
        state: Mutex<State>,
        /// Signalled when the buffer gets its first byte, or on stop.
        filled: Condvar,
        /// Signalled when the writer has taken the buffer.
        taken: Condvar,
    }

    impl Shared {
        fn lock(&self) -> MutexGuard<'_, State> {
            // A thread that panicked while holding the lock left a buffer of whole lines behind.
            self.state
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }
    }

    /// The [`tracing_subscriber::fmt::MakeWriter`] side: cheap to clone, one per logging call.
    pub struct BatchWriter<W> {
        shared: Arc<Shared>,
        /// Where lines go once the writer thread has stopped.
        direct: fn() -> W,
    }

    impl<W> Clone for BatchWriter<W> {
        fn clone(&self) -> Self {
            BatchWriter {
                shared: Arc::clone(&self.shared),
                direct: self.direct,
            }
        }
    }

    /// Writes out what is buffered and stops the writer thread when dropped.
    pub struct BatchGuard {
        shared: Arc<Shared>,
        thread: Option<JoinHandle<()>>,
    }

    /// Starts the writer thread writing batches to `make()` (e.g. `std::io::stderr`).
    pub fn batch_writer<W: Write + 'static>(
        make: fn() -> W,
        thread_name: &str,
    ) -> std::io::Result<(BatchWriter<W>, BatchGuard)> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                buf: Vec::with_capacity(64 * 1024),
                stopped: false,
            }),
            filled: Condvar::new(),
            taken: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(thread_name.to_string())
            .spawn(move || write_batches(&worker, make()))?;
        Ok((
            BatchWriter {
                shared: Arc::clone(&shared),
                direct: make,
            },
            BatchGuard {
                shared,
                thread: Some(thread),
            },
        ))
    }

    fn write_batches<W: Write>(shared: &Shared, mut out: W) {
        let mut spare: Vec<u8> = Vec::with_capacity(64 * 1024);
        let mut state = shared.lock();
        loop {
            while state.buf.is_empty() && !state.stopped {
                state = shared
                    .filled
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            if state.buf.is_empty() {
                return; // stopped, and everything is written
            }
            if !state.stopped {
                // Let the batch gather.
                drop(state);
                std::thread::sleep(FLUSH_INTERVAL);
                state = shared.lock();
            }
            std::mem::swap(&mut state.buf, &mut spare);
            drop(state);
            shared.taken.notify_all();
            // Nowhere to report a failed write to stderr; the lines are dropped as tracing would.
            let _ = out.write_all(&spare);
            let _ = out.flush();
            spare.clear();
            if spare.capacity() > 4 * MAX_BUFFERED_BYTES {
                spare.shrink_to(64 * 1024);
            }
            state = shared.lock();
        }
    }

    impl Drop for BatchGuard {
        fn drop(&mut self) {
            self.shared.lock().stopped = true;
            self.shared.filled.notify_all();
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }

    /// One logging call's writer.
    pub struct BatchLine<'a, W> {
        writer: &'a BatchWriter<W>,
    }

    impl<W: Write> Write for BatchLine<'_, W> {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let shared = &self.writer.shared;
            let mut state = shared.lock();
            while state.buf.len() >= MAX_BUFFERED_BYTES && !state.stopped {
                state = shared
                    .taken
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            if state.stopped {
                drop(state);
                return (self.writer.direct)().write(bytes);
            }
            let first = state.buf.is_empty();
            state.buf.extend_from_slice(bytes);
            drop(state);
            if first {
                shared.filled.notify_one();
            }
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a, W: Write + 'static> tracing_subscriber::fmt::MakeWriter<'a> for BatchWriter<W> {
        type Writer = BatchLine<'a, W>;

        fn make_writer(&'a self) -> Self::Writer {
            BatchLine { writer: self }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::sync::OnceLock;

        static SINK: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

        struct Sink;
        impl Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                SINK.get_or_init(Default::default)
                    .lock()
                    .expect("sink")
                    .extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }

        fn sink() -> Sink {
            Sink
        }

        fn written() -> Vec<u8> {
            SINK.get_or_init(Default::default)
                .lock()
                .expect("sink")
                .clone()
        }

        #[test]
        fn every_line_arrives_whole_and_in_order_and_the_guard_flushes() {
            use tracing_subscriber::fmt::MakeWriter;
            let (writer, guard) = batch_writer(sink, "test-log-writer").expect("thread");
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
            let text = String::from_utf8(written()).expect("utf-8");
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
            // After the guard, lines go straight through.
            writer.make_writer().write_all(b"after\n").expect("write");
            assert!(String::from_utf8(written())
                .expect("utf-8")
                .ends_with("after\n"));
        }
    }
}
