//! The kubectl plugin: the real `storageversion-webhook` binary linked as
//! `kubectl-storageversions` on PATH, found and run by the real kubectl the project builds
//! (tests/controlplane/build), against a real control plane, with kubectl's kubeconfig and its
//! current context.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};

use support::ops::{run, text};
use support::{bin_dir, repo_root, serial, ControlPlane};

/// kubectl with PATH = the plugin dir and the control plane binaries only, and its own HOME.
fn kubectl(plugin_dir: &Path, kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(bin_dir().join("kubectl"));
    let path = std::env::join_paths([plugin_dir.to_path_buf(), bin_dir()]).expect("PATH");
    cmd.env("PATH", path)
        .env("HOME", plugin_dir)
        .env("KUBECONFIG", kubeconfig)
        .current_dir(repo_root());
    cmd
}

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_runs_the_plugin_on_its_current_context() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let plugin = dir.path().join("kubectl-storageversions");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_storageversion-webhook"), &plugin)
        .expect("link the plugin");

    // A kubeconfig with a second context whose server does not answer; the real one is current.
    let kc_text = std::fs::read_to_string(&cp.kubeconfig).expect("kubeconfig");
    let mut kc: Value = serde_norway::from_str(&kc_text).expect("kubeconfig YAML");
    let real_context = kc["current-context"]
        .as_str()
        .expect("current-context")
        .to_string();
    let user = kc["contexts"][0]["context"]["user"].clone();
    kc["clusters"]
        .as_array_mut()
        .expect("clusters")
        .push(json!({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": true}}));
    kc["contexts"]
        .as_array_mut()
        .expect("contexts")
        .push(json!({"name": "nowhere", "context": {"cluster": "nowhere", "user": user}}));
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, serde_json::to_string(&kc).expect("JSON")).expect("write");
    let k = || kubectl(dir.path(), &kubeconfig);

    // kubectl finds it.
    let out = run(k().args(["plugin", "list"]), None);
    assert!(
        text(&out).contains(&plugin.display().to_string()),
        "kubectl plugin list:\n{}",
        text(&out)
    );

    // It names itself as kubectl runs it, and offers check and audit (serve is hidden).
    let out = run(k().args(["storageversions", "--help"]), None);
    let help = text(&out);
    assert_eq!(code(&out), Some(0), "{help}");
    assert!(help.contains("Usage: kubectl storageversions"), "{help}");
    assert!(help.contains("check") && help.contains("audit"), "{help}");
    assert!(
        !help.lines().any(|l| l.trim_start().starts_with("serve ")),
        "{help}"
    );
    let out = run(k().args(["storageversions", "no-such-command"]), None);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("kubectl storageversions"),
        "{}",
        text(&out)
    );

    // rules: the rule catalogue, text and JSON, exactly as the binary renders it itself.
    assert!(help.contains("rules"), "{help}");
    for (flag, format) in [
        ("text", storageversion_webhook::catalog::RulesOutput::Text),
        ("json", storageversion_webhook::catalog::RulesOutput::Json),
    ] {
        let out = run(
            k().args(["storageversions", "rules", "--output", flag]),
            None,
        );
        assert_eq!(code(&out), Some(0), "{}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            storageversion_webhook::catalog::render(format),
            "kubectl storageversions rules --output {flag}"
        );
    }
    let out = run(
        k().args(["storageversions", "rules", "--output", "json"]),
        None,
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert!(
        listed
            .as_array()
            .is_some_and(|rules| rules.iter().any(|r| r["code"] == "lease-missing")),
        "{}",
        text(&out)
    );

    // check: offline files.
    let out = run(
        k().args([
            "storageversions",
            "check",
            "tests/fixtures/check/deployments.yaml",
        ]),
        None,
    );
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert!(text(&out).contains("allowed"), "{}", text(&out));
    let out = run(
        k().args([
            "storageversions",
            "check",
            "tests/fixtures/check/bad-encoding.yaml",
        ]),
        None,
    );
    assert_eq!(code(&out), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("encoding-not-decodable"),
        "{}",
        text(&out)
    );

    // audit: the current context's cluster. First clean, then with an entry of an apiserver that
    // has no lease.
    let out = run(k().args(["storageversions", "audit"]), None);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert!(text(&out).contains("clean"), "{}", text(&out));
    support::create_sv(&cp, "apps.h11plugin").await;
    support::put_status(
        &cp,
        "apps.h11plugin",
        support::status_for("apps", &["h11-gone"]),
    )
    .await
    .expect("write an entry of an apiserver without a lease");
    let out = run(k().args(["storageversions", "audit"]), None);
    assert_eq!(code(&out), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("apps.h11plugin h11-gone"),
        "{}",
        text(&out)
    );
    let out = run(
        k().args(["storageversions", "audit", "--output", "json"]),
        None,
    );
    assert_eq!(code(&out), Some(1), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("audit JSON");
    assert!(report.to_string().contains("h11-gone"), "{report}");

    // Switching kubectl's current context switches the plugin's cluster.
    let out = run(k().args(["config", "use-context", "nowhere"]), None);
    assert!(out.status.success(), "{}", text(&out));
    let out = run(k().args(["storageversions", "audit"]), None);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("error"), "{}", text(&out));
    let out = run(k().args(["config", "use-context", &real_context]), None);
    assert!(out.status.success(), "{}", text(&out));
    let out = run(k().args(["storageversions", "audit"]), None);
    assert_eq!(code(&out), Some(1), "{}", text(&out));
}
