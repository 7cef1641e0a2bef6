//! Upstream parity: kube-apiserver's own StorageVersion validation (docs/upstream.md §2.1-2.5), with the same
//! checks, in the same order, with the same messages.
//!
//! One deliberate difference: upstream indexes the condition list on the `status` path itself, so
//! its condition errors read `status[i].type`; ours read `status.conditions[i].type`, the path of
//! the field that is actually wrong (docs/upstream.md §2.4, §7 (f)). Messages are unchanged.

use super::common::actual_common_encoding_version;
use super::lists::{repeats, Members};
use super::names;
use super::render::{go_list, go_quote, go_string_slice};
use super::{Code, ErrorType, Violation};
use crate::model::{
    ServerStorageVersion, StorageVersion, StorageVersionCondition, StorageVersionStatus,
};

/// Upstream's message for a name without a dot.
pub const NAME_FORM_MSG: &str = "name must be in the form of <group>.<resource>";
/// Upstream's message for a common version given while the servers disagree.
pub const COMMON_SHOULD_BE_NIL_MSG: &str = "should be nil if servers do not agree on the same encoding version, or if there is no server reporting the supported versions yet";

/// Every upstream rule, in upstream's order: the name, then the status.
pub fn check(sv: &StorageVersion, out: &mut Vec<Violation>) {
    check_name(sv.name(), out);
    check_status(&sv.status, out);
}

/// The API group a well-formed StorageVersion name is about (`""` for `core`), or `None` when
/// the name breaks [`check_name`].
pub fn name_group(name: &str) -> Option<&str> {
    let (group, resource) = name.rsplit_once('.')?;
    if !names::is_dns1123_subdomain(group) || !names::is_dns1035_label(resource) {
        return None;
    }
    Some(if group == "core" { "" } else { group })
}

/// `metadata.name` must be `<group>.<resource>`: split at the last dot, the group a DNS-1123
/// subdomain and the resource a DNS-1035 label (docs/upstream.md §2.1).
pub fn check_name(name: &str, out: &mut Vec<Violation>) {
    let mut push = |message: String| {
        out.push(Violation {
            code: Code::NameFormat,
            path: "metadata.name".to_string(),
            error_type: ErrorType::Invalid,
            value: Some(go_quote(name)),
            message,
            entry_id: None,
        })
    };
    match name.rsplit_once('.') {
        None => push(NAME_FORM_MSG.to_string()),
        Some((group, resource)) => {
            for m in names::dns1123_subdomain(group) {
                push(format!("the group segment {m}"));
            }
            for m in names::dns1035_label(resource) {
                push(format!("the resource segment {m}"));
            }
        }
    }
}

/// `status`: per entry the duplicate-ID check then the entry's own checks, then the common
/// version, then the conditions (docs/upstream.md §2.2).
pub fn check_status(status: &StorageVersionStatus, out: &mut Vec<Violation>) {
    let entries = &status.storage_versions;
    let duplicates = repeats(entries, |e| e.api_server_id.as_str());
    let mut duplicates = duplicates.iter().peekable();
    for (i, entry) in entries.iter().enumerate() {
        if let Some(&(_, earlier)) = duplicates.next_if(|(later, _)| *later == i) {
            out.push(entry_violation(
                Code::ApiServerIdDuplicate,
                i,
                entry,
                "apiServerID",
                ErrorType::Duplicate,
                go_quote(&entry.api_server_id),
                format!(
                    "apiServerID {} also appears in status.storageVersions[{earlier}]; each apiserver has exactly one entry: remove or merge the repeated entry",
                    go_quote(&entry.api_server_id)
                ),
            ));
        }
        check_entry(i, entry, out);
    }
    check_common(status, out);
    check_conditions(&status.conditions, out);
}

/// A violation inside `status.storageVersions[i]`.
pub(super) fn entry_violation(
    code: Code,
    i: usize,
    entry: &ServerStorageVersion,
    child: &str,
    error_type: ErrorType,
    value: String,
    message: String,
) -> Violation {
    Violation {
        code,
        path: format!("status.storageVersions[{i}].{child}"),
        error_type,
        value: Some(value),
        message,
        entry_id: Some(entry.api_server_id.clone()),
    }
}

