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
    // `kubectl storageversions ARGS`: asserts its exit code and that its output has `has`.
    let sv = |args: &[&str], want: i32, has: &str| {
        let out = run(k().arg("storageversions").args(args), None);
        assert_eq!(code(&out), Some(want), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains(has),
            "{args:?}: no {has:?} in {}",
            text(&out)
        );
        out
    };

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
    sv(&["no-such-command"], 2, "kubectl storageversions");

    // rules: the rule catalogue, text and JSON, exactly as the binary renders it itself.
    assert!(help.contains("rules"), "{help}");
    for (flag, format) in [
        ("text", storageversion_webhook::catalog::RulesOutput::Text),
        ("json", storageversion_webhook::catalog::RulesOutput::Json),
    ] {
        let out = sv(&["rules", "--output", flag], 0, "lease-missing");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            storageversion_webhook::catalog::render(format),
            "kubectl storageversions rules --output {flag}"
        );
    }
    let out = sv(&["rules", "--output", "json"], 0, "lease-missing");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert!(
        listed
            .as_array()
            .is_some_and(|rules| rules.iter().any(|r| r["code"] == "lease-missing")),
        "{}",
        text(&out)
    );

    // check: offline files.
    sv(
        &["check", "tests/fixtures/check/deployments.yaml"],
        0,
        "allowed",
    );
    sv(
        &["check", "tests/fixtures/check/bad-encoding.yaml"],
        1,
        "encoding-not-decodable",
    );

    // audit: the current context's cluster. First clean, then with an entry of an apiserver that
    // has no lease.
    sv(&["audit"], 0, "clean");
    support::gc::seed_sv(
        &cp,
        "apps.h11plugin",
        support::status_for("apps", &["h11-gone"]),
    )
    .await;
    sv(&["audit"], 1, "apps.h11plugin h11-gone");
    let out = sv(&["audit", "--output", "json"], 1, "h11-gone");
    let report: Value = serde_json::from_slice(&out.stdout).expect("audit JSON");
    assert!(report.to_string().contains("h11-gone"), "{report}");

    // Switching kubectl's current context switches the plugin's cluster.
    let out = run(k().args(["config", "use-context", "nowhere"]), None);
    assert!(out.status.success(), "{}", text(&out));
    sv(&["audit"], 2, "error");
    let out = run(k().args(["config", "use-context", &real_context]), None);
    assert!(out.status.success(), "{}", text(&out));
    sv(&["audit"], 1, "apps.h11plugin h11-gone");
}
