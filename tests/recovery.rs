//! Recovery from out-of-memory in an install: the operator with its own admission webhook on
//! (registered with the real API server, served over TLS with its managed CA), so every write
//! the recovery makes — the status, the re-decided `spec.offload` — passes the webhook as it
//! does in a cluster. kwok ends the training pods as a process that runs out of memory does (a
//! stand-in for the training process, named as such: `offload.dev/kwok-out-of-memory`).

use offload_testenv::support;

use k8s_openapi::api::batch::v1::Job;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use offload_api::names;
use offload_api::v1alpha1::{JobPhase, MemoryKind, ModeSetting, OffloadProfile, TrainingJob};
use offload_testenv::fixtures;
use serde_json::json;
use support::controller::*;
use support::*;

/// The shared cluster with the operator and its webhook, a client and a fresh namespace.
async fn setup_with_webhook(prefix: &str) -> (Client, String) {
    let cluster = cluster(OPTIONS);
    operator_with_webhook(cluster);
    let client = client(cluster).await;
    let ns = namespace(&client, prefix).await;
    (client, ns)
}

/// Creates `tj`, retrying while the webhook's caches have not seen the test's profile or
/// node yet (it refuses what it cannot decide from, as it should).
async fn create_through_webhook(api: &Api<TrainingJob>, tj: &TrainingJob) {
    poll("the TrainingJob admitted", WAIT, || async {
        match api.create(&PostParams::default(), tj).await {
            Ok(_) => Some(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Some(()),
            Err(e) => {
                eprintln!("not admitted yet: {e}");
                None
            }
        }
    })
    .await;
}

/// TrainingJob `name` once it ran out of memory once and runs again, re-decided with offload.
async fn redecided_and_running(api: &Api<TrainingJob>, name: &str) -> TrainingJob {
    wait_list(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
        &format!("{name} re-decided, recreated and running"),
        WAIT,
        |jobs| {
            let tj = jobs.first()?;
            let s = tj.status.as_ref()?;
            (s.phase == Some(JobPhase::Running)
                && s.memory_failures.len() == 1
                && tj.spec.offload.mode == ModeSetting::CpuCopy)
                .then(|| TrainingJob::clone(tj))
        },
    )
    .await
}

/// The field managers that own `status.<field>` of `tj`.
fn owners_of(tj: &TrainingJob, field: &str) -> Vec<String> {
    tj.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:status"))
                .and_then(|s| s.get(format!("f:{field}")))
                .is_some()
        })
        .filter_map(|m| m.manager.clone())
        .collect()
}

#[tokio::test]
async fn one_gpu_oom_with_the_webhook_on_is_redecided_and_recreated() {
    let (client, ns) = setup_with_webhook("wh-oom").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // Without offload by the model; its pod runs out of GPU memory there, and runs with
    // offload.
    create_through_webhook(&api, &oom_job("mistral", &ns, "GPU", 32, 4096)).await;
    let running = redecided_and_running(&api, "mistral").await;
    let status = running.status.clone().unwrap();
    let failure = &status.memory_failures[0];
    assert_eq!(failure.kind, MemoryKind::Gpu);
    assert!(failure.configuration.starts_with("mode=Disabled"));
    // What PyTorch's allocator said: 134.10 GiB allocated + 3.99 GiB asked.
    let needed = failure.needed_bytes.unwrap() as f64 / f64::from(1u32 << 30);
    assert!((needed - 138.09).abs() < 0.01, "{needed}");
    let resolved = status
        .conditions
        .iter()
        .find(|c| c.type_ == "OffloadResolved")
        .unwrap();
    assert_eq!(resolved.status, "True", "{}", resolved.message);
    // The operator's write of the new spec carries the user's request: Auto stays Auto.
    let requested = running
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::ANNOTATION_REQUESTED))
        .cloned()
        .unwrap_or_default();
    let record: serde_json::Value = serde_json::from_str(&requested).unwrap();
    assert_eq!(record["requested"]["mode"], "Auto", "{requested}");
    assert_eq!(record["wrote"]["mode"], "CPUCopy", "{requested}");
    assert_eq!(
        status
            .offload
            .as_ref()
            .unwrap()
            .requested
            .as_ref()
            .unwrap()
            .mode,
        ModeSetting::Auto
    );
    // One writer per status field.
    for field in ["workload", "phase", "offload", "memoryFailures"] {
        let owners = owners_of(&running, field);
        assert_eq!(owners.len(), 1, "status.{field} owned by {owners:?}");
    }
    // The new workload runs the re-decided configuration, and a user's edit of the running
    // job's offload is still refused.
    let job = Api::<Job>::namespaced(client.clone(), &ns)
        .get("mistral")
        .await
        .unwrap();
    let env = &job.spec.unwrap().template.spec.unwrap().containers[0];
    assert!(
        env.env
            .iter()
            .flatten()
            .any(|e| e.name == "OFFLOAD_MODE" && e.value.as_deref() == Some("cpu-copy")),
        "{env:?}"
    );
    let edit = json!({"spec": {"offload": {"mode": "Disabled"}}});
    let refused = api
        .patch(
            "mistral",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&edit),
        )
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("cannot change once the workload exists"),
        "{refused}"
    );
}

