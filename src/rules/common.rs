//! Recomputing `commonEncodingVersion` and the `AllEncodingVersionsEqual` condition exactly as
//! upstream's `SetCommonEncodingVersion` (docs/upstream.md §3.3), and the updater's local update. Used by the
//! garbage collector when it rewrites an object, and by the rules for the common-version check.

use crate::model::{
    ServerStorageVersion, StorageVersion, StorageVersionCondition, ALL_ENCODING_VERSIONS_EQUAL,
};

/// Condition reason when every entry has the same encoding version.
pub const REASON_SET: &str = "CommonEncodingVersionSet";
/// Condition reason when the entries disagree (or there are none).
pub const REASON_UNSET: &str = "CommonEncodingVersionUnset";
/// Condition message when every entry has the same encoding version.
pub const MESSAGE_SET: &str = "Common encoding version set";
/// Condition message when the entries disagree (or there are none).
pub const MESSAGE_UNSET: &str = "Common encoding version unset";

/// The encoding version every entry agrees on: none for an empty list, otherwise the first
/// entry's version if every entry's is byte-equal to it. Entry validity does not matter.
pub fn actual_common_encoding_version(entries: &[ServerStorageVersion]) -> Option<&str> {
    let first = &entries.first()?.encoding_version;
    entries
        .iter()
        .all(|e| e.encoding_version == *first)
        .then_some(first.as_str())
}

/// Upstream's `SetCommonEncodingVersion`: recompute `commonEncodingVersion`, then upsert the
/// `AllEncodingVersionsEqual` condition (first one of that type, in place). Its
/// `lastTransitionTime` becomes `now` (RFC 3339 text) when the condition is new, when its status
/// changes, or when the common version changes from one set value to another.
pub fn set_common_encoding_version(sv: &mut StorageVersion, now: &str) {
    let old_common = sv.status.common_encoding_version.take();
    let new_common = actual_common_encoding_version(&sv.status.storage_versions).map(str::to_owned);
    let (status, reason, message) = if new_common.is_some() {
        ("True", REASON_SET, MESSAGE_SET)
    } else {
        ("False", REASON_UNSET, MESSAGE_UNSET)
    };
    let force_transition = matches!((&old_common, &new_common), (Some(a), Some(b)) if a != b);
    let observed_generation = sv.metadata.generation.unwrap_or(0);
    sv.status.common_encoding_version = new_common;

    let conditions = &mut sv.status.conditions;
    match conditions
        .iter_mut()
        .find(|c| c.type_ == ALL_ENCODING_VERSIONS_EQUAL)
    {
        Some(existing) => {
            if existing.status != status || force_transition {
                existing.status = status.to_string();
                existing.last_transition_time = Some(now.to_string());
            }
            existing.reason = reason.to_string();
            existing.message = message.to_string();
            existing.observed_generation = observed_generation;
        }
        None => conditions.push(StorageVersionCondition {
            type_: ALL_ENCODING_VERSIONS_EQUAL.to_string(),
            status: status.to_string(),
            observed_generation,
            last_transition_time: Some(now.to_string()),
            reason: reason.to_string(),
            message: message.to_string(),
        }),
    }
}

/// Upstream's `localUpdate`: replace the first entry with the same apiServerID in place (or
/// append), then [`set_common_encoding_version`].
pub fn local_update(sv: &mut StorageVersion, entry: ServerStorageVersion, now: &str) {
    let entries = &mut sv.status.storage_versions;
    match entries
        .iter_mut()
        .find(|e| e.api_server_id == entry.api_server_id)
    {
        Some(existing) => *existing = entry,
        None => entries.push(entry),
    }
    set_common_encoding_version(sv, now);
}

#[cfg(test)]
mod tests {
    //! The updater tests of docs/upstream.md §3.3 (`TestLocalUpdateStorageVersion`,
    //! `TestSetCommonEncodingVersion`).

    use super::*;

    const BEFORE: &str = "2020-01-01T00:00:00Z";
    const NOW: &str = "2026-01-01T00:00:00Z";

