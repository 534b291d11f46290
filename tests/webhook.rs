//! The webhook through the real API server, over real TLS with the operator-managed CA.

use offload_testenv::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Client;
use kube::api::{Api, PostParams};
use offload_api::v1alpha1::OffloadProfile;
use offload_operator::cluster::caches::Caches;
use offload_operator::ops::metrics::Metrics;
use offload_operator::webhook::admit::StoreView;
use offload_operator::webhook::tls::ManagedCerts;
use offload_operator::webhook::{self, CertMode, Rotator, WebhookOptions, WebhookState};
use offload_testenv::devcluster::{ClusterOptions, DevCluster, free_port};
use offload_testenv::fixtures;
use serde_json::json;
use support::*;
use tokio::sync::OnceCell;

const WEBHOOK_NS: &str = "offload-system";
const POOL: &str = "webhook-tests";

/// The webhook of this test binary, registered with the API server once.
struct Served {
    rotator: Rotator,
}

async fn setup() -> (&'static DevCluster, Client, &'static Served) {
    static SERVED: OnceCell<Served> = OnceCell::const_new();
    let cluster = cluster(ClusterOptions::default());
    let served = SERVED
        .get_or_init(|| async {
            // The webhook runs on a runtime of its own that outlives every test.
            let rotator = in_background(cluster, |client, tx| async move {
                let ns: Namespace =
                    serde_json::from_value(json!({"metadata": {"name": WEBHOOK_NS}})).unwrap();
                let _ = Api::<Namespace>::all(client.clone())
                    .create(&PostParams::default(), &ns)
                    .await;
                let nodes: Api<Node> = Api::all(client.clone());
                let _ = nodes
                    .create(
                        &PostParams::default(),
                        &reported_node("webhook-h200", fixtures::H200_READING, POOL),
                    )
                    .await;
                let profile = pool_profile("default", POOL, json!({}));
                let _ = Api::<OffloadProfile>::all(client.clone())
                    .create(&PostParams::default(), &profile)
                    .await;

                let port = free_port().unwrap();
                let (mutating, validating) =
                    webhook_configurations(port, "offload-operator-test", WEBHOOK_NS);
                Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .create(&PostParams::default(), &mutating)
                    .await
                    .unwrap();
                Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .create(&PostParams::default(), &validating)
                    .await
                    .unwrap();

                let shutdown = tokio_util::sync::CancellationToken::new();
                let mut registry = prometheus_client::registry::Registry::default();
                let metrics = Metrics::new(&mut registry);
                let (caches, drive) =
                    Caches::new(&client, metrics.clone(), Some(&Default::default()));
                let state = WebhookState {
                    view: Arc::new(StoreView::new(&caches)),
                    metrics,
                    configs: offload_operator::webhook::ConfigSource::Api(client.clone()),
                    events: Some(offload_operator::webhook::events::EventSink::start(
                        client.clone(),
                        "offload-operator-test",
                    )),
                };
                let options = WebhookOptions {
                    addr: format!("127.0.0.1:{port}").parse().unwrap(),
                    certs: CertMode::Managed(ManagedCerts {
                        namespace: WEBHOOK_NS.into(),
                        secret: offload_api::names::WEBHOOK_SECRET.into(),
                        names: vec!["127.0.0.1".into()],
                        mutating: Some("offload-operator-test".into()),
                        validating: Some("offload-operator-test".into()),
                    }),
                    check_interval: Duration::from_secs(3600),
                };
                let (rotator, _bound, serve) =
                    webhook::serve(client.clone(), options, state, shutdown.clone())
                        .await
                        .unwrap();
                // Wait until the webhook's own view has the profile and node it decides from.
                tx.send(rotator).ok();
                tokio::join!(drive, serve);
            });
            Served { rotator }
        })
        .await;
    let client = client(cluster).await;
    // The webhook's caches fill asynchronously: wait until a labelled pod is admitted with env.
    (cluster, client, served)
}

fn pod(name: &str, labelled: bool) -> Pod {
    let labels = if labelled {
        json!({"offload.dev/profile": "auto"})
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox", "env": [{"name": "KEEP", "value": "me"}]}]}
    }))
    .unwrap()
}

fn env_names(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<String> {
    spec.containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| e.name.clone())
        .collect()
}