#[tokio::test]
async fn gpu_oom_every_time_with_the_webhook_on_is_redecided_at_most_max_retries_then_held() {
    let (client, ns) = setup_with_webhook("wh-always").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    Api::<OffloadProfile>::all(client.clone())
        .create(
            &PostParams::default(),
            &pool_profile(&ns, &ns, json!({"maxMemoryRetries": 2})),
        )
        .await
        .unwrap();
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    create_through_webhook(&api, &oom_job("always", &ns, "GPUAlways", 32, 4096)).await;
    let cond = condition_when(&api, "always", "MemoryRecovery", "False").await;
    assert_eq!(cond.reason, "RetriesExhausted", "{}", cond.message);
    let tj = api.get("always").await.unwrap();
    let status = tj.status.unwrap();
    // Three configurations ran out: the first decision and two re-decisions, each a different
    // configuration, each with its figures.
    assert_eq!(
        status.memory_failures.len(),
        3,
        "{:?}",
        status.memory_failures
    );
    let configs: std::collections::BTreeSet<_> = status
        .memory_failures
        .iter()
        .map(|f| f.configuration.clone())
        .collect();
    assert_eq!(configs.len(), 3, "{configs:?}");
    assert!(
        status
            .memory_failures
            .iter()
            .all(|f| f.estimate_bytes.is_some() && f.needed_bytes.is_some())
    );
    assert!(
        cond.message.contains("maxMemoryRetries (2)"),
        "{}",
        cond.message
    );
    // Never refused by its own webhook on the way.
    let refused = status
        .conditions
        .iter()
        .any(|c| c.type_ == "OffloadResolved" && c.reason == "SpecPatchRefused");
    assert!(!refused, "{:?}", status.conditions);
}

/// Adds `runs` for `shape` on discrete nodes under `profile` to the operator's learned store
/// (the ConfigMap it keeps them in), as another replica's batch would: read, add, replace at
/// the read resourceVersion, again on a conflict.
async fn add_runs(
    client: &Client,
    profile: &str,
    shape: &str,
    runs: Vec<offload_operator::decision::runs::learned::Run>,
) {
    use k8s_openapi::api::core::v1::ConfigMap;
    use offload_operator::cluster::learned::{CONFIG_MAP, KEY};
    use offload_operator::decision::runs::learned::LearnedMemory;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    poll("the runs added to the learned store", WAIT, || async {
        let current = cms.get_opt(CONFIG_MAP).await.ok()?;
        let mut store = current
            .as_ref()
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get(KEY))
            .map_or_else(LearnedMemory::default, |t| LearnedMemory::parse(t).unwrap());
        for r in &runs {
            store
                .record(
                    profile,
                    offload_api::v1alpha1::NodeClass::Discrete,
                    shape,
                    "the test's shape",
                    r.clone(),
                )
                .unwrap();
        }
        let mut cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": CONFIG_MAP, "namespace": "default"},
            "data": {KEY: store.to_json().unwrap()}
        }))
        .unwrap();
        let written = match current {
            Some(c) => {
                cm.metadata.resource_version = c.metadata.resource_version;
                cms.replace(CONFIG_MAP, &PostParams::default(), &cm).await
            }
            None => cms.create(&PostParams::default(), &cm).await,
        };
        written.ok().map(|_| ())
    })
    .await;
}

