//! Other job kinds and Pods: configured at creation, refused with the reason, or left alone.

use super::*;

// ---- other kinds and Pods --------------------------------------------------------------------

fn container() -> Value {
    json!({"name": "train", "image": "train:1", "env": [{"name": "KEEP", "value": "me"}], "resources": {"limits": {"nvidia.com/gpu": "1"}}})
}

pub(super) fn opted_meta(name: &str) -> Value {
    json!({"name": name, "namespace": "team-a", "labels": {"offload.dev/profile": "auto"}, "annotations": {"offload.dev/framework": "Generic"}})
}

fn env_of(template: &Value) -> BTreeMap<String, String> {
    template["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn assert_configured(template: &Value, mode: &str) {
    let env = env_of(template);
    assert_eq!(env["OFFLOAD_MODE"], mode, "{template}");
    assert_eq!(env["KEEP"], "me");
    let exprs = &template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"];
    assert!(
        exprs
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["key"] == names::LABEL_UMA),
        "{exprs}"
    );
}

#[tokio::test]
async fn batch_jobs_are_configured_once() {
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": opted_meta("j"),
        "spec": {"parallelism": 2, "template": {"spec": {"restartPolicy": "Never", "containers": [container()]}}}});
    let r = admit(
        coherent_cluster(),
        paths::MUTATE_WORKLOAD,
        review("batch", "v1", "Job", "jobs", "CREATE", job.clone(), None),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&job, &r);
    assert_configured(&out["spec"]["template"], "unified-memory");
    assert!(
        out["metadata"]["annotations"][names::ANNOTATION_RESOLVED]
            .as_str()
            .unwrap()
            .contains("mode=UnifiedMemory")
    );
    // Every reason, one a line, as a TrainingJob's status has them.
    let reasons = out["metadata"]["annotations"][names::ANNOTATION_REASONS]
        .as_str()
        .unwrap();
    for field in [
        "mode: ",
        "nodeClass: ",
        "overlap: ",
        "offloadRatio: ",
        "pinMemory: ",
        "framework: ",
    ] {
        assert!(
            reasons.lines().any(|l| l.starts_with(field)),
            "{field}: {reasons}"
        );
    }
    let again = admit(
        coherent_cluster(),
        paths::MUTATE_WORKLOAD,
        review("batch", "v1", "Job", "jobs", "CREATE", out, None),
    )
    .await;
    assert!(
        again.get("patch").is_none_or(Value::is_null),
        "re-invocation adds nothing: {again}"
    );
}

#[tokio::test]
async fn jobsets_pytorchjobs_and_trainjobs_are_configured() {
    let jobset = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": opted_meta("js"),
    "spec": {"replicatedJobs": [
        {"name": "leader", "replicas": 1, "template": {"spec": {"template": {"spec": {"containers": [container()]}}}}},
        {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 2, "template": {"spec": {"containers": [container()]}}}}}
    ]}});
    let r = admit(
        discrete_cluster(),
        paths::MUTATE_WORKLOAD,
        review(
            "jobset.x-k8s.io",
            "v1alpha2",
            "JobSet",
            "jobsets",
            "CREATE",
            jobset.clone(),
            None,
        ),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&jobset, &r);
    for i in 0..2 {
        assert_configured(
            &out["spec"]["replicatedJobs"][i]["template"]["spec"]["template"],
            "cpu-copy",
        );
    }

    let ptj = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": opted_meta("pt"),
    "spec": {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "template": {"spec": {"containers": [container()]}}},
        "Worker": {"replicas": 3, "template": {"spec": {"containers": [container()]}}}
    }}});
    let r = admit(
        coherent_cluster(),
        paths::MUTATE_WORKLOAD,
        review(
            "kubeflow.org",
            "v1",
            "PyTorchJob",
            "pytorchjobs",
            "CREATE",
            ptj.clone(),
            None,
        ),
    )
    .await;
    // Four pods, two coherent GPUs: the only class still wins, pods wait for capacity.
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&ptj, &r);
    assert_configured(
        &out["spec"]["pytorchReplicaSpecs"]["Master"]["template"],
        "unified-memory",
    );
    assert_configured(
        &out["spec"]["pytorchReplicaSpecs"]["Worker"]["template"],
        "unified-memory",
    );
}

