//! TrainingJobs and opted-in batch Jobs under the real Kueue: Kueue installed with its own Helm
//! chart and an image of its controller built here (`hack/k8s/build.sh kueue`), running on the
//! real node beside the operator's chart, which creates one ResourceFlavor per node class. The
//! GPU nodes are simulated (kwok) with recorded reports of a GH200 and an H200 node.
//!
//! Each ClusterQueue lists the discrete flavor before the coherent one, both with free quota, so
//! a coherent job admitted to the coherent flavor shows that Kueue's flavor assignment follows
//! the class the operator pinned the job to, not the order of the queue. Needs root (a kubelet
//! and containerd run here); the figures it prints go into `docs/benchmarks/kueue.md`.

use offload_testenv::support;

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use offload_api::names;
use offload_api::v1alpha1::{JobPhase, OffloadMode, OffloadProfile, TrainingJob};
use offload_testenv::deploy::{self, GPU_TAINT_KEY};
use offload_testenv::devcluster::{ClusterOptions, DevCluster};
use offload_testenv::fixtures;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(180);

/// A ClusterQueue with both flavors, the discrete one first, one GPU of quota in each, and
/// preemption of lower-priority workloads inside the queue.
fn cluster_queue(name: &str, flavors: &[&str]) -> String {
    let flavors: Vec<serde_json::Value> = flavors
        .iter()
        .map(|f| {
            json!({"name": f, "resources": [
                {"name": "cpu", "nominalQuota": 64},
                {"name": "memory", "nominalQuota": "512Gi"},
                {"name": "nvidia.com/gpu", "nominalQuota": 1}
            ]})
        })
        .collect();
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                "flavors": flavors}]
        }
    })
    .to_string()
}

/// A ClusterQueue that covers GPUs only (as many GPU platforms quota them): one GPU of the
/// discrete flavor.
fn gpu_only_cluster_queue(name: &str) -> String {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                                "flavors": [{"name": "offload-discrete", "resources": [
                                    {"name": "nvidia.com/gpu", "nominalQuota": 1}]}]}]
        }
    })
    .to_string()
}

fn local_queue(ns: &str, name: &str, cq: &str) -> String {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterQueue": cq}
    })
    .to_string()
}

fn priority_class(name: &str, value: i32) -> String {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
        "metadata": {"name": name}, "value": value,
        "description": format!("{name} priority for the Kueue test")
    })
    .to_string()
}

fn apply(cluster: &DevCluster, manifest: &str) {
    let (ok, out, err) = kubectl_result(cluster, &["apply", "-f", "-"], Some(manifest));
    assert!(ok, "kubectl apply: {out}{err}\n{manifest}");
}

fn queued_job(
    name: &str,
    queue: &str,
    profile: &str,
    priority: Option<&str>,
    completes: bool,
) -> TrainingJob {
    serde_json::from_value(deploy::queued_training_job(
        name,
        Some(queue),
        profile,
        priority,
        completes,
    ))
    .unwrap()
}

