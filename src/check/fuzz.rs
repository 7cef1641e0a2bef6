//! Fuzzing `check`'s input reader with proptest: arbitrary bytes, arbitrary text in the shapes
//! the reader knows (JSON and YAML, one or many documents) and real inputs cut short. Whatever a
//! file holds, reading it never panics: it yields writes to judge (which are then judged) or an
//! error naming the file. The case counts bound the run time.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;

use super::{judge, objects};
use crate::rules::RuleOptions;

/// Writes `bytes` to a fresh file (check reads paths) and loads it as `check` does.
fn load_and_judge(bytes: &[u8]) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path: PathBuf = std::env::temp_dir().join(format!(
        "svw-check-fuzz-{}-{}.yaml",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let written = std::fs::File::create(&path).and_then(|mut f| f.write_all(bytes));
    assert!(written.is_ok(), "cannot write {}", path.display());
    let loaded = objects::load(&path);
    let _ = std::fs::remove_file(&path);
    match loaded {
        Ok(found) => {
            for c in &found.crds {
                let before = (!c.crd.status.stored_versions.is_empty())
                    .then_some(c.crd.status.stored_versions.as_slice());
                let _ = crate::crd::upgrade::judge(&c.crd, before);
            }
            let subjects = found.subjects;
            let opts = RuleOptions {
                now: "2026-01-01T00:00:00Z".parse().expect("a timestamp"),
                lease_skew_allowance: Duration::from_secs(30),
            };
            for s in subjects {
                let _ = judge(&s.new, s.old.as_ref(), None, &opts);
            }
        }
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.starts_with(&path.display().to_string()),
                "the error names the file: {text}"
            );
        }
    }
}

const SAMPLE: &str = r#"apiVersion: internal.apiserver.k8s.io/v1alpha1
kind: StorageVersion
metadata:
  name: apps.deployments
status:
  storageVersions:
  - apiServerID: apiserver-a
    encodingVersion: apps/v1
    decodableVersions: [apps/v1]
    servedVersions: [apps/v1]
  commonEncodingVersion: apps/v1
---
{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": "UPDATE", "object": {"metadata": {"name": "apps.deployments"}}, "oldObject": {}}}
"#;

/// Pieces that the reader gives meaning to, put together at random.
fn shaped_text() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "apiVersion: internal.apiserver.k8s.io/v1alpha1\n",
        "apiVersion: admission.k8s.io/v1\n",
        "apiVersion: v1\n",
        "kind: StorageVersion\n",
        "kind: StorageVersionList\n",
        "kind: List\n",
        "kind: AdmissionReview\n",
        "items:\n",
        "- ",
        "  ",
        "request:\n",
        "  object: ",
        "  oldObject: ",
        "status:\n",
        "storageVersions: [",
        "{\"apiServerID\": \"a\"}",
        "]",
        "---\n",
        "...\n",
        "{",
        "}",
        "\"kind\": \"StorageVersion\"",
        ", ",
        "null",
        "&a ",
        "*a",
        "!!binary ",
        "[[[[",
        "\n",
        "# comment\n",
        "\u{feff}",
    ]);
    prop::collection::vec(piece, 0..40).prop_map(|p| p.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 128, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        load_and_judge(&bytes);
    }

    #[test]
    fn arbitrary_shaped_text(text in shaped_text()) {
        load_and_judge(text.as_bytes());
    }

    #[test]
    fn real_input_cut_short(cut in any::<prop::sample::Index>()) {
        let at = cut.index(SAMPLE.len());
        load_and_judge(&SAMPLE.as_bytes()[..at]);
    }
}
