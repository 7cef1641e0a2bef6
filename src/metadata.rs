//! The object metadata the long-lived stores keep, decoded without the rest.
//!
//! A watched object's `metadata` carries `managedFields`, whose `fieldsV1` trees k8s-openapi
//! decodes into `serde_json::Value` maps: thousands of small allocations per list page, all
//! dropped at once. The identity-lease store and the collector's StorageVersion store need only a
//! few fields, so they decode `metadata` with [`kept`], which skips the rest without building it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

/// What a store keeps of `metadata`; every other field is skipped unbuilt.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Kept {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    deletion_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// `#[serde(deserialize_with = "crate::metadata::kept")]`: name, namespace, uid,
/// resourceVersion and labels of an object's `metadata`, nothing else.
pub fn kept<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = kept_with_generation(d)?;
    Ok(ObjectMeta {
        generation: None,
        deletion_timestamp: None,
        ..m
    })
}

/// Like [`kept`], with `generation` and `deletionTimestamp` too (the CRD migrator's watch).
pub fn kept_with_generation<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let k = Kept::deserialize(d)?;
    Ok(ObjectMeta {
        name: k.name,
        namespace: k.namespace,
        uid: k.uid,
        resource_version: k.resource_version,
        labels: k.labels,
        generation: k.generation,
        deletion_timestamp: k.deletion_timestamp,
        ..ObjectMeta::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Obj {
        #[serde(deserialize_with = "kept")]
        metadata: ObjectMeta,
    }

    #[test]
    fn keeps_the_five_fields_and_skips_the_rest() {
        let o: Obj = serde_json::from_value(serde_json::json!({"metadata": {
            "name": "n", "namespace": "kube-system", "uid": "u", "resourceVersion": "7",
            "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver"},
            "annotations": {"a": "b"}, "generation": 3,
            "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {"f:x": {}}}}]
        }}))
        .unwrap();
        let m = o.metadata;
        assert_eq!(m.name.as_deref(), Some("n"));
        assert_eq!(m.namespace.as_deref(), Some("kube-system"));
        assert_eq!(m.uid.as_deref(), Some("u"));
        assert_eq!(m.resource_version.as_deref(), Some("7"));
        assert_eq!(m.labels.map(|l| l.len()), Some(1));
        assert!(m.annotations.is_none() && m.generation.is_none() && m.managed_fields.is_none());
    }

    #[test]
    fn a_wrong_type_is_an_error_that_names_the_field() {
        let e = serde_json::from_value::<Obj>(serde_json::json!({"metadata": {"name": 5}}))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("invalid type"), "{e}");
    }
}
