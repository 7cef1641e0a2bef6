//! The admission rules (docs/design.md, "The rules"), as pure functions: a StorageVersion (and the stored one it
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

/// Declares every rule code once, with its stable string, whether kube-apiserver's own validation
/// enforces it too, and the one-line description `rules` prints (and the README's table is made
/// from). [`Code::ALL`], [`Code::as_str`], [`Code::is_upstream`], [`Code::description`] and the
/// serialised form are all derived from this one list.
macro_rules! rule_codes {
    ($( $(#[$doc:meta])* $variant:ident = $code:literal, upstream: $upstream:literal, $description:literal; )*) => {
        /// Stable rule codes. The string form (kebab-case) is part of our interface: it appears in
        /// denials, warnings, logs, metrics labels and the JSON of `check`, `audit` and `rules`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Code {
            $( $(#[$doc])* $variant, )*
        }

        impl Code {
            /// Every code, in declaration order (upstream parity first, in upstream's order).
            pub const ALL: &'static [Code] = &[ $( Code::$variant, )* ];

            /// The stable string: the one form used in text, JSON, metrics and the README.
            pub fn as_str(self) -> &'static str {
                match self { $( Code::$variant => $code, )* }
            }

            /// True for the rules that kube-apiserver's own validation also enforces (see
            /// `docs/upstream.md`).
            pub fn is_upstream(self) -> bool {
                match self { $( Code::$variant => $upstream, )* }
            }

            /// What the rule requires, in one line (Markdown: code spans in backticks).
            pub fn description(self) -> &'static str {
                match self { $( Code::$variant => $description, )* }
            }
        }
    };
}

rule_codes! {
    // Upstream parity (docs/upstream.md), in upstream's order.
    /// `metadata.name` is not `<group>.<resource>` (group a DNS-1123 subdomain, resource a DNS-1035 label).
    NameFormat = "name-format", upstream: true,
        "`metadata.name` is `<group>.<resource>`: group a DNS-1123 subdomain, resource a DNS-1035 label";
    /// An entry's `apiServerID` is not a DNS-1123 subdomain.
    ApiServerIdInvalid = "apiserverid-invalid", upstream: true,
        "`apiServerID` is a DNS-1123 subdomain";
    /// An `apiServerID` appears in more than one entry (reported on each later one).
    ApiServerIdDuplicate = "apiserverid-duplicate", upstream: true,
        "no two entries for one `apiServerID`";
    /// An encoding, decodable or served version is not a valid `[group/]version` string.
    VersionInvalid = "version-invalid", upstream: true,
        "encoding/decodable/served versions are `version` or `group/version`";
    /// `decodableVersions` does not include the entry's `encodingVersion`.
    EncodingNotDecodable = "encoding-not-decodable", upstream: true,
        "`encodingVersion` is one of `decodableVersions`";
    /// A served version is not one of the entry's `decodableVersions`.
    ServedNotDecodable = "served-not-decodable", upstream: true,
        "every `servedVersions` item is one of `decodableVersions`";
    /// `commonEncodingVersion` is not the version all entries agree on (or is set while they disagree).
    CommonVersionMismatch = "common-version-mismatch", upstream: true,
        "`commonEncodingVersion` is set exactly when all entries agree, to their version";
    /// A condition type appears more than once.
    ConditionTypeDuplicate = "condition-type-duplicate", upstream: true,
        "condition types are unique";
    /// A condition type is not a qualified name.
    ConditionTypeInvalid = "condition-type-invalid", upstream: true,
        "condition type is a qualified name";
    /// A condition status is not a qualified name.
    ConditionStatusInvalid = "condition-status-invalid", upstream: true,
        "condition status is a qualified name";
    /// A condition has no reason.
    ConditionReasonEmpty = "condition-reason-empty", upstream: true,
        "condition reason is set";
    /// A condition has no message.
    ConditionMessageEmpty = "condition-message-empty", upstream: true,
        "condition message is set";
    // Beyond upstream (docs/design.md).
    /// `encodingVersion` is in another API group than the one the object's name is about.
    EncodingGroupMismatch = "encoding-group-mismatch", upstream: false,
        "`encodingVersion`'s group is the group in the object's name (`core` = no group)";
    /// `decodableVersions` (a set) lists a version more than once.
    DecodableDuplicate = "decodable-duplicate", upstream: false,
        "`decodableVersions` holds no duplicates (it is a set)";
    /// `servedVersions` (a set) lists a version more than once.
    ServedDuplicate = "served-duplicate", upstream: false,
        "`servedVersions` holds no duplicates (it is a set)";
    /// A condition status is a qualified name but not `True`, `False` or `Unknown`.
    ConditionStatusUnknownValue = "condition-status-unknown-value", upstream: false,
        "condition status is `True`, `False` or `Unknown`";
    /// The `AllEncodingVersionsEqual` condition contradicts `commonEncodingVersion`.
    ConditionDisagreesWithCommon = "condition-disagrees-with-common", upstream: false,
        "`AllEncodingVersionsEqual` agrees with `commonEncodingVersion`";
    /// No identity lease exists for an entry's `apiServerID`.
    LeaseMissing = "lease-missing", upstream: false,
        "an added or changed entry's apiserver has an identity Lease in `kube-system`";
    /// The identity lease of an entry is not labelled as a kube-apiserver's.
    LeaseNotApiserver = "lease-not-apiserver", upstream: false,
        "that Lease carries `apiserver.kubernetes.io/identity=kube-apiserver`";
    /// The identity lease of an entry has expired (or has no renew time or duration).
    LeaseExpired = "lease-expired", upstream: false,
        "that Lease is live: `renewTime + leaseDurationSeconds + skew allowance > now`";
    /// The identity lease could not be looked up (a warning only, never a denial).
    LeaseLookupFailed = "lease-lookup-failed", upstream: false,
        "the lease could not be looked up: always only a warning, never a denial";
}

/// Serialised as [`Code::as_str`], so JSON says what text, metrics and the README say.
impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
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
    for e in &new.status.storage_versions {
        let id = e.api_server_id.as_str();
        if names::is_dns1123_subdomain(id) && !ids.contains(&id) {
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

/// Judges one write: every rule (see [`Code`]), with ratcheting against `old` (the stored object
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
    if !found.is_empty() {
        let mut ratchet = ratchet::Ratchet::new(new, old);
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
        let unchanged = ratchet::entry_unchanged(entry, old);
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
