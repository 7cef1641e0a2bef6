//! Background tasks owned by a handle: stopped with a bound on the wait.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long [`Owned::shutdown`] waits for its task to stop before aborting it.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);

/// A background task (or none: a disabled component) and the token that tells it to stop.
/// Dropping the handle tells the task to stop; [`Owned::shutdown`] also waits for it, up to
/// [`SHUTDOWN_TIMEOUT`].
pub struct Owned {
    what: &'static str,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Owned {
    /// No task: shutdown returns at once.
    pub fn none(what: &'static str) -> Owned {
        Owned {
            what,
            shutdown: CancellationToken::new(),
            task: None,
        }
    }

    /// Spawns `work(shutdown)` on the current Tokio runtime; `what` names it in the warning
    /// when it does not stop in time.
    pub fn spawn<F, Fut>(what: &'static str, work: F) -> Owned
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(work(shutdown.clone()));
        Owned {
            what,
            shutdown,
            task: Some(task),
        }
    }

    /// Whether there is a task (false for [`Owned::none`]).
    pub fn is_running(&self) -> bool {
        self.task.is_some()
    }

    /// Tells the task to stop and waits for it (bounded in time).
    pub fn shutdown(mut self) -> impl Future<Output = ()> + Send + 'static {
        self.shutdown.cancel();
        join_within(self.task.take(), SHUTDOWN_TIMEOUT, self.what)
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Waits up to `limit` for `task` (already told to stop) to finish, then aborts it with a
/// warning naming `what`. Does nothing when there is no task (a disabled component).
pub async fn join_within(task: Option<JoinHandle<()>>, limit: Duration, what: &'static str) {
    let Some(mut task) = task else { return };
    if tokio::time::timeout(limit, &mut task).await.is_err() {
        tracing::warn!("{what} did not stop within {limit:?}");
        task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_task_that_does_not_stop_is_aborted() {
        let task = tokio::spawn(std::future::pending::<()>());
        let abort = task.abort_handle();
        join_within(Some(task), Duration::from_secs(15), "test task").await;
        tokio::task::yield_now().await;
        assert!(abort.is_finished(), "the task was aborted");
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_handle_tells_the_task_to_stop() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let owned = Owned::spawn("test task", |stop| async move {
            stop.cancelled().await;
            let _ = tx.send(());
        });
        assert!(owned.is_running());
        drop(owned);
        assert!(rx.await.is_ok(), "the task saw its token cancelled");
        assert!(!Owned::none("test task").is_running());
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_task_or_none_returns_at_once() {
        let task = tokio::spawn(async {});
        join_within(Some(task), Duration::from_secs(15), "test task").await;
        join_within(None, Duration::from_secs(15), "test task").await;
    }
}
