//! Where the last agreed version of each resource is remembered across restarts and leaders: one
//! ConfigMap (default `storageversion-webhook-migrate`, in the leader Lease's namespace) whose
//! data maps each StorageVersion name to the encoding version last agreed on. StorageVersion
//! names are valid ConfigMap keys (`<group>.<resource>`).
//!
//! Only the leader writes it, with server-side apply (field manager
//! `storageversion-webhook-migrate`, forced): no read-modify-write race with itself, and the
//! whole map is written at once.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};

/// Field manager of the state ConfigMap writes.
pub const FIELD_MANAGER: &str = "storageversion-webhook-migrate";
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// StorageVersion name -> encoding version last agreed on.
pub type Memory = BTreeMap<String, String>;

/// Reads the memory; a missing ConfigMap is an empty memory. Errors name the ConfigMap.
pub async fn load(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<Memory> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let got = tokio::time::timeout(CALL_TIMEOUT, api.get_opt(name))
        .await
        .with_context(|| format!("reading ConfigMap {namespace}/{name} timed out"))?
        .with_context(|| format!("cannot read ConfigMap {namespace}/{name}"))?;
    Ok(got.and_then(|cm| cm.data).unwrap_or_default())
}

/// Writes the whole memory (creating the ConfigMap if needed).
pub async fn save(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    memory: &Memory,
) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "storageversion-webhook"},
            "annotations": {
                "storageversion-webhook.io/description":
                    "StorageVersion name -> encoding version all apiservers last agreed on; \
                     a migration is created when the agreed version changes (serve --migrate)"
            },
        },
        "data": memory,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    tokio::time::timeout(CALL_TIMEOUT, api.patch(name, &params, &Patch::Apply(&cm)))
        .await
        .with_context(|| format!("writing ConfigMap {namespace}/{name} timed out"))?
        .with_context(|| format!("cannot write ConfigMap {namespace}/{name}"))?;
    Ok(())
}
