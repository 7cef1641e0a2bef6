//! Ratcheting (design §3): what a write leaves unchanged is never the reason for a denial.
//!
//! A violation in the new object is only a warning when
//! (a) it lies inside an entry that the stored object already has, unchanged (same apiServerID,
//!     same versions; the set-typed version lists compared regardless of order), or
//! (b) the stored object already had a violation with the same code, at the same place and with
//!     the same offending value: the same path for violations outside entries; the same
//!     apiServerID and the same path inside the entry for violations inside one, so reordering
//!     entries changes nothing. Changing an already bad value into another bad value is a new
//!     violation. Each old violation excuses one new one, so adding a further repeat of an
//!     already repeated apiServerID denies.
//!
//! The work is bounded whatever the objects hold: the stored entries are indexed by apiServerID
//! once, and whether an entry is unchanged is decided once per entry, not once per violation.
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

/// Where a violation is, independent of entry order, and what the offending value is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Place {
    code: Code,
    entry_id: Option<String>,
    path: String,
    value: Option<String>,
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
            value: v.value.clone(),
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
    /// The stored object's entries by apiServerID; computed on first need.
    old_entries: Option<HashMap<&'a str, Vec<&'a ServerStorageVersion>>>,
    /// Whether entry `i` of the new object is unchanged, decided at most once per entry.
    unchanged: HashMap<usize, bool>,
}

impl<'a> Ratchet<'a> {
    pub fn new(new: &'a StorageVersion, old: Option<&'a StorageVersion>) -> Self {
        Ratchet {
            new,
            old,
            old_places: None,
            old_entries: None,
            unchanged: HashMap::new(),
        }
    }

    /// True when entry `i` of the new object is in the stored object unchanged (same as
    /// [`entry_unchanged`], with the stored entries indexed and the answer remembered).
    pub fn entry_unchanged_at(&mut self, i: usize) -> bool {
        let Some(old) = self.old else {
            return false;
        };
        let Some(entry) = self.new.status.storage_versions.get(i) else {
            return false;
        };
        if let Some(known) = self.unchanged.get(&i) {
            return *known;
        }
        let index = self.old_entries.get_or_insert_with(|| {
            let mut index: HashMap<&str, Vec<&ServerStorageVersion>> = HashMap::new();
            for o in &old.status.storage_versions {
                index.entry(o.api_server_id.as_str()).or_default().push(o);
            }
            index
        });
        let unchanged = index
            .get(entry.api_server_id.as_str())
            .is_some_and(|olds| olds.iter().any(|o| same_entry(o, entry)));
        self.unchanged.insert(i, unchanged);
        unchanged
    }

    /// `Some(note)` when `v` (a violation of the new object) is excused by the stored object.
    pub fn excuse(&mut self, v: &Violation) -> Option<&'static str> {
        let old = self.old?;
        if v.entry_id.is_some() && v.code != Code::ApiServerIdDuplicate {
            if entry_index(&v.path).is_some_and(|i| self.entry_unchanged_at(i)) {
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
