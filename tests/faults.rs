//! Faults, each checked for nothing lost and nothing duplicated: the operator killed with
//! SIGKILL again and again during a burst, the API server and etcd restarted mid-burst, the
//! webhook down, a node's report turning from verified to failed while jobs wait, and a node
//! deleted under a resolved job.
//!
//! The operator runs as its own process (the built `offload-operator` binary) wherever a fault
//! kills it; each such test owns its control plane, so a restart disturbs no other test.

use offload_testenv::support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use offload_api::names;
use offload_api::report::{NodeReport, OverlapVerdict};
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};
use offload_testenv::devcluster::{ClusterOptions, DevCluster, free_port, repo_root};
use offload_testenv::fixtures;
use serde_json::json;
use support::controller::{create_training_job, training_job};
use support::*;

const POOL: &str = "faults";

/// The operator binary as a process of its own, killed with SIGKILL on drop.
struct OperatorProcess {
    child: Child,
    admin: u16,
}

impl OperatorProcess {
    fn start(cluster: &DevCluster, args: &[String]) -> Self {
        let admin = free_port().unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(cluster.root().join("operator.log"))
            .unwrap();
        let child = Command::new(workspace_binary("offload-operator"))
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env("RUST_LOG", "info")
            .args(["run", "--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        OperatorProcess { child, admin }
    }

    /// SIGKILL: no shutdown, no lease released, no connection closed cleanly.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    async fn wait_ready(&self) {
        let admin = self.admin;
        poll(
            "the operator to report ready",
            Duration::from_secs(90),
            || async move { offload_testenv::http::ready(admin).await.then_some(()) },
        )
        .await;
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A control plane of the test's own, with the CRDs, one coherent and one discrete recorded
/// node, and the pool's profile.
async fn own_cluster() -> (DevCluster, Client) {
    let cluster = DevCluster::start(ClusterOptions::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    apply_crds(&client).await;
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, fixture) in [
        ("faults-gh200", fixtures::GH200_REFERENCE),
        ("faults-h200", fixtures::H200_READING),
    ] {
        nodes
            .create(&PostParams::default(), &reported_node(name, fixture, POOL))
            .await
            .unwrap();
    }
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &pool_profile(POOL, POOL, json!({})))
        .await
        .unwrap();
    (cluster, client)
}

fn deepspeed() -> serde_json::Value {
    json!({"name": "DeepSpeed", "version": "0.19.8"})
}

/// Creates `count` TrainingJobs, 8 at a time, each retried through API errors and outages
/// until the server has it (a retry answered "already exists" means an earlier try landed).
/// `quarter` is told when a quarter of them exist.
async fn create_burst(
    api: Api<TrainingJob>,
    count: usize,
    created: Arc<AtomicUsize>,
    quarter: Arc<tokio::sync::Notify>,
) {
    futures::stream::iter(0..count)
        .for_each_concurrent(8, |i| {
            let api = api.clone();
            let created = created.clone();
            let quarter = quarter.clone();
            async move {
                let tj = training_job(&format!("burst-{i}"), POOL, deepspeed(), json!({}));
                let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
                let mut delay = Duration::from_millis(50);
                loop {
                    match api.create(&PostParams::default(), &tj).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(e)) if e.code == 409 => break,
                        Err(e) => {
                            assert!(
                                tokio::time::Instant::now() < deadline,
                                "burst-{i} could not be created in 240 s: {e}"
                            );
                            tokio::time::sleep(delay).await;
                            delay = (delay * 2).min(Duration::from_secs(1));
                        }
                    }
                }
                if created.fetch_add(1, Ordering::Relaxed) + 1 == count / 4 {
                    quarter.notify_one();
                }
            }
        })
        .await;
}

/// Waits until at least `target` workload Jobs exist in `ns`; returns how many do.
async fn workloads_at_least(client: &Client, ns: &str, target: usize, before: &str) -> usize {
    wait_list(
        Api::<Job>::namespaced(client.clone(), ns),
        kube::runtime::watcher::Config::default(),
        &format!("{target} workloads before {before}"),
        Duration::from_secs(180),
        |jobs| (jobs.len() >= target).then_some(jobs.len()),
    )
    .await
}

