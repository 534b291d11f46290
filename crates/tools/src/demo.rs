//! `offload-demo`: the whole story on a local cluster, in one screen.
//!
//! Starts etcd, kube-apiserver, controller-manager, scheduler, kwok and a real node (containerd,
//! runc, CNI, kubelet, kube-proxy); creates simulated GPU nodes (two GH200-class coherent, two
//! H200 discrete) whose recorded node reports the real `offload-agent` publishes (replaying the
//! recordings: there is no GPU here); installs the Helm chart as it ships, with the images built
//! by `hack/images.sh`, so the operator and the agent run as pods on the real node; applies
//! `examples/`; and prints the decisions and the configuration that reached the pods.
//!
//! `--out-of-cluster` runs the operator in this process instead (no real node, no images:
//! quicker for development). `--kueue` installs Kueue first (its controller built from its Go
//! module, its image imported into the real node, its chart), the operator with its Kueue
//! flavors, a ClusterQueue and a LocalQueue of one GPU each, and shows a queued job waiting for
//! quota with Kueue's reason, then admitted once the job before it finishes.

// Functions fit on a screen (clippy.toml has the threshold).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unwrap or expect outside tests (clippy.toml allows them there) and start-up, where each
// is allowed by name.
#![warn(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, PostParams};
use offload_api::v1alpha1::TrainingJob;
use offload_operator::operator::{self, RunOptions};
use offload_operator::webhook::tls::ManagedCerts;
use offload_operator::webhook::{CertMode, WebhookOptions};
use offload_testenv::deploy::{self, NAMESPACE};
use offload_testenv::devcluster::{ClusterOptions, DevCluster, free_port, repo_root};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The operator's whole story on a local cluster.
#[path = "demo/kueue.rs"]
mod kueue;

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Leave the cluster running (prints its KUBECONFIG) until Ctrl-C.
    #[arg(long)]
    keep: bool,
    /// Run the operator in this process instead of as pods on a real node.
    #[arg(long)]
    out_of_cluster: bool,
    /// Install Kueue first and show a queued job waiting for quota, then admitted (in cluster
    /// only).
    #[arg(long, conflicts_with = "out_of_cluster")]
    kueue: bool,
}

fn step(msg: &str) {
    eprintln!("\n\x1b[1m==> {msg}\x1b[0m");
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    deploy::run(cmd, what).map_err(|e| e.to_string())
}

/// A binary built beside this one (the workspace builds all of them into one directory).
fn sibling(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating offload-demo: {e}"))?;
    let path = exe
        .parent()
        .map(|dir| dir.join(name))
        .ok_or_else(|| format!("{} has no directory", exe.display()))?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: build every binary first (cargo build --workspace --bins; hack/demo.sh does)",
            path.display()
        ))
    }
}

async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    let mut delay = Duration::from_millis(50);
    while !check().await {
        if start.elapsed() > timeout {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
    Ok(())
}

/// The operator running in this process, for `--out-of-cluster`.
struct InProcess {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), operator::RunError>>,
}

async fn operator_out_of_cluster(
    cluster: &DevCluster,
    client: &kube::Client,
) -> Result<InProcess, String> {
    step(
        "helm install offload-operator (the operator runs in this process, webhook reached by URL)",
    );
    let webhook_port = free_port().map_err(|e| e.to_string())?;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))
        .map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .map_err(|e| e.to_string())?;
    run(
        cluster
            .helm()
            .args(["install", deploy::RELEASE])
            .arg(repo_root().join("charts/offload-operator"))
            .args([
                "--namespace",
                NAMESPACE,
                "--set",
                "operator.enabled=false",
                "--set",
                &format!("webhook.url=https://127.0.0.1:{webhook_port}"),
                "--set",
                "defaultProfile.create=false",
                "--set",
                "agent.runtimeClassName=",
                "--wait=false",
            ]),
        "helm install",
    )?;
    let shutdown = CancellationToken::new();
    let options = RunOptions {
        admin_addr: format!("127.0.0.1:{}", free_port().map_err(|e| e.to_string())?)
            .parse()
            .map_err(|e| format!("{e}"))?,
        leader_election: None,
        controller: Default::default(),
        webhook: Some(WebhookOptions {
            addr: format!("127.0.0.1:{webhook_port}")
                .parse()
                .map_err(|e| format!("{e}"))?,
            certs: CertMode::Managed(ManagedCerts::chart(NAMESPACE, vec!["127.0.0.1".into()])),
            check_interval: Duration::from_secs(3600),
        }),
        dra: Some(Default::default()),
        learned_namespace: Some(NAMESPACE.into()),
        sizer: None,
    };
    let op_client = client.clone();
    let token = shutdown.clone();
    let task = tokio::spawn(async move { operator::run(op_client, options, token).await });
    Ok(InProcess { shutdown, task })
}

