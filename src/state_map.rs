//! A leader's memory across restarts and leaders: one labelled ConfigMap in the leader Lease's
//! namespace, read whole and written whole with server-side apply (a forced field manager of its
//! own: no read-modify-write race with itself). The migration trigger (`migrate::state`) and the
//! CRD migrator (`crd::state`) each keep one; each decides what its values mean.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};

/// The label (key, value) on every state ConfigMap: `cleanup` deletes a ConfigMap only if it
/// has it.
pub const STATE_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "storageversion-webhook");

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// One state ConfigMap: where it is, who writes it, and what it says of itself.
pub struct StateMap<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// The server-side apply field manager of its writes.
    pub field_manager: &'a str,
    /// Its `storageversion-webhook.io/description` annotation, for whoever finds it.
    pub description: &'a str,
}

impl<'a> StateMap<'a> {
    /// The state ConfigMap `namespace/name`, written by `field_manager`, described by
    /// `description`.
    pub fn new(
        namespace: &'a str,
        name: &'a str,
        field_manager: &'a str,
        description: &'a str,
    ) -> Self {
        StateMap {
            namespace,
            name,
            field_manager,
            description,
        }
    }

    /// Its data; a missing ConfigMap is empty data. Errors name the ConfigMap.
    pub async fn load(&self, client: &kube::Client) -> anyhow::Result<BTreeMap<String, String>> {
        let (namespace, name) = (self.namespace, self.name);
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let got = tokio::time::timeout(CALL_TIMEOUT, api.get_opt(name))
            .await
            .with_context(|| format!("reading ConfigMap {namespace}/{name} timed out"))?
            .with_context(|| format!("cannot read ConfigMap {namespace}/{name}"))?;
        Ok(got.and_then(|cm| cm.data).unwrap_or_default())
    }

    /// Writes `data` as the whole of its data (creating the ConfigMap if needed): keys not in
    /// it are removed.
    pub async fn save(
        &self,
        client: &kube::Client,
        data: BTreeMap<String, String>,
    ) -> anyhow::Result<()> {
        let (namespace, name) = (self.namespace, self.name);
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let cm = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {STATE_LABEL.0: STATE_LABEL.1},
                "annotations": {"storageversion-webhook.io/description": self.description},
            },
            "data": data,
        });
        let params = PatchParams::apply(self.field_manager).force();
        tokio::time::timeout(CALL_TIMEOUT, api.patch(name, &params, &Patch::Apply(&cm)))
            .await
            .with_context(|| format!("writing ConfigMap {namespace}/{name} timed out"))?
            .with_context(|| format!("cannot write ConfigMap {namespace}/{name}"))?;
        Ok(())
    }

    /// Writes `memory` (as `encode` makes it data) when `*dirty`, then clears `*dirty`; true when
    /// nothing is left unwritten. No memory yet (not read this term) is never written. A failed
    /// write is given to `failed` and left for the next pass.
    pub async fn save_if_dirty<M>(
        &self,
        client: &kube::Client,
        dirty: &mut bool,
        memory: Option<&M>,
        encode: impl FnOnce(&M) -> BTreeMap<String, String>,
        failed: impl FnOnce(&anyhow::Error),
    ) -> bool {
        if !*dirty {
            return true;
        }
        let Some(m) = memory else {
            return false;
        };
        match self.save(client, encode(m)).await {
            Ok(()) => {
                *dirty = false;
                true
            }
            Err(e) => {
                failed(&e);
                false
            }
        }
    }
}
