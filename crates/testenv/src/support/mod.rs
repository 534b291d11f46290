//! Integration-test support: one real control plane per test binary, a fresh namespace per test,
//! the CRDs applied, and waits on conditions with timeouts that say what they waited for.
//!
//! These helpers run inside tests, where a failure is a panic that names what failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod controller;

use crate::devcluster::{ClusterOptions, DevCluster};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Resource};
use serde_json::json;

/// The shared cluster of this test binary, once started.
static CLUSTER: OnceLock<DevCluster> = OnceLock::new();

/// What is wrong with the shared cluster, for a test that timed out waiting on it: the
/// components that exited, with their logs' last lines; empty where all run (or none started).
fn cluster_health() -> String {
    CLUSTER
        .get()
        .map(|c| {
            c.exited_components()
                .into_iter()
                .map(|(name, tail)| format!("\n{name} is no longer running; its log ends:\n{tail}"))
                .collect()
        })
        .unwrap_or_default()
}

/// The shared cluster of this test binary, started on first use with `options`. Every test of
/// one binary must ask for the same options.
pub fn cluster(options: ClusterOptions) -> &'static DevCluster {
    let cluster = CLUSTER.get_or_init(|| {
        // Started on its own runtime: each #[tokio::test] has a runtime of its own that ends
        // with the test, and the cluster outlives them all.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let started = Instant::now();
            // A second try where the first start fails (a component that exits while starting,
            // seen once under the real-node tests' load): the error is printed, not lost.
            let cluster = rt
                .block_on(DevCluster::start(options))
                .or_else(|e| {
                    eprintln!("the local control plane did not start, trying once more: {e}");
                    rt.block_on(DevCluster::start(options))
                })
                .unwrap_or_else(|e| panic!("could not start the local control plane: {e}"));
            eprintln!(
                "control plane ready in {:.1} s at {}",
                started.elapsed().as_secs_f64(),
                cluster.server
            );
            cluster
        })
        .join()
        .unwrap()
    });
    assert_eq!(
        cluster.options(),
        options,
        "all tests of one binary must share cluster options"
    );
    cluster
}

/// A client for the shared cluster, bound to the calling test's runtime.
pub async fn client(cluster: &DevCluster) -> Client {
    cluster.client().await.unwrap()
}

/// A binary of the workspace, built beside the running test (`target/<profile>/<name>`). The
/// test command builds every binary before the tests run.
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build every binary first (cargo build --workspace --bins)",
        path.display()
    );
    path
}

/// Creates a namespace with a unique name for one test.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("{prefix}-{}-{n}", std::process::id());
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    // The ServiceAccount admission plugin needs the namespace's `default` account before any
    // pod is accepted; without a controller-manager nobody else creates it.
    let sa = k8s_openapi::api::core::v1::ServiceAccount {
        metadata: kube::api::ObjectMeta {
            name: Some("default".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), &name);
    match sas.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating the default ServiceAccount in {name}: {e}"),
    }
    name
}

/// Applies the generated CRDs (server-side apply) and waits until each is Established.
pub async fn apply_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in offload_api::v1alpha1::crds() {
        let name = crd.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("offload-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
        wait(
            &format!("CRD {name} established"),
            Duration::from_secs(30),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap();
    }
}

/// Awaits `fut`, failing the test with `what` if it takes longer than `timeout`.
pub async fn wait<T>(what: &str, timeout: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(timeout, fut).await {
        Ok(v) => v,
        Err(_) => panic!(
            "timed out after {timeout:?} waiting for {what}{}",
            cluster_health()
        ),
    }
}

/// Watches the objects `config` selects and returns as soon as `check` accepts the current list
/// (evaluated after the initial list and after every change); fails with `what` after
/// `timeout`. The wait for a condition over several objects, without polling.
pub async fn wait_list<K, T>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
    what: &str,
    timeout: Duration,
    check: impl Fn(&[std::sync::Arc<K>]) -> Option<T>,
) -> T
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let (store, writer) = reflector::store();
    let events = watcher(api, config).default_backoff().reflect(writer);
    let until = async {
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
                Ok(_) => {}
                Err(e) => {
                    eprintln!("{what}: watch error (retrying): {e}");
                    continue;
                }
            }
            if let Some(v) = check(&store.state()) {
                return v;
            }
        }
        panic!("the watch for {what} ended")
    };
    wait(what, timeout, until).await
}