async fn demo(cli: Cli) -> Result<(), String> {
    let started = Instant::now();
    let in_cluster = !cli.out_of_cluster;
    let cluster = start_cluster(in_cluster, started).await?;
    let client = cluster.client().await.map_err(|e| e.to_string())?;
    let in_process = install(&cluster, &client, in_cluster, cli.kueue).await?;
    apply_examples(&cluster).await?;
    wait_for_decisions(&cluster, &client).await?;
    show_decisions(&cluster, in_cluster)?;
    if cli.kueue {
        kueue::story(&cluster, &client).await?;
    }
    if cli.keep {
        eprintln!(
            "\nThe cluster keeps running: export KUBECONFIG={} ; Ctrl-C to stop and clean up.",
            cluster.kubeconfig.display()
        );
        eprintln!(
            "  kubectl and helm: {dir}/kubectl, {dir}/helm (export PATH={dir}:$PATH)",
            dir = cluster.bin_dir().display()
        );
        if let Some(bins) = cluster.node_bin_dir() {
            eprintln!(
                "  the real node's containerd: {}/ctr --address {} --namespace k8s.io images ls",
                bins.display(),
                cluster
                    .kubelet_dir()
                    .and_then(|k| k.parent().map(|d| d.join("containerd/containerd.sock")))
                    .unwrap_or_default()
                    .display()
            );
        }
        let _ = tokio::signal::ctrl_c().await;
    }
    if let Some(op) = in_process {
        op.shutdown.cancel();
        let _ = op.task.await;
    }
    eprintln!("\ndone in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// `kubectl` against the demo's cluster; its output, or what it said on failure.
fn kubectl(cluster: &DevCluster, args: &[&str]) -> Result<String, String> {
    run(
        cluster.kubectl().args(args),
        &format!("kubectl {}", args.join(" ")),
    )
}

/// The local cluster: with a real node for the in-cluster install, simulated nodes only else.
async fn start_cluster(in_cluster: bool, started: Instant) -> Result<DevCluster, String> {
    let options = if in_cluster {
        step(
            "starting the local cluster: etcd, kube-apiserver, controller-manager, scheduler, kwok, and a real node (containerd, runc, CNI, kubelet, kube-proxy)",
        );
        ClusterOptions::with_real_node()
    } else {
        step(
            "starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)",
        );
        ClusterOptions::full()
    };
    let cluster = DevCluster::start(options)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!(
        "ready in {:.1} s; KUBECONFIG={}",
        started.elapsed().as_secs_f64(),
        cluster.kubeconfig.display()
    );
    Ok(cluster)
}

/// The simulated GPU nodes, then the operator: installed with its chart (in cluster) or run in
/// this process.
async fn install(
    cluster: &DevCluster,
    client: &kube::Client,
    in_cluster: bool,
    kueue: bool,
) -> Result<Option<InProcess>, String> {
    step(
        "simulated GPU nodes gh200-0, gh200-1 (coherent) and h200-0, h200-1, h200-2 (discrete); offload-agent publishes each one's recorded report (no GPU here)",
    );
    deploy::add_simulated_gpu_nodes(
        cluster,
        client,
        &sibling("offload-agent")?,
        &[
            ("gh200-0", "node-report-gh200.json"),
            ("gh200-1", "node-report-gh200.json"),
            ("h200-0", "node-report-h200.json"),
            ("h200-1", "node-report-h200.json"),
            ("h200-2", "node-report-h200.json"),
        ],
    )
    .await
    .map_err(|e| e.to_string())?;

    Ok(if in_cluster {
        step(
            "helm install offload-operator: the chart as it ships, with the images built here (operator and agent run as pods on the real node)",
        );
        deploy::prepare_real_node(client)
            .await
            .map_err(|e| e.to_string())?;
        // The sizer's pods run beside everything else on this one machine: small, and bounded
        // in time (the examples' images are not pulled here, so the counted model decides).
        let mut values = vec![
            "--set".to_string(),
            "defaultProfile.create=false".to_string(),
            "--set".to_string(),
            "sizer.cpu=100m".to_string(),
            "--set".to_string(),
            "sizer.memory=512Mi".to_string(),
            "--set".to_string(),
            "sizer.timeout=60s".to_string(),
        ];
        if kueue {
            step(
                "helm install kueue (its controller built from the sigs.k8s.io/kueue module, its image imported into the real node's containerd)",
            );
            let took = deploy::install_kueue(cluster).map_err(|e| e.to_string())?;
            eprintln!("Kueue's controller ready in {:.1} s", took.as_secs_f64());
            values.extend([
                "--set".to_string(),
                "kueue.resourceFlavors.enabled=true".to_string(),
            ]);
        }
        let took = deploy::helm_install(cluster, &values).map_err(|e| e.to_string())?;
        eprintln!("every pod ready in {:.1} s", took.as_secs_f64());
        None
    } else {
        Some(operator_out_of_cluster(cluster, client).await?)
    })
}

/// `kubectl apply -f examples/`, once the webhook answers (it guards profiles and jobs with
/// failurePolicy Fail).
async fn apply_examples(cluster: &DevCluster) -> Result<(), String> {
    step("kubectl apply -f examples/");
    let examples = repo_root().join("examples");
    let examples = examples.to_string_lossy().into_owned();
    // The webhook guards profiles and jobs (failurePolicy Fail): apply once it answers.
    let mut last = String::new();
    wait_for(
        "the webhook to admit examples/",
        Duration::from_secs(60),
        || {
            let r = kubectl(cluster, &["apply", "-f", &examples]);
            let ok = r.is_ok();
            if let Err(e) = r {
                last = e;
            }
            async move { ok }
        },
    )
    .await
    .map_err(|e| format!("{e}: {last}"))
}

/// Waits until every example job has its workload, the profiles count nodes and jobs, and the
/// pods are placed.
async fn wait_for_decisions(cluster: &DevCluster, client: &kube::Client) -> Result<(), String> {
    wait_for_workloads(client).await?;
    wait_for_profile_counts(cluster).await?;
    wait_for(
        "pods of every job to be placed",
        Duration::from_secs(60),
        || async {
            kubectl(
                cluster,
                &[
                    "get",
                    "pods",
                    "-n",
                    "default",
                    "-l",
                    "offload.dev/training-job",
                    "-o",
                    "jsonpath={.items[*].spec.nodeName}",
                ],
            )
            .is_ok_and(|s| s.split_whitespace().count() >= 5)
        },
    )
    .await?;

    Ok(())
}

/// Waits until every example TrainingJob has created its workload.
async fn wait_for_workloads(client: &kube::Client) -> Result<(), String> {
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), "default");
    wait_for(
        "every TrainingJob to create its workload",
        Duration::from_secs(90),
        || {
            let jobs = jobs.clone();
            async move {
                jobs.list(&ListParams::default()).await.is_ok_and(|l| {
                    !l.items.is_empty()
                        && l.items.iter().all(|j| {
                            j.status.as_ref().is_some_and(|s| {
                                s.conditions
                                    .iter()
                                    .any(|c| c.type_ == "WorkloadCreated" && c.status == "True")
                            })
                        })
                })
            }
        },
    )
    .await
}

