//! `rules`: the catalogue of rule codes, from the one list in [`crate::rules::Code`], then the
//! codes of what `audit` and `serve --report` find besides rule violations, from the one list in
//! [`FindingCode`]. The README's two tables are `rules --output markdown` (a test keeps them
//! equal).

use std::fmt::Write as _;
use std::process::ExitCode;

use serde::Serialize;

use crate::audit::codes::FindingCode;
use crate::rules::Code;

#[derive(Clone, Debug, clap::Args)]
#[command(after_help = "\
Upstream = kube-apiserver's own validation enforces the rule too. The code is what denials, \
warnings, logs, metrics labels and the JSON of `check` and `audit` name. The findings after the \
rules are what `audit` and `serve --report` say about storage migrations (built-in resources \
and CRDs).")]
pub struct RulesArgs {
    /// Report format.
    #[arg(long, value_enum, default_value_t = RulesOutput::Text)]
    pub output: RulesOutput,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RulesOutput {
    /// One line per rule, for people.
    Text,
    /// A JSON array of `{code, kind, upstream, description}`, for programs (kind: `admission`
    /// for a rule, `finding` for an audit finding).
    Json,
    /// The Markdown table of the README.
    Markdown,
}

/// One rule (or finding) as `rules --output json` prints it.
#[derive(Debug, Serialize)]
pub struct RuleInfo {
    pub code: &'static str,
    /// `admission` (a rule of the webhook) or `finding` (of `audit` and `serve --report`).
    pub kind: &'static str,
    pub upstream: bool,
    pub description: &'static str,
}

/// Every rule, in [`Code::ALL`] order, then every finding, in [`FindingCode::ALL`] order.
pub fn catalogue() -> Vec<RuleInfo> {
    let rules = Code::ALL.iter().map(|&code| RuleInfo {
        code: code.as_str(),
        kind: "admission",
        upstream: code.is_upstream(),
        description: code.description(),
    });
    let findings = FindingCode::ALL.iter().map(|&code| RuleInfo {
        code: code.as_str(),
        kind: "finding",
        upstream: false,
        description: code.description(),
    });
    rules.chain(findings).collect()
}

/// The catalogue in `format`, ending in a newline.
pub fn render(format: RulesOutput) -> String {
    let all = catalogue();
    let (rules, findings): (Vec<&RuleInfo>, Vec<&RuleInfo>) =
        all.iter().partition(|r| r.kind == "admission");
    let mut out = String::new();
    match format {
        RulesOutput::Text => {
            let width = all.iter().map(|r| r.code.len()).max().unwrap_or(0);
            let _ = writeln!(out, "{:width$}  UPSTREAM  RULE", "CODE");
            for r in &rules {
                let upstream = if r.upstream { "yes" } else { "no" };
                let _ = writeln!(
                    out,
                    "{:width$}  {upstream:8}  {}",
                    r.code,
                    r.description.replace('`', "")
                );
            }
            let _ = writeln!(out, "\n{:width$}  FINDING (audit, serve --report)", "CODE");
            for r in &findings {
                let _ = writeln!(out, "{:width$}  {}", r.code, r.description.replace('`', ""));
            }
        }
        RulesOutput::Json => {
            // Serialising static strings and bools cannot fail.
            out = serde_json::to_string_pretty(&all).unwrap_or_default();
            out.push('\n');
        }
        RulesOutput::Markdown => {
            out.push_str("| code | rule | upstream does it too |\n|---|---|---|\n");
            for r in &rules {
                let upstream = if r.upstream { "yes" } else { "no" };
                let _ = writeln!(out, "| `{}` | {} | {upstream} |", r.code, r.description);
            }
            out.push_str(
                "\nWhat `audit` and `serve --report` find besides rule violations:\n\n| code | finding |\n|---|---|\n",
            );
            for r in &findings {
                let _ = writeln!(out, "| `{}` | {} |", r.code, r.description);
            }
        }
    }
    out
}

pub fn run(args: RulesArgs) -> ExitCode {
    print!("{}", render(args.output));
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_one_string_everywhere() {
        let mut seen = std::collections::BTreeSet::new();
        for &code in Code::ALL {
            let s = code.as_str();
            assert!(seen.insert(s), "{s} used by two codes");
            assert_eq!(code.to_string(), s, "Display of {code:?}");
            assert_eq!(
                serde_json::to_value(code).ok(),
                Some(serde_json::Value::from(s)),
                "JSON of {code:?}"
            );
            assert!(
                s.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{s} is not kebab-case"
            );
            assert!(!code.description().is_empty());
        }
        for &code in FindingCode::ALL {
            let s = code.as_str();
            assert!(
                seen.insert(s),
                "{s} is both a rule and a finding, or two findings"
            );
            assert_eq!(code.to_string(), s);
            assert_eq!(
                serde_json::to_value(code).ok(),
                Some(serde_json::Value::from(s))
            );
            assert!(s.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'));
            assert!(!code.description().is_empty());
        }
        assert_eq!(
            serde_json::to_value(Code::ApiServerIdInvalid).ok(),
            Some(serde_json::Value::from("apiserverid-invalid"))
        );
    }

    #[test]
    fn json_lists_every_rule() {
        let v: serde_json::Value =
            serde_json::from_str(&render(RulesOutput::Json)).unwrap_or_default();
        let items = v.as_array().cloned().unwrap_or_default();
        assert_eq!(items.len(), Code::ALL.len() + FindingCode::ALL.len());
        assert_eq!(items[0]["code"], "name-format");
        assert_eq!(items[0]["upstream"], true);
        assert_eq!(items[20]["code"], "lease-lookup-failed");
        assert_eq!(items[20]["upstream"], false);
        assert_eq!(items[20]["kind"], "admission");
        let last = &items[items.len() - 1];
        assert_eq!(
            (&last["code"], &last["kind"]),
            (&"crd-prune-pending".into(), &"finding".into())
        );
    }

    #[test]
    fn text_has_a_line_per_rule() {
        let text = render(RulesOutput::Text);
        assert_eq!(
            text.lines().count(),
            Code::ALL.len() + 1 + 2 + FindingCode::ALL.len()
        );
        assert!(text.contains("apiserverid-invalid"));
        assert!(text.contains("crd-migration-failed"));
    }
}
