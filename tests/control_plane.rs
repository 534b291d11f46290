//! Smoke tests of the local control plane: the real kube-apiserver stores our CRDs and enforces
//! their schema; the real controller-manager, scheduler and kwok run a batch Job's pods.

use offload_testenv::support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use offload_api::v1alpha1::{ModeSetting, OffloadProfile, RatioSetting, TrainingJob};
use offload_testenv::devcluster::ClusterOptions;
use support::*;

const OPTIONS: ClusterOptions = ClusterOptions {
    controller_manager: true,
    scheduler: true,
    kwok: true,
    real_node: false,
};

fn crds_dir() -> String {
    format!("{}/crds", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn crds_are_served_and_their_schema_is_enforced() {
    let cluster = cluster(OPTIONS);
    let client = client(cluster).await;
    // The committed files, exactly as a user would apply them.
    kubectl(cluster, &["apply", "--server-side", "-f", &crds_dir()]);
    kubectl(
        cluster,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/offloadprofiles.offload.dev",
            "crd/trainingjobs.offload.dev",
        ],
    );
    let ns = namespace(&client, "smoke").await;

    let profile: OffloadProfile = serde_json::from_value(serde_json::json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile",
        "metadata": {"name": format!("smoke-{ns}")},
        "spec": {"mode": "CPUCopy", "offloadRatio": 0.5}
    }))
    .unwrap();
    let profiles: Api<OffloadProfile> = Api::all(client.clone());
    profiles
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
    let stored = profiles.get(&format!("smoke-{ns}")).await.unwrap();
    assert_eq!(stored.spec.mode, ModeSetting::CpuCopy);
    assert_eq!(stored.spec.offload_ratio, RatioSetting::Fixed(0.5));
    assert_eq!(
        stored.spec.min_overlap_efficiency, 0.8,
        "schema default applied by the API server"
    );

    let job: TrainingJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "ds", "annotations": {"offload.dev/profile": "auto"}},
        "spec": {
            "framework": {"name": "DeepSpeed", "version": "0.19.8"},
            "template": {"spec": {"containers": [{"name": "train", "image": "busybox"}]}}
        }
    }))
    .unwrap();
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let stored = jobs.get("ds").await.unwrap();
    assert_eq!(
        stored.spec.offload.mode,
        ModeSetting::Auto,
        "offload defaults to Auto"
    );
    assert_eq!(stored.spec.replicas, 1);

    // The API server's own validation, with its own messages.
    let reject = |yaml: String| {
        let (ok, _out, err) =
            kubectl_result(cluster, &["apply", "-n", &ns, "-f", "-"], Some(&yaml));
        assert!(!ok, "the API server accepted:\n{yaml}");
        err
    };
    let err = reject(format!(
        "apiVersion: offload.dev/v1alpha1\nkind: OffloadProfile\nmetadata: {{name: bad-ratio-{ns}}}\nspec: {{offloadRatio: \"1.5\"}}\n"
    ));
    assert!(
        err.contains("offloadRatio must be Auto, None (nothing offloaded, with mode Disabled) or a number greater than 0 and at most 1"),
        "{err}"
    );
    // None is what the operator writes for a job with nothing offloaded: only with Disabled.
    let err = reject(format!(
        "apiVersion: offload.dev/v1alpha1\nkind: OffloadProfile\nmetadata: {{name: none-ratio-{ns}}}\nspec: {{mode: Auto, offloadRatio: \"None\"}}\n"
    ));
    assert!(
        err.contains(
            "offloadRatio None means nothing is offloaded: it goes only with mode Disabled"
        ),
        "{err}"
    );
    let err = reject(format!(
        "apiVersion: offload.dev/v1alpha1\nkind: OffloadProfile\nmetadata: {{name: bad-ratio-{ns}}}\nspec: {{offloadRatio: 0.5}}\n"
    ));
    assert!(err.contains("must be of type string"), "{err}");
    let err = reject(format!(
        "apiVersion: offload.dev/v1alpha1\nkind: OffloadProfile\nmetadata: {{name: bad-ratio-{ns}}}\nspec: {{offloadRatio: Half}}\n"
    ));
    assert!(err.contains("offloadRatio must be Auto"), "{err}");
    let err = reject(
        "apiVersion: offload.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: no-version}\nspec:\n  framework: {name: DeepSpeed}\n  template: {spec: {containers: [{name: t, image: busybox}]}}\n".into(),
    );
    assert!(
        err.contains("framework.version is required for DeepSpeed"),
        "{err}"
    );
    let err = reject(
        "apiVersion: offload.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: bad-mode}\nspec:\n  framework: {name: Generic}\n  offload: {mode: Sometimes}\n  template: {spec: {containers: [{name: t, image: busybox}]}}\n".into(),
    );
    assert!(err.contains("Unsupported value: \"Sometimes\""), "{err}");
    let err = reject(
        "apiVersion: offload.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: no-containers}\nspec:\n  framework: {name: Generic}\n  template: {spec: {containers: []}}\n".into(),
    );
    assert!(
        err.contains("spec.template.spec.containers: Invalid value")
            && err.contains("at least 1 items"),
        "{err}"
    );

    // What `kubectl get` shows.
    let table = kubectl(cluster, &["get", "offloadprofiles", &format!("smoke-{ns}")]);
    assert_eq!(header(&table), columns("OffloadProfile"));
    assert!(table.lines().nth(1).unwrap().contains("CPUCopy"), "{table}");
    let table = kubectl(cluster, &["get", "tj", "-n", &ns]);
    assert_eq!(header(&table), columns("TrainingJob"));
    let explained = kubectl(cluster, &["explain", "trainingjob.spec.offload.mode"]);
    assert!(explained.contains("UnifiedMemory"), "{explained}");
    let listed = kubectl(cluster, &["get", "offload", "-A"]);
    assert!(
        listed.contains("smoke-"),
        "the `offload` category lists our kinds: {listed}"
    );
}

