//! The chart as it ships, on a real node: the operator and the agent run as containers from the
//! images built here (`hack/images.sh`), under the chart's ServiceAccounts and RBAC; the API
//! server reaches the webhook through its Service; the GPU nodes are simulated by kwok with
//! recorded reports. Then the leader's container is killed while opted-in pods and
//! TrainingJobs keep coming, and `helm uninstall` runs the clean-up hook as a real Job.
//!
//! Needs root (a kubelet and containerd run here); the figures it prints go into
//! `docs/benchmarks/deploy.md`.

use offload_testenv::support;

#[path = "deploy/failover.rs"]
mod failover;
#[path = "deploy/monitoring.rs"]
mod monitoring;
#[path = "deploy/overlap_observed.rs"]
mod overlap_observed;
#[path = "deploy/recovery.rs"]
mod recovery;
use failover::failover_admits_everything_and_resolves_every_job_once;
use overlap_observed::the_agent_observes_a_configured_pod_on_the_real_node;
use recovery::out_of_memory_on_the_real_node_is_recovered;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use offload_api::names;
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};
use offload_testenv::deploy::{self, GPU_TAINT_KEY, NAMESPACE, RELEASE};
use offload_testenv::devcluster::{ClusterOptions, DevCluster, REAL_NODE};
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(180);

fn toleration() -> serde_json::Value {
    json!([{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}])
}

