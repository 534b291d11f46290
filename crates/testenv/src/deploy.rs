//! The chart as it ships, installed on a local cluster with a real node: only the image
//! references point at the images `hack/images.sh` built. Shared by the demo and the
//! end-to-end tests.
//!
//! The cluster is arranged as a GPU cluster would be: simulated GPU nodes (kwok) carry recorded
//! node reports, published by the real `offload-agent` replaying them, and the taint GPU nodes
//! usually carry (`nvidia.com/gpu=present:NoSchedule`), so the operator's pods run on the real
//! node; the real node carries the label GPU Feature Discovery puts on GPU nodes, so the
//! chart's agent DaemonSet runs there too, and a RuntimeClass `nvidia` as the NVIDIA container
//! toolkit installs (served by runc on this node). The real node has no GPU, which its agent
//! reports.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::devcluster::node::images;
use crate::devcluster::{DevCluster, REAL_NODE, free_port, repo_root};

/// The release and namespace the chart is installed as.
pub const RELEASE: &str = "offload-operator";
/// The chart's namespace.
pub const NAMESPACE: &str = "offload-system";
/// The taint of the simulated GPU nodes, which workloads meant for them tolerate.
pub const GPU_TAINT_KEY: &str = "nvidia.com/gpu";
/// Pods with this annotation keep running on kwok nodes; the test cluster's kwok stage
/// (`kwok/pod-complete.yaml`) completes every other Job pod.
pub const KWOK_KEEP_RUNNING: &str = "offload.dev/kwok-keep-running";

