//! The slice of a `apiextensions.k8s.io/v1` CustomResourceDefinition the migrator reads: names,
//! scope, versions (served, storage), the `Established` condition and `storedVersions`. Our own
//! serde types: the schemas, which make most of a CRD's bytes, are skipped while decoding, and so
//! are `managedFields` ([`crate::metadata::kept_with_generation`]).

use serde::{Deserialize, Serialize};

use super::decide::Snapshot;

pub const GROUP: &str = "apiextensions.k8s.io";
pub const VERSION: &str = "v1";
pub const API_VERSION: &str = "apiextensions.k8s.io/v1";
pub const KIND: &str = "CustomResourceDefinition";
pub const PLURAL: &str = "customresourcedefinitions";

crate::model::object_struct! {
    pub struct Crd where metadata = "crate::metadata::kept_with_generation" {
        spec: CrdSpec,
        status: CrdStatus,
    }
}

crate::model::cluster_resource!(Crd);

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CrdSpec {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub names: CrdNames,
    /// `Namespaced` or `Cluster`.
    #[serde(default)]
    pub scope: String,
    #[serde(default)]
    pub versions: Vec<CrdVersion>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CrdNames {
    #[serde(default)]
    pub plural: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CrdVersion {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub served: bool,
    #[serde(default)]
    pub storage: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdStatus {
    #[serde(default)]
    pub conditions: Vec<CrdCondition>,
    #[serde(default)]
    pub stored_versions: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CrdCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
}

/// How to reach a CRD's objects: what [`kube::api::ApiResource`] needs, and the scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub group: String,
    /// The version the objects are read and written through: the storage version if served,
    /// else the first served one.
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
}

impl Target {
    pub fn api_resource(&self) -> kube::api::ApiResource {
        kube::api::ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version: format!("{}/{}", self.group, self.version),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }
}

impl Crd {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    /// The one version with `storage: true` (None: none or several, which kube-apiserver's
    /// validation never lets through).
    pub fn storage_version(&self) -> Option<&str> {
        let mut storage = self.spec.versions.iter().filter(|v| v.storage);
        match (storage.next(), storage.next()) {
            (Some(v), None) => Some(v.name.as_str()),
            _ => None,
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            name: self.name().to_string(),
            uid: self.metadata.uid.clone().unwrap_or_default(),
            generation: self.metadata.generation.unwrap_or(0),
            resource_version: self.metadata.resource_version.clone().unwrap_or_default(),
            established: self
                .status
                .conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"),
            terminating: self.metadata.deletion_timestamp.is_some(),
            storage: self.storage_version().map(str::to_string),
            served: self
                .spec
                .versions
                .iter()
                .filter(|v| v.served)
                .map(|v| v.name.clone())
                .collect(),
            stored: self.status.stored_versions.clone(),
        }
    }

    /// Where its objects are read and written; None when no version is served.
    pub fn target(&self) -> Option<Target> {
        let served = |v: &&CrdVersion| v.served;
        let version = self
            .spec
            .versions
            .iter()
            .filter(served)
            .find(|v| v.storage)
            .or_else(|| self.spec.versions.iter().find(served))?;
        Some(Target {
            group: self.spec.group.clone(),
            version: version.name.clone(),
            kind: self.spec.names.kind.clone(),
            plural: self.spec.names.plural.clone(),
            namespaced: self.spec.scope != "Cluster",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_what_it_needs_and_skips_the_rest() {
        let crd: Crd = serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": "widgets.example.com", "uid": "u", "generation": 3,
                         "resourceVersion": "42",
                         "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [
                        {"name": "v1beta1", "served": true, "storage": false,
                         "schema": {"openAPIV3Schema": {"type": "object"}}},
                        {"name": "v1", "served": false, "storage": true}]},
            "status": {"storedVersions": ["v1beta1", "v1"],
                       "conditions": [{"type": "Established", "status": "True", "reason": "x"}]}
        }))
        .expect("decode");
        assert!(crd.metadata.managed_fields.is_none());
        let s = crd.snapshot();
        assert_eq!(s.storage.as_deref(), Some("v1"));
        assert_eq!(s.served, vec!["v1beta1"]);
        assert_eq!(s.stored, vec!["v1beta1", "v1"]);
        assert!(s.established && !s.terminating && !s.up_to_date());
        assert_eq!((s.generation, s.resource_version.as_str()), (3, "42"));
        // The storage version is not served: the objects go through the first served one.
        let t = crd.target().expect("served");
        assert_eq!((t.version.as_str(), t.namespaced), ("v1beta1", true));
        assert_eq!(t.api_resource().api_version, "example.com/v1beta1");
        let none: Crd = serde_json::from_value(serde_json::json!({"spec": {"versions": [
            {"name": "a", "storage": true}, {"name": "b", "storage": true}]}}))
        .expect("decode");
        assert_eq!(none.storage_version(), None);
        assert_eq!(none.target(), None);
    }
}
