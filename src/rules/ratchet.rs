//! Ratcheting (docs/design.md §3): what a write leaves unchanged is never the reason for a denial.
//!
//! A violation in the new object is only a warning when
//! (a) it lies inside an entry that the stored object already has, unchanged (same apiServerID,
//!     same versions; the set-typed version lists compared regardless of order), or
//! (b) the stored object already had a violation with the same code at the same place: the same
//!     path for violations outside entries; the same apiServerID and the same path inside the
//!     entry for violations inside one, so reordering entries changes nothing. Each old violation
//!     excuses one new one, so adding a further repeat of an already repeated apiServerID denies.
//!
//! The duplicate-apiServerID violation is about the list, not about the entry it points at, so
//! only (b) applies to it.

use std::collections::HashMap;

use super::{violations, Code, Violation};
use crate::model::{ServerStorageVersion, StorageVersion};

/// The note on findings that are warnings because the write did not cause them.
pub const UNCHANGED_NOTE: &str = "unchanged from the stored object";

const ENTRY_PATH_PREFIX: &str = "status.storageVersions[";

/// Same items, same number of times each, in any order.
fn same_items(a: &[String], b: &[String]) -> bool {
    if a == b {
        return true;
    }
    if a.len() != b.len() {
        return false;
    }
    if a.len() > 16 {
        let mut a: Vec<&String> = a.iter().collect();
        let mut b: Vec<&String> = b.iter().collect();
        a.sort_unstable();
        b.sort_unstable();
        return a == b;
    }
    a.iter()
        .all(|x| a.iter().filter(|y| *y == x).count() == b.iter().filter(|y| *y == x).count())
}

/// Two entries say the same thing (the version lists are sets, so their order does not count;
/// kube-apiserver builds `servedVersions` from a Go map, in no fixed order).
pub fn same_entry(a: &ServerStorageVersion, b: &ServerStorageVersion) -> bool {
    a.api_server_id == b.api_server_id
        && a.encoding_version == b.encoding_version
        && same_items(&a.decodable_versions, &b.decodable_versions)
        && same_items(&a.served_versions, &b.served_versions)
}

/// True when `old` has an entry with the same apiServerID that says the same as `entry`.
pub fn entry_unchanged(entry: &ServerStorageVersion, old: Option<&StorageVersion>) -> bool {
    old.is_some_and(|old| {
        old.status
            .storage_versions
            .iter()
            .any(|o| same_entry(o, entry))
    })
}

/// The entry index of a path inside `status.storageVersions[i]`.
pub fn entry_index(path: &str) -> Option<usize> {
    let rest = path.strip_prefix(ENTRY_PATH_PREFIX)?;
    rest[..rest.find(']')?].parse().ok()
}

/// The part of a path after `status.storageVersions[i]`, or the whole path outside entries.
pub fn place_in_entry(path: &str) -> &str {
    path.strip_prefix(ENTRY_PATH_PREFIX)
        .and_then(|rest| rest.find(']').map(|end| &rest[end + 1..]))
        .unwrap_or(path)
}

/// Where a violation is, independent of entry order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Place {
    code: Code,
    entry_id: Option<String>,
    path: String,
}

impl Place {
    fn of(v: &Violation) -> Place {
        let path = if v.entry_id.is_some() {
            place_in_entry(&v.path)
        } else {
            &v.path
        };
        Place {
            code: v.code,
            entry_id: v.entry_id.clone(),
            path: path.to_string(),
        }
    }
}

/// Decides, violation by violation, whether the stored object excuses it.
pub struct Ratchet<'a> {
    new: &'a StorageVersion,
    old: Option<&'a StorageVersion>,
    /// How many violations of the stored object at each place are still unused; computed on
    /// first need.
    old_places: Option<HashMap<Place, usize>>,
}

impl<'a> Ratchet<'a> {
    pub fn new(new: &'a StorageVersion, old: Option<&'a StorageVersion>) -> Self {
        Ratchet {
            new,
            old,
            old_places: None,
        }
    }

    /// `Some(note)` when `v` (a violation of the new object) is excused by the stored object.
    pub fn excuse(&mut self, v: &Violation) -> Option<&'static str> {
        let old = self.old?;
        if v.entry_id.is_some() && v.code != Code::ApiServerIdDuplicate {
            let entry = entry_index(&v.path).and_then(|i| self.new.status.storage_versions.get(i));
            if entry.is_some_and(|e| entry_unchanged(e, Some(old))) {
                return Some(UNCHANGED_NOTE);
            }
        }
        let places = self.old_places.get_or_insert_with(|| {
            let mut places = HashMap::new();
            for o in violations(old) {
                *places.entry(Place::of(&o)).or_insert(0usize) += 1;
            }
            places
        });
        match places.get_mut(&Place::of(v)) {
            Some(left) if *left > 0 => {
                *left -= 1;
                Some(UNCHANGED_NOTE)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_inside_entries() {
        let p = "status.storageVersions[12].decodableVersions[3]";
        assert_eq!(entry_index(p), Some(12));
        assert_eq!(place_in_entry(p), ".decodableVersions[3]");
        assert_eq!(entry_index("metadata.name"), None);
        assert_eq!(place_in_entry("metadata.name"), "metadata.name");
    }

    #[test]
    fn set_lists_compare_without_order() {
        let l = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(same_items(&l(&["a", "b"]), &l(&["b", "a"])));
        assert!(!same_items(&l(&["a", "a", "b"]), &l(&["a", "b", "b"])));
        assert!(!same_items(&l(&["a"]), &l(&["a", "a"])));
    }
}
