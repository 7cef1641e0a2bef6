//! What the collector keeps of a StorageVersion: only what its rules and its write need.
//!
//! - metadata: name, uid and resourceVersion (no `managedFields`, labels or annotations: a write
//!   through `/status` cannot change them anyway, the API server keeps the stored ones);
//! - status: the fields this program knows ([`StorageVersionStatus`]) plus, verbatim, every field
//!   it does not (a newer apiserver may add one), so a status written back keeps them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::model::{
    StorageVersion, StorageVersionStatus, API_VERSION, GROUP, KIND, PLURAL, VERSION,
};

crate::model::object_struct! {
    /// A StorageVersion as the collector's store holds it. Its metadata is decoded without
    /// `managedFields` and the like (they are never built).
    pub struct StoredSv where metadata = "crate::metadata::kept" {
        status: StoredStatus,
    }
}

/// A status: the known fields, and the rest as they came.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StoredStatus {
    #[serde(flatten)]
    pub known: StorageVersionStatus,
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl StoredSv {
    /// Drops what the collector never needs (called on every object the watch delivers).
    pub fn trim(mut self) -> StoredSv {
        let meta = std::mem::take(&mut self.metadata);
        self.metadata = ObjectMeta {
            name: meta.name,
            uid: meta.uid,
            resource_version: meta.resource_version,
            ..ObjectMeta::default()
        };
        self
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    pub fn resource_version(&self) -> Option<&str> {
        self.metadata.resource_version.as_deref()
    }

    /// The object as the pure rules see it.
    pub fn to_model(&self) -> StorageVersion {
        StorageVersion {
            api_version: Some(API_VERSION.to_string()),
            kind: Some(KIND.to_string()),
            metadata: self.metadata.clone(),
            spec: Default::default(),
            status: self.status.known.clone(),
        }
    }

    /// The body of a `/status` PUT: `planned`'s entries, common version and conditions, this
    /// object's unknown status fields, and its resourceVersion (the write fails with 409 if the
    /// object changed since).
    pub fn with_status(&self, planned: StorageVersionStatus) -> StoredSv {
        StoredSv {
            api_version: Some(API_VERSION.to_string()),
            kind: Some(KIND.to_string()),
            metadata: self.metadata.clone(),
            status: StoredStatus {
                known: planned,
                unknown: self.status.unknown.clone(),
            },
        }
    }
}

crate::model::cluster_resource!(StoredSv);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_status_fields_survive_a_rewrite_and_metadata_is_trimmed() {
        let sv: StoredSv = serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": "a.b", "uid": "u", "resourceVersion": "7",
                         "labels": {"x": "y"},
                         "managedFields": [{"manager": "kube-apiserver", "operation": "Update"}]},
            "spec": {},
            "status": {
                "storageVersions": [{"apiServerID": "a", "encodingVersion": "v1",
                                     "decodableVersions": ["v1"]}],
                "commonEncodingVersion": "v1",
                "futureField": {"nested": [1, 2]},
            }
        }))
        .unwrap();
        let sv = sv.trim();
        assert!(sv.metadata.managed_fields.is_none() && sv.metadata.labels.is_none());
        assert_eq!(sv.resource_version(), Some("7"));
        assert_eq!(sv.status.known.storage_versions.len(), 1);
        assert_eq!(sv.status.unknown.len(), 1, "{:?}", sv.status.unknown);

        let mut planned = sv.status.known.clone();
        planned.storage_versions.clear();
        planned.common_encoding_version = None;
        let body = serde_json::to_value(sv.with_status(planned)).unwrap();
        assert_eq!(body["status"]["futureField"]["nested"][1], 2);
        assert!(body["status"].get("storageVersions").is_none());
        assert!(body["status"].get("commonEncodingVersion").is_none());
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["metadata"]["uid"], "u");
    }
}