#[tokio::test]
async fn a_trial_that_runs_out_with_the_webhook_on_goes_back_to_what_trained() {
    use offload_api::v1alpha1::StatePlacement;
    use offload_operator::decision::runs::learned::RanAs;
    use offload_operator::decision::runs::learned::Run;
    let (client, ns) = setup_with_webhook("wh-trial").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // The shape's decision by the model alone: a share of the optimizer state offloaded.
    create_through_webhook(&api, &oom_job("probe", &ns, "None", 40, 4096)).await;
    let probe = wait_for_condition(&api, "probe", "OffloadResolved", "True").await;
    let decided = probe.status.unwrap().offload.unwrap();
    assert_eq!(decided.placement, Some(StatePlacement::PartialOptimizer));
    let shape = decided.estimate.unwrap().shape.unwrap();
    let r0 = decided.offload_ratio;
    // Earlier runs of the shape: one ran out at that share, needing far more than the model
    // counts (a failure's lower bound lifts every later estimate past it); one trained with
    // 6 points more offloaded, needing less than the model counts.
    let now = jiff::Timestamp::now().to_string();
    let ran = |ratio: f64| RanAs {
        placement: StatePlacement::PartialOptimizer,
        ratio,
        ranks: 1,
        gpu_bytes: 150_754_820_096,
    };
    let r_trained = ((r0 + 0.06) * 100.0).round() / 100.0;
    add_runs(
        &client,
        &ns,
        &shape,
        vec![
            Run {
                job: format!("{ns}/failed/1"),
                activations: 3.0,
                host: None,
                failed: true,
                parameters: None,
                allocator: true,
                ran_as: Some(ran(r0)),
                trained: false,
                trial: false,
                step_seconds: None,
                at: now.clone(),
            },
            Run {
                job: format!("{ns}/trained/2"),
                activations: 0.9,
                host: None,
                failed: false,
                parameters: None,
                allocator: true,
                ran_as: Some(ran(r_trained)),
                trained: true,
                trial: false,
                step_seconds: None,
                at: now.clone(),
            },
        ],
    )
    .await;
    // The profile shows them once the operator has read them.
    poll("the profile shows the two runs", WAIT, || async {
        let p = Api::<OffloadProfile>::all(client.clone())
            .get(&ns)
            .await
            .ok()?;
        (p.status?.learned?.runs >= 2).then_some(())
    })
    .await;
    // The next job of the shape tries a faster share; its pod runs out (the stand-in fails a
    // trial's pods); it goes back to the share that trained, and runs.
    create_through_webhook(&api, &oom_job("trial", &ns, "Trial", 40, 4096)).await;
    let running = wait_list(
        api.clone(),
        watcher::Config::default().fields("metadata.name=trial"),
        "the trial run out, gone back to what trained, and running",
        WAIT,
        |jobs| {
            let tj = jobs.first()?;
            let s = tj.status.as_ref()?;
            (s.phase == Some(JobPhase::Running) && s.memory_failures.len() == 1)
                .then(|| TrainingJob::clone(tj))
        },
    )
    .await;
    let status = running.status.unwrap();
    let failure = &status.memory_failures[0];
    let tried: f64 = failure
        .configuration
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ratio="))
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("{}", failure.configuration));
    assert!(
        tried < r_trained - 0.015 && tried > r0 + 0.015,
        "a trial between {r0} and {r_trained}: {}",
        failure.configuration
    );
    let offload = status.offload.unwrap();
    assert!(offload.trial.is_none(), "{:?}", offload.trial);
    assert!(
        (offload.offload_ratio - r_trained).abs() < 1e-9,
        "back to {r_trained}: {}",
        offload.offload_ratio
    );
    // The configuration that trained decides it again, said by its code.
    assert!(
        offload.reasons.iter().any(|r| r.field == "mode"
            && r.code == Some(offload_api::v1alpha1::ReasonCode::ProvenByRuns)),
        "{:?}",
        offload.reasons
    );
    let recovery = status
        .conditions
        .iter()
        .find(|c| c.type_ == "MemoryRecovery")
        .unwrap();
    assert!(
        recovery
            .message
            .contains("a trial of a configuration faster"),
        "{}",
        recovery.message
    );
    let job = Api::<Job>::namespaced(client.clone(), &ns)
        .get("trial")
        .await
        .unwrap();
    let annotations = job
        .spec
        .unwrap()
        .template
        .metadata
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    assert!(
        !annotations.contains_key(names::ANNOTATION_TRIAL),
        "the recreated pods are no trial: {annotations:?}"
    );
    // An Event said the job was a trial, what trained and what it would go back to.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let said = poll("the trial's Event", WAIT, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("trial"))
            .find(|e| e.reason.as_deref() == Some(names::EVENT_TRIAL))
            .and_then(|e| e.note)
    })
    .await;
    assert!(
        said.starts_with("a trial (1 of at most") && said.contains("the job goes back to"),
        "{said}"
    );
    // No agent had a window of the trial's pod: its own termination message is the record, and
    // no later job of the shape goes as far.
    create_through_webhook(&api, &oom_job("next", &ns, "Trial", 40, 4096)).await;
    let next = wait_for_condition(&api, "next", "OffloadResolved", "True").await;
    let next = next.status.unwrap().offload.unwrap();
    assert!(
        next.offload_ratio > tried + 0.015,
        "the next job of the shape goes as far as the trial that ran out ({tried}): {} {:?}",
        next.offload_ratio,
        next.trial
    );
}

