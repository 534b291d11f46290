//! What a TrainingJob's status says in the cases that went wrong before: a stale cached copy,
//! a large DeepSpeed config, a workload the API server refuses, a job that did not opt in.

use offload_testenv::support;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};
use offload_api::v1alpha1::{ModeSetting, TrainingJob};
use offload_testenv::fixtures;
use serde_json::json;
use support::controller::*;

#[tokio::test]
async fn a_job_that_did_not_opt_in_runs_without_offload_and_says_so() {
    let (_cluster, client, ns) = setup("optout").await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut tj = training_job("plain", "x", json!({"name": "Generic"}), json!({}));
    tj.metadata.annotations = None;
    api.create(&PostParams::default(), &tj).await.unwrap();
    // Our own kind is never left silent: it runs as written, and its status says why it has no
    // offload configuration.
    wait_for_condition(&api, "plain", "WorkloadCreated", "True").await;
    let plain = api.get("plain").await.unwrap();
    let status = plain.status.unwrap();
    let held = status
        .conditions
        .iter()
        .find(|c| c.type_ == "OffloadResolved")
        .unwrap();
    assert_eq!(
        (held.status.as_str(), held.reason.as_str()),
        ("False", "NotRequested")
    );
    assert!(
        held.message.contains("runs without offload configuration"),
        "{}",
        held.message
    );
    assert!(status.offload.is_none());
    assert_eq!(
        plain.spec.offload.mode,
        ModeSetting::Auto,
        "the spec is not touched"
    );
    let job = Api::<Job>::namespaced(client.clone(), &ns)
        .get("plain")
        .await
        .unwrap();
    let container = &job.spec.unwrap().template.spec.unwrap().containers[0];
    let env: Vec<&str> = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert!(env.contains(&"USER_SETTING"), "{env:?}");
    assert!(
        !env.iter().any(|e| e.starts_with("OFFLOAD_")),
        "no offload env for a job that asked for none: {env:?}"
    );
}

/// A second reconcile working from a stale cached copy (the job as created, no status yet)
/// must not drop the decision another write just recorded: 7 of 187 jobs lost
/// `status.offload` and `OffloadResolved` that way when one writer applied the whole status.
#[tokio::test]
async fn a_stale_copy_never_drops_the_recorded_decision() {
    let (_cluster, client, ns) = setup("stale").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let stale = create_training_job(&api, "late", &ns, json!({"name": "Generic"}), json!({})).await;
    let resolved = wait_for_condition(&api, "late", "WorkloadCreated", "True").await;
    assert!(resolved.status.as_ref().unwrap().offload.is_some());

    // The reconcile a stale cache would run: it finds the workload and follows it.
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = offload_operator::ops::metrics::Metrics::new(&mut registry);
    let (caches, _not_driven) = offload_operator::cluster::caches::Caches::new(
        &client,
        metrics.clone(),
        Some(&Default::default()),
    );
    let ctx = offload_operator::controller::Context::new(client.clone(), &caches, metrics, "test");
    offload_operator::controller::reconcile_job(&stale, &ctx)
        .await
        .unwrap();

    let after = api.get("late").await.unwrap();
    let status = after.status.unwrap();
    assert!(
        status.offload.is_some(),
        "status.offload dropped: {status:?}"
    );
    for (kind, want) in [("OffloadResolved", "True"), ("WorkloadCreated", "True")] {
        assert!(
            status
                .conditions
                .iter()
                .any(|c| c.type_ == kind && c.status == want),
            "{kind} lost: {:?}",
            status.conditions
        );
    }
}

