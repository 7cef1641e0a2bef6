//! The operations kit: the alerting rules (`files/prometheus-rules.yaml` and the chart's
//! PrometheusRule), the Grafana dashboard, and the metrics both name.
//!
//! * The rules pass `promtool check rules` and `promtool test rules` on series written here:
//!   every alert fires on its condition (with its labels and rendered annotations) and stays
//!   quiet otherwise.
//! * The PrometheusRule the chart renders carries exactly the rules file; the dashboard ConfigMap
//!   carries exactly the dashboard JSON.
//! * Every dashboard query parses with promtool.
//! * Every metric an alert or a panel names is exported by the real `serve` (scraped from
//!   `/metrics` after real traffic through a real kube-apiserver), with the label values the
//!   alerts select on: a renamed metric or label fails here.
//!
//! promtool and helm come from tests/controlplane/build.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use regex::Regex;
use serde_json::{json, Value};

use support::gc::{create_lease, delete_lease, seed_sv};
use support::ops::{self, ok, render, run, text};
use support::{
    live_identity_lease, poll_until, register_webhook, serial, Certs, ControlPlane, Webhook,
};

// ------------------------------------------------------------------------------ helpers --

fn rules() -> Value {
    let text = std::fs::read_to_string(ops::rules_file()).expect("read the rules file");
    serde_norway::from_str(&text).expect("the rules file is YAML")
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(ops::dashboard_file()).expect("read the dashboard");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every alerting rule: (group, rule).
fn alert_rules(rules: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for group in rules["groups"].as_array().expect("groups") {
        let name = group["name"].as_str().expect("group name").to_string();
        for rule in group["rules"].as_array().expect("rules") {
            out.push((name.clone(), rule.clone()));
        }
    }
    out
}

/// Every panel query of the dashboard: (panel title, expr).
fn panel_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().expect("panel title").to_string();
        let targets = panel["targets"].as_array().expect("panel targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for t in targets {
            out.push((title.clone(), t["expr"].as_str().expect("expr").to_string()));
        }
    }
    out
}

/// Grafana's template variables replaced by values Prometheus understands.
fn without_grafana_variables(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$namespace", ".*")
}

/// `promtool <command> rules FILE` on `content` written to a temp file named `name`.
fn promtool_rules(command: &str, name: &str, content: &Value) -> std::process::Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    // JSON is YAML.
    std::fs::write(&path, content.to_string()).expect("write temp file");
    run(ops::promtool().args([command, "rules"]).arg(&path), None)
}

// ------------------------------------------------------------------- promtool: alerts --

/// One expected firing alert: its labels, and the placeholders of its annotations filled in.
fn firing(alert: &str, labels: Value, fill: &[(&str, &str)]) -> Value {
    let rules = rules();
    let rule = alert_rules(&rules)
        .into_iter()
        .map(|(_, r)| r)
        .find(|r| r["alert"] == alert)
        .unwrap_or_else(|| panic!("no alert {alert} in the rules file"));
    let mut annotations = serde_json::Map::new();
    for (k, v) in rule["annotations"].as_object().expect("annotations") {
        let mut s = v.as_str().expect("annotation").to_string();
        for (placeholder, value) in fill {
            s = s.replace(placeholder, value);
        }
        assert!(
            !s.contains("{{"),
            "{alert}: annotation {k} has an unfilled placeholder: {s}"
        );
        annotations.insert(k.clone(), json!(s));
    }
    json!({"exp_labels": labels, "exp_annotations": annotations})
}

fn check(alert: &str, at: &str, expected: Vec<Value>) -> Value {
    json!({"eval_time": at, "alertname": alert, "exp_alerts": expected})
}

/// A check that `alert` fires at `at` with `labels` (and its annotations filled with `fill`).
fn fires(alert: &str, at: &str, labels: Value, fill: &[(&str, &str)]) -> Value {
    check(alert, at, vec![firing(alert, labels, fill)])
}

/// A check that `alert` does not fire at `at`.
fn quiet(alert: &str, at: &str) -> Value {
    check(alert, at, vec![])
}

/// Checks that `alert` is quiet at `quiet_at` and fires at `fire_at` with `labels`.
fn quiet_then_fires(alert: &str, quiet_at: &str, fire_at: &str, labels: Value) -> Vec<Value> {
    vec![
        quiet(alert, quiet_at),
        fires(alert, fire_at, labels, FILL_POD),
    ]
}

