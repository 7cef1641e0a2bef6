//! What the garbage collector does to one StorageVersion, as pure functions: no I/O, no clock.
//!
//! 1. [`judge_lease`] turns what is known about an entry's identity lease into a [`LeaseState`].
//! 2. The caller decides which gone apiServerIDs may be removed now (the collector applies its
//!    deletion grace; `audit` reports what would eventually happen) and calls [`plan`].
//! 3. [`plan`] returns [`Plan::Nothing`], a rewritten status ([`Plan::Rewrite`], entries kept in
//!    order, commonEncodingVersion and condition recomputed as upstream, docs/upstream.md §3.3), or
//!    [`Plan::Delete`] when no entry is left (docs/upstream.md §5.6).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Serialize;

use crate::model::{LeaseLookup, LeaseRecord, StorageVersion, IDENTITY_LABEL_VALUE};
use crate::rules::common::set_common_encoding_version;

/// What the collector concludes about one apiServerID's identity lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// A kube-apiserver identity lease that exists (and, when the expired-lease grace is on, has
    /// not been expired for longer than it).
    Live,
    /// The API server said NotFound.
    Missing,
    /// The lease exists but lacks `apiserver.kubernetes.io/identity=kube-apiserver`.
    NotApiserver { label: Option<String> },
    /// Expired for longer than `--gc-expired-lease-grace` (`expired_at` is `None` when the lease
    /// has no renewTime or duration, which counts as expired, docs/upstream.md §4.4).
    ExpiredBeyondGrace { expired_at: Option<Timestamp> },
    /// The lookup failed: never a reason to remove anything.
    Unknown(String),
}

impl LeaseState {
    /// Evidence that the apiserver is gone.
    pub fn is_gone(&self) -> bool {
        self.reason().is_some()
    }

    /// Why an entry of this apiserver would be removed, if it would.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            LeaseState::Missing => Some(Reason::LeaseMissing),
            LeaseState::NotApiserver { label } => Some(Reason::LeaseNotApiserver {
                label: label.clone(),
            }),
            LeaseState::ExpiredBeyondGrace { expired_at } => Some(Reason::LeaseExpired {
                expired_at: *expired_at,
            }),
            LeaseState::Live | LeaseState::Unknown(_) => None,
        }
    }

    /// Whether removal must wait for the lease to have been gone for the deletion grace.
    /// Missing and unlabelled leases must (kube-apiserver deletes and re-creates its own lease
    /// around restarts); a lease expired beyond the expired-lease grace has already waited.
    pub fn needs_deletion_grace(&self) -> bool {
        matches!(self, LeaseState::Missing | LeaseState::NotApiserver { .. })
    }
}

/// Why an entry is removed. Rendered in logs, Events and `audit`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum Reason {
    /// Identity lease `kube-system/<id>` does not exist.
    LeaseMissing,
    /// The lease exists but is not a kube-apiserver identity lease.
    LeaseNotApiserver { label: Option<String> },
    /// The lease expired longer ago than `--gc-expired-lease-grace`.
    LeaseExpired {
        #[serde(skip_serializing_if = "Option::is_none")]
        expired_at: Option<Timestamp>,
    },
}

impl Reason {
    /// Short stable code (also a metric label value).
    pub fn code(&self) -> &'static str {
        match self {
            Reason::LeaseMissing => "lease-missing",
            Reason::LeaseNotApiserver { .. } => "lease-not-apiserver",
            Reason::LeaseExpired { .. } => "lease-expired",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::LeaseMissing => f.write_str("its identity lease does not exist"),
            Reason::LeaseNotApiserver { label: None } => write!(
                f,
                "its lease has no label apiserver.kubernetes.io/identity={IDENTITY_LABEL_VALUE}"
            ),
            Reason::LeaseNotApiserver { label: Some(v) } => write!(
                f,
                "its lease is labelled apiserver.kubernetes.io/identity={v:?}, not {IDENTITY_LABEL_VALUE:?}"
            ),
            Reason::LeaseExpired {
                expired_at: Some(t),
            } => write!(f, "its identity lease expired at {t}"),
            Reason::LeaseExpired { expired_at: None } => f.write_str(
                "its identity lease has no renewTime or leaseDurationSeconds (counts as expired)",
            ),
        }
    }
}

