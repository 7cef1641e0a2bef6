//! The pure decision of the CRD migrator: given what a CustomResourceDefinition shows now, what
//! we recorded about its last migration, how long it has looked the same, and `now`, what to do.
//! No I/O, no clock, no logging: everything is an argument (docs/crd.md, invariants I7 and I8).

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// What the migrator keeps of one CRD (everything else of it is dropped on decoding).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub name: String,
    pub uid: String,
    pub generation: i64,
    pub resource_version: String,
    /// The `Established` condition is True.
    pub established: bool,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// The version with `storage: true` (None: none, or more than one).
    pub storage: Option<String>,
    /// Served versions, in spec order.
    pub served: Vec<String>,
    /// `status.storedVersions`, as listed.
    pub stored: Vec<String>,
}

impl Snapshot {
    /// storedVersions lists nothing but the storage version.
    pub fn up_to_date(&self) -> bool {
        match &self.storage {
            Some(s) => self.stored.iter().all(|v| v == s),
            None => true,
        }
    }

    /// What must stay the same for the settle time before a migration begins: the CRD object,
    /// its spec (generation), its storage version and its storedVersions.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint {
            uid: self.uid.clone(),
            generation: self.generation,
            storage: self.storage.clone(),
            stored: self.stored.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    uid: String,
    generation: i64,
    storage: Option<String>,
    stored: Vec<String>,
}

/// How long, after our StorageVersionMigration succeeded, we leave the prune to
/// kube-controller-manager's migrator before we prune ourselves. Its migrator prunes in the same
/// reconcile that sees the success from 1.36 on (`finishCRDMigration`); 1.35's never prunes
/// (measured: `scripts/matrix 1.35`), and a CRD would stay unfinished there.
pub const KCM_PRUNE_GRACE: Duration = Duration::from_secs(60);

/// The longest wait before a failed migration is tried again (see [`retry_wait`]).
pub const RETRY_CAP: Duration = Duration::from_secs(6 * 3600);

/// How long after a failed migration the same need is tried again: `retry` after the first
/// failure in a row, doubling with each further one, at most [`RETRY_CAP`].
pub fn retry_wait(retry: Duration, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    retry.saturating_mul(1 << doublings).min(RETRY_CAP)
}

/// The migrator's waits (`--crd-migrate-settle`, `--crd-migrate-retry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a CRD must look the same before a migration of it begins.
    pub settle: Duration,
    /// The first wait before a failed migration is tried again ([`retry_wait`]).
    pub retry: Duration,
}

/// Since when a CRD has looked the same (in memory only: a restart restarts the settle time,
/// which can only delay a migration), since when this term has waited for
/// kube-controller-manager's prune of it, and since when it has seen its last migration failed
/// (likewise: a new leader waits again).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub fingerprint: Fingerprint,
    pub since: Instant,
    pub awaiting_prune: Option<Instant>,
    pub failed_since: Option<Instant>,
}

impl Seen {
    pub fn observe(previous: Option<&Seen>, crd: &Snapshot, now: Instant) -> Seen {
        let fingerprint = crd.fingerprint();
        match previous {
            Some(p) if p.fingerprint == fingerprint => p.clone(),
            _ => Seen {
                fingerprint,
                since: now,
                awaiting_prune: None,
                failed_since: None,
            },
        }
    }

    /// After `decision` at `now`: the wait for kube-controller-manager's prune starts at the
    /// first [`Decision::AwaitPrune`], the wait before a retry at the first
    /// [`Decision::Failed`], and each ends with any other decision.
    pub fn after(mut self, decision: &Decision, now: Instant) -> Seen {
        let since = |d: bool, s: Option<Instant>| d.then(|| s.unwrap_or(now));
        self.awaiting_prune = since(
            matches!(decision, Decision::AwaitPrune),
            self.awaiting_prune,
        );
        self.failed_since = since(
            matches!(decision, Decision::Failed { .. }),
            self.failed_since,
        );
        self
    }
}

/// How the objects are rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// A StorageVersionMigration, run by kube-controller-manager's migrator, which also prunes
    /// storedVersions when it succeeds from 1.36 on: we verify, and prune after
    /// [`KCM_PRUNE_GRACE`] where it does not (1.35).
    Svm,
    /// We rewrite every object ourselves, then prune.
    Rewrite,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Svm => "svm",
            Method::Rewrite => "rewrite",
        }
    }
}

