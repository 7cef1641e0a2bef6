//! `cleanup`: what the chart's `post-delete` Job runs after `helm uninstall` removed the release.
//! The running pods made objects Helm does not know about: the collector's leader Lease, its
//! journal ConfigMap (`<lease>-journal`) and the migration state ConfigMap; and the last `helm
//! test` pod is kept for its logs. This deletes exactly those, by name.
//!
//! Order: first it waits until no pod matching `--wait-for-pods` is left (the webhook's pods,
//! which Kubernetes' garbage collector deletes after their Deployment): while one runs it can
//! re-create the Lease (every replica takes part in the election) or re-write the ConfigMap. Then
//! it deletes, and checks that each object is gone or going. A ConfigMap that does not carry the
//! label serve puts on its ConfigMaps is left alone (it is someone else's).
//!
//! Exit 0 when every named object is gone, 1 when one could not be deleted.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, Preconditions};

use crate::duration::parse_positive_duration;
use crate::migrate::state::STATE_LABEL;

/// Exit status when an object could not be deleted.
const EXIT_FAILED: u8 = 1;
/// How long each API call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, clap::Args)]
#[command(after_help = "\
What the chart's post-delete hook runs (its ServiceAccount needs, in the namespace: list pods; \
get/delete the named Lease, ConfigMaps and pods). Objects already gone are fine. Exit status: 0 \
when every named object is gone, 1 when one could not be deleted.")]
pub struct CleanupArgs {
    /// kubeconfig file; without it, the in-cluster configuration, $KUBECONFIG or ~/.kube/config.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the objects.
    #[arg(long)]
    pub namespace: String,
    /// The garbage collector's leader Lease (`serve --gc-leader-lease-name`); its journal
    /// ConfigMap `<NAME>-journal` goes too (only if it carries the label serve writes).
    #[arg(long, value_name = "NAME")]
    pub leader_lease: Option<String>,
    /// The migration state ConfigMap (`serve --migrate-state-configmap`); deleted only if it
    /// carries the label `serve --migrate` writes.
    #[arg(long, value_name = "NAME")]
    pub migrate_state_configmap: Option<String>,
    /// A pod to delete (repeatable), e.g. the last `helm test` pod.
    #[arg(long = "pod", value_name = "NAME")]
    pub pods: Vec<String>,
    /// Before deleting, wait until no pod matches this label selector (the webhook's pods).
    #[arg(long, value_name = "SELECTOR")]
    pub wait_for_pods: Option<String>,
    /// Longest wait for those pods to go; after it, the objects are deleted anyway (and a
    /// replica still running may make its Lease again).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_positive_duration)]
    pub pods_timeout: Duration,
}

/// `storageversion-webhook cleanup`.
pub fn run(args: CleanupArgs) -> ExitCode {
    super::block_on(async move {
        let client = match crate::kubeclient::client(args.kubeconfig.as_deref()).await {
            Ok(c) => c,
            Err(e) => {
                println!("FAIL: no Kubernetes client: {e:#}");
                return ExitCode::from(EXIT_FAILED);
            }
        };
        let failures = cleanup(&client, &args).await;
        if failures.is_empty() {
            println!("cleanup done");
            ExitCode::SUCCESS
        } else {
            for f in &failures {
                println!("FAIL: {f}");
            }
            ExitCode::from(EXIT_FAILED)
        }
    })
}

