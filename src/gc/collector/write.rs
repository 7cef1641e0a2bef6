//! Step 4 of a pass: one write per object naming a confirmed lease ([`Term::act`],
//! [`Term::write_one`]); [`Term::send`] is the one place write errors are mapped.
//!
//! Invariant I1 (docs/gc.md): the objects are the copies in the pass's snapshot, taken before the
//! confirming GETs ([`Term::targets`]), and each write carries its copy's resourceVersion (a
//! delete also the uid, [`delete_params`]), so it removes nothing written after the copy. A 409
//! reads the object again and confirms again after that read (`confirm.rs`). Before each write, a
//! lease the watch already shows back drops out (no API call). An unchanged rewrite slips past
//! the resourceVersion: the give-back after the batch closes that (`give_back.rs`).
//!
//! Invariant I6 (API calls per event): per object one write; per 409 at most one GET of the
//! object, the confirming GETs again and one more write, at most `MAX_CONFLICT_RETRIES` times.
//! No per-object read otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::Resource;
use tokio::time::Instant;

use super::journal::{self, Removed, MAX_RECORD_BYTES};
use super::record::{describe, EventNote};
use super::{backoff, is_status, lock, Term, MAX_CONFLICT_RETRIES};
use crate::gc::metrics::{InFlight, ReasonLabels, ResultLabels};
use crate::gc::plan::{self, Plan, Reason, Removal};
use crate::gc::stored::StoredSv;
use crate::model::{ServerStorageVersion, StorageVersion};

/// Objects written together, and what the journal records of them.
struct Batch {
    targets: Vec<Arc<StoredSv>>,
    removals: Vec<Removed>,
}

/// The targets cut into batches whose journal record stays within [`MAX_RECORD_BYTES`] (an
/// object alone is a batch however large its record).
fn batches(targets: Vec<Arc<StoredSv>>, confirmed: &BTreeMap<String, Reason>) -> Vec<Batch> {
    let mut out: Vec<Batch> = Vec::new();
    let mut bytes = 0;
    for sv in targets {
        let removal = Removed {
            storage_version: sv.name().to_string(),
            entries: sv
                .status
                .known
                .storage_versions
                .iter()
                .filter(|e| confirmed.contains_key(&e.api_server_id))
                .cloned()
                .collect(),
        };
        let size = journal::encode(std::slice::from_ref(&removal)).len();
        match out.last_mut() {
            Some(b) if bytes + size <= MAX_RECORD_BYTES => {
                bytes += size;
                b.targets.push(sv);
                b.removals.push(removal);
            }
            _ => {
                bytes = size;
                out.push(Batch {
                    targets: vec![sv],
                    removals: vec![removal],
                });
            }
        }
    }
    out
}

/// How a write went, after [`Term::send`] mapped it.
enum Sent {
    Ok(Box<StoredSv>),
    Conflict,
    Gone,
    Failed,
}

/// What became of one object in [`Term::act`].
enum Outcome {
    Done,
    /// Written: the Event that records it, published once the batch's writes are done.
    Changed(Box<EventNote>),
    /// Try again at a later pass (a failed write or read). With the entries a write that got
    /// no good answer may still have removed: a timeout, a lost connection or a 5xx can come
    /// after the apiserver applied it. The give-back checks them like a written removal's.
    Retry(Vec<ServerStorageVersion>),
}

impl Term {
    /// Step 4: one write per object naming a confirmed lease (bounded concurrency). Suspects
    /// whose objects are all done are forgotten; the others retry later.
    pub(super) async fn act(
        self: &Arc<Self>,
        confirmed: &BTreeMap<String, Reason>,
        snapshot: &[Arc<StoredSv>],
    ) -> Option<()> {
        // In name order: the journal's record and the give-back's calls are the same for the
        // same state, whatever order the store keeps.
        let mut targets = self.targets(confirmed, snapshot);
        targets.sort_by(|a, b| a.name().cmp(b.name()));
        let now = plan::format_time(Timestamp::now());
        let mut outcomes = Vec::with_capacity(targets.len());
        for batch in batches(targets, confirmed) {
            outcomes.extend(self.act_batch(batch, confirmed, &now).await?);
        }
        self.settle(confirmed, &outcomes);
        // The record of the batch, after its writes: the Events do not hold up the collection,
        // nor compete with its writes at the apiserver.
        let notes = outcomes.into_iter().filter_map(|(_, o)| match o {
            Outcome::Changed(note) => Some(*note),
            _ => None,
        });
        futures::stream::iter(notes)
            .for_each_concurrent(self.c.cfg.concurrency.max(1), |note| self.publish(note))
            .await;
        Some(())
    }

