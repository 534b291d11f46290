//! Events on the objects of other kinds the webhook configured, so their owners see why
//! (`kubectl describe job`), as a TrainingJob's status says it. The object does not exist yet
//! while it is admitted: a small pool of workers waits for it to appear (bounded) and then
//! records the Event against its uid. The queue is bounded: in a burst an Event may be
//! skipped (counted in the log), never the admission slowed.

use std::time::Duration;

use crate::ops::events::{Event, EventType, Recorder, Reporter};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use tokio::sync::mpsc;

/// Events waiting to be written.
const QUEUE: usize = 1024;
/// Workers writing them.
const WORKERS: usize = 4;
/// How long a worker waits for the object to appear.
const WAIT_FOR_OBJECT: Duration = Duration::from_secs(15);

/// One Event to record on an object being created.
#[derive(Clone, Debug)]
pub struct Pending {
    /// Group, version and kind of the object.
    pub gvk: GroupVersionKind,
    /// Its resource (plural).
    pub plural: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The Event's reason (`OffloadConfigured`).
    pub reason: &'static str,
    /// The Event's note (capped at 1 kB by the API server).
    pub note: String,
}

/// Where the webhook sends the Events it wants written.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Pending>,
}

impl EventSink {
    /// Starts the workers over `client`.
    pub fn start(client: kube::Client, reporter: &str) -> EventSink {
        let (tx, rx) = mpsc::channel(QUEUE);
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: reporter.to_string(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..WORKERS {
            let (rx, client, recorder) = (rx.clone(), client.clone(), recorder.clone());
            tokio::spawn(async move {
                loop {
                    let next = rx.lock().await.recv().await;
                    let Some(p) = next else { break };
                    write(&client, &recorder, p).await;
                }
            });
        }
        EventSink { tx }
    }

    /// Queues an Event; a full queue drops it (logged).
    pub fn send(&self, p: Pending) {
        if let Err(e) = self.tx.try_send(p) {
            tracing::warn!(error = %e, "an Event on a configured object was skipped");
        }
    }
}

async fn write(client: &kube::Client, recorder: &Recorder, p: Pending) {
    let resource = ApiResource::from_gvk_with_plural(&p.gvk, &p.plural);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &p.namespace, &resource);
    let deadline = tokio::time::Instant::now() + WAIT_FOR_OBJECT;
    let mut pause = Duration::from_millis(50);
    let object = loop {
        match api.get_opt(&p.name).await {
            Ok(Some(o)) => break Some(o),
            Ok(None) | Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            _ => break None,
        }
    };
    let Some(object) = object else {
        tracing::debug!(kind = %p.gvk.kind, name = %p.name, "the configured object never appeared: no Event");
        return;
    };
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(resource.api_version.clone()),
        kind: Some(p.gvk.kind.clone()),
        name: Some(p.name.clone()),
        namespace: Some(p.namespace.clone()),
        uid: object.metadata.uid.clone(),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: p.reason.to_string(),
        note: Some(p.note.chars().take(1000).collect()),
        action: "Admit".to_string(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::warn!(error = %e, "could not publish an Event on a configured object");
    }
}
