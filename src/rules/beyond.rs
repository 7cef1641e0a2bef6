//! Rules beyond upstream validation (docs/design.md §3), except the live-lease rule (see `lease.rs`):
//! the encoding version's group matches the object's name, the set-typed version lists hold no
//! repeats, and the conditions say something consistent.

use super::lists::repeats;
use super::names;
use super::render::go_quote;
use super::upstream::{condition_violation, entry_violation, name_group};
use super::{Code, ErrorType, Violation};
use crate::model::{ServerStorageVersion, StorageVersion, ALL_ENCODING_VERSIONS_EQUAL};

/// The condition statuses Kubernetes defines.
pub const CONDITION_STATUSES: [&str; 3] = ["True", "False", "Unknown"];

/// Every beyond-upstream rule that needs no lease data.
pub fn check(sv: &StorageVersion, out: &mut Vec<Violation>) {
    let group = name_group(sv.name());
    for (i, entry) in sv.status.storage_versions.iter().enumerate() {
        if let Some(group) = group {
            check_encoding_group(sv.name(), group, i, entry, out);
        }
        let decodable = &entry.decodable_versions;
        check_list_repeats(
            i,
            entry,
            decodable,
            "decodableVersions",
            Code::DecodableDuplicate,
            out,
        );
        let served = &entry.served_versions;
        check_list_repeats(
            i,
            entry,
            served,
            "servedVersions",
            Code::ServedDuplicate,
            out,
        );
    }
    check_conditions(sv, out);
}

fn describe_group(group: &str) -> String {
    if group.is_empty() {
        "the core group".to_string()
    } else {
        format!("API group {}", go_quote(group))
    }
}

/// `encodingVersion` must be a version of the group the object is named after (`core` is the
/// empty group). Only judged when both the name and the version are well-formed, so a malformed
/// value is reported once, by the upstream rules.
fn check_encoding_group(
    name: &str,
    name_group: &str,
    i: usize,
    entry: &ServerStorageVersion,
    out: &mut Vec<Violation>,
) {
    let enc = &entry.encoding_version;
    if !names::is_api_version(enc) {
        return;
    }
    let enc_group = names::api_version_group(enc);
    if enc_group == name_group {
        return;
    }
    let expected = if name_group.is_empty() {
        "a bare version such as \"v1\"".to_string()
    } else {
        format!("\"{name_group}/<version>\"")
    };
    out.push(entry_violation(
        Code::EncodingGroupMismatch,
        i,
        entry,
        "encodingVersion",
        ErrorType::Invalid,
        go_quote(enc),
        format!(
            "encodingVersion {} is in {}, but the object {} is about a resource of {}; report the storage version of the named resource, which is {expected}",
            go_quote(enc),
            describe_group(enc_group),
            go_quote(name),
            describe_group(name_group),
        ),
    ));
}

/// `decodableVersions` and `servedVersions` are `listType=set`: each later repeat is reported at
/// its own index.
fn check_list_repeats(
    i: usize,
    entry: &ServerStorageVersion,
    list: &[String],
    field: &str,
    code: Code,
    out: &mut Vec<Violation>,
) {
    for (j, earlier) in repeats(list, String::as_str) {
        out.push(entry_violation(
            code,
            i,
            entry,
            &format!("{field}[{j}]"),
            ErrorType::Duplicate,
            go_quote(&list[j]),
            format!(
                "{} is listed more than once in {field} (also at {field}[{earlier}]); {field} is a set: remove the repeat",
                go_quote(&list[j])
            ),
        ));
    }
}

/// Condition statuses must be defined values, and the `AllEncodingVersionsEqual` condition must
/// agree with `commonEncodingVersion`.
fn check_conditions(sv: &StorageVersion, out: &mut Vec<Violation>) {
    let common = sv.status.common_encoding_version.as_deref();
    for (i, c) in sv.status.conditions.iter().enumerate() {
        // A status that is not even a qualified name is reported by the upstream rule only.
        if !CONDITION_STATUSES.contains(&c.status.as_str()) && names::is_qualified_name(&c.status) {
            out.push(condition_violation(
                Code::ConditionStatusUnknownValue,
                i,
                "status",
                ErrorType::Invalid,
                Some(go_quote(&c.status)),
                "a condition status must be \"True\", \"False\" or \"Unknown\"; use one of these"
                    .to_string(),
            ));
        }
        if c.type_ != ALL_ENCODING_VERSIONS_EQUAL {
            continue;
        }
        let message = match (c.status.as_str(), common) {
            ("True", None) => format!(
                "the {ALL_ENCODING_VERSIONS_EQUAL} condition is \"True\" but status.commonEncodingVersion is not set; set the condition to \"False\" (reason CommonEncodingVersionUnset) when the apiservers do not agree on one encoding version, or set commonEncodingVersion to the version they agree on"
            ),
            ("False", Some(common)) => format!(
                "the {ALL_ENCODING_VERSIONS_EQUAL} condition is \"False\" but status.commonEncodingVersion is set to {}; set the condition to \"True\" (reason CommonEncodingVersionSet) when all apiservers agree on one encoding version, or unset commonEncodingVersion",
                go_quote(common)
            ),
            _ => continue,
        };
        out.push(condition_violation(
            Code::ConditionDisagreesWithCommon,
            i,
            "status",
            ErrorType::Invalid,
            Some(go_quote(&c.status)),
            message,
        ));
    }
}