fn opted_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {names::PROFILE_ANNOTATION: "auto"}},
        "spec": {"tolerations": toleration(),
                 "containers": [{"name": "train", "image": "train:1",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap()
}

fn training_job(name: &str, profile: &str) -> TrainingJob {
    serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "annotations": {names::PROFILE_ANNOTATION: profile}},
        "spec": {"replicas": 1, "framework": {"name": "DeepSpeed", "version": "0.19.8"},
                 "template": {"spec": {"tolerations": toleration(),
                     "containers": [{"name": "train", "image": "train:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    }))
    .unwrap()
}

/// Creates a TrainingJob once the webhook admits it: the webhook refuses a job for a profile
/// whose node it has not seen yet, so this waits for its view.
async fn create_when_admitted(tjs: &Api<TrainingJob>, tj: &TrainingJob, what: &str) {
    poll(&format!("the webhook to admit {what}"), WAIT, || {
        let tjs = tjs.clone();
        let tj = tj.clone();
        async move {
            match tjs.create(&PostParams::default(), &tj).await {
                Ok(_) => Some(()),
                Err(e) => {
                    eprintln!("not yet: {e}");
                    None
                }
            }
        }
    })
    .await;
}

/// Creates an OffloadProfile that selects only the real node, with `extra` merged into its
/// spec.
async fn create_real_node_profile(client: &kube::Client, name: &str, extra: serde_json::Value) {
    let mut spec = json!({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": REAL_NODE}}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    let profile: OffloadProfile = serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap();
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Figures of the run, printed at the end for `docs/benchmarks/deploy.md`.
#[derive(Default)]
struct Figures {
    lines: Vec<String>,
}

impl Figures {
    fn add(&mut self, line: String) {
        eprintln!("figure: {line}");
        self.lines.push(line);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_on_a_real_node_fails_over_and_uninstalls_cleanly() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: a real node needs root (kubelet, containerd, cgroups, iptables)");
        return;
    }
    let mut figures = Figures::default();
    let started = Instant::now();
    let cluster = DevCluster::start(ClusterOptions::with_real_node())
        .await
        .unwrap_or_else(|e| panic!("starting the cluster with a real node: {e}"));
    figures.add(format!(
        "control plane and real node Ready: {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    let client = cluster.client().await.unwrap();
    apply_crds(&client).await;

    deploy::prepare_real_node(&client).await.unwrap();
    let agent = workspace_binary("offload-agent");
    deploy::add_simulated_gpu_nodes(
        &cluster,
        &client,
        &agent,
        &[
            ("gh200-0", "node-report-gh200.json"),
            ("gh200-1", "node-report-gh200.json"),
            ("h200-0", "node-report-h200.json"),
        ],
    )
    .await
    .unwrap();

    // helm install of the chart as it ships, only the images pointed at the ones built here.
    let took = deploy::helm_install(&cluster, &[]).unwrap();
    figures.add(format!(
        "helm install → every pod ready: {:.1} s",
        took.as_secs_f64()
    ));

    installation_runs_from_its_images_on_the_real_node(&cluster, &client).await;
    the_webhook_and_controller_work_in_cluster(&client).await;
    let out = kubectl(
        &cluster,
        &[
            "--namespace",
            NAMESPACE,
            "logs",
            "-l",
            "app.kubernetes.io/component=operator",
            "--tail=5",
        ],
    );
    eprintln!("operator logs (tail):\n{out}");
    helm_test_passes(&cluster);
    the_start_up_guard_stops_a_pod_on_the_wrong_node(&cluster, &client, &agent, &mut figures).await;
    failover_admits_everything_and_resolves_every_job_once(&cluster, &client, &mut figures).await;
    the_agent_observes_a_configured_pod_on_the_real_node(&cluster, &client, &mut figures).await;
    out_of_memory_on_the_real_node_is_recovered(&cluster, &client).await;
    uninstall_leaves_nothing_behind(&cluster, &client).await;

    eprintln!("\n--- figures ---");
    for line in &figures.lines {
        eprintln!("{line}");
    }
}

async fn installation_runs_from_its_images_on_the_real_node(
    cluster: &DevCluster,
    client: &kube::Client,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    // Two operator replicas, both Running on the real node and both ready (the standby
    // serves the webhook too), under the chart's ServiceAccount. Waited for: on a loaded
    // machine a readiness probe can miss once after `helm install --wait` saw them ready.
    let operators = poll("both operator replicas ready", WAIT, || {
        let pods = pods.clone();
        async move {
            let items = pods
                .list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
                .await
                .ok()?
                .items;
            (items.len() == 2 && items.iter().all(is_ready)).then_some(items)
        }
    })
    .await;
    assert_eq!(operators.len(), 2, "two operator replicas");
    for pod in &operators {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some(REAL_NODE));
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("offload-operator")
        );
        assert!(
            spec.containers[0]
                .image
                .as_deref()
                .unwrap()
                .starts_with("localhost/offload-operator:")
        );
        assert!(is_ready(pod), "{:?} not ready", pod.metadata.name);
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    let ready_endpoints = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=offload-operator-webhook"))
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .count();
    assert_eq!(ready_endpoints, 2, "the webhook Service has both replicas");

    // The agent DaemonSet's pod runs on the real node, which has no GPU: it says so in its
    // report and logs, writes no memory-model label, and stays healthy.
    let agent = wait_list(
        pods.clone(),
        watcher::Config::default().labels("app.kubernetes.io/component=agent"),
        "the agent pod Running on the real node",
        WAIT,
        |pods| {
            pods.iter()
                .find(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(REAL_NODE)
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .map(|p| Pod::clone(p))
        },
    )
    .await;
    let node = wait(
        "the agent's report on the real node",
        WAIT,
        kube::runtime::wait::await_condition(
            Api::<Node>::all(client.clone()),
            REAL_NODE,
            |n: Option<&Node>| {
                n.and_then(|n| n.metadata.annotations.as_ref())
                    .is_some_and(|a| a.contains_key(names::ANNOTATION_NODE_REPORT))
            },
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let report: serde_json::Value =
        serde_json::from_str(&annotations[names::ANNOTATION_NODE_REPORT]).unwrap();
    assert_eq!(report["memoryModel"], "unknown", "{report}");
    assert_eq!(report["nvml"]["available"], false, "{report}");
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for key in [
        names::LABEL_UMA,
        names::LABEL_ADDRESSING_MODE,
        names::LABEL_C2C,
    ] {
        assert!(
            !labels.contains_key(key),
            "{key} on a node without GPU: {labels:?}"
        );
    }
    assert_eq!(labels[names::LABEL_OVERLAP], "untested");
    let logs = kubectl(
        cluster,
        &[
            "--namespace",
            NAMESPACE,
            "logs",
            agent.metadata.name.as_deref().unwrap(),
        ],
    );
    assert!(
        logs.contains("measured") && logs.contains("unknown"),
        "agent logs: {logs}"
    );
    let restarts: i32 = agent
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).sum());
    assert_eq!(restarts, 0, "the agent stays up");
    let ds = Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
        .get("offload-agent")
        .await
        .unwrap();
    assert!(ds.status.unwrap().number_ready >= 1);
}

async fn the_webhook_and_controller_work_in_cluster(client: &kube::Client) {
    let ns = namespace(client, "e2e").await;
    // A labelled pod goes through the webhook, reached by the API server through its Service.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = pods
        .create(&PostParams::default(), &opted_pod("configured"))
        .await
        .unwrap();
    let env: Vec<String> = pod.spec.unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| format!("{}={}", e.name, e.value.clone().unwrap_or_default()))
        .collect();
    assert!(
        env.contains(&"OFFLOAD_MODE=unified-memory".to_string()),
        "{env:?}"
    );
    // A TrainingJob is resolved by the operator running in the cluster; its pod lands on a
    // simulated coherent node.
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    tjs.create(&PostParams::default(), &training_job("in-cluster", "auto"))
        .await
        .unwrap();
    wait_list(
        pods,
        watcher::Config::default().labels("offload.dev/training-job=in-cluster"),
        "the in-cluster job's pod on a coherent node",
        WAIT,
        |pods| {
            pods.iter()
                .find(|p| {
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .is_some_and(|n| n.starts_with("gh200-"))
                })
                .map(|_| ())
        },
    )
    .await;
}

/// The real node made to look like a discrete GPU node (a recorded H200 report, a GPU in its
/// capacity), then a TrainingJob placed there: its pod's start-up guard runs from the agent
/// image on the real kubelet, finds no NVIDIA driver, fails the pod with the reason, and the
/// operator shows that on the TrainingJob as a condition and an Event.
async fn the_start_up_guard_stops_a_pod_on_the_wrong_node(
    cluster: &DevCluster,
    client: &kube::Client,
    agent: &std::path::Path,
    figures: &mut Figures,
) {
    deploy::replay_report(cluster, agent, REAL_NODE, "node-report-h200.json").unwrap();
    let capacity = json!({"status": {"capacity": {"nvidia.com/gpu": "1"}}});
    Api::<Node>::all(client.clone())
        .patch_status(
            REAL_NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&capacity),
        )
        .await
        .unwrap();
    create_real_node_profile(client, "real-node", json!({})).await;
    let ns = namespace(client, "guard").await;
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let tj = training_job("guarded", "real-node");
    let started = Instant::now();
    create_when_admitted(&tjs, &tj, "the guarded job").await;
    let message = wait_list(
        tjs,
        watcher::Config::default().fields("metadata.name=guarded"),
        "NodeVerified=False on the guarded job",
        WAIT,
        |jobs| {
            jobs.first()?
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == "NodeVerified" && c.status == "False")
                .map(|c| c.message.clone())
        },
    )
    .await;
    figures.add(format!(
        "start-up guard: job created → NodeVerified=False in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    eprintln!("guard message: {message}");
    assert!(
        message.contains(&format!("on node {REAL_NODE}"))
            && message.contains("sees no NVIDIA driver")
            && message.contains("configured for cpu-copy offload"),
        "{message}"
    );
    let events = events_with_reason(cluster, &ns, "StartupGuardFailed");
    assert!(!events.trim().is_empty(), "an Event says so too");
    // Leave the real node as it was for what follows.
    kubectl(cluster, &["delete", "namespace", &ns, "--wait=false"]);
    kubectl(cluster, &["delete", "offloadprofile", "real-node"]);
}

fn helm_test_passes(cluster: &DevCluster) {
    let out = deploy::run(
        cluster.helm().args([
            "test",
            RELEASE,
            "--namespace",
            NAMESPACE,
            "--logs",
            "--timeout",
            "3m",
        ]),
        "helm test",
    )
    .unwrap();
    assert!(
        out.contains("Phase:          Succeeded") || out.contains("Succeeded"),
        "{out}"
    );
    assert!(out.contains("admission webhooks answered"), "{out}");
}

async fn uninstall_leaves_nothing_behind(cluster: &DevCluster, client: &kube::Client) {
    deploy::run(
        cluster.helm().args([
            "uninstall",
            RELEASE,
            "--namespace",
            NAMESPACE,
            "--wait",
            "--timeout",
            "3m",
        ]),
        "helm uninstall",
    )
    .unwrap();
    // The pods of the release go away.
    wait_list(
        Api::<Pod>::namespaced(client.clone(), NAMESPACE),
        watcher::Config::default(),
        "every pod of the release to be gone",
        WAIT,
        |pods| pods.is_empty().then_some(()),
    )
    .await;
    // The clean-up hook ran as a real Job: no node keeps an agent label or report; the operator's
    // run-time objects are gone.
    assert_agent_left_nothing(client).await;
    let left = kubectl(
        cluster,
        &[
            "get",
            "all,secrets,leases,serviceaccounts,roles,rolebindings,configmaps",
            "-n",
            NAMESPACE,
            "-o",
            "name",
        ],
    );
    let left: Vec<&str> = left
        .lines()
        .filter(|l| !l.ends_with("/kube-root-ca.crt") && !l.ends_with("serviceaccount/default"))
        .collect();
    assert!(left.is_empty(), "left behind in {NAMESPACE}: {left:?}");
    let cluster_wide = kubectl(
        cluster,
        &[
            "get",
            "clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations,validatingadmissionpolicies,validatingadmissionpolicybindings",
            "-o",
            "name",
        ],
    );
    assert!(!cluster_wide.contains("offload"), "{cluster_wide}");
}
