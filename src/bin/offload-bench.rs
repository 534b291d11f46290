//! `offload-bench`: benchmarks that print figures (never pass/fail).
//!
//! - `control-plane`: start-up time to ready of the local control plane and each process's memory;
//! - `controller --jobs N`: N TrainingJobs created in a burst against the local control plane,
//!   time from creation to workload (p50/p99), the operator's CPU time and peak RSS (the release
//!   `offload-operator` binary, run as its own process);
//! - `webhook`: pod mutation over TLS on loopback at increasing concurrency (throughput,
//!   p50/p99/p99.9), and real pod creation through the API server with and without the webhook,
//!   side by side.
//! - `admission`: the admission handlers in process by cluster size (µs per request with and
//!   without a decision over every reported node).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use offload_operator::api::{OffloadProfile, TrainingJob};
use offload_operator::devcluster::{ClusterOptions, DevCluster, free_port};
use offload_operator::report::{NodeReport, fixtures};
use serde_json::json;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(mut ms: Vec<f64>) -> (f64, f64, f64, f64, f64) {
    ms.sort_by(f64::total_cmp);
    #[allow(clippy::cast_precision_loss)]
    let mean = ms.iter().sum::<f64>() / ms.len().max(1) as f64;
    (
        mean,
        percentile(&ms, 50.0),
        percentile(&ms, 99.0),
        percentile(&ms, 99.9),
        ms.last().copied().unwrap_or(f64::NAN),
    )
}

fn proc_status(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// utime + stime of a process, seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[allow(clippy::cast_precision_loss)]
    Some(ticks as f64 / hz.max(1) as f64)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    format!(
        "{} cores ({cpu}), {} GiB",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        proc_total_gib()
    )
}

fn proc_total_gib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024 / 1024)
}

async fn control_plane(runs: u32) -> Result<(), String> {
    println!("# control plane start-up ({})", machine());
    let mut apiserver = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let c = DevCluster::start(ClusterOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        apiserver.push(t.elapsed().as_secs_f64());
        drop(c);
    }
    let t = Instant::now();
    let full = DevCluster::start(ClusterOptions::full())
        .await
        .map_err(|e| e.to_string())?;
    let full_ready = t.elapsed().as_secs_f64();
    // Let the controllers finish their first sync before reading memory.
    tokio::time::sleep(Duration::from_secs(15)).await;
    println!(
        "etcd + kube-apiserver to /readyz, {runs} runs: {}",
        apiserver
            .iter()
            .map(|s| format!("{s:.2} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("with controller-manager, scheduler, kwok (apiserver ready): {full_ready:.2} s");
    println!("resident memory 15 s after start:");
    for (name, kib) in full.memory_kib() {
        println!("  {name:<24} {:>6.0} MiB", kib as f64 / 1024.0);
    }
    Ok(())
}

fn reported_node(name: &str, fixture: &str) -> Result<Node, String> {
    let mut report = NodeReport::parse(fixture).map_err(|e| e.to_string())?;
    report.node = name.to_string();
    let mut labels: BTreeMap<String, String> = report.labels();
    labels.insert("kubernetes.io/hostname".into(), name.into());
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"offload.dev/node-report": report.to_annotation().map_err(|e| e.to_string())?}}
    }))
    .map_err(|e| e.to_string())
}

