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

use support::ops::{self, ok, render, run, text};
use support::{
    leases, live_identity_lease, poll_until, register_webhook, serial, Certs, ControlPlane, Webhook,
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

/// Writes `content` to a new temp file named `name`; returns the dir (keep it alive).
fn temp_file(name: &str, content: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    std::fs::write(&path, content).expect("write temp file");
    (dir, path)
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

fn case(series: Value, checks: Vec<Value>) -> Value {
    json!({"interval": "1m", "input_series": series, "alert_rule_test": checks})
}

fn s(series: &str, values: &str) -> Value {
    json!({"series": series, "values": values})
}

const POD: &str = r#"namespace="svw",pod="svw-0""#;

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
    let bucket = |le: &str| {
        format!(
            r#"storageversion_webhook_admission_review_duration_seconds_bucket{{{POD},le="{le}"}}"#
        )
    };
    let expiry = "storageversion_webhook_serving_certificate_expiry_seconds";
    vec![
        // Unavailable: nothing scraped at all, then a replica that is not ready.
        case(
            json!([]),
            vec![
                check("StorageVersionWebhookUnavailable", "4m", vec![]),
                check(
                    "StorageVersionWebhookUnavailable",
                    "6m",
                    vec![firing(
                        "StorageVersionWebhookUnavailable",
                        json!({"severity": "critical"}),
                        &[],
                    )],
                ),
            ],
        ),
        case(
            json!([
                s(&format!("storageversion_webhook_ready{{{POD}}}"), "0x20"),
                s(
                    r#"storageversion_webhook_ready{namespace="svw",pod="svw-1"}"#,
                    "1x20"
                ),
            ]),
            vec![
                check("StorageVersionWebhookUnavailable", "15m", vec![]),
                check("StorageVersionWebhookNotReady", "9m", vec![]),
                check(
                    "StorageVersionWebhookNotReady",
                    "11m",
                    vec![firing(
                        "StorageVersionWebhookNotReady",
                        pod_labels("warning"),
                        FILL_POD,
                    )],
                ),
            ],
        ),
        case(
            json!([s(&format!("storageversion_webhook_ready{{{POD}}}"), "0x20")]),
            vec![check(
                "StorageVersionWebhookUnavailable",
                "6m",
                vec![firing(
                    "StorageVersionWebhookUnavailable",
                    json!({"severity": "critical"}),
                    &[],
                )],
            )],
        ),
        // A denied apiserver write: the first one (the series appears at 1), and later ones;
        // the alert ends 10 minutes after the last. Denials of other requesters, and allowed
        // apiserver writes, never fire it.
        case(
            json!([s(&denied_by_apiserver, "_x10 1x30")]),
            vec![
                check("StorageVersionWebhookDeniedAPIServerWrite", "9m", vec![]),
                check(
                    "StorageVersionWebhookDeniedAPIServerWrite",
                    "11m",
                    vec![firing(
                        "StorageVersionWebhookDeniedAPIServerWrite",
                        ns_labels("critical"),
                        FILL_POD,
                    )],
                ),
                check("StorageVersionWebhookDeniedAPIServerWrite", "22m", vec![]),
            ],
        ),
        case(
            json!([s(&denied_by_apiserver, "0x10 3x30")]),
            vec![
                check("StorageVersionWebhookDeniedAPIServerWrite", "9m", vec![]),
                check(
                    "StorageVersionWebhookDeniedAPIServerWrite",
                    "12m",
                    vec![firing(
                        "StorageVersionWebhookDeniedAPIServerWrite",
                        ns_labels("critical"),
                        FILL_POD,
                    )],
                ),
                check("StorageVersionWebhookDeniedAPIServerWrite", "25m", vec![]),
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
                check("StorageVersionWebhookDeniedAPIServerWrite", "7m", vec![]),
                check("StorageVersionWebhookDeniedAPIServerWrite", "20m", vec![]),
            ],
        ),
        // Lease view stale (watch broken for more than 60 s), or never synced.
        case(
            json!([
                s(
                    &format!("storageversion_webhook_lease_view_staleness_seconds{{{POD}}}"),
                    "0 0 90+60x20"
                ),
                s(
                    &format!("storageversion_webhook_lease_view_synced{{{POD}}}"),
                    "1x20"
                ),
            ]),
            vec![
                check("StorageVersionWebhookLeaseViewStale", "5m", vec![]),
                check(
                    "StorageVersionWebhookLeaseViewStale",
                    "8m",
                    vec![firing(
                        "StorageVersionWebhookLeaseViewStale",
                        pod_labels("warning"),
                        FILL_POD,
                    )],
                ),
            ],
        ),
        case(
            json!([
                s(
                    &format!("storageversion_webhook_lease_view_staleness_seconds{{{POD}}}"),
                    "0x20"
                ),
                s(
                    &format!("storageversion_webhook_lease_view_synced{{{POD}}}"),
                    "0x20"
                ),
            ]),
            vec![check(
                "StorageVersionWebhookLeaseViewStale",
                "6m",
                vec![firing(
                    "StorageVersionWebhookLeaseViewStale",
                    pod_labels("warning"),
                    FILL_POD,
                )],
            )],
        ),
        case(
            json!([
                s(
                    &format!("storageversion_webhook_lease_view_staleness_seconds{{{POD}}}"),
                    "0 30 0 45 0x20"
                ),
                s(
                    &format!("storageversion_webhook_lease_view_synced{{{POD}}}"),
                    "1x20"
                ),
            ]),
            vec![check("StorageVersionWebhookLeaseViewStale", "15m", vec![])],
        ),
        // Admission p99: every review between 100 and 250 ms fires it; below 5 ms does not.
        case(
            json!([
                s(&bucket("0.005"), "0x30"),
                s(&bucket("0.1"), "0x30"),
                s(&bucket("0.25"), "0+60x30"),
                s(&bucket("+Inf"), "0+60x30"),
            ]),
            vec![
                check("StorageVersionWebhookSlowAdmission", "8m", vec![]),
                check(
                    "StorageVersionWebhookSlowAdmission",
                    "20m",
                    vec![firing(
                        "StorageVersionWebhookSlowAdmission",
                        ns_labels("warning"),
                        FILL_POD,
                    )],
                ),
            ],
        ),
        case(
            json!([
                s(&bucket("0.005"), "0+600x30"),
                s(&bucket("0.1"), "0+600x30"),
                s(&bucket("0.25"), "0+600x30"),
                s(&bucket("+Inf"), "0+600x30"),
            ]),
            vec![check("StorageVersionWebhookSlowAdmission", "20m", vec![])],
        ),
        // Certificate expiry: 11.5 days left warns after an hour; 1.2 days is also critical at
        // once; 30 days is quiet.
        case(
            json!([s(&format!("{expiry}{{{POD}}}"), "1000000x90")]),
            vec![
                check(
                    "StorageVersionWebhookCertificateExpiringSoon",
                    "30m",
                    vec![],
                ),
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
                check(
                    "StorageVersionWebhookCertificateExpiryCritical",
                    "61m",
                    vec![],
                ),
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
            vec![check(
                "StorageVersionWebhookCertificateExpiringSoon",
                "80m",
                vec![],
            )],
        ),
        // No GC leader among the replicas for 10 minutes; one leader is quiet.
        case(
            json!([
                s(
                    &format!("storageversion_webhook_gc_leader{{{POD}}}"),
                    "1 1 0x20"
                ),
                s(
                    r#"storageversion_webhook_gc_leader{namespace="svw",pod="svw-1"}"#,
                    "0x22"
                ),
            ]),
            vec![
                check("StorageVersionGCNoLeader", "10m", vec![]),
                check(
                    "StorageVersionGCNoLeader",
                    "13m",
                    vec![firing(
                        "StorageVersionGCNoLeader",
                        ns_labels("warning"),
                        FILL_POD,
                    )],
                ),
            ],
        ),
        case(
            json!([
                s(
                    &format!("storageversion_webhook_gc_leader{{{POD}}}"),
                    "0x20"
                ),
                s(
                    r#"storageversion_webhook_gc_leader{namespace="svw",pod="svw-1"}"#,
                    "1x20"
                ),
            ]),
            vec![check("StorageVersionGCNoLeader", "15m", vec![])],
        ),
        // GC errors in every 5-minute window for 15 minutes; a single burst is quiet.
        case(
            json!([s(
                &format!(
                    r#"storageversion_webhook_gc_errors_total{{{POD},operation="update_status"}}"#
                ),
                "0+1x40"
            ),]),
            vec![
                check("StorageVersionGCFailing", "10m", vec![]),
                check(
                    "StorageVersionGCFailing",
                    "20m",
                    vec![firing(
                        "StorageVersionGCFailing",
                        ns_labels("warning"),
                        FILL_POD,
                    )],
                ),
            ],
        ),
        case(
            json!([s(
                &format!(
                    r#"storageversion_webhook_gc_errors_total{{{POD},operation="list_leases"}}"#
                ),
                "0 0 5x40"
            ),]),
            vec![check("StorageVersionGCFailing", "30m", vec![])],
        ),
        // Stale entries for 15 minutes; a few minutes (the collector's grace) are quiet.
        case(
            json!([s(
                &format!("storageversion_webhook_gc_stale_entries{{{POD}}}"),
                "3x20"
            )]),
            vec![
                check("StorageVersionStaleEntries", "14m", vec![]),
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
            json!([s(
                &format!("storageversion_webhook_gc_stale_entries{{{POD}}}"),
                "2x6 0x30"
            )]),
            vec![check("StorageVersionStaleEntries", "20m", vec![])],
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
    // JSON is YAML.
    let (_dir, path) = temp_file("alerts_test.yaml", &tests.to_string());
    let out = run(ops::promtool().args(["test", "rules"]).arg(&path), None);
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
    let (_dir, path) = temp_file("dashboard_rules.yaml", &file.to_string());
    let out = run(ops::promtool().args(["check", "rules"]).arg(&path), None);
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
    let (_dir2, bad_path) = temp_file("bad_rules.yaml", &bad.to_string());
    let out = run(
        ops::promtool().args(["check", "rules"]).arg(&bad_path),
        None,
    );
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
    let (_dir, path) = temp_file("rendered_rules.yaml", &rule["spec"].to_string());
    ok(ops::promtool().args(["check", "rules"]).arg(&path), None);
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
    leases(&cp)
        .create(&Default::default(), &live_identity_lease("h11-departed"))
        .await
        .expect("create lease");
    support::create_sv(&cp, "apps.h11gadgets").await;
    support::put_status(
        &cp,
        "apps.h11gadgets",
        support::status_for("apps", &["h11-departed"]),
    )
    .await
    .expect("allowed while the lease is live");
    leases(&cp)
        .delete("h11-departed", &Default::default())
        .await
        .expect("delete lease");

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