/// Creates an object once the webhooks admit it: Kueue's webhooks answer only once its
/// certificates are in place, the operator's once it has seen the nodes.
async fn create_when_admitted<K>(api: &Api<K>, obj: &K, what: &str)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    poll(&format!("the webhooks to admit {what}"), WAIT, || {
        let api = api.clone();
        let obj = obj.clone();
        async move {
            match api.create(&PostParams::default(), &obj).await {
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

fn phase_is(phase: JobPhase) -> impl Fn(Option<&TrainingJob>) -> bool {
    move |tj: Option<&TrainingJob>| {
        tj.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.phase == Some(phase))
    }
}

fn admitted_reason(tj: &TrainingJob) -> Option<(String, String, String)> {
    tj.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Admitted")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn wait_tj(
    api: &Api<TrainingJob>,
    name: &str,
    what: &str,
    cond: impl Fn(Option<&TrainingJob>) -> bool,
) -> TrainingJob {
    wait(what, WAIT, await_condition(api.clone(), name, cond))
        .await
        .unwrap()
        .unwrap()
}

/// The flavor Kueue assigned to the Job's pods: the node labels it injected, as kube-scheduler
/// then placed them, and the node they run on.
async fn running_pod(client: &kube::Client, ns: &str, job: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_list(
        pods,
        kube::runtime::watcher::Config::default().labels(&format!("job-name={job}")),
        &format!("a running pod of {job}"),
        WAIT,
        |pods| {
            pods.iter()
                .find(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .map(|p| Pod::clone(p))
        },
    )
    .await
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// The pod template's offload environment, as the Job carries it.
async fn job_env(jobs: &Api<Job>, name: &str) -> serde_json::Value {
    let job = jobs.get(name).await.unwrap();
    let spec = job.spec.unwrap().template.spec.unwrap();
    serde_json::to_value(&spec.containers[0].env).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_jobs_are_admitted_to_the_flavor_of_their_node_class() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: a real node needs root (kubelet, containerd, cgroups, iptables)");
        return;
    }
    let (cluster, client) = cluster_with_kueue().await;
    let s = teams(&cluster, client).await;
    let first_pod = a_coherent_job_is_admitted_to_the_coherent_flavor(&s).await;
    let low = a_discrete_job_runs_on_the_discrete_flavor(&s).await;
    jobs_wait_for_their_own_flavor(&s).await;
    the_waiting_job_is_admitted_when_one_finishes(&s, &first_pod).await;
    a_preempted_job_resumes_configured_as_before(&s, low).await;
    an_opted_in_batch_job_is_configured_and_admitted(&s).await;
    a_gpu_only_queue_admits_a_guarded_job(&s).await;
    jobset_under_kueue(s.cluster, &s.client, &s.ns).await;

    let listed = kubectl(
        s.cluster,
        &[
            "--namespace",
            &s.ns,
            "get",
            "trainingjobs,workloads.kueue.x-k8s.io",
        ],
    );
    eprintln!("{listed}");
    drop(cluster);
}

/// The test's cluster, its queues and the API of its namespace.
struct Teams<'a> {
    cluster: &'a DevCluster,
    client: kube::Client,
    ns: String,
    tjs: Api<TrainingJob>,
    jobs: Api<Job>,
}

/// The cluster with a real node, simulated GPU nodes of both classes, JobSet's CRD, Kueue and
/// the operator (its chart's flavors on), each installed with its chart.
async fn cluster_with_kueue() -> (DevCluster, kube::Client) {
    let started = Instant::now();
    let cluster = DevCluster::start(ClusterOptions::with_real_node())
        .await
        .unwrap_or_else(|e| panic!("starting the cluster with a real node: {e}"));
    let client = cluster.client().await.unwrap();
    eprintln!(
        "figure: control plane and real node Ready: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    deploy::prepare_real_node(&client).await.unwrap();
    // Simulated GPU nodes of both classes, eight GPUs each, tainted as GPU nodes are so that
    // Kueue's and the operator's own pods stay on the real node.
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, fixture) in [
        ("gh200-k", fixtures::GH200_REFERENCE),
        ("h200-k", fixtures::H200_READING),
    ] {
        let mut node = reported_node(name, fixture, "kueue");
        node.spec = Some(
            serde_json::from_value(json!({"taints": [
            {"key": GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"}]}))
            .unwrap(),
        );
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }

    // JobSet's CRD before Kueue starts, so that Kueue's JobSet integration is on (no JobSet
    // controller runs here: what is checked is what both webhooks and Kueue's admission write).
    let kinds = offload_testenv::devcluster::ensure_job_kinds().unwrap();
    let crd = kinds.join("jobset/jobset.x-k8s.io_jobsets.yaml");
    kubectl(
        &cluster,
        &["apply", "--server-side", "-f", &crd.display().to_string()],
    );
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    wait(
        "JobSet's CRD established",
        WAIT,
        await_condition(
            crds,
            "jobsets.jobset.x-k8s.io",
            kube::runtime::wait::conditions::is_crd_established(),
        ),
    )
    .await
    .unwrap();

    let took = deploy::install_kueue(&cluster).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "figure: helm install kueue → controller ready: {:.1} s",
        took.as_secs_f64()
    );
    let took = deploy::helm_install(
        &cluster,
        &["--set".into(), "kueue.resourceFlavors.enabled=true".into()],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "figure: helm install offload-operator → every pod ready: {:.1} s",
        took.as_secs_f64()
    );

    // The chart's flavors carry the labels the operator pins each class by.
    let flavor = |name: &str| -> serde_json::Value {
        serde_json::from_str(&kubectl(
            &cluster,
            &["get", "resourceflavors.kueue.x-k8s.io", name, "-o", "json"],
        ))
        .unwrap()
    };
    assert_eq!(
        flavor("offload-coherent")["spec"]["nodeLabels"],
        json!({"offload.dev/uma": "true", "offload.dev/addressing-mode": "ats", "offload.dev/c2c": "true"})
    );
    assert_eq!(
        flavor("offload-discrete")["spec"]["nodeLabels"],
        json!({"offload.dev/uma": "false"})
    );

    (cluster, client)
}

/// Profiles per class; queues for two teams, one whose only flavor is discrete, one for JobSets.
async fn teams(cluster: &DevCluster, client: kube::Client) -> Teams<'_> {
    // Profiles per class; queues for two teams and one whose only flavor is discrete.
    let profiles: Api<OffloadProfile> = Api::all(client.clone());
    for (name, uma) in [("coherent", "true"), ("discrete", "false")] {
        let profile: OffloadProfile = serde_json::from_value(json!({
            "apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile",
            "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {"offload.dev/test-pool": "kueue", names::LABEL_UMA: uma}}}
        }))
        .unwrap();
        profiles
            .create(&PostParams::default(), &profile)
            .await
            .unwrap();
    }
    let ns = namespace(&client, "kueue").await;
    for manifest in [
        priority_class("low", 100),
        priority_class("high", 1000),
        cluster_queue("team-a", &["offload-discrete", "offload-coherent"]),
        cluster_queue("team-b", &["offload-discrete", "offload-coherent"]),
        cluster_queue("team-c", &["offload-discrete"]),
        cluster_queue("team-js", &["offload-discrete", "offload-coherent"]),
        gpu_only_cluster_queue("team-gpu"),
        local_queue(&ns, "team-gpu", "team-gpu"),
        local_queue(&ns, "team-js", "team-js"),
        local_queue(&ns, "team-a", "team-a"),
        local_queue(&ns, "team-b", "team-b"),
        local_queue(&ns, "team-c", "team-c"),
    ] {
        apply(cluster, &manifest);
    }

    Teams {
        cluster,
        tjs: Api::namespaced(client.clone(), &ns),
        jobs: Api::namespaced(client.clone(), &ns),
        client,
        ns,
    }
}

/// A coherent job in team-a: admitted to the coherent flavor although the discrete one, listed
/// first, has free quota; its pod lands on the GH200 node. Returns that pod.
async fn a_coherent_job_is_admitted_to_the_coherent_flavor(s: &Teams<'_>) -> Pod {
    // A coherent job in team-a: admitted to the coherent flavor although the discrete one,
    // listed first, has free quota; its pod lands on the GH200 node.
    create_when_admitted(
        &s.tjs,
        &queued_job("coherent-1", "team-a", "coherent", None, false),
        "coherent-1",
    )
    .await;
    let first = wait_tj(
        &s.tjs,
        "coherent-1",
        "coherent-1 Running",
        phase_is(JobPhase::Running),
    )
    .await;
    let decided = first.status.as_ref().unwrap().offload.clone().unwrap();
    assert_eq!(decided.mode, OffloadMode::UnifiedMemory);
    assert_eq!(
        admitted_reason(&first).map(|(s, r, _)| (s, r)),
        Some(("True".into(), "Admitted".into()))
    );
    let job = s.jobs.get("coherent-1").await.unwrap();
    assert_eq!(
        job.labels()
            .get(names::KUEUE_QUEUE_LABEL)
            .map(String::as_str),
        Some("team-a"),
        "the queue label reaches the workload Job"
    );
    // The host memory the decision counts on is the container's request, and Kueue's Workload
    // asks its quota for it.
    let request = job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("memory"))
        .cloned()
        .expect("the memory the decision counts on is requested");
    let workloads: serde_json::Value = serde_json::from_str(&kubectl(
        s.cluster,
        &[
            "--namespace",
            &s.ns,
            "get",
            "workloads.kueue.x-k8s.io",
            "-o",
            "json",
        ],
    ))
    .unwrap();
    let workload = workloads["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| {
            w["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|o| o.iter().any(|r| r["name"] == "coherent-1"))
        })
        .unwrap_or_else(|| panic!("no Workload owned by coherent-1: {workloads}"));
    assert_eq!(
        workload["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]
            ["memory"],
        json!(request.0),
        "Kueue sees the raised request: {workload}"
    );
    let pod = running_pod(&s.client, &s.ns, "coherent-1").await;
    assert_eq!(node_of(&pod), "gh200-k");
    assert_eq!(
        pod.spec.as_ref().unwrap().node_selector.as_ref().unwrap()[names::LABEL_UMA],
        "true",
        "Kueue injected the coherent flavor's labels"
    );

    pod
}

/// What a discrete job ran with, to compare after its preemption.
struct Ran {
    decision: serde_json::Value,
    env: serde_json::Value,
}

/// A discrete job in team-b, low priority: the discrete flavor, the H200 node.
async fn a_discrete_job_runs_on_the_discrete_flavor(s: &Teams<'_>) -> Ran {
    // A discrete job in team-b, low priority: the discrete flavor, the H200 node.
    create_when_admitted(
        &s.tjs,
        &queued_job("discrete-low", "team-b", "discrete", Some("low"), false),
        "discrete-low",
    )
    .await;
    let low = wait_tj(
        &s.tjs,
        "discrete-low",
        "discrete-low Running",
        phase_is(JobPhase::Running),
    )
    .await;
    let low_decision = serde_json::to_value(&low.status.as_ref().unwrap().offload).unwrap();
    assert_eq!(low_decision["mode"], "CPUCopy");
    let low_env = job_env(&s.jobs, "discrete-low").await;
    assert_eq!(
        node_of(&running_pod(&s.client, &s.ns, "discrete-low").await),
        "h200-k"
    );

    Ran {
        decision: low_decision,
        env: low_env,
    }
}

/// A second coherent job in team-a waits (the coherent quota is taken, the discrete flavor's is
/// not for it), and one in team-c, whose only flavor is discrete, never runs on the wrong class;
/// both say Kueue's reason.
async fn jobs_wait_for_their_own_flavor(s: &Teams<'_>) {
    // A second coherent job in team-a waits: the coherent quota is taken, and the discrete
    // flavor's free quota is not for it. Kueue's reason reaches its Admitted condition.
    s.tjs
        .create(
            &PostParams::default(),
            &queued_job("coherent-2", "team-a", "coherent", None, true),
        )
        .await
        .unwrap();
    // How long Kueue's word takes to reach the job: from the first read of the Workload that
    // carries it to the first read of the TrainingJob that shows it (both read every 100 ms).
    let workloads: Api<kube::api::DynamicObject> = Api::namespaced_with(
        s.client.clone(),
        &s.ns,
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "kueue.x-k8s.io",
            "v1beta2",
            "Workload",
        )),
    );
    let kueue_said: std::cell::Cell<Option<Instant>> = std::cell::Cell::new(None);
    let waiting = poll("coherent-2 Queued with Kueue's reason", WAIT, || {
        let workloads = workloads.clone();
        let tjs = s.tjs.clone();
        let said = &kueue_said;
        async move {
            if said.get().is_none() {
                let list = workloads.list(&Default::default()).await.ok()?;
                let waits = list.items.iter().any(|w| {
                    w.owner_references().iter().any(|o| o.name == "coherent-2")
                        && w.data["status"]["conditions"].as_array().is_some_and(|cs| {
                            cs.iter().any(|c| {
                                c["type"] == "QuotaReserved"
                                    && c["status"] == "False"
                                    && c["message"].as_str().is_some_and(|m| !m.is_empty())
                            })
                        })
                });
                if waits {
                    said.set(Some(Instant::now()));
                }
            }
            let tj = tjs.get("coherent-2").await.ok()?;
            admitted_reason(&tj)
                .is_some_and(|(s, r, m)| s == "False" && r == "Queued" && m.contains("Kueue:"))
                .then_some(tj)
        }
    })
    .await;
    let delay = kueue_said.get().map_or(0.0, |t| t.elapsed().as_secs_f64());
    eprintln!("figure: Kueue's reason on the Workload → on the TrainingJob: {delay:.1} s");
    assert!(
        delay <= 5.0,
        "Kueue's reason reached the job {delay:.1} s after Kueue wrote it"
    );
    let (_, _, message) = admitted_reason(&waiting).unwrap();
    assert!(
        message.contains("offload-discrete doesn't match node affinity"),
        "{message}"
    );
    assert!(
        s.jobs
            .get("coherent-2")
            .await
            .unwrap()
            .spec
            .unwrap()
            .suspend
            .unwrap_or(false)
    );

    // A coherent job in team-c, whose only flavor is discrete, never runs on the wrong class:
    // it waits, and says why.
    s.tjs
        .create(
            &PostParams::default(),
            &queued_job("coherent-wrong-flavor", "team-c", "coherent", None, true),
        )
        .await
        .unwrap();
    let wrong = wait_tj(
        &s.tjs,
        "coherent-wrong-flavor",
        "coherent-wrong-flavor Queued with Kueue's reason",
        |tj| {
            tj.and_then(admitted_reason)
                .is_some_and(|(_, _, m)| m.contains("doesn't match node affinity"))
        },
    )
    .await;
    assert_eq!(wrong.status.unwrap().phase, Some(JobPhase::Queued));
}

/// The first coherent job finishes: the second is admitted to the coherent flavor.
async fn the_waiting_job_is_admitted_when_one_finishes(s: &Teams<'_>, pod: &Pod) {
    // The first coherent job finishes: the second is admitted to the coherent flavor.
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    pods.patch(
        pod.metadata.name.as_deref().unwrap(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {deploy::KWOK_KEEP_RUNNING: null}}})),
    )
    .await
    .unwrap();
    wait_tj(
        &s.tjs,
        "coherent-1",
        "coherent-1 Succeeded",
        phase_is(JobPhase::Succeeded),
    )
    .await;
    let second = wait_tj(
        &s.tjs,
        "coherent-2",
        "coherent-2 admitted once coherent-1 finished",
        |tj| {
            tj.and_then(admitted_reason)
                .is_some_and(|(s, _, _)| s == "True")
        },
    )
    .await;
    assert_eq!(
        second.status.unwrap().offload.unwrap().mode,
        OffloadMode::UnifiedMemory
    );
}

/// A high-priority discrete job in team-b preempts the low one: the low one shows it is
/// suspended (not failed), and resumes configured as before once the high one is done.
async fn a_preempted_job_resumes_configured_as_before(s: &Teams<'_>, low: Ran) {
    let (low_decision, low_env) = (low.decision, low.env);
    // A high-priority discrete job in team-b preempts the low one: the low one shows it is
    // suspended (not failed), and resumes configured as before once the high one is done.
    // The high one keeps running until the test lets it finish, so the low one's suspended
    // state can be watched for as long as it lasts.
    s.tjs
        .create(
            &PostParams::default(),
            &queued_job("discrete-high", "team-b", "discrete", Some("high"), false),
        )
        .await
        .unwrap();
    let suspended = wait_tj(
        &s.tjs,
        "discrete-low",
        "discrete-low suspended by Kueue",
        |tj| {
            tj.and_then(admitted_reason)
                .is_some_and(|(s, r, _)| s == "False" && r == "Suspended")
        },
    )
    .await;
    assert_ne!(
        suspended.status.as_ref().unwrap().phase,
        Some(JobPhase::Failed)
    );
    // The state that stays: `Suspended` through the reconciles that follow (Kueue's Workload
    // changes, the operator's look every 15 s at a waiting job), watched until the condition is
    // 35 s old — each read must still say Suspended.
    let held = poll("discrete-low still Suspended 35 s on", WAIT, || async {
        let tj = s.tjs.get("discrete-low").await.ok()?;
        let c = tj
            .status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == "Admitted")?
            .clone();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "Suspended"),
            "the preempted state must stay: {c:?}"
        );
        let age = jiff::Timestamp::now().duration_since(c.last_transition_time.0);
        (age.as_secs() >= 35).then_some(c)
    })
    .await;
    eprintln!("suspended for 35 s: {}", held.message);
    let high_pod = running_pod(&s.client, &s.ns, "discrete-high").await;
    Api::<Pod>::namespaced(s.client.clone(), &s.ns)
        .patch(
            high_pod.metadata.name.as_deref().unwrap(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {deploy::KWOK_KEEP_RUNNING: null}}})),
        )
        .await
        .unwrap();
    wait_tj(
        &s.tjs,
        "discrete-high",
        "discrete-high Succeeded",
        phase_is(JobPhase::Succeeded),
    )
    .await;
    let resumed = wait_tj(&s.tjs, "discrete-low", "discrete-low running again", |tj| {
        phase_is(JobPhase::Running)(tj)
            && tj
                .and_then(admitted_reason)
                .is_some_and(|(s, _, _)| s == "True")
    })
    .await;
    assert_eq!(
        serde_json::to_value(&resumed.status.as_ref().unwrap().offload).unwrap(),
        low_decision,
        "the same decision after preemption"
    );
    assert_eq!(job_env(&s.jobs, "discrete-low").await, low_env);
    assert_eq!(
        node_of(&running_pod(&s.client, &s.ns, "discrete-low").await),
        "h200-k"
    );
    let events = kubectl(
        s.cluster,
        &[
            "--namespace",
            &s.ns,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=discrete-low,reason=Suspended",
            "-o",
            "name",
        ],
    );
    assert!(
        !events.trim().is_empty(),
        "an Event says Kueue suspended it"
    );
}