async fn setup_cluster(cluster: &DevCluster) -> Result<kube::Client, String> {
    let client = cluster.client().await.map_err(|e| e.to_string())?;
    let crds = root().join("crds");
    let out = cluster
        .kubectl()
        .args(["apply", "--server-side", "-f"])
        .arg(&crds)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let _ = cluster
        .kubectl()
        .args([
            "wait",
            "--for=condition=Established",
            "crd/trainingjobs.offload.dev",
            "crd/offloadprofiles.offload.dev",
        ])
        .output();
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..8 {
        nodes
            .create(
                &PostParams::default(),
                &reported_node(&format!("gh200-{i}"), fixtures::GH200_REFERENCE)?,
            )
            .await
            .map_err(|e| e.to_string())?;
        nodes
            .create(
                &PostParams::default(),
                &reported_node(&format!("h200-{i}"), fixtures::H200_READING)?,
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    let profile: OffloadProfile = serde_json::from_value(json!({"apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile", "metadata": {"name": "default"}, "spec": {}})).map_err(|e| e.to_string())?;
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &profile)
        .await
        .map_err(|e| e.to_string())?;
    Ok(client)
}

/// Starts the release operator; returns it with its admin (metrics) port.
fn spawn_operator(cluster: &DevCluster, webhook_port: Option<u16>) -> Result<(Child, u16), String> {
    let bin = root().join("target/release/offload-operator");
    if !bin.exists() {
        return Err("build the release binaries first: cargo build --release --bins".into());
    }
    let admin = free_port().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(bin);
    cmd.env("KUBECONFIG", &cluster.kubeconfig)
        .env("RUST_LOG", "warn")
        .args(["run", "--admin-addr", &format!("127.0.0.1:{admin}")])
        .args(["--namespace", "offload-system"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    match webhook_port {
        Some(p) => cmd.args([
            "--webhook-addr",
            &format!("127.0.0.1:{p}"),
            "--webhook-names",
            "127.0.0.1",
        ]),
        None => cmd.args(["--webhook-addr", ""]),
    };
    cmd.spawn().map(|c| (c, admin)).map_err(|e| e.to_string())
}

/// The operator's own measure of its pod-mutation handler: (sum seconds, count) of
/// `offload_operator_admission_duration_seconds{endpoint="mutate-pod"}` from its `/metrics`.
fn handler_seconds(admin_port: u16) -> Option<(f64, f64)> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", admin_port)).ok()?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    let metric = |name: &str| -> Option<f64> {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains("endpoint=\"mutate-pod\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .next()
    };
    Some((
        metric("offload_operator_admission_duration_seconds_sum")?,
        metric("offload_operator_admission_duration_seconds_count")?,
    ))
}

async fn controller(jobs: usize) -> Result<(), String> {
    println!(
        "# controller: {jobs} TrainingJobs in a burst ({})",
        machine()
    );
    let cluster = DevCluster::start(ClusterOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let client = setup_cluster(&cluster).await?;
    let (mut op, _) = spawn_operator(&cluster, None)?;
    let pid = op.id();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu0 = cpu_seconds(pid).unwrap_or(0.0);

    let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let api_jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let seen_w = seen.clone();
    let watch = tokio::spawn(async move {
        let stream = watcher(
            api_jobs,
            watcher::Config::default().labels("offload.dev/training-job"),
        )
        .touched_objects();
        futures::pin_mut!(stream);
        while let Ok(Some(job)) = stream.try_next().await {
            if let Some(name) = job.metadata.name {
                seen_w
                    .lock()
                    .map(|mut s| s.entry(name).or_insert_with(Instant::now).to_owned())
                    .ok();
            }
        }
    });
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), "default");
    let start = Instant::now();
    futures::stream::iter(0..jobs)
        .map(|i| {
            let tjs = tjs.clone();
            let created = created.clone();
            async move {
                let name = format!("burst-{i}");
                let tj: TrainingJob = serde_json::from_value(json!({
                    "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
                    "metadata": {"name": name, "annotations": {"offload.dev/profile": "auto"}},
                    "spec": {"framework": {"name": "DeepSpeed", "version": "0.19.8"},
                             "template": {"spec": {"containers": [{"name": "t", "image": "train:1"}]}}}
                }))
                .ok()?;
                let t = Instant::now();
                tjs.create(&PostParams::default(), &tj).await.ok()?;
                created.lock().ok()?.insert(name, t);
                Some(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let create_wall = start.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let n = seen.lock().map(|s| s.len()).unwrap_or(0);
        if n >= jobs || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu0;
    let hwm = proc_status(pid, "VmHWM:").unwrap_or(0);
    let rss = proc_status(pid, "VmRSS:").unwrap_or(0);
    let _ = op.kill();
    let _ = op.wait();
    watch.abort();
    let (created, seen) = (
        created.lock().map(|c| c.clone()).unwrap_or_default(),
        seen.lock().map(|s| s.clone()).unwrap_or_default(),
    );
    let latencies: Vec<f64> = created
        .iter()
        .filter_map(|(name, t0)| {
            seen.get(name)
                .map(|t1| t1.saturating_duration_since(*t0).as_secs_f64() * 1e3)
        })
        .collect();
    let (mean, p50, p99, _, max) = summary(latencies.clone());
    println!(
        "created {} TrainingJobs in {create_wall:.1} s (32 concurrent clients); {} workloads seen after {all_wall:.1} s",
        created.len(),
        latencies.len()
    );
    println!(
        "creation → workload Job: mean {mean:.0} ms, p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms"
    );
    println!(
        "operator CPU {cpu:.1} s over the burst ({:.0} % of one core), peak RSS {:.0} MiB, RSS at end {:.0} MiB",
        cpu / all_wall * 100.0,
        hwm as f64 / 1024.0,
        rss as f64 / 1024.0
    );
    Ok(())
}

// ---- admission in process ------------------------------------------------------------------

/// A fixed cluster view: every profile is the default one, `nodes` reported nodes.
struct FixedView(Arc<[offload_operator::decision::NodeInfo]>);

impl offload_operator::webhook::admit::ClusterView for FixedView {
    fn profile(&self, _name: &str) -> Option<offload_operator::api::OffloadProfileSpec> {
        Some(offload_operator::api::OffloadProfileSpec::default())
    }
    fn nodes(&self) -> Arc<[offload_operator::decision::NodeInfo]> {
        self.0.clone()
    }
}

fn fixed_view(nodes: usize) -> Result<FixedView, String> {
    let mut out = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let (name, fixture) = if i % 2 == 0 {
            (format!("gh200-{i}"), fixtures::GH200_REFERENCE)
        } else {
            (format!("h200-{i}"), fixtures::H200_READING)
        };
        let report = NodeReport::parse(fixture).map_err(|e| e.to_string())?;
        out.push(offload_operator::decision::NodeInfo::from_metadata(
            name,
            report.labels(),
            &BTreeMap::from([(
                offload_operator::names::ANNOTATION_NODE_REPORT.to_string(),
                fixture.to_string(),
            )]),
        ));
    }
    Ok(FixedView(out.into()))
}

fn admission_request(
    kind: (&str, &str, &str, &str),
    object: serde_json::Value,
) -> Result<kube::core::admission::AdmissionRequest<kube::core::DynamicObject>, String> {
    let (group, version, kind, resource) = kind;
    let review: kube::core::admission::AdmissionReview<kube::core::DynamicObject> =
        serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "00000000-0000-0000-0000-000000000001",
                        "kind": {"group": group, "version": version, "kind": kind},
                        "resource": {"group": group, "version": version, "resource": resource},
                        "namespace": "bench", "operation": "CREATE",
                        "userInfo": {"username": "bench"}, "object": object}
        }))
        .map_err(|e| e.to_string())?;
    review.try_into().map_err(|e| format!("{e}"))
}