/// Fields of a newer Kubernetes release than this build's types (`hostnameOverride`, a
/// container field of a future release), and the object's own annotations.
fn with_newer_fields(mut template: Value) -> Value {
    template["spec"]["hostnameOverride"] = json!("trainer-0");
    template["spec"]["containers"][0]["futureField"] = json!({"on": true});
    template
}

fn assert_kept(template: &Value) {
    assert_eq!(
        template["spec"]["hostnameOverride"], "trainer-0",
        "{template}"
    );
    assert_eq!(
        template["spec"]["containers"][0]["futureField"],
        json!({"on": true}),
        "{template}"
    );
}

#[tokio::test]
async fn template_fields_the_types_do_not_know_are_kept() {
    let template =
        with_newer_fields(json!({"spec": {"restartPolicy": "Never", "containers": [container()]}}));
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": opted_meta("j"),
        "spec": {"parallelism": 2, "template": template.clone()}});
    let jobset = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": opted_meta("js"),
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": template.clone()}}}]}});
    let cases = [
        (("batch", "v1", "Job", "jobs"), job, "/spec/template"),
        (
            ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
            jobset,
            "/spec/replicatedJobs/0/template/spec/template",
        ),
    ];
    for ((group, version, kind, resource), object, at) in cases {
        let r = admit(
            discrete_cluster(),
            paths::MUTATE_WORKLOAD,
            review(
                group,
                version,
                kind,
                resource,
                "CREATE",
                object.clone(),
                None,
            ),
        )
        .await;
        assert_eq!(r["allowed"], true, "{kind}: {r}");
        let ops = patch_of(&r);
        assert!(
            ops.iter().all(|op| op["op"] != "remove"),
            "{kind}: the patch removes a field: {ops:?}"
        );
        let out = patched(&object, &r);
        let template = out.pointer(at).unwrap();
        assert_configured(template, "cpu-copy");
        assert_kept(template);
        // The object's own annotation stays beside the two the webhook writes.
        let annotations = &out["metadata"]["annotations"];
        assert_eq!(
            annotations["offload.dev/framework"], "Generic",
            "{annotations}"
        );
        assert!(
            annotations[names::ANNOTATION_RESOLVED].is_string(),
            "{annotations}"
        );
        assert!(
            annotations[names::ANNOTATION_REASONS].is_string(),
            "{annotations}"
        );
    }
    // A Pod without annotations gets both.
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": opted_meta("p")});
    pod["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    pod["spec"] = with_newer_fields(json!({"spec": {"containers": [container()]}}))["spec"].clone();
    let r = admit(
        discrete_cluster(),
        paths::MUTATE_POD,
        review("", "v1", "Pod", "pods", "CREATE", pod.clone(), None),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(patch_of(&r).iter().all(|op| op["op"] != "remove"), "{r}");
    let out = patched(&pod, &r);
    assert_configured(&out, "cpu-copy");
    assert_kept(&out);
    assert!(
        out["metadata"]["annotations"][names::ANNOTATION_RESOLVED].is_string(),
        "{out}"
    );
}

#[tokio::test]
async fn pods_are_the_last_safety_net() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": opted_meta("p"), "spec": {"containers": [container()]}});
    let r = admit(
        discrete_cluster(),
        paths::MUTATE_POD,
        review("", "v1", "Pod", "pods", "CREATE", pod.clone(), None),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&pod, &r);
    assert_configured(&out, "cpu-copy");
    // An already configured pod passes unchanged.
    let r = admit(
        discrete_cluster(),
        paths::MUTATE_POD,
        review("", "v1", "Pod", "pods", "CREATE", out, None),
    )
    .await;
    assert!(r.get("patch").is_none_or(Value::is_null));
}

