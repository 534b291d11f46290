//! The chart as it ships, on a real node: the operator and the agent run as containers from the
//! images built here (`hack/images.sh`), under the chart's ServiceAccounts and RBAC; the API
//! server reaches the webhook through its Service; the GPU nodes are simulated by kwok with
//! recorded reports. Then the leader's container is killed while opted-in pods and
//! TrainingJobs keep coming, and `helm uninstall` runs the clean-up hook as a real Job.
//!
//! Needs root (a kubelet and containerd run here); the figures it prints go into
//! `docs/benchmarks/deploy.md`.

mod support;

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
use offload_operator::api::{OffloadProfile, TrainingJob};
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

fn training_job(name: &str) -> TrainingJob {
    serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "annotations": {names::PROFILE_ANNOTATION: "auto"}},
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
    // serves the webhook too), under the chart's ServiceAccount.
    let operators = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
        .await
        .unwrap()
        .items;
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
    tjs.create(&PostParams::default(), &training_job("in-cluster"))
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
    let mut tj = training_job("guarded");
    tj.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(names::PROFILE_ANNOTATION.into(), "real-node".into());
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
    let events = kubectl(
        cluster,
        &[
            "get",
            "events",
            "-n",
            &ns,
            "--field-selector",
            "reason=StartupGuardFailed",
            "-o",
            "name",
        ],
    );
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

/// The container ID of a pod's first container, as containerd knows it.
fn container_id(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.clone())
        .and_then(|id| id.strip_prefix("containerd://").map(str::to_string))
        .unwrap()
}

