//! Where the CRD migrator records each CRD's last migration across restarts and leaders: one
//! ConfigMap (default `storageversion-webhook-crd`, in the leader Lease's namespace) whose data
//! maps each CRD name (a valid ConfigMap key) to its [`Record`] as JSON. Only the leader writes
//! it, the whole map at once, with server-side apply. A CRD that is gone loses its key at the
//! next write, so the map holds at most one record (a few hundred bytes) per existing CRD.

use std::collections::BTreeMap;

pub use super::decide::Record;
use crate::state_map::StateMap;

/// Field manager of the state ConfigMap writes.
pub const FIELD_MANAGER: &str = "storageversion-webhook-crd";

/// CRD name -> its record.
pub type Memory = BTreeMap<String, Record>;

/// One value as a record; an unreadable value is no record (the CRD starts afresh, which can
/// only begin a migration after the settle time, never prune).
pub fn parse(value: &str) -> Option<Record> {
    serde_json::from_str(value).ok()
}

pub fn data(memory: &Memory) -> BTreeMap<String, String> {
    memory
        .iter()
        .filter_map(|(k, r)| Some((k.clone(), serde_json::to_string(r).ok()?)))
        .collect()
}

const DESCRIPTION: &str =
    "CustomResourceDefinition name -> the last migration serve --crd-migrate began for it (docs/crd.md)";

/// The state ConfigMap `namespace/name`.
pub fn map<'a>(namespace: &'a str, name: &'a str) -> StateMap<'a> {
    StateMap::new(namespace, name, FIELD_MANAGER, DESCRIPTION)
}

/// Reads the memory; a missing ConfigMap is an empty memory.
pub async fn load(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<Memory> {
    let data = map(namespace, name).load(client).await?;
    Ok(data
        .into_iter()
        .filter_map(|(k, v)| Some((k, parse(&v)?)))
        .collect())
}

/// The state ConfigMap `namespace/name` as a store fed by a watch of that one object, for the
/// CRD guard on every replica, and the watch to run (it retries with backoff and never ends
/// on its own; the text says why if it does). Until its first list the store is empty: the
/// guard then knows of no migration, and denies nothing.
pub fn watch(
    client: kube::Client,
    namespace: &str,
    name: &str,
) -> (
    kube::runtime::reflector::Store<k8s_openapi::api::core::v1::ConfigMap>,
    impl std::future::Future<Output = String> + Send + 'static,
) {
    use futures::StreamExt;
    use kube::runtime::{reflector, watcher, WatchStreamExt};

    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client, namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let (store, writer) = reflector::store();
    let what = format!("{namespace}/{name}");
    let run = async move {
        let events = watcher(api, config).default_backoff().reflect(writer);
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            if let Err(e) = event {
                tracing::warn!(configmap = %what, error = %e, "cannot watch the CRD migrator's state (the CRD guard denies nothing until it can)");
            }
        }
        format!("the watch of ConfigMap {what} ended")
    };
    (store, run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::decide::{Method, Snapshot};

    #[test]
    fn records_round_trip_and_garbage_is_no_record() {
        let crd = Snapshot {
            name: "widgets.example.com".into(),
            uid: "u".into(),
            generation: 2,
            storage: Some("v1".into()),
            stored: vec!["v1beta1".into(), "v1".into()],
            ..Snapshot::default()
        };
        let r = Record::begin(&crd, "m", 1, Method::Rewrite).expect("storage");
        let memory: Memory = [(crd.name.clone(), r.clone())].into_iter().collect();
        let d = data(&memory);
        assert_eq!(parse(&d["widgets.example.com"]), Some(r));
        assert_eq!(parse("v1"), None);
        assert_eq!(parse("{\"uid\": 3}"), None);
    }
}