#[tokio::test]
async fn objects_that_cannot_be_configured_are_refused_with_the_reason() {
    let cases = [
        (
            "annotations",
            "offload.dev/mode",
            "UnifiedMemory",
            "needs a hardware-coherent node",
        ),
        (
            "annotations",
            "offload.dev/mode",
            "Sometimes",
            "annotation offload.dev/mode",
        ),
        (
            "labels",
            "offload.dev/profile",
            "missing",
            "OffloadProfile \"missing\" does not exist",
        ),
    ];
    for (map, key, value, expected) in cases {
        let mut meta = opted_meta("p");
        meta[map][key] = json!(value);
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [container()]}});
        let r = admit(
            discrete_cluster(),
            paths::MUTATE_POD,
            review("", "v1", "Pod", "pods", "CREATE", pod, None),
        )
        .await;
        assert_eq!(r["allowed"], false, "{map} {key}={value}: {r}");
        let message = r["status"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{map} {key}={value}: {message}");
    }

    let unknown = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": opted_meta("d"), "spec": {}});
    let r = admit(
        discrete_cluster(),
        paths::MUTATE_WORKLOAD,
        review(
            "apps",
            "v1",
            "Deployment",
            "deployments",
            "CREATE",
            unknown,
            None,
        ),
    )
    .await;
    assert_eq!(r["allowed"], false);
}

/// Job sizes crafted to overflow (JobSet's schema allows 5 × (2³¹−1) × (2³¹−1) pods, or any
/// unsigned 64-bit count before validation) get a clear denial naming the field; the handler
/// answered nothing before, closing the connection on an arithmetic overflow.
#[tokio::test]
async fn crafted_job_sizes_are_denied_with_the_field_named() {
    let max = i64::from(i32::MAX);
    let template =
        json!({"spec": {"parallelism": max, "template": {"spec": {"containers": [container()]}}}});
    let cases = [
        (
            ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
            json!({"replicatedJobs": [
                {"name": "a", "replicas": 5, "template": template},
                {"name": "b", "replicas": max, "template": template}
            ]}),
            "/spec/replicatedJobs",
        ),
        (
            ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
            json!({"replicatedJobs": [{"name": "a", "replicas": u64::MAX, "template":
                {"spec": {"parallelism": u64::MAX, "template": {"spec": {"containers": [container()]}}}}}]}),
            "/spec/replicatedJobs",
        ),
        (
            ("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
            json!({"pytorchReplicaSpecs": {
                "Master": {"replicas": u64::MAX, "template": {"spec": {"containers": [container()]}}},
                "Worker": {"replicas": u64::MAX, "template": {"spec": {"containers": [container()]}}}}}),
            "/spec/pytorchReplicaSpecs",
        ),
        (
            ("batch", "v1", "Job", "jobs"),
            json!({"parallelism": -3, "template": {"spec": {"containers": [container()]}}}),
            "/spec/parallelism",
        ),
    ];
    for ((group, version, kind, resource), spec, field) in cases {
        let obj = json!({"apiVersion": format!("{group}/{version}"), "kind": kind,
                         "metadata": opted_meta("big"), "spec": spec});
        let r = admit(
            discrete_cluster(),
            paths::MUTATE_WORKLOAD,
            review(group, version, kind, resource, "CREATE", obj, None),
        )
        .await;
        assert_eq!(r["allowed"], false, "{kind}: {r}");
        let message = r["status"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{kind}: {message}");
    }
}

/// Objects without the opt-in label pass unchanged even where a webhook configuration sends
/// them (the configurations select by the label; the handler does not rely on it).
#[tokio::test]
async fn unlabelled_objects_are_never_configured() {
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                     "spec": {"template": {"spec": {"containers": [container()]}}}});
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "spec": {"containers": [container()]}});
    for (path, r) in [
        (
            paths::MUTATE_WORKLOAD,
            review("batch", "v1", "Job", "jobs", "CREATE", job, None),
        ),
        (
            paths::MUTATE_POD,
            review("", "v1", "Pod", "pods", "CREATE", pod, None),
        ),
    ] {
        let r = admit(discrete_cluster(), path, r).await;
        assert_eq!(r["allowed"], true, "{path}: {r}");
        assert!(r.get("patch").is_none_or(Value::is_null), "{path}: {r}");
    }
}