/// The lease view's staleness and synced series of pod svw-0.
fn lease_view(staleness: &str, synced: &str) -> Value {
    json!([
        pod_series(
            "storageversion_webhook_lease_view_staleness_seconds",
            staleness
        ),
        pod_series("storageversion_webhook_lease_view_synced", synced),
    ])
}

/// The GC leader series of pods svw-0 and svw-1.
fn gc_leaders(svw0: &str, svw1: &str) -> Value {
    json!([
        pod_series("storageversion_webhook_gc_leader", svw0),
        s(
            r#"storageversion_webhook_gc_leader{namespace="svw",pod="svw-1"}"#,
            svw1
        ),
    ])
}

fn case(series: Value, checks: Vec<Value>) -> Value {
    json!({"interval": "1m", "input_series": series, "alert_rule_test": checks})
}

fn s(series: &str, values: &str) -> Value {
    json!({"series": series, "values": values})
}

const POD: &str = r#"namespace="svw",pod="svw-0""#;

/// The series `metric{POD}` with `values`.
fn pod_series(metric: &str, values: &str) -> Value {
    s(&format!("{metric}{{{POD}}}"), values)
}

fn pod_labels(severity: &str) -> Value {
    json!({"namespace": "svw", "pod": "svw-0", "severity": severity})
}

fn ns_labels(severity: &str) -> Value {
    json!({"namespace": "svw", "severity": severity})
}

const FILL_POD: &[(&str, &str)] = &[
    ("{{ $labels.pod }}", "svw-0"),
    ("{{ $labels.namespace }}", "svw"),
];

