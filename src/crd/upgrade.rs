//! What applying a CRD leaves in `status.storedVersions` (`check crd.yaml`, offline), by the
//! rules kube-apiserver keeps: a new CRD's storedVersions is `[storage version]`; an update
//! appends the new storage version when it is not listed yet and removes nothing; and the
//! update is rejected when a listed version is not in the new `spec.versions` (with
//! kube-apiserver 1.37's message; older minors word it `must appear in spec.versions`). Pure.

use serde::Serialize;

use super::types::Crd;

/// What an apply of one CRD comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// storedVersions is (or stays) just the storage version.
    UpToDate,
    /// storedVersions lists another version after it: its objects need a migration before
    /// that version can leave `spec.versions`.
    NeedsMigration,
    /// kube-apiserver rejects the apply.
    Rejected,
    /// The CRD as it is in the cluster is not known (no `--current`, no status in the file):
    /// what it leaves depends on it.
    Unknown,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::UpToDate => "up-to-date",
            Outcome::NeedsMigration => "needs-migration",
            Outcome::Rejected => "rejected",
            Outcome::Unknown => "unknown",
        }
    }
}

/// The verdict on applying one CRD.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub name: String,
    pub outcome: Outcome,
    /// Its storage version (None: not exactly one `storage: true`).
    pub storage_version: Option<String>,
    /// storedVersions in the cluster before the apply, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_versions_before: Option<Vec<String>>,
    /// storedVersions after the apply (None: rejected, or not known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_versions_after: Option<Vec<String>>,
    /// What it means and what to do, one line each.
    pub messages: Vec<String>,
}

/// The verdict on applying `new` over a CRD whose storedVersions is `before` (None: not known;
/// `Some(&[])`: the CRD does not exist yet).
pub fn judge(new: &Crd, before: Option<&[String]>) -> Verdict {
    let name = new.name().to_string();
    let storage = new.storage_version().map(str::to_string);
    let verdict = |outcome, after: Option<Vec<String>>, messages: Vec<String>| Verdict {
        name: name.clone(),
        outcome,
        storage_version: storage.clone(),
        stored_versions_before: before.map(<[String]>::to_vec),
        stored_versions_after: after,
        messages,
    };
    let Some(storage) = storage.clone() else {
        return verdict(
            Outcome::Rejected,
            None,
            vec!["spec.versions: Invalid value: must have exactly one version marked as storage version".to_string()],
        );
    };
    let Some(before) = before else {
        return verdict(
            Outcome::Unknown,
            None,
            vec![
                format!("created, its storedVersions is [{storage}]; applied over an existing CRD, it is that CRD's storedVersions plus {storage}, and the apply is rejected if one of those is not in spec.versions"),
                format!("to know which: add --current with the CRD as it is now (kubectl get crd {name} -o yaml)"),
            ],
        );
    };
    let in_spec = |v: &str| new.spec.versions.iter().any(|s| s.name == v);
    let missing: Vec<String> = before
        .iter()
        .enumerate()
        .filter(|(_, v)| !in_spec(v))
        .map(|(i, v)| {
            format!(
                "status.storedVersions[{i}]: Invalid value: {v:?}: missing from spec.versions; {v} was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in {v} and removes {v} from status.storedVersions"
            )
        })
        .collect();
    if !missing.is_empty() {
        let dropped: Vec<&str> = before
            .iter()
            .map(String::as_str)
            .filter(|v| !in_spec(v))
            .collect();
        let mut messages = missing;
        messages.push(format!(
            "objects may still be stored in {}: first apply a CRD that keeps {} in spec.versions with {storage} as the storage version; serve --crd-migrate then migrates the objects and sets storedVersions to [{storage}] (after --crd-migrate-settle), and this apply goes through",
            dropped.join(", "),
            if dropped.len() == 1 { "it" } else { "them" }
        ));
        return verdict(Outcome::Rejected, None, messages);
    }
    let mut after = before.to_vec();
    if !after.contains(&storage) {
        after.push(storage.clone());
    }
    let others: Vec<&str> = after
        .iter()
        .map(String::as_str)
        .filter(|v| *v != storage)
        .collect();
    if others.is_empty() {
        return verdict(
            Outcome::UpToDate,
            Some(after),
            vec![format!("storedVersions is [{storage}]: nothing to migrate")],
        );
    }
    let others = others.join(", ");
    verdict(
        Outcome::NeedsMigration,
        Some(after.clone()),
        vec![
            format!("storedVersions becomes [{}]: objects may be stored in {others} until they are migrated, and {others} cannot leave spec.versions until then", after.join(", ")),
            format!("serve --crd-migrate (on by default in the chart) migrates them and sets storedVersions to [{storage}] once the CRD has held still for --crd-migrate-settle; audit shows where it stands"),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(versions: &[(&str, bool)]) -> Crd {
        let versions: Vec<serde_json::Value> = versions
            .iter()
            .map(|(n, storage)| serde_json::json!({"name": n, "served": true, "storage": storage}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "versions": versions},
        }))
        .unwrap_or_default()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn what_an_apply_leaves_in_stored_versions() {
        let flip = crd(&[("v1beta1", false), ("v1", true)]);
        // Created: just the storage version.
        let v = judge(&flip, Some(&[]));
        assert_eq!(v.outcome, Outcome::UpToDate);
        assert_eq!(v.stored_versions_after, Some(s(&["v1"])));
        // The storage flip over a CRD stored in v1beta1: both listed, a migration needed.
        let v = judge(&flip, Some(&s(&["v1beta1"])));
        assert_eq!(v.outcome, Outcome::NeedsMigration);
        assert_eq!(v.stored_versions_after, Some(s(&["v1beta1", "v1"])));
        assert!(
            v.messages[0].contains("v1beta1 cannot leave"),
            "{:?}",
            v.messages
        );
        // Already migrated and pruned.
        assert_eq!(judge(&flip, Some(&s(&["v1"]))).outcome, Outcome::UpToDate);
        // Dropping v1beta1 while it is stored: kube-apiserver's own message, and the way out.
        let dropped = crd(&[("v1", true)]);
        let v = judge(&dropped, Some(&s(&["v1beta1", "v1"])));
        assert_eq!(v.outcome, Outcome::Rejected);
        assert_eq!(v.stored_versions_after, None);
        assert!(
            v.messages[0].starts_with(
                r#"status.storedVersions[0]: Invalid value: "v1beta1": missing from spec.versions; v1beta1 was previously a storage version"#
            ),
            "{:?}",
            v.messages
        );
        assert!(
            v.messages[1].contains("keeps it in spec.versions"),
            "{:?}",
            v.messages
        );
        // After the prune the same drop goes through.
        assert_eq!(
            judge(&dropped, Some(&s(&["v1"]))).outcome,
            Outcome::UpToDate
        );
        // Not known: says what either case gives and how to know.
        let v = judge(&flip, None);
        assert_eq!(v.outcome, Outcome::Unknown);
        assert!(v.messages[1].contains("--current"), "{:?}", v.messages);
        // No single storage version.
        let none = crd(&[("v1", false), ("v2", false)]);
        assert_eq!(judge(&none, Some(&[])).outcome, Outcome::Rejected);
        let two = crd(&[("v1", true), ("v2", true)]);
        assert_eq!(judge(&two, None).outcome, Outcome::Rejected);
    }
}