/// An opted-in batch Job under Kueue: the webhook's configuration and Kueue's suspension both
/// land at creation, and Kueue admits it to the flavor of the class it was pinned to.
async fn an_opted_in_batch_job_is_configured_and_admitted(s: &Teams<'_>) {
    // An opted-in batch Job under Kueue: the webhook's configuration and Kueue's suspension
    // both land at creation, and Kueue admits it to the flavor of the class it was pinned to.
    let batch: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "batch-coherent",
                     "labels": {names::PROFILE_ANNOTATION: "coherent", names::KUEUE_QUEUE_LABEL: "team-b"},
                     "annotations": {"offload.dev/model-parameters": "12B"}},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "train", "image": "train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    }))
    .unwrap();
    let created = s.jobs.create(&PostParams::default(), &batch).await.unwrap();
    let spec = created.spec.as_ref().unwrap();
    assert_eq!(spec.suspend, Some(true), "Kueue's webhook suspended it");
    let env = serde_json::to_value(&spec.template.spec.as_ref().unwrap().containers[0].env)
        .unwrap()
        .to_string();
    assert!(env.contains("OFFLOAD_MODE"), "configured: {env}");
    let pod = running_pod(&s.client, &s.ns, "batch-coherent").await;
    assert_eq!(node_of(&pod), "gh200-k");
    let pod_env = serde_json::to_value(&pod.spec.as_ref().unwrap().containers[0].env)
        .unwrap()
        .to_string();
    assert!(pod_env.contains("OFFLOAD_MODE"), "{pod_env}");
}