/// A legal DeepSpeed config of 680 KB (compact) fits a ConfigMap once merged: it was
/// pretty-printed to over 3 MiB, refused by the API server every few seconds, and the job's
/// status stayed empty.
#[tokio::test]
async fn a_large_deepspeed_config_is_merged_compactly() {
    let (_cluster, client, ns) = setup("bigds").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let partition = vec![1u8; 340_000];
    let user = json!({"zero_optimization": {"stage": 3}, "pipeline": {"partition": partition}});
    let text = user.to_string();
    assert!(text.len() > 600_000, "{} bytes", text.len());
    add_deepspeed_config(&client, &ns, "big-ds", &text).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    create_training_job(
        &api,
        "big",
        &ns,
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
        json!({"deepspeed": {"configMapRef": {"name": "big-ds"}}}),
    )
    .await;
    wait_for_condition(&api, "big", "WorkloadCreated", "True").await;
    let merged = rendered_deepspeed_config(&client, &ns, "big").await;
    assert_eq!(
        merged["pipeline"]["partition"].as_array().unwrap().len(),
        340_000
    );
    assert_eq!(
        merged["zero_optimization"]["offload_optimizer"]["device"],
        "cpu"
    );
}

/// A workload the API server refuses for a reason that will not pass on its own (here a
/// container without an image) is shown on the TrainingJob, with the server's message.
#[tokio::test]
async fn a_refused_workload_is_a_condition_with_the_servers_message() {
    let (_cluster, client, ns) = setup("refused").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut tj = training_job("noimage", &ns, json!({"name": "Generic"}), json!({}));
    if let Some(spec) = tj.spec.template.spec.as_mut() {
        spec.containers[0].image = None;
    }
    api.create(&PostParams::default(), &tj).await.unwrap();
    let held = wait_for_condition(&api, "noimage", "WorkloadCreated", "False").await;
    let status = held.status.unwrap();
    let cond = status
        .conditions
        .iter()
        .find(|c| c.type_ == "WorkloadCreated")
        .unwrap();
    assert_eq!(cond.reason, "ApplyFailed");
    assert!(
        cond.message.contains("applying the workload Job failed") && cond.message.contains("image"),
        "{}",
        cond.message
    );
    assert!(status.offload.is_some(), "the decision itself stands");
}

/// The operator's Events carry the times `kubectl get events` shows and sorts by
/// (`firstTimestamp`, `lastTimestamp`, `count`), and the same Event repeated on one object is
/// one Event whose count moves.
#[tokio::test]
async fn events_carry_the_time_kubectl_sorts_by_and_repeats_are_counted() {
    use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent};
    use kube::Resource;
    use offload_operator::ops::events::{Event, EventType, Recorder, Reporter};

    let (cluster, client, ns) = setup("events").await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut tj = training_job("timed", "x", json!({"name": "Generic"}), json!({}));
    tj.metadata.annotations = None;
    api.create(&PostParams::default(), &tj).await.unwrap();
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), &ns);
    let created = support::poll(
        "the operator's WorkloadCreated Event",
        std::time::Duration::from_secs(60),
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.involved_object.name.as_deref() == Some("timed")
                    && e.reason.as_deref() == Some("WorkloadCreated")
            })
        },
    )
    .await;
    assert!(created.last_timestamp.is_some() && created.first_timestamp.is_some());
    assert_eq!(created.count, Some(1));
    let shown = support::kubectl(
        cluster,
        &["-n", &ns, "get", "events", "--sort-by=.lastTimestamp"],
    );
    let line = shown
        .lines()
        .find(|l| l.contains("WorkloadCreated"))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(
        !line.contains("<nil>") && !line.contains("<unknown>"),
        "kubectl shows when it happened: {shown}"
    );

    // The same Event twice on one object: one Event, counted twice; another note: another Event.
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "target"}})).unwrap(),
        )
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "offload-operator".into(),
            instance: None,
        },
    );
    let event = |note: &str| Event {
        type_: EventType::Warning,
        reason: "Repeated".into(),
        note: Some(note.into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    let reference = cm.object_ref(&());
    for note in ["the same", "the same", "another"] {
        recorder.publish(&event(note), &reference).await.unwrap();
    }
    let mine: Vec<CoreEvent> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Repeated"))
        .collect();
    assert_eq!(mine.len(), 2, "{mine:?}");
    let same = mine
        .iter()
        .find(|e| e.message.as_deref() == Some("the same"))
        .unwrap();
    assert_eq!(same.count, Some(2));
    assert!(same.last_timestamp >= same.first_timestamp);
}