/// One apiServerID whose entries go, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Removal {
    #[serde(rename = "apiServerID")]
    pub id: String,
    #[serde(flatten)]
    pub reason: Reason,
}

/// What to do with one StorageVersion.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Nothing to remove: no write at all (so a stale commonEncodingVersion is left alone, as
    /// upstream leaves it, docs/upstream.md §5 case 2).
    Nothing,
    /// Write this object (same metadata, so the resourceVersion read) through `/status`.
    Rewrite {
        object: Box<StorageVersion>,
        removed: Vec<Removal>,
    },
    /// No entry is left: delete the object (with resourceVersion and uid preconditions).
    Delete { removed: Vec<Removal> },
}

impl Plan {
    pub fn removed(&self) -> &[Removal] {
        match self {
            Plan::Nothing => &[],
            Plan::Rewrite { removed, .. } | Plan::Delete { removed } => removed,
        }
    }
}

/// When an identity lease expires: `renewTime + leaseDurationSeconds`, or `None` when either is
/// missing (then it counts as expired, docs/upstream.md §4.4).
pub fn expiry(record: &LeaseRecord) -> Option<Timestamp> {
    record.expiry()
}

/// Judges one lookup. `expired_grace` is `--gc-expired-lease-grace` (None: expiry is ignored,
/// as upstream ignores it).
pub fn judge_lease(
    lookup: &LeaseLookup,
    now: Timestamp,
    expired_grace: Option<Duration>,
) -> LeaseState {
    match lookup {
        LeaseLookup::NotFound => LeaseState::Missing,
        LeaseLookup::Failed(e) => LeaseState::Unknown(e.clone()),
        LeaseLookup::Unknown => LeaseState::Unknown("no lease data".to_string()),
        LeaseLookup::Found(record) => judge_record(record, now, expired_grace),
    }
}

/// Judges a lease that exists.
pub fn judge_record(
    record: &LeaseRecord,
    now: Timestamp,
    expired_grace: Option<Duration>,
) -> LeaseState {
    if !record.is_apiserver() {
        return LeaseState::NotApiserver {
            label: record.identity_label.clone(),
        };
    }
    let Some(grace) = expired_grace else {
        return LeaseState::Live;
    };
    match expiry(record) {
        None => LeaseState::ExpiredBeyondGrace { expired_at: None },
        Some(at) => {
            let grace = SignedDuration::try_from(grace).unwrap_or(SignedDuration::MAX);
            let gone = at
                .checked_add(grace)
                .map(|limit| limit < now)
                .unwrap_or(false);
            if gone {
                LeaseState::ExpiredBeyondGrace {
                    expired_at: Some(at),
                }
            } else {
                LeaseState::Live
            }
        }
    }
}

/// The distinct apiServerIDs of `sv`'s entries, in order.
pub fn entry_ids(sv: &StorageVersion) -> Vec<&str> {
    let mut ids: Vec<&str> = Vec::new();
    for e in &sv.status.storage_versions {
        if !ids.contains(&e.api_server_id.as_str()) {
            ids.push(&e.api_server_id);
        }
    }
    ids
}