/// Creates a labelled pod, retrying while the webhook's caches are still filling (it refuses
/// pods it cannot configure yet, with ProfileNotFound or NoReportedNodes) and while the API
/// server's ServiceAccount cache has not seen the new namespace's `default` account.
async fn create_configured_pod(pods: &Api<Pod>, name: &str) -> Pod {
    create_admitted(pods, &pod(name, true)).await
}

/// [`create_configured_pod`] for any pod.
async fn create_admitted(pods: &Api<Pod>, pod: &Pod) -> Pod {
    let name = pod.metadata.name.clone().unwrap_or_default();
    poll(
        &format!("the webhook to configure pod {name}"),
        Duration::from_secs(30),
        || async {
            match pods.create(&PostParams::default(), pod).await {
                Ok(p) => Some(p),
                Err(kube::Error::Api(e))
                    if e.message.contains("does not exist")
                        || e.message.contains("reported")
                        || e.message.contains("serviceaccount") =>
                {
                    eprintln!("not yet: {}", e.message);
                    None
                }
                Err(e) => panic!("creating pod {name}: {e}"),
            }
        },
    )
    .await
}

#[tokio::test]
async fn labelled_pods_and_jobs_are_stored_configured_and_others_untouched() {
    let (_cluster, client, _served) = setup().await;
    let ns = namespace(&client, "wh").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let stored = create_configured_pod(&pods, "labelled").await;
    let spec = stored.spec.unwrap();
    let names = env_names(&spec);
    assert!(
        names.contains(&"OFFLOAD_MODE".to_string()) && names.contains(&"KEEP".to_string()),
        "{names:?}"
    );
    let terms = required_node_terms(&spec);
    assert!(
        terms[0]
            .match_expressions
            .as_ref()
            .unwrap()
            .iter()
            .any(|e| e.key == "offload.dev/uma")
    );
    assert!(stored.metadata.annotations.unwrap()["offload.dev/resolved"].contains("mode=CPUCopy"));

    let plain = pods
        .create(&PostParams::default(), &pod("plain", false))
        .await
        .unwrap();
    assert_eq!(
        env_names(&plain.spec.unwrap()),
        vec!["KEEP".to_string()],
        "an unlabelled pod is untouched"
    );
    assert!(
        !plain
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("offload.dev/resolved")
    );

    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "labels": {"offload.dev/profile": "auto"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .unwrap();
    let stored = Api::<Job>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    let annotations = stored.metadata.annotations.clone().unwrap_or_default();
    let uid = stored.metadata.uid.clone().unwrap();
    let template = stored.spec.unwrap().template.spec.unwrap();
    assert!(env_names(&template).contains(&"OFFLOAD_MODE".to_string()));
    assert!(template.affinity.is_some());
    // Its owner sees why: every reason in an annotation, and an Event on the Job itself.
    let reasons = &annotations["offload.dev/reasons"];
    assert!(
        reasons.lines().any(|l| l.starts_with("mode: ")) && reasons.contains("\nnodeClass: "),
        "{reasons}"
    );
    let note = wait_list(
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), &ns),
        kube::runtime::watcher::Config::default().fields(&format!(
            "involvedObject.uid={uid},reason=OffloadConfigured"
        )),
        "an OffloadConfigured Event on Job train",
        Duration::from_secs(60),
        |events| events.first().and_then(|e| e.message.clone()),
    )
    .await;
    assert!(
        note.starts_with("mode=CPUCopy") && note.contains("offload.dev/reasons"),
        "{note}"
    );
}

#[tokio::test]
async fn kubectl_apply_of_an_invalid_training_job_prints_the_webhook_message() {
    let (cluster, client, _served) = setup().await;
    let ns = namespace(&client, "whtj").await;
    // Wait for the webhook to be serving with its view.
    create_configured_pod(&Api::namespaced(client.clone(), &ns), "probe").await;
    let manifest = "apiVersion: offload.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: half\n  annotations: {offload.dev/profile: auto}\nspec:\n  framework: {name: FSDP, version: \"2.7.1\"}\n  offload: {offloadRatio: \"0.5\"}\n  template: {spec: {containers: [{name: t, image: busybox}]}}\n";
    let (ok, _out, err) = kubectl_result(cluster, &["apply", "-n", &ns, "-f", "-"], Some(manifest));
    assert!(!ok);
    assert!(
        err.contains("denied the request")
            && err.contains("FSDP has no partial-offload switch")
            && err.contains("set spec.offload.offloadRatio to 1 or Auto"),
        "{err}"
    );
}

