//! The admission rules of design §3, as pure functions: a StorageVersion (and the stored one it
//! replaces, and what is known about identity leases) in, findings out. No I/O, no clock: `now`
//! is an input. Used by the webhook, by `check` and by `audit`.

pub mod beyond;
pub mod common;
pub mod lease;
mod lists;
pub mod names;
pub mod ratchet;
pub mod render;
pub mod upstream;

#[cfg(test)]
mod tests;

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
    /// `metadata.name` is not `<group>.<resource>` (group a DNS-1123 subdomain, resource a DNS-1035 label).
    NameFormat,
    /// An entry's `apiServerID` is not a DNS-1123 subdomain.
    ApiServerIdInvalid,
    /// An `apiServerID` appears in more than one entry (reported on each later one).
    ApiServerIdDuplicate,
    /// An encoding, decodable or served version is not a valid `[group/]version` string.
    VersionInvalid,
    /// `decodableVersions` does not include the entry's `encodingVersion`.
    EncodingNotDecodable,
    /// A served version is not one of the entry's `decodableVersions`.
    ServedNotDecodable,
    /// `commonEncodingVersion` is not the version all entries agree on (or is set while they disagree).
    CommonVersionMismatch,
    /// A condition type appears more than once.
    ConditionTypeDuplicate,
    /// A condition type is not a qualified name.
    ConditionTypeInvalid,
    /// A condition status is not a qualified name.
    ConditionStatusInvalid,
    /// A condition has no reason.
    ConditionReasonEmpty,
    /// A condition has no message.
    ConditionMessageEmpty,
    // beyond upstream (design §3)
    /// `encodingVersion` is in another API group than the one the object's name is about.
    EncodingGroupMismatch,
    /// `decodableVersions` (a set) lists a version more than once.
    DecodableDuplicate,
    /// `servedVersions` (a set) lists a version more than once.
    ServedDuplicate,
    /// A condition status is a qualified name but not `True`, `False` or `Unknown`.
    ConditionStatusUnknownValue,
    /// The `AllEncodingVersionsEqual` condition contradicts `commonEncodingVersion`.
    ConditionDisagreesWithCommon,
    /// No identity lease exists for an entry's `apiServerID`.
    LeaseMissing,
    /// The identity lease of an entry is not labelled as a kube-apiserver's.
    LeaseNotApiserver,
    /// The identity lease of an entry has expired (or has no renew time or duration).
    LeaseExpired,
    /// The identity lease could not be looked up (a warning only, never a denial).
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
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Deny)
    }
    pub fn warnings(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Warn)
    }
    pub fn is_denied(&self) -> bool {
        self.denials().next().is_some()
    }
}

/// The distinct apiServerIDs of `new`'s entries, in order: the leases the caller must look up
/// before calling [`evaluate`]. Entries the write leaves unchanged are included, so that a stale
/// one can be warned about. IDs that are not DNS-1123 subdomains are left out: no lease can have
/// such a name (and an empty name would turn a GET into a LIST); the ID rule denies them anyway.
pub fn lease_ids<'a>(new: &'a StorageVersion, _old: Option<&StorageVersion>) -> Vec<&'a str> {
    let mut ids: Vec<&str> = Vec::with_capacity(new.status.storage_versions.len());
    let mut seen = std::collections::HashSet::with_capacity(new.status.storage_versions.len());
    for e in &new.status.storage_versions {
        let id = e.api_server_id.as_str();
        if names::is_dns1123_subdomain(id) && seen.insert(id) {
            ids.push(id);
        }
    }
    ids
}

/// Every rule that needs no lease data, on one object, without ratcheting: upstream parity
/// first (in upstream's order), then the rules beyond upstream. Used by `audit` and `check`.
pub fn violations(sv: &StorageVersion) -> Vec<Violation> {
    let mut out = Vec::new();
    upstream::check(sv, &mut out);
    beyond::check(sv, &mut out);
    out
}

/// Judges one write: every rule of design §3, with ratcheting against `old` (the stored object
/// on UPDATE, `None` on CREATE). `leases` holds the lookups of [`lease_ids`]; an ID missing from
/// it is treated as [`LeaseLookup::Unknown`].
pub fn evaluate(
    new: &StorageVersion,
    old: Option<&StorageVersion>,
    leases: &LeaseFacts,
    opts: &RuleOptions,
) -> Evaluation {
    let mut evaluation = Evaluation::default();
    let found = violations(new);
    let mut ratchet = ratchet::Ratchet::new(new, old);
    if !found.is_empty() {
        evaluation.findings.reserve(found.len());
        for violation in found {
            let note = ratchet.excuse(&violation);
            evaluation.findings.push(Finding {
                severity: if note.is_some() {
                    Severity::Warn
                } else {
                    Severity::Deny
                },
                violation,
                note,
            });
        }
    }

    for (i, entry) in new.status.storage_versions.iter().enumerate() {
        let id = entry.api_server_id.as_str();
        if !names::is_dns1123_subdomain(id) {
            continue;
        }
        let (code, message) = match lease::judge(id, leases.get(id), opts) {
            lease::LeaseJudgement::Live => continue,
            lease::LeaseJudgement::Unknown => {
                evaluation.lease_rule_skipped = true;
                continue;
            }
            lease::LeaseJudgement::Problem { code, message } => (code, message),
        };
        let unchanged = ratchet.entry_unchanged_at(i);
        evaluation.findings.push(Finding {
            severity: if unchanged || code == Code::LeaseLookupFailed {
                Severity::Warn
            } else {
                Severity::Deny
            },
            violation: Violation {
                code,
                path: format!("status.storageVersions[{i}].apiServerID"),
                error_type: ErrorType::Invalid,
                value: Some(render::go_quote(id)),
                message,
                entry_id: Some(id.to_string()),
            },
            note: unchanged.then_some(ratchet::UNCHANGED_NOTE),
        });
    }
    evaluation
}
