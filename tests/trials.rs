//! The bound on faster trials holds per shape across decisions made at once, through the real
//! API server: two operator replicas (no leader election: both reconcile) decide two
//! TrainingJobs of one shape created together, under a profile that allows one trial. The
//! learned ConfigMap is the one record: a trial is taken there, read and written at its
//! resourceVersion, before the job's workload exists, so only one of the two is a trial.

use offload_testenv::support;

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use offload_api::v1alpha1::{NodeClass, OffloadProfile, StatePlacement, TrainingJob};
use offload_operator::cluster::learned::{CONFIG_MAP, KEY, TRIALS_KEY};
use offload_operator::decision::runs::learned::LearnedMemory;
use offload_operator::decision::runs::learned::RanAs;
use offload_operator::decision::runs::learned::Run;
use offload_testenv::devcluster::ClusterOptions;
use offload_testenv::fixtures;
use serde_json::json;
use support::controller::{WAIT, oom_job, wait_for_condition};
use support::*;

/// The H200's memory as NVML reads it.
const H200_BYTES: u64 = 150_754_820_096;

/// An operator replica in this test's runtime, keeping what it learns in `ns`.
fn replica(client: &Client, ns: &str) -> tokio_util::sync::CancellationToken {
    let token = tokio_util::sync::CancellationToken::new();
    tokio::spawn(offload_operator::operator::run(
        client.clone(),
        offload_operator::operator::RunOptions {
            learned_namespace: Some(ns.to_string()),
            sizer: None,
            ..operator_options()
        },
        token.clone(),
    ));
    token
}

/// Writes `runs` of `shape` on discrete nodes under `profile` into the learned ConfigMap of
/// `ns`, as a replica's batch would (read, add, replace at the read resourceVersion).
async fn add_runs(client: &Client, ns: &str, profile: &str, shape: &str, runs: Vec<Run>) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    poll("the runs added to the learned store", WAIT, || async {
        let current = cms.get_opt(CONFIG_MAP).await.ok()?;
        let mut store = current
            .as_ref()
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get(KEY))
            .map_or_else(LearnedMemory::default, |t| LearnedMemory::parse(t).unwrap());
        for r in &runs {
            store
                .record(
                    profile,
                    NodeClass::Discrete,
                    shape,
                    "the test's shape",
                    r.clone(),
                )
                .unwrap();
        }
        let mut cm = current.clone().unwrap_or_else(|| {
            serde_json::from_value(json!({"metadata": {"name": CONFIG_MAP, "namespace": ns}}))
                .unwrap()
        });
        cm.data
            .get_or_insert_with(Default::default)
            .insert(KEY.into(), store.to_json().unwrap());
        let written = match current {
            Some(_) => cms.replace(CONFIG_MAP, &PostParams::default(), &cm).await,
            None => cms.create(&PostParams::default(), &cm).await,
        };
        written.ok().map(|_| ())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_deciding_two_jobs_at_once_give_the_last_trial_once() {
    let cluster = cluster(ClusterOptions::full());
    let client = client(cluster).await;
    apply_crds(&client).await;
    let ns = namespace(&client, "trials").await;
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &reported_node(&format!("{ns}-h200"), fixtures::H200_READING, &ns),
        )
        .await
        .unwrap();
    Api::<OffloadProfile>::all(client.clone())
        .create(
            &PostParams::default(),
            &pool_profile(&ns, &ns, json!({"fasterTrials": 1})),
        )
        .await
        .unwrap();
    let (first, second) = (replica(&client, &ns), replica(&client, &ns));
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);

    // The shape's decision by the model alone: a share of the optimizer state.
    api.create(
        &PostParams::default(),
        &oom_job("probe", &ns, "None", 40, 4096),
    )
    .await
    .unwrap();
    let probe = wait_for_condition(&api, "probe", "OffloadResolved", "True").await;
    let decided = probe.status.unwrap().offload.unwrap();
    assert_eq!(decided.placement, Some(StatePlacement::PartialOptimizer));
    let shape = decided.estimate.unwrap().shape.unwrap();
    let r0 = decided.offload_ratio;
    api.delete("probe", &DeleteParams::foreground())
        .await
        .unwrap();

    // Earlier runs of the shape in this namespace: one ran out at that share, one trained
    // with 6 points more offloaded: a faster share between them is worth a trial.
    let now = jiff::Timestamp::now().to_string();
    let ran = |ratio: f64| RanAs {
        placement: StatePlacement::PartialOptimizer,
        ratio,
        ranks: 1,
        gpu_bytes: H200_BYTES,
    };
    let run = |job: String, ratio: f64, activations: f64, failed: bool| Run {
        job,
        activations,
        host: None,
        failed,
        parameters: None,
        allocator: true,
        ran_as: Some(ran(ratio)),
        trained: !failed,
        trial: false,
        step_seconds: None,
        at: now.clone(),
    };
    let r_trained = ((r0 + 0.06) * 100.0).round() / 100.0;
    add_runs(
        &client,
        &ns,
        &ns,
        &shape,
        vec![
            run(format!("{ns}/failed/1"), r0, 3.0, true),
            run(format!("{ns}/trained/2"), r_trained, 0.9, false),
        ],
    )
    .await;
    poll("the profile shows the two runs", WAIT, || async {
        let p = Api::<OffloadProfile>::all(client.clone())
            .get(&ns)
            .await
            .ok()?;
        (p.status?.learned?.runs >= 2).then_some(())
    })
    .await;

    // Two jobs of the shape at once.
    let pp = PostParams::default();
    let (job_a, job_b) = (
        oom_job("a", &ns, "None", 40, 4096),
        oom_job("b", &ns, "None", 40, 4096),
    );
    let (a, b) = tokio::join!(api.create(&pp, &job_a), api.create(&pp, &job_b));
    a.unwrap();
    b.unwrap();
    let decided: Vec<TrainingJob> = vec![
        wait_for_condition(&api, "a", "WorkloadCreated", "True").await,
        wait_for_condition(&api, "b", "WorkloadCreated", "True").await,
    ];
    let trials: Vec<f64> = decided
        .iter()
        .filter_map(|tj| {
            let o = tj.status.as_ref()?.offload.as_ref()?;
            o.trial.as_ref().map(|_| o.offload_ratio)
        })
        .collect();
    assert_eq!(trials.len(), 1, "one trial of the one allowed: {trials:?}");
    assert!(
        trials[0] < r_trained - 0.015,
        "{trials:?} after {r_trained}"
    );
    // The other is decided from what trained.
    let other = decided
        .iter()
        .filter_map(|tj| tj.status.as_ref()?.offload.as_ref())
        .find(|o| o.trial.is_none())
        .unwrap();
    assert!(
        (other.offload_ratio - r_trained).abs() < 1e-9,
        "{}",
        other.offload_ratio
    );
    // The trial is recorded where every replica reads it.
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get(CONFIG_MAP)
        .await
        .unwrap();
    let taken = cm
        .data
        .unwrap()
        .get(TRIALS_KEY)
        .cloned()
        .unwrap_or_default();
    assert_eq!(taken.matches("\"job\"").count(), 1, "{taken}");
    first.cancel();
    second.cancel();
}
