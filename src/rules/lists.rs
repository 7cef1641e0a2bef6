//! Finding repeated and missing items in string lists without allocating for small lists and
//! without quadratic work for big ones (an AdmissionReview may carry megabytes of list items).

use std::collections::{HashMap, HashSet};

/// Lists up to this long are scanned pairwise; longer ones are indexed with a hash map.
const SCAN_LIMIT: usize = 16;

/// For every item that already occurred earlier in `items`, the pair (its index, the index of the
/// most recent earlier occurrence), in index order. Empty (and not allocated) when nothing repeats.
pub fn repeats<'a, T>(items: &'a [T], key: impl Fn(&'a T) -> &'a str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    if items.len() <= SCAN_LIMIT {
        for (i, item) in items.iter().enumerate() {
            let k = key(item);
            if let Some(prev) = items[..i].iter().rposition(|other| key(other) == k) {
                out.push((i, prev));
            }
        }
    } else {
        let mut seen: HashMap<&str, usize> = HashMap::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if let Some(prev) = seen.insert(key(item), i) {
                out.push((i, prev));
            }
        }
    }
    out
}

/// Membership tests against a list, scanning small lists and hashing big ones.
pub struct Members<'a> {
    items: &'a [String],
    index: Option<HashSet<&'a str>>,
}

impl<'a> Members<'a> {
    /// Prepares for `lookups` membership tests against `items`.
    pub fn new(items: &'a [String], lookups: usize) -> Self {
        let index = (items.len() > SCAN_LIMIT && lookups > 1)
            .then(|| items.iter().map(String::as_str).collect());
        Members { items, index }
    }

    pub fn contains(&self, item: &str) -> bool {
        match &self.index {
            Some(index) => index.contains(item),
            None => self.items.iter().any(|i| i == item),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn repeats_point_at_most_recent_earlier_index() {
        let l = strings(&["a", "b", "a", "a", "c", "b"]);
        assert_eq!(repeats(&l, |s| s), vec![(2, 0), (3, 2), (5, 1)]);
        assert!(repeats(&strings(&["a", "b"]), |s| s).is_empty());
    }

    #[test]
    fn big_lists_give_the_same_answer() {
        let mut l: Vec<String> = (0..40).map(|i| format!("v{i}")).collect();
        l.push("v3".into());
        l.push("v3".into());
        l.push("v39".into());
        assert_eq!(repeats(&l, |s| s), vec![(40, 3), (41, 40), (42, 39)]);
        let m = Members::new(&l, 5);
        assert!(m.contains("v7"));
        assert!(!m.contains("v77"));
        let small = strings(&["x"]);
        let m = Members::new(&small, 5);
        assert!(m.contains("x"));
        assert!(!m.contains("y"));
    }
}
