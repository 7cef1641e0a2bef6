//! The pure rule: given what one StorageVersion says now, what is remembered about the resource
//! ([`Record`]: which versions its entries encoded since the last migration began), and since
//! when the current agreement has been seen, is a storage migration due?
//!
//! No I/O and no clock: the caller passes `now` and keeps the [`Seen`] record between calls.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::StorageVersionStatus;

/// What the apiservers agree on right now, read from a StorageVersion's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Agreement {
    /// Every entry encodes `version`, `commonEncodingVersion` says so too, and every entry can
    /// decode it.
    Agreed(String),
    /// No entry, no `commonEncodingVersion`, or entries that encode different versions.
    Disagree,
    /// Every entry encodes `version`, but the entry of `apiserver` does not list it in
    /// `decodableVersions`: objects rewritten in it could not be read there.
    NotDecodable { version: String, apiserver: String },
}

/// Reads the agreement from a status. The entries decide; `commonEncodingVersion` must match
/// them (a stale or missing common version counts as disagreement).
pub fn agreement(status: &StorageVersionStatus) -> Agreement {
    let Some(common) = status.common_encoding_version.as_deref() else {
        return Agreement::Disagree;
    };
    if common.is_empty() || status.storage_versions.is_empty() {
        return Agreement::Disagree;
    }
    if status
        .storage_versions
        .iter()
        .any(|e| e.encoding_version != common)
    {
        return Agreement::Disagree;
    }
    if let Some(e) = status
        .storage_versions
        .iter()
        .find(|e| !e.decodable_versions.iter().any(|d| d == common))
    {
        return Agreement::NotDecodable {
            version: common.to_string(),
            apiserver: e.api_server_id.clone(),
        };
    }
    Agreement::Agreed(common.to_string())
}

/// What the trigger remembers about one resource across passes, restarts and leaders (one value
/// of the state ConfigMap, see [`super::state`]). Pure data; [`Record::observe`] folds what a
/// StorageVersion says now into it.
///
/// The question it answers: *may an object of this resource be stored in a version other than
/// the one the apiservers agree on now, with no migration begun since it was written?* Objects
/// are written in the version their apiserver encodes; an apiserver writes its entry before it
/// serves writes of the resource (upstream's storage-version barrier), so the entries' encoding
/// versions over time cover every version an object can have been written in.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The version every entry encoded when last seen agreeing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agreed: Option<String>,
    /// Every encoding version an entry was seen with since the last migration began (or since
    /// the resource was first seen). At most [`MAX_WRITTEN`] versions; past that, `missed`.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub written: BTreeSet<String>,
    /// The entries disagreed between two observations (the `AllEncodingVersionsEqual`
    /// condition moved while the object stayed the same): what was written then is unknown.
    #[serde(default, skip_serializing_if = "is_false")]
    pub missed: bool,
    /// The StorageVersion's uid and its condition's `lastTransitionTime` when last seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition: Option<String>,
    /// How many migrations were begun for this resource; the last one's name ends in it, so a
    /// new need never reuses an old name.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sequence: u64,
    /// The last migration begun (recorded before it is created), whether the create went
    /// through, and whether it was seen `Succeeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub created: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub succeeded: bool,
}

/// Versions remembered in [`Record::written`] at most (a resource has a handful; a hostile
/// writer of StorageVersions could name many).
pub const MAX_WRITTEN: usize = 16;

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The one version every entry encodes (None: no entry, or entries that differ). The entries
/// decide, not `commonEncodingVersion`.
fn single_encoding(status: &StorageVersionStatus) -> Option<&str> {
    crate::rules::common::actual_common_encoding_version(&status.storage_versions)
}

/// `lastTransitionTime` of the `AllEncodingVersionsEqual` condition.
fn transition(status: &StorageVersionStatus) -> Option<String> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == crate::model::ALL_ENCODING_VERSIONS_EQUAL)
        .and_then(|c| c.last_transition_time.clone())
}

