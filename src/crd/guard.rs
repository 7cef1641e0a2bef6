//! The CRD guard's decision (`POST /validate-crd`, docs/crd.md "The guard"): what to say about
//! an UPDATE of a CustomResourceDefinition, from the object before and after and our record of
//! its last migration. Pure: the review's decoding and answer are `admission::crd`'s, the
//! record's watch is [`watch_records`].
//!
//! - **A storage-version change while our migration of the CRD runs** is denied (or, with
//!   `--crd-guard=warn`, warned about): the migration rewrites the objects to the old storage
//!   version, a change now abandons it, and the objects end up in one more version. The message
//!   names the migration and where to see when it has finished.
//! - **Any other storage-version change** is allowed with a warning that says what comes next:
//!   the old version stays in `status.storedVersions`, and so cannot leave `spec.versions`, until
//!   the objects are migrated; who does that (our migrator, after its settle time) or how.
//! - **Everything else passes untouched.** Invariant I9: the guard never denies a write that is
//!   not a storage-version change during our migration (`only_a_storage_flip_during_a_migration_is_ever_denied`).
//!
//! A version removed from `spec.versions` while still in `storedVersions` is never ours to
//! judge: kube-apiserver's own validation refuses that update before any validating webhook is
//! called (measured: `tests/e2e_crd.rs` `the_guard_denies_a_storage_change_during_our_rewrite_and_nothing_else`),
//! so the explanation goes with the storage change that starts the version change instead.

use std::time::Duration;

use super::decide::{Method, Phase, Record};
use super::types::Crd;

/// The CEL `matchConditions` expression of the guard's webhook entry (the chart renders the same,
/// `tests/chart.rs` checks it): kube-apiserver calls only for an update that changes a version's
/// name, `served` or `storage`.
pub const MATCH_CONDITION: &str = "object.spec.versions.map(v, v.name + ':' + string(v.served) + ':' + string(v.storage)) != oldObject.spec.versions.map(v, v.name + ':' + string(v.served) + ':' + string(v.storage))";

/// What the guard does with a storage-version change during our migration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GuardMode {
    /// Deny it, saying when it will be allowed.
    #[default]
    Deny,
    /// Allow it with a warning.
    Warn,
}

/// What the guard knows besides the review.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    /// Our record of the CRD's last migration (any uid: it is checked here).
    pub record: Option<&'a Record>,
    /// The migrator's settle time when `--crd-migrate` is on.
    pub migrator: Option<Duration>,
    pub mode: GuardMode,
    /// `namespace/name` of the state ConfigMap, for the messages.
    pub state: &'a str,
}

/// What the guard answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The denial message, if denied.
    pub denied: Option<String>,
    pub warnings: Vec<String>,
    /// For the log line and metrics: `unchanged`, `storage_change`,
    /// `storage_change_during_migration`.
    pub code: &'static str,
}

/// Longest version or CRD name quoted in a message (the API allows 63 and 253 bytes; a direct
/// caller may send anything).
const MAX_NAME_BYTES: usize = 253;

/// The guard's decision on an UPDATE from `old` to `new`.
pub fn judge(old: &Crd, new: &Crd, cx: &Context<'_>) -> Verdict {
    let (from, to) = (old.storage_version(), new.storage_version());
    let Some(to) = to.filter(|to| Some(*to) != from) else {
        return Verdict {
            code: "unchanged",
            ..Verdict::default()
        };
    };
    let name = cut(old.name());
    let to = cut(to);
    let from_text = from.map_or_else(|| "none".to_string(), |f| cut(f).to_string());
    let snapshot = old.snapshot();
    let ours = cx
        .record
        .filter(|r| r.uid == snapshot.uid)
        .and_then(|r| r.migration.as_ref());
    if let Some(m) = ours.filter(|m| m.phase == Phase::Running && m.covers(&snapshot)) {
        let text = format!(
            "CRD {name}: the storage version changes from {from_text} to {to} while \
             storageversion-webhook's migration {} ({}) rewrites its objects to {}; a change now \
             abandons that migration and leaves objects stored in one more version. Allowed once \
             the migration has finished: its phase is in ConfigMap {}, key {name} (succeeded or \
             failed)",
            cut(&m.name),
            method_text(m.method),
            cut(&m.storage),
            cx.state,
        );
        return match cx.mode {
            GuardMode::Deny => Verdict {
                denied: Some(text),
                warnings: Vec::new(),
                code: "storage_change_during_migration",
            },
            GuardMode::Warn => Verdict {
                denied: None,
                warnings: vec![text],
                code: "storage_change_during_migration",
            },
        };
    }
    let next = match cx.migrator {
        Some(settle) => format!(
            "storageversion-webhook migrates them once the CRD has held still for {}, then sets \
             storedVersions to [{to}]",
            seconds(settle)
        ),
        None => format!(
            "migrate them (storageversion-webhook serve --crd-migrate, or a \
             StorageVersionMigration of {}.{}), then set status.storedVersions to [{to}]",
            cut(&new.spec.names.plural),
            cut(&new.spec.group),
        ),
    };
    let warning = match from {
        Some(_) => format!(
            "CRD {name}: the storage version changes from {from_text} to {to}. Objects stay \
             stored in {from_text} (status.storedVersions keeps it, and {from_text} cannot leave \
             spec.versions) until they are rewritten: {next}"
        ),
        None => format!("CRD {name}: the storage version is now {to}: {next}"),
    };
    Verdict {
        denied: None,
        warnings: vec![warning],
        code: "storage_change",
    }
}

/// A settle time as the flag would say it: `120s`.
fn seconds(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

/// `s` cut to at most [`MAX_NAME_BYTES`] (on a character boundary).
fn cut(s: &str) -> &str {
    let mut end = s.len().min(MAX_NAME_BYTES);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn method_text(method: Method) -> &'static str {
    match method {
        Method::Svm => "a StorageVersionMigration",
        Method::Rewrite => "its own rewrite",
    }
}

#[cfg(test)]
mod tests;
