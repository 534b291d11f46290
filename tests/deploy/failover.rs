//! Failover: the leader's container killed while opted-in pods and TrainingJobs keep coming.

use super::*;

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

pub(super) async fn failover_admits_everything_and_resolves_every_job_once(
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
    let Creations {
        errors,
        stop,
        created_jobs,
        mut attempts_seen,
        creator,
    } = keep_creating(client, &ns);
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

    let created = created_jobs.lock().unwrap().clone();
    every_job_resolved_once(client, &ns, &created).await;
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

/// The creations going on in the background: what was refused, what to stop them with, the
/// TrainingJobs created, how many attempts so far, the task (its result: the attempts).
struct Creations {
    errors: Arc<Mutex<Vec<String>>>,
    stop: tokio_util::sync::CancellationToken,
    created_jobs: Arc<Mutex<Vec<String>>>,
    attempts_seen: tokio::sync::watch::Receiver<usize>,
    creator: tokio::task::JoinHandle<usize>,
}

/// An opted-in pod every 100 ms, and a TrainingJob every fourth time, until stopped.
fn keep_creating(client: &kube::Client, ns: &str) -> Creations {
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let created_jobs: Arc<Mutex<Vec<String>>> = Arc::default();
    let (attempted, attempts_seen) = tokio::sync::watch::channel(0usize);
    let creator = {
        let (client, ns, errors, stop, created_jobs) = (
            client.clone(),
            ns.to_string(),
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
                        .create(&PostParams::default(), &training_job(&name, "auto"))
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
    Creations {
        errors,
        stop,
        created_jobs,
        attempts_seen,
        creator,
    }
}

/// Every TrainingJob created is resolved, once: one workload Job each.
async fn every_job_resolved_once(client: &kube::Client, ns: &str, created: &[String]) {
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), ns);
    every_job_has_its_workload(
        &tjs,
        created.len(),
        "every TrainingJob created during the failover to get its workload",
        WAIT,
    )
    .await;
    let jobs = Api::<Job>::namespaced(client.clone(), ns)
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
}
