//! The collector's work while this replica leads (one *term*).
//!
//! It judges from two stores, not from per-object reads: StorageVersions from a watch folded
//! into a kube-runtime reflector store (metadata trimmed, see [`StoredSv`]), identity leases from
//! the process's shared [`LeaseStore`]. One loop runs *passes*, woken by store events, by the
//! next grace to run out, and by the periodic sweep. A pass is four steps:
//!
//! 1. [`Term::observe`]: from the stores, which apiServerIDs look gone and which objects name
//!    them (also the `stale_entries` gauge). No API call.
//! 2. [`Term::due`]: which of those *suspects* have been gone for the deletion grace (or are
//!    expired beyond the expired-lease grace, or were deleted and need a follow-up).
//! 3. [`Term::confirm`]: one live GET per due lease, right before the writes that act on it: a
//!    lease that is back, or a lookup that fails, removes nothing.
//! 4. [`Term::act`]: each object naming a confirmed lease costs one write (the `/status` PUT with
//!    the stored copy's resourceVersion, or the preconditioned DELETE); a conflict reads the
//!    object again, confirms again (after that read) the leases it still names, and retries.
//!    [`Term::send`] is the one place write errors are mapped.
//!
//! The copies acted on come from one snapshot of the store taken before step 3, so each entry
//! removed was written before its lease was seen gone (invariant I1 in docs/gc.md).
//!
//! Everything stops when the term's token is cancelled. That keeps invariant I3 (docs/gc.md: a
//! replica that is not the leader never completes a write): every API call of a term is raced
//! against the token ([`Term::cancellable`], [`Term::call`]), which the election cancels before
//! it says leadership ended (`gc::leader::each_term`).
//!
//! The pass loop here bounds I2 (an entry whose lease has been gone longer than the grace plus a
//! bound is removed): it wakes at the next due suspect, a pass runs at most
//! [`MIN_PASS_INTERVAL`] after a wake-up, and every call ends within [`CALL_TIMEOUT`]. I4 and I5
//! are the migration trigger's (docs/migration.md).
//!
//! Each step is a file of its own:
//! - `inputs.rs`: the watches that feed the stores and wake the loop, and the sweep timer.
//! - `observe.rs`: steps 1 and 2, the suspects and their grace.
//! - `confirm.rs`: step 3, the live GETs (and again after a conflict's re-read).
//! - `write.rs`: step 4, one write per object, and what became of it.
//! - `give_back.rs`: after the batch, the entries given back to an apiserver found back.
//! - `record.rs`: the Events that record a batch, and how removals are described.

mod confirm;
mod give_back;
mod inputs;
mod journal;
mod observe;
mod record;
mod write;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::Api;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, Store};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::GcMetrics;
use super::stored::StoredSv;
use crate::leases::LeaseStore;
use observe::Suspect;

pub use journal::{name_for as journal_name, JournalConfig};
pub use record::describe;
pub use write::delete_params;

/// Settings of the collector (from [`super::GcArgs`]).
#[derive(Clone, Debug)]
pub struct CollectorConfig {
    pub deletion_grace: Duration,
    pub resync_interval: Duration,
    pub concurrency: usize,
    pub expired_grace: Option<Duration>,
    pub dry_run: bool,
    /// Where the batches' removals are written down before their writes (`journal.rs`).
    pub journal: Option<JournalConfig>,
}

/// How long one API call may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Conflicts retried at once (with backoff) before the object waits for the next pass.
const MAX_CONFLICT_RETRIES: u32 = 6;
const MIN_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// Shortest time between two passes, so a burst of store events costs one pass, not hundreds.
const MIN_PASS_INTERVAL: Duration = Duration::from_millis(50);

/// Long-lived pieces shared by every term.
pub struct Collector {
    client: kube::Client,
    svs: Api<StoredSv>,
    leases: LeaseStore,
    cfg: CollectorConfig,
    metrics: GcMetrics,
    recorder: Recorder,
    /// The running term's StorageVersion store, for other leader-only work (the report).
    shared: watch::Sender<Option<SvView>>,
}

/// A read-only view of the collector's StorageVersion store while a term runs: the store, and a
/// counter bumped after every change the watch delivered, 0 until the first list is in the store
/// (wait on it, not on `Store::wait_until_ready`, whose future keeps only one waker: the
/// collector's own wait would be lost). Shared so that other leader-only work (`serve --report`)
/// judges from the same watch instead of a second.
#[derive(Clone)]
pub struct SvView {
    pub store: Store<StoredSv>,
    pub changes: watch::Receiver<u64>,
}

