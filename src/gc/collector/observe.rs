//! Steps 1 and 2 of a pass: [`Term::observe`], what the stores show (no API call), and
//! [`Term::due`], which gone-looking apiServerIDs (*suspects*) have waited out their grace.
//!
//! Invariant I2 (docs/gc.md): an entry whose lease has been gone longer than the grace plus a
//! bound is removed. A suspect is due at [`Suspect::due_at`]: the deletion grace after this term
//! first saw it gone (at once for a lease expired beyond the expired-lease grace, which waited
//! its own), or later after a failed lookup or write (capped backoff). The grace counts from the
//! latest absence: a lease that looks live again is forgotten (in [`Term::due`], and at once when
//! the lease watch delivers it, `inputs.rs`). The grace is also I1's first clause: an entry goes
//! only after its lease was seen gone for the whole grace, and then confirmed (`confirm.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::{lock, min_opt, Term};
use crate::gc::plan::{self, LeaseState};
use crate::gc::stored::StoredSv;
use crate::model::LeaseRecord;

/// An apiServerID whose lease looks gone (or was deleted), being waited on.
#[derive(Clone, Debug)]
pub(super) struct Suspect {
    /// When this term first saw it gone.
    pub(super) since: Instant,
    /// The deletion grace applies (missing, or not an apiserver's); not for an expired lease.
    pub(super) needs_grace: bool,
    /// A deletion (or a lease gone at a relist) to follow up with a GET even if no object
    /// names it.
    pub(super) follow_up: bool,
    /// After a failed lookup or write: not before this.
    pub(super) retry_at: Option<Instant>,
    pub(super) failures: u32,
}

impl Suspect {
    pub(super) fn new(since: Instant) -> Suspect {
        Suspect {
            since,
            needs_grace: true,
            follow_up: false,
            retry_at: None,
            failures: 0,
        }
    }

    pub(super) fn due_at(&self, grace: Duration) -> Instant {
        let after = if self.needs_grace {
            self.since + grace
        } else {
            self.since
        };
        self.retry_at.map_or(after, |r| r.max(after))
    }
}

/// What the stores show at one moment.
#[derive(Debug, Default)]
pub(super) struct Observed {
    /// Gone-looking apiServerIDs named by some object, and whether the deletion grace applies.
    gone: BTreeMap<String, bool>,
    /// Entries whose apiserver's lease is missing, not an apiserver's, or expired.
    pub(super) stale_entries: usize,
    /// The earliest instant a named lease will count as expired beyond the expired-lease grace.
    pub(super) next_expiry: Option<Instant>,
}

impl Term {
    /// Whether the lease store shows lease `id` live (present, an apiserver's, and not expired
    /// beyond the expired-lease grace when that is on).
    pub(super) fn looks_live(&self, id: &str) -> bool {
        let now = Timestamp::now();
        let expired_grace = self.c.cfg.expired_grace;
        self.c
            .leases
            .read(|leases| !judge_stored(leases.get(id), now, expired_grace).is_gone())
    }

    /// Step 1: what the stores show. No API call.
    pub(super) fn observe(&self, svs: &[Arc<StoredSv>]) -> Observed {
        let now = Timestamp::now();
        let expired_grace = self.c.cfg.expired_grace;
        self.c.leases.read(|leases| {
            let mut seen = Observed::default();
            let mut judged: HashMap<&str, LeaseState> = HashMap::new();
            for sv in svs {
                for e in &sv.status.known.storage_versions {
                    let id = e.api_server_id.as_str();
                    let record = leases.get(id);
                    let state = judged
                        .entry(id)
                        .or_insert_with(|| judge_stored(record, now, expired_grace));
                    if state.is_gone() {
                        seen.gone
                            .insert(id.to_string(), state.needs_deletion_grace());
                    }
                    if state.is_gone() || record.is_some_and(is_expired_at(now)) {
                        seen.stale_entries += 1;
                    }
                    if let (Some(grace), Some(r)) = (expired_grace, record) {
                        if !state.is_gone() {
                            seen.next_expiry =
                                min_opt(seen.next_expiry, expiry_instant(r, grace, now));
                        }
                    }
                }
            }
            seen
        })
    }

    /// Step 2: update the suspects from what was observed; return the IDs due for a live GET.
    pub(super) fn due(&self, observed: &Observed, svs: &[Arc<StoredSv>]) -> Vec<String> {
        let now = Instant::now();
        let grace = self.c.cfg.deletion_grace;
        // A deletion to follow up whose lease the store shows live again: back, forget it (its
        // next absence waits the whole grace).
        let follow_ups: Vec<String> = lock(&self.state)
            .suspects
            .iter()
            .filter(|(id, s)| s.follow_up && !observed.gone.contains_key(*id))
            .map(|(id, _)| id.clone())
            .collect();
        let back: BTreeSet<String> = follow_ups
            .into_iter()
            .filter(|id| self.looks_live(id))
            .collect();
        let mut state = lock(&self.state);
        for (id, needs_grace) in &observed.gone {
            let s = state
                .suspects
                .entry(id.clone())
                .or_insert_with(|| Suspect::new(now));
            s.needs_grace = *needs_grace;
        }
        // Looks live again (and no deletion to follow up): forget it.
        state
            .suspects
            .retain(|id, s| observed.gone.contains_key(id) || (s.follow_up && !back.contains(id)));
        // Objects changed since we acted on them: the stored copy is newer now.
        let current: HashMap<String, Option<String>> = svs
            .iter()
            .map(|sv| (sv.name().to_string(), sv.metadata.resource_version.clone()))
            .collect();
        state
            .acted
            .retain(|name, rv| current.get(name).is_some_and(|c| c.as_ref() == Some(rv)));
        state
            .suspects
            .iter()
            .filter(|(_, s)| s.due_at(grace) <= now)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// Judges a lease as the store shows it (`None`: not in the store, i.e. missing).
fn judge_stored(
    record: Option<&LeaseRecord>,
    now: Timestamp,
    expired_grace: Option<Duration>,
) -> LeaseState {
    match record {
        None => LeaseState::Missing,
        Some(r) => plan::judge_record(r, now, expired_grace),
    }
}

fn is_expired_at(now: Timestamp) -> impl Fn(&LeaseRecord) -> bool {
    move |r| r.expiry().is_none_or(|e| e <= now)
}

/// When the labelled lease `r` will count as expired beyond `grace`, on the monotonic clock
/// (None if it already does or never will).
fn expiry_instant(r: &LeaseRecord, grace: Duration, now: Timestamp) -> Option<Instant> {
    let at = r
        .expiry()?
        .checked_add(k8s_openapi::jiff::SignedDuration::try_from(grace).ok()?)
        .ok()?;
    let ahead = Duration::try_from(at.duration_since(now)).ok()?;
    Some(Instant::now() + ahead + Duration::from_millis(50))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_suspect_waits_for_the_grace_and_its_retries() {
        let grace = Duration::from_secs(30);
        let t0 = Instant::now();
        let mut s = Suspect::new(t0);
        assert_eq!(s.due_at(grace), t0 + grace);
        s.needs_grace = false;
        assert_eq!(s.due_at(grace), t0);
        s.retry_at = Some(t0 + Duration::from_secs(5));
        assert_eq!(s.due_at(grace), t0 + Duration::from_secs(5));
    }
}
