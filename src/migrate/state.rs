//! Where what the trigger knows about each resource is remembered across restarts and leaders:
//! one ConfigMap (default `storageversion-webhook-migrate`, in the leader Lease's namespace) whose
//! data maps each StorageVersion name to its [`Record`] as JSON. StorageVersion names are valid
//! ConfigMap keys (`<group>.<resource>`). A value that is not JSON is the format of earlier
//! releases, the bare version last agreed on, and reads as a record of just that.
//!
//! Only the leader writes it, with server-side apply (field manager
//! `storageversion-webhook-migrate`, forced): no read-modify-write race with itself, and the
//! whole map is written at once.

use std::collections::BTreeMap;

pub use super::decide::Record;
use crate::state_map::StateMap;

/// Field manager of the state ConfigMap writes.
pub const FIELD_MANAGER: &str = "storageversion-webhook-migrate";

/// StorageVersion name -> what is remembered about it.
pub type Memory = BTreeMap<String, Record>;

/// One ConfigMap value as a record: JSON, or an earlier release's bare version.
pub fn parse(value: &str) -> Record {
    if value.trim_start().starts_with('{') {
        if let Ok(r) = serde_json::from_str(value) {
            return r;
        }
    }
    let v = value.trim();
    if v.is_empty() || v.starts_with('{') {
        // Unreadable: remember nothing, so the next observation starts afresh.
        return Record::default();
    }
    Record {
        agreed: Some(v.to_string()),
        written: [v.to_string()].into_iter().collect(),
        ..Record::default()
    }
}

/// The ConfigMap's data for a memory.
pub fn data(memory: &Memory) -> BTreeMap<String, String> {
    memory
        .iter()
        .map(|(k, r)| (k.clone(), serde_json::to_string(r).unwrap_or_default()))
        .collect()
}

pub use crate::state_map::STATE_LABEL;

const DESCRIPTION: &str =
    "StorageVersion name -> what serve --migrate knows of it: the version all \
     apiservers last agreed on, the versions written since the last migration began, and that \
     migration";

/// The state ConfigMap `namespace/name`.
pub fn map<'a>(namespace: &'a str, name: &'a str) -> StateMap<'a> {
    StateMap::new(namespace, name, FIELD_MANAGER, DESCRIPTION)
}

/// Reads the memory; a missing ConfigMap is an empty memory. Errors name the ConfigMap.
pub async fn load(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<Memory> {
    let data = map(namespace, name).load(client).await?;
    Ok(data.into_iter().map(|(k, v)| (k, parse(&v))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_of_earlier_releases_and_of_this_one() {
        let old = parse("g/v1beta1");
        assert_eq!(old.agreed.as_deref(), Some("g/v1beta1"));
        assert!(old.written.contains("g/v1beta1") && !old.needs_migration_to("g/v1beta1"));
        assert!(old.needs_migration_to("g/v1"));
        let memory: Memory = [("g.things".to_string(), old.clone())]
            .into_iter()
            .collect();
        let text = data(&memory);
        assert_eq!(parse(&text["g.things"]), old);
        assert_eq!(parse("{not json"), Record::default());
        assert_eq!(parse(""), Record::default());
    }
}
