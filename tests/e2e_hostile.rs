//! End-to-end proof, through a real kube-apiserver, that hostile traffic cannot turn into a
//! flood of lease lookups against kube-apiserver, and that a slow or unreachable kube-apiserver
//! costs the webhook only warnings, never its answers in time or its view of the leases:
//!
//! - a 20,000-entry StorageVersion status (every entry a distinct apiServerID with no lease) is
//!   sent through the apiserver, which calls the webhook; the lease GETs kube-apiserver serves
//!   meanwhile are counted at the apiserver (its `apiserver_request_total` for `leases`), and the
//!   webhook's own lookups in its metrics;
//! - a flood of reviews naming random IDs from many connections stays inside the lookup budget
//!   (counted at the apiserver) while kube-apiserver's own reviews are answered at once;
//! - with a fault-injecting proxy ([`svw_testkit::proxy::FaultProxy`]) between the webhook and
//!   kube-apiserver: 4 s of latency, a 20 s partition and its heal, connections cut.
//!
//! Run alone: `cargo test --test e2e_hostile -- --nocapture`.

mod support;

use std::time::{Duration, Instant};

use storageversion_webhook::admission::DEFAULT_MAX_LEASE_LOOKUPS;
use support::*;

const SV_NAME: &str = "hostile.example.com.widgets";

