//! The admission rules of design §3, as pure functions: a StorageVersion (and the stored one it
//! replaces, and what is known about identity leases) in, findings out. No I/O, no clock: `now`
//! is an input. Used by the webhook, by `check` and by `audit`.

pub mod common;
pub mod names;

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::model::{LeaseLookup, StorageVersion};

/// Stable rule codes. The string form (kebab-case) is part of our interface: it appears in
/// denials, warnings, logs, metrics labels and `check` output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Code {
    // upstream parity (spec §2)
    NameFormat,
    ApiServerIdInvalid,
    ApiServerIdDuplicate,
    VersionInvalid,
    EncodingNotDecodable,
    ServedNotDecodable,
    CommonVersionMismatch,
    ConditionTypeDuplicate,
    ConditionTypeInvalid,
    ConditionStatusInvalid,
    ConditionReasonEmpty,
    ConditionMessageEmpty,
    // beyond upstream (design §3)
    EncodingGroupMismatch,
    DecodableDuplicate,
    ServedDuplicate,
    ConditionStatusUnknownValue,
    ConditionDisagreesWithCommon,
    LeaseMissing,
    LeaseNotApiserver,
    LeaseExpired,
    LeaseLookupFailed,
}

impl Code {
    pub const ALL: &'static [Code] = &[
        Code::NameFormat,
        Code::ApiServerIdInvalid,
        Code::ApiServerIdDuplicate,
        Code::VersionInvalid,
        Code::EncodingNotDecodable,
        Code::ServedNotDecodable,
        Code::CommonVersionMismatch,
        Code::ConditionTypeDuplicate,
        Code::ConditionTypeInvalid,
        Code::ConditionStatusInvalid,
        Code::ConditionReasonEmpty,
        Code::ConditionMessageEmpty,
        Code::EncodingGroupMismatch,
        Code::DecodableDuplicate,
        Code::ServedDuplicate,
        Code::ConditionStatusUnknownValue,
        Code::ConditionDisagreesWithCommon,
        Code::LeaseMissing,
        Code::LeaseNotApiserver,
        Code::LeaseExpired,
        Code::LeaseLookupFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::NameFormat => "name-format",
            Code::ApiServerIdInvalid => "apiserverid-invalid",
            Code::ApiServerIdDuplicate => "apiserverid-duplicate",
            Code::VersionInvalid => "version-invalid",
            Code::EncodingNotDecodable => "encoding-not-decodable",
            Code::ServedNotDecodable => "served-not-decodable",
            Code::CommonVersionMismatch => "common-version-mismatch",
            Code::ConditionTypeDuplicate => "condition-type-duplicate",
            Code::ConditionTypeInvalid => "condition-type-invalid",
            Code::ConditionStatusInvalid => "condition-status-invalid",
            Code::ConditionReasonEmpty => "condition-reason-empty",
            Code::ConditionMessageEmpty => "condition-message-empty",
            Code::EncodingGroupMismatch => "encoding-group-mismatch",
            Code::DecodableDuplicate => "decodable-duplicate",
            Code::ServedDuplicate => "served-duplicate",
            Code::ConditionStatusUnknownValue => "condition-status-unknown-value",
            Code::ConditionDisagreesWithCommon => "condition-disagrees-with-common",
            Code::LeaseMissing => "lease-missing",
            Code::LeaseNotApiserver => "lease-not-apiserver",
            Code::LeaseExpired => "lease-expired",
            Code::LeaseLookupFailed => "lease-lookup-failed",
        }
    }

    /// True for the rules that kube-apiserver's own validation (spec §2) also enforces.
    pub fn is_upstream(self) -> bool {
        matches!(
            self,
            Code::NameFormat
                | Code::ApiServerIdInvalid
                | Code::ApiServerIdDuplicate
                | Code::VersionInvalid
                | Code::EncodingNotDecodable
                | Code::ServedNotDecodable
                | Code::CommonVersionMismatch
                | Code::ConditionTypeDuplicate
                | Code::ConditionTypeInvalid
                | Code::ConditionStatusInvalid
                | Code::ConditionReasonEmpty
                | Code::ConditionMessageEmpty
        )
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// apimachinery's `field.ErrorType`s that the rules use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ErrorType {
    Invalid,
    Duplicate,
    Required,
}

/// One broken rule at one place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub code: Code,
    /// Field path, e.g. `status.storageVersions[1].decodableVersions[0]`.
    pub path: String,
    #[serde(skip)]
    pub error_type: ErrorType,
    /// The offending value as apimachinery renders it (already quoted where upstream quotes).
    #[serde(skip)]
    pub value: Option<String>,
    /// What is wrong, in words a person can act on (upstream's exact detail for parity rules).
    pub message: String,
    /// The apiServerID of the entry the violation is in, if it is inside an entry. Ratcheting
    /// compares entries by ID, not index.
    #[serde(skip)]
    pub entry_id: Option<String>,
}

impl fmt::Display for Violation {
    /// Rendered like apimachinery's `field.Error`: `<path>: <Type>: <value>: <detail>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.error_type {
            ErrorType::Invalid => write!(
                f,
                "{}: Invalid value: {}: {}",
                self.path,
                self.value.as_deref().unwrap_or("\"null\""),
                self.message
            ),
            ErrorType::Duplicate => write!(
                f,
                "{}: Duplicate value: {}",
                self.path,
                self.value.as_deref().unwrap_or("\"null\"")
            ),
            ErrorType::Required => write!(f, "{}: Required value: {}", self.path, self.message),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Grounds for a denial (in `deny` enforcement).
    Deny,
    /// Reported as a warning only.
    Warn,
}

/// A violation with what it means for this write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    #[serde(flatten)]
    pub violation: Violation,
    pub severity: Severity,
    /// Why a violation is only a warning, e.g. "unchanged from the stored object".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
}

/// Inputs besides the objects.
#[derive(Clone, Debug)]
pub struct RuleOptions {
    pub now: Timestamp,
    /// Added to `renewTime + leaseDurationSeconds` before a lease counts as expired.
    pub lease_skew_allowance: std::time::Duration,
}

/// What is known about the identity leases of the entries being judged, by apiServerID.
/// An ID missing from the map is treated as [`LeaseLookup::Unknown`] (rule skipped).
pub type LeaseFacts = BTreeMap<String, LeaseLookup>;

/// The result of judging one write.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Evaluation {
    pub findings: Vec<Finding>,
    /// True when at least one entry's lease could not be judged because no lease data was given.
    pub lease_rule_skipped: bool,
}

impl Evaluation {
    pub fn denials(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.severity == Severity::Deny)
    }
    pub fn warnings(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.severity == Severity::Warn)
    }
    pub fn is_denied(&self) -> bool {
        self.denials().next().is_some()
    }
}

/// The distinct apiServerIDs of `new`'s entries, in order: the leases the caller must look up
/// before calling [`evaluate`].
pub fn lease_ids<'a>(new: &'a StorageVersion, _old: Option<&StorageVersion>) -> Vec<&'a str> {
    let mut ids: Vec<&str> = Vec::new();
    for e in &new.status.storage_versions {
        if !ids.contains(&e.api_server_id.as_str()) {
            ids.push(&e.api_server_id);
        }
    }
    ids
}

/// Judges one write: every rule of design §3, with ratcheting against `old`.
/// PLACEHOLDER: implemented by the rules work.
pub fn evaluate(
    _new: &StorageVersion,
    _old: Option<&StorageVersion>,
    _leases: &LeaseFacts,
    _opts: &RuleOptions,
) -> Evaluation {
    Evaluation::default()
}