/// Where a recorded migration stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Running,
    Succeeded,
    Failed,
    /// Given up because the CRD changed under it (a rewrite we stopped); never pruned on.
    Abandoned,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::Succeeded => "succeeded",
            Phase::Failed => "failed",
            Phase::Abandoned => "abandoned",
        }
    }
}

/// One migration of a CRD's objects, as recorded before it began.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    /// Never used for another migration (see [`super::names`]).
    pub name: String,
    pub sequence: u64,
    pub method: Method,
    /// The storage version it migrates to.
    pub storage: String,
    /// The CRD's generation when it began.
    pub generation: i64,
    /// storedVersions when it began.
    pub stored: Vec<String>,
    pub phase: Phase,
    /// Why it failed or was abandoned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl Migration {
    /// The CRD is still what this migration was begun for: the same generation and storage
    /// version, and no version in storedVersions that was not there when it began. Only then
    /// can its success justify a prune (I7).
    pub fn covers(&self, crd: &Snapshot) -> bool {
        let began: BTreeSet<&str> = self.stored.iter().map(String::as_str).collect();
        crd.generation == self.generation
            && crd.storage.as_deref() == Some(self.storage.as_str())
            && crd
                .stored
                .iter()
                .all(|v| began.contains(v.as_str()) || *v == self.storage)
    }
}

/// What we recorded about one CRD (a value of the state ConfigMap).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The CRD object (uid) the record is about: a CRD deleted and created again is a new one.
    pub uid: String,
    /// The highest migration number used for this CRD object.
    pub sequence: u64,
    /// Migrations of this CRD object that failed in a row (a success sets it back to 0): the
    /// wait before the next try doubles with each ([`retry_wait`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    /// The last migration begun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<Migration>,
}

impl Record {
    /// The record as it applies to `crd` (a record of another uid is none).
    pub fn of<'a>(record: Option<&'a Record>, crd: &Snapshot) -> Option<&'a Record> {
        record.filter(|r| r.uid == crd.uid)
    }

    /// The record once migration `name` (number `sequence`) of `crd` by `method` has begun.
    pub fn begin(crd: &Snapshot, name: &str, sequence: u64, method: Method) -> Option<Record> {
        let storage = crd.storage.clone()?;
        Some(Record {
            uid: crd.uid.clone(),
            sequence,
            failures: 0,
            migration: Some(Migration {
                name: name.to_string(),
                sequence,
                method,
                storage,
                generation: crd.generation,
                stored: crd.stored.clone(),
                phase: Phase::Running,
                message: String::new(),
            }),
        })
    }
}

/// What to do about one CRD now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not Established, being deleted, or no single storage version: nothing is ours to do.
    NotReady,
    /// storedVersions lists only the storage version.
    UpToDate,
    /// A migration is needed, once the CRD has looked the same for the settle time.
    Settle { remaining: Duration },
    /// Begin migration number `sequence` (record it first, then start it).
    Start { sequence: u64, method: Method },
    /// Our migration is running: keep it going (a rewrite this term did not start is resumed),
    /// or follow it (a StorageVersionMigration).
    Run,
    /// Our rewrite is running for a CRD that changed under it: stop it and record it abandoned;
    /// a new migration follows after the settle time.
    Abandon { reason: String },
    /// Our rewrite succeeded and still covers the CRD: set storedVersions to `[storage]`, on the
    /// resourceVersion this decision was made on.
    Prune { storage: String },
    /// Our StorageVersionMigration succeeded: kube-controller-manager's migrator prunes; we wait
    /// [`KCM_PRUNE_GRACE`] and verify (then [`Decision::Prune`]: one whose migrator does not
    /// prune, as 1.35's, leaves it to us).
    AwaitPrune,
    /// Our migration for this very need failed: tried again in `retry_in` (after
    /// `--crd-migrate-retry`, doubling with each failure in a row), or after the settle time
    /// once the CRD changes.
    Failed { retry_in: Duration },
    /// A migration is needed but neither way is available (`--crd-migrate-method=svm` on a
    /// cluster that serves no StorageVersionMigration API).
    NoMethod,
}

impl Decision {
    /// The label of the `crds` gauge.
    pub fn state(&self) -> &'static str {
        match self {
            Decision::NotReady => "not_ready",
            Decision::UpToDate => "up_to_date",
            Decision::Settle { .. } => "settling",
            Decision::Start { .. } | Decision::Run | Decision::Abandon { .. } => "migrating",
            Decision::Prune { .. } | Decision::AwaitPrune => "prune_pending",
            Decision::Failed { .. } => "failed",
            Decision::NoMethod => "no_method",
        }
    }
}