/// A ZeRO stage stated in the referenced ConfigMap gets the answer one in the spec gets: the
/// webhook reads the ConfigMap through the API server.
#[tokio::test]
async fn a_stage_in_the_config_map_is_refused_at_admission_like_one_in_the_spec() {
    let (cluster, client, _served) = setup().await;
    let ns = namespace(&client, "whcm").await;
    create_configured_pod(&Api::namespaced(client.clone(), &ns), "probe").await;
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ds}\ndata:\n  ds_config.json: '{\"zero_optimization\": {\"stage\": 2}}'\n";
    let (ok, _, err) = kubectl_result(cluster, &["apply", "-n", &ns, "-f", "-"], Some(cm));
    assert!(ok, "{err}");
    let job = |deepspeed: &str| {
        format!(
            "apiVersion: offload.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: partial\n  annotations: {{offload.dev/profile: auto}}\nspec:\n  framework: {{name: DeepSpeed, version: \"0.19.8\"}}\n  deepspeed: {deepspeed}\n  offload: {{offloadRatio: \"0.5\"}}\n  template: {{spec: {{containers: [{{name: t, image: busybox}}]}}}}\n"
        )
    };
    let (ok, _, in_config) = kubectl_result(
        cluster,
        &["apply", "-n", &ns, "-f", "-"],
        Some(&job("{configMapRef: {name: ds}}")),
    );
    assert!(!ok, "refused: {in_config}");
    let (ok, _, in_spec) = kubectl_result(
        cluster,
        &["apply", "-n", &ns, "-f", "-"],
        Some(&job("{zeroStage: 2}")),
    );
    assert!(!ok);
    let reason = |e: &str| {
        e.split("denied the request: ")
            .nth(1)
            .unwrap_or(e)
            .trim()
            .to_string()
    };
    assert_eq!(reason(&in_config), reason(&in_spec));
    assert!(in_config.contains("stage 2"), "{in_config}");
}

#[tokio::test]
async fn a_certificate_rotation_mid_stream_fails_no_admission() {
    let (_cluster, client, served) = setup().await;
    let ns = namespace(&client, "whrot").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create_configured_pod(&pods, "warm").await;
    let created = Arc::new(AtomicUsize::new(0));
    let (ten_done, ten) = tokio::sync::oneshot::channel::<()>();
    let creator = {
        let pods = pods.clone();
        let created = created.clone();
        tokio::spawn(async move {
            let mut ten_done = Some(ten_done);
            for i in 0..60 {
                let p = pods
                    .create(&PostParams::default(), &pod(&format!("p-{i}"), true))
                    .await
                    .unwrap_or_else(|e| panic!("admission {i} failed: {e}"));
                assert!(env_names(&p.spec.unwrap()).contains(&"OFFLOAD_MODE".to_string()));
                if created.fetch_add(1, Ordering::Relaxed) + 1 >= 10
                    && let Some(tx) = ten_done.take()
                {
                    let _ = tx.send(());
                }
            }
        })
    };
    // Rotate once some admissions went through, while the rest are still to come.
    wait(
        "some admissions before the rotation",
        Duration::from_secs(30),
        ten,
    )
    .await
    .unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), WEBHOOK_NS);
    let serving_cert = || async {
        secrets
            .get(offload_api::names::WEBHOOK_SECRET)
            .await
            .unwrap()
            .data
            .unwrap()["tls.crt"]
            .clone()
    };
    let before = serving_cert().await;
    served.rotator.rotate().await.unwrap();
    let after = serving_cert().await;
    assert_ne!(before, after, "the serving certificate was re-issued");
    let done_at_rotation = created.load(Ordering::Relaxed);
    creator.await.unwrap();
    assert!(
        done_at_rotation < 60,
        "the rotation happened mid-stream ({done_at_rotation} of 60 done)"
    );
    assert_eq!(created.load(Ordering::Relaxed), 60);
}