    /// One batch: its removals written to the journal, its writes, the give-back check, the
    /// journal cleared (`journal.rs`, I1 across terms). A batch whose journal could not be
    /// written writes nothing: its objects are retried later.
    async fn act_batch(
        self: &Arc<Self>,
        batch: Batch,
        confirmed: &BTreeMap<String, Reason>,
        now: &str,
    ) -> Option<Vec<(Arc<StoredSv>, Outcome)>> {
        if !self.record(&batch.removals).await? {
            return Some(
                batch
                    .targets
                    .into_iter()
                    .map(|sv| (sv, Outcome::Retry(Vec::new())))
                    .collect(),
            );
        }
        let outcomes: Vec<(Arc<StoredSv>, Outcome)> = futures::stream::iter(batch.targets)
            .map(|sv| async move {
                let outcome = self.write_one(&sv, confirmed, now).await;
                outcome.map(|o| (sv, o))
            })
            .buffer_unordered(self.c.cfg.concurrency.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Option<_>>()?;
        // What went through, and what a write without a good answer may have removed (seed
        // 1623: a PUT applied after the apiserver's unchanged rewrite, its answer past the
        // call's deadline).
        let mut removed: Vec<(&str, &[ServerStorageVersion])> = outcomes
            .iter()
            .filter_map(|(sv, o)| match o {
                Outcome::Changed(note) => Some((note.name.as_str(), note.removed.as_slice())),
                Outcome::Retry(maybe) => Some((sv.name(), maybe.as_slice())),
                Outcome::Done => None,
            })
            .filter(|(_, entries)| !entries.is_empty())
            .collect();
        removed.sort_by(|a, b| a.0.cmp(b.0));
        if !removed.is_empty() {
            self.give_back_if_returned(&removed).await?;
        }
        // Cleared: a failure leaves the record to the next batch (which overwrites it, its
        // give-back done) or the next term (which checks it again, at no harm).
        self.record(&[]).await?;
        Some(outcomes)
    }

    /// The stored objects naming a confirmed lease, but for those already acted on at their
    /// current resourceVersion.
    fn targets(
        &self,
        confirmed: &BTreeMap<String, Reason>,
        snapshot: &[Arc<StoredSv>],
    ) -> Vec<Arc<StoredSv>> {
        let state = lock(&self.state);
        snapshot
            .iter()
            .filter(|sv| {
                let acted = state.acted.get(sv.name()).map(String::as_str);
                acted.is_none() || acted != sv.resource_version()
            })
            .filter(|sv| {
                sv.status
                    .known
                    .storage_versions
                    .iter()
                    .any(|e| confirmed.contains_key(&e.api_server_id))
            })
            .cloned()
            .collect()
    }

    /// After a batch: a confirmed lease with a failed object is retried later, the others are
    /// done (in a dry run: looked at again at the next sweep).
    fn settle(&self, confirmed: &BTreeMap<String, Reason>, outcomes: &[(Arc<StoredSv>, Outcome)]) {
        let failed: BTreeSet<&str> = outcomes
            .iter()
            .filter(|(_, outcome)| matches!(outcome, Outcome::Retry(_)))
            .flat_map(|(sv, _)| sv.status.known.storage_versions.iter())
            .filter_map(|e| {
                confirmed
                    .get_key_value(&e.api_server_id)
                    .map(|(id, _)| id.as_str())
            })
            .collect();
        for id in confirmed.keys() {
            if failed.contains(id.as_str()) {
                self.retry_later(id);
            } else if self.c.cfg.dry_run {
                // Reported; look again at the next sweep, not at every pass.
                if let Some(s) = lock(&self.state).suspects.get_mut(id) {
                    s.retry_at = Some(Instant::now() + self.c.cfg.resync_interval);
                }
            } else {
                lock(&self.state).suspects.remove(id);
            }
        }
    }

    /// Plans and writes one object, reading it again after a conflict. `None` if the term ended.
    async fn write_one(
        &self,
        stored: &StoredSv,
        confirmed: &BTreeMap<String, Reason>,
        now: &str,
    ) -> Option<Outcome> {
        let _in_flight = InFlight::start(&self.c.metrics);
        let mut current = stored.clone();
        let mut confirmed = confirmed.clone();
        for attempt in 0..=MAX_CONFLICT_RETRIES {
            // A lease the watch has delivered back since the confirmation is back: its entries
            // stay (no API call; the give-back after the batch covers what the watch had not
            // delivered yet).
            confirmed.retain(|id, _| !self.looks_live(id));
            let decided = plan::plan(&current.to_model(), &confirmed, now);
            if matches!(decided, Plan::Nothing) {
                // Not marked acted: nothing was written, and the judgement rests on leases the
                // watch shows back now. Marked, the object stayed out of every later batch
                // until its resourceVersion moved, which an apiserver's unchanged rewrites
                // never do (seed 309, I2: an entry kept for good after its lease went again).
                self.c.metrics.check("unchanged");
                return Some(Outcome::Done);
            }
            if self.c.cfg.dry_run {
                self.dry_run(&current, &decided);
                self.mark_acted(stored);
                return Some(Outcome::Done);
            }
            match self.send(&current, &decided).await? {
                Sent::Ok(written) => {
                    // The store may hold `stored` until the watch delivers the change.
                    self.mark_acted(stored);
                    let before = current.to_model();
                    let after = match decided {
                        Plan::Delete { .. } => None,
                        _ => Some(written.to_model()),
                    };
                    let note = self.done(&before, after.as_ref(), decided.removed());
                    return Some(Outcome::Changed(Box::new(note)));
                }
                Sent::Gone => {
                    self.c.metrics.check("gone");
                    self.mark_acted(stored);
                    return Some(Outcome::Done);
                }
                Sent::Failed => {
                    self.c.metrics.check("error");
                    let maybe = removed_entries(&current.to_model(), decided.removed());
                    return Some(Outcome::Retry(maybe));
                }
                Sent::Conflict => match self.reread(current.name(), attempt).await? {
                    // The object changed after the leases were confirmed: an apiserver may have
                    // come back and written its entry again since. The confirmation holds only
                    // for what was written before it, so confirm again, after this read.
                    Ok(fresh) => match self.reconfirm(&fresh, &confirmed).await? {
                        Some(still_gone) => {
                            current = fresh;
                            confirmed = still_gone;
                        }
                        None => return Some(Outcome::Retry(Vec::new())),
                    },
                    Err(outcome) => return Some(outcome),
                },
            }
        }
        self.c.metrics.check("error");
        tracing::warn!(
            storageversion = stored.name(),
            "still conflicting; retrying later"
        );
        Some(Outcome::Retry(Vec::new()))
    }

    /// After a conflict: backs off, then reads the object again (`Err`: what became of it).
    async fn reread(&self, name: &str, attempt: u32) -> Option<Result<StoredSv, Outcome>> {
        tracing::debug!(
            storageversion = name,
            attempt,
            "write conflict; reading again"
        );
        self.cancellable(tokio::time::sleep(backoff(attempt + 1)))
            .await?;
        let got = self
            .call("GET storageversion", self.c.svs.get_opt(name))
            .await?;
        Some(match got {
            Ok(Some(fresh)) => Ok(fresh.trim()),
            Ok(None) => {
                self.c.metrics.check("gone");
                Err(Outcome::Done)
            }
            Err(e) => {
                self.c.metrics.error("get_storage_version");
                self.c.metrics.check("error");
                tracing::warn!(storageversion = name, error = %e, "cannot read StorageVersion after a conflict; retrying later");
                Err(Outcome::Retry(Vec::new()))
            }
        })
    }

    fn mark_acted(&self, sv: &StoredSv) {
        if let Some(rv) = sv.resource_version() {
            lock(&self.state)
                .acted
                .insert(sv.name().to_string(), rv.to_string());
        }
    }

    /// The one write of an object, and the one place its errors are mapped.
    async fn send(&self, sv: &StoredSv, decided: &Plan) -> Option<Sent> {
        if self.token.is_cancelled() {
            return None;
        }
        let name = sv.name();
        let (operation, result) = match decided {
            Plan::Nothing => return Some(Sent::Gone),
            Plan::Rewrite { object, .. } => {
                let body = sv.with_status(object.status.clone());
                let pp = PostParams::default();
                let put = self.c.svs.replace_status(name, &pp, &body);
                (
                    "update_status",
                    self.call("PUT storageversion status", put).await?,
                )
            }
            Plan::Delete { .. } => {
                let dp = delete_params(&sv.to_model());
                let delete = self.c.svs.delete(name, &dp);
                let r = self.call("DELETE storageversion", delete).await?;
                ("delete", r.map(|_| sv.clone()))
            }
        };
        Some(match result {
            Ok(written) => {
                self.c.metrics.write(operation, "ok");
                if operation == "delete" {
                    self.c.metrics.objects_deleted.inc();
                }
                Sent::Ok(Box::new(written))
            }
            // Changed since the stored copy (an apiserver re-added itself): the resourceVersion
            // (or the delete precondition) kept it.
            Err(e) if is_status(&e, 409) => {
                self.c.metrics.write(operation, "conflict");
                Sent::Conflict
            }
            Err(e) if is_status(&e, 404) => {
                self.c.metrics.write(operation, "not_found");
                Sent::Gone
            }
            Err(e) => {
                self.c.metrics.write(operation, "error");
                self.c.metrics.error(operation);
                tracing::warn!(storageversion = name, error = %e, "{operation} failed; retrying later");
                Sent::Failed
            }
        })
    }

    fn dry_run(&self, sv: &StoredSv, decided: &Plan) {
        let (what, result) = match decided {
            Plan::Delete { .. } => ("delete", "would_delete"),
            _ => ("rewrite", "would_rewrite"),
        };
        self.c
            .metrics
            .dry_run_changes
            .get_or_create(&ResultLabels { result: what })
            .inc();
        self.c.metrics.check(result);
        tracing::info!(
            storageversion = sv.name(),
            action = what,
            removed = %describe(decided.removed()),
            "dry run: would {what} the StorageVersion; changing nothing"
        );
    }

    /// After a successful write of `before` (into `after`, or deleted when `None`): metrics and
    /// log now, and the Event to publish after the batch.
    fn done(
        &self,
        before: &StorageVersion,
        after: Option<&StorageVersion>,
        removed: &[Removal],
    ) -> EventNote {
        for r in removed {
            let n = before
                .status
                .storage_versions
                .iter()
                .filter(|e| e.api_server_id == r.id)
                .count()
                .max(1);
            self.c
                .metrics
                .entries_removed
                .get_or_create(&ReasonLabels {
                    reason: r.reason.code(),
                })
                .inc_by(n as u64);
        }
        let what = describe(removed);
        let sv = after.unwrap_or(before);
        let (reason, note) = if after.is_none() {
            self.c.metrics.check("deleted");
            tracing::info!(storageversion = sv.name(), removed = %what, "deleted StorageVersion: no entry left");
            (
                "StorageVersionDeleted",
                format!("Deleted: no entry left after removing {what}"),
            )
        } else {
            self.c.metrics.check("rewritten");
            let common = sv
                .status
                .common_encoding_version
                .as_deref()
                .unwrap_or("unset");
            tracing::info!(storageversion = sv.name(), removed = %what, common_encoding_version = common, "removed stale entries");
            (
                "StaleEntriesRemoved",
                format!("Removed the entries of {what}; commonEncodingVersion is now {common}"),
            )
        };
        let removed = removed_entries(before, removed);
        EventNote {
            name: sv.name().to_string(),
            reference: sv.object_ref(&()),
            reason,
            note,
            removed,
        }
    }
}

/// The entries of `before` that `removed` names, as they were.
fn removed_entries(before: &StorageVersion, removed: &[Removal]) -> Vec<ServerStorageVersion> {
    before
        .status
        .storage_versions
        .iter()
        .filter(|e| removed.iter().any(|r| r.id == e.api_server_id))
        .cloned()
        .collect()
}

/// Delete options for an object as it was read: resourceVersion and uid preconditions, so a
/// StorageVersion that changed since (an apiserver re-added itself) or was re-created is kept
/// (the API server answers 409 Conflict). Upstream deletes unconditionally (docs/upstream.md §7 (b)).
pub fn delete_params(read: &StorageVersion) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: read.metadata.resource_version.clone(),
            uid: read.metadata.uid.clone(),
        }),
        ..DeleteParams::default()
    }
}