/// A job whose training container asks for GPUs alone, with the start-up guard on (the chart's
/// default), in a ClusterQueue that covers only `nvidia.com/gpu`: the guard adds no cpu or
/// memory to what Kueue counts, so the queue admits it and it runs.
async fn a_gpu_only_queue_admits_a_guarded_job(s: &Teams<'_>) {
    let mut tj = queued_job("gpu-only", "team-gpu", "discrete", None, true);
    // No model hints: the decision raises no memory request either.
    tj.spec.model = None;
    create_when_admitted(&s.tjs, &tj, "gpu-only").await;
    wait_tj(&s.tjs, "gpu-only", "gpu-only admitted and done", |tj| {
        phase_is(JobPhase::Succeeded)(tj)
            && tj
                .and_then(admitted_reason)
                .is_some_and(|(s, _, _)| s == "True")
    })
    .await;
    let job = s.jobs.get("gpu-only").await.unwrap();
    let pod = job.spec.unwrap().template.spec.unwrap();
    let guard = pod
        .init_containers
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == "offload-verify")
        .expect("the start-up guard is on");
    let resources = guard.resources.unwrap();
    let names: Vec<String> = resources
        .requests
        .iter()
        .chain(resources.limits.iter())
        .flat_map(|m| m.keys().cloned())
        .collect();
    assert!(
        names.iter().all(|n| n == "nvidia.com/gpu"),
        "the guard asks for nothing but the pod's GPUs: {names:?}"
    );
}

