//! What the documentation states and the binary does, kept equal, on the real binary (no
//! cluster, a second or two):
//!
//! - the README's rule table is byte for byte `rules --output markdown`;
//! - `rules --output json` and `check --output json` name each rule code with the one string
//!   text output, metrics and the README use (tried as a new user would: a bad apiServerID);
//! - every default the chart's `values.yaml` documents for a flag (`null: 30s`) is the default
//!   `serve --help` prints;
//! - the rules stay pure (no I/O or async crate, no other module of ours but `model`);
//! - nothing in the repository points at paths outside it or cites unnamed "spec §N" sections.
//!
//! Run alone: `cargo test --test docs_in_sync`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs the real binary; returns stdout, after checking the exit status.
fn webhook(args: &[&str], stdin: Option<&str>, want_status: i32) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_storageversion-webhook"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start storageversion-webhook");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("write stdin");
    }
    drop(input);
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    assert_eq!(
        out.status.code(),
        Some(want_status),
        "{args:?}: stdout {stdout}\nstderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn readme_rule_table_is_the_rules_subcommand_output() {
    let readme = read("README.md");
    let begin =
        "<!-- rules:begin (generated: storageversion-webhook rules --output markdown) -->\n";
    let start = readme
        .find(begin)
        .expect("README.md has the rules:begin marker")
        + begin.len();
    let len = readme[start..]
        .find("<!-- rules:end -->")
        .expect("README.md has the rules:end marker");
    let generated = webhook(&["rules", "--output", "markdown"], None, 0);
    assert_eq!(
        &readme[start..start + len],
        generated,
        "README.md's rule table differs from `storageversion-webhook rules --output markdown`: \
         paste that output between the markers"
    );
}

#[test]
fn every_output_names_a_code_the_same_way() {
    let rules: serde_json::Value =
        serde_json::from_str(&webhook(&["rules", "--output", "json"], None, 0)).expect("json");
    let codes: Vec<&str> = rules
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| r["code"].as_str().expect("code"))
        .collect();
    assert!(codes.contains(&"apiserverid-invalid"), "{codes:?}");
    let text = webhook(&["rules"], None, 0);
    for code in &codes {
        assert!(text.contains(code), "`rules` text lacks {code}");
    }

    // A new user's first try: an apiServerID with an underscore, through both outputs of check.
    let object = r#"{"apiVersion":"internal.apiserver.k8s.io/v1alpha1","kind":"StorageVersion",
        "metadata":{"name":"apps.deployments"},"spec":{},
        "status":{"storageVersions":[{"apiServerID":"bad_id","encodingVersion":"apps/v1",
        "decodableVersions":["apps/v1"]}],"commonEncodingVersion":"apps/v1"}}"#;
    let json: serde_json::Value = serde_json::from_str(&webhook(
        &["check", "--output", "json", "-"],
        Some(object),
        1,
    ))
    .expect("check json");
    let mut found = Vec::new();
    codes_in(&json, &mut found);
    assert_eq!(found, ["apiserverid-invalid"], "{json}");
    let text = webhook(&["check", "-"], Some(object), 1);
    assert!(text.contains("[apiserverid-invalid]"), "{text}");
    for code in &found {
        assert!(codes.contains(&code.as_str()), "{code} is not in `rules`");
    }
}

/// Every `"code"` string anywhere in a JSON document.
fn codes_in(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v.as_str()) {
                    ("code", Some(code)) => out.push(code.to_string()),
                    _ => codes_in(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| codes_in(v, out)),
        _ => {}
    }
}

/// `serve --help`'s `[default: ...]` of every flag that has one.
fn help_defaults() -> BTreeMap<String, (String, Option<String>)> {
    let help = webhook(&["serve", "--help"], None, 0);
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in help.lines().chain(std::iter::once("  --end")) {
        let trimmed = line.trim_start();
        let is_flag =
            trimmed.starts_with("--") || trimmed.starts_with("-h,") || trimmed.starts_with("-V,");
        if is_flag {
            if let Some((flag, body)) = current.take() {
                let default = body
                    .find("[default: ")
                    .map(|i| body[i + 10..].split(']').next().unwrap_or("").to_string());
                out.insert(flag, (body, default));
            }
            let flag = trimmed
                .trim_start_matches("-h, ")
                .split([' ', '='])
                .next()
                .unwrap_or("")
                .to_string();
            current = Some((flag, String::new()));
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(trimmed);
            body.push(' ');
        }
    }
    out
}

