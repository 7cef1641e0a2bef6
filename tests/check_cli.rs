//! `storageversion-webhook check`, run as the real binary on the files under
//! `tests/fixtures/check/`.
//!
//! The fixtures use three live apiservers (A, B, C below) whose leases in `leases.yaml` were renewed
//! at 2026-03-02T09:59:55.412306Z with `leaseDurationSeconds: 3600`, and a gone one (D).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

const A: &str = "apiserver-ujzdegxdncf32epf3dhodzdoci";
const C: &str = "apiserver-v4seh2kvj72ceuvw75efr6edt4";
const D: &str = "apiserver-sywb5wkh7dnsipzz7fk4zri3r2";

/// Ten seconds after the fixture leases were renewed.
const NOW: &str = "2026-03-02T10:00:00Z";
/// Two hours after: every fixture lease has expired.
const LATER: &str = "2026-03-02T12:00:00Z";

const NOTE: &str = "note: no --leases given: the live-lease rule (lease-missing, lease-not-apiserver, lease-expired) was not checked";

fn fixture(name: &str) -> String {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        "check",
        name,
    ]
    .iter()
    .collect();
    path.display().to_string()
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn check_with_stdin(args: &[&str], stdin: &[u8]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_storageversion-webhook"))
        .arg("check")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(stdin)
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait for the binary");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

fn check(args: &[&str]) -> Run {
    check_with_stdin(args, b"")
}

fn json(run: &Run) -> serde_json::Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {run:?}"))
}

/// `check --leases FIXTURE --now NOW` then `rest` (fixture names or flags, as they are).
fn check_with_leases(leases: &str, now: &str, rest: &[&str]) -> Run {
    let leases = fixture(leases);
    let mut args = vec!["--leases", &leases, "--now", now];
    args.extend_from_slice(rest);
    check(&args)
}

/// `check --output json` of the UPDATE review, with fresh leases.
fn review_update_in_json() -> Run {
    check_with_leases(
        "leases.yaml",
        NOW,
        &["--output", "json", &fixture("review-update.yaml")],
    )
}

/// What a case's run must show.
enum Want<'a> {
    /// This exit code.
    Code(i32),
    /// This text in stdout.
    Out(&'a str),
    /// Not this text in stdout.
    NotOut(&'a str),
    /// This text in stderr.
    Err(&'a str),
    /// Stderr starting with this text.
    ErrStart(&'a str),
    /// Nothing on stdout.
    NoStdout,
}

/// Runs each case and checks every thing it wants; a failure names the case.
fn run_cases(cases: Vec<(&str, Run, Vec<Want>)>) {
    for (name, run, wants) in cases {
        for want in wants {
            match want {
                Want::Code(code) => assert_eq!(run.code, Some(code), "{name}: {run:?}"),
                Want::Out(text) => {
                    assert!(run.stdout.contains(text), "{name}: no {text:?}: {run:?}")
                }
                Want::NotOut(text) => {
                    assert!(!run.stdout.contains(text), "{name}: {text:?}: {run:?}")
                }
                Want::Err(text) => {
                    assert!(run.stderr.contains(text), "{name}: no {text:?}: {run:?}")
                }
                Want::ErrStart(text) => {
                    assert!(run.stderr.starts_with(text), "{name}: {run:?}")
                }
                Want::NoStdout => assert!(run.stdout.is_empty(), "{name}: {run:?}"),
            }
        }
    }
}

/// The first line of stdout starting with `prefix`.
fn line_starting<'r>(run: &'r Run, prefix: &str) -> &'r str {
    run.stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?}: {run:?}"))
}

// ---- verdicts -------------------------------------------------------------------------------