/// Waits until every one of `count` TrainingJobs has its workload, then checks that nothing was
/// lost or duplicated: one Job and one Service owned by each, and the Job's configuration is
/// the decision recorded in the job's status.
async fn every_job_resolved_once(client: &Client, ns: &str, count: usize) {
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), ns);
    every_job_has_its_workload(
        &api,
        count,
        "every TrainingJob to report WorkloadCreated",
        Duration::from_secs(300),
    )
    .await;
    let jobs = Api::<Job>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let services = Api::<Service>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(jobs.len(), count, "one workload Job per TrainingJob");
    assert_eq!(services.len(), count, "one Service per TrainingJob");
    let owned_by = |uid: &str, refs: Option<&Vec<_>>| {
        refs.into_iter()
            .flatten()
            .any(|o: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| o.uid == uid)
    };
    for tj in api.list(&ListParams::default()).await.unwrap().items {
        let name = tj.name_any();
        let uid = tj.uid().unwrap();
        let owned: Vec<&Job> = jobs
            .iter()
            .filter(|j| owned_by(&uid, j.metadata.owner_references.as_ref()))
            .collect();
        assert_eq!(owned.len(), 1, "{name} owns {} Jobs", owned.len());
        let svcs = services
            .iter()
            .filter(|s| owned_by(&uid, s.metadata.owner_references.as_ref()))
            .count();
        assert_eq!(svcs, 1, "{name} owns {svcs} Services");
        let status = tj.status.unwrap();
        let decision = status.offload.expect("a resolved job records its decision");
        let env: BTreeMap<String, String> = owned[0]
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .map(|p| {
                p.containers[0]
                    .env
                    .iter()
                    .flatten()
                    .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            env.get(names::ENV_MODE).map(String::as_str),
            Some(decision.mode.env_value()),
            "{name}: the workload carries the recorded decision"
        );
        assert_eq!(
            status.workload.map(|w| w.job),
            owned[0].metadata.name.clone(),
            "{name}: the status names the Job that exists"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_killed_again_and_again_mid_burst_loses_and_duplicates_nothing() {
    const JOBS: usize = 150;
    const KILLS: usize = 3;
    let (cluster, client) = own_cluster().await;
    let ns = namespace(&client, "killed").await;
    let args: Vec<String> = [
        "--leader-election",
        "--lease-duration",
        "5s",
        "--namespace",
        &ns,
        "--webhook-addr",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut operator = OperatorProcess::start(&cluster, &args);
    let created = Arc::new(AtomicUsize::new(0));
    let burst = tokio::spawn(create_burst(
        Api::namespaced(client.clone(), &ns),
        JOBS,
        created.clone(),
        Arc::default(),
    ));
    // Kill the leader each time it has made progress, and start a new replica at once: the
    // new one must wait out the dead one's lease, then finish from what the cluster holds.
    let mut last = 0;
    for kill in 1..=KILLS {
        let target = (last + 10).min(JOBS - 1);
        let seen = workloads_at_least(&client, &ns, target, &format!("kill {kill}")).await;
        operator.kill();
        eprintln!("kill {kill}: SIGKILL after {seen} of {JOBS} workloads");
        last = seen;
        operator = OperatorProcess::start(&cluster, &args);
    }
    burst.await.unwrap();
    assert_eq!(created.load(Ordering::Relaxed), JOBS);
    every_job_resolved_once(&client, &ns, JOBS).await;
    drop(operator);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_and_etcd_restarted_mid_burst_lose_and_duplicate_nothing() {
    const JOBS: usize = 200;
    let (mut cluster, client) = own_cluster().await;
    let ns = namespace(&client, "outage").await;
    let operator = OperatorProcess::start(&cluster, &["--webhook-addr".into(), String::new()]);
    operator.wait_ready().await;
    let created = Arc::new(AtomicUsize::new(0));
    let quarter = Arc::new(tokio::sync::Notify::new());
    let burst = tokio::spawn(create_burst(
        Api::namespaced(client.clone(), &ns),
        JOBS,
        created.clone(),
        quarter.clone(),
    ));
    // The outage comes while jobs are still being created and resolved.
    wait(
        "a quarter of the jobs to be created",
        Duration::from_secs(120),
        quarter.notified(),
    )
    .await;
    let seen = workloads_at_least(&client, &ns, 10, "the outage").await;
    let t = std::time::Instant::now();
    cluster.restart_control_plane().await.unwrap();
    eprintln!(
        "etcd and kube-apiserver killed after {seen} of {JOBS} workloads ({} created), serving again in {:.1} s",
        created.load(Ordering::Relaxed),
        t.elapsed().as_secs_f64()
    );
    burst.await.unwrap();
    // A fresh client: the old one's connections died with the server.
    let client = cluster.client().await.unwrap();
    every_job_resolved_once(&client, &ns, JOBS).await;
    assert!(
        offload_testenv::http::ready(operator.admin).await,
        "the operator recovered on its own"
    );
}

/// The chart's webhook configurations, pointing at an operator outside the cluster.
fn register_webhook(cluster: &DevCluster, port: u16) {
    let out = cluster
        .helm()
        .args(["install", "offload-operator"])
        .arg(repo_root().join("charts/offload-operator"))
        .args(["--namespace", "offload-system", "--create-namespace"])
        .args(["--set", "operator.enabled=false"])
        .args(["--set", "agent.enabled=false"])
        .args(["--set", "defaultProfile.create=false"])
        .args(["--set", &format!("webhook.url=https://127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn batch_job(name: &str, opted_in: bool) -> Job {
    let labels = if opted_in {
        json!({names::PROFILE_ANNOTATION: POOL})
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {"suspend": true, "template": {
            "metadata": {"labels": labels},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "train", "image": "registry.example.com/train:1",
                "resources": {"limits": {names::GPU_RESOURCE: "1"}}}]}}}
    }))
    .unwrap()
}

fn job_env(job: &Job) -> BTreeMap<String, String> {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.env.as_ref())
        .map(|env| {
            env.iter()
                .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_down_refuses_opted_in_objects_clearly_affects_nothing_else_and_recovers() {
    let (cluster, client) = own_cluster().await;
    let port = free_port().unwrap();
    register_webhook(&cluster, port);
    let args: Vec<String> = [
        "--namespace",
        "offload-system",
        "--webhook-addr",
        &format!("127.0.0.1:{port}"),
        "--webhook-names",
        "127.0.0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut operator = OperatorProcess::start(&cluster, &args);
    operator.wait_ready().await;
    let ns = namespace(&client, "webhook-down").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let before = jobs
        .create(&PostParams::default(), &batch_job("before", true))
        .await
        .unwrap();
    assert!(
        job_env(&before).contains_key(names::ENV_MODE),
        "an opted-in Job is configured while the webhook serves"
    );

    operator.kill();
    // Opted-in objects are refused, saying which webhook could not be reached.
    let refused = jobs
        .create(&PostParams::default(), &batch_job("during", true))
        .await
        .expect_err("an opted-in Job must not be admitted unconfigured");
    let text = refused.to_string();
    assert!(
        text.contains("workloads.mutate.offload.dev") && text.contains("failed calling webhook"),
        "the refusal names the webhook: {text}"
    );
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let refused = tjs
        .create(
            &PostParams::default(),
            &training_job("during", POOL, deepspeed(), json!({})),
        )
        .await
        .expect_err("a TrainingJob cannot be validated while the webhook is down");
    assert!(
        refused
            .to_string()
            .contains("trainingjobs.validate.offload.dev"),
        "{refused}"
    );
    // Everything else is untouched: Jobs and Pods that did not opt in, namespaces, profiles
    // are not offload's to judge (the advisory webhooks fail open).
    let plain = jobs
        .create(&PostParams::default(), &batch_job("plain", false))
        .await
        .unwrap();
    assert!(!job_env(&plain).contains_key(names::ENV_MODE));
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let other: Namespace =
        serde_json::from_value(json!({"metadata": {"name": format!("{ns}-other")}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &other)
        .await
        .unwrap();

    // Recovery on its own: a new process serves again, and the same request is admitted.
    operator = OperatorProcess::start(&cluster, &args);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    poll(
        "an opted-in Job to be admitted again",
        Duration::from_secs(90),
        || {
            let jobs = jobs.clone();
            let dry = dry.clone();
            async move { jobs.create(&dry, &batch_job("after", true)).await.ok() }
        },
    )
    .await;
    let after = jobs
        .create(&PostParams::default(), &batch_job("after", true))
        .await
        .unwrap();
    assert_eq!(
        job_env(&after).get(names::ENV_MODE),
        job_env(&before).get(names::ENV_MODE),
        "configured as before the outage"
    );
    drop(operator);
}

/// The H200 reading with its self-test verdict replaced, as the agent would publish it.
fn h200_report(node: &str, verdict: OverlapVerdict, efficiency: f64) -> NodeReport {
    let mut report = test_node_report(node, fixtures::H200_READING);
    report.selftest.verdict = verdict;
    report.selftest.efficiency = Some(efficiency);
    report
}

async fn publish(client: &Client, report: &NodeReport, pool: &str) {
    let mut labels = offload_api::labels::published(report);
    labels.insert("offload.dev/test-pool".into(), pool.into());
    Api::<Node>::all(client.clone())
        .patch(
            &report.node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "labels": labels,
                "annotations": {names::ANNOTATION_NODE_REPORT: report.to_annotation().unwrap()}
            }})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_turning_failed_while_jobs_wait_is_what_they_are_decided_on() {
    let cluster = cluster(ClusterOptions::default());
    operator(cluster);
    let client = client(cluster).await;
    let ns = namespace(&client, "turned").await;
    let node = format!("{ns}-h200");
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &reported_node(&node, fixtures::H200_READING, &ns),
        )
        .await
        .unwrap();
    // The jobs wait: their profile does not exist yet.
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    for i in 0..3 {
        create_training_job(&api, &format!("waiting-{i}"), &ns, deepspeed(), json!({})).await;
    }
    for i in 0..3 {
        let tj = support::controller::wait_for_condition(
            &api,
            &format!("waiting-{i}"),
            "OffloadResolved",
            "False",
        )
        .await;
        let cond = tj.status.unwrap().conditions;
        assert!(cond.iter().any(|c| c.reason == "ProfileNotFound"));
    }
    // The node's self-test now fails. A probe profile over the same pool shows when the
    // operator has seen it; only then does the waiting jobs' profile appear.
    publish(
        &client,
        &h200_report(&node, OverlapVerdict::Failed, 0.31),
        &ns,
    )
    .await;
    let probe = format!("{ns}-probe");
    Api::<OffloadProfile>::all(client.clone())
        .create(
            &PostParams::default(),
            &pool_profile(&probe, &ns, json!({})),
        )
        .await
        .unwrap();
    decided_overlap_becomes(&api, &probe, false).await;
    support::controller::add_profile(&client, &ns).await;
    for i in 0..3 {
        let tj = support::controller::wait_for_condition(
            &api,
            &format!("waiting-{i}"),
            "WorkloadCreated",
            "True",
        )
        .await;
        let decision = tj.status.unwrap().offload.unwrap();
        assert!(
            !decision.overlap,
            "waiting-{i} decided on the failed report, not the verified one it saw first"
        );
        let said = serde_json::to_string(&decision.reasons).unwrap();
        assert!(
            said.contains("self-test failed"),
            "the reason says why: {said}"
        );
    }
    // And a report that turns verified again gives overlap to the next job.
    publish(
        &client,
        &h200_report(&node, OverlapVerdict::Verified, 0.84),
        &ns,
    )
    .await;
    decided_overlap_becomes(&api, &ns, true).await;
}

/// Creates probe jobs under `profile` until one is decided with overlap `want` (the operator's
/// node cache has caught up with a report just published); fails after 90 s.
async fn decided_overlap_becomes(api: &Api<TrainingJob>, profile: &str, want: bool) {
    static N: AtomicUsize = AtomicUsize::new(0);
    poll(
        &format!("a job under {profile} to be decided with overlap {want}"),
        Duration::from_secs(90),
        || async move {
            let name = format!("probe-{}", N.fetch_add(1, Ordering::Relaxed));
            api.create(
                &PostParams::default(),
                &training_job(&name, profile, deepspeed(), json!({})),
            )
            .await
            .ok()?;
            let tj = support::controller::wait_for_condition(api, &name, "WorkloadCreated", "True")
                .await;
            (tj.status?.offload?.overlap == want).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_under_a_resolved_job_leaves_it_and_its_workload_alone() {
    let cluster = cluster(ClusterOptions::default());
    operator(cluster);
    let client = client(cluster).await;
    let ns = namespace(&client, "deleted").await;
    let node = format!("{ns}-h200");
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &reported_node(&node, fixtures::H200_READING, &ns),
        )
        .await
        .unwrap();
    support::controller::add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    create_training_job(&api, "resolved", &ns, deepspeed(), json!({})).await;
    let before =
        support::controller::wait_for_condition(&api, "resolved", "WorkloadCreated", "True").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let workload_before = jobs.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(workload_before.len(), 1);

    nodes.delete(&node, &Default::default()).await.unwrap();
    // The resolved job is reconciled again (a touch), and a new job in the same pool now
    // waits for a node: the controller saw the deletion.
    api.patch(
        "resolved",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await
    .unwrap();
    create_training_job(&api, "after-deletion", &ns, deepspeed(), json!({})).await;
    let waiting =
        support::controller::wait_for_condition(&api, "after-deletion", "OffloadResolved", "False")
            .await;
    let reason = waiting
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "OffloadResolved")
        .unwrap()
        .reason;
    assert_eq!(reason, "NoReportedNodes");
    let after = api.get("resolved").await.unwrap();
    assert_eq!(
        after.status.as_ref().and_then(|s| s.offload.clone()),
        before.status.as_ref().and_then(|s| s.offload.clone()),
        "the decision is kept: a started job is never reconfigured"
    );
    assert!(has_workload(&after), "its workload is still reported");
    let workload_after = jobs.list(&ListParams::default()).await.unwrap().items;
    let uids = |l: &[Job]| l.iter().map(|j| j.uid()).collect::<Vec<_>>();
    // The new job has no workload (it waits); the old one still exactly its own.
    assert_eq!(uids(&workload_after), uids(&workload_before));
}