/// Waits until the profiles' status counts the nodes and the jobs decided with each.
async fn wait_for_profile_counts(cluster: &DevCluster) -> Result<(), String> {
    wait_for(
        "profile status to count the nodes",
        Duration::from_secs(30),
        || async {
            kubectl(
                cluster,
                &[
                    "get",
                    "offloadprofile",
                    "default",
                    "-o",
                    "jsonpath={.status.nodes.total}",
                ],
            )
            .is_ok_and(|s| s.trim() == "5")
        },
    )
    .await?;
    wait_for(
        "profile status to count the jobs decided with it",
        Duration::from_secs(30),
        || async {
            kubectl(
                cluster,
                &[
                    "get",
                    "offloadprofiles",
                    "-o",
                    "jsonpath={.items[*].status.jobs}",
                ],
            )
            .is_ok_and(|s| {
                let counts: Vec<&str> = s.split_whitespace().collect();
                counts.len() == 2 && counts.iter().all(|c| *c != "0")
            })
        },
    )
    .await?;
    Ok(())
}

/// What a newcomer reads: the nodes' labels, the profiles and jobs, each example job's reasons,
/// env, affinity and node, and the merged DeepSpeed config.
fn show_decisions(cluster: &DevCluster, in_cluster: bool) -> Result<(), String> {
    let kubectl = |args: &[&str]| kubectl(cluster, args);
    println!(
        "\n$ kubectl get nodes -L offload.dev/uma,offload.dev/addressing-mode,offload.dev/c2c,offload.dev/overlap"
    );
    print!(
        "{}",
        kubectl(&[
            "get",
            "nodes",
            "-L",
            "offload.dev/uma,offload.dev/addressing-mode,offload.dev/c2c,offload.dev/overlap"
        ])?
    );
    if in_cluster {
        println!(
            "\n$ kubectl get pods -n {NAMESPACE} -o wide   (the operator and agent, from images built here)"
        );
        print!(
            "{}",
            kubectl(&[
                "get",
                "pods",
                "-n",
                NAMESPACE,
                "-o",
                "custom-columns=NAME:.metadata.name,READY:.status.containerStatuses[0].ready,STATUS:.status.phase,NODE:.spec.nodeName,IMAGE:.spec.containers[0].image"
            ])?
        );
    }
    println!("\n$ kubectl get offloadprofiles");
    print!("{}", kubectl(&["get", "offloadprofiles"])?);
    println!("\n$ kubectl get trainingjobs -A");
    print!("{}", kubectl(&["get", "trainingjobs", "-A"])?);
    for job in [
        "llama-8b-deepspeed",
        "neox-20b-deepspeed",
        "mistral-7b-fsdp",
        "gpt-20b-megatron",
    ] {
        show_job(cluster, job)?;
    }
    if kubectl(&["get", "configmap", "-o", "name"])?.contains("neox-20b-deepspeed-offload") {
        println!(
            "\n$ kubectl get configmap neox-20b-deepspeed-offload -o jsonpath='{{.data.ds_config\\.json}}' | jq   (merged DeepSpeed config)"
        );
        let text = kubectl(&[
            "get",
            "configmap",
            "neox-20b-deepspeed-offload",
            "-o",
            "jsonpath={.data.ds_config\\.json}",
        ])?;
        let pretty = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or(text);
        println!("{pretty}");
    }
    Ok(())
}

