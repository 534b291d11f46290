//! Where the upstream binaries come from: `hack/k8s/build.sh` builds them from their Go modules
//! into a cache outside the clone, keyed by version.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::DevClusterError;

/// Where the control-plane binaries live: `$OFFLOAD_K8S_BIN_DIR`, else the cache directory
/// `hack/k8s/build.sh` builds into. Builds them (with progress on stderr) when missing.
pub fn ensure_binaries() -> Result<PathBuf, DevClusterError> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| build("OFFLOAD_K8S_BIN_DIR", &[]))
        .clone()
        .map_err(DevClusterError::Binaries)
}

/// Where the real node's binaries live (kubelet, kube-proxy, containerd, its shim, ctr, CNI
/// plugins): `$OFFLOAD_NODE_BIN_DIR`, else `hack/k8s/build.sh node`'s cache directory. Builds
/// them when missing.
pub fn ensure_node_binaries() -> Result<PathBuf, DevClusterError> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| build("OFFLOAD_NODE_BIN_DIR", &["node"]))
        .clone()
        .map_err(DevClusterError::Binaries)
}

/// The upstream CRDs and example manifests of JobSet, Kubeflow Trainer (current and the last
/// release with `podTemplateOverrides`) and the Training Operator, fetched from their Go modules
/// at the versions pinned in `hack/k8s/versions.env` (`OFFLOAD_JOB_KINDS_DIR` overrides).
pub fn ensure_job_kinds() -> Result<PathBuf, DevClusterError> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| build("OFFLOAD_JOB_KINDS_DIR", &["jobkinds"]))
        .clone()
        .map_err(DevClusterError::Binaries)
}

/// Kueue at the version pinned in `hack/k8s/versions.env`: its controller's image
/// (`kueue.tar`, `localhost/kueue:v<version>`) and its Helm chart (`chart/`), built by
/// `hack/k8s/build.sh kueue` (`OFFLOAD_KUEUE_DIR` overrides).
pub fn ensure_kueue() -> Result<PathBuf, DevClusterError> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| build("OFFLOAD_KUEUE_DIR", &["kueue"]))
        .clone()
        .map_err(DevClusterError::Binaries)
}

fn build(env: &str, args: &[&str]) -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var(env) {
        return Ok(PathBuf::from(dir));
    }
    let script = repo_root().join("hack/k8s/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}); see its output above",
            script.display(),
            out.status
        ));
    }
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    Ok(PathBuf::from(dir))
}

/// The repository root (this crate lives in `crates/testenv`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}