/// A Pod whose GPUs come from a DRA claim: sized by the claim (here 4 GPUs, over which 20B
/// parameters fit an H200 node's GPUs without offload; on one GPU they would not), pinned by
/// the agent's labels as other kinds are; a claim whose template is missing is refused.
#[tokio::test]
async fn pods_with_gpu_claims_are_sized_by_them() {
    let mut report = NodeReport::parse(fixtures::H200_READING).unwrap();
    let gpu = report.gpus[0].clone();
    report.gpus = (0..4)
        .map(|i| offload_api::report::GpuReport {
            index: i,
            uuid: format!("{}-{i}", gpu.uuid),
            ..gpu.clone()
        })
        .collect();
    // Four GPUs on the node, handed out by DRA: the driver's slices say so (no device plugin).
    let mut driver = crate::dra::slices::DriverWitness {
        driver: "gpu.nvidia.com".into(),
        gpus: 4,
        ..Default::default()
    };
    driver.modes.insert("None", 4);
    let nodes = vec![
        NodeInfo::from_report("h200-0", &report)
            .with_allocatable(crate::index::Allocatable {
                memory: Some(1 << 40),
                gpus: None,
                cpus: None,
                ..Default::default()
            })
            .with_driver(driver),
    ];
    let template: crate::dra::api::ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "four", "namespace": "team-a"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 4}}]}}}
    }))
    .unwrap();
    let mut registry = Registry::default();
    let view = MemoryView {
        dra: Some(crate::dra::DraOptions::default()),
        claim_templates: BTreeMap::from([(
            ("team-a".to_string(), "four".to_string()),
            Arc::new(template),
        )]),
        ..MemoryView::new(
            nodes,
            BTreeMap::from([("default".to_string(), OffloadProfileSpec::default())]),
        )
    };
    let app = router(WebhookState {
        view: Arc::new(view),
        metrics: Metrics::new(&mut registry),
        configs: ConfigSource::Memory(BTreeMap::new()),
        events: None,
    });
    let pod = |template: &str| {
        let mut meta = opted_meta("p");
        meta["annotations"]["offload.dev/framework"] = json!("DeepSpeed");
        meta["annotations"]["offload.dev/framework-version"] = json!("0.19.8");
        meta["annotations"]["offload.dev/model-parameters"] = json!("20B");
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
               "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
                        "containers": [{"name": "train", "image": "train:1", "env": [{"name": "KEEP", "value": "me"}],
                                        "resources": {"claims": [{"name": "gpus"}]}}]}})
    };
    let r = admit(
        app.clone(),
        paths::MUTATE_POD,
        review("", "v1", "Pod", "pods", "CREATE", pod("four"), None),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&pod("four"), &r);
    assert_eq!(
        env_of(&out)["OFFLOAD_MODE"],
        "disabled",
        "fits over four GPUs: {out}"
    );
    // The same pod with one device-plugin GPU does not fit without offload.
    let mut one = pod("four");
    one["spec"]
        .as_object_mut()
        .unwrap()
        .remove("resourceClaims");
    one["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
    let r = admit(
        app.clone(),
        paths::MUTATE_POD,
        review("", "v1", "Pod", "pods", "CREATE", one.clone(), None),
    )
    .await;
    assert_eq!(
        env_of(&patched(&one, &r))["OFFLOAD_MODE"],
        "cpu-copy",
        "{r}"
    );
    let r = admit(
        app,
        paths::MUTATE_POD,
        review("", "v1", "Pod", "pods", "CREATE", pod("missing"), None),
    )
    .await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        r["status"]["message"].as_str().unwrap().contains("missing"),
        "{r}"
    );
}