/// One example job: why it was decided so, and what its first pod got.
fn show_job(cluster: &DevCluster, job: &str) -> Result<(), String> {
    let kubectl = |args: &[&str]| kubectl(cluster, args);
    println!("\n$ kubectl get trainingjob {job} -o jsonpath='{{.status.offload.reasons}}'  (why)");
    let reasons = kubectl(&[
        "get",
        "trainingjob",
        job,
        "-o",
        "jsonpath={range .status.offload.reasons[*]}{.field} {.code}: {.message}{\"\\n\"}{end}",
    ])?;
    for line in reasons.lines() {
        println!("  {line}");
    }
    let pod = kubectl(&[
        "get",
        "pods",
        "-l",
        &format!("offload.dev/training-job={job}"),
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ])?;
    println!("\n$ kubectl get pod {pod}   (env, affinity, node)");
    let env = kubectl(&[
        "get",
        "pod",
        &pod,
        "-o",
        "jsonpath={range .spec.containers[0].env[*]}{.name}={.value}{\"\\n\"}{end}",
    ])?;
    for line in env
        .lines()
        .filter(|l| l.starts_with("OFFLOAD_") || l.starts_with("FSDP_"))
    {
        println!("  env {line}");
    }
    let aff = kubectl(&[
        "get",
        "pod",
        &pod,
        "-o",
        "jsonpath={range .spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[*]}{.key} {.operator} {.values}{\"\\n\"}{end}",
    ])?;
    for line in aff.lines() {
        println!("  affinity {line}");
    }
    let node = kubectl(&["get", "pod", &pod, "-o", "jsonpath={.spec.nodeName}"])?;
    if node.trim().is_empty() {
        println!("  node (none yet: the GPUs of its class are still taken)");
    } else {
        println!("  node {node}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    #[allow(clippy::expect_used)] // start-up
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("start-up: tokio runtime");
    match rt.block_on(demo(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
