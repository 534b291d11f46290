//! `offload-bench`: benchmarks that print figures (never pass/fail).
//!
//! - `control-plane`: start-up time to ready of the local control plane and each process's memory;
//! - `controller --jobs N`: N TrainingJobs created in a burst against the local control plane,
//!   time from creation to workload (p50/p99), the operator's CPU time and peak RSS (the release
//!   `offload-operator` binary, run as its own process);
//! - `webhook`: pod mutation over TLS on loopback at increasing concurrency (throughput,
//!   p50/p99/p99.9), and real pod creation through the API server with and without the webhook,
//!   side by side.

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

fn spawn_operator(cluster: &DevCluster, webhook_port: Option<u16>) -> Result<Child, String> {
    let bin = root().join("target/release/offload-operator");
    if !bin.exists() {
        return Err("build the release binaries first: cargo build --release --bins".into());
    }
    let mut cmd = Command::new(bin);
    cmd.env("KUBECONFIG", &cluster.kubeconfig)
        .env("RUST_LOG", "warn")
        .args([
            "run",
            "--admin-addr",
            &format!("127.0.0.1:{}", free_port().map_err(|e| e.to_string())?),
        ])
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
    cmd.spawn().map_err(|e| e.to_string())
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
    let mut op = spawn_operator(&cluster, None)?;
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
                    let req = hyper::Request::post("/mutate/pod")
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

async fn webhook(seconds: u64, pods: usize, clients: usize) -> Result<(), String> {
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
    let mut op = spawn_operator(&cluster, Some(port))?;
    // The CA the operator generated, to trust the webhook.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "offload-system");
    let mut ca = None;
    for _ in 0..100 {
        if let Ok(Some(s)) = secrets.get_opt("offload-operator-webhook-tls").await {
            ca = s.data.and_then(|d| d.get("ca.crt").map(|b| b.0.clone()));
            if ca.is_some() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ca = ca.ok_or("the operator did not write its CA")?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(&ca) {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let tls = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    // Wait until the webhook serves with its caches filled (a mutation comes back with a patch).
    for _ in 0..100 {
        if let Ok((n, _)) = webhook_load(port, tls.clone(), 1, Duration::from_millis(50)).await
            && n > 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let op_pid = op.id();
    println!(
        "\npod mutation over TLS on loopback ({seconds} s per level, keep-alive connections):"
    );
    println!("| concurrency | mutations/s | p50 ms | p99 ms | p99.9 ms | operator CPU % |");
    println!("|---|---|---|---|---|---|");
    for c in [1usize, 2, 4, 8, 16, 32, 64] {
        let cpu0 = cpu_seconds(op_pid).unwrap_or(0.0);
        let t = Instant::now();
        let (n, lat) = webhook_load(port, tls.clone(), c, Duration::from_secs(seconds)).await?;
        let wall = t.elapsed().as_secs_f64();
        let cpu = cpu_seconds(op_pid).unwrap_or(0.0) - cpu0;
        let (_, p50, p99, p999, _) = summary(lat);
        #[allow(clippy::cast_precision_loss)]
        let rate = n as f64 / wall;
        println!(
            "| {c} | {rate:.0} | {p50:.3} | {p99:.3} | {p999:.3} | {:.0} |",
            cpu / wall * 100.0
        );
    }

    // Real pod creation through the API server: unlabelled pods (not sent to the webhook) and
    // labelled pods (mutated), interleaved in rounds so both see the same conditions.
    let bench_ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "bench"}}))
            .map_err(|e| e.to_string())?;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &bench_ns)
        .await;
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}}))
            .map_err(|e| e.to_string())?;
    let _ = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), "bench")
        .create(&PostParams::default(), &sa)
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let podsapi: Api<Pod> = Api::namespaced(client.clone(), "bench");
    let mut without = Vec::new();
    let mut with = Vec::new();
    let rounds = 10;
    for round in 0..rounds {
        for labelled in [false, true] {
            let lat: Vec<f64> = futures::stream::iter(0..pods / rounds)
                .map(|i| {
                    let podsapi = podsapi.clone();
                    async move {
                        let labels = if labelled { json!({"offload.dev/profile": "auto"}) } else { json!({}) };
                        let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": format!("{}-{round}-{i}", if labelled { "with" } else { "without" }), "labels": labels},
                            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
                        .ok()?;
                        let t = Instant::now();
                        podsapi.create(&PostParams::default(), &pod).await.ok()?;
                        Some(t.elapsed().as_secs_f64() * 1e3)
                    }
                })
                .buffer_unordered(clients)
                .filter_map(|x| async move { x })
                .collect()
                .await;
            if labelled {
                with.extend(lat)
            } else {
                without.extend(lat)
            }
        }
    }
    let (m0, p50_0, p99_0, _, _) = summary(without.clone());
    let (m1, p50_1, p99_1, _, _) = summary(with.clone());
    println!(
        "\nreal pod creation through kube-apiserver, {clients} concurrent clients, {pods} pods each way:"
    );
    println!("| pods | created | mean ms | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    println!(
        "| without the webhook (unlabelled) | {} | {m0:.2} | {p50_0:.2} | {p99_0:.2} |",
        without.len()
    );
    println!(
        "| with the webhook (labelled, mutated) | {} | {m1:.2} | {p50_1:.2} | {p99_1:.2} |",
        with.len()
    );
    println!(
        "added: mean {:+.2} ms ({:+.1} %), p50 {:+.2} ms ({:+.1} %)",
        m1 - m0,
        (m1 / m0 - 1.0) * 100.0,
        p50_1 - p50_0,
        (p50_1 / p50_0 - 1.0) * 100.0
    );
    // Connections the API server opened to the webhook (closed ones linger in TIME-WAIT).
    if let Ok(out) = Command::new("ss")
        .args([
            "-tan",
            "state",
            "time-wait",
            &format!("( sport = :{port} or dport = :{port} )"),
        ])
        .output()
    {
        println!(
            "closed connections to the webhook port (TIME-WAIT): {}",
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .count()
                .saturating_sub(1)
        );
    }
    // The API server's own view of the webhook call (round trip as it measures it).
    if let Ok(out) = cluster
        .kubectl()
        .args(["get", "--raw", "/metrics"])
        .output()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        let metric = |name: &str| -> Option<f64> {
            text.lines()
                .filter(|l| l.starts_with(name) && l.contains("pods.mutate.offload.dev"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .next()
        };
        if let (Some(sum), Some(count)) = (
            metric("apiserver_admission_webhook_admission_duration_seconds_sum"),
            metric("apiserver_admission_webhook_admission_duration_seconds_count"),
        ) {
            println!(
                "kube-apiserver's own measure of the webhook call: {count:.0} calls, mean {:.2} ms",
                sum / count * 1e3
            );
        }
    }
    let _ = op.kill();
    let _ = op.wait();
    Ok(())
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
        Some("webhook") => rt.block_on(webhook(flag("--seconds", 5) as u64, flag("--pods", 500), flag("--clients", 10))),
        _ => Err("usage: offload-bench control-plane [--runs N] | controller [--jobs N] | webhook [--seconds S] [--pods N] [--clients N]".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