/// A TrainingJob of 1.1 MiB (legal: the API server stores objects up to about 1.5 MiB) can be
/// updated through the webhook: the review of an UPDATE carries both copies, over 2 MiB, and
/// the webhook answered 413 to the API server, so every update (the operator's own patch too)
/// failed.
#[tokio::test]
async fn a_large_training_job_can_be_updated_through_the_webhook() {
    let (_cluster, client, _served) = setup().await;
    let ns = namespace(&client, "large").await;
    let api: Api<offload_api::v1alpha1::TrainingJob> = Api::namespaced(client.clone(), &ns);
    let tj: offload_api::v1alpha1::TrainingJob = serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "large"},
        "spec": {"framework": {"name": "Generic"},
                 "template": {"spec": {"containers": [{"name": "t", "image": "train:1",
                     "env": [{"name": "BIG", "value": "x".repeat(1_150_000)}]}]}}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &tj).await.unwrap();
    let patch = json!({"metadata": {"labels": {"touched": "yes"}}});
    let updated = api
        .patch(
            "large",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    assert_eq!(updated.metadata.labels.unwrap()["touched"], "yes");
}

// ---- upstream job kinds ----------------------------------------------------------------------

/// An upstream manifest as JSON (kubectl reads the YAML; the kind's CRD must be installed).
fn manifest_json(cluster: &DevCluster, path: &std::path::Path) -> serde_json::Value {
    let out = kubectl(
        cluster,
        &[
            "create",
            "--dry-run=client",
            "-o",
            "json",
            "-f",
            &path.display().to_string(),
        ],
    );
    serde_json::from_str(&out).unwrap()
}

/// Opts an upstream object in (the profile label), into the test's namespace.
fn opted_in(mut obj: serde_json::Value, ns: &str, name: &str) -> serde_json::Value {
    let meta = obj["metadata"].as_object_mut().unwrap();
    meta.insert("namespace".into(), json!(ns));
    meta.insert("name".into(), json!(name));
    meta.entry("labels")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .unwrap()
        .insert("offload.dev/profile".into(), json!("auto"));
    obj
}

/// Creates an object through the API server (and so through the webhook); returns what was stored.
fn create_stored(cluster: &DevCluster, obj: &serde_json::Value) -> serde_json::Value {
    let (ok, out, err) = kubectl_result(
        cluster,
        &["create", "-o", "json", "-f", "-"],
        Some(&obj.to_string()),
    );
    assert!(
        ok,
        "creating {} {}: {err}",
        obj["kind"], obj["metadata"]["name"]
    );
    serde_json::from_str(&out).unwrap()
}

fn env_of(env: &serde_json::Value) -> Vec<&str> {
    env.as_array()
        .map(|e| e.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default()
}

/// The stored pod template carries the configuration the webhook wrote (env and placement).
fn assert_template_configured(what: &str, template: &serde_json::Value) {
    let spec = &template["spec"];
    for c in spec["containers"].as_array().unwrap() {
        assert!(
            env_of(&c["env"]).contains(&"OFFLOAD_MODE"),
            "{what}: container {} lost its env: {c}",
            c["name"]
        );
    }
    assert!(
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"]
            .as_array()
            .is_some_and(|m| m.iter().any(|e| e["key"] == "offload.dev/uma")),
        "{what}: placement was pruned or not written: {spec}"
    );
}

/// The upstream CRDs of JobSet, Kubeflow Trainer and the Training Operator, installed at their
/// pinned versions; their own example manifests, opted in, keep what the webhook wrote once the
/// API server has pruned what their schemas do not know.
#[tokio::test]
async fn upstream_job_kinds_keep_what_the_webhook_wrote() {
    let dir = offload_testenv::devcluster::ensure_job_kinds().unwrap();
    let (cluster, client, _served) = setup().await;
    let ns = namespace(&client, "kinds").await;
    create_configured_pod(&Api::namespaced(client.clone(), &ns), "probe").await;
    for crd in [
        "jobset/jobset.x-k8s.io_jobsets.yaml",
        "trainer/trainer.kubeflow.org_trainjobs.yaml",
        "trainer/trainer.kubeflow.org_trainingruntimes.yaml",
        "trainer/trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "training-operator/kubeflow.org_pytorchjobs.yaml",
    ] {
        install(cluster, dir.join(crd));
    }
    kubectl(
        cluster,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/jobsets.jobset.x-k8s.io",
            "crd/trainjobs.trainer.kubeflow.org",
            "crd/trainingruntimes.trainer.kubeflow.org",
            "crd/clustertrainingruntimes.trainer.kubeflow.org",
            "crd/pytorchjobs.kubeflow.org",
        ],
    );
    // Trainer's stock runtime: the TrainJobs below refer to it, and its template is a JobSet.
    install(cluster, dir.join("trainer/torch_distributed.yaml"));

    // Trainer's stock runtime: the TrainJobs below refer to it, and its template is a JobSet.
    install(cluster, dir.join("trainer/torch_distributed.yaml"));
    pytorchjob_and_jobset_keep_their_templates(cluster, &dir, &ns);
    trainjobs_keep_env_and_runtime_patch(cluster, &dir, &ns);
    trainer_2_1_gets_pod_template_overrides(cluster, &dir, &ns).await;
}