/// Retries an action (`check`) until it returns `Some`, failing with `what` after `timeout`;
/// backs off up to 500 ms. Only for what no watch can express: an admission that succeeds once
/// a webhook's or the API server's caches have caught up, a command's outcome.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    let mut delay = Duration::from_millis(20);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}{}",
            cluster_health()
        );
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

/// Runs kubectl against the cluster and returns stdout, failing the test on a non-zero exit.
pub fn kubectl(cluster: &DevCluster, args: &[&str]) -> String {
    let out = cluster.kubectl().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs kubectl and returns (success, stdout, stderr) without asserting.
pub fn kubectl_result(
    cluster: &DevCluster,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String, String) {
    use std::io::Write;
    let mut cmd = cluster.kubectl();
    cmd.args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(std::process::Stdio::piped());
    }
    let mut child = cmd.spawn().unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A kwok-managed Node (simulated: kwok makes it Ready and runs its pods), with extra labels
/// and annotations, e.g. the agent's labels and report.
pub fn kwok_node(name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Node {
    let mut node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}
        },
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
        }
    }))
    .unwrap();
    let meta = node.meta_mut();
    for (k, v) in labels {
        meta.labels
            .get_or_insert_with(Default::default)
            .insert((*k).to_string(), (*v).to_string());
    }
    for (k, v) in annotations {
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert((*k).to_string(), (*v).to_string());
    }
    node
}

/// Runs `task` on a runtime of its own thread, which outlives every test's runtime, with a
/// client of `cluster` and the CRDs applied; returns what `task` sends once it is up (it goes on
/// running until the test binary exits).
pub fn in_background<T, F>(
    cluster: &'static DevCluster,
    task: impl FnOnce(Client, std::sync::mpsc::Sender<T>) -> F + Send + 'static,
) -> T
where
    T: Send + 'static,
    F: Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let client = cluster.client().await.unwrap();
            apply_crds(&client).await;
            task(client, tx).await;
        });
    });
    rx.recv().unwrap()
}

/// Starts the operator in-process (its own thread and runtime, like the cluster) once per test
/// binary; it runs until the binary exits.
pub fn operator(cluster: &'static DevCluster) {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        in_background(cluster, |client, up| async move {
            let token = tokio_util::sync::CancellationToken::new();
            up.send(()).unwrap();
            offload_operator::operator::run(client, operator_options(), token)
                .await
                .unwrap();
        })
    });
}

/// The operator's webhook configurations as the chart registers them, named `name`, calling
/// `https://127.0.0.1:port` (an in-process webhook), for every namespace but kube-system and
/// `own_namespace`; the managed CA is written into them by the webhook itself.
pub fn webhook_configurations(
    port: u16,
    name: &str,
    own_namespace: &str,
) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let url = |path: &str| format!("https://127.0.0.1:{port}{path}");
    let not_system = json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", own_namespace]}]});
    let opted = json!({"matchExpressions": [{"key": "offload.dev/profile", "operator": "Exists"}]});
    let common =
        |name: &str, path: &str, rules: serde_json::Value, object_selector: serde_json::Value| {
            // The workload and pod webhooks start the sizer of a held job's step.
            let starts = path == offload_operator::webhook::paths::MUTATE_WORKLOAD
                || path == offload_operator::webhook::paths::MUTATE_POD;
            json!({
                "name": name,
                "clientConfig": {"url": url(path)},
                "rules": rules,
                "namespaceSelector": not_system,
                "objectSelector": object_selector,
                "sideEffects": if starts { "NoneOnDryRun" } else { "None" },
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
                "failurePolicy": "Fail"
            })
        };
    let mut mutating = vec![
        common(
            "trainingjobs.mutate.offload.dev",
            offload_operator::webhook::paths::MUTATE_TRAINING_JOB,
            json!([{"apiGroups": ["offload.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE"], "resources": ["trainingjobs"]}]),
            json!({}),
        ),
        common(
            "workloads.mutate.offload.dev",
            offload_operator::webhook::paths::MUTATE_WORKLOAD,
            json!([
                {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["jobs"]},
                {"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["jobsets"]},
                {"apiGroups": ["kubeflow.org"], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["pytorchjobs"]},
                {"apiGroups": ["trainer.kubeflow.org"], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["trainjobs"]}
            ]),
            opted.clone(),
        ),
        common(
            "pods.mutate.offload.dev",
            offload_operator::webhook::paths::MUTATE_POD,
            json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]),
            opted,
        ),
    ];
    for m in &mut mutating {
        m["reinvocationPolicy"] = json!("IfNeeded");
    }
    let validating = vec![
        common(
            "trainingjobs.validate.offload.dev",
            offload_operator::webhook::paths::VALIDATE_TRAINING_JOB,
            json!([{"apiGroups": ["offload.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"], "resources": ["trainingjobs"]}]),
            json!({}),
        ),
        common(
            "offloadprofiles.validate.offload.dev",
            offload_operator::webhook::paths::VALIDATE_PROFILE,
            json!([{"apiGroups": ["offload.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"], "resources": ["offloadprofiles"]}]),
            json!({}),
        ),
    ];
    (
        serde_json::from_value(json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration", "metadata": {"name": name}, "webhooks": mutating})).unwrap(),
        serde_json::from_value(json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "metadata": {"name": name}, "webhooks": validating})).unwrap(),
    )
}

