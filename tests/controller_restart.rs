//! Killing the operator mid-way and starting it again leaves exactly one workload per job.
//! Its own test binary, so its operators are the only ones running against its cluster.

use offload_testenv::support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use offload_api::v1alpha1::TrainingJob;
use offload_testenv::devcluster::{ClusterOptions, free_port};
use offload_testenv::fixtures;
use serde_json::json;
use support::*;

const JOBS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_way_leaves_exactly_one_workload_per_job() {
    let cluster = cluster(ClusterOptions::default());
    let client = client(cluster).await;
    apply_crds(&client).await;
    let ns = namespace(&client, "restart").await;
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &reported_node("restart-h200", fixtures::H200_READING, &ns),
        )
        .await
        .unwrap();
    support::controller::add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    for i in 0..JOBS {
        let tj: TrainingJob = serde_json::from_value(json!({
            "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": format!("job-{i}"), "annotations": {"offload.dev/profile": ns}},
            "spec": {"framework": {"name": "DeepSpeed", "version": "0.19.8"},
                     "template": {"spec": {"containers": [{"name": "t", "image": "busybox"}]}}}
        }))
        .unwrap();
        api.create(&PostParams::default(), &tj).await.unwrap();
    }

    // First operator: stopped hard as soon as some, but not all, workloads exist.
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let first = tokio::spawn(offload_operator::operator::run(
        client.clone(),
        operator_options(),
        Default::default(),
    ));
    let created_before = wait_list(
        jobs.clone(),
        watcher::Config::default(),
        "the first operator to create some workloads",
        Duration::from_secs(60),
        |jobs| (!jobs.is_empty()).then_some(jobs.len()),
    )
    .await;
    first.abort();
    let _ = first.await;
    eprintln!("first operator stopped after {created_before} of {JOBS} workloads");

    // Second operator: finishes the rest.
    let token = tokio_util::sync::CancellationToken::new();
    let second = tokio::spawn(offload_operator::operator::run(
        client.clone(),
        operator_options(),
        token.clone(),
    ));
    every_job_has_its_workload(
        &api,
        JOBS,
        "every TrainingJob to report WorkloadCreated",
        Duration::from_secs(120),
    )
    .await;
    token.cancel();
    second.await.unwrap().unwrap();

    let job_list = jobs.list(&ListParams::default()).await.unwrap().items;
    let services = Api::<Service>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(job_list.len(), JOBS, "exactly one Job per TrainingJob");
    assert_eq!(services.len(), JOBS, "exactly one Service per TrainingJob");
    for tj in api.list(&ListParams::default()).await.unwrap().items {
        let name = tj.metadata.name.clone().unwrap();
        let owned: Vec<&Job> = job_list
            .iter()
            .filter(|j| {
                j.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| Some(&o.uid) == tj.metadata.uid.as_ref())
            })
            .collect();
        assert_eq!(owned.len(), 1, "{name} owns {} Jobs", owned.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_to_the_standby_when_the_leader_stops() {
    use k8s_openapi::api::coordination::v1::Lease;
    use offload_operator::operator::{LeaderElection, RunOptions};
    let cluster = cluster(ClusterOptions::default());
    let client = client(cluster).await;
    apply_crds(&client).await;
    let ns = namespace(&client, "lease").await;
    let options = |identity: &str, admin_port: u16| RunOptions {
        admin_addr: format!("127.0.0.1:{admin_port}").parse().unwrap(),
        leader_election: Some(LeaderElection {
            namespace: ns.clone(),
            lease_name: "offload-operator-leader".into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
        }),
        ..operator_options()
    };
    let (a_admin, b_admin) = (free_port().unwrap(), free_port().unwrap());
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let holder = |want: &'static str| {
        kube::runtime::wait::await_condition(
            leases.clone(),
            "offload-operator-leader",
            move |lease: Option<&Lease>| {
                lease
                    .and_then(|l| l.spec.as_ref())
                    .and_then(|s| s.holder_identity.as_deref())
                    == Some(want)
            },
        )
    };
    let a_token = tokio_util::sync::CancellationToken::new();
    let a = tokio::spawn(offload_operator::operator::run(
        client.clone(),
        options("replica-a", a_admin),
        a_token.clone(),
    ));
    wait(
        "replica-a to hold the lease",
        Duration::from_secs(60),
        holder("replica-a"),
    )
    .await
    .unwrap();
    let b_token = tokio_util::sync::CancellationToken::new();
    let b = tokio::spawn(offload_operator::operator::run(
        client.clone(),
        options("replica-b", b_admin),
        b_token.clone(),
    ));
    // The standby is ready as soon as its caches synced, though it does not lead: it serves
    // the webhook, so the webhook Service keeps an endpoint while a leader restarts.
    wait(
        "replica-b (standby) to report ready",
        Duration::from_secs(60),
        async {
            let mut delay = Duration::from_millis(20);
            loop {
                if offload_testenv::http::ready(b_admin).await {
                    break;
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(250));
            }
        },
    )
    .await;
    assert!(
        offload_testenv::http::ready(a_admin).await,
        "the leader is ready too"
    );
    // Stopping the leader hands the lease to the standby.
    a_token.cancel();
    a.await.unwrap().unwrap();
    wait(
        "replica-b to take the lease after replica-a stopped",
        Duration::from_secs(90),
        holder("replica-b"),
    )
    .await
    .unwrap();
    b_token.cancel();
    b.await.unwrap().unwrap();
}