/// The decision for `crd`, given our `record` of it, since when it has looked the same
/// (`seen`, from [`Seen::observe`]), the way migrations can be made now (`method`, None: none),
/// the settle and retry times and the highest migration number already used for it elsewhere
/// (`highest_elsewhere`: our StorageVersionMigrations of it, so that a lost record never makes a
/// name be used twice).
pub fn decide(
    crd: &Snapshot,
    record: Option<&Record>,
    seen: &Seen,
    now: Instant,
    timing: Timing,
    method: Option<Method>,
    highest_elsewhere: u64,
) -> Decision {
    let record = Record::of(record, crd);
    let migration = record.and_then(|r| r.migration.as_ref());
    // I8: while one of ours runs, nothing else begins. This comes before the readiness checks:
    // a rewrite of a CRD being deleted or changed is stopped, not left running.
    if let Some(m) = migration.filter(|m| m.phase == Phase::Running) {
        let covers = m.covers(crd) && !crd.terminating;
        return match (m.method, covers) {
            (_, true) => Decision::Run,
            (Method::Rewrite, false) => Decision::Abandon {
                reason: abandon_reason(m, crd),
            },
            // kube-controller-manager runs it to its end; it checks the generation itself before
            // it prunes, and so do we (nothing is pruned on a migration that no longer covers).
            (Method::Svm, false) => Decision::Run,
        };
    }
    let Some(storage) = crd.storage.as_deref() else {
        return Decision::NotReady;
    };
    if !crd.established || crd.terminating {
        return Decision::NotReady;
    }
    if crd.up_to_date() {
        return Decision::UpToDate;
    }
    if let Some(m) = migration.filter(|m| m.covers(crd)) {
        match (m.phase, m.method) {
            (Phase::Succeeded, Method::Rewrite) => {
                return Decision::Prune {
                    storage: storage.to_string(),
                }
            }
            (Phase::Succeeded, Method::Svm) => {
                let waited = seen
                    .awaiting_prune
                    .map(|since| now.saturating_duration_since(since));
                return match waited {
                    Some(w) if w >= KCM_PRUNE_GRACE => Decision::Prune {
                        storage: storage.to_string(),
                    },
                    _ => Decision::AwaitPrune,
                };
            }
            (Phase::Failed, _) => {
                // I8: the same need is tried again only once the failed one has ended, and
                // after the wait; as a new migration with the next number.
                let failures = record.map_or(1, |r| r.failures.max(1));
                let wait = retry_wait(timing.retry, failures);
                let waited = seen
                    .failed_since
                    .map(|since| now.saturating_duration_since(since))
                    .unwrap_or_default();
                if waited < wait {
                    return Decision::Failed {
                        retry_in: wait - waited,
                    };
                }
            }
            (Phase::Running, _) | (Phase::Abandoned, _) => {}
        }
    }
    let Some(method) = method else {
        return Decision::NoMethod;
    };
    let settle = timing.settle;
    let held = now.saturating_duration_since(seen.since);
    if seen.fingerprint != crd.fingerprint() || held < settle {
        let remaining = if seen.fingerprint == crd.fingerprint() {
            settle - held
        } else {
            settle
        };
        return Decision::Settle { remaining };
    }
    let sequence = record
        .map(|r| r.sequence)
        .unwrap_or(0)
        .max(highest_elsewhere)
        .saturating_add(1);
    Decision::Start { sequence, method }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn abandon_reason(m: &Migration, crd: &Snapshot) -> String {
    if crd.terminating {
        return "the CustomResourceDefinition is being deleted".to_string();
    }
    if crd.storage.as_deref() != Some(m.storage.as_str()) {
        return format!(
            "the storage version changed from {} to {}",
            m.storage,
            crd.storage.as_deref().unwrap_or("none")
        );
    }
    if crd.generation != m.generation {
        return format!(
            "the generation changed from {} to {}",
            m.generation, crd.generation
        );
    }
    "a version joined storedVersions".to_string()
}

/// The storedVersions a prune writes, and whether it may be written on `crd` as it is now: the
/// decision is made again on the copy read right before the write, whose resourceVersion the
/// write carries, so a change in between makes the write fail instead of losing a version.
pub fn pruned(crd: &Snapshot, record: Option<&Record>) -> Option<Vec<String>> {
    let m = Record::of(record, crd)?.migration.as_ref()?;
    let ok = m.phase == Phase::Succeeded
        && m.covers(crd)
        && crd.established
        && !crd.terminating
        && !crd.up_to_date();
    ok.then(|| vec![m.storage.clone()])
}

#[cfg(test)]
mod tests;
