//! Shared by the operations tests (tests/operations.rs, tests/policy.rs, tests/kubectl_plugin.rs):
//! the pinned helm and promtool, running commands, the chart's files.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use super::{bin_dir, repo_root, ControlPlane};

pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/storageversion-webhook")
}

/// The plain Prometheus rules file (also the PrometheusRule's source).
pub fn rules_file() -> PathBuf {
    chart_dir().join("files/prometheus-rules.yaml")
}

pub fn dashboard_file() -> PathBuf {
    chart_dir().join("files/grafana-dashboard.json")
}

/// The pinned promtool (tests/controlplane/build, component `prometheus`).
pub fn promtool() -> Command {
    Command::new(bin_dir().join("promtool"))
}

/// The pinned helm, with its cache and config kept under the target dir (not $HOME).
pub fn helm() -> Command {
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("helm-home");
    let mut cmd = Command::new(bin_dir().join("helm"));
    cmd.current_dir(repo_root())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG");
    cmd
}

/// helm with `cp`'s admin kubeconfig.
pub fn helm_on(cp: &ControlPlane) -> Command {
    let mut cmd = helm();
    cmd.env("KUBECONFIG", &cp.kubeconfig);
    cmd
}

/// Runs `cmd` with `stdin`, capturing both outputs.
pub fn run(cmd: &mut Command, stdin: Option<&str>) -> Output {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("piped stdin");
        pipe.write_all(input.as_bytes()).expect("write stdin");
    }
    child.wait_with_output().expect("wait for command")
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`; panics with its output unless it succeeds; returns stdout.
pub fn ok(cmd: &mut Command, stdin: Option<&str>) -> String {
    let out = run(cmd, stdin);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}",
        out.status,
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `helm template svw <chart> --namespace svw-system <args>`, as parsed documents.
pub fn render(args: &[&str]) -> Vec<Value> {
    let yaml = ok(
        helm()
            .args(["template", "svw", "charts/storageversion-webhook"])
            .args(["--namespace", "svw-system"])
            .args(args),
        None,
    );
    serde_norway::Deserializer::from_str(&yaml)
        .filter_map(|doc| {
            let v: Value = serde::Deserialize::deserialize(doc).expect("rendered YAML");
            (!v.is_null()).then_some(v)
        })
        .collect()
}

pub fn kind_of(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or("")
}

/// The one rendered document of `kind`; panics if there is not exactly one.
pub fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| kind_of(d) == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}, got {}", found.len());
    found[0]
}