    fn ssv(id: &str, enc: &str, decodable: &[&str], served: &[&str]) -> ServerStorageVersion {
        ServerStorageVersion {
            api_server_id: id.into(),
            encoding_version: enc.into(),
            decodable_versions: decodable.iter().map(|s| s.to_string()).collect(),
            served_versions: served.iter().map(|s| s.to_string()).collect(),
        }
    }
    fn ssv1() -> ServerStorageVersion {
        ssv("1", "v1", &["v1", "v2"], &["v1"])
    }
    fn ssv2() -> ServerStorageVersion {
        ssv("2", "v1", &["v1", "v2"], &["v1", "v2"])
    }
    fn ssv3() -> ServerStorageVersion {
        ssv("3", "v2", &["v1", "v2"], &["v1", "v2"])
    }
    fn ssv4() -> ServerStorageVersion {
        ssv("4", "v1", &["v1", "v2", "v4"], &["v1", "v2"])
    }
    fn ssv5() -> ServerStorageVersion {
        ssv("5", "v2", &["v1", "v2", "v4"], &["v1", "v2"])
    }

    fn cond(set: bool) -> StorageVersionCondition {
        StorageVersionCondition {
            type_: ALL_ENCODING_VERSIONS_EQUAL.into(),
            status: if set { "True" } else { "False" }.into(),
            observed_generation: 0,
            last_transition_time: Some(BEFORE.into()),
            reason: if set { REASON_SET } else { REASON_UNSET }.into(),
            message: if set { MESSAGE_SET } else { MESSAGE_UNSET }.into(),
        }
    }

    fn sv(
        entries: Vec<ServerStorageVersion>,
        common: Option<&str>,
        conditions: Vec<StorageVersionCondition>,
    ) -> StorageVersion {
        let mut sv = StorageVersion::default();
        sv.metadata.name = Some("core.pods".into());
        sv.status.storage_versions = entries;
        sv.status.common_encoding_version = common.map(str::to_owned);
        sv.status.conditions = conditions;
        sv
    }

    /// Asserts the single condition is the True/False one and whether its LTT moved to NOW.
    /// (`case` names the case in a failure.)
    #[track_caller]
    fn assert_condition(sv: &StorageVersion, set: bool, ltt_set: bool, case: &str) {
        assert_eq!(
            sv.status.conditions.len(),
            1,
            "{case}: {:?}",
            sv.status.conditions
        );
        let c = &sv.status.conditions[0];
        let mut want = cond(set);
        want.last_transition_time = Some(if ltt_set { NOW } else { BEFORE }.into());
        assert_eq!(*c, want, "{case}");
    }

    /// Upstream's localUpdate cases: what is stored (entries, common version, the condition's
    /// status if any), the entry written, then the entries and common version after, and the
    /// condition after (True?, moved to NOW?).
    #[test]
    fn local_update_cases() {
        type Case = (
            &'static str,
            Vec<ServerStorageVersion>,
            Option<&'static str>,
            Option<bool>,
            ServerStorageVersion,
            Vec<ServerStorageVersion>,
            Option<&'static str>,
            (bool, bool),
        );
        #[rustfmt::skip]
        let cases: [Case; 4] = [
            ("into an empty object", vec![], None, None,
                ssv1(), vec![ssv1()], Some("v1"), (true, true)),
            ("adding a different version unsets common", vec![ssv1(), ssv2()], Some("v1"), Some(true),
                ssv3(), vec![ssv1(), ssv2(), ssv3()], None, (false, true)),
            ("adding the same version keeps the transition time", vec![ssv1(), ssv2()], Some("v1"), Some(true),
                ssv4(), vec![ssv1(), ssv2(), ssv4()], Some("v1"), (true, false)),
            ("while disagreeing keeps the transition time", vec![ssv1(), ssv2(), ssv3()], None, Some(false),
                ssv4(), vec![ssv1(), ssv2(), ssv3(), ssv4()], None, (false, false)),
        ];
        for (case, stored, common, condition, added, entries, common_after, (set, moved)) in cases {
            let mut s = sv(stored, common, condition.map(cond).into_iter().collect());
            local_update(&mut s, added, NOW);
            assert_eq!(s.status.storage_versions, entries, "{case}");
            assert_eq!(
                s.status.common_encoding_version.as_deref(),
                common_after,
                "{case}"
            );
            assert_condition(&s, set, moved, case);
        }
    }

