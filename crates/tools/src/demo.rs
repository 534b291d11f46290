//! `offload-demo`: the whole story on a local control plane, in one screen.
//!
//! Starts etcd, kube-apiserver, controller-manager, scheduler and kwok; creates simulated GPU
//! nodes (two GH200-class coherent, two H200 discrete) and publishes their recorded node
//! reports with the real `offload-agent` (replaying the recordings: there is no GPU here);
//! installs the Helm chart with values for an operator running outside the cluster; runs the
//! operator (controller + webhook) in this process; applies `examples/`; and prints the
//! decisions and the configuration that reached the pods.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, ListParams, PostParams};
use offload_operator::api::TrainingJob;
use offload_operator::operator::{self, RunOptions};
use offload_operator::webhook::tls::ManagedCerts;
use offload_operator::webhook::{CertMode, WebhookOptions};
use offload_testenv::devcluster::{ClusterOptions, DevCluster, free_port, repo_root};
use offload_testenv::fixtures;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NS: &str = "offload-system";

fn root() -> PathBuf {
    repo_root()
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

fn step(msg: &str) {
    eprintln!("\n\x1b[1m==> {msg}\x1b[0m");
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn gpu_node(name: &str) -> Result<Node, String> {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", "nvidia.com/gpu.present": "true"}
        },
        "status": {
            "allocatable": {"cpu": "72", "memory": "480Gi", "pods": "110", "nvidia.com/gpu": "1"},
            "capacity": {"cpu": "72", "memory": "480Gi", "pods": "110", "nvidia.com/gpu": "1"}
        }
    }))
    .map_err(|e| e.to_string())
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

