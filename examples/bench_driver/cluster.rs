//! The cluster-side benchmarks: identity leases, `/status` write latency through
//! kube-apiserver, the garbage-collection race, and populating a big cluster.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::{json, Value};
use storageversion_webhook::model::{
    StorageVersion, IDENTITY_LABEL_KEY, IDENTITY_LABEL_VALUE, IDENTITY_LEASE_NAMESPACE,
};

use svw_testkit::{fixtures, http_get, metric_sum, webhook_configuration};

const VWC_NAME: &str = "storageversion-webhook-bench";
/// Label on every StorageVersion the benchmarks create.
const BENCH_LABEL: &str = "storageversion-webhook.bench/scenario";
/// The API group of the benchmarks' StorageVersions (`<group>.<resource>` names).
const BENCH_GROUP: &str = "bench.example.com";

async fn client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    storageversion_webhook::kubeclient::client(Some(kubeconfig)).await
}

fn leases(client: &kube::Client) -> Api<Lease> {
    Api::namespaced(client.clone(), IDENTITY_LEASE_NAMESPACE)
}

fn storage_versions(client: &kube::Client) -> Api<StorageVersion> {
    Api::all(client.clone())
}

/// A live identity lease as kube-apiserver writes it (renewed now, valid for an hour).
fn identity_lease(name: &str) -> anyhow::Result<Lease> {
    let now = Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    Ok(serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": IDENTITY_LEASE_NAMESPACE,
            "labels": {IDENTITY_LABEL_KEY: IDENTITY_LABEL_VALUE},
        },
        "spec": {
            "holderIdentity": format!("{name}_bench"),
            "leaseDurationSeconds": 3600,
            "renewTime": now,
            "acquireTime": now,
        }
    }))?)
}

/// Creates the lease, or renews it if it exists.
async fn ensure_lease(api: &Api<Lease>, name: &str) -> anyhow::Result<()> {
    let lease = identity_lease(name)?;
    match api.create(&PostParams::default(), &lease).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let mut current = api.get(name).await?;
            current.spec = lease.spec;
            current.metadata.labels = lease.metadata.labels;
            api.replace(name, &PostParams::default(), &current).await?;
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("create lease {name}")),
    }
}

pub async fn fixture_leases(kubeconfig: &Path, count: usize) -> anyhow::Result<()> {
    let client = client(kubeconfig).await?;
    let api = leases(&client);
    for id in fixtures::apiserver_ids(count) {
        ensure_lease(&api, &id).await?;
    }
    Ok(())
}

/// The status of a bench StorageVersion with one entry per id, `served` versions on the last.
fn bench_status(ids: &[String], served: &[&str]) -> Value {
    let v = format!("{BENCH_GROUP}/v1");
    let v2 = format!("{BENCH_GROUP}/v2");
    let entries: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let mut e = json!({
                "apiServerID": id,
                "encodingVersion": v,
                "decodableVersions": [v, v2],
            });
            if i + 1 == ids.len() {
                e["servedVersions"] = json!(served);
            } else {
                e["servedVersions"] = json!([v]);
            }
            e
        })
        .collect();
    fixtures::agreed_status(entries, &v, "2026-01-01T00:00:00Z")
}

/// Creates StorageVersion `name` (labelled `scenario`) if missing and sets its status.
async fn put_storage_version(
    api: &Api<StorageVersion>,
    name: &str,
    scenario: &str,
    status: &Value,
) -> anyhow::Result<StorageVersion> {
    let mut sv = match api.get_opt(name).await? {
        Some(sv) => sv,
        None => {
            let fresh: StorageVersion = serde_json::from_value(json!({
                "apiVersion": "internal.apiserver.k8s.io/v1alpha1",
                "kind": "StorageVersion",
                "metadata": {"name": name, "labels": {BENCH_LABEL: scenario}},
                "spec": {},
            }))?;
            match api.create(&PostParams::default(), &fresh).await {
                Ok(sv) => sv,
                Err(kube::Error::Api(s)) if s.code == 409 => api.get(name).await?,
                Err(e) => return Err(e).with_context(|| format!("create {name}")),
            }
        }
    };
    let want = serde_json::from_value(status.clone())?;
    if sv.status == want {
        return Ok(sv);
    }
    sv.status = want;
    sv.api_version = Some("internal.apiserver.k8s.io/v1alpha1".into());
    sv.kind = Some("StorageVersion".into());
    api.replace_status(name, &PostParams::default(), &sv)
        .await
        .with_context(|| format!("write the status of {name}"))
}

