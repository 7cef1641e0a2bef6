//! The `openreports.io/v1alpha1` `ClusterReport` as far as this program writes it: our own serde
//! structs (k8s-openapi has none), checked against the CRD of the pinned
//! `github.com/openreports/reports-api` v0.2.1 (`config/crd/openreports.io_clusterreports.yaml`),
//! whose only required fields are `results[].policy` and, when `configuration` is set,
//! `configuration.limits`. Every other field is optional and left out when empty, so a
//! server-side apply owns exactly what we send.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "openreports.io";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "openreports.io/v1alpha1";
pub const KIND: &str = "ClusterReport";
pub const PLURAL: &str = "clusterreports";

/// A cluster-scoped policy report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReport {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The engine that produced every result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<Configuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<ReportResult>,
}

crate::model::cluster_resource!(ClusterReport);

/// The contract between the report's producer and its readers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Configuration {
    pub limits: Limits,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// At most this many results are listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_results: Option<i64>,
    /// Only results with these statuses are listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub status_filter: Vec<Status>,
}

/// How many checks ended how (every finding, also those left out of `results`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    #[serde(default)]
    pub pass: i64,
    #[serde(default)]
    pub fail: i64,
    #[serde(default)]
    pub warn: i64,
    #[serde(default)]
    pub error: i64,
    #[serde(default)]
    pub skip: i64,
}

/// The outcome of one check (the CRD's `result` enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Fail,
    Warn,
    Error,
    Pass,
    Skip,
}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::Pass,
        Status::Fail,
        Status::Warn,
        Status::Error,
        Status::Skip,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Warn => "warn",
            Status::Error => "error",
            Status::Skip => "skip",
        }
    }
}

/// The CRD's `severity` enum, most severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Critical,
    High,
    Medium,
    Low,
    Info,
}

/// One result: what was checked (`policy`/`rule`), about which object (`resources`), and how
/// it ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportResult {
    /// Required by the CRD.
    pub policy: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<Severity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Status>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scored: Option<bool>,
    /// The objects the result is about.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ObjectReference>,
    /// Further facts (string values only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
}
