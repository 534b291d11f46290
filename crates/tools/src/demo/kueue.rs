//! The Kueue part of the demo (`hack/demo.sh --kueue`).

use std::time::{Duration, Instant};

use kube::api::{Api, ListParams, PostParams};
use offload_api::v1alpha1::TrainingJob;
use offload_testenv::devcluster::DevCluster;
use serde_json::json;

use offload_testenv::deploy;

use super::{kubectl, step, wait_for};

/// The Kueue part of the demo: a ClusterQueue of one GPU per node class, a LocalQueue, two
/// jobs for the discrete class: the first is admitted and runs (its kwok pod is told to keep
/// running), the second waits with Kueue's reason, and is admitted once the first finishes.
pub(crate) async fn story(cluster: &DevCluster, client: &kube::Client) -> Result<(), String> {
    use offload_api::v1alpha1::JobPhase;
    step(
        "Kueue: ClusterQueue demo (1 GPU per node class), LocalQueue demo in namespace kueue-demo; two jobs for the pcie-pool profile",
    );
    make_queues(cluster)?;
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), NS);
    // Waits until the second job's Admitted condition (status, message) satisfies `holds`.
    let second_admission = |what: &'static str, holds: fn(&str, &str) -> bool| {
        let tjs = tjs.clone();
        wait_for(what, Duration::from_secs(120), move || {
            let tjs = tjs.clone();
            async move {
                tjs.get("second")
                    .await
                    .ok()
                    .and_then(|t| admitted(&t))
                    .is_some_and(|(s, m)| holds(&s, &m))
            }
        })
    };
    let started = Instant::now();
    create(&tjs, "first").await?;
    wait_for("first Running", Duration::from_secs(120), || {
        let tjs = tjs.clone();
        async move {
            tjs.get("first")
                .await
                .ok()
                .is_some_and(|t| t.status.as_ref().and_then(|s| s.phase) == Some(JobPhase::Running))
        }
    })
    .await?;
    eprintln!(
        "first: admitted and Running in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let queued_at = Instant::now();
    create(&tjs, "second").await?;
    second_admission("second Queued with Kueue's reason", |s, m| {
        s == "False" && m.contains("Kueue:")
    })
    .await?;
    eprintln!(
        "second: waiting, with Kueue's reason, {:.1} s after it was created",
        queued_at.elapsed().as_secs_f64()
    );
    println!();
    show_queue(cluster)?;
    println!(
        "$ kubectl -n {NS} get trainingjob second -o jsonpath='{{.status.conditions[?(@.type==\"Admitted\")].message}}'"
    );
    println!(
        "{}\n",
        kubectl(
            cluster,
            &[
                "-n",
                NS,
                "get",
                "trainingjob",
                "second",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Admitted\")].message}"
            ]
        )?
    );
    // The first job finishes (its kwok pod is let go): the second is admitted.
    let_finish(client, "first").await?;
    let released = Instant::now();
    second_admission("second admitted once first finished", |s, _| s == "True").await?;
    eprintln!(
        "second: admitted {:.1} s after first was let finish",
        released.elapsed().as_secs_f64()
    );
    show_queue(cluster)?;
    Ok(())
}

/// The demo's namespace.
const NS: &str = "kueue-demo";

/// The ClusterQueue (one GPU per node class) and the namespace's LocalQueue.
fn make_queues(cluster: &DevCluster) -> Result<(), String> {
    let flavors: Vec<serde_json::Value> = ["offload-discrete", "offload-coherent"]
        .iter()
        .map(|f| {
            json!({"name": f, "resources": [
                {"name": "cpu", "nominalQuota": 64},
                {"name": "memory", "nominalQuota": "512Gi"},
                {"name": "nvidia.com/gpu", "nominalQuota": 1}]})
        })
        .collect();
    let manifests = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
         "metadata": {"name": "demo"},
         "spec": {"namespaceSelector": {},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                      "flavors": flavors}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "demo", "namespace": NS}, "spec": {"clusterQueue": "demo"}}
    ]});
    let file = cluster.root().join("kueue-demo.json");
    std::fs::write(&file, manifests.to_string())
        .map_err(|e| format!("writing {}: {e}", file.display()))?;
    kubectl(cluster, &["apply", "-f", &file.display().to_string()])?;
    Ok(())
}

/// A queued job for the pcie-pool profile, created once the webhooks answer (after Kueue's
/// certificates are in place).
async fn create(tjs: &Api<TrainingJob>, name: &'static str) -> Result<(), String> {
    let tj: TrainingJob = serde_json::from_value(deploy::queued_training_job(
        name,
        Some("demo"),
        "pcie-pool",
        None,
        false,
    ))
    .map_err(|e| e.to_string())?;
    wait_for(
        &format!("{name} admitted by the webhooks"),
        Duration::from_secs(120),
        || {
            let (tjs, tj) = (tjs.clone(), tj.clone());
            async move { tjs.create(&PostParams::default(), &tj).await.is_ok() }
        },
    )
    .await
}

/// A job's Admitted condition: (status, message).
fn admitted(tj: &TrainingJob) -> Option<(String, String)> {
    let c = tj
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Admitted")?;
    Some((c.status.clone(), c.message.clone()))
}

/// The demo namespace's jobs and Kueue's Workloads, as kubectl shows them.
fn show_queue(cluster: &DevCluster) -> Result<(), String> {
    println!("$ kubectl -n {NS} get trainingjobs,workloads.kueue.x-k8s.io");
    let shown = kubectl(
        cluster,
        &["-n", NS, "get", "trainingjobs,workloads.kueue.x-k8s.io"],
    )?;
    println!("{shown}");
    Ok(())
}

/// Lets a job's kwok pods finish (they were told to keep running).
async fn let_finish(client: &kube::Client, job: &str) -> Result<(), String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    let list = pods
        .list(
            &ListParams::default()
                .labels(&format!("{}={job}", offload_api::names::LABEL_TRAINING_JOB)),
        )
        .await
        .map_err(|e| e.to_string())?;
    for pod in list.items {
        let name = pod.metadata.name.unwrap_or_default();
        pods.patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {deploy::KWOK_KEEP_RUNNING: null}}}),
            ),
        )
        .await
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}