/// `kubectl apply --server-side` of one upstream manifest.
fn install(cluster: &DevCluster, path: std::path::PathBuf) {
    kubectl(
        cluster,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=offload-tests",
            "-f",
            &path.display().to_string(),
        ],
    );
}

/// PyTorchJob (Training Operator): every replica's template; JobSet: the JobSet that Trainer's
/// torch-distributed runtime runs.
fn pytorchjob_and_jobset_keep_their_templates(
    cluster: &DevCluster,
    dir: &std::path::Path,
    ns: &str,
) {
    let ptj = create_stored(
        cluster,
        &opted_in(
            manifest_json(cluster, &dir.join("training-operator/simple.yaml")),
            ns,
            "pytorch-simple",
        ),
    );
    for (role, spec) in ptj["spec"]["pytorchReplicaSpecs"].as_object().unwrap() {
        assert_template_configured(&format!("PyTorchJob {role}"), &spec["template"]);
    }

    // JobSet: the JobSet that Trainer's torch-distributed runtime runs.
    let runtime = manifest_json(cluster, &dir.join("trainer/torch_distributed.yaml"));
    let jobset = opted_in(
        json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {},
               "spec": runtime["spec"]["template"]["spec"]}),
        ns,
        "torch-distributed",
    );
    let stored = create_stored(cluster, &jobset);
    let jobs = stored["spec"]["replicatedJobs"].as_array().unwrap();
    assert!(!jobs.is_empty());
    for job in jobs {
        assert_template_configured(
            &format!("JobSet job {}", job["name"]),
            &job["template"]["spec"]["template"],
        );
    }
}