#[test]
fn verdicts_in_text() {
    use Want::*;
    let deployments = fixture("deployments.yaml");
    let text = std::fs::read(&deployments).expect("read fixture");
    let missing_one = std::fs::read(fixture("leases-missing-one.yaml")).expect("read fixture");
    run_cases(vec![
        (
            "fresh leases allow and drop the note",
            check_with_leases("leases.yaml", NOW, &[&deployments]),
            vec![Code(0), Out("deployments.yaml#1): allowed\n"), NotOut("note:")],
        ),
        (
            "a missing lease denies",
            check_with_leases("leases-missing-one.yaml", NOW, &[&deployments]),
            vec![Code(1), Out("deployments.yaml#1): denied\n"), NotOut("note:")],
        ),
        (
            "expired leases deny",
            check_with_leases("leases.yaml", LATER, &[&deployments]),
            vec![
                Code(1),
                Out("deployments.yaml#1): denied\n"),
                Out("  deny [lease-expired] "),
            ],
        ),
        (
            // renewTime + 3600 s is 10:59:55.412306; 20 s later is inside the default 30 s
            // allowance.
            "the default skew allowance is honoured",
            check_with_leases("leases.yaml", "2026-03-02T11:00:15Z", &[&deployments]),
            vec![Code(0)],
        ),
        (
            "a smaller skew allowance is honoured",
            check_with_leases(
                "leases.yaml",
                "2026-03-02T11:00:15Z",
                &["--lease-skew-allowance", "10s", &deployments],
            ),
            vec![Code(1), Out("[lease-expired]")],
        ),
        (
            "encoding not in decodable denies with its path",
            check(&[&fixture("bad-encoding.yaml")]),
            vec![
                Code(1),
                Out("core.pods ("),
                Out("bad-encoding.yaml#1): denied\n"),
                Out("  deny [encoding-not-decodable] status.storageVersions[0].decodableVersions: "),
            ],
        ),
        (
            "a StorageVersionList in JSON gives one result per item",
            check(&[&fixture("storageversionlist.json")]),
            vec![
                Code(1),
                Out("networking.k8s.io.ingresses ("),
                Out("storageversionlist.json#1 items[0]): denied\n"),
                Out("  deny [served-not-decodable] status.storageVersions[0].servedVersions[1]: "),
                Out("storageversionlist.json#1 items[1]): allowed\n"),
            ],
        ),
        (
            "a generic list judges StorageVersions and skips the rest",
            check(&[&fixture("list.yaml")]),
            vec![
                Code(1),
                Out("batch.jobs ("),
                Out("list.yaml#1 items[0]): allowed\n"),
                Out("list.yaml#1 items[1]): denied\n"),
                Out("[encoding-not-decodable]"),
                Out("list.yaml#1 items[2]): v1 ConfigMap kube-system/kube-root-ca.crt is not a StorageVersion"),
                Out("2 objects checked: 1 allowed, 0 with warnings, 1 denied; 1 skipped"),
            ],
        ),
        (
            "multi-document YAML counts documents and ignores empty ones",
            check(&[&fixture("multi.yaml")]),
            vec![
                Code(1),
                Out("batch.jobs ("),
                Out("multi.yaml#1): allowed\n"),
                Out("core.pods ("),
                Out("multi.yaml#3): denied\n"),
                Out("2 objects checked"),
            ],
        ),
        (
            "standard input is read for a dash",
            check_with_stdin(&["-"], &text),
            vec![Code(0), Out("apps.deployments (<stdin>#1): allowed\n")],
        ),
        (
            "leases can come from standard input",
            check_with_stdin(&["--leases", "-", "--now", NOW, &deployments], &missing_one),
            vec![Code(1), Out("[lease-missing]")],
        ),
    ]);
}

#[test]
fn a_valid_object_is_allowed_and_the_unchecked_lease_rule_is_noted() {
    let run = check(&[&fixture("deployments.yaml")]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout.contains("apps.deployments (")
            && run.stdout.contains("deployments.yaml#1): allowed\n"),
        "{run:?}"
    );
    assert_eq!(run.stdout.matches(NOTE).count(), 1, "{run:?}");
    assert!(run.stderr.is_empty(), "{run:?}");
}

#[test]
fn a_missing_lease_denial_names_the_apiserver() {
    let run = check_with_leases(
        "leases-missing-one.yaml",
        NOW,
        &[&fixture("deployments.yaml")],
    );
    assert!(
        line_starting(&run, "  deny [lease-missing] ").contains(C),
        "{run:?}"
    );
}

#[test]
fn leases_outside_kube_system_do_not_count() {
    // leases.yaml holds a lease named like D, but in kube-node-lease.
    let run = review_update_in_json();
    let report = json(&run);
    let findings = report["results"][0]["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings array: {run:?}"));
    assert!(
        findings.iter().any(
            |f| f["code"] == "lease-missing" && f["message"].as_str().unwrap_or("").contains(D)
        ),
        "{run:?}"
    );
}

#[test]
fn an_update_review_ratchets_an_unchanged_stale_entry_to_a_warning() {
    let run = check_with_leases("leases.yaml", NOW, &[&fixture("review-update.yaml")]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .contains("review-update.yaml#1, AdmissionReview UPDATE): warnings\n"),
        "{run:?}"
    );
    let line = line_starting(&run, "  warn [lease-missing] ");
    assert!(line.contains(D), "{run:?}");
    assert!(!line.contains(A), "{run:?}");
    assert!(!run.stdout.contains("  deny ["), "{run:?}");
}

