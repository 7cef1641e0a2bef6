//! `check`'s report: one result per judged object, the items it did not judge, and a summary;
//! rendered as text for people or as one JSON document for programs.

use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::rules::{Evaluation, Finding, Severity};

use super::input::ItemHeader;
use super::objects::Subject;

/// Printed (text) once when no `--leases` was given.
pub const LEASE_RULE_NOT_CHECKED: &str = "no --leases given: the live-lease rule \
     (lease-missing, lease-not-apiserver, lease-expired) was not checked";

/// Where an object came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Source {
    pub file: String,
    /// 1-based document index within the file.
    pub document: usize,
    /// 0-based index in the list's `items`, for objects from a list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.file, self.document)?;
        if let Some(i) = self.item {
            write!(f, " items[{i}]")?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// No findings.
    Allowed,
    /// Allowed, with findings that are warnings only.
    Warnings,
    /// At least one finding would deny the write.
    Denied,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Warnings => "warnings",
            Verdict::Denied => "denied",
        }
    }
}

/// The verdict on one object.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectResult {
    pub source: Source,
    pub name: String,
    /// The operation, for objects from an AdmissionReview.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    pub verdict: Verdict,
    pub findings: Vec<Finding>,
}

impl ObjectResult {
    pub fn new(subject: Subject, evaluation: Evaluation) -> Self {
        let verdict = if evaluation.is_denied() {
            Verdict::Denied
        } else if evaluation.findings.is_empty() {
            Verdict::Allowed
        } else {
            Verdict::Warnings
        };
        ObjectResult {
            name: subject.new.name().to_string(),
            source: subject.source,
            operation: subject.operation,
            verdict,
            findings: evaluation.findings,
        }
    }
}

/// The verdict on applying one CRD.
#[derive(Clone, Debug, Serialize)]
pub struct CrdResult {
    pub source: Source,
    #[serde(flatten)]
    pub verdict: crate::crd::upgrade::Verdict,
}

impl CrdResult {
    pub fn new(source: Source, verdict: crate::crd::upgrade::Verdict) -> Self {
        CrdResult { source, verdict }
    }
}

/// Something in the input that is not judged (a list item of another kind, an AdmissionReview
/// the webhook would not judge).
#[derive(Clone, Debug, Serialize)]
pub struct Skip {
    pub source: Source,
    pub reason: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub allowed: usize,
    pub warnings: usize,
    pub denied: usize,
    pub skipped: usize,
    /// CRD applies kube-apiserver would reject.
    #[serde(skip_serializing_if = "is_zero")]
    pub rejected: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// False when no `--leases` was given: the live-lease rule was skipped.
    pub lease_rule_checked: bool,
    pub results: Vec<ObjectResult>,
    /// The CRDs, each judged as an apply.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub crds: Vec<CrdResult>,
    pub skipped: Vec<Skip>,
    pub summary: Summary,
}

impl Report {
    pub fn new(lease_rule_checked: bool, results: Vec<ObjectResult>, skipped: Vec<Skip>) -> Self {
        let count = |v: Verdict| results.iter().filter(|r| r.verdict == v).count();
        let summary = Summary {
            allowed: count(Verdict::Allowed),
            warnings: count(Verdict::Warnings),
            denied: count(Verdict::Denied),
            skipped: skipped.len(),
            rejected: 0,
        };
        Report {
            lease_rule_checked,
            results,
            crds: Vec::new(),
            skipped,
            summary,
        }
    }

    /// The report with the verdicts on CRD applies.
    pub fn with_crds(mut self, crds: Vec<CrdResult>) -> Self {
        self.summary.rejected = crds
            .iter()
            .filter(|c| c.verdict.outcome == crate::crd::upgrade::Outcome::Rejected)
            .count();
        self.crds = crds;
        self
    }