impl Record {
    /// The record after seeing a StorageVersion (its `uid` and `status`) now. A resource seen
    /// for the first time agreeing on one version starts clean: nothing is known to be stored in
    /// another (else every resource of a new install would be migrated).
    pub fn observe(
        previous: Option<&Record>,
        uid: Option<&str>,
        status: &StorageVersionStatus,
    ) -> Record {
        let mut r = previous.cloned().unwrap_or_default();
        let first = previous.is_none();
        for e in &status.storage_versions {
            if r.written.contains(&e.encoding_version) {
                continue;
            }
            if r.written.len() < MAX_WRITTEN {
                r.written.insert(e.encoding_version.clone());
            } else {
                r.missed = true;
            }
        }
        let now_transition = transition(status);
        let same_object = uid.is_some() && r.uid.as_deref() == uid;
        if let Some(v) = single_encoding(status) {
            // The condition moved while the entries agreed before and agree now: they disagreed
            // in between, and this process did not see what they encoded then. A re-created
            // object (new uid) starts its condition afresh: that is no evidence.
            if !first
                && same_object
                && r.agreed.as_deref() == Some(v)
                && r.transition.is_some()
                && now_transition.is_some()
                && r.transition != now_transition
            {
                r.missed = true;
            }
            r.agreed = Some(v.to_string());
        }
        r.uid = uid.map(str::to_string);
        r.transition = now_transition;
        r
    }

    /// Whether objects may be stored in a version other than `version` with no migration begun
    /// since they were written.
    pub fn needs_migration_to(&self, version: &str) -> bool {
        self.missed || self.written.iter().any(|w| w != version)
    }

    /// The versions other than `version` objects may be stored in (`unknown` for what was
    /// missed), for messages.
    pub fn others(&self, version: &str) -> String {
        let mut v: Vec<&str> = self
            .written
            .iter()
            .map(String::as_str)
            .filter(|w| *w != version)
            .collect();
        if self.missed {
            v.push("unknown");
        }
        v.join(", ")
    }

    /// The record once a migration to `version` named `name` (number `sequence`) has begun:
    /// what was written before is the migration's to rewrite.
    pub fn begin(&self, version: &str, name: &str, sequence: u64) -> Record {
        Record {
            written: BTreeSet::from([version.to_string()]),
            missed: false,
            sequence,
            migration: Some(name.to_string()),
            created: false,
            succeeded: false,
            ..self.clone()
        }
    }
}

/// This process's memory of one resource between two decisions: the agreement last seen and
/// since when (monotonic clock). Lost on restart, which only delays a migration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub agreement: Agreement,
    pub since: Instant,
}

impl Seen {
    /// The record after observing `now_agreement` at `now`: the start time is kept while the
    /// agreement stays the same, and restarts when it changes.
    pub fn observe(previous: Option<&Seen>, now_agreement: Agreement, now: Instant) -> Seen {
        match previous {
            Some(p) if p.agreement == now_agreement => p.clone(),
            _ => Seen {
                agreement: now_agreement,
                since: now,
            },
        }
    }
}

/// What to do about one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do: nothing is known to be stored in another version since the last
    /// migration began.
    UpToDate,
    /// The apiservers disagree: never migrate now.
    WaitDisagree,
    /// Agreed on a version some apiserver cannot decode: never migrate to it.
    BlockedNotDecodable { version: String, apiserver: String },
    /// Objects may be stored in other versions, but the agreement has not held for the settle
    /// time yet.
    WaitSettle {
        from: String,
        to: String,
        remaining: Duration,
    },
    /// Begin a migration to `to` (objects may be stored as `from`).
    Migrate { from: String, to: String },
}

