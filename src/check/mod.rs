//! `check`: the admission rules, offline, on files.
//!
//! A thin adapter: it reads StorageVersions (single objects, lists, or AdmissionReviews whose
//! `request.oldObject` enables ratcheting) and optionally identity Leases from files, then runs the
//! very same [`rules::lease_ids`] + [`rules::evaluate`] as the webhook, with leases judged like
//! [`StaticLeases`]: present means found, absent means NotFound. Without `--leases` every lookup is
//! [`LeaseLookup::Unknown`], so the live-lease rule is skipped, and the report says so.
//!
//! Every input is read and decoded before anything is judged. If any input cannot be used, only
//! the errors are printed (no verdicts) and the exit status is 2.

#[cfg(test)]
mod fuzz;
mod input;
mod objects;
mod report;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use serde::de::Deserializer;
use serde::Deserialize;

use crate::leases::StaticLeases;
use crate::model::{LeaseLookup, LeaseRecord, StorageVersion, IDENTITY_LEASE_NAMESPACE};
use crate::rules::{self, Evaluation, LeaseFacts, RuleOptions};

use input::{decode_file, decode_items, read_input, reject, Header, InputError, Shape, STDIN_ARG};
use objects::Subject;
use report::{ObjectResult, Report};

/// Exit status for denials.
const EXIT_DENIED: u8 = 1;
/// Exit status for usage errors and unusable input.
const EXIT_INPUT: u8 = 2;

#[derive(Clone, Debug, clap::Args)]
#[command(after_help = "\
Each FILE (or - for standard input, at most once) is YAML, possibly several `---` documents, or \
JSON. It may hold StorageVersion objects, StorageVersionLists, `kind: List`s (items of other \
kinds are reported as skipped) and admission.k8s.io/v1 AdmissionReviews (request.object is \
judged, with request.oldObject as the stored object).

Exit status: 0 when every object is allowed (possibly with warnings), 1 when any is denied, \
2 for usage errors or input that cannot be read (then only the errors are printed).")]
pub struct CheckArgs {
    /// Identity Leases (Lease, LeaseList or `kind: List`, e.g. the output of
    /// `kubectl get leases -n kube-system -o yaml`); only leases in kube-system count. May be
    /// repeated. Without it the live-lease rule is not checked.
    #[arg(long = "leases", value_name = "FILE")]
    pub leases: Vec<PathBuf>,
    /// The time the lease rule judges expiry against (RFC 3339) [default: the current time].
    #[arg(long, value_name = "RFC3339", value_parser = parse_now)]
    pub now: Option<Timestamp>,
    /// How long after renewTime + leaseDurationSeconds a lease still counts as live
    /// (e.g. 30s, 1m30s, 500ms).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub lease_skew_allowance: Duration,
    /// Report format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Files holding StorageVersions, lists of them or AdmissionReviews (`-` for standard input).
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// One block per object, for people.
    Text,
    /// A single JSON document, for programs.
    Json,
}

pub fn run(args: CheckArgs) -> ExitCode {
    let stdin_uses = args
        .leases
        .iter()
        .chain(&args.files)
        .filter(|p| p.as_path() == Path::new(STDIN_ARG))
        .count();
    if stdin_uses > 1 {
        eprintln!("error: standard input (-) can be given only once");
        return ExitCode::from(EXIT_INPUT);
    }

    let (leases, subjects, skipped) = match load(&args) {
        Ok(loaded) => loaded,
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            return ExitCode::from(EXIT_INPUT);
        }
    };

    let opts = RuleOptions {
        now: args.now.unwrap_or_else(Timestamp::now),
        lease_skew_allowance: args.lease_skew_allowance,
    };
    let results: Vec<ObjectResult> = subjects
        .into_iter()
        .map(|s| {
            let evaluation = judge(&s.new, s.old.as_ref(), leases.as_ref(), &opts);
            ObjectResult::new(s, evaluation)
        })
        .collect();
    let report = Report::new(leases.is_some(), results, skipped);

    let rendered = match args.output {
        OutputFormat::Text => Ok(report.to_text()),
        OutputFormat::Json => report.to_json(),
    };
    let written = rendered.map_err(|e| e.to_string()).and_then(|text| {
        match std::io::stdout().lock().write_all(text.as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.to_string()),
            _ => Ok(()),
        }
    });
    if let Err(e) = written {
        eprintln!("error: cannot write the report: {e}");
        return ExitCode::from(EXIT_INPUT);
    }

    if report.summary.denied > 0 {
        ExitCode::from(EXIT_DENIED)
    } else {
        ExitCode::SUCCESS
    }
}

type Loaded = (Option<StaticLeases>, Vec<Subject>, Vec<report::Skip>);

