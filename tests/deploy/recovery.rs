//! Recovery from out-of-memory on the real node, under the chart's operator: the training
//! container is a stand-in for a training process (`images/pause/standin.c`, in the pause
//! image; the node has no GPU) that fails as PyTorch does when its configuration does not fit —
//! CUDA's out-of-memory error without offload — or that the kernel OOM-kills under its cgroup's
//! memory limit. The real kubelet puts the container's last log lines in its termination
//! message (the operator sets `FallbackToLogsOnError`) and reports `OOMKilled`.

use super::*;
use k8s_openapi::api::core::v1::Container;
use offload_api::v1alpha1::{JobPhase, MemoryKind, StatePlacement};
use support::controller::condition_when;

fn standin_job(
    name: &str,
    profile: &str,
    args: &[&str],
    memory_limit: Option<&str>,
) -> TrainingJob {
    use offload_testenv::devcluster::node::images;
    let mut tj = training_job(name, profile);
    let pod = tj.spec.template.spec.as_mut().unwrap();
    pod.restart_policy = Some("Never".into());
    let c: &mut Container = &mut pod.containers[0];
    c.image = Some(images::reference("offload-pause"));
    c.image_pull_policy = Some("Never".into());
    c.command = Some(args.iter().map(|a| (*a).to_string()).collect());
    if let Some(limit) = memory_limit {
        let mut limits = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        limits.insert(
            "memory".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(limit.into()),
        );
        c.resources.as_mut().unwrap().limits = Some(limits);
    }
    tj
}