/// The alert unit tests: for each alert, series that must make it fire (when, with which labels
/// and annotations) and series that must not.
fn alert_cases() -> Vec<Value> {
    let reviews = "storageversion_webhook_admission_reviews_total";
    let denied_by_apiserver = format!(
        r#"{reviews}{{{POD},operation="UPDATE",subresource="status",requester="apiserver",verdict="denied"}}"#
    );
    // The latency histogram's series for the buckets 5 ms, 100 ms, 250 ms and +Inf.
    let buckets = |values: [&str; 4]| {
        let series = ["0.005", "0.1", "0.25", "+Inf"].iter().zip(values).map(|(le, v)| {
            s(
                &format!(
                    r#"storageversion_webhook_admission_review_duration_seconds_bucket{{{POD},le="{le}"}}"#
                ),
                v,
            )
        });
        Value::Array(series.collect())
    };
    let expiry = "storageversion_webhook_serving_certificate_expiry_seconds";
    vec![
        // Unavailable: nothing scraped at all, then a replica that is not ready.
        case(
            json!([]),
            vec![
                quiet("StorageVersionWebhookUnavailable", "4m"),
                fires(
                    "StorageVersionWebhookUnavailable",
                    "6m",
                    json!({"severity": "critical"}),
                    &[],
                ),
            ],
        ),
        case(
            json!([
                pod_series("storageversion_webhook_ready", "0x20"),
                s(
                    r#"storageversion_webhook_ready{namespace="svw",pod="svw-1"}"#,
                    "1x20"
                ),
            ]),
            vec![
                quiet("StorageVersionWebhookUnavailable", "15m"),
                quiet("StorageVersionWebhookNotReady", "9m"),
                fires(
                    "StorageVersionWebhookNotReady",
                    "11m",
                    pod_labels("warning"),
                    FILL_POD,
                ),
            ],
        ),
        case(
            json!([pod_series("storageversion_webhook_ready", "0x20")]),
            vec![fires(
                "StorageVersionWebhookUnavailable",
                "6m",
                json!({"severity": "critical"}),
                &[],
            )],
        ),
        // A denied apiserver write: the first one (the series appears at 1), and later ones;
        // the alert ends 10 minutes after the last. Denials of other requesters, and allowed
        // apiserver writes, never fire it.
        case(
            json!([s(&denied_by_apiserver, "_x10 1x30")]),
            vec![
                quiet("StorageVersionWebhookDeniedAPIServerWrite", "9m"),
                fires(
                    "StorageVersionWebhookDeniedAPIServerWrite",
                    "11m",
                    ns_labels("critical"),
                    FILL_POD,
                ),
                quiet("StorageVersionWebhookDeniedAPIServerWrite", "22m"),
            ],
        ),
        case(
            json!([s(&denied_by_apiserver, "0x10 3x30")]),
            vec![
                quiet("StorageVersionWebhookDeniedAPIServerWrite", "9m"),
                fires(
                    "StorageVersionWebhookDeniedAPIServerWrite",
                    "12m",
                    ns_labels("critical"),
                    FILL_POD,
                ),
                quiet("StorageVersionWebhookDeniedAPIServerWrite", "25m"),
            ],
        ),
        case(
            json!([
                s(
                    &format!(
                        r#"{reviews}{{{POD},operation="UPDATE",subresource="status",requester="other",verdict="denied"}}"#
                    ),
                    "_x5 1+1x30"
                ),
                s(
                    &format!(
                        r#"{reviews}{{{POD},operation="UPDATE",subresource="status",requester="apiserver",verdict="allowed"}}"#
                    ),
                    "_x5 1+10x30"
                ),
            ]),
            vec![
                quiet("StorageVersionWebhookDeniedAPIServerWrite", "7m"),
                quiet("StorageVersionWebhookDeniedAPIServerWrite", "20m"),
            ],
        ),
        // Lease view stale (watch broken for more than 60 s), or never synced.
        case(
            lease_view("0 0 90+60x20", "1x20"),
            quiet_then_fires(
                "StorageVersionWebhookLeaseViewStale",
                "5m",
                "8m",
                pod_labels("warning"),
            ),
        ),
        case(
            lease_view("0x20", "0x20"),
            vec![fires(
                "StorageVersionWebhookLeaseViewStale",
                "6m",
                pod_labels("warning"),
                FILL_POD,
            )],
        ),
        case(
            lease_view("0 30 0 45 0x20", "1x20"),
            vec![quiet("StorageVersionWebhookLeaseViewStale", "15m")],
        ),
        // Admission p99: every review between 100 and 250 ms fires it; below 5 ms does not.
        case(
            buckets(["0x30", "0x30", "0+60x30", "0+60x30"]),
            quiet_then_fires(
                "StorageVersionWebhookSlowAdmission",
                "8m",
                "20m",
                ns_labels("warning"),
            ),
        ),
        case(
            buckets(["0+600x30", "0+600x30", "0+600x30", "0+600x30"]),
            vec![quiet("StorageVersionWebhookSlowAdmission", "20m")],
        ),
        // Certificate expiry: 11.5 days left warns after an hour; 1.2 days is also critical at
        // once; 30 days is quiet.
        case(
            json!([s(&format!("{expiry}{{{POD}}}"), "1000000x90")]),
            vec![
                quiet("StorageVersionWebhookCertificateExpiringSoon", "30m"),
                check(
                    "StorageVersionWebhookCertificateExpiringSoon",
                    "61m",
                    vec![firing(
                        "StorageVersionWebhookCertificateExpiringSoon",
                        ns_labels("warning"),
                        &[
                            ("{{ $labels.namespace }}", "svw"),
                            ("{{ $value | humanizeDuration }}", "11d 13h 46m 40s"),
                        ],
                    )],
                ),
                quiet("StorageVersionWebhookCertificateExpiryCritical", "61m"),
            ],
        ),
        case(
            json!([s(&format!("{expiry}{{{POD}}}"), "100000x10")]),
            vec![check(
                "StorageVersionWebhookCertificateExpiryCritical",
                "1m",
                vec![firing(
                    "StorageVersionWebhookCertificateExpiryCritical",
                    ns_labels("critical"),
                    &[
                        ("{{ $labels.namespace }}", "svw"),
                        ("{{ $value | humanizeDuration }}", "1d 3h 46m 40s"),
                    ],
                )],
            )],
        ),
        case(
            json!([s(&format!("{expiry}{{{POD}}}"), "2592000x90")]),
            vec![quiet("StorageVersionWebhookCertificateExpiringSoon", "80m")],
        ),
        // No GC leader among the replicas for 10 minutes; one leader is quiet.
        case(
            gc_leaders("1 1 0x20", "0x22"),
            quiet_then_fires(
                "StorageVersionGCNoLeader",
                "10m",
                "13m",
                ns_labels("warning"),
            ),
        ),
        case(
            gc_leaders("0x20", "1x20"),
            vec![quiet("StorageVersionGCNoLeader", "15m")],
        ),
        // GC errors in every 5-minute window for 15 minutes; a single burst is quiet.
        case(
            json!([s(
                &format!(
                    r#"storageversion_webhook_gc_errors_total{{{POD},operation="update_status"}}"#
                ),
                "0+1x40"
            ),]),
            quiet_then_fires(
                "StorageVersionGCFailing",
                "10m",
                "20m",
                ns_labels("warning"),
            ),
        ),
        case(
            json!([s(
                &format!(
                    r#"storageversion_webhook_gc_errors_total{{{POD},operation="list_leases"}}"#
                ),
                "0 0 5x40"
            ),]),
            vec![quiet("StorageVersionGCFailing", "30m")],
        ),
        // Stale entries for 15 minutes; a few minutes (the collector's grace) are quiet.
        case(
            json!([pod_series(
                "storageversion_webhook_gc_stale_entries",
                "3x20"
            )]),
            vec![
                quiet("StorageVersionStaleEntries", "14m"),
                check(
                    "StorageVersionStaleEntries",
                    "16m",
                    vec![firing(
                        "StorageVersionStaleEntries",
                        ns_labels("warning"),
                        &[("{{ $labels.namespace }}", "svw"), ("{{ $value }}", "3")],
                    )],
                ),
            ],
        ),
        case(
            json!([pod_series(
                "storageversion_webhook_gc_stale_entries",
                "2x6 0x30"
            )]),
            vec![quiet("StorageVersionStaleEntries", "20m")],
        ),
    ]
}