/// Decides what to do with `sv` given the apiServerIDs to remove now. Entries of other IDs are
/// kept, in order. `now` is RFC 3339 text for a condition's lastTransitionTime.
pub fn plan(sv: &StorageVersion, remove: &BTreeMap<String, Reason>, now: &str) -> Plan {
    let removed: Vec<Removal> = entry_ids(sv)
        .into_iter()
        .filter_map(|id| {
            remove.get(id).map(|reason| Removal {
                id: id.to_string(),
                reason: reason.clone(),
            })
        })
        .collect();
    if removed.is_empty() {
        return Plan::Nothing;
    }
    let kept: Vec<_> = sv
        .status
        .storage_versions
        .iter()
        .filter(|e| !remove.contains_key(&e.api_server_id))
        .cloned()
        .collect();
    if kept.is_empty() {
        return Plan::Delete { removed };
    }
    let mut object = sv.clone();
    object.status.storage_versions = kept;
    set_common_encoding_version(&mut object, now);
    Plan::Rewrite {
        object: Box::new(object),
        removed,
    }
}

/// `now` as kube-apiserver writes a `metav1.Time`: RFC 3339, whole seconds, UTC.
/// The object with `entries` given back: each whose apiServerID has no entry now is appended
/// (in order), and the common version and condition are recomputed. None when every one has an
/// entry already (its apiserver wrote again meanwhile: its own entry wins).
pub fn restore(
    sv: &StorageVersion,
    entries: &[crate::model::ServerStorageVersion],
    now: &str,
) -> Option<StorageVersion> {
    let mut object = sv.clone();
    let mut added = false;
    for e in entries {
        if !object
            .status
            .storage_versions
            .iter()
            .any(|have| have.api_server_id == e.api_server_id)
        {
            object.status.storage_versions.push(e.clone());
            added = true;
        }
    }
    if !added {
        return None;
    }
    set_common_encoding_version(&mut object, now);
    Some(object)
}

