//! The journal: the entries a batch is about to remove, written down before its first write,
//! so that a term that ends between the writes and the give-back does not lose them.
//!
//! Invariant I1 (docs/gc.md), across terms. The give-back (`give_back.rs`) closes the one gap
//! of a batch (an apiserver that came back and rewrote its unchanged entry just before the
//! write) only if it runs. The term can end first: a partition, a renewal not confirmed in time,
//! a shutdown. Then no one else knows what was removed. So the leader writes the batch's planned
//! removals to one ConfigMap (`<leader Lease name>-journal`, in the leader Lease's namespace)
//! before it sends the first write, and clears it once the give-back check is done. Every term
//! reads the journal before its first pass and runs the give-back check on what it finds, then
//! clears it. A batch does not start if its journal could not be written.
//!
//! What a record costs: the entries it names are bounded by the batch (each one an entry of a
//! stored object); a batch whose record would pass [`MAX_RECORD_BYTES`] is cut into smaller
//! batches (`write.rs`), so the ConfigMap stays well below its 1 MiB limit.
//!
//! Invariant I3: every read and write here is a call of the term, raced against its token.
//!
//! Invariant I6 (API calls): one GET per term; per batch with removals two PATCHes (the record,
//! the clear).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};

use super::{backoff, is_status, Term};
use crate::model::ServerStorageVersion;

/// Field manager of the journal's writes.
pub const FIELD_MANAGER: &str = "storageversion-webhook-gc";
/// The ConfigMap key holding the record.
const KEY: &str = "removals";
/// The largest record one batch writes (its JSON); a larger batch is cut.
pub const MAX_RECORD_BYTES: usize = 256 * 1024;

/// The name of the journal ConfigMap for the leader Lease `lease`.
pub fn name_for(lease: &str) -> String {
    format!("{lease}-journal")
}

/// Where the journal lives.
#[derive(Clone, Debug)]
pub struct JournalConfig {
    pub namespace: String,
    pub name: String,
}

/// One object's entries a batch removes (or may have removed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Removed {
    pub storage_version: String,
    pub entries: Vec<ServerStorageVersion>,
}

/// The record's text: the JSON of the removals.
pub fn encode(removals: &[Removed]) -> String {
    serde_json::to_string(removals).unwrap_or_default()
}

/// The removals in a record; an unreadable record is empty (it names nothing we can give back).
pub fn decode(text: &str) -> Vec<Removed> {
    serde_json::from_str(text).unwrap_or_default()
}

impl Term {
    /// The journal's API and name (`None`: a dry run, which writes nothing).
    fn journal(&self) -> Option<(Api<ConfigMap>, &JournalConfig)> {
        let cfg = self.c.cfg.journal.as_ref()?;
        if self.c.cfg.dry_run {
            return None;
        }
        Some((Api::namespaced(self.c.client.clone(), &cfg.namespace), cfg))
    }

    /// Before the first pass: what an earlier term recorded and may not have given back gets the
    /// give-back check now, then the journal is cleared. Retries a failed read until it succeeds
    /// (a pass before it would overwrite the record). `None` if the term ended.
    pub(super) async fn recover(&self) -> Option<()> {
        let Some((api, cfg)) = self.journal() else {
            return Some(());
        };
        let name = cfg.name.as_str();
        let mut attempt = 0;
        let text = loop {
            match self.call("GET gc journal", api.get_opt(name)).await? {
                Ok(cm) => {
                    break cm
                        .and_then(|cm| cm.data)
                        .and_then(|mut d| d.remove(KEY))
                        .unwrap_or_default();
                }
                Err(e) => {
                    attempt += 1;
                    self.c.metrics.error("journal");
                    tracing::warn!(configmap = name, error = %e, "cannot read the garbage collector's journal; trying again before collecting");
                    self.cancellable(tokio::time::sleep(backoff(attempt)))
                        .await?;
                }
            }
        };
        let removals = decode(&text);
        if removals.is_empty() {
            return Some(());
        }
        tracing::info!(
            objects = removals.len(),
            "the journal names removals of an earlier term; checking whether their apiservers are back"
        );
        let removed: Vec<(&str, &[ServerStorageVersion])> = removals
            .iter()
            .map(|r| (r.storage_version.as_str(), r.entries.as_slice()))
            .collect();
        self.give_back_if_returned(&removed).await?;
        self.record(&[]).await?;
        Some(())
    }

    /// Writes the journal: `removals` (empty: clears it). Returns whether it was written
    /// (`None` if the term ended).
    pub(super) async fn record(&self, removals: &[Removed]) -> Option<bool> {
        let Some((api, cfg)) = self.journal() else {
            return Some(true);
        };
        let name = cfg.name.as_str();
        let mut data = BTreeMap::new();
        data.insert(KEY.to_string(), encode(removals));
        let cm = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": cfg.namespace,
                "labels": {"app.kubernetes.io/managed-by": "storageversion-webhook"},
                "annotations": {
                    "storageversion-webhook.io/description":
                        "the StorageVersion entries the garbage collector's leader is removing; \
                         the next leader gives back those of an apiserver found back"
                },
            },
            "data": data,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let body = Patch::Apply(&cm);
        let patch = api.patch(name, &params, &body);
        match self.call("PATCH gc journal", patch).await? {
            Ok(_) => Some(true),
            Err(e) => {
                self.c.metrics.error("journal");
                let forbidden = is_status(&e, 403);
                tracing::warn!(configmap = name, forbidden, error = %e, "cannot write the garbage collector's journal; the batch waits");
                Some(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_text_names_nothing() {
        let r = vec![Removed {
            storage_version: "apps.deployments".to_string(),
            entries: vec![ServerStorageVersion {
                api_server_id: "apiserver-a".to_string(),
                encoding_version: "apps/v1".to_string(),
                ..ServerStorageVersion::default()
            }],
        }];
        assert_eq!(decode(&encode(&r)), r);
        assert_eq!(decode(&encode(&[])), Vec::<Removed>::new());
        assert!(decode("{not json").is_empty());
        assert!(decode("").is_empty());
        assert_eq!(name_for("svw-gc"), "svw-gc-journal");
    }
}