/// The admission handlers in process (no TLS, no HTTP), by cluster size: what a request costs
/// the operator's CPU when it needs a decision over every reported node, and when it does not.
fn admission(node_counts: &[usize], iterations: u32) -> Result<(), String> {
    use offload_operator::webhook::admit;
    println!("# admission handlers in process ({})", machine());
    println!(
        "\n{iterations} requests per cell, one thread; µs per request (requests/s on one core)\n"
    );
    println!(
        "| reported nodes | bare Pod (decision) | batch Job (decision) | Pod from a configured template (no decision) |"
    );
    println!("|---|---|---|---|");
    let labels = json!({"offload.dev/profile": "default"});
    let container = json!({"name": "train", "image": "train:1",
                           "resources": {"limits": {"nvidia.com/gpu": "1"}}});
    let bare = admission_request(
        ("", "v1", "Pod", "pods"),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p", "namespace": "bench", "labels": labels},
               "spec": {"containers": [container]}}),
    )?;
    let job = admission_request(
        ("batch", "v1", "Job", "jobs"),
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "j", "namespace": "bench", "labels": labels},
               "spec": {"parallelism": 4, "completions": 4,
                        "template": {"metadata": {"labels": labels},
                                     "spec": {"restartPolicy": "Never", "containers": [container]}}}}),
    )?;
    for &nodes in node_counts {
        let view = fixed_view(nodes)?;
        // The pod a configured template produces: the bare pod with the webhook's patch applied.
        let answer = admit::mutate_pod(&bare, &view).response;
        let patch: json_patch::Patch = answer
            .patch
            .as_deref()
            .and_then(|p| serde_json::from_slice(p).ok())
            .ok_or("the bare pod was not mutated")?;
        let mut configured_pod =
            serde_json::to_value(bare.object.as_ref()).map_err(|e| e.to_string())?;
        json_patch::patch(&mut configured_pod, &patch).map_err(|e| e.to_string())?;
        let configured = admission_request(("", "v1", "Pod", "pods"), configured_pod)?;
        let time = |req: &kube::core::admission::AdmissionRequest<kube::core::DynamicObject>,
                    f: fn(
            &kube::core::admission::AdmissionRequest<kube::core::DynamicObject>,
            &dyn admit::ClusterView,
        ) -> admit::Verdict,
                    patched: bool|
         -> Result<String, String> {
            let t = Instant::now();
            for _ in 0..iterations {
                let v = f(req, &view);
                if !v.response.allowed || v.response.patch.is_some() != patched {
                    return Err(format!(
                        "unexpected answer: {:?}",
                        v.response.result.message
                    ));
                }
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
            Ok(format!("{us:.1} ({:.0}/s)", 1e6 / us))
        };
        println!(
            "| {nodes} | {} | {} | {} |",
            time(&bare, admit::mutate_pod, true)?,
            time(&job, admit::mutate_workload, true)?,
            time(&configured, admit::mutate_pod, false)?
        );
    }
    Ok(())
}

