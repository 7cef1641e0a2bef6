//! `storagemigration.k8s.io` `StorageVersionMigration`: our own serde types (k8s-openapi's
//! feature set does not include it), which served version of the API to use, the deterministic
//! name of the migration for a (resource, version), and how to read a migration's phase from its
//! conditions.
//!
//! Schema as served by kube-apiserver v1.37 (`v1`) and v1.35-v1.36 (`v1beta1`, the same):
//! `spec.resource` is a `{group, resource}` (no version: the migrator rewrites every object in
//! whatever version the apiservers encode now), `status.conditions` are `metav1.Condition`s of
//! type `Running`, `Succeeded`, `Failed`, and `status.resourceVersion` is the list
//! resourceVersion the migration covers. `v1alpha1` (v1.30-v1.34) has another schema (a
//! `{group, version, resource}` and its own condition type) and is not used.

use serde::{Deserialize, Serialize};

pub const GROUP: &str = "storagemigration.k8s.io";
pub const KIND: &str = "StorageVersionMigration";
pub const PLURAL: &str = "storageversionmigrations";

/// A served version of the API with the schema above. `v1` is GA and on by default from
/// Kubernetes 1.37; on 1.35 and 1.36 only `v1beta1` exists, off unless the operator turns on the
/// `StorageVersionMigrator` feature gate and `--runtime-config=storagemigration.k8s.io/v1beta1=true`
/// (kube-apiserver and kube-controller-manager, whose controller runs the migrations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ApiVersion {
    #[default]
    V1,
    V1beta1,
}

impl ApiVersion {
    /// In order of preference.
    pub const ALL: [ApiVersion; 2] = [ApiVersion::V1, ApiVersion::V1beta1];

    pub fn version(self) -> &'static str {
        match self {
            ApiVersion::V1 => "v1",
            ApiVersion::V1beta1 => "v1beta1",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            ApiVersion::V1 => "storagemigration.k8s.io/v1",
            ApiVersion::V1beta1 => "storagemigration.k8s.io/v1beta1",
        }
    }

    /// The preferred one of ours among the versions the group serves (from discovery).
    pub fn choose<'a>(served: impl IntoIterator<Item = &'a str>) -> Option<ApiVersion> {
        let served: Vec<&str> = served.into_iter().collect();
        ApiVersion::ALL
            .into_iter()
            .find(|v| served.contains(&v.version()))
    }

    /// Asks the cluster which of ours it serves (`GET /apis/storagemigration.k8s.io`, a few
    /// hundred bytes); `Ok(None)` when the group is not served or serves neither.
    pub async fn discover(client: &kube::Client) -> Result<Option<ApiVersion>, kube::Error> {
        let request = hyper::Request::get(format!("/apis/{GROUP}"))
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        match client
            .request::<k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroup>(request)
            .await
        {
            Ok(group) => Ok(ApiVersion::choose(
                group.versions.iter().map(|v| v.version.as_str()),
            )),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Label on every migration this program creates (and the selector it lists them by).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "storageversion-webhook";
/// Annotations on a migration we created: the StorageVersion it is for, the version agreed on
/// and the version agreed on before.
pub const ANNOTATION_STORAGEVERSION: &str = "storageversion-webhook.io/storageversion";
pub const ANNOTATION_VERSION: &str = "storageversion-webhook.io/encoding-version";
pub const ANNOTATION_PREVIOUS: &str = "storageversion-webhook.io/previous-encoding-version";
/// The migration's number among those begun for its StorageVersion (the end of its name).
pub const ANNOTATION_SEQUENCE: &str = "storageversion-webhook.io/sequence";
/// Set once the migration's outcome has been reported (Event, log), so that a restart or a new
/// leader does not report it again.
pub const ANNOTATION_REPORTED: &str = "storageversion-webhook.io/reported";

/// Longest object name (a DNS-1123 subdomain).
const MAX_NAME: usize = 253;
/// Room left for the random suffix kube-apiserver appends to a `generateName`.
const GENERATED_SUFFIX: usize = 5;

crate::model::object_struct! {
    pub struct StorageVersionMigration {
        spec: MigrationSpec,
        status: MigrationStatus,
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationSpec {
    #[serde(default)]
    pub resource: GroupResource,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupResource {
    /// `""` for the core group.
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub resource: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<MigrationCondition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// Like `model::cluster_resource!`, with the served version as the dynamic type:
/// `Api::all_with(client, &version)` (`Api::all` is `v1`).
impl kube::Resource for StorageVersionMigration {
    type DynamicType = ApiVersion;
    type Scope = kube::core::ClusterResourceScope;

    fn kind(_: &ApiVersion) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(KIND)
    }
    fn group(_: &ApiVersion) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(GROUP)
    }
    fn version(v: &ApiVersion) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(v.version())
    }
    fn api_version(v: &ApiVersion) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(v.api_version())
    }
    fn plural(_: &ApiVersion) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(PLURAL)
    }
    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &mut self.metadata
    }
}

