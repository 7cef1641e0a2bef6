//! Leader-only tasks: work that runs on the replica leading the garbage collector's election, one
//! term at a time, and stops the moment the term ends (the migration trigger, the report; see
//! docs/ARCHITECTURE.md, "How to add a leader-only task").
//!
//! A task implements [`LeaderTask`] (its name and the work of one term); [`start`] checks the
//! task is wanted and that there is an election to follow, and runs it with [`each_term`] under
//! a [`crate::task::Owned`] handle, which stops it with a bound on the wait.

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::gc::leader::Terms;
use crate::task::Owned;

/// Work of the leader only.
pub trait LeaderTask: Send + Sync + 'static {
    /// What the task is called in logs ("migration trigger").
    const NAME: &'static str;

    /// One term's work. It is dropped the moment `term` is cancelled (the term's token wins
    /// every race), so it need not watch `term` to stop, only to leave a loop early.
    fn lead(self: Arc<Self>, term: CancellationToken) -> impl Future<Output = ()> + Send + 'static;
}

/// The running (or disabled) leader-only task. Dropping it stops the task; [`Owned::shutdown`]
/// also waits for it (bounded in time).
pub type LeaderTaskHandle = Owned;

/// Starts the task `make` builds, if `wanted` (its `--flag` was given), to run each term of
/// `leader`'s election. Fails when it is wanted without the election (`--no-gc`): `flag` names
/// it in the error.
pub fn start<T: LeaderTask>(
    flag: &str,
    wanted: bool,
    gc: &crate::gc::GcArgs,
    leader: &crate::gc::GcHandle,
    make: impl FnOnce() -> T,
) -> anyhow::Result<LeaderTaskHandle> {
    if !wanted {
        return Ok(Owned::none(T::NAME));
    }
    if !gc.enabled() || !leader.is_enabled() {
        anyhow::bail!(
            "{flag} needs the leader election of the garbage collector: drop --no-gc \
             (or use --gc-dry-run to collect nothing)"
        );
    }
    Ok(run(Arc::new(make()), leader.terms()))
}

/// Runs `task` in each term of `terms` until the handle is shut down or dropped.
pub fn run<T: LeaderTask>(task: Arc<T>, terms: Terms) -> LeaderTaskHandle {
    Owned::spawn(T::NAME, move |shutdown| async move {
        each_term(T::NAME, terms, shutdown, move |term| {
            Arc::clone(&task).lead(term)
        })
        .await;
    })
}

/// The one leader-term runner: each time a term starts, runs `work(term)` until the term ends,
/// and drops it at that moment (the term's token wins every race: no further request of a term
/// that ended is sent). Work that returns early waits for the term's end. Returns when
/// `shutdown` is cancelled or the election has ended.
pub async fn each_term<F, Fut>(
    task: &'static str,
    mut terms: Terms,
    shutdown: CancellationToken,
    mut work: F,
) where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        let term = loop {
            let current = terms.borrow_and_update().clone();
            if let Some(term) = current.filter(|t| !t.is_cancelled()) {
                break term;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = terms.changed() => if changed.is_err() { return },
            }
        };
        tracing::info!(task, "leading: starting");
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = term.cancelled() => {}
            () = async {
                work(term.clone()).await;
                term.cancelled().await;
            } => {}
        }
        tracing::info!(task, "no longer leading: stopped");
    }
}
