//! Background tasks owned by a handle: stopped with a bound on the wait.

use std::time::Duration;

use tokio::task::JoinHandle;

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
    async fn a_finished_task_or_none_returns_at_once() {
        let task = tokio::spawn(async {});
        join_within(Some(task), Duration::from_secs(15), "test task").await;
        join_within(None, Duration::from_secs(15), "test task").await;
    }
}
