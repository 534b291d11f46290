//! Observation on the real node: a stand-in device plugin's GPUs, the agent replaying a
//! recorded report and trace, a TrainingJob's pod spinning on one GPU.

use super::*;

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
pub(super) async fn the_agent_observes_a_configured_pod_on_the_real_node(
    cluster: &DevCluster,
    client: &kube::Client,
    figures: &mut Figures,
) {
    use offload_api::observed::{BusySource, ObservedSummary};
    use offload_testenv::device_plugin::StandInDevicePlugin;

    let trace_path = offload_testenv::fixtures::path("utilization-trace-h200.json");
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
    let recorded = recorded_busy(&trace);
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

    agent_replays_recordings(cluster, &trace_path, figures);

    let ns = namespace(client, "observed").await;
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let (pod, started) = a_configured_pod_runs(client, &ns, &tjs).await;
    let spinner = spin_in_cgroup_of(cluster, &pod);

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

    // Host memory from the pod's real memory cgroup: a process in it touches 64 MiB once.
    allocate_in_memory_cgroup_of(cluster, &pod, 64 << 20);
    let with_memory = poll(
        "the agent's summary with the pod's host memory",
        WAIT,
        || {
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
                let pod = summary.pods.into_iter().find(|p| p.namespace == ns)?;
                (pod.host_memory_peak_bytes? >= 64 << 20).then_some(pod)
            }
        },
    )
    .await;
    eprintln!(
        "host memory: {:?} ({:?})",
        with_memory.host_memory_peak_bytes, with_memory.host_memory_source
    );
    assert_eq!(
        with_memory.host_memory_source,
        Some(offload_api::observed::HostMemorySource::CgroupMaxUsage),
        "this machine's cgroup v1 keeps the high-water mark"
    );
    figures.add(format!(
        "observation: a pod's host memory peak from its real cgroup: {} MiB",
        with_memory.host_memory_peak_bytes.unwrap_or_default() >> 20
    ));

    the_job_shows_it(cluster, &tjs, &ns, expected).await;
    // While the job runs and is observed: the dashboard's GPU-busy panel has its series.
    super::monitoring::the_dashboard_and_alerts_work_against_a_real_prometheus(client, figures)
        .await;

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

/// Each recorded GPU's mean busy fraction, by UUID.
fn recorded_busy(trace: &serde_json::Value) -> BTreeMap<String, f64> {
    trace["gpus"]
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
        .collect()
}

/// The agent of the real node replays the recorded H200 report and utilization trace (from a
/// ConfigMap) in place of the NVML this node does not have; observation is on by default, with
/// a short window here.
fn agent_replays_recordings(
    cluster: &DevCluster,
    trace_path: &std::path::Path,
    figures: &mut Figures,
) {
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
}

/// A TrainingJob whose pod runs (the pause image, already on the node) on the real node, under
/// a profile with overlap on; the pod, and when the job was created.
async fn a_configured_pod_runs(
    client: &kube::Client,
    ns: &str,
    tjs: &Api<TrainingJob>,
) -> (Pod, Instant) {
    use offload_testenv::devcluster::node::images;
    create_real_node_profile(
        client,
        "observed",
        json!({"overlap": "Enabled", "startupGuard": false}),
    )
    .await;
    // A pod that runs: the pause image, already on the node.
    let mut tj = training_job("observed", "observed");
    let pod_spec = tj.spec.template.spec.as_mut().unwrap();
    pod_spec.containers[0].image = Some(images::reference("offload-pause"));
    pod_spec.containers[0].image_pull_policy = Some("Never".into());
    create_when_admitted(tjs, &tj, "the observed job").await;
    let started = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
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
    (pod, started)
}

/// A process spinning in the pod's CPU cgroups (the pause container uses none): what the agent
/// should read as the pod's CPU.
fn spin_in_cgroup_of(cluster: &DevCluster, pod: &Pod) -> Spinner {
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

    spinner
}

/// Runs a process in the pod's memory cgroup (v1 hierarchy) that touches `bytes` once and
/// exits: the cgroup's high-water mark then holds at least that much.
fn allocate_in_memory_cgroup_of(cluster: &DevCluster, pod: &Pod, bytes: u64) {
    use std::io::Write;
    let uid = pod.metadata.uid.clone().unwrap();
    let dir = find_pod_cgroup(
        &std::path::Path::new("/sys/fs/cgroup/memory").join(cluster.node_cgroup().unwrap()),
        &uid,
    )
    .unwrap_or_else(|| panic!("no memory cgroup for pod {uid}"));
    // It waits for a line, so it is in the cgroup before it allocates (v1 charges memory to
    // the cgroup a process was in when it touched it).
    let mut child = std::process::Command::new("sh")
        .args([
            "-c",
            &format!("read go; dd if=/dev/zero of=/dev/null bs={bytes} count=1 2>/dev/null"),
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(child.wait().unwrap().success());
}

/// The job's story: status.observed, the OverlapObserved condition, the Event when flagged, the
/// GPU-BUSY column.
async fn the_job_shows_it(cluster: &DevCluster, tjs: &Api<TrainingJob>, ns: &str, expected: f64) {
    // The job's story: status.observed, the condition, the Event when flagged.
    let status = wait_list(
        tjs.clone(),
        watcher::Config::default().fields("metadata.name=observed"),
        "status.observed (with the host memory peak) and OverlapObserved on the job",
        WAIT,
        |jobs| {
            let v = serde_json::to_value(&*jobs.first()?.clone()).ok()?;
            let status = v.get("status")?.clone();
            status.pointer("/observed/gpuBusy")?;
            (status.pointer("/observed/memory/hostPeakBytes")?.as_i64()? >= 64 << 20)
                .then_some(())?;
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
            let out = events_with_reason(cluster, ns, "GPUsIdle");
            (!out.trim().is_empty()).then_some(())
        })
        .await;
    }
    let shown = kubectl(cluster, &["get", "trainingjobs", "-n", ns]);
    eprintln!("{shown}");
    assert!(shown.contains("GPU-BUSY"), "{shown}");
}