/// The namespace of the in-process operator's managed webhook certificate.
pub const OPERATOR_NAMESPACE: &str = "offload-system";

/// Starts the operator in-process as [`operator`] does, with its admission webhook on: the
/// webhook configurations registered with the API server (the chart's rules, the operator's
/// managed CA), so every TrainingJob write — the operator's own included — passes the
/// webhook, as in an install. Once per test binary.
pub fn operator_with_webhook(cluster: &'static DevCluster) {
    operator_with_webhook_and(cluster, |_| {});
}

/// [`operator_with_webhook`], the operator's options edited by `edit` first (the first call of
/// a test binary decides them).
pub fn operator_with_webhook_and(
    cluster: &'static DevCluster,
    edit: impl FnOnce(&mut offload_operator::operator::RunOptions) + Send + 'static,
) {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        in_background(cluster, |client, up| async move {
            let ns: Namespace =
                serde_json::from_value(json!({"metadata": {"name": OPERATOR_NAMESPACE}})).unwrap();
            let _ = Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &ns)
                .await;
            let name = "offload-operator-in-process";
            let port = crate::devcluster::free_port().unwrap();
            let (mutating, validating) = webhook_configurations(port, name, OPERATOR_NAMESPACE);
            Api::<MutatingWebhookConfiguration>::all(client.clone())
                .create(&PostParams::default(), &mutating)
                .await
                .unwrap();
            Api::<ValidatingWebhookConfiguration>::all(client.clone())
                .create(&PostParams::default(), &validating)
                .await
                .unwrap();
            let mut options = operator_options();
            options.webhook = Some(offload_operator::webhook::WebhookOptions {
                addr: format!("127.0.0.1:{port}").parse().unwrap(),
                certs: offload_operator::webhook::CertMode::Managed(
                    offload_operator::webhook::tls::ManagedCerts {
                        namespace: OPERATOR_NAMESPACE.into(),
                        secret: offload_api::names::WEBHOOK_SECRET.into(),
                        names: vec!["127.0.0.1".into()],
                        mutating: Some(name.into()),
                        validating: Some(name.into()),
                    },
                ),
                check_interval: Duration::from_secs(3600),
            });
            edit(&mut options);
            let token = tokio_util::sync::CancellationToken::new();
            up.send(()).unwrap();
            offload_operator::operator::run(client, options, token)
                .await
                .unwrap();
        })
    });
}

/// Options for an in-process operator: admin server on a free port, no leader election.
pub fn operator_options() -> offload_operator::operator::RunOptions {
    offload_operator::operator::RunOptions {
        admin_addr: "127.0.0.1:0".parse().unwrap(),
        leader_election: None,
        controller: Default::default(),
        webhook: None,
        dra: Some(Default::default()),
        learned_namespace: Some("default".into()),
        sizer: None,
    }
}

/// GPUs of a test node ([`kwok_node`] allocates this many `nvidia.com/gpu`).
pub const TEST_NODE_GPUS: u32 = 8;