// ---- webhook -------------------------------------------------------------------------------

fn pod_review(i: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("00000000-0000-0000-0000-{i:012}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "bench", "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("p-{i}"), "namespace": "bench", "labels": {"offload.dev/profile": "auto"}},
                "spec": {"containers": [{"name": "train", "image": "train:1", "env": [{"name": "KEEP", "value": "1"}],
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        }
    }))
    .unwrap_or_default()
}

type Conn = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

async fn connect(port: u16, tls: Arc<rustls::ClientConfig>) -> Result<Conn, String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(send)
}

async fn webhook_load(
    port: u16,
    path: &'static str,
    tls: Arc<rustls::ClientConfig>,
    concurrency: usize,
    duration: Duration,
) -> Result<(usize, Vec<f64>), String> {
    let body = bytes::Bytes::from(pod_review(1));
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let tls = tls.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let mut conn = connect(port, tls).await?;
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let req = hyper::Request::post(path)
                        .header("content-type", "application/json")
                        .header("host", "127.0.0.1")
                        .body(http_body_util::Full::new(body.clone()))
                        .map_err(|e| e.to_string())?;
                    let t = Instant::now();
                    let res = conn.send_request(req).await.map_err(|e| e.to_string())?;
                    let bytes = http_body_util::BodyExt::collect(res.into_body())
                        .await
                        .map_err(|e| e.to_string())?
                        .to_bytes();
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                    if bytes.len() < 50 {
                        return Err("short response".to_string());
                    }
                }
                Ok::<_, String>(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(|e| e.to_string())??);
    }
    Ok((all.len(), all))
}

async fn webhook(
    seconds: u64,
    pods: usize,
    clients: usize,
    kubectl_pods: usize,
) -> Result<(), String> {
    println!("# webhook ({})", machine());
    let cluster = DevCluster::start(ClusterOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let client = setup_cluster(&cluster).await?;
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "offload-system"}}))
            .map_err(|e| e.to_string())?;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
    let port = free_port().map_err(|e| e.to_string())?;
    // Register the pod webhook (as the chart does, by URL for an operator outside the cluster).
    let chart = root().join("charts/offload-operator");
    let out = cluster
        .helm()
        .args(["install", "offload-operator"])
        .arg(&chart)
        .args([
            "--namespace",
            "offload-system",
            "--set",
            "operator.enabled=false",
            "--set",
            "agent.enabled=false",
            "--set",
            "defaultProfile.create=false",
        ])
        .args(["--set", &format!("webhook.url=https://127.0.0.1:{port}")])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let (mut op, admin) = spawn_operator(&cluster, Some(port))?;
    // The CA the operator generated, to trust the webhook.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "offload-system");
    let mut ca = None;
    for _ in 0..100 {
        if let Ok(Some(s)) = secrets
            .get_opt(offload_operator::names::WEBHOOK_SECRET)
            .await
        {
            ca = s.data.and_then(|d| d.get("ca.crt").map(|b| b.0.clone()));
            if ca.is_some() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ca = ca.ok_or("the operator did not write its CA")?;
    let tls = trusting(&ca)?;
    // Wait until the webhook serves with its caches filled (a mutation comes back with a patch).
    for _ in 0..100 {
        if let Ok((n, _)) = webhook_load(
            port,
            "/mutate/pod",
            tls.clone(),
            1,
            Duration::from_millis(50),
        )
        .await
            && n > 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The bench namespace and the peer webhook (it needs the operator's patch for a bench pod).
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "bench"}}))
            .map_err(|e| e.to_string())?;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}}))
            .map_err(|e| e.to_string())?;
    let _ = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), "bench")
        .create(&PostParams::default(), &sa)
        .await;
    let podsapi: Api<Pod> = Api::namespaced(client.clone(), "bench");
    let peer = start_peer(&cluster, &client, &podsapi, port, &tls).await?;

    let op_pid = op.id();
    let peer_pid = peer.child.id();
    println!(
        "\npod mutation over TLS on loopback ({seconds} s per level, keep-alive connections), the operator's webhook and the minimal peer answering the same patch:"
    );
    println!(
        "| concurrency | mutations/s | p50 ms | p99 ms | p99.9 ms | operator CPU % | peer answers/s | peer p50 ms | peer p99 ms | peer CPU % |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for c in [1usize, 2, 4, 8, 16, 32, 64] {
        let mut row = format!("| {c} ");
        for (pid, port, path, tls) in [
            (op_pid, port, "/mutate/pod", &tls),
            (peer_pid, peer.port, "/replay", &peer.tls),
        ] {
            let cpu0 = cpu_seconds(pid).unwrap_or(0.0);
            let t = Instant::now();
            let (n, lat) =
                webhook_load(port, path, tls.clone(), c, Duration::from_secs(seconds)).await?;
            let wall = t.elapsed().as_secs_f64();
            let cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu0;
            let (_, p50, p99, p999, _) = summary(lat);
            #[allow(clippy::cast_precision_loss)]
            let rate = n as f64 / wall;
            if pid == op_pid {
                row += &format!(
                    "| {rate:.0} | {p50:.3} | {p99:.3} | {p999:.3} | {:.0} ",
                    cpu / wall * 100.0
                );
            } else {
                row += &format!(
                    "| {rate:.0} | {p50:.3} | {p99:.3} | {:.0} |",
                    cpu / wall * 100.0
                );
            }
        }
        println!("{row}");
    }

    let created = pod_creation(
        &cluster,
        &podsapi,
        (port, admin),
        &peer.configuration,
        pods,
        clients,
        kubectl_pods,
    )
    .await;
    let _ = op.kill();
    let _ = op.wait();
    created
}