/// The decision for one resource. `record` is what is remembered about it (already updated with
/// what is seen now, [`Record::observe`]), `seen` the current agreement and since when,
/// `settle` how long an agreement must hold before it is acted on.
pub fn decide(record: &Record, seen: &Seen, now: Instant, settle: Duration) -> Decision {
    let version = match &seen.agreement {
        Agreement::Disagree => return Decision::WaitDisagree,
        Agreement::NotDecodable { version, apiserver } => {
            return Decision::BlockedNotDecodable {
                version: version.clone(),
                apiserver: apiserver.clone(),
            }
        }
        Agreement::Agreed(v) => v,
    };
    if !record.needs_migration_to(version) {
        return Decision::UpToDate;
    }
    let from = record.others(version);
    let held = now.saturating_duration_since(seen.since);
    if held < settle {
        return Decision::WaitSettle {
            from,
            to: version.clone(),
            remaining: settle - held,
        };
    }
    Decision::Migrate {
        from,
        to: version.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ServerStorageVersion;

    fn entry(id: &str, enc: &str, dec: &[&str]) -> ServerStorageVersion {
        ServerStorageVersion {
            api_server_id: id.into(),
            encoding_version: enc.into(),
            decodable_versions: dec.iter().map(|s| s.to_string()).collect(),
            served_versions: vec![],
        }
    }

    fn status(entries: Vec<ServerStorageVersion>, common: Option<&str>) -> StorageVersionStatus {
        StorageVersionStatus {
            storage_versions: entries,
            common_encoding_version: common.map(str::to_string),
            conditions: vec![],
        }
    }

    const B: &str = "g/v1beta1";
    const V: &str = "g/v1";

    #[test]
    fn agreement_reads_entries_not_just_the_common_version() {
        let both = &[B, V];
        assert_eq!(
            agreement(&status(
                vec![entry("a", V, both), entry("b", V, both)],
                Some(V)
            )),
            Agreement::Agreed(V.into())
        );
        // Mixed entries: disagreement, whatever commonEncodingVersion says.
        assert_eq!(
            agreement(&status(
                vec![entry("a", V, both), entry("b", B, both)],
                Some(V)
            )),
            Agreement::Disagree
        );
        assert_eq!(
            agreement(&status(
                vec![entry("a", V, both), entry("b", B, both)],
                None
            )),
            Agreement::Disagree
        );
        // Entries agree but the common version is missing or stale.
        assert_eq!(
            agreement(&status(vec![entry("a", V, both)], None)),
            Agreement::Disagree
        );
        assert_eq!(
            agreement(&status(vec![entry("a", V, both)], Some(B))),
            Agreement::Disagree
        );
        assert_eq!(agreement(&status(vec![], Some(V))), Agreement::Disagree);
        assert_eq!(
            agreement(&status(vec![entry("a", V, both)], Some(""))),
            Agreement::Disagree
        );
        // An entry that cannot decode the agreed version blocks it.
        assert_eq!(
            agreement(&status(
                vec![entry("a", V, both), entry("b", V, &[B])],
                Some(V)
            )),
            Agreement::NotDecodable {
                version: V.into(),
                apiserver: "b".into()
            }
        );
    }

    fn seen(a: Agreement, since: Instant) -> Seen {
        Seen {
            agreement: a,
            since,
        }
    }

    #[test]
    fn observe_keeps_the_start_while_unchanged_and_restarts_on_change() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(5);
        let s = Seen::observe(None, Agreement::Agreed(V.into()), t0);
        assert_eq!(s.since, t0);
        let s2 = Seen::observe(Some(&s), Agreement::Agreed(V.into()), t1);
        assert_eq!(s2.since, t0);
        let s3 = Seen::observe(Some(&s2), Agreement::Disagree, t1);
        assert_eq!(s3.since, t1);
        let s4 = Seen::observe(
            Some(&s3),
            Agreement::Agreed(V.into()),
            t1 + Duration::from_secs(1),
        );
        assert_eq!(s4.since, t1 + Duration::from_secs(1));
    }

    fn record(agreed: &str, written: &[&str]) -> Record {
        Record {
            agreed: Some(agreed.into()),
            written: written.iter().map(|w| w.to_string()).collect(),
            ..Record::default()
        }
    }

    #[test]
    fn decisions() {
        let t0 = Instant::now();
        let settle = Duration::from_secs(60);
        let agreed = seen(Agreement::Agreed(V.into()), t0);
        // Only V was ever written: nothing to do, however long.
        assert_eq!(
            decide(&record(V, &[V]), &agreed, t0 + settle * 10, settle),
            Decision::UpToDate
        );
        // B written too, settling.
        let mixed = record(V, &[B, V]);
        assert_eq!(
            decide(&mixed, &agreed, t0 + Duration::from_secs(20), settle),
            Decision::WaitSettle {
                from: B.into(),
                to: V.into(),
                remaining: Duration::from_secs(40)
            }
        );
        // Settled: exactly at the settle time.
        assert_eq!(
            decide(&mixed, &agreed, t0 + settle, settle),
            Decision::Migrate {
                from: B.into(),
                to: V.into()
            }
        );
        // A zero settle time migrates at once.
        assert_eq!(
            decide(&mixed, &agreed, t0, Duration::ZERO),
            Decision::Migrate {
                from: B.into(),
                to: V.into()
            }
        );
        // A missed disagreement counts as another version written.
        let missed = Record {
            missed: true,
            ..record(V, &[V])
        };
        assert_eq!(
            decide(&missed, &agreed, t0 + settle, settle),
            Decision::Migrate {
                from: "unknown".into(),
                to: V.into()
            }
        );
    }

    #[test]
    fn never_while_disagreeing_or_undecodable_however_long() {
        let t0 = Instant::now();
        let late = t0 + Duration::from_secs(86_400);
        let settle = Duration::from_secs(1);
        for r in [Record::default(), record(B, &[B, V]), record(V, &[V])] {
            assert_eq!(
                decide(&r, &seen(Agreement::Disagree, t0), late, settle),
                Decision::WaitDisagree
            );
            let nd = Agreement::NotDecodable {
                version: V.into(),
                apiserver: "b".into(),
            };
            assert_eq!(
                decide(&r, &seen(nd, t0), late, settle),
                Decision::BlockedNotDecodable {
                    version: V.into(),
                    apiserver: "b".into()
                }
            );
        }
    }

    /// A StorageVersion status as kube-apiserver writes it: entries encoding `encodings`, the
    /// common version and condition computed upstream's way with `transition` as its time.
    fn observed(encodings: &[&str], transition: &str) -> StorageVersionStatus {
        let entries: Vec<_> = encodings
            .iter()
            .enumerate()
            .map(|(i, v)| entry(&format!("a{i}"), v, &[B, V]))
            .collect();
        let common =
            crate::rules::common::actual_common_encoding_version(&entries).map(str::to_string);
        let mut st = status(entries, common.as_deref());
        st.conditions.push(crate::model::StorageVersionCondition {
            type_: crate::model::ALL_ENCODING_VERSIONS_EQUAL.into(),
            status: if common.is_some() { "True" } else { "False" }.into(),
            last_transition_time: Some(transition.into()),
            reason: "r".into(),
            message: "m".into(),
            ..Default::default()
        });
        st
    }

    /// Walks (seconds, status, uid) through observe + decide as the trigger does, beginning a
    /// migration whenever one is decided; returns the versions migrated to, with when.
    fn walk(
        start: Option<Record>,
        steps: &[(u64, StorageVersionStatus, &str)],
        settle: Duration,
    ) -> (Vec<(u64, String)>, Record) {
        let t0 = Instant::now();
        let mut r = start;
        let mut s: Option<Seen> = None;
        let mut migrated = Vec::new();
        for (at, st, uid) in steps {
            let now = t0 + Duration::from_secs(*at);
            let mut next = Record::observe(r.as_ref(), Some(uid), st);
            let seen_now = Seen::observe(s.as_ref(), agreement(st), now);
            if let Decision::Migrate { to, .. } = decide(&next, &seen_now, now, settle) {
                let n = next.sequence + 1;
                next = next.begin(&to, &format!("m-{n}"), n);
                migrated.push((*at, to));
            }
            r = Some(next);
            s = Some(seen_now);
        }
        (migrated, r.unwrap_or_default())
    }

    #[test]
    fn a_new_install_migrates_nothing() {
        let steps = [
            (0, observed(&[V, V], "t0"), "u"),
            (1000, observed(&[V, V], "t0"), "u"),
        ];
        let (migrated, r) = walk(None, &steps, Duration::from_secs(60));
        assert!(migrated.is_empty(), "{migrated:?}");
        assert_eq!(r.agreed.as_deref(), Some(V));
    }

    #[test]
    fn an_upgrade_migrates_once_after_the_settle_time() {
        let settle = Duration::from_secs(60);
        let steps = [
            (0, observed(&[B, B], "t0"), "u"),
            (10, observed(&[V, B], "t1"), "u"),
            (20, observed(&[V, V], "t2"), "u"),
            (50, observed(&[V, V], "t2"), "u"),
            (80, observed(&[V, V], "t2"), "u"),
            (500, observed(&[V, V], "t2"), "u"),
        ];
        let (migrated, r) = walk(None, &steps, settle);
        assert_eq!(migrated, vec![(80, V.to_string())]);
        assert_eq!(r.sequence, 1);
        assert!(!r.needs_migration_to(V));
    }

    /// Defect 3 of the interleavings issue: upgrade, migration, rollback of one apiserver (it
    /// writes objects in B), re-upgrade to the version already migrated to. The old rule
    /// compared only the agreed version with the remembered one and answered "up to date".
    #[test]
    fn writes_during_a_rollback_are_migrated_after_the_reupgrade() {
        let settle = Duration::from_secs(60);
        let steps = [
            (0, observed(&[B, B], "t0"), "u"),
            (10, observed(&[V, V], "t1"), "u"),
            (100, observed(&[V, V], "t1"), "u"), // migration 1 to V
            (200, observed(&[B, V], "t2"), "u"), // one apiserver rolled back
            (300, observed(&[V, V], "t3"), "u"), // upgraded again
            (330, observed(&[V, V], "t3"), "u"),
            (400, observed(&[V, V], "t3"), "u"), // migration 2 to V
            (900, observed(&[V, V], "t3"), "u"),
        ];
        let (migrated, r) = walk(None, &steps, settle);
        assert_eq!(migrated, vec![(100, V.to_string()), (400, V.to_string())]);
        assert_eq!(r.sequence, 2);
        assert_eq!(r.migration.as_deref(), Some("m-2"));
    }

    /// The same rollback, but the trigger never saw the entries disagree (it was not leading, or
    /// it polls slower than the apiserver went back and forth): the condition's transition time
    /// moved on the same object, which is evidence enough.
    #[test]
    fn a_disagreement_between_two_looks_is_not_missed() {
        let settle = Duration::from_secs(60);
        let start = record(V, &[V]);
        let with_transition = Record {
            uid: Some("u".into()),
            transition: Some("t1".into()),
            ..start
        };
        let (migrated, _) = walk(
            Some(with_transition.clone()),
            &[
                (0, observed(&[V, V], "t1"), "u"),
                (100, observed(&[V, V], "t1"), "u"),
            ],
            settle,
        );
        assert!(migrated.is_empty(), "{migrated:?}");
        let (migrated, _) = walk(
            Some(with_transition.clone()),
            &[
                (0, observed(&[V, V], "t5"), "u"),
                (100, observed(&[V, V], "t5"), "u"),
            ],
            settle,
        );
        assert_eq!(migrated, vec![(100, V.to_string())]);
        // A re-created object (all its entries were collected, then an apiserver wrote it
        // again) starts a new condition: no evidence of another version.
        let (migrated, _) = walk(
            Some(with_transition),
            &[
                (0, observed(&[V, V], "t5"), "u2"),
                (100, observed(&[V, V], "t5"), "u2"),
            ],
            settle,
        );
        assert!(migrated.is_empty(), "{migrated:?}");
    }

    #[test]
    fn a_rollback_before_the_settle_time_migrates_nothing_to_the_new_version() {
        // B remembered; upgrade: disagree, then V for 30 s; rollback: disagree, then B again.
        // Nothing migrates to V. Objects may have been written in V meanwhile, so once B has
        // held for the settle time they are migrated back to B.
        let settle = Duration::from_secs(60);
        let steps = [
            (0, observed(&[B, B], "t0"), "u"),
            (10, observed(&[V, B], "t1"), "u"),
            (20, observed(&[V, V], "t2"), "u"),
            (50, observed(&[V, V], "t2"), "u"),
            (55, observed(&[B, V], "t3"), "u"),
            (70, observed(&[B, B], "t4"), "u"),
            (100, observed(&[B, B], "t4"), "u"),
            (130, observed(&[B, B], "t4"), "u"),
            (500, observed(&[B, B], "t4"), "u"),
        ];
        let (migrated, _) = walk(None, &steps, settle);
        assert_eq!(migrated, vec![(130, B.to_string())]);
    }

    #[test]
    fn written_versions_are_bounded() {
        let mut r: Option<Record> = None;
        for i in 0..100 {
            let v = format!("g/v{i}");
            r = Some(Record::observe(
                r.as_ref(),
                Some("u"),
                &observed(&[v.as_str()], "t"),
            ));
        }
        let r = r.unwrap_or_default();
        assert_eq!(r.written.len(), MAX_WRITTEN);
        assert!(r.missed && r.needs_migration_to("g/v99"));
    }

    #[test]
    fn records_read_back_as_written() {
        let r = Record {
            migration: Some("m-1".into()),
            sequence: 1,
            created: true,
            ..record(V, &[V])
        };
        let text = serde_json::to_string(&r).unwrap_or_default();
        assert_eq!(serde_json::from_str::<Record>(&text).ok(), Some(r));
    }
}
