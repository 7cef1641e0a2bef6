//! The product's container image (built by `scripts/image`, exactly as the README says) and a
//! control plane with a real node (`tests/controlplane/run up --node`, see docs/node.md).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use super::{repo_root, ControlPlane, ControlPlaneDir};

/// The image every node test runs: its tag (as podman and containerd name it) and OCI archive.
pub struct Image {
    /// `localhost/storageversion-webhook`: what the chart's `image.repository` is set to.
    pub repository: String,
    pub tag: String,
    pub archive: PathBuf,
}

impl Image {
    pub fn reference(&self) -> String {
        format!("{}:{}", self.repository, self.tag)
    }
}

/// Builds the image once per test process with `scripts/image` (a static release binary on
/// `scratch`, Dockerfile BASE=static) and saves it as an OCI archive. Without whole-program LTO
/// (profile `release-nolto`, unless `SVW_IMAGE_PROFILE` says otherwise): the tests check what the
/// image does, not how fast, and this build is the one `scripts/run` and `bench/run --quick` use.
pub fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let tag = env!("CARGO_PKG_VERSION").to_string();
        let archive =
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("storageversion-webhook.oci.tar");
        let mut cmd = Command::new(repo_root().join("scripts/image"));
        cmd.arg(format!("storageversion-webhook:{tag}"))
            .arg(&archive)
            .current_dir(repo_root());
        if std::env::var_os("SVW_IMAGE_PROFILE").is_none() {
            cmd.env("SVW_IMAGE_PROFILE", "release-nolto");
        }
        // The CARGO_* variables `cargo test` sets for this process are not the user's: without
        // them the nested release build is the one `scripts/image` run by hand made (when they
        // leaked through, the crate was rebuilt every time).
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("CARGO_") && k != "CARGO_HOME" && k != "CARGO_TARGET_DIR" {
                cmd.env_remove(&k);
            }
        }
        let out = output(&mut cmd);
        assert!(
            out.status.success(),
            "scripts/image failed ({}):\n{}",
            out.status,
            text(&out)
        );
        Image {
            repository: "localhost/storageversion-webhook".into(),
            tag,
            archive,
        }
    })
}

/// Runs `cmd` with its output captured.
pub fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// stdout and stderr of a finished command, for messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl ControlPlane {
    /// A private control plane with a node (`run up --node`) that has `images` imported.
    /// Dropping it stops everything (`run down` stops the node first).
    pub async fn up_with_node(images: &[&std::path::Path]) -> ControlPlane {
        let dir = tempfile::Builder::new()
            .prefix("svw-node-")
            .tempdir()
            .expect("temp dir for the control plane");
        let script = ControlPlaneDir(dir.path().to_path_buf());
        let kubeconfig = dir.path().join("kubeconfig");
        // The ControlPlane exists before `up` finishes so that a failed `up` is still torn down.
        let client_cfg = || async {
            storageversion_webhook::kubeclient::client(Some(&kubeconfig))
                .await
                .expect("client for the test control plane")
        };
        let result = std::panic::catch_unwind(|| script.run(&["up", "--node"]));
        if let Err(panic) = result {
            let _ = Command::new(repo_root().join("tests/controlplane/run"))
                .arg("down")
                .env("SVW_CP_DIR", dir.path())
                .status();
            std::panic::resume_unwind(panic);
        }
        let cp = ControlPlane {
            client: client_cfg().await,
            kubeconfig: kubeconfig.clone(),
            dir,
        };
        for image in images {
            cp.node(&["import", &image.display().to_string()]);
        }
        cp
    }

    /// Runs `tests/controlplane/node <args>` against this control plane; panics on failure.
    pub fn node(&self, args: &[&str]) {
        let out = output(
            Command::new(repo_root().join("tests/controlplane/node"))
                .args(args)
                .env("SVW_CP_DIR", self.state_dir()),
        );
        assert!(
            out.status.success(),
            "tests/controlplane/node {args:?} failed ({}):\n{}",
            out.status,
            text(&out)
        );
    }

    /// A log of the node's own processes (containerd, kubelet, kube-scheduler).
    pub fn node_log(&self, component: &str) -> String {
        std::fs::read_to_string(
            self.state_dir()
                .join("node")
                .join(format!("{component}.log")),
        )
        .unwrap_or_default()
    }
}