async fn failover_admits_everything_and_resolves_every_job_once(
    cluster: &DevCluster,
    client: &kube::Client,
    figures: &mut Figures,
) {
    let ns = namespace(client, "failover").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let lease = leases.get("offload-operator-leader").await.unwrap();
    let leader_identity = lease.spec.unwrap().holder_identity.unwrap();
    let leader_pod_name = leader_identity.split('_').next().unwrap().to_string();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let leader_pod = pods.get(&leader_pod_name).await.unwrap();
    let container = container_id(&leader_pod);

    // Opted-in pods and TrainingJobs keep coming while the leader's container is killed.
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let created_jobs: Arc<Mutex<Vec<String>>> = Arc::default();
    let (attempted, mut attempts_seen) = tokio::sync::watch::channel(0usize);
    let creator = {
        let (client, ns, errors, stop, created_jobs) = (
            client.clone(),
            ns.clone(),
            errors.clone(),
            stop.clone(),
            created_jobs.clone(),
        );
        tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let tjs: Api<TrainingJob> = Api::namespaced(client, &ns);
            let mut i = 0;
            let mut ticker = tokio::time::interval(Duration::from_millis(100));
            while !stop.is_cancelled() {
                ticker.tick().await;
                if let Err(e) = pods
                    .create(&PostParams::default(), &opted_pod(&format!("p-{i}")))
                    .await
                {
                    errors.lock().unwrap().push(format!("pod p-{i}: {e}"));
                }
                if i % 4 == 0 {
                    let name = format!("tj-{i}");
                    match tjs
                        .create(&PostParams::default(), &training_job(&name))
                        .await
                    {
                        Ok(_) => created_jobs.lock().unwrap().push(name),
                        Err(e) => errors
                            .lock()
                            .unwrap()
                            .push(format!("TrainingJob {name}: {e}")),
                    }
                }
                i += 1;
                attempted.send_replace(i);
            }
            i
        })
    };
    // Some admissions before the kill, with the leader serving.
    wait(
        "20 creations before the kill",
        WAIT,
        attempts_seen.wait_for(|n| *n >= 20),
    )
    .await
    .unwrap();
    let killed_at = Instant::now();
    deploy::run(
        &mut cluster.ctr(&["tasks", "kill", "--signal", "SIGKILL", &container]),
        "killing the leader's container",
    )
    .unwrap();
    let new_holder = wait(
        "the lease to move away from the killed leader",
        Duration::from_secs(60),
        kube::runtime::wait::await_condition(leases.clone(), "offload-operator-leader", {
            let old = leader_identity.clone();
            move |l: Option<&Lease>| {
                l.and_then(|l| l.spec.as_ref())
                    .and_then(|s| s.holder_identity.as_ref())
                    .is_some_and(|h| *h != old)
            }
        }),
    )
    .await
    .unwrap()
    .unwrap();
    let failover = killed_at.elapsed();
    let holder = new_holder.spec.unwrap().holder_identity.unwrap();
    // And some after the new leader took over.
    let at_takeover = *attempts_seen.borrow();
    wait(
        "20 creations after the takeover",
        WAIT,
        attempts_seen.wait_for(|n| *n >= at_takeover + 20),
    )
    .await
    .unwrap();
    stop.cancel();
    let attempts = creator.await.unwrap();
    let errors = errors.lock().unwrap().clone();
    figures.add(format!(
        "leader container killed: lease taken by {holder} after {:.1} s (lease duration 15 s); the killed replica was {leader_pod_name}",
        failover.as_secs_f64()
    ));
    assert!(
        !holder.starts_with(&format!("{leader_pod_name}_")),
        "the standby takes over, not the restarted leader: {holder}"
    );
    figures.add(format!(
        "admission during failover: {attempts} pod creations and {} TrainingJobs, {} refused{}",
        created_jobs.lock().unwrap().len(),
        errors.len(),
        errors
            .first()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default()
    ));
    assert!(failover < Duration::from_secs(15 + 10), "{failover:?}");

    // Every TrainingJob created is resolved, once: one workload Job each.
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let created = created_jobs.lock().unwrap().clone();
    wait_list(
        tjs,
        watcher::Config::default(),
        "every TrainingJob created during the failover to get its workload",
        WAIT,
        |tjs| {
            (tjs.len() == created.len()
                && tjs.iter().all(|tj| {
                    tj.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "WorkloadCreated" && c.status == "True")
                    })
                }))
            .then_some(())
        },
    )
    .await;
    let jobs = Api::<Job>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels(names::LABEL_TRAINING_JOB))
        .await
        .unwrap()
        .items;
    let mut per_job: BTreeMap<String, usize> = BTreeMap::new();
    for job in &jobs {
        *per_job
            .entry(job.metadata.name.clone().unwrap())
            .or_default() += 1;
    }
    assert_eq!(per_job.len(), created.len());
    assert!(per_job.values().all(|n| *n == 1), "{per_job:?}");
    // Both replicas are back and ready.
    wait_list(
        pods,
        watcher::Config::default().labels("app.kubernetes.io/component=operator"),
        "both operator replicas ready again",
        WAIT,
        |pods| (pods.iter().filter(|p| is_ready(p)).count() == 2).then_some(()),
    )
    .await;
    let _ = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get("offload-operator")
        .await
        .unwrap();
    let _ = Api::<OffloadProfile>::all(client.clone());
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
    for node in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        for key in names::AGENT_LABELS {
            assert!(
                !labels.contains_key(key),
                "{key} left on {:?}",
                node.metadata.name
            );
        }
        assert!(
            !node
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key(names::ANNOTATION_NODE_REPORT),
            "report left on {:?}",
            node.metadata.name
        );
    }
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

/// A process standing in for a training pod's CPU work: a shell spinning in the pod's cgroup
/// (cpu and cpuacct hierarchies), killed when dropped.
struct Spinner(std::process::Child);

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The cgroup directory of pod `uid` under `dir` (the node's cgroup in one v1 hierarchy),
/// found by walking it: independent of the agent's own search.
fn find_pod_cgroup(dir: &std::path::Path, uid: &str) -> Option<std::path::PathBuf> {
    let want = format!("pod{uid}");
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name().to_str() == Some(want.as_str()) {
            return Some(entry.path());
        }
        if let Some(found) = find_pod_cgroup(&entry.path(), uid) {
            return Some(found);
        }
    }
    None
}