/// A one-replica DeepSpeed TrainingJob of 12B parameters (too large for one GPU of either class,
/// so it is offloaded) with one `nvidia.com/gpu`, tolerating the GPU taint, for `profile`; in
/// Kueue queue `queue` and priority class `priority` where given; its pod keeps running unless
/// `completes`.
pub fn queued_training_job(
    name: &str,
    queue: Option<&str>,
    profile: &str,
    priority: Option<&str>,
    completes: bool,
) -> serde_json::Value {
    let mut labels = json!({});
    if let Some(q) = queue {
        labels[offload_api::names::KUEUE_QUEUE_LABEL] = json!(q);
    }
    if let Some(p) = priority {
        labels[offload_api::names::KUEUE_PRIORITY_LABEL] = json!(p);
    }
    let annotations = if completes {
        json!({})
    } else {
        json!({KWOK_KEEP_RUNNING: "true"})
    };
    json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {offload_api::names::PROFILE_ANNOTATION: profile}},
        "spec": {"replicas": 1, "framework": {"name": "DeepSpeed", "version": "0.19.8"},
                 "model": {"parameters": "12B"},
                 "template": {
                     "metadata": {"annotations": annotations},
                     "spec": {"tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                              "containers": [{"name": "train", "image": "train:1",
                                              "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    })
}

/// A deployment step failed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// A command failed.
    #[error("{what} failed: {detail}")]
    Command {
        /// The command.
        what: String,
        /// Its output.
        detail: String,
    },
    /// Something did not happen in time.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
    /// A manifest could not be built (a bug).
    #[error("building a manifest: {0}")]
    Json(#[from] serde_json::Error),
    /// A port could not be found.
    #[error(transparent)]
    Cluster(#[from] crate::devcluster::DevClusterError),
}

fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> DeployError {
    let what = what.into();
    move |source| DeployError::Kube { what, source }
}

/// Runs a command; its output on success, both streams in the error.
pub fn run(cmd: &mut Command, what: &str) -> Result<String, DeployError> {
    let out = cmd.output().map_err(|e| DeployError::Command {
        what: what.to_string(),
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(DeployError::Command {
            what: what.to_string(),
            detail: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A simulated (kwok) GPU node with `gpus` GPUs, tainted as GPU nodes usually are.
pub fn simulated_gpu_node(name: &str, gpus: u32) -> Result<Node, DeployError> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok"}
        },
        "spec": {"taints": [{"key": GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "72", "memory": "480Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()},
            "capacity": {"cpu": "72", "memory": "480Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()}
        }
    }))?)
}

/// Creates simulated GPU nodes and publishes each one's recorded report with the real agent
/// (`offload-agent run --once --replay`), as the agent on such a node would.
pub async fn add_simulated_gpu_nodes(
    cluster: &DevCluster,
    client: &kube::Client,
    agent: &Path,
    nodes: &[(&str, &str)],
) -> Result<(), DeployError> {
    let api: Api<Node> = Api::all(client.clone());
    for (name, fixture) in nodes {
        api.create(&PostParams::default(), &simulated_gpu_node(name, 1)?)
            .await
            .map_err(kube(format!("creating node {name}")))?;
        replay_report(cluster, agent, name, fixture)?;
    }
    Ok(())
}

/// Publishes a recorded node report (labels and annotation) on an existing node, through the
/// agent's own publishing code: a stand-in for GPU hardware that is not here.
pub fn replay_report(
    cluster: &DevCluster,
    agent: &Path,
    node: &str,
    fixture: &str,
) -> Result<(), DeployError> {
    run(
        Command::new(agent)
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env("RUST_LOG", "warn")
            .args(["run", "--once", "--node-name", node])
            .arg("--addr")
            .arg(format!("127.0.0.1:{}", free_port()?))
            .arg("--replay")
            .arg(crate::fixtures::path(fixture)),
        &format!("offload-agent on {node}"),
    )?;
    Ok(())
}

/// The real node as a GPU node looks to the chart: GPU Feature Discovery's label, and the
/// `nvidia` RuntimeClass.
pub async fn prepare_real_node(client: &kube::Client) -> Result<(), DeployError> {
    let runtime: RuntimeClass = serde_json::from_value(json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"}, "handler": "nvidia"
    }))?;
    Api::<RuntimeClass>::all(client.clone())
        .patch(
            "nvidia",
            &PatchParams::apply("offload-testenv").force(),
            &Patch::Apply(&runtime),
        )
        .await
        .map_err(kube("creating RuntimeClass nvidia"))?;
    let label = json!({"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}});
    Api::<Node>::all(client.clone())
        .patch(REAL_NODE, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .map_err(kube("labelling the real node"))?;
    Ok(())
}

/// `helm install` of the chart with the images built here; waits until every pod is ready.
/// Returns how long that took.
pub fn helm_install(cluster: &DevCluster, extra: &[String]) -> Result<Duration, DeployError> {
    let start = Instant::now();
    let chart = repo_root().join("charts/offload-operator");
    let mut cmd = cluster.helm();
    cmd.args(["install", RELEASE])
        .arg(&chart)
        .args(["--namespace", NAMESPACE, "--create-namespace"])
        .args([
            "--set",
            &format!(
                "image.repository={}",
                images::reference("offload-operator")
                    .rsplit_once(':')
                    .map_or("", |(r, _)| r)
            ),
            "--set",
            &format!("image.tag={}", images::TAG),
            "--set",
            &format!(
                "agent.image.repository={}",
                images::reference("offload-agent")
                    .rsplit_once(':')
                    .map_or("", |(r, _)| r)
            ),
            "--set",
            &format!("agent.image.tag={}", images::TAG),
            // The real node's kubelet keeps its state under the cluster's directory.
            "--set",
            &format!(
                "agent.observe.podResourcesDir={}",
                cluster
                    .kubelet_dir()
                    .unwrap_or_else(|| std::path::PathBuf::from("/var/lib/kubelet"))
                    .join("pod-resources")
                    .display()
            ),
            "--wait",
            "--timeout",
            "5m",
        ])
        .args(extra);
    run(&mut cmd, "helm install")?;
    Ok(start.elapsed())
}

/// The namespace Kueue is installed in, as its documentation installs it.
pub const KUEUE_NAMESPACE: &str = "kueue-system";

/// Kueue's configuration here: the integrations the tests use (batch Jobs; the TrainingJob's
/// workload is one), and otherwise the chart's defaults.
const KUEUE_CONFIG: &str = r#"apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
health:
  healthProbeBindAddress: :8081
metrics:
  bindAddress: :8443
webhook:
  port: 9443
leaderElection:
  leaderElect: true
  resourceName: c1f6bfd2.kueue.x-k8s.io
controller:
  groupKindConcurrency:
    Job.batch: 5
    Pod: 5
    Workload.kueue.x-k8s.io: 5
    LocalQueue.kueue.x-k8s.io: 1
    ClusterQueue.kueue.x-k8s.io: 1
    ResourceFlavor.kueue.x-k8s.io: 1
clientConnection:
  qps: 50
  burst: 100
integrations:
  frameworks:
  - "batch/job"
  - "jobset.x-k8s.io/jobset"
"#;

/// Installs Kueue with its own Helm chart (from its Go module, `hack/k8s/build.sh kueue`) and
/// the image built here, imported into the real node as a registry pull would land it; waits
/// until its controller is ready (its webhooks answer). Returns how long that took.
pub fn install_kueue(cluster: &DevCluster) -> Result<Duration, DeployError> {
    let start = Instant::now();
    let dir = crate::devcluster::ensure_kueue()?;
    let version = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("kueue-"))
        .unwrap_or_default()
        .to_string();
    cluster.import_image(&dir.join("kueue.tar"))?;
    let values = json!({
        "controllerManager": {"manager": {
            "image": {"repository": "localhost/kueue", "tag": version, "pullPolicy": "IfNotPresent"},
            // The node here has two cores.
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                          "limits": {"cpu": "2", "memory": "512Mi"}}
        }},
        "managerConfig": {"controllerManagerConfigYaml": KUEUE_CONFIG}
    });
    let values_file = cluster.root().join("kueue-values.json");
    std::fs::write(&values_file, serde_json::to_vec(&values)?).map_err(|e| {
        DeployError::Command {
            what: "writing Kueue's values".into(),
            detail: e.to_string(),
        }
    })?;
    let mut cmd = cluster.helm();
    cmd.args(["install", "kueue"])
        .arg(dir.join("chart"))
        .args(["--namespace", KUEUE_NAMESPACE, "--create-namespace"])
        .arg("--values")
        .arg(&values_file)
        .args(["--wait", "--timeout", "5m"]);
    run(&mut cmd, "helm install kueue")?;
    Ok(start.elapsed())
}