// ---- JSON output ----------------------------------------------------------------------------

#[test]
fn json_output_has_results_findings_and_a_summary() {
    let run = check(&["--output", "json", &fixture("list.yaml")]);
    assert_eq!(run.code, Some(1), "{run:?}");
    let report = json(&run);
    assert_eq!(report["leaseRuleChecked"], false, "{run:?}");
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{run:?}");

    let jobs = &results[0];
    assert_eq!(jobs["name"], "batch.jobs");
    assert_eq!(jobs["verdict"], "allowed");
    assert!(jobs["source"]["file"]
        .as_str()
        .is_some_and(|f| f.ends_with("list.yaml")));
    assert_eq!(jobs["source"]["document"], 1);
    assert_eq!(jobs["source"]["item"], 0);
    assert_eq!(jobs["findings"], serde_json::json!([]));

    let pods = &results[1];
    assert_eq!(pods["name"], "core.pods");
    assert_eq!(pods["verdict"], "denied");
    assert_eq!(pods["source"]["item"], 1);
    let finding = pods["findings"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["code"] == "encoding-not-decodable"))
        .unwrap_or_else(|| panic!("no encoding-not-decodable finding: {run:?}"));
    assert_eq!(
        finding["path"],
        "status.storageVersions[0].decodableVersions"
    );
    assert_eq!(finding["severity"], "deny");
    assert!(finding["message"].as_str().is_some_and(|m| !m.is_empty()));

    assert_eq!(report["skipped"][0]["source"]["item"], 2, "{run:?}");
    assert_eq!(
        report["summary"],
        serde_json::json!({"allowed": 1, "warnings": 0, "denied": 1, "skipped": 1})
    );
}

#[test]
fn json_output_says_when_the_lease_rule_was_checked() {
    let run = review_update_in_json();
    assert_eq!(run.code, Some(0), "{run:?}");
    let report = json(&run);
    assert_eq!(report["leaseRuleChecked"], true);
    assert_eq!(report["results"][0]["operation"], "UPDATE");
    assert_eq!(report["results"][0]["verdict"], "warnings", "{run:?}");
    assert_eq!(
        report["summary"],
        serde_json::json!({"allowed": 0, "warnings": 1, "denied": 0, "skipped": 0})
    );
}

// ---- input errors ---------------------------------------------------------------------------

#[test]
fn input_and_usage_errors() {
    use Want::*;
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(b"kind: StorageVersion\nmetadata:\n  name: caf\xe9\n")
        .expect("write temp file");
    let not_utf8 = file.path().display().to_string();
    let not_utf8_error = format!("{not_utf8}: line 3, column 12: not valid UTF-8");
    let missing = fixture("no-such-file.yaml");
    let missing_error = format!("error: {missing}: cannot read: ");
    let deployments = fixture("deployments.yaml");
    run_cases(vec![
        (
            // The error is on line 14, in the second document.
            "a YAML syntax error names the file and line and prints no verdicts",
            check(&[&deployments, &fixture("syntax-error.yaml")]),
            vec![
                Code(2),
                ErrStart("error: "),
                Err("syntax-error.yaml: line 14, column "),
                NoStdout,
            ],
        ),
        (
            "a field of the wrong type is located",
            check(&[&fixture("wrong-type.yaml")]),
            vec![
                Code(2),
                Err("wrong-type.yaml: line 9, column 24: status.storageVersions[0].decodableVersions: invalid type"),
            ],
        ),
        (
            "a JSON syntax error is located",
            check_with_stdin(&["-"], b"{\"kind\": \"StorageVersion\",\n \"metadata\": }\n"),
            vec![Code(2), Err("<stdin>: line 2, column "), NoStdout],
        ),
        (
            "a missing file is named",
            check(&[&missing]),
            vec![Code(2), Err(&missing_error), NoStdout],
        ),
        (
            "an unknown kind is an input error at its kind",
            check(&[&fixture("configmap.yaml")]),
            vec![
                Code(2),
                Err("configmap.yaml: line 3, column 7: "),
                Err("\"ConfigMap\""),
                NoStdout,
            ],
        ),
        (
            "a leases file of another kind is an input error",
            check(&["--leases", &deployments, &deployments]),
            vec![
                Code(2),
                Err("deployments.yaml: line "),
                Err("\"StorageVersion\""),
            ],
        ),
        (
            "text that is not UTF-8 is an input error",
            check(&[&not_utf8]),
            vec![Code(2), Err(&not_utf8_error)],
        ),
        (
            "a bad --now is a usage error",
            check(&["--now", "yesterday", &deployments]),
            vec![Code(2), Err("--now"), NoStdout],
        ),
        (
            "a bad skew allowance is a usage error",
            check(&["--lease-skew-allowance", "thirty", &deployments]),
            vec![Code(2), Err("--lease-skew-allowance")],
        ),
        (
            "standard input can be used only once",
            check(&["--leases", "-", "-"]),
            vec![Code(2), Err("standard input")],
        ),
        ("a file is required", check(&[]), vec![Code(2)]),
    ]);
}