#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let out = run(
        ops::promtool()
            .args(["check", "rules"])
            .arg(ops::rules_file()),
        None,
    );
    assert!(
        out.status.success(),
        "promtool check rules:\n{}",
        text(&out)
    );
    let out_text = text(&out);
    assert!(out_text.contains("SUCCESS"), "{out_text}");

    // Every alert is tested, fires at least once and has a runbook section.
    let cases = alert_cases();
    let tested: BTreeSet<String> = cases
        .iter()
        .flat_map(|c| c["alert_rule_test"].as_array().cloned().unwrap_or_default())
        .filter(|c| !c["exp_alerts"].as_array().is_some_and(|a| a.is_empty()))
        .map(|c| c["alertname"].as_str().unwrap_or_default().to_string())
        .collect();
    let runbook = std::fs::read_to_string(support::repo_root().join("docs/runbook.md"))
        .expect("docs/runbook.md");
    for (_, rule) in alert_rules(&rules()) {
        let name = rule["alert"].as_str().expect("alert name");
        assert!(tested.contains(name), "no firing test case for {name}");
        let anchor = format!("docs/runbook.md#{}", name.to_lowercase());
        assert_eq!(
            rule["annotations"]["runbook_url"], anchor,
            "{name}: runbook_url"
        );
        assert!(
            runbook.contains(&format!("## {name}")),
            "docs/runbook.md has no section ## {name}"
        );
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["warning", "critical"].contains(&severity),
            "{name}: severity {severity:?}"
        );
    }

    let tests = json!({
        "rule_files": [ops::rules_file().display().to_string()],
        "evaluation_interval": "1m",
        "tests": cases,
    });
    let out = promtool_rules("test", "alerts_test.yaml", &tests);
    assert!(
        out.status.success(),
        "promtool test rules failed:\n{}",
        text(&out)
    );
}

// --------------------------------------------------------------- promtool: dashboard --

#[test]
fn every_dashboard_query_parses_with_promtool() {
    let dashboard = dashboard();
    let queries = panel_queries(&dashboard);
    assert!(queries.len() >= 15, "only {} queries", queries.len());
    let titles: BTreeSet<&str> = queries.iter().map(|(t, _)| t.as_str()).collect();
    for needed in [
        "Reviews per second by verdict",
        "Review latency",
        "Findings by rule code",
        "Lease view staleness",
        "Leader",
        "Stale entries (leader's view)",
        "Serving certificate expiry",
    ] {
        assert!(titles.contains(needed), "no panel {needed:?}");
    }
    // Each query as a recording rule: promtool parses and checks every one.
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| {
            json!({"record": format!("svw:dashboard_query_{i}"), "expr": without_grafana_variables(expr)})
        })
        .collect();
    let file = json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let out = promtool_rules("check", "dashboard_rules.yaml", &file);
    assert!(
        out.status.success(),
        "a dashboard query does not parse:\n{}",
        text(&out)
    );
    assert!(
        text(&out).contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{}",
        text(&out)
    );

    // A query that does not parse is caught (the check can fail).
    let bad = json!({"groups": [{"name": "bad", "rules": [{"record": "svw:bad", "expr": "sum by (verdict (rate(x[5m]))"}]}]});
    let out = promtool_rules("check", "bad_rules.yaml", &bad);
    assert!(!out.status.success(), "promtool accepted a broken query");
}