/// The kinds of pod in the side-by-side creation run: what the API server does with each.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PodKind {
    /// Unlabelled: no webhook is called.
    Without,
    /// Unlabelled, created with the operator's configuration already written in (the pod the
    /// webhook produces, without the webhook).
    Preconfigured,
    /// Sent to the peer webhook, which allows without a patch.
    PeerNoop,
    /// Sent to the peer webhook, which answers with the patch the operator computed for the
    /// same pod (a fixed answer, no work).
    PeerReplay,
    /// Sent to the operator's webhook and mutated.
    Operator,
}

impl PodKind {
    const ALL: [PodKind; 5] = [
        Self::Without,
        Self::Preconfigured,
        Self::PeerNoop,
        Self::PeerReplay,
        Self::Operator,
    ];

    fn row(self) -> &'static str {
        match self {
            Self::Without => "no webhook called (unlabelled)",
            Self::Preconfigured => "no webhook called, configuration written by the client",
            Self::PeerNoop => "minimal webhook, allow without a patch",
            Self::PeerReplay => "minimal webhook, answers the operator's patch",
            Self::Operator => "the operator's webhook (mutates)",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::Without => "without",
            Self::Preconfigured => "preconfigured",
            Self::PeerNoop => "noop",
            Self::PeerReplay => "replay",
            Self::Operator => "with",
        }
    }

    fn labels(self) -> serde_json::Value {
        match self {
            Self::Without | Self::Preconfigured => json!({}),
            Self::PeerNoop => json!({"bench.offload.dev/peer": "noop"}),
            Self::PeerReplay => json!({"bench.offload.dev/peer": "replay"}),
            Self::Operator => json!({"offload.dev/profile": "auto"}),
        }
    }

    /// The pod to create; `configuration` is the operator's patch for it (applied by the
    /// client for `Preconfigured`).
    fn pod(self, name: &str, configuration: &json_patch::Patch) -> serde_json::Value {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "labels": self.labels()},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        if self == Self::Preconfigured {
            // Checked once in start_peer: the patch applies to this pod.
            let _ = json_patch::patch(&mut pod, configuration);
        }
        pod
    }
}