    #[test]
    fn local_update_replaces_the_first_entry_with_the_id_in_place() {
        let mut s = sv(vec![ssv1(), ssv3(), ssv1()], None, vec![cond(false)]);
        let replacement = ssv("1", "v2", &["v2"], &[]);
        local_update(&mut s, replacement.clone(), NOW);
        assert_eq!(s.status.storage_versions, vec![replacement, ssv3(), ssv1()]);
        assert_eq!(s.status.common_encoding_version, None);
    }

    /// Upstream's setCommonEncodingVersion cases: the entries, the stored common version and
    /// condition (its status, if any), then the common version after, the condition after (True?,
    /// moved to NOW?), and whether the object is unchanged. The entries never change.
    #[test]
    fn set_common_cases() {
        let disagree = || vec![ssv1(), ssv2(), ssv3()];
        let agree = || vec![ssv1(), ssv2()];
        type Case = (
            &'static str,
            Vec<ServerStorageVersion>,
            Option<&'static str>,
            Option<bool>,
            Option<&'static str>,
            (bool, bool),
            bool,
        );
        let cases: [Case; 7] = [
            (
                "no common, init",
                disagree(),
                None,
                None,
                None,
                (false, true),
                false,
            ),
            (
                "no common, transition",
                disagree(),
                Some("v1"),
                Some(true),
                None,
                (false, true),
                false,
            ),
            (
                "no common, no transition",
                disagree(),
                None,
                Some(false),
                None,
                (false, false),
                true,
            ),
            (
                "common, init",
                agree(),
                None,
                None,
                Some("v1"),
                (true, true),
                false,
            ),
            (
                "common, no transition",
                agree(),
                Some("v1"),
                Some(true),
                Some("v1"),
                (true, false),
                true,
            ),
            (
                "common, transition",
                agree(),
                None,
                Some(false),
                Some("v1"),
                (true, true),
                false,
            ),
            (
                "a changed version forces a transition",
                vec![ssv3(), ssv5()],
                Some("v1"),
                Some(true),
                Some("v2"),
                (true, true),
                false,
            ),
        ];
        for (case, entries, common, condition, common_after, (set, moved), unchanged) in cases {
            let mut s = sv(
                entries.clone(),
                common,
                condition.map(cond).into_iter().collect(),
            );
            let before = s.clone();
            set_common_encoding_version(&mut s, NOW);
            assert_eq!(
                s.status.common_encoding_version.as_deref(),
                common_after,
                "{case}"
            );
            assert_condition(&s, set, moved, case);
            assert_eq!(s.status.storage_versions, entries, "{case}");
            if unchanged {
                assert_eq!(s, before, "{case}");
            }
        }
    }

    #[test]
    fn set_common_on_empty_list_is_false_and_keeps_other_conditions_in_place() {
        let other = StorageVersionCondition {
            type_: "Other".into(),
            status: "True".into(),
            reason: "R".into(),
            message: "M".into(),
            ..Default::default()
        };
        let mut s = sv(
            vec![],
            Some("v1"),
            vec![other.clone(), cond(true), cond(true)],
        );
        s.metadata.generation = Some(7);
        set_common_encoding_version(&mut s, NOW);
        assert_eq!(s.status.common_encoding_version, None);
        assert_eq!(s.status.conditions.len(), 3);
        assert_eq!(s.status.conditions[0], other);
        let c = &s.status.conditions[1];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", REASON_UNSET, MESSAGE_UNSET)
        );
        assert_eq!(c.observed_generation, 7);
        assert_eq!(c.last_transition_time.as_deref(), Some(NOW));
        // Only the first condition of the type is updated, as upstream.
        assert_eq!(s.status.conditions[2], cond(true));
    }

    #[test]
    fn actual_common_version() {
        assert_eq!(actual_common_encoding_version(&[]), None);
        assert_eq!(
            actual_common_encoding_version(&[ssv1(), ssv2()]),
            Some("v1")
        );
        assert_eq!(actual_common_encoding_version(&[ssv1(), ssv3()]), None);
        let empty = ssv("x", "", &[], &[]);
        assert_eq!(
            actual_common_encoding_version(&[empty.clone(), empty]),
            Some("")
        );
    }
}
