//! `rules`: the catalogue of rule codes, from the one list in [`crate::rules::Code`]. The
//! README's rule table is `rules --output markdown` (a test keeps them equal).

use std::fmt::Write as _;
use std::process::ExitCode;

use serde::Serialize;

use crate::rules::Code;

#[derive(Clone, Debug, clap::Args)]
#[command(after_help = "\
Upstream = kube-apiserver's own validation enforces the rule too. The code is what denials, \
warnings, logs, metrics labels and the JSON of `check` and `audit` name.")]
pub struct RulesArgs {
    /// Report format.
    #[arg(long, value_enum, default_value_t = RulesOutput::Text)]
    pub output: RulesOutput,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RulesOutput {
    /// One line per rule, for people.
    Text,
    /// A JSON array of `{code, upstream, description}`, for programs.
    Json,
    /// The Markdown table of the README.
    Markdown,
}

/// One rule as `rules --output json` prints it.
#[derive(Debug, Serialize)]
pub struct RuleInfo {
    pub code: Code,
    pub upstream: bool,
    pub description: &'static str,
}

/// Every rule, in [`Code::ALL`] order.
pub fn catalogue() -> Vec<RuleInfo> {
    Code::ALL
        .iter()
        .map(|&code| RuleInfo {
            code,
            upstream: code.is_upstream(),
            description: code.description(),
        })
        .collect()
}

/// The catalogue in `format`, ending in a newline.
pub fn render(format: RulesOutput) -> String {
    let rules = catalogue();
    let mut out = String::new();
    match format {
        RulesOutput::Text => {
            let width = rules
                .iter()
                .map(|r| r.code.as_str().len())
                .max()
                .unwrap_or(0);
            let _ = writeln!(out, "{:width$}  UPSTREAM  RULE", "CODE");
            for r in &rules {
                let upstream = if r.upstream { "yes" } else { "no" };
                let _ = writeln!(
                    out,
                    "{:width$}  {upstream:8}  {}",
                    r.code.as_str(),
                    r.description.replace('`', "")
                );
            }
        }
        RulesOutput::Json => {
            // Serialising static strings and bools cannot fail.
            out = serde_json::to_string_pretty(&rules).unwrap_or_default();
            out.push('\n');
        }
        RulesOutput::Markdown => {
            out.push_str("| code | rule | upstream does it too |\n|---|---|---|\n");
            for r in &rules {
                let upstream = if r.upstream { "yes" } else { "no" };
                let _ = writeln!(out, "| `{}` | {} | {upstream} |", r.code, r.description);
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
        assert_eq!(items.len(), Code::ALL.len());
        assert_eq!(items[0]["code"], "name-format");
        assert_eq!(items[0]["upstream"], true);
        assert_eq!(items[20]["code"], "lease-lookup-failed");
        assert_eq!(items[20]["upstream"], false);
    }

    #[test]
    fn text_has_a_line_per_rule() {
        let text = render(RulesOutput::Text);
        assert_eq!(text.lines().count(), Code::ALL.len() + 1);
        assert!(text.contains("apiserverid-invalid"));
    }
}