/// Reads and decodes every input. Collects the first error of each file.
fn load(args: &CheckArgs) -> Result<Loaded, Vec<InputError>> {
    let mut errors = Vec::new();
    let mut records = Vec::new();
    for path in &args.leases {
        match load_leases(path) {
            Ok(found) => records.extend(found),
            Err(e) => errors.push(e),
        }
    }
    let mut subjects = Vec::new();
    let mut skipped = Vec::new();
    for path in &args.files {
        match objects::load(path) {
            Ok((s, k)) => {
                subjects.extend(s);
                skipped.extend(k);
            }
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let leases = (!args.leases.is_empty()).then(|| StaticLeases::new(records));
    Ok((leases, subjects, skipped))
}

/// Judges one write exactly as the webhook does, with the leases from files (if any).
pub fn judge(
    new: &StorageVersion,
    old: Option<&StorageVersion>,
    leases: Option<&StaticLeases>,
    opts: &RuleOptions,
) -> Evaluation {
    let facts: LeaseFacts = rules::lease_ids(new, old)
        .into_iter()
        .map(|id| {
            let lookup = leases.map_or(LeaseLookup::Unknown, |l| l.get(id));
            (id.to_string(), lookup)
        })
        .collect();
    rules::evaluate(new, old, &facts, opts)
}

/// What a document of a leases file is decoded as.
enum LeaseShape {
    One,
    List(Vec<bool>),
    Reject(String),
}

enum LeaseDoc {
    One(Box<Lease>),
    List(Vec<Option<Lease>>),
}

const LEASE_API_VERSION: &str = "coordination.k8s.io/v1";
const LEASE_KIND: &str = "Lease";

impl Shape for LeaseShape {
    type Decoded = LeaseDoc;

    fn decode<'de, D: Deserializer<'de>>(&self, d: D) -> Result<LeaseDoc, D::Error> {
        match self {
            LeaseShape::One => Lease::deserialize(d).map(|l| LeaseDoc::One(Box::new(l))),
            LeaseShape::List(wanted) => decode_items(d, wanted).map(LeaseDoc::List),
            LeaseShape::Reject(why) => reject(d, why),
        }
    }
}

fn lease_shape(h: &Header) -> LeaseShape {
    let is_lease = |api_version: Option<&str>, kind: Option<&str>, kind_optional: bool| {
        let kind_ok = kind.map_or(kind_optional, |k| k == LEASE_KIND);
        kind_ok && api_version.is_none_or(|v| v == LEASE_API_VERSION)
    };
    let api_version = h.api_version.as_deref();
    match h.kind.as_deref() {
        Some(LEASE_KIND) if is_lease(api_version, Some(LEASE_KIND), false) => LeaseShape::One,
        Some("LeaseList") if api_version.is_none_or(|v| v == LEASE_API_VERSION) => {
            LeaseShape::List(
                h.items
                    .iter()
                    .map(|i| is_lease(i.api_version.as_deref(), i.kind.as_deref(), true))
                    .collect(),
            )
        }
        Some("List") if api_version.is_none_or(|v| v == "v1") => LeaseShape::List(
            h.items
                .iter()
                .map(|i| is_lease(i.api_version.as_deref(), i.kind.as_deref(), false))
                .collect(),
        ),
        kind => LeaseShape::Reject(format!(
            "{}: expected a Lease or LeaseList ({LEASE_API_VERSION}), or a List of Leases",
            report::describe_kind(api_version, kind)
        )),
    }
}

/// The identity-lease records of a leases file: Leases in kube-system (or with no namespace).
/// Items of a list that are not Leases are ignored, with a warning.
fn load_leases(path: &Path) -> Result<Vec<LeaseRecord>, InputError> {
    let file = read_input(path)?;
    let docs = decode_file(&file, lease_shape)?;
    let mut records = Vec::new();
    for doc in docs {
        let leases: Vec<Lease> = match doc.value {
            LeaseDoc::One(lease) => vec![*lease],
            LeaseDoc::List(items) => {
                for (i, (item, header)) in items.iter().zip(&doc.header.items).enumerate() {
                    if item.is_none() {
                        eprintln!(
                            "warning: {}#{} items[{i}]: {} is not a Lease: ignored",
                            file.name,
                            doc.index,
                            report::describe_item(header)
                        );
                    }
                }
                items.into_iter().flatten().collect()
            }
        };
        records.extend(
            leases
                .iter()
                .filter(|l| {
                    l.metadata
                        .namespace
                        .as_deref()
                        .is_none_or(|ns| ns.is_empty() || ns == IDENTITY_LEASE_NAMESPACE)
                })
                .map(LeaseRecord::from_lease),
        );
    }
    Ok(records)
}

/// Parses `--now`.
fn parse_now(s: &str) -> Result<Timestamp, String> {
    s.parse::<Timestamp>()
        .map_err(|e| format!("not an RFC 3339 time such as 2025-06-01T12:00:00Z: {e}"))
}

/// Parses a duration like Go's `time.ParseDuration`: a sequence of decimal numbers with units
/// `h`, `m`, `s`, `ms`, `us` (or `µs`), `ns`, e.g. `30s`, `1m30s`, `1.5h`; `0` alone is allowed.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {s:?}: expected e.g. 30s, 1m30s or 500ms");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut rest = s;
    let mut nanos = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let value: f64 = number.parse().map_err(|_| invalid())?;
        let unit_nanos = match unit {
            "h" => 3_600e9,
            "m" => 60e9,
            "s" => 1e9,
            "ms" => 1e6,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e3,
            "ns" => 1.0,
            _ => return Err(invalid()),
        };
        nanos += value * unit_nanos;
        rest = after;
    }
    Duration::try_from_secs_f64(nanos.round() / 1e9).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_go() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["", "30", "s", "-1s", "1d", "1..5s", "1 s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn now_must_be_rfc3339() {
        assert!(parse_now("2025-06-01T12:00:00Z").is_ok());
        assert!(parse_now("2025-06-01T12:00:00.123456+02:00").is_ok());
        assert!(parse_now("yesterday").is_err());
        assert!(parse_now("2025-06-01").is_err());
    }
}