// ------------------------------------------------------------------------- chart --

#[test]
fn chart_renders_the_rules_file_and_the_dashboard_opt_in() {
    let default = render(&[]);
    for kind in ["PrometheusRule", "ValidatingAdmissionPolicy"] {
        assert!(
            default.iter().all(|d| ops::kind_of(d) != kind),
            "{kind} rendered by default"
        );
    }
    assert!(
        default
            .iter()
            .all(|d| d["metadata"]["labels"]["grafana_dashboard"].is_null()),
        "a dashboard ConfigMap rendered by default"
    );

    let docs = render(&[
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "prometheusRule.labels.release=prometheus",
        "--set",
        "grafanaDashboard.enabled=true",
    ]);
    let rule = ops::one(&docs, "PrometheusRule");
    assert_eq!(
        rule["spec"]["groups"],
        rules()["groups"],
        "the PrometheusRule differs from files/prometheus-rules.yaml"
    );
    assert_eq!(rule["metadata"]["namespace"], "svw-system");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");

    let cm = docs
        .iter()
        .find(|d| {
            ops::kind_of(d) == "ConfigMap" && d["metadata"]["labels"]["grafana_dashboard"] == "1"
        })
        .expect("a ConfigMap labelled grafana_dashboard: \"1\"");
    let json_text = cm["data"]["storageversion-webhook.json"]
        .as_str()
        .expect("dashboard JSON in the ConfigMap");
    let embedded: Value = serde_json::from_str(json_text).expect("the embedded dashboard is JSON");
    assert_eq!(embedded, dashboard());

    // Without the collector, its alerts are left out; the rest stay.
    let no_gc = render(&[
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "gc.enabled=false",
    ]);
    let groups: Vec<&str> = ops::one(&no_gc, "PrometheusRule")["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    assert_eq!(groups, vec!["storageversion-webhook"]);

    // The rendered PrometheusRule's spec is itself a rules file promtool accepts.
    let out = promtool_rules("check", "rendered_rules.yaml", &rule["spec"]);
    assert!(out.status.success(), "{}", text(&out));
}

// ------------------------------------------------------- metrics against real serve --

/// A metric named in a query, with the matchers written next to it.
#[derive(Debug)]
struct Selector {
    name: String,
    matchers: Vec<(String, String, String)>,
}

/// The `storageversion_webhook_*` selectors and the `by (...)` labels of `expr`.
fn selectors(expr: &str) -> (Vec<Selector>, Vec<String>) {
    let sel = Regex::new(r"\b(storageversion_webhook_[a-z0-9_]+)\s*(\{[^}]*\})?").expect("regex");
    let matcher =
        Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)""#).expect("regex");
    let by = Regex::new(r"\b(?:by|without)\s*\(([^)]*)\)").expect("regex");
    let selectors = sel
        .captures_iter(expr)
        .map(|c| Selector {
            name: c[1].to_string(),
            matchers: c
                .get(2)
                .map(|m| {
                    matcher
                        .captures_iter(m.as_str())
                        .map(|m| (m[1].to_string(), m[2].to_string(), m[3].to_string()))
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    let grouping = by
        .captures_iter(expr)
        .flat_map(|c| {
            c[1].split(',')
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
        })
        .collect();
    (selectors, grouping)
}

/// A scrape: family types from `# TYPE`, and samples (name, labels).
struct Scrape {
    types: BTreeMap<String, String>,
    samples: Vec<(String, BTreeMap<String, String>)>,
}

fn parse_scrape(body: &str) -> Scrape {
    let label = Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)""#).expect("regex");
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                types.insert(name.to_string(), kind.to_string());
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = line[..name_end].to_string();
        let labels = match (line.find('{'), line.rfind('}')) {
            (Some(a), Some(b)) if a < b => label
                .captures_iter(&line[a + 1..b])
                .map(|c| (c[1].to_string(), c[2].to_string()))
                .collect(),
            _ => BTreeMap::new(),
        };
        samples.push((name, labels));
    }
    Scrape { types, samples }
}

/// The family a sample name belongs to, and the type it must have.
fn family_of(name: &str) -> (&str, &[&str]) {
    if let Some(f) = name.strip_suffix("_total") {
        return (f, &["counter"]);
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(f) = name.strip_suffix(suffix) {
            return (f, &["histogram"]);
        }
    }
    (name, &["gauge"])
}

/// Labels Prometheus adds or histograms carry, never on a metric's own samples.
const TARGET_LABELS: &[&str] = &["namespace", "pod", "instance", "job", "le"];

/// Families that may have no sample in the test's scrape: nothing in the test makes the collector
/// fail. A labelled family without samples is not in the scrape at all (no `# TYPE` either), so
/// this one is checked only when it has samples.
const MAY_HAVE_NO_SAMPLES: &[&str] = &["storageversion_webhook_gc_errors_total"];

/// Checks every query against a scrape; returns the problems.
fn problems(queries: &[(String, String)], scrape: &Scrape) -> Vec<String> {
    let mut problems = Vec::new();
    for (what, expr) in queries {
        let (sels, grouping) = selectors(expr);
        assert!(
            !sels.is_empty(),
            "{what}: names no storageversion_webhook metric: {expr}"
        );
        for sel in &sels {
            let (family, kinds) = family_of(&sel.name);
            match scrape.types.get(family) {
                Some(t) if kinds.contains(&t.as_str()) => {}
                Some(t) => {
                    problems.push(format!(
                        "{what}: {} is a {t}, the query reads it as {kinds:?}",
                        sel.name
                    ));
                    continue;
                }
                None => {
                    if !MAY_HAVE_NO_SAMPLES.contains(&sel.name.as_str()) {
                        problems.push(format!("{what}: {} is not exported", sel.name));
                    }
                    continue;
                }
            }
            let samples: Vec<&BTreeMap<String, String>> = scrape
                .samples
                .iter()
                .filter(|(n, _)| *n == sel.name)
                .map(|(_, l)| l)
                .collect();
            if samples.is_empty() {
                if !MAY_HAVE_NO_SAMPLES.contains(&sel.name.as_str()) {
                    problems.push(format!(
                        "{what}: {} has no sample after the test's traffic",
                        sel.name
                    ));
                }
                continue;
            }
            for (label, op, value) in &sel.matchers {
                if TARGET_LABELS.contains(&label.as_str()) {
                    continue;
                }
                let hit = samples.iter().any(|l| match op.as_str() {
                    "=" => l.get(label) == Some(value),
                    _ => l.contains_key(label),
                });
                if !hit {
                    problems.push(format!(
                        "{what}: no sample of {} has {label}{op}{value:?}",
                        sel.name
                    ));
                }
            }
        }
        for label in &grouping {
            if TARGET_LABELS.contains(&label.as_str()) {
                continue;
            }
            let carried = sels.iter().any(|sel| {
                scrape
                    .samples
                    .iter()
                    .any(|(n, l)| *n == sel.name && l.contains_key(label))
            });
            let all_empty = sels.iter().all(|sel| {
                MAY_HAVE_NO_SAMPLES.contains(&sel.name.as_str())
                    && !scrape.samples.iter().any(|(n, _)| *n == sel.name)
            });
            if !carried && !all_empty {
                problems.push(format!(
                    "{what}: groups by {label}, which no sample carries"
                ));
            }
        }
    }
    problems
}

#[test]
fn the_name_check_catches_renames() {
    let scrape = parse_scrape(
        "# TYPE storageversion_webhook_ready gauge\nstorageversion_webhook_ready 1\n\
         # TYPE storageversion_webhook_admission_reviews counter\n\
         storageversion_webhook_admission_reviews_total{verdict=\"denied\",requester=\"apiserver\"} 1\n",
    );
    let q = |e: &str| vec![("q".to_string(), e.to_string())];
    assert!(problems(&q("storageversion_webhook_ready == 0"), &scrape).is_empty());
    assert!(problems(
        &q(r#"sum by (requester) (storageversion_webhook_admission_reviews_total{verdict="denied"})"#),
        &scrape
    )
    .is_empty());
    assert_eq!(
        problems(&q("storageversion_webhook_readiness == 0"), &scrape).len(),
        1
    );
    assert_eq!(
        problems(&q("storageversion_webhook_ready_total"), &scrape).len(),
        1
    );
    assert_eq!(
        problems(
            &q(r#"storageversion_webhook_admission_reviews_total{verdict="rejected"}"#),
            &scrape
        )
        .len(),
        1
    );
    assert_eq!(
        problems(
            &q("sum by (user) (storageversion_webhook_admission_reviews_total)"),
            &scrape
        )
        .len(),
        1
    );
}

/// Real traffic through a real kube-apiserver into the real `serve` (with the collector on),
/// then every metric and label value the alerts and panels name must be in its `/metrics`.
#[tokio::test(flavor = "multi_thread")]
async fn alerts_and_panels_name_only_exported_metrics() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let certs = Certs::generate();
    let hook = Webhook::start(
        &cp,
        &certs,
        &[
            "--gc-lease-deletion-grace=1s",
            "--gc-leader-lease-namespace=default",
        ],
    )
    .await;
    register_webhook(&cp, &hook.url(), &certs.ca_pem, "Fail").await;

    // 1. A write by kube-apiserver's identity that is denied (its lease does not exist).
    support::create_sv(&cp, "apps.h11widgets").await;
    let current = ok(
        cp.kubectl()
            .args(["get", "storageversion", "apps.h11widgets", "-o", "json"]),
        None,
    );
    let mut sv: Value = serde_json::from_str(&current).expect("StorageVersion JSON");
    sv["status"] = support::status_for("apps", &["h11-no-such-apiserver"]);
    let out = run(
        cp.kubectl().args([
            "replace",
            "--subresource=status",
            "--as=system:apiserver",
            "--as-group=system:masters",
            "-f",
            "-",
        ]),
        Some(&sv.to_string()),
    );
    assert!(
        !out.status.success(),
        "the write was not denied:\n{}",
        text(&out)
    );
    assert!(text(&out).contains("lease-missing"), "{}", text(&out));

    // 2. An entry of an apiserver whose lease then goes: the collector removes it.
    create_lease(&cp, &live_identity_lease("h11-departed")).await;
    seed_sv(
        &cp,
        "apps.h11gadgets",
        support::status_for("apps", &["h11-departed"]),
    )
    .await;
    delete_lease(&cp, "h11-departed").await;

    // 3. A request that is not an AdmissionReview, over TLS.
    let out = run(
        std::process::Command::new("curl").args([
            "-sS",
            "--cacert",
            &certs.ca_file.display().to_string(),
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "--data",
            "not json",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &hook.url(),
        ]),
        None,
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "400",
        "{}",
        text(&out)
    );

    let hook_ref = &hook;
    poll_until(
        Duration::from_secs(60),
        "the collector to remove the entry",
        move || async move {
            support::metric_sum(
                &hook_ref.metrics().await,
                "storageversion_webhook_gc_entries_removed_total",
                &[],
            ) >= 1.0
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));

    // 4. A certificate reload (a new pair written over the served files), last: kube-apiserver's
    // caBundle no longer matches afterwards.
    let next = Certs::generate();
    std::fs::copy(&next.cert_file, &certs.cert_file).expect("write the new certificate");
    std::fs::copy(&next.key_file, &certs.key_file).expect("write the new key");
    poll_until(
        Duration::from_secs(30),
        "the certificate reload to be counted",
        move || async move {
            hook_ref
                .metrics()
                .await
                .contains("storageversion_webhook_tls_certificate_reloads_total{")
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));

    let body = hook.metrics().await;
    let scrape = parse_scrape(&body);
    let mut queries: Vec<(String, String)> = alert_rules(&rules())
        .into_iter()
        .map(|(_, r)| {
            (
                format!("alert {}", r["alert"].as_str().unwrap_or_default()),
                r["expr"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    queries.extend(
        panel_queries(&dashboard())
            .into_iter()
            .map(|(t, e)| (format!("panel {t:?}"), without_grafana_variables(&e))),
    );
    for var in dashboard()["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(q) = var["definition"].as_str() {
            queries.push((format!("variable {}", var["name"]), q.to_string()));
        }
    }
    let found = problems(&queries, &scrape);
    assert!(
        found.is_empty(),
        "alerts or panels name what serve does not export:\n{}\n\n/metrics:\n{body}",
        found.join("\n")
    );
}
