//! The pure rule: given what one StorageVersion says now, the version this resource last agreed
//! on, and since when the current agreement has been seen, is a storage migration due?
//!
//! No I/O and no clock: the caller passes `now` and keeps the [`Seen`] record between calls.

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
    /// Nothing to do: the agreed version is the one last agreed on.
    UpToDate,
    /// First agreement ever seen for this resource: remember it, migrate nothing (there is no
    /// earlier version known to have been written).
    Remember { version: String },
    /// The apiservers disagree: never migrate now.
    WaitDisagree,
    /// Agreed on a version some apiserver cannot decode: never migrate to it.
    BlockedNotDecodable { version: String, apiserver: String },
    /// A new version is agreed on but has not stayed so for the settle time yet.
    WaitSettle {
        from: String,
        to: String,
        remaining: Duration,
    },
    /// Create the migration to `to` (then remember `to`).
    Migrate { from: String, to: String },
}

/// The decision for one resource. `remembered` is the version this resource last agreed on (as
/// stored across restarts), `seen` the current agreement and since when, `settle` how long a
/// new agreement must hold before it is acted on.
pub fn decide(remembered: Option<&str>, seen: &Seen, now: Instant, settle: Duration) -> Decision {
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
    let Some(from) = remembered else {
        return Decision::Remember {
            version: version.clone(),
        };
    };
    if from == version {
        return Decision::UpToDate;
    }
    let held = now.saturating_duration_since(seen.since);
    if held < settle {
        return Decision::WaitSettle {
            from: from.to_string(),
            to: version.clone(),
            remaining: settle - held,
        };
    }
    Decision::Migrate {
        from: from.to_string(),
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

    #[test]
    fn decisions() {
        let t0 = Instant::now();
        let settle = Duration::from_secs(60);
        let agreed = seen(Agreement::Agreed(V.into()), t0);
        // First agreement: remembered, never migrated.
        assert_eq!(
            decide(None, &agreed, t0 + settle * 10, settle),
            Decision::Remember { version: V.into() }
        );
        // Unchanged.
        assert_eq!(decide(Some(V), &agreed, t0, settle), Decision::UpToDate);
        // Changed, settling.
        assert_eq!(
            decide(Some(B), &agreed, t0 + Duration::from_secs(20), settle),
            Decision::WaitSettle {
                from: B.into(),
                to: V.into(),
                remaining: Duration::from_secs(40)
            }
        );
        // Changed and settled: exactly at the settle time.
        assert_eq!(
            decide(Some(B), &agreed, t0 + settle, settle),
            Decision::Migrate {
                from: B.into(),
                to: V.into()
            }
        );
        // A zero settle time migrates at once.
        assert_eq!(
            decide(Some(B), &agreed, t0, Duration::ZERO),
            Decision::Migrate {
                from: B.into(),
                to: V.into()
            }
        );
    }

    #[test]
    fn never_while_disagreeing_or_undecodable_however_long() {
        let t0 = Instant::now();
        let late = t0 + Duration::from_secs(86_400);
        let settle = Duration::from_secs(1);
        for remembered in [None, Some(B), Some(V)] {
            assert_eq!(
                decide(remembered, &seen(Agreement::Disagree, t0), late, settle),
                Decision::WaitDisagree
            );
            let nd = Agreement::NotDecodable {
                version: V.into(),
                apiserver: "b".into(),
            };
            assert_eq!(
                decide(remembered, &seen(nd, t0), late, settle),
                Decision::BlockedNotDecodable {
                    version: V.into(),
                    apiserver: "b".into()
                }
            );
        }
    }

    #[test]
    fn a_rollback_before_the_settle_time_migrates_nothing() {
        // v1beta1 remembered; upgrade: disagree, then v1 for 30 s; rollback: disagree, then
        // v1beta1 again. Walk the sequence through observe + decide.
        let settle = Duration::from_secs(60);
        let t0 = Instant::now();
        let steps = [
            (0, Agreement::Agreed(B.into())),
            (10, Agreement::Disagree),
            (20, Agreement::Agreed(V.into())),
            (50, Agreement::Agreed(V.into())),
            (55, Agreement::Disagree),
            (70, Agreement::Agreed(B.into())),
            (500, Agreement::Agreed(B.into())),
        ];
        let mut s: Option<Seen> = None;
        for (at, a) in steps {
            let now = t0 + Duration::from_secs(at);
            let next = Seen::observe(s.as_ref(), a, now);
            let d = decide(Some(B), &next, now, settle);
            assert!(
                !matches!(d, Decision::Migrate { .. }),
                "migrated at {at}s: {d:?}"
            );
            s = Some(next);
        }
    }
}
