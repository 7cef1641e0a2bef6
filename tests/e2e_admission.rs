//! End-to-end proof of the admission webhook through a real kube-apiserver (issue 3). Each test
//! starts its own control plane (tests/controlplane/run) and the real `serve` process. Tests that
//! store stale entries on purpose run `serve --no-gc`, so the garbage collector (proven in
//! e2e_gc.rs) cannot change what they look at.
//!
//! Run one alone: `cargo test --test e2e_admission -- own_writes_are_admitted --nocapture`.
//! Tests 1, 2 and 4 also run against kube-apiserver 1.36 (`*_v1_36`, the version matrix).

mod support;

use std::process::Output;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, PostParams};
use storageversion_webhook::leases::budget::NEGATIVE_CACHE_TTL;
use storageversion_webhook::leases::{KubeLeaseView, LeaseView};
use storageversion_webhook::model::LeaseLookup;
use support::gc::{create_lease, delete_lease};
use support::*;

const GROUP: &str = "e2e.example.com";
const SV_NAME: &str = "e2e.example.com.widgets";

/// Runs `kubectl patch storageversion <name> --subresource=status --type=merge -p <patch>`.
fn kubectl_patch_status(cp: &ControlPlane, name: &str, patch: &serde_json::Value) -> Output {
    cp.kubectl()
        .args([
            "patch",
            "storageversion",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
        ])
        .arg(patch.to_string())
        .output()
        .expect("run kubectl")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

async fn count_storage_versions(cp: &ControlPlane) -> usize {
    storage_versions(cp)
        .list(&Default::default())
        .await
        .map(|l| l.items.len())
        .unwrap_or(0)
}

/// Deletes every StorageVersion, then restarts kube-apiserver and waits until it has written
/// them all again and is ready. Returns how long the restart took and how many it wrote.
async fn restart_and_rewrite(cp: &ControlPlane) -> (Duration, usize) {
    let before = count_storage_versions(cp).await;
    assert!(
        before > 30,
        "kube-apiserver wrote only {before} StorageVersions"
    );
    storage_versions(cp)
        .delete_collection(&DeleteParams::default(), &Default::default())
        .await
        .expect("delete all StorageVersions");
    let start = Instant::now();
    cp.restart_apiserver(); // waits for /readyz, which waits for the storage-version updater
    let took = start.elapsed();
    let after = count_storage_versions(cp).await;
    (took, after)
}

/// A control plane on the current kube-apiserver, or on `version` (e.g. "1.36").
/// Holds the serial lock and starts a control plane of kube-apiserver `version` (the current one
/// for `None`). Bind as `let (_serial, cp)`: the control plane stops before the lock is released.
async fn up_at(version: Option<&str>) -> (tokio::sync::MutexGuard<'static, ()>, ControlPlane) {
    let serial = serial().await;
    let cp = match version {
        Some(v) => ControlPlane::up_with(&["--version", v]).await,
        None => ControlPlane::up().await,
    };
    (serial, cp)
}

/// A lease view of its own (and the registry of its metrics) on `cp`, synced.
async fn synced_lease_view(
    cp: &ControlPlane,
) -> (
    prometheus_client::registry::Registry,
    std::sync::Arc<KubeLeaseView>,
) {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = storageversion_webhook::metrics::Metrics::register(&mut registry);
    let view = KubeLeaseView::spawn(cp.client.clone(), metrics, Duration::from_secs(60));
    poll_until(Duration::from_secs(30), "lease view to sync", || async {
        view.is_ready()
    })
    .await
    .expect("sync");
    (registry, view)
}

/// Waits up to 10 s until `view` holds `id` (`want`) or does not.
async fn wait_cached(view: &KubeLeaseView, id: &str, want: bool, what: &str) {
    poll_until(Duration::from_secs(10), what, || async {
        view.cached_record(id).is_some() == want
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Declares the test `$latest` (the current kube-apiserver) and `$v1_36` (kube-apiserver 1.36,
/// the version matrix of docs/ha-upgrade.md), both running `$scenario(version)`.
macro_rules! on_each_version {
    ($latest:ident, $v1_36:ident, $scenario:ident) => {
        #[tokio::test(flavor = "multi_thread")]
        async fn $latest() {
            $scenario(None).await
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn $v1_36() {
            $scenario(Some("1.36")).await
        }
    };
}

#[rustfmt::skip]
on_each_version! { own_writes_are_admitted, own_writes_are_admitted_v1_36, own_writes_are_admitted_on }

/// Test 1: kube-apiserver restarted with the webhook registered in deny mode (fail closed):
/// every StorageVersion it writes is admitted, including entries judged by the live-lease rule
/// against its own identity lease.
async fn own_writes_are_admitted_on(version: Option<&str>) {
    let (_serial, cp) = up_at(version).await;
    let (_certs, hook) = registered_webhook(&cp, &["--enforcement=deny"], "Fail").await;
    let own_id = own_apiserver_id(&cp).await;

    let (took, written) = restart_and_rewrite(&cp).await;
    eprintln!("restart with the webhook up (Fail): {took:?}, {written} StorageVersions");
    assert!(written > 30, "only {written} StorageVersions after restart");

    let metrics = hook.metrics().await;
    let reviews = reviews_total(&metrics, &[]);
    let denied = reviews_total(&metrics, &["verdict=\"denied\""]);
    let creates = reviews_total(&metrics, &["operation=\"CREATE\""]);
    let lease_findings = findings_total(&metrics, &["code=\"lease-"]);
    eprintln!("reviews {reviews}, creates {creates}, denied {denied}");
    assert_eq!(
        denied, 0.0,
        "the webhook denied kube-apiserver's own writes:\n{metrics}"
    );
    assert_eq!(
        lease_findings, 0.0,
        "lease findings on kube-apiserver's own writes:\n{metrics}"
    );
    assert!(
        creates >= written as f64,
        "expected a CREATE review per StorageVersion ({written}), saw {creates}"
    );
    assert!(
        reviews >= 2.0 * written as f64,
        "expected CREATE + status UPDATE per object"
    );

    // Every rewritten object carries the apiserver's own entry, which the lease rule judged.
    let list = storage_versions(&cp)
        .list(&Default::default())
        .await
        .expect("list");
    for sv in &list.items {
        assert!(
            sv.entry(&own_id).is_some(),
            "{} has no entry for {own_id}",
            sv.name()
        );
    }
}

#[rustfmt::skip]
on_each_version! { stale_entries_are_denied_until_the_lease_is_live, stale_entries_are_denied_until_the_lease_is_live_v1_36, stale_entries_are_denied_until_the_lease_is_live_on }

/// Test 2: a status write adding an entry for an apiServerID with no lease, a lease of the wrong
/// label, or an expired lease is denied, naming the webhook and the rule; renewed, it is admitted.
async fn stale_entries_are_denied_until_the_lease_is_live_on(version: Option<&str>) {
    let (_serial, cp) = up_at(version).await;
    let (_certs, hook) = registered_webhook(&cp, &["--no-gc"], "Fail").await;
    create_sv(&cp, SV_NAME).await;
    let id = "apiserver-e2enolease0000000000000";
    let status = status_for(GROUP, &[id]);

    let denied = put_status(&cp, SV_NAME, status.clone()).await;
    let msg = api_error_text(&denied);
    assert!(denied.is_err(), "write with no lease was admitted");
    assert!(
        msg.contains(WEBHOOK_NAME),
        "error does not name the webhook: {msg}"
    );
    assert!(
        msg.contains("lease-missing"),
        "error does not name the rule: {msg}"
    );
    assert!(
        msg.contains("status.storageVersions[0].apiServerID"),
        "no field path: {msg}"
    );

    let leases = leases(&cp);
    let wrong_label = identity_lease(id, Some("kube-controller-manager"), Duration::ZERO);
    create_lease(&cp, &wrong_label).await;
    // The NotFound just seen is remembered for a few seconds, and the watch (identity label
    // only) never shows a lease of another label: until the memory runs out the write reads as
    // lease-missing, then as lease-not-apiserver. Denied all along.
    let end = Instant::now() + NEGATIVE_CACHE_TTL + Duration::from_secs(10);
    let mut missing_denials = 1.0;
    let msg = loop {
        let msg = api_error_text(&put_status(&cp, SV_NAME, status.clone()).await);
        if msg.contains("lease-not-apiserver") {
            break msg;
        }
        assert!(
            msg.contains("lease-missing"),
            "a lease of the wrong label neither missing nor not an apiserver's: {msg}"
        );
        missing_denials += 1.0;
        assert!(
            Instant::now() < end,
            "wrong label not denied as such: {msg}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        msg.contains("lease-not-apiserver"),
        "wrong label not denied: {msg}"
    );
    delete_lease(&cp, id).await;
    drop(wrong_label);

    let expired = identity_lease(id, Some("kube-apiserver"), Duration::from_secs(3 * 3600));
    create_lease(&cp, &expired).await;
    let msg = api_error_text(&put_status(&cp, SV_NAME, status.clone()).await);
    assert!(
        msg.contains("lease-expired"),
        "expired lease not denied: {msg}"
    );

    // Renew it, as kube-apiserver's lease controller would.
    let mut renewed: Lease = leases.get(id).await.expect("lease");
    renewed.spec = live_identity_lease(id).spec;
    leases
        .replace(id, &PostParams::default(), &renewed)
        .await
        .expect("renew");
    let admitted = put_status(&cp, SV_NAME, status).await;
    assert!(
        admitted.is_ok(),
        "write with a renewed lease denied: {}",
        api_error_text(&admitted)
    );

    let metrics = hook.metrics().await;
    for (code, times) in [
        ("lease-missing", missing_denials),
        ("lease-not-apiserver", 1.0),
        ("lease-expired", 1.0),
    ] {
        assert_eq!(
            findings_total(
                &metrics,
                &[&format!("code=\"{code}\""), "severity=\"deny\""]
            ),
            times,
            "{code} not counted once per denial:\n{metrics}"
        );
    }
}

/// Test 3: a lease created an instant before the write is honoured (the live fallback).
#[tokio::test(flavor = "multi_thread")]
async fn lease_created_just_before_the_write_is_honoured() {
    let (_serial, cp) = up_at(None).await;
    let (_certs, hook) = registered_webhook(&cp, &["--no-gc"], "Fail").await;
    let leases = leases(&cp);
    for i in 0..10 {
        let name = format!("{GROUP}.widgets{i}");
        let id = format!("apiserver-e2efresh{i:015}");
        create_sv(&cp, &name).await;
        create_lease(&cp, &live_identity_lease(&id)).await;
        let result = put_status(&cp, &name, status_for(GROUP, &[&id])).await;
        assert!(
            result.is_ok(),
            "write right after the lease was created was denied: {}",
            api_error_text(&result)
        );
    }
    let metrics = hook.metrics().await;
    let live = lease_lookups_total(&metrics, &["result=\"live_found\""]);
    let hits = lease_lookups_total(&metrics, &["result=\"cache_hit\""]);
    eprintln!("fresh leases: {live} live lookups, {hits} cache hits");
    assert_eq!(
        live + hits,
        10.0,
        "every write looked its lease up once:\n{metrics}"
    );

    // The watch usually wins the race above, so show the live fallback directly and
    // deterministically: a lease the watch cache cannot hold (its label is missing, and the watch
    // selects on it) is still found, by a live GET, and judged for what it is.
    let (registry, view) = synced_lease_view(&cp).await;
    let id = "apiserver-e2einstant0000000000000";
    leases
        .create(
            &PostParams::default(),
            &identity_lease(id, None, Duration::ZERO),
        )
        .await
        .expect("lease");
    let found = view.lookup(id).await;
    assert!(
        matches!(found, LeaseLookup::Found(ref r) if r.name == id),
        "fresh lease not found live: {found:?}"
    );
    let text = storageversion_webhook::metrics::encode(&registry);
    let live = lease_lookups_total(&text, &["result=\"live_found\""]);
    let hits = lease_lookups_total(&text, &["result=\"cache_hit\""]);
    assert_eq!(
        (live, hits),
        (1.0, 0.0),
        "the unsynced view must have asked the API server:\n{text}"
    );
}

#[rustfmt::skip]
on_each_version! { unchanged_stale_entry_only_warns, unchanged_stale_entry_only_warns_v1_36, unchanged_stale_entry_only_warns_on }

/// Test 4: with one stale entry stored, a write that changes only another entry is admitted and
/// the client receives our warning.
async fn unchanged_stale_entry_only_warns_on(version: Option<&str>) {
    let (_serial, cp) = up_at(version).await;
    let certs = Certs::generate();
    let live = "apiserver-e2elive00000000000000000";
    let stale = "apiserver-e2estale0000000000000000";
    create_lease(&cp, &live_identity_lease(live)).await;
    // Stored before the webhook exists: an entry whose server is gone.
    create_sv(&cp, SV_NAME).await;
    put_status(&cp, SV_NAME, status_for(GROUP, &[stale, live]))
        .await
        .expect("seed");

    let hook = Webhook::start(&cp, &certs, &["--no-gc"]).await;
    register_webhook(&cp, &hook.url(), &certs.ca_pem, "Fail").await;

    let v2 = format!("{GROUP}/v2");
    let v1 = format!("{GROUP}/v1");
    let patch = serde_json::json!({"status": {
        "storageVersions": [
            entry(stale, &v1, &[&v1]),
            {"apiServerID": live, "encodingVersion": v1, "decodableVersions": [&v1, &v2]},
        ]
    }});
    let out = kubectl_patch_status(&cp, SV_NAME, &patch);
    let said = text(&out);
    assert!(
        out.status.success(),
        "write changing only the live entry was denied: {said}"
    );
    assert!(
        said.contains("Warning:") && said.contains("lease-missing") && said.contains(stale),
        "no warning about the unchanged stale entry reached the client: {said}"
    );

    // Changing the stale entry itself is judged, and denied.
    let patch = serde_json::json!({"status": {
        "storageVersions": [
            {"apiServerID": stale, "encodingVersion": v1, "decodableVersions": [&v1, &v2]},
            {"apiServerID": live, "encodingVersion": v1, "decodableVersions": [&v1, &v2]},
        ]
    }});
    let out = kubectl_patch_status(&cp, SV_NAME, &patch);
    assert!(
        !out.status.success(),
        "changing the stale entry was admitted"
    );
    assert!(text(&out).contains("lease-missing"), "{}", text(&out));
}

/// Test 5: writes that upstream validation accepts but our beyond-upstream rules reject.
#[tokio::test(flavor = "multi_thread")]
async fn beyond_upstream_rules_deny() {
    let (_serial, cp) = up_at(None).await;
    let certs = Certs::generate();
    let id = "apiserver-e2ebeyond000000000000000";
    create_lease(&cp, &live_identity_lease(id)).await;
    create_sv(&cp, SV_NAME).await;
    let hook = Webhook::start(&cp, &certs, &["--no-gc"]).await;

    // First show upstream accepts each of them (no webhook registered yet), then that we deny.
    let cases: Vec<(&str, serde_json::Value)> = vec![
        ("encoding-group-mismatch", status_for("apps", &[id])),
        ("decodable-duplicate", {
            let mut s = status_for(GROUP, &[id]);
            let v = format!("{GROUP}/v1");
            s["storageVersions"][0]["decodableVersions"] = serde_json::json!([v, v]);
            s
        }),
        ("condition-status-unknown-value", {
            let mut s = status_for(GROUP, &[id]);
            s["conditions"].as_array_mut().expect("conditions").push(serde_json::json!({
                "type": "Example", "status": "Maybe", "reason": "Testing", "message": "a status upstream accepts",
                "lastTransitionTime": "2026-01-01T00:00:00Z"
            }));
            s
        }),
    ];
    for (code, status) in &cases {
        let result = put_status(&cp, SV_NAME, status.clone()).await;
        assert!(
            result.is_ok(),
            "upstream rejected the {code} case: {}",
            api_error_text(&result)
        );
        put_status(&cp, SV_NAME, serde_json::json!({}))
            .await
            .expect("reset");
    }
    register_webhook(&cp, &hook.url(), &certs.ca_pem, "Fail").await;
    for (code, status) in cases {
        let result = put_status(&cp, SV_NAME, status).await;
        let msg = api_error_text(&result);
        assert!(result.is_err(), "{code} case admitted");
        assert!(
            msg.contains(code) && msg.contains(WEBHOOK_NAME),
            "{code}: {msg}"
        );
    }
}

/// Test 6: warn mode admits the write of test 2 and the warning reaches the client.
#[tokio::test(flavor = "multi_thread")]
async fn warn_mode_admits_with_a_warning() {
    let (_serial, cp) = up_at(None).await;
    let (_certs, hook) = registered_webhook(&cp, &["--enforcement=warn", "--no-gc"], "Fail").await;
    create_sv(&cp, SV_NAME).await;
    let id = "apiserver-e2enolease0000000000000";
    let status = status_for(GROUP, &[id]);
    let out = kubectl_patch_status(&cp, SV_NAME, &serde_json::json!({ "status": status }));
    let said = text(&out);
    assert!(out.status.success(), "warn mode denied: {said}");
    assert!(
        said.contains("Warning:") && said.contains("lease-missing"),
        "{said}"
    );
    let sv = storage_versions(&cp).get(SV_NAME).await.expect("get");
    assert!(sv.entry(id).is_some(), "the write did not land");
    let metrics = hook.metrics().await;
    assert_eq!(
        reviews_total(&metrics, &["verdict=\"warned\""]),
        1.0,
        "{metrics}"
    );
}

/// Test 7: with the webhook stopped and failurePolicy Ignore, kube-apiserver still restarts and
/// finishes its storage version updates. Prints both restart times.
#[tokio::test(flavor = "multi_thread")]
async fn webhook_down_with_ignore_does_not_block_restart() {
    let (_serial, cp) = up_at(None).await;
    let (_certs, mut hook) = registered_webhook(&cp, &["--no-gc"], "Ignore").await;

    let (up_took, up_written) = restart_and_rewrite(&cp).await;
    hook.kill();
    let (down_took, down_written) = restart_and_rewrite(&cp).await;
    eprintln!(
        "kube-apiserver restart (delete all StorageVersions, restart, /readyz ok): \
         webhook up {up_took:?} ({up_written} objects), webhook down {down_took:?} ({down_written} objects)"
    );
    assert_eq!(
        up_written, down_written,
        "with the webhook down kube-apiserver wrote a different number of StorageVersions"
    );
    std::fs::create_dir_all(repo_root().join("target")).ok();
    std::fs::write(
        repo_root().join("target/e2e-restart-timings.txt"),
        format!(
            "webhook_up_ms={}\nwebhook_down_ms={}\n",
            up_took.as_millis(),
            down_took.as_millis()
        ),
    )
    .ok();
}

/// Test 8: the lease view follows the cluster: a lease deleted, re-created and renewed is seen
/// within a bounded time, from the cache.
#[tokio::test(flavor = "multi_thread")]
async fn lease_view_follows_the_cluster() {
    let (_serial, cp) = up_at(None).await;
    let (_registry, view) = synced_lease_view(&cp).await;
    let own = own_apiserver_id(&cp).await;
    assert!(
        view.cached_record(&own).is_some(),
        "the initial list missed {own}"
    );

    let id = "apiserver-e2eview000000000000000";
    let leases = leases(&cp);
    create_lease(&cp, &live_identity_lease(id)).await;
    wait_cached(&view, id, true, "created lease in view").await;
    delete_lease(&cp, id).await;
    wait_cached(&view, id, false, "deleted lease gone from view").await;
    // While deleted, a lookup says NotFound (confirmed live).
    assert_eq!(view.lookup(id).await, LeaseLookup::NotFound);

    let old = identity_lease(id, Some("kube-apiserver"), Duration::from_secs(600));
    create_lease(&cp, &old).await;
    wait_cached(&view, id, true, "re-created lease in view").await;
    let before = view
        .cached_record(id)
        .and_then(|r| r.renew_time)
        .expect("renew time");
    let mut lease = leases.get(id).await.expect("get");
    lease.spec = live_identity_lease(id).spec;
    leases
        .replace(id, &PostParams::default(), &lease)
        .await
        .expect("renew");
    poll_until(Duration::from_secs(10), "renewal in view", || async {
        view.cached_record(id)
            .and_then(|r| r.renew_time)
            .is_some_and(|t| t > before)
    })
    .await
    .expect("renewal seen");
    assert!(matches!(view.lookup(id).await, LeaseLookup::Found(_)));
}