/// The GETs of leases kube-apiserver has served, from its own metrics.
async fn apiserver_lease_gets(cp: &ControlPlane) -> f64 {
    let req = hyper::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = cp
        .client
        .request_text(req)
        .await
        .expect("GET kube-apiserver /metrics");
    metric_sum(
        &text,
        "apiserver_request_total",
        &["resource=\"leases\"", "verb=\"GET\""],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_ids_make_a_bounded_number_of_lease_gets_at_the_apiserver() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let (_certs, hook) = registered_webhook(&cp, &["--enforcement=deny", "--no-gc"], "Fail").await;
    create_sv(&cp, SV_NAME).await;

    let ids: Vec<String> = (0..20_000).map(|i| format!("hostile-{i:06}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let status = status_for("hostile.example.com", &ids);

    let gets_before = apiserver_lease_gets(&cp).await;
    let started = Instant::now();
    let result = put_status(&cp, SV_NAME, status).await;
    let took = started.elapsed();
    let gets_after = apiserver_lease_gets(&cp).await;
    let error = api_error_text(&result);
    eprintln!(
        "20,000-entry write answered in {took:?}: {}",
        &error[..error.len().min(300)]
    );
    assert!(
        result.is_err(),
        "a write naming 20,000 apiservers without leases was stored"
    );
    assert!(
        error.contains("lease-missing"),
        "the denial is the webhook's, summarised: {}",
        &error[..error.len().min(2000)]
    );

    let metrics = hook.metrics().await;
    let webhook_live = lease_lookups_total(&metrics, &[])
        - lease_lookups_total(&metrics, &["result=\"cache_hit\""]);
    eprintln!(
        "lease GETs at kube-apiserver: {} (webhook live lookups {webhook_live})",
        gets_after - gets_before
    );
    let limit = DEFAULT_MAX_LEASE_LOOKUPS as f64;
    assert!(
        webhook_live <= limit,
        "the webhook made {webhook_live} live lookups, want at most {limit}"
    );
    // The control plane's own components (leader election, the apiserver's identity lease)
    // also GET leases now and then; 20,000 would be the defect.
    assert!(
        gets_after - gets_before <= limit + 100.0,
        "kube-apiserver served {} lease GETs during one review",
        gets_after - gets_before
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    hook.wait_ready(Duration::from_secs(5)).await;
}

// ---------------------------------------------------------------------------------------------
// Many hostile reviews together, and a slow or unreachable kube-apiserver

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kube::api::{DeleteParams, PostParams};
use svw_testkit::proxy::FaultProxy;

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// An HTTPS client of the webhook trusting only the test CA (HTTP/1.1, like kube-apiserver).
fn webhook_client(certs: &Certs) -> HttpsClient {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(svw_testkit::certs::first_der(&certs.ca_pem))
        .expect("CA");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

/// A `/status` UPDATE of a StorageVersion naming `ids` (all new: no old object), by `username`.
fn review_naming(uid: &str, username: &str, ids: &[String]) -> Bytes {
    let mut review = svw_testkit::fixtures::status_update_review(ids);
    review["request"]["uid"] = serde_json::json!(uid);
    review["request"]["userInfo"]["username"] = serde_json::json!(username);
    review["request"]["oldObject"] = serde_json::Value::Null;
    Bytes::from(serde_json::to_vec(&review).expect("review"))
}

/// POSTs `body` to the webhook; returns the AdmissionReview response's `response` object.
async fn post_review(
    client: &HttpsClient,
    url: &str,
    body: Bytes,
) -> anyhow::Result<serde_json::Value> {
    let req = hyper::Request::post(url)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))?;
    let resp = client.request(req).await?;
    anyhow::ensure!(resp.status() == 200, "status {}", resp.status());
    let body = resp.into_body().collect().await?.to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    Ok(v["response"].clone())
}

fn random_ids(n: usize, seed: &mut u64) -> Vec<String> {
    (0..n)
        .map(|_| {
            // xorshift: distinct, DNS-1123 names
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            format!("flood-{:016x}", *seed)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_random_ids_stays_inside_the_lookup_budget_and_the_apiserver_is_answered_at_once(
) {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let certs = Certs::generate();
    // A small budget, so that the flood is far over it: 4 per second, 8 at once.
    let hook = Webhook::start(
        &cp,
        &certs,
        &["--no-gc", "--lease-lookup-rate=4", "--lease-lookup-burst=8"],
    )
    .await;
    let live = own_apiserver_id(&cp).await;
    let url = hook.url();

    let gets_before = apiserver_lease_gets(&cp).await;
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let flood_reviews = Arc::new(AtomicUsize::new(0));
    let flood: Vec<_> = (0..16u64)
        .map(|conn| {
            let (client, url) = (webhook_client(&certs), url.clone());
            let (stop, count) = (Arc::clone(&stop), Arc::clone(&flood_reviews));
            tokio::spawn(async move {
                let mut seed = 0x9e37_79b9_7f4a_7c15 ^ (conn + 1);
                while !stop.load(Ordering::SeqCst) {
                    let body = review_naming("uid-flood", "attacker", &random_ids(16, &mut seed));
                    if post_review(&client, &url, body).await.is_ok() {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();

    // Meanwhile kube-apiserver's own reviews, each on a new connection: one naming its live lease
    // (a cache hit) and one also naming a lease that does not exist (a live lookup, from the
    // share of the budget kept for it).
    let mut seed = 42u64;
    let mut slowest = Duration::ZERO;
    for i in 0..6 {
        tokio::time::sleep(Duration::from_millis(900)).await;
        let client = webhook_client(&certs);
        let asked = Instant::now();
        let answer = post_review(
            &client,
            &url,
            review_naming("uid-own", "system:apiserver", std::slice::from_ref(&live)),
        )
        .await
        .expect("kube-apiserver's review is answered");
        slowest = slowest.max(asked.elapsed());
        assert_eq!(answer["allowed"], true, "{answer}");
        assert!(
            answer["warnings"].is_null(),
            "its live lease is judged live: {answer}"
        );

        let client = webhook_client(&certs);
        let mut ids = vec![live.clone()];
        ids.extend(random_ids(1, &mut seed));
        let answer = post_review(
            &client,
            &url,
            review_naming("uid-own-missing", "system:apiserver", &ids),
        )
        .await
        .expect("kube-apiserver's review is answered");
        let text = answer.to_string();
        assert!(
            text.contains("lease-missing") && !text.contains("lease-lookup-failed"),
            "review {i}: the flood must not spend kube-apiserver's share of the lookups: {text}"
        );
    }
    stop.store(true, Ordering::SeqCst);
    for task in flood {
        let _ = task.await;
    }
    let elapsed = started.elapsed();
    let gets = apiserver_lease_gets(&cp).await - gets_before;
    let metrics = hook.metrics().await;
    let live_lookups = lease_lookups_total(&metrics, &["result=\"live_"])
        + lease_lookups_total(&metrics, &["result=\"error\""]);
    let over = lease_lookups_total(&metrics, &["result=\"over_budget\""]);
    let reviews = flood_reviews.load(Ordering::SeqCst);
    // The budget: 8 at once, then 4 per second (some of the start-up GETs of the webhook and the
    // control plane's own components also count at the apiserver: a margin of 30).
    let budget = 8.0 + 4.0 * elapsed.as_secs_f64();
    eprintln!(
        "{reviews} flood reviews (16 IDs each) in {elapsed:?}: {live_lookups} live lookups by the webhook, {gets} lease GETs at kube-apiserver, {over} over budget; slowest own review {slowest:?}"
    );
    assert!(reviews >= 16, "the flood ran: {reviews} reviews");
    assert!(over > 0.0, "the flood was over the budget");
    assert!(
        live_lookups <= budget + 1.0,
        "{live_lookups} live lookups, budget {budget:.0}"
    );
    assert!(
        gets <= budget + 30.0,
        "{gets} lease GETs at kube-apiserver, budget {budget:.0}"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "kube-apiserver's review took {slowest:?} during the flood"
    );
}

/// `cp`'s kubeconfig with the apiserver's address replaced by `proxy`'s, written next to it;
/// returns its path and the apiserver's address.
fn kubeconfig_via(cp: &ControlPlane, dir: &std::path::Path) -> (PathBuf, SocketAddr) {
    let text = std::fs::read_to_string(&cp.kubeconfig).expect("kubeconfig");
    let server = regex::Regex::new(r"server: https://(127\.0\.0\.1:[0-9]+)")
        .expect("regex")
        .captures(&text)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_string())
        .expect("the kubeconfig names a loopback server");
    (dir.join("kubeconfig"), server.parse().expect("address"))
}

/// Starts `serve` talking to `cp` through a new fault proxy; returns both once `/readyz` is ok.
async fn webhook_behind_proxy(
    cp: &ControlPlane,
    certs: &Certs,
    extra: &[&str],
) -> (FaultProxy, Webhook) {
    let (path, upstream) = kubeconfig_via(cp, certs.dir.path());
    let proxy = FaultProxy::start(upstream).await.expect("proxy");
    let text = std::fs::read_to_string(&cp.kubeconfig)
        .expect("kubeconfig")
        .replace(&upstream.to_string(), &proxy.addr().to_string());
    std::fs::write(&path, text).expect("write the proxied kubeconfig");
    let extra: Vec<&str> = ["--no-gc"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let hook = Webhook::start_with_kubeconfig(&path, certs, &extra).await;
    (proxy, hook)
}

async fn view_gauge(hook: &Webhook, name: &str) -> f64 {
    metric_sum(&hook.metrics().await, name, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_apiserver_still_gets_an_answer_in_time_with_a_warning() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let certs = Certs::generate();
    let (proxy, hook) = webhook_behind_proxy(&cp, &certs, &[]).await;
    let client = webhook_client(&certs);

    proxy.set_latency(Duration::from_secs(4));
    // A lease the webhook has not seen (its watch event is 4 s away).
    let fresh = "apiserver-fresh-slow";
    leases(&cp)
        .create(&PostParams::default(), &live_identity_lease(fresh))
        .await
        .expect("create lease");
    let asked = Instant::now();
    let answer = post_review(
        &client,
        &hook.url(),
        review_naming("uid-slow", "system:apiserver", &[fresh.to_string()]),
    )
    .await
    .expect("answered");
    let took = asked.elapsed();
    eprintln!("with 4 s of latency to kube-apiserver: answered in {took:?}: {answer}");
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    assert_eq!(answer["allowed"], true, "{answer}");
    assert!(
        answer.to_string().contains("lease-lookup-failed"),
        "{answer}"
    );

    proxy.set_latency(Duration::ZERO);
    // The watch delivers it in the end (its event was on its way): judged live, no warning.
    poll_until(
        Duration::from_secs(30),
        "the slow watch to deliver the lease",
        || {
            let (client, url) = (&client, hook.url());
            async move {
                post_review(
                    client,
                    &url,
                    review_naming("uid-slow-2", "system:apiserver", &[fresh.to_string()]),
                )
                .await
                .is_ok_and(|a| a["allowed"] == true && a["warnings"].is_null())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_partition_heals_the_lease_view_catches_up_within_seconds() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let certs = Certs::generate();
    let (proxy, hook) = webhook_behind_proxy(&cp, &certs, &[]).await;
    let client = webhook_client(&certs);
    let api = leases(&cp);
    let doomed = "apiserver-doomed";
    api.create(&PostParams::default(), &live_identity_lease(doomed))
        .await
        .expect("create lease");
    let before = 2.0; // the control plane's own apiserver and `doomed`
    poll_until(
        Duration::from_secs(30),
        "the view to hold both leases",
        || async { view_gauge(&hook, "storageversion_webhook_lease_view_leases").await == before },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    proxy.partition();
    let born = ["apiserver-born-a", "apiserver-born-b"];
    for name in born {
        api.create(&PostParams::default(), &live_identity_lease(name))
            .await
            .expect("create lease");
    }
    api.delete(doomed, &DeleteParams::default())
        .await
        .expect("delete lease");
    // 20 s of partition. /readyz stays ok (the view is stale for less than
    // --lease-view-max-staleness, and every review is still answered in time), but the view
    // must know it is stale: a dead watch connection is noticed, not silently trusted.
    let partition = Instant::now();
    let mut staleness_seen = 0.0f64;
    while partition.elapsed() < Duration::from_secs(20) {
        let ready = http_get(hook.admin, "/readyz").await;
        assert_eq!(
            ready.as_ref().map(|r| r.0),
            Some(200),
            "/readyz during the partition: {ready:?}"
        );
        staleness_seen = staleness_seen
            .max(view_gauge(&hook, "storageversion_webhook_lease_view_staleness_seconds").await);
        let answer = post_review(
            &client,
            &hook.url(),
            review_naming("uid-part", "system:apiserver", &[born[0].to_string()]),
        )
        .await
        .expect("answered during the partition");
        assert_eq!(
            answer["allowed"], true,
            "never a denial without evidence: {answer}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("largest lease_view_staleness_seconds during the partition: {staleness_seen}");
    assert!(
        staleness_seen > 0.0,
        "the lease watch was cut off for 20 s and the view never noticed (staleness stayed 0)"
    );

    proxy.heal();
    let healed = Instant::now();
    let url = hook.url();
    poll_until(
        Duration::from_secs(30),
        "the view to catch up after the partition",
        || {
            let (client, url, hook) = (&client, url.clone(), &hook);
            async move {
                let leases = view_gauge(hook, "storageversion_webhook_lease_view_leases").await;
                let born_live = post_review(
                    client,
                    &url,
                    review_naming("uid-born", "system:apiserver", &born.map(String::from)),
                )
                .await
                .is_ok_and(|a| a["allowed"] == true && a["warnings"].is_null());
                let doomed_missing = post_review(
                    client,
                    &url,
                    review_naming("uid-doomed", "system:apiserver", &[doomed.to_string()]),
                )
                .await
                .is_ok_and(|a| a["allowed"] == false && a.to_string().contains("lease-missing"));
                leases == 3.0 && born_live && doomed_missing
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    eprintln!("caught up {:?} after the heal", healed.elapsed());
    assert!(healed.elapsed() < Duration::from_secs(30));
    hook.wait_ready(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_its_connections_are_cut_the_client_works_again_within_seconds() {
    let _serial = serial().await;
    let cp = ControlPlane::up().await;
    let certs = Certs::generate();
    let (proxy, hook) = webhook_behind_proxy(&cp, &certs, &[]).await;
    let client = webhook_client(&certs);
    let accepted = proxy.accepted();
    proxy.cut();
    let cut = Instant::now();
    let name = "apiserver-after-cut";
    leases(&cp)
        .create(&PostParams::default(), &live_identity_lease(name))
        .await
        .expect("create lease");
    let url = hook.url();
    poll_until(
        Duration::from_secs(20),
        "the watch and live lookups to work again",
        || {
            let (client, url, hook) = (&client, url.clone(), &hook);
            async move {
                let leases = view_gauge(hook, "storageversion_webhook_lease_view_leases").await;
                let missing = post_review(
                    client,
                    &url,
                    review_naming(
                        "uid-cut",
                        "system:apiserver",
                        &["apiserver-never".to_string()],
                    ),
                )
                .await
                .is_ok_and(|a| a["allowed"] == false && a.to_string().contains("lease-missing"));
                leases == 2.0 && missing
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; logs:\n{}", hook.logs_text()));
    eprintln!(
        "working again {:?} after the cut ({} new connections)",
        cut.elapsed(),
        proxy.accepted() - accepted
    );
}