/// One `ServerStorageVersion` (docs/upstream.md §2.3).
pub fn check_entry(i: usize, entry: &ServerStorageVersion, out: &mut Vec<Violation>) {
    // A version string at `field` that is not `[group/]version`.
    let invalid_version = |field: &str, v: &str| {
        let why = names::api_version(v).join(",");
        entry_violation(
            Code::VersionInvalid,
            i,
            entry,
            field,
            ErrorType::Invalid,
            go_quote(v),
            why,
        )
    };
    let id = &entry.api_server_id;
    if !names::is_dns1123_subdomain(id) {
        for m in names::dns1123_subdomain(id) {
            out.push(entry_violation(
                Code::ApiServerIdInvalid,
                i,
                entry,
                "apiServerID",
                ErrorType::Invalid,
                go_quote(id),
                m.to_string(),
            ));
        }
    }

    let enc = &entry.encoding_version;
    if !names::is_api_version(enc) {
        out.push(invalid_version("encodingVersion", enc));
    }

    let decodable = &entry.decodable_versions;
    for (j, d) in decodable.iter().enumerate() {
        if !names::is_api_version(d) {
            out.push(invalid_version(&format!("decodableVersions[{j}]"), d));
        }
    }
    if !decodable.iter().any(|d| d == enc) {
        out.push(entry_violation(
            Code::EncodingNotDecodable,
            i,
            entry,
            "decodableVersions",
            ErrorType::Invalid,
            go_string_slice(decodable),
            format!("decodableVersions must include encodingVersion {enc}"),
        ));
    }

    let served = &entry.served_versions;
    let decodable_set = Members::new(decodable, served.len());
    for (k, s) in served.iter().enumerate() {
        if !names::is_api_version(s) {
            out.push(invalid_version(&format!("servedVersions[{k}]"), s));
        }
        if !decodable_set.contains(s) {
            out.push(entry_violation(
                Code::ServedNotDecodable,
                i,
                entry,
                &format!("servedVersions[{k}]"),
                ErrorType::Invalid,
                go_quote(s),
                format!(
                    "individual served version : {s} must be included in decodableVersions : {}",
                    go_list(decodable)
                ),
            ));
        }
    }
}

/// `commonEncodingVersion` must be the version every entry agrees on, or absent (docs/upstream.md §2.5).
pub fn check_common(status: &StorageVersionStatus, out: &mut Vec<Violation>) {
    let actual = actual_common_encoding_version(&status.storage_versions);
    let given = status.common_encoding_version.as_deref();
    let message = match (actual, given) {
        (None, None) => return,
        (Some(a), Some(x)) if a == x => return,
        (None, Some(_)) => COMMON_SHOULD_BE_NIL_MSG.to_string(),
        (Some(a), None) => format!("the common encoding version is {a}"),
        (Some(a), Some(_)) => format!("the actual common encoding version is {a}"),
    };
    out.push(Violation {
        code: Code::CommonVersionMismatch,
        path: "status.commonEncodingVersion".to_string(),
        error_type: ErrorType::Invalid,
        // None renders as "null", like apimachinery prints a nil pointer.
        value: given.map(go_quote),
        message,
        entry_id: None,
    });
}

/// A violation at `status.conditions[i].<child>`.
pub(super) fn condition_violation(
    code: Code,
    i: usize,
    child: &str,
    error_type: ErrorType,
    value: Option<String>,
    message: String,
) -> Violation {
    Violation {
        code,
        path: format!("status.conditions[{i}].{child}"),
        error_type,
        value,
        message,
        entry_id: None,
    }
}

/// The conditions (docs/upstream.md §2.4): unique type, type and status qualified names, non-empty reason
/// and message. Neither type nor status is restricted to the defined values here.
pub fn check_conditions(conditions: &[StorageVersionCondition], out: &mut Vec<Violation>) {
    let duplicates = repeats(conditions, |c| c.type_.as_str());
    let mut duplicates = duplicates.iter().peekable();
    for (i, c) in conditions.iter().enumerate() {
        if let Some(&(_, earlier)) = duplicates.next_if(|(later, _)| *later == i) {
            out.push(condition_violation(
                Code::ConditionTypeDuplicate,
                i,
                "type",
                ErrorType::Invalid,
                Some(go_quote(&c.type_)),
                format!(
                    "the type of the condition is not unique, it also appears in conditions[{earlier}]"
                ),
            ));
        }
        // type, then status: each a qualified name.
        for (code, field, value) in [
            (Code::ConditionTypeInvalid, "type", &c.type_),
            (Code::ConditionStatusInvalid, "status", &c.status),
        ] {
            if !names::is_qualified_name(value) {
                for m in names::qualified_name(value) {
                    let bad = Some(go_quote(value));
                    out.push(condition_violation(
                        code,
                        i,
                        field,
                        ErrorType::Invalid,
                        bad,
                        m,
                    ));
                }
            }
        }
        if c.reason.is_empty() {
            out.push(condition_violation(
                Code::ConditionReasonEmpty,
                i,
                "reason",
                ErrorType::Required,
                None,
                "reason cannot be empty".to_string(),
            ));
        }
        if c.message.is_empty() {
            out.push(condition_violation(
                Code::ConditionMessageEmpty,
                i,
                "message",
                ErrorType::Required,
                None,
                "message cannot be empty".to_string(),
            ));
        }
    }
}