/// A Megatron-core PyTorchJob carries its layout in annotations (as `spec.megatron` of a
/// TrainingJob): the flags its pods get follow the tensor-parallel size (a 20B GPT over two
/// GH200s, each holding half the model), a layout its GPUs cannot take is refused naming the
/// annotations, and a layout annotation on a job of another framework is refused.
#[tokio::test]
async fn megatron_pytorchjobs_take_their_layout_from_annotations() {
    let ptj = |annotations: Value| {
        let mut meta = opted_meta("gpt");
        meta["annotations"] = annotations;
        json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta,
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": {"spec": {"containers": [container()]}}},
            "Worker": {"replicas": 1, "template": {"spec": {"containers": [container()]}}}
        }}})
    };
    let megatron = |tensor: Option<&str>| {
        let mut a = json!({
            "offload.dev/framework": "Megatron", "offload.dev/framework-version": "0.14.0",
            "offload.dev/model-parameters": "18B", "offload.dev/architecture": "GPT",
            "offload.dev/hidden-size": "6144", "offload.dev/layers": "40",
            "offload.dev/tokens-per-step": "4096"});
        if let Some(t) = tensor {
            a["offload.dev/megatron-tensor-parallel"] = json!(t);
        }
        a
    };
    let admit_ptj = |object: Value| async move {
        let r = admit(
            coherent_cluster(),
            paths::MUTATE_WORKLOAD,
            review(
                "kubeflow.org",
                "v1",
                "PyTorchJob",
                "pytorchjobs",
                "CREATE",
                object.clone(),
                None,
            ),
        )
        .await;
        (object, r)
    };
    // A PyTorchJob of these annotations, refused: the webhook's message.
    let refusal = |annotations: Value| async move {
        let (_, r) = admit_ptj(ptj(annotations)).await;
        assert_eq!(r["allowed"], false, "{r}");
        r["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let fraction = |out: &Value| -> f64 {
        let env = env_of(&out["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]);
        let args: Vec<&str> = env["OFFLOAD_MEGATRON_ARGS"].split(' ').collect();
        assert!(args.contains(&"--use-distributed-optimizer"), "{args:?}");
        let at = args
            .iter()
            .position(|a| *a == "--optimizer-offload-fraction")
            .unwrap_or_else(|| panic!("no fraction: {args:?}"));
        args[at + 1].parse().unwrap()
    };
    let (object, split) = admit_ptj(ptj(megatron(Some("2")))).await;
    assert_eq!(split["allowed"], true, "{split}");
    let split = fraction(&patched(&object, &split));
    // Declared sequence parallel, every activation splits over the two: less is offloaded.
    let mut sequence = megatron(Some("2"));
    sequence["offload.dev/megatron-sequence-parallel"] = json!("true");
    let (object, r) = admit_ptj(ptj(sequence.clone())).await;
    assert_eq!(r["allowed"], true, "{r}");
    let with_sequence = fraction(&patched(&object, &r));
    assert!(with_sequence < split, "{with_sequence} against {split}");
    // Declared on Megatron-core's local layers, each layer's unfused attention holds its
    // sequence² scores: no less is offloaded. A value Megatron-LM does not take is refused.
    let mut local = sequence.clone();
    local["offload.dev/megatron-transformer-impl"] = json!("local");
    let (object, r) = admit_ptj(ptj(local.clone())).await;
    assert_eq!(r["allowed"], true, "{r}");
    let with_local = fraction(&patched(&object, &r));
    assert!(
        with_local >= with_sequence,
        "{with_local} against {with_sequence}"
    );
    // A training loop that does not run --manual-gc: no collection rendered, the first copy
    // counted (no less offloaded); a value that is not a boolean is refused.
    let mut no_gc = sequence.clone();
    no_gc["offload.dev/megatron-manual-gc"] = json!("false");
    let (object, r) = admit_ptj(ptj(no_gc.clone())).await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&object, &r);
    let env = env_of(&out["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]);
    assert!(
        !env["OFFLOAD_MEGATRON_ARGS"].contains("--manual-gc"),
        "{env:?}"
    );
    assert!(fraction(&out) >= with_sequence);
    no_gc["offload.dev/megatron-manual-gc"] = json!("sometimes");
    let message = refusal(no_gc).await;
    assert!(
        message.contains("offload.dev/megatron-manual-gc"),
        "{message}"
    );
    local["offload.dev/megatron-transformer-impl"] = json!("fused");
    let message = refusal(local).await;
    assert!(
        message.contains(
            "offload.dev/megatron-transformer-impl: \"fused\" is not local or transformer_engine"
        ),
        "{message}"
    );
    // An optimizer the hybrid device optimizer cannot take: the job that needs offload is
    // refused, naming the change; a value Megatron-LM does not take is refused too.
    let mut sgd = sequence.clone();
    sgd["offload.dev/megatron-optimizer"] = json!("sgd");
    let message = refusal(sgd.clone()).await;
    assert!(
        message.contains("takes --optimizer adam alone") && message.contains("Adam"),
        "{message}"
    );
    sgd["offload.dev/megatron-optimizer"] = json!("lion");
    let message = refusal(sgd).await;
    assert!(
        message.contains("offload.dev/megatron-optimizer: \"lion\" is not one of adam, sgd, muon"),
        "{message}"
    );
    // FP8 gathers with a recipe other than delayed, and Megatron-FSDP: refused the same way.
    let mut fp8 = sequence.clone();
    fp8["offload.dev/megatron-fp8-param-gather"] = json!("true");
    fp8["offload.dev/megatron-fp8-recipe"] = json!("tensorwise");
    let message = refusal(fp8.clone()).await;
    assert!(message.contains("--fp8-recipe delayed"), "{message}");
    fp8["offload.dev/megatron-fp8-recipe"] = json!("delayed");
    let (_, r) = admit_ptj(ptj(fp8)).await;
    assert_eq!(r["allowed"], true, "{r}");
    let mut fsdp = sequence.clone();
    fsdp["offload.dev/megatron-fsdp"] = json!("true");
    let message = refusal(fsdp).await;
    assert!(message.contains("Megatron-FSDP"), "{message}");
    // Without the annotation each GPU is read as holding the whole model (data-parallel over
    // two): it fits no GH200, and the refusal says which annotation would fit it.
    let message = refusal(megatron(None)).await;
    let placement = if split < 1.0 {
        format!("{:.0}% of the optimizer state offloaded", split * 100.0)
    } else {
        "the optimizer state offloaded".to_string()
    };
    assert!(
        message.contains(&format!(
            "tensor-parallel size 2 (1 now: spec.megatron.tensorParallel, or annotation offload.dev/megatron-tensor-parallel on other kinds) would fit as {placement}"
        )),
        "{message}"
    );

    // Three-way tensor parallel over two GPUs: no whole model-parallel group.
    let message = refusal(megatron(Some("3"))).await;
    assert!(
        message.contains("not a whole number of model-parallel groups")
            && message.contains("offload.dev/megatron-tensor-parallel"),
        "{message}"
    );
    // Out of bounds, and on a job of another framework.
    let message = refusal(megatron(Some("0"))).await;
    assert!(
        message.contains(
            "offload.dev/megatron-tensor-parallel: \"0\" is not a whole number from 1 to 1024"
        ),
        "{message}"
    );
    let mut deepspeed = megatron(Some("2"));
    deepspeed["offload.dev/framework"] = json!("DeepSpeed");
    deepspeed["offload.dev/framework-version"] = json!("0.19.8");
    let message = refusal(deepspeed).await;
    assert!(
        message.contains("describes a Megatron-core job"),
        "{message}"
    );
}