/// TrainJob, current Trainer: env in spec.trainer.env, placement in our runtimePatches entry,
/// beside the example's own entry.
fn trainjobs_keep_env_and_runtime_patch(cluster: &DevCluster, dir: &std::path::Path, ns: &str) {
    let trainer_patch = |tj: &serde_json::Value| -> Option<serde_json::Value> {
        tj["spec"]["runtimePatches"]
            .as_array()?
            .iter()
            .find(|p| p["manager"] == "offload.dev/operator")
            .map(|p| {
                p["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
                    ["spec"]["template"]
                    .clone()
            })
    };
    for (file, name) in [
        ("trainer/01-multi-node.yaml", "multi-node"),
        ("trainer/02-runtime-patches.yaml", "runtime-patches"),
    ] {
        let tj = create_stored(
            cluster,
            &opted_in(manifest_json(cluster, &dir.join(file)), ns, name),
        );
        assert!(
            env_of(&tj["spec"]["trainer"]["env"]).contains(&"OFFLOAD_MODE"),
            "{name}: {}",
            tj["spec"]["trainer"]
        );
        let mut template = trainer_patch(&tj)
            .unwrap_or_else(|| panic!("{name}: our runtime patch was pruned: {}", tj["spec"]));
        // The env is in spec.trainer.env (runtime patches may not set the node container's env).
        template["spec"]["containers"] = json!([]);
        assert_template_configured(name, &template);
    }
    let stored = kubectl(
        cluster,
        &["get", "-n", ns, "trainjob", "runtime-patches", "-o", "json"],
    );
    let stored: serde_json::Value = serde_json::from_str(&stored).unwrap();
    assert!(
        stored["spec"]["runtimePatches"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["manager"] == "example.io/platform-team"),
        "the example's own patch is kept"
    );
}

/// The last Trainer with spec.podTemplateOverrides: once the webhook's view has the replaced
/// CRD, what it writes is that field, and it survives pruning.
async fn trainer_2_1_gets_pod_template_overrides(
    cluster: &DevCluster,
    dir: &std::path::Path,
    ns: &str,
) {
    install(
        cluster,
        dir.join("trainer-old/trainer.kubeflow.org_trainjobs.yaml"),
    );
    let old = manifest_json(cluster, &dir.join("trainer/01-multi-node.yaml"));
    let mut attempt = 0;
    let tj = poll(
        "a TrainJob stored with podTemplateOverrides under Trainer 2.1's CRD",
        Duration::from_secs(60),
        || {
            attempt += 1;
            let name = format!("old-{attempt}");
            let obj = opted_in(old.clone(), ns, &name);
            let tj = create_stored(cluster, &obj);
            let ok = tj["spec"]["podTemplateOverrides"].is_array();
            if !ok {
                eprintln!(
                    "not yet: the webhook wrote for the previous schema: {}",
                    tj["spec"]
                );
                kubectl(cluster, &["delete", "-n", ns, "trainjob", &name]);
            }
            async move { ok.then_some(tj) }
        },
    )
    .await;
    let ov = &tj["spec"]["podTemplateOverrides"][0];
    assert_eq!(ov["targetJobs"][0]["name"], "node");
    let template = json!({"spec": {"containers": [], "affinity": ov["spec"]["affinity"]}});
    assert_template_configured("TrainJob (Trainer 2.1)", &template);
    assert!(env_of(&tj["spec"]["trainer"]["env"]).contains(&"OFFLOAD_MODE"));
    // Put the current CRD back for anything after this test.
    install(
        cluster,
        dir.join("trainer/trainer.kubeflow.org_trainjobs.yaml"),
    );
}

/// A profile's `wholeCores` through the real API server: a labelled pod whose container
/// requests less than its whole-core CPU limit and its memory limit is stored Guaranteed (the
/// API server's own QoS class) where the profile's nodes run the static CPU manager; the same
/// pod on a profile without it stays Burstable, as written.
#[tokio::test]
async fn whole_cores_store_a_labelled_pod_guaranteed() {
    let (_cluster, client, _served) = setup().await;
    let pool = "webhook-near";
    let mut report = test_node_report("webhook-near-h200", fixtures::H200_READING);
    report.cpu_manager_policy = Some("static".into());
    let mut labels: Vec<(String, String)> = offload_api::labels::published(&report)
        .into_iter()
        .collect();
    labels.push(("offload.dev/test-pool".into(), pool.into()));
    let refs: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let annotation = report.to_annotation().unwrap();
    let node = kwok_node(
        "webhook-near-h200",
        &refs,
        &[(
            offload_api::names::ANNOTATION_NODE_REPORT,
            annotation.as_str(),
        )],
    );
    let _ = Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await;
    let _ = Api::<OffloadProfile>::all(client.clone())
        .create(
            &PostParams::default(),
            &pool_profile("near", pool, json!({"wholeCores": true})),
        )
        .await;
    let ns = namespace(&client, "whole").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = |name: &str, profile: &str| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"offload.dev/profile": profile}},
            "spec": {"containers": [{"name": "train", "image": "busybox", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"},
                "limits": {"cpu": "4", "memory": "2Gi"}}}]}
        }))
        .unwrap()
    };
    let qos = |p: &Pod| p.status.as_ref().and_then(|s| s.qos_class.clone());
    let near = create_admitted(&pods, &pod("near", "near")).await;
    let r = near.spec.as_ref().unwrap().containers[0]
        .resources
        .clone()
        .unwrap();
    assert_eq!(qos(&near).as_deref(), Some("Guaranteed"), "{r:?}");
    assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "4");
    assert_eq!(r.requests.as_ref().unwrap()["memory"].0, "2Gi");
    let plain = create_admitted(&pods, &pod("plain", "auto")).await;
    assert_eq!(qos(&plain).as_deref(), Some("Burstable"));
}