/// Where a migration stands, from its conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Created; the migrator has not started it yet.
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    pub const ALL: [Phase; 4] = [
        Phase::Pending,
        Phase::Running,
        Phase::Succeeded,
        Phase::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Running => "running",
            Phase::Succeeded => "succeeded",
            Phase::Failed => "failed",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

impl StorageVersionMigration {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    fn condition(&self, type_: &str) -> Option<&MigrationCondition> {
        self.status
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    }

    /// Failed wins over Succeeded (the migrator sets only one of them), then Running.
    pub fn phase(&self) -> Phase {
        if self.condition("Failed").is_some() {
            Phase::Failed
        } else if self.condition("Succeeded").is_some() {
            Phase::Succeeded
        } else if self.condition("Running").is_some() {
            Phase::Running
        } else {
            Phase::Pending
        }
    }

    /// The message of the condition that decided the phase (empty when pending).
    pub fn phase_message(&self) -> &str {
        let t = match self.phase() {
            Phase::Failed => "Failed",
            Phase::Succeeded => "Succeeded",
            Phase::Running => "Running",
            Phase::Pending => return "",
        };
        self.condition(t).map(|c| c.message.as_str()).unwrap_or("")
    }

    /// Seconds from creation to the final condition's transition, when both are known.
    pub fn duration_seconds(&self) -> Option<f64> {
        let created = self.metadata.creation_timestamp.as_ref()?.0;
        let t = match self.phase() {
            Phase::Failed => "Failed",
            Phase::Succeeded => "Succeeded",
            _ => return None,
        };
        let done = self.condition(t)?.last_transition_time.as_ref()?.0;
        let d = done.duration_since(created);
        Some(d.as_secs_f64().max(0.0))
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }
}

/// Splits a StorageVersion name `<group>.<resource>` into the API group (`""` for `core`) and
/// the resource. None when the name has no dot or an empty part.
pub fn group_resource(storageversion: &str) -> Option<GroupResource> {
    let (group, resource) = storageversion.rsplit_once('.')?;
    if group.is_empty() || resource.is_empty() {
        return None;
    }
    Some(GroupResource {
        group: if group == "core" {
            String::new()
        } else {
            group.to_string()
        },
        resource: resource.to_string(),
    })
}

/// The name of migration number `sequence` of StorageVersion `storageversion` to `version`
/// (`group/v` or `v`): `<storageversion>-<v>-<sequence>`, e.g. `core.pods-v1-2`. The number
/// comes from the state ConfigMap, so a new need never takes an older migration's name, while a
/// restart or another replica that begins the same migration finds it instead of creating a
/// second. Names that would be too long or not a DNS subdomain end in a stable hash instead.
pub fn migration_name(storageversion: &str, version: &str, sequence: u64) -> String {
    let v = version.rsplit('/').next().unwrap_or(version);
    object_name(&format!("{storageversion}-{v}-{sequence}"))
}

/// The `generateName` prefix of a migration made by hand (`audit`'s fix).
pub fn manual_prefix(storageversion: &str) -> String {
    object_name(&format!("{storageversion}-manual"))
}

/// `plain` if it is a DNS-1123 subdomain (with room for a `generateName` suffix), else a valid
/// name made of its characters and a stable hash.
fn object_name(plain: &str) -> String {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if plain.len() <= MAX_NAME - GENERATED_SUFFIX && plain.split('.').all(label_ok) {
        return plain.to_string();
    }
    let hash = format!("{:016x}", fnv1a(plain.as_bytes()));
    let mut prefix = String::new();
    for c in plain.chars() {
        if prefix.len() + hash.len() + 1 >= MAX_NAME - GENERATED_SUFFIX {
            break;
        }
        let c = match c {
            'a'..='z' | '0'..='9' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        };
        if !(c == '-' && prefix.ends_with('-')) {
            prefix.push(c);
        }
    }
    let prefix = prefix.trim_matches('-');
    if prefix.is_empty() {
        format!("svw-{hash}")
    } else {
        format!("{prefix}-{hash}")
    }
}

/// 64-bit FNV-1a: a hash that is the same on every build and platform.
fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_version_is_v1_where_served_else_v1beta1_never_v1alpha1() {
        assert_eq!(ApiVersion::choose(["v1", "v1beta1"]), Some(ApiVersion::V1));
        assert_eq!(ApiVersion::choose(["v1beta1", "v1"]), Some(ApiVersion::V1));
        assert_eq!(ApiVersion::choose(["v1beta1"]), Some(ApiVersion::V1beta1));
        assert_eq!(ApiVersion::choose(["v1alpha1"]), None);
        assert_eq!(ApiVersion::choose([]), None);
        use kube::Resource;
        assert_eq!(
            StorageVersionMigration::api_version(&ApiVersion::V1beta1),
            "storagemigration.k8s.io/v1beta1"
        );
        assert_eq!(
            StorageVersionMigration::api_version(&ApiVersion::default()),
            "storagemigration.k8s.io/v1"
        );
    }

    fn is_dns_subdomain(n: &str) -> bool {
        n.len() <= MAX_NAME
            && n.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    }

    #[test]
    fn names_are_deterministic_valid_and_never_reused() {
        assert_eq!(
            migration_name(
                "admissionregistration.k8s.io.mutatingadmissionpolicies",
                "admissionregistration.k8s.io/v1",
                1
            ),
            "admissionregistration.k8s.io.mutatingadmissionpolicies-v1-1"
        );
        assert_eq!(migration_name("core.pods", "v1", 2), "core.pods-v1-2");
        // A new need (a new number) never takes an older migration's name.
        assert_ne!(
            migration_name("core.pods", "v1", 1),
            migration_name("core.pods", "v1", 2)
        );
        assert_ne!(
            migration_name("core.pods", "v1", 1),
            migration_name("core.pods", "v2", 1)
        );
        let long = format!("{}.things", "a".repeat(300));
        let n = migration_name(&long, "g/v1", 1);
        assert!(is_dns_subdomain(&n), "{n}");
        assert_eq!(n, migration_name(&long, "g/v1", 1));
        assert_ne!(n, migration_name(&long, "g/v2", 1));
        assert_ne!(n, migration_name(&long, "g/v1", 2));
        let odd = migration_name("Weird_Name.x", "g/V1+x", 3);
        assert!(is_dns_subdomain(&odd), "{odd}");
        assert!(is_dns_subdomain(&migration_name("___", "___", 1)));
        assert_eq!(manual_prefix("core.pods"), "core.pods-manual");
        assert!(manual_prefix(&long).len() + GENERATED_SUFFIX <= MAX_NAME);
    }

    #[test]
    fn group_resource_of_names() {
        assert_eq!(
            group_resource("core.pods"),
            Some(GroupResource {
                group: String::new(),
                resource: "pods".into()
            })
        );
        assert_eq!(
            group_resource("admissionregistration.k8s.io.mutatingadmissionpolicies"),
            Some(GroupResource {
                group: "admissionregistration.k8s.io".into(),
                resource: "mutatingadmissionpolicies".into()
            })
        );
        assert_eq!(group_resource("pods"), None);
        assert_eq!(group_resource(".pods"), None);
        assert_eq!(group_resource("core."), None);
    }

    #[test]
    fn phases_from_conditions() {
        let mut m: StorageVersionMigration = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"resource": {"group": "g", "resource": "r"}},
        }))
        .expect("decodes");
        assert_eq!(m.phase(), Phase::Pending);
        assert_eq!(m.duration_seconds(), None);
        m = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"conditions": [
                {"type": "Running", "status": "True", "reason": "r", "message": "0/2",
                 "lastTransitionTime": "2026-01-01T00:00:01Z"},
            ]},
        }))
        .expect("decodes");
        assert_eq!(m.phase(), Phase::Running);
        m.status.conditions.push(MigrationCondition {
            type_: "Failed".into(),
            status: "True".into(),
            last_transition_time: serde_json::from_value(serde_json::json!("2026-01-01T00:00:03Z"))
                .ok(),
            reason: "StorageVersionMigrationFailed".into(),
            message: "denied".into(),
        });
        assert_eq!(m.phase(), Phase::Failed);
        assert_eq!(m.phase_message(), "denied");
        assert_eq!(m.duration_seconds(), Some(3.0));
        // A condition that is not True does not count.
        m.status.conditions[1].status = "False".into();
        assert_eq!(m.phase(), Phase::Running);
    }
}