impl Collector {
    pub fn new(
        client: kube::Client,
        leases: LeaseStore,
        cfg: CollectorConfig,
        metrics: GcMetrics,
        identity: &str,
    ) -> Collector {
        let recorder = Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "storageversion-webhook-gc".to_string(),
                instance: Some(identity.to_string()),
            },
        );
        Collector {
            svs: Api::all(client.clone()),
            client,
            leases,
            cfg,
            metrics,
            recorder,
            shared: watch::channel(None).0,
        }
    }

    /// Follows the store of each term: `Some` while a term runs, `None` between terms.
    pub fn sv_view(&self) -> watch::Receiver<Option<SvView>> {
        self.shared.subscribe()
    }

    /// One term of leadership: runs until `token` is cancelled.
    pub async fn lead(self: Arc<Self>, token: CancellationToken) {
        let (reader, writer) = reflector::store();
        let (changes, changes_rx) = watch::channel(0u64);
        self.shared.send_replace(Some(SvView {
            store: reader.clone(),
            changes: changes_rx,
        }));
        let term = Arc::new(Term {
            c: Arc::clone(&self),
            token: token.clone(),
            svs: reader,
            changes,
            wake: Notify::new(),
            sweep_due: AtomicBool::new(true),
            state: Mutex::new(TermState::default()),
        });
        let changes = self.leases.subscribe();
        tokio::join!(
            Arc::clone(&term).watch_storage_versions(writer),
            Arc::clone(&term).follow_leases(changes),
            Arc::clone(&term).sweeper(),
            Arc::clone(&term).run(),
        );
        self.shared.send_replace(None);
        self.metrics.stale_entries.set(0);
    }
}

#[derive(Default)]
struct TermState {
    suspects: HashMap<String, Suspect>,
    /// Objects already written (or, in a dry run, reported) at this resourceVersion: the store
    /// may still hold the old copy for a moment; don't write it twice.
    acted: HashMap<String, String>,
}

/// What one term knows and runs.
struct Term {
    c: Arc<Collector>,
    /// Cancelled when the term ends: every call of the term races it (I3).
    token: CancellationToken,
    svs: Store<StoredSv>,
    /// Bumped after every change of `svs` (see [`SvView`]).
    changes: watch::Sender<u64>,
    wake: Notify,
    sweep_due: AtomicBool,
    state: Mutex<TermState>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Term {
    /// Runs `fut` unless the term ends first (then `None`).
    async fn cancellable<F: std::future::Future>(&self, fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            _ = self.token.cancelled() => None,
            out = fut => Some(out),
        }
    }

    /// An API call bounded by [`CALL_TIMEOUT`] and the term.
    async fn call<T, F>(&self, what: &str, fut: F) -> Option<Result<T, kube::Error>>
    where
        F: std::future::Future<Output = Result<T, kube::Error>>,
    {
        match self
            .cancellable(tokio::time::timeout(CALL_TIMEOUT, fut))
            .await?
        {
            Ok(r) => Some(r),
            Err(_) => Some(Err(kube::Error::Service(
                format!("{what} took longer than {CALL_TIMEOUT:?}").into(),
            ))),
        }
    }

    /// Waits for both stores' first lists, then runs passes until the term ends.
    async fn run(self: Arc<Self>) {
        let ready = async {
            self.c.leases.synced().await;
            self.svs.wait_until_ready().await
        };
        match self.cancellable(ready).await {
            None => return,
            Some(Err(e)) => {
                tracing::error!(error = %e, "StorageVersion store closed before it listed");
                return;
            }
            Some(Ok(())) => {}
        }
        if self.recover().await.is_none() {
            return;
        }
        loop {
            let sweep = self.sweep_due.swap(false, Ordering::AcqRel);
            let started = std::time::Instant::now();
            let Some(next) = self.pass().await else {
                return;
            };
            if sweep {
                let took = started.elapsed();
                self.c.metrics.sweep_duration.observe(took.as_secs_f64());
                self.c.metrics.sweeps.inc();
                tracing::info!(objects = self.svs.state().len(), took = ?took, "GC sweep done");
            }
            let wait = async {
                tokio::time::sleep(MIN_PASS_INTERVAL).await;
                match next {
                    Some(at) => {
                        tokio::select! {
                            _ = self.wake.notified() => {}
                            _ = tokio::time::sleep_until(at) => {}
                        }
                    }
                    None => self.wake.notified().await,
                }
            };
            if self.cancellable(wait).await.is_none() {
                return;
            }
        }
    }

    /// One pass: observe, pick what is due, confirm it live, act. Returns when the next pass is
    /// needed without a wake-up (`None`: only on one), or `None` if the term ended.
    ///
    /// The objects acted on are the copies in one snapshot of the store taken at the start,
    /// before the confirming GETs: every entry in them was written before its lease was seen
    /// gone, so no entry written by an apiserver that came back afterwards is judged by that
    /// confirmation (invariant I1, docs/gc.md). A copy that is no longer current is refused by
    /// its resourceVersion, and then read and confirmed again ([`Term::write_one`]).
    async fn pass(self: &Arc<Self>) -> Option<Option<Instant>> {
        let snapshot = self.svs.state();
        let observed = self.observe(&snapshot);
        self.c
            .metrics
            .stale_entries
            .set(i64::try_from(observed.stale_entries).unwrap_or(i64::MAX));
        let due = self.due(&observed, &snapshot);
        if !due.is_empty() {
            let confirmed = self.confirm(&due).await?;
            if !confirmed.is_empty() {
                self.act(&confirmed, &snapshot).await?;
            }
        }
        let grace = self.c.cfg.deletion_grace;
        let next_suspect = lock(&self.state)
            .suspects
            .values()
            .map(|s| s.due_at(grace))
            .min();
        Some(min_opt(next_suspect, observed.next_expiry))
    }
}

fn min_opt(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Capped exponential backoff: 100 ms, 200 ms, 400 ms, ... up to 30 s.
fn backoff(attempt: u32) -> Duration {
    let exp = attempt.saturating_sub(1).min(16);
    (MIN_RETRY * 2u32.pow(exp)).min(MAX_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(100), MAX_RETRY);
    }
}