/// Real pod creation through the API server, four kinds interleaved in rounds so that all see
/// the same conditions: no webhook, a minimal peer webhook (no patch, and replaying the
/// operator's patch) and the operator's webhook; then the same through `kubectl create`.
async fn pod_creation(
    cluster: &DevCluster,
    podsapi: &Api<Pod>,
    (port, admin): (u16, u16),
    configuration: &json_patch::Patch,
    pods: usize,
    clients: usize,
    kubectl_pods: usize,
) -> Result<(), String> {
    let handler_before = handler_seconds(admin);
    let mut api = Tally::default();
    let rounds = 10;
    for round in 0..rounds {
        for kind in PodKind::ALL {
            let results: Vec<Result<f64, String>> = futures::stream::iter(0..pods / rounds)
                .map(|i| {
                    let podsapi = podsapi.clone();
                    async move {
                        let pod: Pod = serde_json::from_value(
                            kind.pod(&format!("{}-{round}-{i}", kind.prefix()), configuration),
                        )
                        .map_err(|e| e.to_string())?;
                        let t = Instant::now();
                        podsapi
                            .create(&PostParams::default(), &pod)
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok(t.elapsed().as_secs_f64() * 1e3)
                    }
                })
                .buffer_unordered(clients)
                .collect()
                .await;
            for r in results {
                api.record(kind, r);
            }
        }
    }
    println!(
        "\nreal pod creation through kube-apiserver (kube client), {clients} concurrent clients, {pods} pods of each kind, interleaved:"
    );
    api.table();
    if let (Some((s0, n0)), Some((s1, n1))) = (handler_before, handler_seconds(admin)) {
        println!(
            "the operator's handler itself (its offload_operator_admission_duration_seconds, parse to answer): {:.0} calls, mean {:.3} ms",
            n1 - n0,
            (s1 - s0) / (n1 - n0) * 1e3
        );
    }

    // The same through kubectl, one process per pod, as a user creates one.
    if kubectl_pods > 0 {
        let mut cli = Tally::default();
        for i in 0..kubectl_pods {
            for kind in PodKind::ALL {
                let manifest = kind
                    .pod(&format!("kubectl-{}-{i}", kind.prefix()), configuration)
                    .to_string();
                let t = Instant::now();
                let ok = run_with_stdin(
                    cluster
                        .kubectl()
                        .args(["create", "--namespace", "bench", "-f", "-"]),
                    &manifest,
                );
                cli.record(kind, ok.map(|()| t.elapsed().as_secs_f64() * 1e3));
            }
        }
        println!(
            "\nreal pod creation with `kubectl create -f -` (one process per pod), {kubectl_pods} pods of each kind, interleaved:"
        );
        cli.table();
    }

    // Connections to the webhook port: the API server's open ones, and those closed in the last
    // minute (they linger in TIME-WAIT; the load phase's own connections may be among them).
    let sockets = |state: &str| -> Option<usize> {
        let out = Command::new("ss")
            .args([
                "-tan",
                "state",
                state,
                &format!("( sport = :{port} or dport = :{port} )"),
            ])
            .output()
            .ok()?;
        Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .count()
                .saturating_sub(1),
        )
    };
    if let (Some(open), Some(closed)) = (sockets("established"), sockets("time-wait")) {
        println!(
            "\nconnections to the operator's webhook port after the run: {} open (each seen from both ends), {closed} closed in the last minute (TIME-WAIT)",
            open
        );
    }
    // The API server's own view of each webhook call.
    if let Ok(out) = cluster
        .kubectl()
        .args(["get", "--raw", "/metrics"])
        .output()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        println!(
            "kube-apiserver's own measure of each webhook call (apiserver_admission_webhook_admission_duration_seconds):"
        );
        for (hook, row) in [
            ("noop.bench.offload.dev", PodKind::PeerNoop.row()),
            ("replay.bench.offload.dev", PodKind::PeerReplay.row()),
            ("pods.mutate.offload.dev", PodKind::Operator.row()),
        ] {
            let metric = |name: &str| -> Option<f64> {
                text.lines()
                    .filter(|l| l.starts_with(name) && l.contains(&format!("name=\"{hook}\"")))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .next()
            };
            if let (Some(sum), Some(count)) = (
                metric("apiserver_admission_webhook_admission_duration_seconds_sum"),
                metric("apiserver_admission_webhook_admission_duration_seconds_count"),
            ) {
                println!(
                    "- {row}: {count:.0} calls, mean {:.2} ms",
                    sum / count * 1e3
                );
            }
        }
    }
    Ok(())
}

/// Creation latencies and failures by pod kind.
#[derive(Default)]
struct Tally {
    lat: HashMap<&'static str, Vec<f64>>,
    failed: HashMap<&'static str, usize>,
}

impl Tally {
    /// Records one creation; the first failure of a kind is printed.
    fn record(&mut self, kind: PodKind, result: Result<f64, String>) {
        match result {
            Ok(ms) => self.lat.entry(kind.prefix()).or_default().push(ms),
            Err(e) => {
                let n = self.failed.entry(kind.prefix()).or_default();
                if *n == 0 {
                    eprintln!("{}: creation failed: {e}", kind.row());
                }
                *n += 1;
            }
        }
    }

