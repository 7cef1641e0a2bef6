//! Building a Kubernetes client from `--kubeconfig`, or in-cluster config, or the usual
//! kubeconfig lookup (`KUBECONFIG`, `~/.kube/config`).

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// How long a response may stay silent. Longer than the 290 s a kube-runtime watch asks the API
/// server to keep it open (a quiet cluster sends nothing on a watch for minutes; a 30 s timeout
/// cut every idle watch about every 32 s). Unary calls carry their own, shorter deadlines
/// (admission's live lookup, the collector's calls, `audit`'s pages).
pub const READ_TIMEOUT: Duration = Duration::from_secs(295);

/// A client for the cluster of `kubeconfig` (a file path), or, when `None`, of the in-cluster
/// service account, falling back to the usual kubeconfig lookup (`$KUBECONFIG`, `~/.kube/config`).
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {} is not usable", path.display()))?
        }
        None => match kube::Config::incluster() {
            Ok(config) => config,
            Err(in_cluster) => kube::Config::from_kubeconfig(&KubeConfigOptions::default())
                .await
                .map_err(|kubeconfig| {
                    anyhow::anyhow!(
                        "no cluster configuration: not in a pod ({in_cluster}) and no usable kubeconfig ({kubeconfig}); pass --kubeconfig"
                    )
                })?,
        },
    };
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(READ_TIMEOUT);
    kube::Client::try_from(config).context("cannot build a Kubernetes client")
}
