//! The Helm chart against the real control plane: lint, server-side validation of the rendered
//! manifests, install → the whole flow → uninstall leaving nothing behind, and the policy that
//! confines the agent to its own node.

use offload_testenv::support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, PostParams};
use offload_api::names;
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};
use offload_operator::operator::{self, RunOptions};
use offload_operator::webhook::tls::ManagedCerts;
use offload_operator::webhook::{CertMode, WebhookOptions};
use offload_testenv::devcluster::{ClusterOptions, DevCluster, free_port};
use serde_json::json;
use support::*;

const OPTIONS: ClusterOptions = ClusterOptions {
    controller_manager: true,
    scheduler: true,
    kwok: true,
    real_node: false,
};
const NS: &str = "offload-system";
const WAIT: Duration = Duration::from_secs(90);

fn chart() -> String {
    format!("{}/charts/offload-operator", env!("CARGO_MANIFEST_DIR"))
}

fn agent_binary() -> PathBuf {
    workspace_binary("offload-agent")
}

fn output(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn gpu_node(name: &str) -> Node {
    kwok_node(name, &[("nvidia.com/gpu.present", "true")], &[])
}

fn publish_with_agent(cluster: &DevCluster, node: &str, fixture: &str) {
    output(
        Command::new(agent_binary())
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env("RUST_LOG", "warn")
            .args([
                "run",
                "--once",
                "--node-name",
                node,
                "--addr",
                &format!("127.0.0.1:{}", free_port().unwrap()),
            ])
            .arg("--replay")
            .arg(offload_testenv::fixtures::path(fixture)),
        &format!("offload-agent on {node}"),
    );
}

/// One test, in order: cluster-scoped objects of the chart (webhook configurations, cluster
/// roles) would collide between tests running at once.
#[tokio::test]
async fn the_chart_lints_validates_installs_runs_and_uninstalls_cleanly() {
    lint_and_server_side_validation_of_the_rendered_chart().await;
    install_run_the_whole_flow_and_uninstall_leaving_nothing_behind().await;
}

async fn lint_and_server_side_validation_of_the_rendered_chart() {
    let cluster = cluster(OPTIONS);
    let lint = output(
        cluster.helm().args(["lint", "--strict", &chart()]),
        "helm lint",
    );
    assert!(lint.contains("0 chart(s) failed"), "{lint}");
    let client = client(cluster).await;
    apply_crds(&client).await;
    let ns = namespace(&client, "render").await;
    for values in [
        vec![],
        vec![
            "--set",
            "webhook.url=https://127.0.0.1:9443",
            "--set",
            "operator.enabled=false",
        ],
        vec!["--set", "networkPolicy.enabled=true"],
        vec!["--set", "metrics.grafanaDashboard.enabled=true"],
        vec![
            "--set",
            "agent.observe.enabled=false",
            "--set",
            "agent.extraArgs={--observe-trace=/recorded/trace.json}",
            "--set-json",
            r#"agent.extraVolumes=[{"name":"recorded","configMap":{"name":"recorded"}}]"#,
            "--set-json",
            r#"agent.extraVolumeMounts=[{"name":"recorded","mountPath":"/recorded"}]"#,
        ],
    ] {
        let rendered = output(
            cluster
                .helm()
                .args([
                    "template",
                    "t",
                    &chart(),
                    "--skip-tests",
                    "--namespace",
                    &ns,
                ])
                .args(&values),
            "helm template",
        );
        let (ok, out, err) = kubectl_result(
            cluster,
            &["apply", "--dry-run=server", "-n", &ns, "-f", "-"],
            Some(&rendered),
        );
        assert!(
            ok,
            "server-side dry-run of the chart ({values:?}) failed:\n{err}\n{out}"
        );
    }
    // Values the schema rejects.
    let bad = cluster
        .helm()
        .args([
            "template",
            "t",
            &chart(),
            "--set",
            "agent.overlapThreshold=2",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("overlapThreshold"));
    kueue_flavors_render_with_the_class_labels(cluster);
    the_dra_driver_reaches_operator_and_agent(cluster);
    monitoring_renders_the_alerts_and_the_dashboard(cluster);
}

/// The PrometheusRule carries exactly the rule groups of `files/alerts.yaml` (what promtool
/// checks and tests), the dashboard's ConfigMap exactly `files/dashboard.json`, and the agents
/// get a PodMonitor beside the operator's ServiceMonitor; none of it by default.
fn monitoring_renders_the_alerts_and_the_dashboard(cluster: &DevCluster) {
    let render = |extra: &[&str]| {
        serde_saphyr::from_multiple::<serde_json::Value>(&rendered(cluster, extra))
            .unwrap()
            .into_iter()
            .filter(|d| !d.is_null())
            .map(|d| {
                let key = format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap()
                );
                (key, d)
            })
            .collect::<BTreeMap<String, serde_json::Value>>()
    };
    let default = render(&[]);
    assert!(
        !default.keys().any(|k| k.starts_with("PrometheusRule/")
            || k.starts_with("PodMonitor/")
            || k == "ConfigMap/offload-operator-dashboard"),
        "{:?}",
        default.keys()
    );
    let on = render(&[
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.prometheusRule.labels.release=kps",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.grafanaDashboard.enabled=true",
    ]);
    let files = std::path::Path::new(&chart()).join("files");
    let alerts: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(files.join("alerts.yaml")).unwrap())
            .unwrap();
    let rule = &on["PrometheusRule/offload-operator"];
    assert_eq!(rule["spec"], alerts);
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(files.join("dashboard.json")).unwrap())
            .unwrap();
    let shipped = &on["ConfigMap/offload-operator-dashboard"];
    assert_eq!(shipped["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: serde_json::Value =
        serde_json::from_str(shipped["data"]["offload-operator.json"].as_str().unwrap()).unwrap();
    assert_eq!(shipped, dashboard);
    assert!(
        on.contains_key("PodMonitor/offload-agent"),
        "{:?}",
        on.keys()
    );
    assert!(
        on.contains_key("ServiceMonitor/offload-operator"),
        "{:?}",
        on.keys()
    );
}

/// The chart as `helm template` renders it with `extra` (the test fails where it does not).
fn rendered(cluster: &DevCluster, extra: &[&str]) -> String {
    let out = cluster
        .helm()
        .args(["template", "t", &chart(), "--skip-tests"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `dra.driver` reaches both the operator (whose slices it watches) and the agent (whose
/// pods' DRA devices it counts as GPUs); `dra.enabled=false` leaves both without one.
fn the_dra_driver_reaches_operator_and_agent(cluster: &DevCluster) {
    let args = |extra: &[&str]| -> Vec<String> {
        rendered(cluster, extra)
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- --dra-driver"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(args(&[]), ["=gpu.nvidia.com", "=gpu.nvidia.com"]);
    assert_eq!(
        args(&["--set", "dra.driver=gpu.example.com"]),
        ["=gpu.example.com", "=gpu.example.com"]
    );
    assert_eq!(args(&["--set", "dra.enabled=false"]), ["=", "="]);
}

/// The optional Kueue flavors: off by default; on, one per class with the labels the operator
/// pins that class with, plus a pool's; names and label counts checked by the schema.
fn kueue_flavors_render_with_the_class_labels(cluster: &DevCluster) {
    let render = |extra: &[&str]| {
        cluster
            .helm()
            .args(["template", "t", &chart(), "--skip-tests"])
            .args(extra)
            .output()
            .unwrap()
    };
    let default = render(&[]);
    assert!(!String::from_utf8_lossy(&default.stdout).contains("ResourceFlavor"));
    let on = render(&[
        "--show-only",
        "templates/kueue-flavors.yaml",
        "--set",
        "kueue.resourceFlavors.enabled=true",
        "--set",
        "kueue.resourceFlavors.coherent.nodeLabels.pool=gh200-a",
    ]);
    assert!(
        on.status.success(),
        "{}",
        String::from_utf8_lossy(&on.stderr)
    );
    let flavors: BTreeMap<String, serde_json::Value> =
        serde_saphyr::from_multiple::<serde_json::Value>(&String::from_utf8_lossy(&on.stdout))
            .unwrap()
            .into_iter()
            .filter(|d| !d.is_null())
            .map(|d| (d["metadata"]["name"].as_str().unwrap().to_string(), d))
            .collect();
    assert_eq!(flavors.len(), 2, "{flavors:?}");
    assert_eq!(
        flavors["offload-coherent"]["spec"]["nodeLabels"],
        json!({"offload.dev/uma": "true", "offload.dev/addressing-mode": "ats",
               "offload.dev/c2c": "true", "pool": "gh200-a"})
    );
    assert_eq!(
        flavors["offload-discrete"]["spec"]["nodeLabels"],
        json!({"offload.dev/uma": "false"})
    );
    for bad in [
        "kueue.resourceFlavors.coherent.name=Not_A_Name",
        "kueue.resourceFlavors.discrete.nodeLabels.a=1",
        "kueue.resourceFlavors.typo=true",
    ] {
        let out = render(&["--set", "kueue.resourceFlavors.enabled=true", "--set", bad]);
        assert!(!out.status.success(), "{bad} accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("kueue"),
            "{bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let six = render(&[
        "--set",
        "kueue.resourceFlavors.enabled=true",
        "--set-json",
        r#"kueue.resourceFlavors.discrete.nodeLabels={"a":"1","b":"1","c":"1","d":"1","e":"1","f":"1"}"#,
    ]);
    assert!(!six.status.success(), "six extra labels accepted");
}

async fn install_run_the_whole_flow_and_uninstall_leaving_nothing_behind() {
    let cluster = cluster(OPTIONS);
    let client = client(cluster).await;
    let port = install_with_agents_on_three_gpu_nodes(cluster, &client).await;
    // The operator, outside the cluster as the chart's values say.
    let shutdown = tokio_util::sync::CancellationToken::new();
    let op = tokio::spawn(operator::run(
        client.clone(),
        RunOptions {
            webhook: Some(WebhookOptions {
                addr: format!("127.0.0.1:{port}").parse().unwrap(),
                certs: CertMode::Managed(ManagedCerts::chart(NS, vec!["127.0.0.1".into()])),
                check_interval: Duration::from_secs(3600),
            }),
            ..operator_options()
        },
        shutdown.clone(),
    ));
    a_job_runs_on_the_coherent_nodes(cluster, &client).await;
    the_agent_may_only_touch_offload_keys_on_its_own_node(cluster, &client).await;
    shutdown.cancel();
    op.await.unwrap().unwrap();
    uninstall_leaves_nothing(cluster, &client).await;
}

/// Three simulated GPU nodes with their agents' reports, and the chart installed with its
/// webhook pointed at a local port (returned) and no operator pod; the agent DaemonSet lands on
/// the GPU nodes (kwok simulates its pods).
async fn install_with_agents_on_three_gpu_nodes(
    cluster: &DevCluster,
    client: &kube::Client,
) -> u16 {
    let nodes: Api<Node> = Api::all(client.clone());
    for name in ["chart-gh200-0", "chart-gh200-1", "chart-h200-0"] {
        nodes
            .create(&PostParams::default(), &gpu_node(name))
            .await
            .unwrap();
    }
    publish_with_agent(cluster, "chart-gh200-0", "node-report-gh200.json");
    publish_with_agent(cluster, "chart-gh200-1", "node-report-gh200.json");
    publish_with_agent(cluster, "chart-h200-0", "node-report-h200.json");

    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
    let port = free_port().unwrap();
    output(
        cluster
            .helm()
            .args([
                "install",
                "offload-operator",
                &chart(),
                "--namespace",
                NS,
                "--set",
                "operator.enabled=false",
                "--set",
                "agent.runtimeClassName=",
            ])
            .args(["--set", &format!("webhook.url=https://127.0.0.1:{port}")]),
        "helm install",
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    wait_list(
        pods.clone(),
        kube::runtime::watcher::Config::default().labels("app.kubernetes.io/component=agent"),
        "agent pods on the 3 GPU nodes",
        WAIT,
        |pods| {
            (pods
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
                .count()
                == 3)
                .then_some(())
        },
    )
    .await;

    port
}

/// The chart's default profile filled from real status; a TrainingJob admitted, given its
/// workload, its pods placed on the coherent nodes; the profile counting nodes and jobs.
async fn a_job_runs_on_the_coherent_nodes(cluster: &DevCluster, client: &kube::Client) {
    // The chart's default profile, filled from real status.
    let profiles: Api<OffloadProfile> = Api::all(client.clone());
    wait(
        "the default profile to count the 3 nodes",
        WAIT,
        kube::runtime::wait::await_condition(
            profiles.clone(),
            "default",
            |p: Option<&OffloadProfile>| {
                p.and_then(|p| p.status.as_ref())
                    .is_some_and(|s| s.nodes.total >= 3 && s.nodes.coherent >= 2)
            },
        ),
    )
    .await
    .unwrap();

    let job_ns = namespace(client, "e2e").await;
    let tj: TrainingJob = serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "e2e", "annotations": {names::PROFILE_ANNOTATION: "auto"}},
        "spec": {"replicas": 2, "framework": {"name": "DeepSpeed", "version": "0.19.8"},
                 "template": {"spec": {"containers": [{"name": "t", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    }))
    .unwrap();
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &job_ns);
    // The webhook may still be filling its caches: retry while it says it cannot decide yet.
    poll("the TrainingJob to be admitted", WAIT, || async {
        match jobs.create(&PostParams::default(), &tj).await {
            Ok(_) => Some(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Some(()),
            Err(e) => {
                eprintln!("not yet: {e}");
                None
            }
        }
    })
    .await;
    wait(
        "TrainingJob e2e to create its workload",
        WAIT,
        kube::runtime::wait::await_condition(jobs.clone(), "e2e", |j: Option<&TrainingJob>| {
            j.is_some_and(has_workload)
        }),
    )
    .await
    .unwrap();
    let job_pods: Api<Pod> = Api::namespaced(client.clone(), &job_ns);
    let placed = wait_list(
        job_pods,
        kube::runtime::watcher::Config::default().labels("offload.dev/training-job=e2e"),
        "the e2e pods on the coherent nodes",
        WAIT,
        |pods| {
            let nodes: Vec<String> = pods
                .iter()
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect();
            (nodes.len() >= 2).then_some(nodes)
        },
    )
    .await;
    assert!(
        placed.iter().all(|n| n.starts_with("chart-gh200")),
        "{placed:?}"
    );
    // The profile's status is recomputed shortly after its jobs change (debounced).
    let table = poll(
        "the default profile to count its nodes and jobs",
        Duration::from_secs(30),
        || async {
            let table = kubectl(
                cluster,
                &["get", "offloadprofiles", "default", "--no-headers"],
            );
            let cols: Vec<&str> = table.split_whitespace().collect();
            let counted = cols.len() > 5
                && cols[3].parse::<u32>().is_ok_and(|n| n >= 2)
                && cols[4].parse::<u32>().is_ok_and(|n| n >= 3)
                && cols[5].parse::<u32>().is_ok_and(|n| n >= 1);
            counted.then_some(table)
        },
    )
    .await;
    let cols: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(&cols[..3], ["default", "Auto", "Auto"], "{table}");
}

/// Uninstall. kwok simulates the clean-up hook's pod without running it, so its command
/// (`offload-agent cleanup --all-nodes`) is run here against the same cluster; nothing the
/// chart made, and nothing the agent wrote, is left.
async fn uninstall_leaves_nothing(cluster: &DevCluster, client: &kube::Client) {
    output(
        cluster.helm().args([
            "uninstall",
            "offload-operator",
            "--namespace",
            NS,
            "--wait",
            "--timeout",
            "90s",
        ]),
        "helm uninstall",
    );
    output(
        Command::new(agent_binary())
            .env("KUBECONFIG", &cluster.kubeconfig)
            .args(["cleanup", "--all-nodes"]),
        "offload-agent cleanup --all-nodes",
    );
    assert_agent_left_nothing(client).await;
    let left = kubectl(
        cluster,
        &[
            "get",
            "all,serviceaccounts,roles,rolebindings,poddisruptionbudgets",
            "-n",
            NS,
            "-l",
            "app.kubernetes.io/instance=offload-operator",
            "-o",
            "name",
        ],
    );
    assert!(left.trim().is_empty(), "left behind in {NS}: {left}");
    let cluster_left = kubectl(
        cluster,
        &[
            "get",
            "clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations,validatingadmissionpolicies,validatingadmissionpolicybindings",
            "-l",
            "app.kubernetes.io/instance=offload-operator",
            "-o",
            "name",
        ],
    );
    assert!(
        cluster_left.trim().is_empty(),
        "left behind cluster-wide: {cluster_left}"
    );
}

/// The ValidatingAdmissionPolicy of the chart, with a real bound service-account token of the
/// agent: the token of a pod on node A may change offload.dev/* keys of node A, nothing else.
async fn the_agent_may_only_touch_offload_keys_on_its_own_node(
    cluster: &DevCluster,
    client: &kube::Client,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let probe: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "agent-probe"},
        "spec": {"serviceAccountName": "offload-agent", "nodeName": "chart-h200-0",
                 "containers": [{"name": "c", "image": "busybox"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &probe).await.unwrap();
    let token = kubectl(
        cluster,
        &[
            "create",
            "token",
            "offload-agent",
            "-n",
            NS,
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "agent-probe",
            "--duration",
            "10m",
        ],
    );
    let ca = cluster.root().join("ca.crt");
    let as_agent = |args: &[&str]| {
        let out = Command::new(cluster.bin_dir().join("kubectl"))
            .env("KUBECONFIG", "/dev/null")
            .args([
                "--server",
                &cluster.server,
                "--certificate-authority",
                ca.to_str().unwrap(),
                "--token",
                token.trim(),
            ])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The policy reaches the API server's admission cache a moment after install; until then
    // the change goes through, so each attempt sets a new value (a no-op change is allowed).
    let attempt = std::sync::atomic::AtomicU32::new(0);
    poll("the agent policy to deny a foreign label", WAIT, || async {
        let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (ok, err) = as_agent(&[
            "label",
            "node",
            "chart-h200-0",
            &format!("team=ml-{n}"),
            "--overwrite",
        ]);
        (!ok && err.contains("offload-agent may only change offload.dev/* labels")).then_some(())
    })
    .await;
    let (ok, err) = as_agent(&[
        "label",
        "node",
        "chart-h200-0",
        "offload.dev/probe=1",
        "--overwrite",
    ]);
    assert!(ok, "its own node's offload.dev/* label: {err}");
    let (ok, err) = as_agent(&[
        "label",
        "node",
        "chart-gh200-0",
        "offload.dev/probe=1",
        "--overwrite",
    ]);
    assert!(
        !ok && err.contains("offload-agent may only change the node its pod runs on"),
        "{err}"
    );
    let (ok, err) = as_agent(&[
        "annotate",
        "node",
        "chart-h200-0",
        "example.com/note=x",
        "--overwrite",
    ]);
    assert!(!ok && err.contains("offload.dev/* annotations"), "{err}");
    // Nor may it confirm its own word on the node's memory model.
    let (ok, err) = as_agent(&[
        "annotate",
        "node",
        "chart-h200-0",
        "offload.dev/memory-model-confirmed=coherent",
        "--overwrite",
    ]);
    assert!(
        !ok && err.contains("may not change offload.dev/memory-model-confirmed"),
        "{err}"
    );
    kubectl(
        cluster,
        &["label", "node", "chart-h200-0", "offload.dev/probe-"],
    );
}
