//! Wire types for `internal.apiserver.k8s.io/v1alpha1` StorageVersion objects.
//!
//! These are our own serde structs rather than k8s-openapi's: every field is optional on the way in
//! (`#[serde(default)]`), so an object that upstream validation would reject still decodes and the
//! rules can say precisely what is wrong with it, instead of failing on a missing `reason`.

use serde::{Deserialize, Serialize};

pub const GROUP: &str = "internal.apiserver.k8s.io";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "internal.apiserver.k8s.io/v1alpha1";
pub const KIND: &str = "StorageVersion";
pub const LIST_KIND: &str = "StorageVersionList";
pub const PLURAL: &str = "storageversions";

/// Namespace of the kube-apiserver identity leases.
pub const IDENTITY_LEASE_NAMESPACE: &str = "kube-system";
/// Label carried by kube-apiserver identity leases.
pub const IDENTITY_LABEL_KEY: &str = "apiserver.kubernetes.io/identity";
/// The value of [`IDENTITY_LABEL_KEY`] on a kube-apiserver identity lease.
pub const IDENTITY_LABEL_VALUE: &str = "kube-apiserver";
/// The only condition type upstream defines.
pub const ALL_ENCODING_VERSIONS_EQUAL: &str = "AllEncodingVersionsEqual";

/// Declares the struct of a Kubernetes object: `apiVersion`, `kind` and `metadata`, which every
/// object has, then the given fields (each `#[serde(default)]`, like the header: a missing part
/// decodes as empty so that the rules, not serde, say what is wrong). `where metadata = "path"`
/// decodes the metadata with that function instead.
macro_rules! object_struct {
    (
        $(#[$attr:meta])*
        pub struct $name:ident $(where metadata = $metadata_de:literal)? {
            $($field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$attr])*
        #[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        pub struct $name {
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub api_version: Option<String>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub kind: Option<String>,
            #[serde(default $(, deserialize_with = $metadata_de)?)]
            pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            $(
                #[serde(default)]
                pub $field: $ty,
            )*
        }
    };
}
pub(crate) use object_struct;

object_struct! {
    pub struct StorageVersion {
        spec: StorageVersionSpec,
        status: StorageVersionStatus,
    }
}

/// Empty by design upstream; serialised as `{}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StorageVersionSpec {}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageVersionStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_versions: Vec<ServerStorageVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub common_encoding_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<StorageVersionCondition>,
}

/// One apiserver's report (`status.storageVersions[i]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerStorageVersion {
    #[serde(
        rename = "apiServerID",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub api_server_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub encoding_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decodable_versions: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub served_versions: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageVersionCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observed_generation: i64,
    /// RFC 3339 with second precision, as kube-apiserver writes `metav1.Time`. Kept as text so that
    /// a rewrite by the garbage collector preserves it byte for byte. `None` serialises as `null`,
    /// like a zero `metav1.Time` upstream.
    #[serde(default)]
    pub last_transition_time: Option<String>,
    #[serde(default)]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

impl StorageVersionStatus {
    /// The `AllEncodingVersionsEqual` conditions (upstream keeps exactly one; a hand-written
    /// object may carry none or several).
    pub fn encoding_conditions(&self) -> impl Iterator<Item = &StorageVersionCondition> {
        self.conditions
            .iter()
            .filter(|c| c.type_ == ALL_ENCODING_VERSIONS_EQUAL)
    }
}

impl StorageVersion {
    /// The object's name, or `""` when it has none.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    /// The entry of `id`, if any (the first one, as upstream's updater uses).
    pub fn entry(&self, id: &str) -> Option<&ServerStorageVersion> {
        self.status
            .storage_versions
            .iter()
            .find(|e| e.api_server_id == id)
    }
}

/// Implements `kube::Resource` for a cluster-scoped type with a `metadata: ObjectMeta` field,
/// from the `KIND`, `GROUP`, `VERSION`, `API_VERSION` and `PLURAL` constants in scope where it is
/// used (one definition for StorageVersion, the collector's stored copy and
/// StorageVersionMigration).
macro_rules! cluster_resource {
    ($ty:ty) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = kube::core::ClusterResourceScope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(KIND)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(GROUP)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(VERSION)
            }
            fn api_version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(API_VERSION)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(PLURAL)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use cluster_resource;

/// A List of StorageVersions as returned by `kubectl get storageversions -o yaml`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct StorageVersionList {
    #[serde(default)]
    pub items: Vec<StorageVersion>,
}

cluster_resource!(StorageVersion);

/// What the rules need to know about one identity Lease. Built from a
/// `coordination.k8s.io/v1` Lease by the lease view, or from a file by `check`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    pub name: String,
    /// Value of the `apiserver.kubernetes.io/identity` label, if the label is present.
    pub identity_label: Option<String>,
    pub renew_time: Option<k8s_openapi::jiff::Timestamp>,
    pub lease_duration_seconds: Option<i32>,
}

impl LeaseRecord {
    /// The one definition of when an identity lease expires: `renewTime + leaseDurationSeconds`,
    /// or `None` when either is missing (then it counts as expired). A sum past the largest
    /// time saturates (such a lease is not expired).
    pub fn expiry(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        let renew = self.renew_time?;
        let duration = self.lease_duration_seconds?;
        Some(
            renew
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(i64::from(
                    duration,
                )))
                .unwrap_or(if duration < 0 {
                    k8s_openapi::jiff::Timestamp::MIN
                } else {
                    k8s_openapi::jiff::Timestamp::MAX
                }),
        )
    }

    /// An apiserver's identity lease renewed just now for an hour: the live lease of tests,
    /// benchmarks and examples.
    pub fn live_apiserver(name: impl Into<String>) -> Self {
        LeaseRecord {
            name: name.into(),
            identity_label: Some(IDENTITY_LABEL_VALUE.to_string()),
            renew_time: Some(k8s_openapi::jiff::Timestamp::now()),
            lease_duration_seconds: Some(3600),
        }
    }

    /// Carries `apiserver.kubernetes.io/identity=kube-apiserver`.
    pub fn is_apiserver(&self) -> bool {
        self.identity_label.as_deref() == Some(IDENTITY_LABEL_VALUE)
    }

    pub fn from_lease(lease: &k8s_openapi::api::coordination::v1::Lease) -> Self {
        let spec = lease.spec.as_ref();
        LeaseRecord {
            name: lease.metadata.name.clone().unwrap_or_default(),
            identity_label: lease
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(IDENTITY_LABEL_KEY).cloned()),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            lease_duration_seconds: spec.and_then(|s| s.lease_duration_seconds),
        }
    }
}

/// The outcome of looking up one apiServerID's identity lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseLookup {
    Found(LeaseRecord),
    /// The API server said NotFound (or a synced, fresh cache had no such lease and the live
    /// lookup confirmed it).
    NotFound,
    /// The lookup failed or timed out: never evidence for a denial.
    Failed(String),
    /// No lease data was given (offline `check` without `--leases`): the lease rule is skipped.
    Unknown,
}