#[tokio::test]
async fn a_batch_job_runs_its_pods_on_a_kwok_node() {
    let cluster = cluster(OPTIONS);
    let client = client(cluster).await;
    let ns = namespace(&client, "kwok").await;
    let node_name = format!("kwok-{ns}");
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &kwok_node(&node_name, &[("pool", &ns)], &[]),
        )
        .await
        .unwrap();

    let job: Job = serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "hello"},
        "spec": {
            "completions": 2, "parallelism": 2, "completionMode": "Indexed",
            "template": {"spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"pool": ns},
                "containers": [{"name": "c", "image": "busybox"}]
            }}
        }
    }))
    .unwrap();
    Api::<Job>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // kwok's stock pod stages run a Job's pods to completion at once, so a pod is seen Running
    // or already Succeeded; what matters is that it was bound to the kwok node and ran.
    let bound = wait_list(
        pods,
        kube::runtime::watcher::Config::default().labels("job-name=hello"),
        "2 pods of Job hello bound to the kwok node and run",
        Duration::from_secs(90),
        |pods| {
            let ran: Vec<Pod> = pods
                .iter()
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str())
                })
                .filter(|p| {
                    matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Running" | "Succeeded")
                    )
                })
                .map(|p| Pod::clone(p))
                .collect();
            (ran.len() == 2).then_some(ran)
        },
    )
    .await;
    assert_eq!(bound.len(), 2);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    wait(
        "Job hello to complete",
        Duration::from_secs(60),
        kube::runtime::wait::await_condition(jobs, "hello", |j: Option<&Job>| {
            j.and_then(|j| j.status.as_ref()).and_then(|s| s.succeeded) == Some(2)
        }),
    )
    .await
    .unwrap();
    let node = nodes.get(&node_name).await.unwrap();
    let ready = node
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True", "kwok keeps the node Ready");
}

/// The column names of a `kubectl get` table.
fn header(table: &str) -> Vec<String> {
    let first = table.lines().next().unwrap_or_default();
    first.split_whitespace().map(str::to_string).collect()
}

/// What `kubectl get` shows for `kind`: its name, then the generated CRD's printer columns
/// (`tests/crds.rs` holds those to the documented list).
fn columns(kind: &str) -> Vec<String> {
    let crds = offload_api::v1alpha1::crds();
    let crd = crds.iter().find(|c| c.spec.names.kind == kind).unwrap();
    let printed = crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten();
    std::iter::once("NAME".to_string())
        .chain(printed.map(|c| c.name.to_uppercase()))
        .collect()
}

#[tokio::test]
async fn a_component_that_exits_is_named_with_the_end_of_its_log() {
    // What a test that timed out waiting on the cluster reports (support::wait and poll).
    let cluster = offload_testenv::devcluster::DevCluster::start(ClusterOptions::default())
        .await
        .unwrap();
    assert!(cluster.exited_components().is_empty());
    let pid = cluster.pids()["kube-apiserver"];
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let cluster = &cluster;
    let gone = poll(
        "the killed kube-apiserver to be named",
        Duration::from_secs(30),
        || async move {
            let e = cluster.exited_components();
            e.iter()
                .any(|(name, _)| *name == "kube-apiserver")
                .then_some(e)
        },
    )
    .await;
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert!(!gone[0].1.trim().is_empty(), "its log's last lines");
}
