//! The operator's Events, written through the core `v1` Events API with `firstTimestamp`,
//! `lastTimestamp` and `count`, as the kubelet and the upstream controllers write theirs, so
//! `kubectl get events` shows when each happened and `--sort-by=.lastTimestamp` sorts them.
//! (The `events.k8s.io/v1` API refuses those fields on create, and kube's own recorder writes
//! only `eventTime`, which `kubectl get events` lists as `<nil>`.)
//!
//! The same Event repeated on the same object within [`REPEAT_WINDOW`] is one Event whose count
//! and `lastTimestamp` move, as client-go's correlator does; at most [`MAX_REMEMBERED`] of them
//! are remembered (the oldest forgotten first), so a storm of distinct Events cannot grow the
//! process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
pub use kube::runtime::events::{Event, EventType, Reporter};
use serde_json::json;

/// How long a repeated Event counts into the one before it.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(600);
/// Most distinct Events remembered for counting repeats.
pub const MAX_REMEMBERED: usize = 4096;

/// What makes two Events the same: the object, the type, the reason and the note.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    kind: String,
    name: String,
    uid: String,
    type_: &'static str,
    reason: String,
    note: String,
}

#[derive(Clone, Debug)]
struct Seen {
    /// The Event's name.
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes Events for one reporter (a controller or the webhook); cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
    seen: Arc<Mutex<HashMap<Key, Seen>>>,
}

fn type_str(t: EventType) -> &'static str {
    match t {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

impl Recorder {
    /// A recorder writing as `reporter` over `client`.
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Recorder {
            client,
            reporter,
            seen: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Seen>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes `ev` on the object `reference` names: a new Event, or the count and time of the
    /// same one written within [`REPEAT_WINDOW`].
    pub async fn publish(
        &self,
        ev: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let namespace = reference
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let key = Key {
            namespace: namespace.clone(),
            kind: reference.kind.clone().unwrap_or_default(),
            name: reference.name.clone().unwrap_or_default(),
            uid: reference.uid.clone().unwrap_or_default(),
            type_: type_str(ev.type_),
            reason: ev.reason.clone(),
            note: ev.note.clone().unwrap_or_default(),
        };
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &namespace);
        let now = Timestamp::now();
        let repeat = self
            .lock()
            .get(&key)
            .filter(|s| now.duration_since(s.last).unsigned_abs() < REPEAT_WINDOW)
            .cloned();
        if let Some(seen) = repeat {
            let count = seen.count.saturating_add(1);
            let patch = json!({"count": count, "lastTimestamp": Time(now)});
            match api
                .patch(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.remember(key, seen.name, count, now);
                    return Ok(());
                }
                // Gone (expired, or deleted): write a new one.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let object = key.name.clone();
        let event = CoreEvent {
            metadata: ObjectMeta {
                // As client-go names them: the object's name and a unique suffix.
                name: Some(format!(
                    "{}.{:x}",
                    object.chars().take(200).collect::<String>(),
                    now.as_nanosecond()
                )),
                namespace: Some(namespace),
                ..ObjectMeta::default()
            },
            involved_object: reference.clone(),
            reason: Some(ev.reason.clone()),
            message: ev.note.clone(),
            type_: Some(key.type_.to_string()),
            action: Some(ev.action.clone()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            reporting_component: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            source: Some(EventSource {
                component: Some(self.reporter.controller.clone()),
                host: None,
            }),
            related: ev.secondary.clone(),
            series: None,
        };
        let created = api.create(&PostParams::default(), &event).await?;
        self.remember(key, created.metadata.name.unwrap_or_default(), 1, now);
        Ok(())
    }

    fn remember(&self, key: Key, name: String, count: i32, last: Timestamp) {
        let mut seen = self.lock();
        if seen.len() >= MAX_REMEMBERED
            && !seen.contains_key(&key)
            && let Some(oldest) = seen
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone())
        {
            seen.remove(&oldest);
        }
        seen.insert(key, Seen { name, count, last });
    }
}