// ---------------------------------------------------------------------------------------------
// writes

#[derive(clap::Args)]
pub struct WritesArgs {
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The webhook's URL (https://127.0.0.1:<port>/validate).
    #[arg(long)]
    webhook_url: String,
    /// CA bundle (PEM) of the webhook's serving certificate.
    #[arg(long)]
    ca_file: PathBuf,
    /// The webhook's admin listener (for its review counter).
    #[arg(long)]
    admin: SocketAddr,
    /// Writes per arm (registered, not registered).
    #[arg(long, default_value_t = 500)]
    writes: usize,
    /// Writes per block; arms alternate block by block.
    #[arg(long, default_value_t = 50)]
    block: usize,
    /// Results file: one line per arm with every latency.
    #[arg(long)]
    out: PathBuf,
}

async fn register(client: &kube::Client, url: &str, ca_pem: &[u8]) -> anyhow::Result<()> {
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(webhook_configuration(
        VWC_NAME,
        "storageversions.storageversion-webhook.bench",
        url,
        ca_pem,
        "Fail",
    ))?;
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    api.create(&PostParams::default(), &vwc).await?;
    Ok(())
}

pub async fn unregister(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    match api.delete(VWC_NAME, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn reviews(admin: SocketAddr) -> anyhow::Result<f64> {
    let (status, body) = http_get(admin, "/metrics")
        .await
        .ok_or_else(|| anyhow!("GET /metrics on {admin} failed"))?;
    if status != 200 {
        bail!("GET /metrics: {status}");
    }
    Ok(metric_sum(
        &body,
        "storageversion_webhook_admission_reviews_total",
        &[],
    ))
}

pub async fn writes(args: &WritesArgs) -> anyhow::Result<()> {
    let client = client(&args.kubeconfig).await?;
    let ca = std::fs::read(&args.ca_file)?;
    let ids = fixtures::apiserver_ids(3);
    let api = storage_versions(&client);
    let name = format!("{BENCH_GROUP}.writes");
    let v = format!("{BENCH_GROUP}/v1");
    let v2 = format!("{BENCH_GROUP}/v2");
    let statuses = [bench_status(&ids, &[&v]), bench_status(&ids, &[&v, &v2])];
    unregister(&client).await?;
    let mut sv = put_storage_version(&api, &name, "writes", &statuses[0]).await?;
    let mut flip = 0usize;
    // One write as kube-apiserver does it: PUT /status with the resourceVersion last read.
    let mut write = |mut sv: StorageVersion| {
        flip += 1;
        let api = api.clone();
        let status = statuses[flip % 2].clone();
        let name = name.clone();
        async move {
            sv.status = serde_json::from_value(status)?;
            sv.metadata.managed_fields = None;
            let t = Instant::now();
            let written = api
                .replace_status(&name, &PostParams::default(), &sv)
                .await?;
            anyhow::Ok((written, t.elapsed()))
        }
    };
    // Warm up both paths (connections, caches).
    for _ in 0..20 {
        sv = write(sv).await?.0;
    }

    let mut lat: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut checked: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    let blocks = args.writes.div_ceil(args.block.max(1));
    for b in 0..blocks * 2 {
        let arm = if b % 2 == 0 {
            "registered"
        } else {
            "not_registered"
        };
        // Switch, then wait until the apiserver sees the switch (probe writes, not recorded).
        if arm == "registered" {
            register(&client, &args.webhook_url, &ca).await?;
        } else {
            unregister(&client).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let before = reviews(args.admin).await?;
            sv = write(sv).await?.0;
            let called = reviews(args.admin).await? > before;
            if called == (arm == "registered") {
                break;
            }
            if Instant::now() > deadline {
                bail!("kube-apiserver did not pick up the webhook {arm} within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for _ in 0..3 {
            sv = write(sv).await?.0;
        }
        let before = reviews(args.admin).await?;
        let n = args.block.min(args.writes - (b / 2) * args.block);
        for _ in 0..n {
            let (written, took) = write(sv).await?;
            sv = written;
            lat.entry(arm)
                .or_default()
                .push(took.as_secs_f64() * 1000.0);
        }
        let seen = reviews(args.admin).await? - before;
        let c = checked.entry(arm).or_insert((0.0, 0));
        c.0 += seen;
        c.1 += n;
        eprintln!("  block {b}: {arm}, {n} writes, webhook called {seen} times");
    }
    unregister(&client).await?;
    for (arm, samples) in lat {
        let (seen, n) = checked.get(arm).copied().unwrap_or_default();
        crate::append_jsonl(
            &args.out,
            &json!({"arm": arm, "writes": n, "webhook_calls": seen, "latency_ms": samples}),
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// garbage collection

#[derive(clap::Args, Clone)]
pub struct GcArgs {
    #[arg(long)]
    kubeconfig: PathBuf,
    /// StorageVersions in the scenario.
    #[arg(long, default_value_t = 500)]
    objects: usize,
    /// `strip`: every object has entries of all three apiservers; `delete`: only of the one
    /// whose lease is deleted.
    #[arg(long, default_value = "strip")]
    mode: String,
    /// Writes at once while setting up.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

/// The three apiservers of the GC scenario; the last one's lease is deleted.
fn gc_ids() -> Vec<String> {
    (100..103).map(fixtures::apiserver_id).collect()
}

fn gc_name(mode: &str, i: usize) -> String {
    format!("{BENCH_GROUP}.gc{mode}{i:04}")
}

pub async fn gc_reset(args: &GcArgs) -> anyhow::Result<()> {
    let client = client(&args.kubeconfig).await?;
    let lease_api = leases(&client);
    let ids = gc_ids();
    for id in &ids {
        ensure_lease(&lease_api, id).await?;
    }
    let gone = ids.last().cloned().unwrap_or_default();
    let status = match args.mode.as_str() {
        "strip" => bench_status(&ids, &[&format!("{BENCH_GROUP}/v1")]),
        "delete" => bench_status(&[gone], &[&format!("{BENCH_GROUP}/v1")]),
        other => bail!("--mode {other:?}: want strip or delete"),
    };
    let api = storage_versions(&client);
    let scenario = format!("gc-{}", args.mode);
    let t = Instant::now();
    futures::stream::iter(0..args.objects)
        .map(|i| {
            let api = api.clone();
            let status = status.clone();
            let scenario = scenario.clone();
            let mode = args.mode.clone();
            async move { put_storage_version(&api, &gc_name(&mode, i), &scenario, &status).await }
        })
        .buffer_unordered(args.concurrency.max(1))
        .try_collect::<Vec<_>>()
        .await?;
    eprintln!(
        "  gc scenario {}: {} objects in place after {:.1}s",
        args.mode,
        args.objects,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

#[derive(clap::Args)]
pub struct GcTimeArgs {
    #[command(flatten)]
    scenario: GcArgs,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Results file; one line is appended.
    #[arg(long)]
    out: PathBuf,
    /// Labels for the result line, `key=value` (repeatable).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// After the objects are clean, also wait (up to 60 s) until kube-apiserver has counted one
    /// Event per object, and report when (a collector that records its Events after its writes).
    #[arg(long)]
    wait_events: bool,
}

/// Deletes the last scenario lease and follows the StorageVersions with a watch until none has
/// an entry of it (strip) or all are deleted (delete).
pub async fn gc_time(args: &GcTimeArgs) -> anyhow::Result<()> {
    let sc = &args.scenario;
    let client = client(&sc.kubeconfig).await?;
    let gone = gc_ids().last().cloned().unwrap_or_default();
    let api = storage_versions(&client);
    let selector = format!("{BENCH_LABEL}=gc-{}", sc.mode);
    let cfg = watcher::Config::default().labels(&selector);
    let mut events = std::pin::pin!(watcher(api.clone(), cfg));
    let dirty_of = |sv: &StorageVersion| match sc.mode.as_str() {
        "delete" => true,
        _ => sv.entry(&gone).is_some(),
    };
    // The initial list: every object must be dirty, or the set-up is wrong.
    let mut dirty: HashSet<String> = HashSet::new();
    loop {
        match events.next().await {
            Some(Ok(watcher::Event::InitApply(sv))) => {
                if dirty_of(&sv) {
                    dirty.insert(sv.name().to_string());
                }
            }
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => bail!("watch StorageVersions: {e}"),
            None => bail!("watch ended"),
        }
    }
    if dirty.len() != sc.objects {
        bail!(
            "{} of {} scenario objects have an entry of {gone}: run gc-reset first",
            dirty.len(),
            sc.objects
        );
    }
    let before = apiserver_requests(&client).await?;
    let t0 = Instant::now();
    leases(&client)
        .delete(&gone, &DeleteParams::default())
        .await
        .with_context(|| format!("delete lease {gone}"))?;
    let mut first: Option<Duration> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    while !dirty.is_empty() {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .map_err(|_| {
                anyhow!(
                    "{} of {} objects still not clean after {} s",
                    dirty.len(),
                    sc.objects,
                    args.timeout
                )
            })?;
        let cleaned = match event {
            Some(Ok(watcher::Event::Apply(sv))) if !dirty_of(&sv) => dirty.remove(sv.name()),
            Some(Ok(watcher::Event::Delete(sv))) => dirty.remove(sv.name()),
            Some(Ok(_)) => false,
            Some(Err(e)) => {
                eprintln!("  watch error (retrying): {e}");
                false
            }
            None => bail!("watch ended"),
        };
        if cleaned && first.is_none() {
            first = Some(t0.elapsed());
        }
    }
    let total = t0.elapsed();
    let mut after = apiserver_requests(&client).await?;
    let mut events_at = None;
    if args.wait_events {
        let deadline = Instant::now() + Duration::from_secs(60);
        while RequestCost::between(&before, &after).events < sc.objects as f64 {
            if Instant::now() >= deadline {
                bail!(
                    "fewer than {} Events counted 60 s after the objects were clean",
                    sc.objects
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            after = apiserver_requests(&client).await?;
        }
        events_at = Some(t0.elapsed());
    }
    let cost = RequestCost::between(&before, &after);
    let mut line = labelled(&args.labels)?;
    line.insert("mode".into(), json!(sc.mode));
    line.insert("objects".into(), json!(sc.objects));
    line.insert("seconds".into(), json!(total.as_secs_f64()));
    line.insert("sv_requests".into(), json!(cost.sv_requests));
    line.insert("sv_writes".into(), json!(cost.sv_writes));
    line.insert("lease_gets".into(), json!(cost.lease_gets));
    line.insert("events".into(), json!(cost.events));
    if let Some(at) = events_at {
        line.insert("events_seconds".into(), json!(at.as_secs_f64()));
    }
    line.insert(
        "first_seconds".into(),
        json!(first.map(|d| d.as_secs_f64()).unwrap_or(0.0)),
    );
    eprintln!(
        "  {}: {} objects clean after {:.2}s (first after {:.2}s); apiserver counted {} StorageVersion requests ({} writes), {} lease GETs, {} Event requests",
        args.labels.join(" "),
        sc.objects,
        total.as_secs_f64(),
        first.map(|d| d.as_secs_f64()).unwrap_or(0.0),
        cost.sv_requests,
        cost.sv_writes,
        cost.lease_gets,
        cost.events,
    );
    if let Some(at) = events_at {
        eprintln!("    every Event recorded after {:.2}s", at.as_secs_f64());
    }
    crate::append_jsonl(&args.out, &Value::Object(line))
}

/// `apiserver_request_total` from kube-apiserver's own `/metrics`, summed by
/// (verb, resource, subresource): what every client asked of it.
async fn apiserver_requests(
    client: &kube::Client,
) -> anyhow::Result<BTreeMap<(String, String, String), f64>> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .context("build a /metrics request")?;
    let text = client
        .request_text(req)
        .await
        .context("GET kube-apiserver /metrics")?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let n: f64 = value.trim().parse().unwrap_or(0.0);
        *out.entry((label("verb"), label("resource"), label("subresource")))
            .or_insert(0.0) += n;
    }
    Ok(out)
}

/// Requests a collector made between two scrapes, as kube-apiserver counted them (the
/// benchmark's own watch, LIST and lease DELETE are left out by verb).
struct RequestCost {
    /// GET, PUT, PATCH, DELETE, POST of StorageVersions (not LIST or WATCH).
    sv_requests: f64,
    /// PUT, PATCH, DELETE of StorageVersions.
    sv_writes: f64,
    lease_gets: f64,
    events: f64,
}

impl RequestCost {
    fn between(
        before: &BTreeMap<(String, String, String), f64>,
        after: &BTreeMap<(String, String, String), f64>,
    ) -> RequestCost {
        let delta = |f: &dyn Fn(&str, &str) -> bool| -> f64 {
            after
                .iter()
                .filter(|((verb, resource, _), _)| f(verb, resource))
                .map(|(k, v)| v - before.get(k).copied().unwrap_or(0.0))
                .sum()
        };
        RequestCost {
            sv_requests: delta(&|v, r| {
                r == "storageversions" && matches!(v, "GET" | "PUT" | "PATCH" | "DELETE" | "POST")
            }),
            sv_writes: delta(&|v, r| {
                r == "storageversions" && matches!(v, "PUT" | "PATCH" | "DELETE")
            }),
            lease_gets: delta(&|v, r| r == "leases" && v == "GET"),
            events: delta(&|v, r| r == "events" && matches!(v, "POST" | "PATCH")),
        }
    }
}

#[derive(clap::Args)]
pub struct WaitMetricArgs {
    #[arg(long)]
    admin: SocketAddr,
    /// Metric name (samples summed over labels).
    #[arg(long)]
    metric: String,
    /// Wait until the sum is at least this.
    #[arg(long)]
    at_least: f64,
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

pub async fn wait_metric(args: &WaitMetricArgs) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    loop {
        if let Some((200, body)) = http_get(args.admin, "/metrics").await {
            if metric_sum(&body, &args.metric, &[]) >= args.at_least {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!(
                "{} did not reach {} within {} s",
                args.metric,
                args.at_least,
                args.timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// populate

#[derive(clap::Args)]
pub struct PopulateArgs {
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Identity leases to create.
    #[arg(long, default_value_t = 10_000)]
    leases: usize,
    /// StorageVersions to create (three entries each, of those leases).
    #[arg(long, default_value_t = 2_000)]
    storage_versions: usize,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
}

pub async fn populate(args: &PopulateArgs) -> anyhow::Result<()> {
    let client = client(&args.kubeconfig).await?;
    let t = Instant::now();
    let lease_api = leases(&client);
    let ids: Vec<String> = (0..args.leases as u64)
        .map(|i| fixtures::apiserver_id(10_000 + i))
        .collect();
    futures::stream::iter(ids.iter())
        .map(|id| {
            let api = lease_api.clone();
            async move { ensure_lease(&api, id).await }
        })
        .buffer_unordered(args.concurrency.max(1))
        .try_collect::<Vec<_>>()
        .await?;
    eprintln!(
        "  {} identity leases after {:.1}s",
        ids.len(),
        t.elapsed().as_secs_f64()
    );
    let api = storage_versions(&client);
    let ids = &ids;
    futures::stream::iter(0..args.storage_versions)
        .map(|i| {
            let api = api.clone();
            async move {
                let n = ids.len().max(1);
                let three: Vec<String> = (0..3).map(|k| ids[(i * 3 + k) % n].clone()).collect();
                let status = bench_status(&three, &[&format!("{BENCH_GROUP}/v1")]);
                put_storage_version(&api, &format!("{BENCH_GROUP}.mem{i:05}"), "memory", &status)
                    .await
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .try_collect::<Vec<_>>()
        .await?;
    let listed = api.list_metadata(&ListParams::default()).await?.items.len();
    eprintln!(
        "  {} StorageVersions created ({listed} in the cluster) after {:.1}s",
        args.storage_versions,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A result line holding the `key=value` labels given on the command line.
pub fn labelled(labels: &[String]) -> anyhow::Result<serde_json::Map<String, Value>> {
    let mut line = serde_json::Map::new();
    for label in labels {
        let (k, v) = label
            .split_once('=')
            .ok_or_else(|| anyhow!("label {label:?} is not key=value"))?;
        line.insert(k.into(), json!(v));
    }
    Ok(line)
}