/// Text logs carry no terminal colour codes when stderr is not a terminal (a pod's container
/// log, a file, a pipe): escape sequences there are noise to every reader and log pipeline.
#[test]
fn text_logs_to_a_pipe_have_no_colour_codes() {
    let out = Command::new(env!("CARGO_BIN_EXE_storageversion-webhook"))
        .args(["--log-format", "text", "serve"])
        .args(["--tls-cert-file", &fixture("no-such-cert.pem")])
        .args(["--tls-key-file", &fixture("no-such-key.pem")])
        .args(["--kubeconfig", &fixture("no-such-kubeconfig")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run the binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve without a kubeconfig fails");
    assert!(
        stderr.contains("ERROR") && stderr.contains("serve failed"),
        "the failure is logged: {stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "no escape sequences in a piped log: {stderr:?}"
    );
}

// ---- CRDs: what an apply leaves in storedVersions --------------------------------------------

#[test]
fn a_crd_apply_says_what_it_leaves_in_stored_versions() {
    // Without the cluster's CRDs: both cases said, and how to know; nothing fails.
    let run = check(&[&fixture("crd-v1-only.yaml")]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout.starts_with("widgets.example.com (")
            && run.stdout.contains("CRD apply): unknown"),
        "{run:?}"
    );
    assert!(run.stdout.contains("--current"), "{run:?}");
    assert!(
        !run.stdout.contains(NOTE),
        "no lease note without StorageVersions: {run:?}"
    );

    // Dropping v1beta1 while the cluster still lists it: kube-apiserver's own message, exit 1.
    let current = fixture("crds-current.yaml");
    let run = check(&["--current", &current, &fixture("crd-v1-only.yaml")]);
    assert_eq!(run.code, Some(1), "{run:?}");
    let line = line_starting(&run, "widgets.example.com (");
    assert!(line.ends_with("CRD apply): rejected"), "{run:?}");
    assert!(
        run.stdout.contains(
            r#"  status.storedVersions[0]: Invalid value: "v1beta1": missing from spec.versions; v1beta1 was previously a storage version"#
        ),
        "{run:?}"
    );
    assert!(run.stdout.contains("serve --crd-migrate"), "{run:?}");

    // The storage flip that comes first: storedVersions keeps both until the migration; a CRD
    // the cluster does not have yet is created with just its storage version.
    let run = check(&[
        "--output",
        "json",
        "--current",
        &current,
        &fixture("crd-storage-flip.yaml"),
    ]);
    assert_eq!(run.code, Some(0), "{run:?}");
    let report = json(&run);
    let crds = report["crds"].as_array().expect("crds");
    assert_eq!(crds.len(), 2, "{run:?}");
    assert_eq!(crds[0]["name"], "widgets.example.com");
    assert_eq!(crds[0]["outcome"], "needs-migration");
    assert_eq!(
        crds[0]["storedVersionsBefore"],
        serde_json::json!(["v1beta1", "v1"])
    );
    assert_eq!(
        crds[0]["storedVersionsAfter"],
        serde_json::json!(["v1beta1", "v1"])
    );
    assert_eq!(crds[0]["source"]["document"], 1);
    assert_eq!(crds[1]["name"], "gadgets.example.com");
    assert_eq!(crds[1]["outcome"], "up-to-date");
    assert_eq!(crds[1]["storedVersionsAfter"], serde_json::json!(["v1"]));
    assert_eq!(
        report["summary"]["rejected"],
        serde_json::Value::Null,
        "{run:?}"
    );

    // The file's own status counts when --current does not name the CRD (an exported CRD).
    let run = check(&[&current]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .contains("storedVersions: [v1beta1, v1] -> [v1beta1, v1]"),
        "{run:?}"
    );
}
