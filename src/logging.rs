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
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot install the log subscriber: {e}"))?;
    Ok(LogGuard { _worker: worker })
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