    /// Prints one row per pod kind, with what each adds to the creation of the unlabelled pod
    /// and of the same configured pod created without a webhook.
    fn table(&self) {
        let (lat, failed) = (&self.lat, &self.failed);
        println!(
            "| pods | created | failed | mean ms | p50 ms | p99 ms | added p50 (vs unlabelled) | added p50 (vs configured by the client) |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        let p50_of = |kind: PodKind| summary(lat.get(kind.prefix()).cloned().unwrap_or_default()).1;
        let base = p50_of(PodKind::Without);
        let configured = p50_of(PodKind::Preconfigured);
        let added = |p50: f64, base: f64| {
            format!(
                "{:+.2} ms ({:+.1} %)",
                p50 - base,
                (p50 / base - 1.0) * 100.0
            )
        };
        for kind in PodKind::ALL {
            let l = lat.get(kind.prefix()).cloned().unwrap_or_default();
            let n = l.len();
            let (mean, p50, p99, _, _) = summary(l);
            let (vs_base, vs_configured) = match kind {
                PodKind::Without => ("—".to_string(), "—".to_string()),
                PodKind::Preconfigured => (added(p50, base), "—".to_string()),
                PodKind::PeerNoop => (added(p50, base), "—".to_string()),
                PodKind::PeerReplay | PodKind::Operator => {
                    (added(p50, base), added(p50, configured))
                }
            };
            println!(
                "| {} | {n} | {} | {mean:.2} | {p50:.2} | {p99:.2} | {vs_base} | {vs_configured} |",
                kind.row(),
                failed.get(kind.prefix()).copied().unwrap_or(0)
            );
        }
    }
}

fn run_with_stdin(cmd: &mut Command, input: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The peer webhook process and what the benchmark needs of it.
struct Peer {
    child: Child,
    port: u16,
    /// Trusts the peer's own CA.
    tls: Arc<rustls::ClientConfig>,
    /// The operator's patch for a bench pod (what the peer replays).
    configuration: json_patch::Patch,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TLS client configuration that trusts the CA in `ca_pem`.
fn trusting(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(ca_pem) {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    Ok(Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    ))
}

/// Starts the peer webhook as its own process (this binary, `peer-webhook`), with a CA of its
/// own, the operator's patch for a bench pod to replay, and a configuration that sends the
/// peer-labelled pods to it; returns once the API server calls it.
async fn start_peer(
    cluster: &DevCluster,
    client: &kube::Client,
    podsapi: &Api<Pod>,
    operator_port: u16,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<Peer, String> {
    // The operator's patch for a bench pod as the API server would send it (defaulted): create
    // one unlabelled, read it back, label it and ask the operator's webhook directly.
    let probe: Pod =
        serde_json::from_value(PodKind::Without.pod("probe", &json_patch::Patch(Vec::new())))
            .map_err(|e| e.to_string())?;
    let stored = podsapi
        .create(&PostParams::default(), &probe)
        .await
        .map_err(|e| e.to_string())?;
    let mut object = serde_json::to_value(&stored).map_err(|e| e.to_string())?;
    object["metadata"]["labels"] = PodKind::Operator.labels();
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "00000000-0000-0000-0000-000000000001",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "bench", "operation": "CREATE",
                    "userInfo": {"username": "bench"}, "object": object}
    });
    let mut conn = connect(operator_port, tls.clone()).await?;
    let req = hyper::Request::post("/mutate/pod")
        .header("content-type", "application/json")
        .header("host", "127.0.0.1")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            serde_json::to_vec(&review).map_err(|e| e.to_string())?,
        )))
        .map_err(|e| e.to_string())?;
    let res = conn.send_request(req).await.map_err(|e| e.to_string())?;
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let answer: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    let patch = answer
        .pointer("/response/patch")
        .and_then(|p| p.as_str())
        .ok_or_else(|| format!("the operator's webhook did not patch the probe pod: {answer}"))?
        .to_string();
    let configuration: json_patch::Patch =
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &patch)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or("the operator's patch is not base64 JSON Patch")?;
    let mut check = PodKind::Without.pod("check", &configuration);
    json_patch::patch(&mut check, &configuration)
        .map_err(|e| format!("the operator's patch does not apply to a bench pod: {e}"))?;

    let ca = offload_operator::certs::CertAuthority::generate(
        "offload-bench-peer",
        Duration::from_secs(3600),
    )
    .map_err(|e| e.to_string())?;
    let serving = ca
        .issue_server(&["127.0.0.1".to_string()], Duration::from_secs(3600))
        .map_err(|e| e.to_string())?;
    let dir = cluster
        .kubeconfig
        .parent()
        .ok_or("the cluster has no directory")?
        .join("peer-webhook");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("tls.crt"), &serving.cert_pem).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("tls.key"), &serving.key_pem).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("patch"), &patch).map_err(|e| e.to_string())?;
    let port = free_port().map_err(|e| e.to_string())?;
    let child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .arg("peer-webhook")
        .arg(&dir)
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| e.to_string())?;
    let bundle = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        ca.cert.cert_pem.as_bytes(),
    );
    let hook = |name: &str, path: &str, value: &str| {
        json!({"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
               "failurePolicy": "Fail", "timeoutSeconds": 5,
               "clientConfig": {"url": format!("https://127.0.0.1:{port}/{path}"), "caBundle": bundle},
               "objectSelector": {"matchLabels": {"bench.offload.dev/peer": value}},
               "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}]})
    };
    let config: k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration =
        serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "offload-bench-peer"},
            "webhooks": [hook("noop.bench.offload.dev", "noop", "noop"),
                         hook("replay.bench.offload.dev", "replay", "replay")]
        }))
        .map_err(|e| e.to_string())?;
    Api::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>::all(
        client.clone(),
    )
    .create(&PostParams::default(), &config)
    .await
    .map_err(|e| e.to_string())?;
    // Ready when a replay pod comes back with the operator's env (the peer serves and the API
    // server has loaded the configuration).
    let mut last = String::from("no attempt");
    for i in 0..100 {
        let pod: Pod = serde_json::from_value(
            PodKind::PeerReplay.pod(&format!("peer-ready-{i}"), &configuration),
        )
        .map_err(|e| e.to_string())?;
        match podsapi.create(&PostParams::default(), &pod).await {
            Ok(p)
                if p.spec
                    .iter()
                    .flat_map(|s| &s.containers)
                    .flat_map(|c| c.env.iter().flatten())
                    .any(|e| e.name == offload_operator::names::ENV_MODE) =>
            {
                return Ok(Peer {
                    child,
                    port,
                    tls: trusting(ca.cert.cert_pem.as_bytes())?,
                    configuration,
                });
            }
            Ok(_) => last = "created without the replayed patch".into(),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("the peer webhook did not come into use: {last}"))
}

