//! `check`: the admission rules, offline, on files.
//!
//! A thin adapter: it reads StorageVersions (single objects, lists, or AdmissionReviews whose
//! `request.oldObject` enables ratcheting) and optionally identity Leases from files, then runs the
//! very same [`rules::lease_ids`] + [`rules::evaluate`] as the webhook, with leases judged like
//! [`StaticLeases`]: present means found, absent means NotFound. Without `--leases` every lookup is
//! [`LeaseLookup::Unknown`], so the live-lease rule is skipped, and the report says so.
//!
//! CustomResourceDefinitions in the files are judged as applies: what each leaves in
//! `status.storedVersions` ([`crate::crd::upgrade`]), against the CRD as it is in the cluster
//! (`--current`, or the file's own status), without a cluster.
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

use crate::duration::{parse_duration, parse_now};
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
judged, with request.oldObject as the stored object). CustomResourceDefinitions (and lists of \
them) are judged as an apply: what it leaves in status.storedVersions, and whether \
kube-apiserver rejects it.

Exit status: 0 when every object is allowed (possibly with warnings) and no CRD apply is \
rejected, 1 when any is denied or rejected, 2 for usage errors or input that cannot be read \
(then only the errors are printed).")]
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
    /// The CRDs as they are in the cluster now (e.g. `kubectl get crd -o yaml`): their
    /// status.storedVersions is what an apply of a CRD of the same name starts from. May be
    /// repeated. A CRD in FILE that is not in any of them is taken as new (with --current
    /// given), or judged from its own status.storedVersions when it has one.
    #[arg(long = "current", value_name = "FILE")]
    pub current: Vec<PathBuf>,
    /// Report format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Files holding StorageVersions, lists of them, AdmissionReviews or CRDs (`-` for
    /// standard input).
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
        .chain(&args.current)
        .chain(&args.files)
        .filter(|p| p.as_path() == Path::new(STDIN_ARG))
        .count();
    if stdin_uses > 1 {
        eprintln!("error: standard input (-) can be given only once");
        return ExitCode::from(EXIT_INPUT);
    }

    let (leases, subjects, crds, skipped) = match load(&args) {
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
    let crds = crds
        .into_iter()
        .map(|(source, crd, before)| {
            report::CrdResult::new(source, crate::crd::upgrade::judge(&crd, before.as_deref()))
        })
        .collect();
    let report = Report::new(leases.is_some(), results, skipped).with_crds(crds);

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

    if report.summary.denied > 0 || report.summary.rejected > 0 {
        ExitCode::from(EXIT_DENIED)
    } else {
        ExitCode::SUCCESS
    }
}

/// A CRD to judge, with the storedVersions its apply starts from (None: not known).
type CrdInput = (report::Source, crate::crd::types::Crd, Option<Vec<String>>);

type Loaded = (
    Option<StaticLeases>,
    Vec<Subject>,
    Vec<CrdInput>,
    Vec<report::Skip>,
);

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
    let mut current = std::collections::BTreeMap::new();
    for path in &args.current {
        match objects::load(path) {
            Ok(found) => {
                for c in found.crds {
                    current.insert(c.crd.name().to_string(), c.crd.status.stored_versions);
                }
                if !found.subjects.is_empty() {
                    eprintln!(
                        "warning: {}: --current takes CRDs; its StorageVersions are ignored",
                        path.display()
                    );
                }
            }
            Err(e) => errors.push(e),
        }
    }
    let mut subjects = Vec::new();
    let mut crds = Vec::new();
    let mut skipped = Vec::new();
    for path in &args.files {
        match objects::load(path) {
            Ok(found) => {
                subjects.extend(found.subjects);
                skipped.extend(found.skipped);
                for c in found.crds {
                    let before = match current.get(c.crd.name()) {
                        Some(stored) => Some(stored.clone()),
                        None if !c.crd.status.stored_versions.is_empty() => {
                            Some(c.crd.status.stored_versions.clone())
                        }
                        // Given the cluster's CRDs, one not among them is created.
                        None if !args.current.is_empty() => Some(Vec::new()),
                        None => None,
                    };
                    crds.push((c.source, c.crd, before));
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let leases = (!args.leases.is_empty()).then(|| StaticLeases::new(records));
    Ok((leases, subjects, crds, skipped))
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