/// An opted-in JobSet under Kueue: the operator's webhook configures its templates and Kueue's
/// suspends it at creation; Kueue admits it to the flavor of the class the templates are pinned
/// to (the discrete flavor, listed first, has free quota too) and, resuming it, adds the
/// flavor's node labels without taking away the configuration.
async fn jobset_under_kueue(cluster: &DevCluster, client: &kube::Client, ns: &str) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet"),
        "jobsets",
    );
    let jobsets: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let template = json!({"spec": {
        "restartPolicy": "Never",
        "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "train", "image": "train:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
    let jobset: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "jobset-coherent",
                     "labels": {names::PROFILE_ANNOTATION: "coherent", names::KUEUE_QUEUE_LABEL: "team-js"},
                     "annotations": {"offload.dev/model-parameters": "12B"}},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
            "parallelism": 1, "completions": 1, "template": template}}}]}
    }))
    .unwrap();
    let created = jobsets
        .create(&PostParams::default(), &jobset)
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"]["suspend"],
        json!(true),
        "Kueue's webhook suspended it: {}",
        created.data["spec"]
    );
    let pod_template = |js: &DynamicObject| {
        js.data["spec"]["replicatedJobs"][0]["template"]["spec"]["template"].clone()
    };
    let configured = |t: &serde_json::Value| {
        let env = t["spec"]["containers"][0]["env"].to_string();
        let affinity = t["spec"]["affinity"].to_string();
        env.contains("OFFLOAD_MODE") && affinity.contains(names::LABEL_UMA)
    };
    assert!(
        configured(&pod_template(&created)),
        "configured at creation: {}",
        pod_template(&created)
    );
    let resumed = wait(
        "Kueue admits the JobSet and resumes it",
        WAIT,
        await_condition(
            jobsets.clone(),
            "jobset-coherent",
            |js: Option<&DynamicObject>| {
                js.is_some_and(|js| js.data["spec"]["suspend"] == json!(false))
            },
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let t = pod_template(&resumed);
    assert!(configured(&t), "still configured once resumed: {t}");
    assert_eq!(
        t["spec"]["nodeSelector"][names::LABEL_UMA],
        json!("true"),
        "the coherent flavor's node labels: {t}"
    );
    // The Workload Kueue made of it was admitted to the coherent flavor.
    let workloads: serde_json::Value = serde_json::from_str(&kubectl(
        cluster,
        &[
            "--namespace",
            ns,
            "get",
            "workloads.kueue.x-k8s.io",
            "-o",
            "json",
        ],
    ))
    .unwrap();
    let workload = workloads["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| {
            w["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|o| o.iter().any(|r| r["kind"] == "JobSet"))
        })
        .unwrap_or_else(|| panic!("no Workload owned by the JobSet: {workloads}"));
    let flavors = &workload["status"]["admission"]["podSetAssignments"][0]["flavors"];
    assert_eq!(
        flavors["nvidia.com/gpu"],
        json!("offload-coherent"),
        "{workload}"
    );
}