/// Waits for the job's `condition`; past the wait, prints the job's status and its pods (what
/// the kubelet said) before the test's own wait fails on it.
async fn show_on_timeout(
    cluster: &DevCluster,
    ns: &str,
    tjs: &Api<TrainingJob>,
    name: &str,
    condition: &str,
) {
    let start = Instant::now();
    loop {
        let tj = tjs.get(name).await.ok();
        let has = tj
            .as_ref()
            .and_then(|t| t.status.as_ref())
            .is_some_and(|s| {
                s.conditions.iter().any(|c| c.type_ == condition)
                    || (condition == "Succeeded" && s.phase == Some(JobPhase::Succeeded))
            });
        if has {
            return;
        }
        if start.elapsed() > Duration::from_secs(80) {
            eprintln!(
                "{name} without {condition} after 80 s; its status: {}",
                serde_json::to_string(&tj.and_then(|t| t.status)).unwrap_or_default()
            );
            eprintln!(
                "its pods: {}",
                kubectl(
                    cluster,
                    &[
                        "get",
                        "pods",
                        "-n",
                        ns,
                        "-o",
                        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status}{\"\\n\"}{end}"
                    ]
                )
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A job that runs out of GPU memory without offload is decided again once, with more offload,
/// and its new workload runs; one OOM-killed by its cgroup is recognised from the kubelet's word
/// and, past its profile's bound, held.
pub(super) async fn out_of_memory_on_the_real_node_is_recovered(
    cluster: &DevCluster,
    client: &kube::Client,
) {
    let ns = namespace(client, "recovery").await;
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // The real node's GPUs free (the kubelet refuses a pod whose GPUs a terminating pod holds).
    let all: Api<Pod> = Api::all(client.clone());
    poll("the real node's GPUs free", WAIT, || async {
        let on_node = all
            .list(&ListParams::default().fields(&format!("spec.nodeName={REAL_NODE}")))
            .await
            .ok()?;
        let holding = on_node.items.iter().any(|p| {
            p.spec.iter().flat_map(|s| &s.containers).any(|c| {
                c.resources
                    .as_ref()
                    .and_then(|r| r.limits.as_ref())
                    .is_some_and(|l| l.contains_key("nvidia.com/gpu"))
            })
        });
        (!holding).then_some(())
    })
    .await;
    // GPUs for the kubelet to hand out (the node has none): a stand-in device plugin's.
    let plugin = offload_testenv::device_plugin::StandInDevicePlugin::start(
        names::GPU_RESOURCE,
        vec!["GPU-standin-0".into(), "GPU-standin-1".into()],
    )
    .await
    .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    poll(
        "the real node to advertise two stand-in GPUs",
        WAIT,
        || async {
            let node = nodes.get(REAL_NODE).await.ok()?;
            let n = node
                .status?
                .allocatable?
                .get(names::GPU_RESOURCE)?
                .0
                .clone();
            (n == "2").then_some(())
        },
    )
    .await;

    // CUDA out of memory without offload (TryFastest starts there), then it trains.
    create_real_node_profile(
        client,
        "try-fastest",
        json!({"unknownSize": "TryFastest", "startupGuard": false}),
    )
    .await;
    let tj = standin_job("cuda-oom", "try-fastest", &["/standin", "train"], None);
    create_when_admitted(&tjs, &tj, "the job that runs out of GPU memory").await;
    show_on_timeout(cluster, &ns, &tjs, "cuda-oom", "MemoryRecovery").await;
    let cond = condition_when(&tjs, "cuda-oom", "MemoryRecovery", "True").await;
    assert_eq!(cond.reason, "Redeciding", "{}", cond.message);
    assert!(
        cond.message
            .contains("ran out of GPU memory with mode=Disabled"),
        "{}",
        cond.message
    );
    show_on_timeout(cluster, &ns, &tjs, "cuda-oom", "Succeeded").await;
    let done = poll("the re-decided job to succeed", WAIT, || async {
        let tj = tjs.get("cuda-oom").await.ok()?;
        let s = tj.status.clone()?;
        (s.phase == Some(JobPhase::Succeeded)).then_some(s)
    })
    .await;
    assert_eq!(done.memory_failures.len(), 1, "{:?}", done.memory_failures);
    let failure = &done.memory_failures[0];
    assert_eq!(failure.kind, MemoryKind::Gpu);
    assert!(
        failure
            .message
            .contains("torch.OutOfMemoryError: CUDA out of memory"),
        "{}",
        failure.message
    );
    let decision = done.offload.unwrap();
    assert_eq!(
        decision.placement,
        Some(StatePlacement::Optimizer),
        "{decision:?}"
    );
    assert!(
        !events_with_reason(cluster, &ns, "OutOfMemory")
            .trim()
            .is_empty()
    );
    tjs.delete("cuda-oom", &Default::default()).await.unwrap();

    // OOM-killed by its cgroup: 256 MiB under a 64 MiB limit; held after one re-decision.
    create_real_node_profile(
        client,
        "host-oom",
        json!({"maxMemoryRetries": 1, "startupGuard": false}),
    )
    .await;
    let tj = standin_job(
        "host-oom",
        "host-oom",
        &["/standin", "alloc", "256"],
        Some("64Mi"),
    );
    create_when_admitted(&tjs, &tj, "the job its cgroup OOM-kills").await;
    show_on_timeout(cluster, &ns, &tjs, "host-oom", "MemoryRecovery").await;
    let held = condition_when(&tjs, "host-oom", "MemoryRecovery", "False").await;
    assert_eq!(held.reason, "RetriesExhausted", "{}", held.message);
    let status = tjs.get("host-oom").await.unwrap().status.unwrap();
    assert_eq!(
        status.memory_failures.len(),
        2,
        "{:?}",
        status.memory_failures
    );
    assert!(
        status
            .memory_failures
            .iter()
            .all(|f| f.kind == MemoryKind::Host)
    );
    assert!(
        status.memory_failures[0].message.contains("OOMKilled"),
        "{}",
        status.memory_failures[0].message
    );
    tjs.delete("host-oom", &Default::default()).await.unwrap();
    drop(plugin);
    kubectl(cluster, &["delete", "namespace", &ns, "--wait=false"]);
    kubectl(
        cluster,
        &["delete", "offloadprofile", "try-fastest", "host-oom"],
    );
}