/// A Megatron-core job goes round the same recovery: decided without offload, its pod runs out
/// of GPU memory (PyTorch's text), and it is re-decided with the hybrid device optimizer — the
/// recreated workload's OFFLOAD_MEGATRON_ARGS carry the fraction — through the operator's own
/// webhook.
#[tokio::test]
async fn a_megatron_job_that_runs_out_is_redecided_with_an_offload_fraction() {
    let (client, ns) = setup_with_webhook("wh-megatron").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut tj = oom_job("gpt", &ns, "GPU", 24, 4096);
    tj.spec.framework =
        serde_json::from_value(json!({"name": "Megatron", "version": "0.14.0"})).unwrap();
    create_through_webhook(&api, &tj).await;
    let running = redecided_and_running(&api, "gpt").await;
    let status = running.status.unwrap();
    assert!(
        status.memory_failures[0]
            .configuration
            .starts_with("mode=Disabled")
    );
    let ratio = status.offload.as_ref().unwrap().offload_ratio;
    assert!(ratio > 0.0 && ratio <= 1.0, "{ratio}");
    let job = Api::<Job>::namespaced(client.clone(), &ns)
        .get("gpt")
        .await
        .unwrap();
    let container = &job.spec.unwrap().template.spec.unwrap().containers[0];
    let args = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "OFFLOAD_MEGATRON_ARGS")
        .and_then(|e| e.value.clone())
        .unwrap_or_default();
    assert!(
        args.contains("--optimizer-cpu-offload")
            && args.contains(&format!(
                "--optimizer-offload-fraction {}",
                offload_operator::render::format_ratio(ratio)
            )),
        "{args}"
    );
}