async fn cleanup(client: &kube::Client, args: &CleanupArgs) -> Vec<String> {
    let ns = args.namespace.as_str();
    let mut failures = Vec::new();
    if let Some(selector) = &args.wait_for_pods {
        wait_for_pods(client, ns, selector, args.pods_timeout).await;
    }
    if let Some(name) = &args.leader_lease {
        let api: Api<Lease> = Api::namespaced(client.clone(), ns);
        if let Err(e) = delete(&api, "Lease", ns, name, None).await {
            failures.push(e);
        }
    }
    if let Some(lease) = &args.leader_lease {
        let name = crate::gc::collector::journal_name(lease);
        if let Err(e) = delete_ours(client, ns, &name, "serve's garbage collector").await {
            failures.push(e);
        }
    }
    if let Some(name) = &args.migrate_state_configmap {
        if let Err(e) = delete_ours(client, ns, name, "serve --migrate").await {
            failures.push(e);
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for name in &args.pods {
        if let Err(e) = delete(&pods, "Pod", ns, name, None).await {
            failures.push(e);
        }
    }
    failures
}

/// Deletes the ConfigMap `name` if it carries the label serve writes on its own ConfigMaps
/// (the migration state, the collector's journal); leaves any other alone. `writer` names who
/// makes it, for the message.
async fn delete_ours(
    client: &kube::Client,
    ns: &str,
    name: &str,
    writer: &str,
) -> Result<(), String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    match call(api.get_opt(name)).await {
        Err(e) => Err(format!("cannot read ConfigMap {ns}/{name}: {e}")),
        Ok(None) => {
            println!("ConfigMap {ns}/{name}: not there");
            Ok(())
        }
        Ok(Some(cm)) => {
            let labels = cm.metadata.labels.unwrap_or_default();
            if labels.get(STATE_LABEL.0).map(String::as_str) == Some(STATE_LABEL.1) {
                delete(&api, "ConfigMap", ns, name, cm.metadata.uid).await
            } else {
                println!(
                    "ConfigMap {ns}/{name}: left alone, it has no label {}={} (not made by {writer})",
                    STATE_LABEL.0, STATE_LABEL.1
                );
                Ok(())
            }
        }
    }
}

/// One API call with [`CALL_TIMEOUT`].
async fn call<T>(
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
    }
}

/// Deletes `name` (with a uid precondition when given), then checks that it is gone or being
/// deleted. NotFound is success.
async fn delete<K>(
    api: &Api<K>,
    kind: &str,
    ns: &str,
    name: &str,
    uid: Option<String>,
) -> Result<(), String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let dp = DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match tokio::time::timeout(CALL_TIMEOUT, api.delete(name, &dp)).await {
        Ok(Ok(_)) => {}
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
            println!("{kind} {ns}/{name}: not there");
            return Ok(());
        }
        Ok(Err(e)) => return Err(format!("cannot delete {kind} {ns}/{name}: {e}")),
        Err(_) => {
            return Err(format!(
                "deleting {kind} {ns}/{name}: no answer within {CALL_TIMEOUT:?}"
            ))
        }
    }
    match call(api.get_opt(name)).await {
        Ok(None) => {
            println!("{kind} {ns}/{name}: deleted");
            Ok(())
        }
        Ok(Some(o)) if o.meta().deletion_timestamp.is_some() => {
            println!("{kind} {ns}/{name}: being deleted");
            Ok(())
        }
        Ok(Some(_)) => Err(format!(
            "{kind} {ns}/{name} is still there after its deletion (made again?)"
        )),
        Err(e) => Err(format!("cannot check that {kind} {ns}/{name} is gone: {e}")),
    }
}

/// Waits (polling every second, at most `timeout`) until no pod in `ns` matches `selector`.
async fn wait_for_pods(client: &kube::Client, ns: &str, selector: &str, timeout: Duration) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(selector);
    let end = Instant::now() + timeout;
    let mut said = None;
    loop {
        let left = call(api.list(&lp)).await.map(|l| l.items.len());
        match left {
            Ok(0) => {
                println!("no pod matches {selector}");
                return;
            }
            Ok(n) if said != Some(n) => {
                println!("waiting for {n} pod(s) matching {selector} to go");
                said = Some(n);
            }
            Ok(_) => {}
            Err(e) => println!("cannot list pods matching {selector}: {e}"),
        }
        if Instant::now() >= end {
            println!(
                "pods matching {selector} still there after {timeout:?}; deleting anyway (a replica still running may make its Lease again)"
            );
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