    pub fn to_json(&self) -> serde_json::Result<String> {
        let mut out = serde_json::to_string_pretty(self)?;
        out.push('\n');
        Ok(out)
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for r in &self.results {
            write_result(&mut out, r);
        }
        for c in &self.crds {
            write_crd(&mut out, c);
        }
        for s in &self.skipped {
            let _ = writeln!(out, "skipped ({}): {}", s.source, s.reason);
        }
        if !self.results.is_empty() || !self.skipped.is_empty() || !self.crds.is_empty() {
            out.push('\n');
        }
        if !self.crds.is_empty() {
            let count = |o| self.crds.iter().filter(|c| c.verdict.outcome == o).count();
            use crate::crd::upgrade::Outcome;
            let _ = writeln!(
                out,
                "{} checked: {} up to date, {} needing a migration, {} rejected, {} unknown (no --current)",
                plural(self.crds.len(), "CRD apply"),
                count(Outcome::UpToDate),
                count(Outcome::NeedsMigration),
                count(Outcome::Rejected),
                count(Outcome::Unknown)
            );
            if self.results.is_empty() {
                return out;
            }
        }
        if !self.lease_rule_checked {
            let _ = writeln!(out, "note: {LEASE_RULE_NOT_CHECKED}");
        }
        let s = &self.summary;
        let _ = write!(
            out,
            "{} checked: {} allowed, {} with warnings, {} denied",
            plural(self.results.len(), "object"),
            s.allowed,
            s.warnings,
            s.denied
        );
        if s.skipped > 0 {
            let _ = write!(out, "; {} skipped", s.skipped);
        }
        out.push('\n');
        out
    }
}

fn write_result(out: &mut String, r: &ObjectResult) {
    let name = if r.name.is_empty() {
        "<no name>"
    } else {
        &r.name
    };
    let _ = match &r.operation {
        Some(op) => writeln!(
            out,
            "{name} ({}, AdmissionReview {op}): {}",
            r.source,
            r.verdict.as_str()
        ),
        None => writeln!(out, "{name} ({}): {}", r.source, r.verdict.as_str()),
    };
    for f in &r.findings {
        let severity = match f.severity {
            Severity::Deny => "deny",
            Severity::Warn => "warn",
        };
        let v = &f.violation;
        let _ = write!(out, "  {severity} [{}] {}: {}", v.code, v.path, v.message);
        if let Some(note) = f.note {
            let _ = write!(out, " ({note})");
        }
        out.push('\n');
    }
}

fn write_crd(out: &mut String, c: &CrdResult) {
    let v = &c.verdict;
    let name = if v.name.is_empty() {
        "<no name>"
    } else {
        &v.name
    };
    let _ = writeln!(
        out,
        "{name} ({}, CRD apply): {}",
        c.source,
        v.outcome.as_str()
    );
    if let Some(after) = &v.stored_versions_after {
        let before = v
            .stored_versions_before
            .as_ref()
            .filter(|b| !b.is_empty())
            .map_or_else(
                || "(created)".to_string(),
                |b| format!("[{}]", b.join(", ")),
            );
        let _ = writeln!(out, "  storedVersions: {before} -> [{}]", after.join(", "));
    }
    for m in &v.messages {
        let _ = writeln!(out, "  {m}");
    }
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// `kind "ConfigMap" (apiVersion "v1")`, or `no kind` when there is none.
pub fn describe_kind(api_version: Option<&str>, kind: Option<&str>) -> String {
    match (kind, api_version) {
        (None, _) => "the document has no kind".to_string(),
        (Some(kind), Some(api_version)) => {
            format!("unsupported kind {kind:?} (apiVersion {api_version:?})")
        }
        (Some(kind), None) => format!("unsupported kind {kind:?} (no apiVersion)"),
    }
}

/// `v1 ConfigMap kube-system/settings`, for a list item that is not judged.
pub fn describe_item(item: &ItemHeader) -> String {
    let mut out = String::new();
    if let Some(v) = &item.api_version {
        let _ = write!(out, "{v} ");
    }
    out.push_str(item.kind.as_deref().unwrap_or("an item without kind"));
    let name = item.metadata.name.as_deref().unwrap_or("");
    match item.metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => {
            let _ = write!(out, " {ns}/{name}");
        }
        _ if !name.is_empty() => {
            let _ = write!(out, " {name}");
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_render_with_document_and_item() {
        let mut s = Source {
            file: "a.yaml".into(),
            document: 2,
            item: None,
        };
        assert_eq!(s.to_string(), "a.yaml#2");
        s.item = Some(0);
        assert_eq!(s.to_string(), "a.yaml#2 items[0]");
    }

    #[test]
    fn empty_report_still_says_what_was_not_checked() {
        let text = Report::new(false, Vec::new(), Vec::new()).to_text();
        assert_eq!(
            text,
            format!(
                "note: {LEASE_RULE_NOT_CHECKED}\n0 objects checked: 0 allowed, 0 with warnings, 0 denied\n"
            )
        );
    }
}
