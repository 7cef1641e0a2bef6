//! The text of an admission response: the denial message, the warnings and the log summary,
//! each bounded in bytes whatever the request holds.

use super::log_field;
use crate::rules::{Finding, Severity};

/// Longest text of one finding in a response, in bytes: a finding's message can quote a value
/// from the request, and the response must stay small whatever the request holds.
pub const MAX_FINDING_TEXT_BYTES: usize = 1024;

/// `s` cut to at most `max` bytes (on a character boundary), marked with "…" when cut.
fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

pub(super) fn warning_text(f: &Finding) -> String {
    let v = &f.violation;
    let text = match f.note {
        Some(note) => format!("[{}] {}: {} ({note})", v.code, v.path, v.message),
        None => format!("[{}] {}: {}", v.code, v.path, v.message),
    };
    cut(text, MAX_FINDING_TEXT_BYTES)
}

pub(super) fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

pub(super) fn denial_message(name: &str, denials: &[&Finding], max: usize) -> String {
    let mut msg = format!(
        "StorageVersion {:?} breaks {} rule{}: ",
        log_field(name),
        denials.len(),
        plural(denials.len())
    );
    for (i, f) in denials.iter().take(max).enumerate() {
        if i > 0 {
            msg.push_str("; ");
        }
        let v = &f.violation;
        msg.push_str(&cut(
            format!("[{}] {}: {}", v.code, v.path, v.message),
            MAX_FINDING_TEXT_BYTES,
        ));
    }
    if denials.len() > max {
        msg.push_str(&format!(
            "; and {} more (only the first {max} are listed)",
            denials.len() - max
        ));
    }
    msg
}

pub(super) fn findings_summary(findings: &[Finding], max: usize) -> String {
    let mut out = findings
        .iter()
        .take(max)
        .map(|f| {
            format!(
                "{}:{}:{}",
                match f.severity {
                    Severity::Deny => "deny",
                    Severity::Warn => "warn",
                },
                f.violation.code,
                log_field(&f.violation.path)
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    if findings.len() > max {
        out.push_str(&format!(",and {} more", findings.len() - max));
    }
    out
}