pub fn format_time(now: Timestamp) -> String {
    now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ServerStorageVersion, StorageVersionCondition};

    const NOW: &str = "2026-03-01T12:00:00Z";

    fn entry(id: &str, enc: &str) -> ServerStorageVersion {
        ServerStorageVersion {
            api_server_id: id.into(),
            encoding_version: enc.into(),
            decodable_versions: vec![enc.into()],
            served_versions: vec![],
        }
    }

    fn sv(entries: &[(&str, &str)], common: Option<&str>) -> StorageVersion {
        let mut sv = StorageVersion::default();
        sv.metadata.name = Some("k8s.test.resources".into());
        sv.metadata.resource_version = Some("42".into());
        sv.status.storage_versions = entries.iter().map(|(i, e)| entry(i, e)).collect();
        sv.status.common_encoding_version = common.map(String::from);
        sv
    }

    fn remove(ids: &[&str]) -> BTreeMap<String, Reason> {
        ids.iter()
            .map(|i| (i.to_string(), Reason::LeaseMissing))
            .collect()
    }

    fn ids(sv: &StorageVersion) -> Vec<&str> {
        sv.status
            .storage_versions
            .iter()
            .map(|e| e.api_server_id.as_str())
            .collect()
    }

    #[test]
    fn restore_gives_back_only_what_is_missing() {
        let now_sv = sv(&[("a", "v2")], Some("v2"));
        let back = entry("b", "v1");
        let restored = restore(&now_sv, std::slice::from_ref(&back), NOW).expect("b is missing");
        assert_eq!(ids(&restored), vec!["a", "b"]);
        assert_eq!(restored.status.common_encoding_version, None);
        assert_eq!(cond(&restored).status, "False");
        // b wrote again meanwhile: its own entry wins, nothing to give back.
        let written = sv(&[("a", "v2"), ("b", "v2")], Some("v2"));
        assert!(restore(&written, &[back], NOW).is_none());
    }

    fn cond(sv: &StorageVersion) -> &StorageVersionCondition {
        let c: Vec<_> = sv.status.encoding_conditions().collect();
        assert_eq!(c.len(), 1, "exactly one AllEncodingVersionsEqual condition");
        c[0]
    }

    /// Upstream GC case 1 (docs/upstream.md §5): lease -1 deleted → [-2, -3], common v2, condition True.
    #[test]
    fn upstream_case_1_common_becomes_v2() {
        let s = sv(
            &[
                ("kube-apiserver-1", "v1"),
                ("kube-apiserver-2", "v2"),
                ("kube-apiserver-3", "v2"),
            ],
            Some("v1"),
        );
        let Plan::Rewrite { object, removed } = plan(&s, &remove(&["kube-apiserver-1"]), NOW)
        else {
            panic!("expected a rewrite")
        };
        assert_eq!(removed.len(), 1);
        let ids = ids(&object);
        assert_eq!(ids, ["kube-apiserver-2", "kube-apiserver-3"]);
        assert_eq!(object.status.common_encoding_version.as_deref(), Some("v2"));
        let c = cond(&object);
        assert_eq!(c.status, "True");
        assert_eq!(c.reason, "CommonEncodingVersionSet");
        assert_eq!(c.message, "Common encoding version set");
        assert_eq!(c.last_transition_time.as_deref(), Some(NOW));
        assert_eq!(object.metadata.resource_version.as_deref(), Some("42"));
    }

    /// Upstream GC case 2 (docs/upstream.md §5): the deleted lease is named by no entry → no write at all, even though
    /// the stored common version is inconsistent.
    #[test]
    fn upstream_case_2_nothing_to_remove_means_no_write() {
        let s = sv(
            &[("kube-apiserver-1", "v1"), ("kube-apiserver-3", "v2")],
            Some("v1"),
        );
        assert_eq!(plan(&s, &remove(&["kube-apiserver-2"]), NOW), Plan::Nothing);
        assert_eq!(plan(&s, &BTreeMap::new(), NOW), Plan::Nothing);
    }

    /// Upstream GC case 3 (docs/upstream.md §5): entry -4 without a lease goes; order kept; condition False.
    #[test]
    fn upstream_case_3_invalid_id_removed_in_order() {
        let s = sv(
            &[
                ("kube-apiserver-1", "v1"),
                ("kube-apiserver-2", "v2"),
                ("kube-apiserver-3", "v2"),
                ("kube-apiserver-4", "v2"),
            ],
            Some("v1"),
        );
        let Plan::Rewrite { object, .. } = plan(&s, &remove(&["kube-apiserver-4"]), NOW) else {
            panic!("expected a rewrite")
        };
        let ids = ids(&object);
        assert_eq!(
            ids,
            ["kube-apiserver-1", "kube-apiserver-2", "kube-apiserver-3"]
        );
        assert_eq!(object.status.common_encoding_version, None);
        assert_eq!(cond(&object).status, "False");
        assert_eq!(cond(&object).reason, "CommonEncodingVersionUnset");
    }

    /// Upstream GC case 4 (docs/upstream.md §5): the last entry goes → delete.
    #[test]
    fn upstream_case_4_last_entry_deletes() {
        let s = sv(&[("kube-apiserver-1", "v1")], None);
        let p = plan(&s, &remove(&["kube-apiserver-1"]), NOW);
        assert!(matches!(p, Plan::Delete { ref removed } if removed.len() == 1));
    }

    #[test]
    fn existing_condition_keeps_position_and_time_when_status_unchanged() {
        let mut s = sv(&[("a", "v1"), ("b", "v1"), ("c", "v1")], Some("v1"));
        s.status.conditions = vec![
            StorageVersionCondition {
                type_: "Other".into(),
                status: "True".into(),
                reason: "R".into(),
                message: "M".into(),
                ..Default::default()
            },
            StorageVersionCondition {
                type_: "AllEncodingVersionsEqual".into(),
                status: "True".into(),
                last_transition_time: Some("2020-01-01T00:00:00Z".into()),
                reason: "CommonEncodingVersionSet".into(),
                message: "Common encoding version set".into(),
                ..Default::default()
            },
        ];
        let Plan::Rewrite { object, .. } = plan(&s, &remove(&["b"]), NOW) else {
            panic!("expected a rewrite")
        };
        assert_eq!(object.status.conditions[0].type_, "Other");
        assert_eq!(
            object.status.conditions[1].last_transition_time.as_deref(),
            Some("2020-01-01T00:00:00Z")
        );
    }

    #[test]
    fn duplicate_ids_all_go() {
        let s = sv(&[("a", "v1"), ("b", "v1"), ("a", "v2")], None);
        let Plan::Rewrite { object, removed } = plan(&s, &remove(&["a"]), NOW) else {
            panic!("expected a rewrite")
        };
        assert_eq!(removed.len(), 1);
        assert_eq!(object.status.storage_versions.len(), 1);
        assert_eq!(object.status.common_encoding_version.as_deref(), Some("v1"));
    }

    fn record(label: Option<&str>, renew: Option<&str>, dur: Option<i32>) -> LeaseRecord {
        LeaseRecord {
            name: "x".into(),
            identity_label: label.map(String::from),
            renew_time: renew.map(|r| r.parse().unwrap()),
            lease_duration_seconds: dur,
        }
    }

    #[test]
    fn judging_leases() {
        let now: Timestamp = "2026-03-01T12:00:00Z".parse().unwrap();
        let g = Some(Duration::from_secs(60));
        assert_eq!(
            judge_lease(&LeaseLookup::NotFound, now, g),
            LeaseState::Missing
        );
        assert!(matches!(
            judge_lease(&LeaseLookup::Failed("boom".into()), now, g),
            LeaseState::Unknown(_)
        ));
        assert!(!judge_lease(&LeaseLookup::Failed("boom".into()), now, g).is_gone());
        let unlabelled = record(None, Some("2026-03-01T11:59:59Z"), Some(3600));
        assert_eq!(
            judge_record(&unlabelled, now, None),
            LeaseState::NotApiserver { label: None }
        );
        let other = record(Some("kube-controller-manager"), None, None);
        assert!(judge_record(&other, now, None).is_gone());
        // Expiry ignored without the grace, like upstream.
        let old = record(
            Some("kube-apiserver"),
            Some("2026-03-01T10:00:00Z"),
            Some(3600),
        );
        assert_eq!(judge_record(&old, now, None), LeaseState::Live);
        // Expired at 11:00, grace 60 s → gone.
        assert!(matches!(
            judge_record(&old, now, g),
            LeaseState::ExpiredBeyondGrace {
                expired_at: Some(_)
            }
        ));
        // Expired 30 s ago, grace 60 s → still live.
        let recent = record(
            Some("kube-apiserver"),
            Some("2026-03-01T10:59:30Z"),
            Some(3600),
        );
        assert_eq!(judge_record(&recent, now, g), LeaseState::Live);
        // No renewTime: expired (docs/upstream.md §4.4), only when the grace is on.
        let bare = record(Some("kube-apiserver"), None, None);
        assert_eq!(judge_record(&bare, now, None), LeaseState::Live);
        assert_eq!(
            judge_record(&bare, now, g),
            LeaseState::ExpiredBeyondGrace { expired_at: None }
        );
        assert!(LeaseState::Missing.needs_deletion_grace());
        assert!(!LeaseState::ExpiredBeyondGrace { expired_at: None }.needs_deletion_grace());
    }

    #[test]
    fn reasons_read_well() {
        assert_eq!(
            Reason::LeaseMissing.to_string(),
            "its identity lease does not exist"
        );
        let r = Reason::LeaseNotApiserver {
            label: Some("kube-controller-manager".into()),
        };
        assert!(r.to_string().contains("kube-controller-manager"));
        assert_eq!(r.code(), "lease-not-apiserver");
        assert_eq!(
            format_time("2026-03-01T12:00:00.123456Z".parse().unwrap()),
            NOW
        );
    }
}