/// The peer webhook: the operator's server stack (axum, rustls, TCP_NODELAY) with a handler
/// that only reads the request uid and answers allowed, `/noop` without a patch and `/replay`
/// with a fixed one. What a webhook call costs the API server, without our work.
async fn peer_webhook(dir: PathBuf, port: u16) -> Result<(), String> {
    use axum::routing::post;
    use axum_server::accept::NoDelayAcceptor;
    use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
    let patch = Arc::new(std::fs::read_to_string(dir.join("patch")).map_err(|e| e.to_string())?);
    let config = RustlsConfig::from_pem_file(dir.join("tls.crt"), dir.join("tls.key"))
        .await
        .map_err(|e| e.to_string())?;
    let answer = |patch: Option<Arc<String>>| {
        move |body: bytes::Bytes| async move {
            let review: serde_json::Value = match serde_json::from_slice(&body) {
                Ok(r) => r,
                Err(e) => return (hyper::StatusCode::BAD_REQUEST, e.to_string()).into_response(),
            };
            let mut response = json!({
                "uid": review.pointer("/request/uid").cloned().unwrap_or_default(),
                "allowed": true
            });
            if let Some(p) = patch {
                response["patchType"] = json!("JSONPatch");
                response["patch"] = json!(*p);
            }
            axum::Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})).into_response()
        }
    };
    use axum::response::IntoResponse;
    let app = axum::Router::new()
        .route("/noop", post(answer(None)))
        .route("/replay", post(answer(Some(patch))));
    axum_server::bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .acceptor(RustlsAcceptor::new(config).acceptor(NoDelayAcceptor::new()))
        .serve(app.into_make_service())
        .await
        .map_err(|e| e.to_string())
}

fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str, default: usize| -> usize {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("start-up: tokio runtime");
    let result = match args.first().map(String::as_str) {
        Some("control-plane") => rt.block_on(control_plane(u32::try_from(flag("--runs", 3)).unwrap_or(3))),
        Some("controller") => rt.block_on(controller(flag("--jobs", 1000))),
        Some("webhook") => rt.block_on(webhook(flag("--seconds", 5) as u64, flag("--pods", 500), flag("--clients", 10), flag("--kubectl-pods", 40))),
        Some("admission") => {
            let nodes: Vec<usize> = args
                .iter()
                .position(|a| a == "--nodes")
                .and_then(|i| args.get(i + 1))
                .map(|v| v.split(',').filter_map(|n| n.parse().ok()).collect())
                .unwrap_or_else(|| vec![16, 256, 2048]);
            admission(&nodes, u32::try_from(flag("--iterations", 2000)).unwrap_or(2000))
        }
        Some("peer-webhook") => match (args.get(1), args.get(2).and_then(|p| p.parse().ok())) {
            (Some(dir), Some(port)) => rt.block_on(peer_webhook(PathBuf::from(dir), port)),
            _ => Err("usage: offload-bench peer-webhook DIR PORT".into()),
        },
        _ => Err("usage: offload-bench control-plane [--runs N] | controller [--jobs N] | webhook [--seconds S] [--pods N] [--clients N] [--kubectl-pods N] | admission [--nodes N,N,..] [--iterations N]".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
