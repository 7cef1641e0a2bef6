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

// ---- verdicts -------------------------------------------------------------------------------

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
fn fresh_leases_allow_and_drop_the_note() {
    let run = check(&[
        "--leases",
        &fixture("leases.yaml"),
        "--now",
        NOW,
        &fixture("deployments.yaml"),
    ]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout.contains("deployments.yaml#1): allowed\n"),
        "{run:?}"
    );
    assert!(!run.stdout.contains("note:"), "{run:?}");
}

#[test]
fn a_missing_lease_denies() {
    let run = check(&[
        "--leases",
        &fixture("leases-missing-one.yaml"),
        "--now",
        NOW,
        &fixture("deployments.yaml"),
    ]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stdout.contains("deployments.yaml#1): denied\n"),
        "{run:?}"
    );
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("  deny [lease-missing] "))
        .unwrap_or_else(|| panic!("no lease-missing denial: {run:?}"));
    assert!(line.contains(C), "{run:?}");
    assert!(!run.stdout.contains("note:"), "{run:?}");
}

#[test]
fn expired_leases_deny() {
    let run = check(&[
        "--leases",
        &fixture("leases.yaml"),
        "--now",
        LATER,
        &fixture("deployments.yaml"),
    ]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stdout.contains("deployments.yaml#1): denied\n"),
        "{run:?}"
    );
    assert!(run.stdout.contains("  deny [lease-expired] "), "{run:?}");
}

#[test]
fn the_skew_allowance_is_honoured() {
    // renewTime + 3600 s is 10:59:55.412306; 20 s later is inside the default 30 s allowance.
    let now = "2026-03-02T11:00:15Z";
    let leases = fixture("leases.yaml");
    let file = fixture("deployments.yaml");
    let run = check(&["--leases", &leases, "--now", now, &file]);
    assert_eq!(run.code, Some(0), "{run:?}");
    let run = check(&[
        "--leases",
        &leases,
        "--now",
        now,
        "--lease-skew-allowance",
        "10s",
        &file,
    ]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stdout.contains("[lease-expired]"), "{run:?}");
}

#[test]
fn leases_outside_kube_system_do_not_count() {
    // leases.yaml holds a lease named like D, but in kube-node-lease.
    let run = check(&[
        "--leases",
        &fixture("leases.yaml"),
        "--now",
        NOW,
        "--output",
        "json",
        &fixture("review-update.yaml"),
    ]);
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
fn encoding_not_in_decodable_denies_with_its_path() {
    let run = check(&[&fixture("bad-encoding.yaml")]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stdout.contains("core.pods (") && run.stdout.contains("bad-encoding.yaml#1): denied\n"),
        "{run:?}"
    );
    assert!(
        run.stdout.contains(
            "  deny [encoding-not-decodable] status.storageVersions[0].decodableVersions: "
        ),
        "{run:?}"
    );
}

#[test]
fn a_storage_version_list_in_json_gives_one_result_per_item() {
    let run = check(&[&fixture("storageversionlist.json")]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stdout.contains("networking.k8s.io.ingresses (")
            && run
                .stdout
                .contains("storageversionlist.json#1 items[0]): denied\n"),
        "{run:?}"
    );
    assert!(
        run.stdout.contains(
            "  deny [served-not-decodable] status.storageVersions[0].servedVersions[1]: "
        ),
        "{run:?}"
    );
    assert!(
        run.stdout
            .contains("storageversionlist.json#1 items[1]): allowed\n"),
        "{run:?}"
    );
}

#[test]
fn a_generic_list_judges_storage_versions_and_skips_the_rest() {
    let run = check(&[&fixture("list.yaml")]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stdout.contains("batch.jobs ("), "{run:?}");
    assert!(
        run.stdout.contains("list.yaml#1 items[0]): allowed\n"),
        "{run:?}"
    );
    assert!(
        run.stdout.contains("list.yaml#1 items[1]): denied\n"),
        "{run:?}"
    );
    assert!(run.stdout.contains("[encoding-not-decodable]"), "{run:?}");
    assert!(
        run.stdout.contains("list.yaml#1 items[2]): v1 ConfigMap kube-system/kube-root-ca.crt is not a StorageVersion"),
        "{run:?}"
    );
    assert!(
        run.stdout
            .contains("2 objects checked: 1 allowed, 0 with warnings, 1 denied; 1 skipped"),
        "{run:?}"
    );
}

#[test]
fn an_update_review_ratchets_an_unchanged_stale_entry_to_a_warning() {
    let run = check(&[
        "--leases",
        &fixture("leases.yaml"),
        "--now",
        NOW,
        &fixture("review-update.yaml"),
    ]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .contains("review-update.yaml#1, AdmissionReview UPDATE): warnings\n"),
        "{run:?}"
    );
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("  warn [lease-missing] "))
        .unwrap_or_else(|| panic!("no lease-missing warning: {run:?}"));
    assert!(line.contains(D), "{run:?}");
    assert!(!line.contains(A), "{run:?}");
    assert!(!run.stdout.contains("  deny ["), "{run:?}");
}