#[test]
fn chart_documents_the_binarys_defaults() {
    let help = help_defaults();
    let values = read("charts/storageversion-webhook/values.yaml");
    let mut comment = String::new();
    let mut checked = 0;
    for line in values.lines() {
        let trimmed = line.trim_start();
        if let Some(text) = trimmed.strip_prefix('#') {
            comment.push_str(text);
            comment.push(' ');
            continue;
        }
        let block = std::mem::take(&mut comment);
        // The flag the value sets: the first `--flag` in backticks in its comment.
        let Some(flag) = block
            .split('`')
            .skip(1)
            .step_by(2)
            .find(|s| s.starts_with("--"))
            .map(|s| s.split([' ', '/']).next().unwrap_or(s).to_string())
        else {
            continue;
        };
        let documented = [("null: ", ""), ("binary's default is ", "")]
            .iter()
            .find_map(|(marker, _)| block.find(marker).map(|i| &block[i + marker.len()..]))
            .map(|rest| {
                rest.split_whitespace()
                    .next()
                    .unwrap_or("")
                    .trim_end_matches(['.', ',', ')'])
                    .trim_matches('`')
                    .to_string()
            });
        let Some(documented) = documented else {
            continue;
        };
        let Some((body, default)) = help.get(&flag) else {
            // Logging flags are global: they are on every subcommand's help, checked below.
            if flag.starts_with("--log-") {
                let body = webhook(&["serve", "--help"], None, 0);
                assert!(body.contains(&flag), "{flag} not in serve --help");
                continue;
            }
            panic!("values.yaml documents {flag}, which `serve --help` does not have");
        };
        match default {
            Some(d) => assert_eq!(
                &documented, d,
                "values.yaml documents {flag} as {documented}, `serve --help` says [default: {d}]"
            ),
            // No clap default (an optional flag): the documented meaning must be in its help.
            None => assert!(
                body.to_lowercase().contains(&documented.to_lowercase()),
                "values.yaml documents {flag} as {documented:?}; its --help says: {body}"
            ),
        }
        checked += 1;
    }
    assert!(
        checked >= 12,
        "only {checked} documented defaults found in values.yaml"
    );
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn rules_are_pure() {
    let mut files = Vec::new();
    rust_files(&root().join("src/rules"), &mut files);
    files.push(root().join("src/gc/plan.rs"));
    // Crates and modules the pure core must not import, and calls it must not make.
    let forbidden_imports = [
        "tokio",
        "kube",
        "futures",
        "hyper",
        "axum",
        "tracing",
        "std::fs",
        "std::net",
        "std::io",
        "std::thread",
        "std::env",
        "crate::leases",
        "crate::server",
        "crate::admission",
        "crate::metrics",
        "crate::gc",
        "crate::check",
        "crate::audit",
        "crate::kubeclient",
    ];
    let forbidden_calls = [
        "Timestamp::now",
        "SystemTime::now",
        "Instant::now",
        "async fn",
        "tokio::",
        "std::fs::",
    ];
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        // Only the code, not its tests (which may build fixtures however they like).
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let mut in_use = false;
        for line in code.lines() {
            let t = line.trim_start();
            if t.starts_with("use ")
                || t.starts_with("pub use ")
                || t.starts_with("pub(crate) use ")
            {
                in_use = true;
            }
            if in_use {
                let path = t
                    .trim_start_matches("pub(crate) ")
                    .trim_start_matches("pub ")
                    .trim_start_matches("use ");
                for word in forbidden_imports {
                    assert!(
                        !(path.starts_with(word) || path.contains(&format!("{{{word}")) || path.contains(&format!(" {word}"))),
                        "{} imports {word}: the rules and the GC plan are pure (docs/ARCHITECTURE.md)",
                        file.display()
                    );
                }
                in_use = !t.ends_with(';');
            }
            if t.starts_with("//") {
                continue;
            }
            for call in forbidden_calls {
                assert!(
                    !t.contains(call),
                    "{} uses {call}: the rules and the GC plan are pure (docs/ARCHITECTURE.md)",
                    file.display()
                );
            }
        }
    }
}

#[test]
fn nothing_points_outside_the_repository() {
    let listed = Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root())
        .output()
        .expect("git ls-files");
    let listed = String::from_utf8(listed.stdout).expect("utf-8");
    // Spelled in pieces so that this file does not itself name a path outside the repository.
    const OUTSIDE: [&str; 3] = [
        concat!("..", "/", "shared"),
        concat!("/", "work", "/"),
        "spec §",
    ];
    let mut offenders = Vec::new();
    for file in listed.lines() {
        if file == "tests/docs_in_sync.rs" || file.ends_with(".lock") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root().join(file)) else {
            continue; // binary, or deleted but not yet staged
        };
        for (n, line) in text.lines().enumerate() {
            if OUTSIDE.iter().any(|needle| line.contains(needle)) {
                offenders.push(format!("{file}:{}: {line}", n + 1));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "references outside the repository:\n{}",
        offenders.join("\n")
    );
}