async fn demo(keep: bool) -> Result<(), String> {
    let started = Instant::now();
    step(
        "starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)",
    );
    let cluster = DevCluster::start(ClusterOptions::full())
        .await
        .map_err(|e| e.to_string())?;
    eprintln!(
        "API server {} ready in {:.1} s; KUBECONFIG={}",
        cluster.server,
        started.elapsed().as_secs_f64(),
        cluster.kubeconfig.display()
    );
    let client = cluster.client().await.map_err(|e| e.to_string())?;
    let kubectl = |args: &[&str]| {
        run(
            cluster.kubectl().args(args),
            &format!("kubectl {}", args.join(" ")),
        )
    };

    step("simulated GPU nodes: gh200-0, gh200-1 (coherent), h200-0, h200-1 (discrete)");
    let nodes: Api<Node> = Api::all(client.clone());
    for name in ["gh200-0", "gh200-1", "h200-0", "h200-1"] {
        nodes
            .create(&PostParams::default(), &gpu_node(name)?)
            .await
            .map_err(|e| format!("creating node {name}: {e}"))?;
    }

    step("offload-agent publishes each node's report (replaying recorded readings: no GPU here)");
    let agent = sibling("offload-agent")?;
    for (name, fixture) in [
        ("gh200-0", "node-report-gh200.json"),
        ("gh200-1", "node-report-gh200.json"),
        ("h200-0", "node-report-h200.json"),
        ("h200-1", "node-report-h200.json"),
    ] {
        let port = free_port().map_err(|e| e.to_string())?;
        run(
            Command::new(&agent)
                .env("KUBECONFIG", &cluster.kubeconfig)
                .env("RUST_LOG", "warn")
                .args([
                    "run",
                    "--once",
                    "--node-name",
                    name,
                    "--addr",
                    &format!("127.0.0.1:{port}"),
                ])
                .arg("--replay")
                .arg(fixtures::path(fixture)),
            &format!("offload-agent on {name}"),
        )?;
    }

    step(
        "helm install offload-operator (operator runs outside the cluster, webhook reached by URL)",
    );
    let webhook_port = free_port().map_err(|e| e.to_string())?;
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NS}})).map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .map_err(|e| e.to_string())?;
    let chart = root().join("charts/offload-operator");
    run(
        cluster
            .helm()
            .args(["install", "offload-operator"])
            .arg(&chart)
            .args([
                "--namespace",
                NS,
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

    step("running the operator (controller + webhook) in this process");
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
            certs: CertMode::Managed(ManagedCerts::chart(NS, vec!["127.0.0.1".into()])),
            check_interval: Duration::from_secs(3600),
        }),
    };
    let op_client = client.clone();
    let op_token = shutdown.clone();
    let op = tokio::spawn(async move { operator::run(op_client, options, op_token).await });

    step("kubectl apply -f examples/");
    let examples = root().join("examples");
    let examples = examples.to_string_lossy().into_owned();
    // The webhook guards profiles and jobs (failurePolicy Fail): apply once it answers.
    let mut last = String::new();
    wait_for(
        "the webhook to admit examples/",
        Duration::from_secs(60),
        || {
            let r = kubectl(&["apply", "-f", &examples]);
            let ok = r.is_ok();
            if let Err(e) = r {
                last = e;
            }
            async move { ok }
        },
    )
    .await
    .map_err(|e| format!("{e}: {last}"))?;

    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), "default");
    wait_for(
        "both TrainingJobs to create their workloads",
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
    .await?;
    wait_for(
        "profile status to count the nodes",
        Duration::from_secs(30),
        || async {
            kubectl(&[
                "get",
                "offloadprofile",
                "default",
                "-o",
                "jsonpath={.status.nodes.total}",
            ])
            .is_ok_and(|s| s.trim() == "4")
        },
    )
    .await?;
    wait_for(
        "pods of both jobs to be placed",
        Duration::from_secs(60),
        || async {
            kubectl(&[
                "get",
                "pods",
                "-n",
                "default",
                "-l",
                "offload.dev/training-job",
                "-o",
                "jsonpath={.items[*].spec.nodeName}",
            ])
            .is_ok_and(|s| s.split_whitespace().count() >= 3)
        },
    )
    .await?;

    println!(
        "\n$ kubectl get nodes -L offload.dev/uma,offload.dev/addressing-mode,offload.dev/c2c,offload.dev/overlap"
    );
    print!(
        "{}",
        kubectl(&[
            "get",
            "nodes",
            "-l",
            "nvidia.com/gpu.present",
            "-L",
            "offload.dev/uma,offload.dev/addressing-mode,offload.dev/c2c,offload.dev/overlap"
        ])?
    );
    println!("\n$ kubectl get offloadprofiles");
    print!("{}", kubectl(&["get", "offloadprofiles"])?);
    println!("\n$ kubectl get trainingjobs -A");
    print!("{}", kubectl(&["get", "trainingjobs", "-A"])?);
    for job in ["llama-8b-deepspeed", "mistral-7b-fsdp"] {
        println!(
            "\n$ kubectl get trainingjob {job} -o jsonpath='{{.status.offload.reasons}}'  (why)"
        );
        let reasons = kubectl(&[
            "get",
            "trainingjob",
            job,
            "-o",
            "jsonpath={range .status.offload.reasons[*]}{.field}: {.message}{\"\\n\"}{end}",
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
        println!(
            "  node {}",
            kubectl(&["get", "pod", &pod, "-o", "jsonpath={.spec.nodeName}"])?
        );
    }
    if job_has_config(&kubectl)? {
        println!(
            "\n$ kubectl get configmap llama-8b-deepspeed-offload -o jsonpath='{{.data.ds_config\\.json}}'  (merged DeepSpeed config)"
        );
        println!(
            "{}",
            kubectl(&[
                "get",
                "configmap",
                "llama-8b-deepspeed-offload",
                "-o",
                "jsonpath={.data.ds_config\\.json}"
            ])?
        );
    }

    if keep {
        eprintln!(
            "\nThe cluster keeps running: export KUBECONFIG={} ; Ctrl-C to stop and clean up.",
            cluster.kubeconfig.display()
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    shutdown.cancel();
    let _ = op.await;
    eprintln!("\ndone in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn job_has_config(kubectl: &dyn Fn(&[&str]) -> Result<String, String>) -> Result<bool, String> {
    Ok(kubectl(&["get", "configmap", "-o", "name"])?.contains("llama-8b-deepspeed-offload"))
}

fn main() -> ExitCode {
    let keep = std::env::args().any(|a| a == "--keep");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("start-up: tokio runtime");
    match rt.block_on(demo(keep)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