/// The report a test node `name` publishes: the fixture's, its GPU standing for each of the
/// node's [`TEST_NODE_GPUS`].
pub fn test_node_report(name: &str, fixture: &str) -> offload_api::report::NodeReport {
    let mut report = offload_api::report::NodeReport::parse(fixture).unwrap();
    report.node = name.to_string();
    if let Some(first) = report.gpus.first().cloned() {
        report.gpus = (0..TEST_NODE_GPUS)
            .map(|i| offload_api::report::GpuReport {
                index: i,
                uuid: format!("{}-{i}", first.uuid),
                ..first.clone()
            })
            .collect();
    }
    report
}

/// A kwok node carrying a node report fixture and the labels the agent derives from it, plus a
/// pool label so a test's profile can select only its own nodes. The fixture's GPU stands for
/// each of the node's [`TEST_NODE_GPUS`] GPUs, so the report and the node's allocatable GPUs
/// agree, as an agent's report and a device plugin do.
pub fn reported_node(name: &str, fixture: &str, pool: &str) -> Node {
    let report = test_node_report(name, fixture);
    let labels = offload_api::labels::published(&report);
    let mut label_refs: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    label_refs.push(("offload.dev/test-pool", pool));
    let annotation = report.to_annotation().unwrap();
    kwok_node(
        name,
        &label_refs,
        &[(
            offload_api::names::ANNOTATION_NODE_REPORT,
            annotation.as_str(),
        )],
    )
}

/// An OffloadProfile that only sees nodes of one test pool.
pub fn pool_profile(
    name: &str,
    pool: &str,
    extra: serde_json::Value,
) -> offload_api::v1alpha1::OffloadProfile {
    let mut spec = serde_json::json!({
        "nodeSelector": {"matchLabels": {"offload.dev/test-pool": pool}}
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile",
        "metadata": {"name": name},
        "spec": spec
    }))
    .unwrap()
}

/// Asserts that no Node keeps anything the agent writes (what `offload-agent cleanup` and the
/// chart's uninstall hook promise).
pub async fn assert_agent_left_nothing(client: &Client) {
    let nodes = Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    nodes.items.iter().for_each(assert_agent_left_nothing_on);
}

/// Asserts that `node` keeps nothing the agent writes: its labels, its report, its observation.
pub fn assert_agent_left_nothing_on(node: &Node) {
    use offload_api::names;
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let has = |map: &Option<std::collections::BTreeMap<String, String>>, key: &str| {
        map.as_ref().is_some_and(|m| m.contains_key(key))
    };
    for key in names::AGENT_LABELS {
        assert!(!has(&node.metadata.labels, key), "{key} left on {name}");
    }
    for key in [names::ANNOTATION_NODE_REPORT, names::ANNOTATION_OBSERVED] {
        assert!(
            !has(&node.metadata.annotations, key),
            "{key} left on {name}"
        );
    }
}

/// Whether the TrainingJob reports `WorkloadCreated=True`.
pub fn has_workload(tj: &offload_api::v1alpha1::TrainingJob) -> bool {
    tj.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "WorkloadCreated" && c.status == "True")
    })
}

/// Waits until `api` lists exactly `count` TrainingJobs and every one has its workload.
pub async fn every_job_has_its_workload(
    api: &Api<offload_api::v1alpha1::TrainingJob>,
    count: usize,
    what: &str,
    timeout: Duration,
) {
    wait_list(
        api.clone(),
        kube::runtime::watcher::Config::default(),
        what,
        timeout,
        |tjs| (tjs.len() == count && tjs.iter().all(|tj| has_workload(tj))).then_some(()),
    )
    .await;
}

/// The names of the Events in `ns` with `reason`, as `kubectl get events` lists them (empty when
/// there are none).
pub fn events_with_reason(cluster: &DevCluster, ns: &str, reason: &str) -> String {
    let selector = format!("reason={reason}");
    kubectl(
        cluster,
        &[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            &selector,
            "-o",
            "name",
        ],
    )
}

/// The required node-affinity terms of a pod spec; fails the test when it has none.
pub fn required_node_terms(
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> &[k8s_openapi::api::core::v1::NodeSelectorTerm] {
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    &required
        .expect("required node affinity")
        .node_selector_terms
}