#[test]
fn multi_document_yaml_counts_documents_and_ignores_empty_ones() {
    let run = check(&[&fixture("multi.yaml")]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stdout.contains("batch.jobs ("), "{run:?}");
    assert!(run.stdout.contains("multi.yaml#1): allowed\n"), "{run:?}");
    assert!(run.stdout.contains("core.pods ("), "{run:?}");
    assert!(run.stdout.contains("multi.yaml#3): denied\n"), "{run:?}");
    assert!(run.stdout.contains("2 objects checked"), "{run:?}");
}

#[test]
fn standard_input_is_read_for_a_dash() {
    let text = std::fs::read(fixture("deployments.yaml")).expect("read fixture");
    let run = check_with_stdin(&["-"], &text);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .contains("apps.deployments (<stdin>#1): allowed\n"),
        "{run:?}"
    );
}

#[test]
fn leases_can_come_from_standard_input() {
    let text = std::fs::read(fixture("leases-missing-one.yaml")).expect("read fixture");
    let run = check_with_stdin(
        &["--leases", "-", "--now", NOW, &fixture("deployments.yaml")],
        &text,
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stdout.contains("[lease-missing]"), "{run:?}");
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
    let run = check(&[
        "--output",
        "json",
        "--leases",
        &fixture("leases.yaml"),
        "--now",
        NOW,
        &fixture("review-update.yaml"),
    ]);
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
fn a_yaml_syntax_error_names_the_file_and_line_and_prints_no_verdicts() {
    // The error is on line 14, in the second document.
    let run = check(&[&fixture("deployments.yaml"), &fixture("syntax-error.yaml")]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.starts_with("error: ")
            && run.stderr.contains("syntax-error.yaml: line 14, column "),
        "{run:?}"
    );
    assert!(run.stdout.is_empty(), "{run:?}");
}

#[test]
fn a_field_of_the_wrong_type_is_located() {
    let run = check(&[&fixture("wrong-type.yaml")]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains(
            "wrong-type.yaml: line 9, column 24: status.storageVersions[0].decodableVersions: invalid type"
        ),
        "{run:?}"
    );
}

#[test]
fn a_json_syntax_error_is_located() {
    let run = check_with_stdin(
        &["-"],
        b"{\"kind\": \"StorageVersion\",\n \"metadata\": }\n",
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("<stdin>: line 2, column "), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
}

#[test]
fn a_missing_file_is_named() {
    let missing = fixture("no-such-file.yaml");
    let run = check(&[&missing]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr
            .contains(&format!("error: {missing}: cannot read: ")),
        "{run:?}"
    );
    assert!(run.stdout.is_empty(), "{run:?}");
}

#[test]
fn an_unknown_kind_is_an_input_error_at_its_kind() {
    let run = check(&[&fixture("configmap.yaml")]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains("configmap.yaml: line 3, column 7: ")
            && run.stderr.contains("\"ConfigMap\""),
        "{run:?}"
    );
    assert!(run.stdout.is_empty(), "{run:?}");
}

#[test]
fn a_leases_file_of_another_kind_is_an_input_error() {
    let run = check(&[
        "--leases",
        &fixture("deployments.yaml"),
        &fixture("deployments.yaml"),
    ]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains("deployments.yaml: line ") && run.stderr.contains("\"StorageVersion\""),
        "{run:?}"
    );
}

#[test]
fn text_that_is_not_utf8_is_an_input_error() {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(b"kind: StorageVersion\nmetadata:\n  name: caf\xe9\n")
        .expect("write temp file");
    let path = file.path().display().to_string();
    let run = check(&[&path]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr
            .contains(&format!("{path}: line 3, column 12: not valid UTF-8")),
        "{run:?}"
    );
}

#[test]
fn a_bad_now_is_a_usage_error() {
    let run = check(&["--now", "yesterday", &fixture("deployments.yaml")]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("--now"), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
}

#[test]
fn a_bad_skew_allowance_is_a_usage_error() {
    let run = check(&[
        "--lease-skew-allowance",
        "thirty",
        &fixture("deployments.yaml"),
    ]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("--lease-skew-allowance"), "{run:?}");
}

#[test]
fn standard_input_can_be_used_only_once() {
    let run = check(&["--leases", "-", "-"]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("standard input"), "{run:?}");
}

#[test]
fn a_file_is_required() {
    let run = check(&[]);
    assert_eq!(run.code, Some(2), "{run:?}");
}