/// Observed overlap on the real node: a stand-in device plugin hands out the GPUs of a recorded
/// H200 utilization trace, a TrainingJob's pod (the pause image) holds one, a process spins in
/// its cgroup; the chart's agent, told to replay the recording for NVML, attributes the GPU
/// through the kubelet's real pod-resources API and reads the pod's CPU from its real cgroup;
/// the operator shows it on the job.
async fn the_agent_observes_a_configured_pod_on_the_real_node(
    cluster: &DevCluster,
    client: &kube::Client,
    figures: &mut Figures,
) {
    use offload_api::observed::{BusySource, ObservedSummary};
    use offload_testenv::devcluster::node::images;
    use offload_testenv::device_plugin::StandInDevicePlugin;

    let trace_path = offload_testenv::fixtures::path("utilization-trace-h200.json");
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
    let recorded: BTreeMap<String, f64> = trace["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let p: Vec<f64> = g["percent"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            let mean = p.iter().sum::<f64>() / (100.0 * p.len() as f64);
            (g["uuid"].as_str().unwrap().to_string(), mean)
        })
        .collect();
    let plugin =
        StandInDevicePlugin::start(names::GPU_RESOURCE, recorded.keys().cloned().collect())
            .await
            .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    poll("the real node to advertise the stand-in GPUs", WAIT, || {
        let nodes = nodes.clone();
        let want = recorded.len().to_string();
        async move {
            let node = nodes.get(REAL_NODE).await.ok()?;
            let n = node
                .status?
                .allocatable?
                .get(names::GPU_RESOURCE)?
                .0
                .clone();
            (n == want).then_some(())
        }
    })
    .await;

    // The agent of the real node replays the recorded H200 report and utilization trace
    // (from a ConfigMap) in place of the NVML this node does not have; observation is on by
    // default, with a short window here.
    kubectl(
        cluster,
        &[
            "create",
            "configmap",
            "offload-recordings",
            "--namespace",
            NAMESPACE,
            &format!(
                "--from-file=node-report.json={}",
                offload_testenv::fixtures::path("node-report-h200.json").display()
            ),
            &format!("--from-file=trace.json={}", trace_path.display()),
        ],
    );
    let values = json!({"agent": {
        "observe": {"window": "10s"},
        "extraArgs": ["--replay=/recorded/node-report.json", "--observe-trace=/recorded/trace.json"],
        "extraVolumes": [{"name": "recorded", "configMap": {"name": "offload-recordings"}}],
        "extraVolumeMounts": [{"name": "recorded", "mountPath": "/recorded", "readOnly": true}]
    }});
    let values_file = cluster.root().join("observe-values.json");
    std::fs::write(&values_file, values.to_string()).unwrap();
    let upgraded = Instant::now();
    deploy::run(
        cluster
            .helm()
            .args(["upgrade", RELEASE])
            .arg(offload_testenv::devcluster::repo_root().join("charts/offload-operator"))
            .args(["--namespace", NAMESPACE, "--reuse-values", "-f"])
            .arg(&values_file)
            .args(["--wait", "--timeout", "5m"]),
        "helm upgrade (agent replaying recordings)",
    )
    .unwrap();
    figures.add(format!(
        "helm upgrade (observation with recordings) → ready: {:.1} s",
        upgraded.elapsed().as_secs_f64()
    ));

    create_real_node_profile(
        client,
        "observed",
        json!({"overlap": "Enabled", "startupGuard": false}),
    )
    .await;
    let ns = namespace(client, "observed").await;
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // A pod that runs: the pause image, already on the node.
    let mut tj = training_job("observed");
    tj.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(names::PROFILE_ANNOTATION.into(), "observed".into());
    let pod_spec = tj.spec.template.spec.as_mut().unwrap();
    pod_spec.containers[0].image = Some(images::reference("offload-pause"));
    pod_spec.containers[0].image_pull_policy = Some("Never".into());
    create_when_admitted(&tjs, &tj, "the observed job").await;
    let started = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = wait_list(
        pods,
        watcher::Config::default().labels(&format!("{}=observed", names::LABEL_TRAINING_JOB)),
        "the observed job's pod running on the real node",
        WAIT,
        |pods| {
            let p = pods.first()?;
            (p.status.as_ref()?.phase.as_deref() == Some("Running")).then(|| (**p).clone())
        },
    )
    .await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(REAL_NODE)
    );
    let uid = pod.metadata.uid.clone().unwrap();
    let node_cgroup = cluster.node_cgroup().unwrap();
    let spinner = Spinner(
        std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap(),
    );
    for hierarchy in ["cpu", "cpuacct"] {
        let dir = find_pod_cgroup(
            &std::path::Path::new("/sys/fs/cgroup")
                .join(hierarchy)
                .join(node_cgroup),
            &uid,
        )
        .unwrap_or_else(|| panic!("no {hierarchy} cgroup for pod {uid}"));
        std::fs::write(dir.join("cgroup.procs"), spinner.0.id().to_string()).unwrap();
    }

    // What the kubelet handed out, as the stand-in plugin saw it.
    let allocated: Vec<String> = plugin.allocations().into_iter().flatten().collect();
    assert_eq!(allocated.len(), 1, "one GPU allocated: {allocated:?}");
    let expected = recorded[&allocated[0]];

    // The node's summary: that pod, that GPU, the spinning CPU.
    let summary = poll("the agent's summary with the pod's CPU", WAIT, || {
        let nodes = nodes.clone();
        let ns = ns.clone();
        async move {
            let node = nodes.get(REAL_NODE).await.ok()?;
            let text = node
                .metadata
                .annotations?
                .get(names::ANNOTATION_OBSERVED)?
                .clone();
            let summary = ObservedSummary::parse(&text).ok()?;
            let pod = summary.pods.iter().find(|p| p.namespace == ns)?;
            (pod.cpu_cores? >= 0.5).then_some(summary)
        }
    })
    .await;
    figures.add(format!(
        "observation: job created → summary with the pod's CPU: {:.1} s (10 s windows)",
        started.elapsed().as_secs_f64()
    ));
    eprintln!("summary: {summary:?}");
    assert_eq!(summary.source, BusySource::RecordedTrace);
    let observed_pod = summary.pods.iter().find(|p| p.namespace == ns).unwrap();
    assert_eq!(observed_pod.gpus, allocated, "the kubelet's assignment");
    assert_eq!(observed_pod.training_job.as_deref(), Some("observed"));
    assert!(
        (observed_pod.gpu_busy - expected).abs() < 0.05,
        "busy {} against the recording's {expected:.3}",
        observed_pod.gpu_busy
    );
    assert!(observed_pod.cpu_cores.unwrap() <= 1.2, "{observed_pod:?}");

    // The job's story: status.observed, the condition, the Event when flagged.
    let status = wait_list(
        tjs.clone(),
        watcher::Config::default().fields("metadata.name=observed"),
        "status.observed and OverlapObserved on the job",
        WAIT,
        |jobs| {
            let v = serde_json::to_value(&*jobs.first()?.clone()).ok()?;
            let status = v.get("status")?.clone();
            status.pointer("/observed/gpuBusy")?;
            status
                .get("conditions")?
                .as_array()?
                .iter()
                .any(|c| c["type"] == "OverlapObserved")
                .then_some(status)
        },
    )
    .await;
    eprintln!("status.observed: {}", status["observed"]);
    assert_eq!(status["observed"]["gpus"], 1);
    let busy = status["observed"]["gpuBusy"].as_f64().unwrap();
    assert!((busy - expected).abs() < 0.05, "{busy} vs {expected}");
    let condition = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "OverlapObserved")
        .unwrap()
        .clone();
    let flagged = busy < 0.6;
    assert_eq!(
        condition["status"],
        if flagged { "False" } else { "True" },
        "{condition}"
    );
    if flagged {
        assert_eq!(condition["reason"], "GPUsIdle");
        poll("the GPUsIdle Event", WAIT, || async {
            let out = kubectl(
                cluster,
                &[
                    "get",
                    "events",
                    "-n",
                    &ns,
                    "--field-selector",
                    "reason=GPUsIdle",
                    "-o",
                    "name",
                ],
            );
            (!out.trim().is_empty()).then_some(())
        })
        .await;
    }
    let shown = kubectl(cluster, &["get", "trainingjobs", "-n", &ns]);
    eprintln!("{shown}");
    assert!(shown.contains("GPU-BUSY"), "{shown}");

    // The job gone and the spinner stopped: the next window clears the node's summary.
    drop(spinner);
    tjs.delete("observed", &Default::default()).await.unwrap();
    poll("the node's summary cleared", WAIT, || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(REAL_NODE).await.ok()?;
            (!node
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key(names::ANNOTATION_OBSERVED))
            .then_some(())
        }
    })
    .await;
    drop(plugin);
    kubectl(cluster, &["delete", "namespace", &ns, "--wait=false"]);
    kubectl(cluster, &["delete", "offloadprofile", "observed"]);
    // The recordings are this test's, not the chart's: the uninstall check must not find them.
    kubectl(
        cluster,
        &[
            "delete",
            "configmap",
            "offload-recordings",
            "--namespace",
            NAMESPACE,
        ],
    );
}
