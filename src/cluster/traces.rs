//! Where the sizer's traces are kept: one ConfigMap per traced step in the operator's own
//! namespace (label [`names::LABEL_TRACE`], the step's key), read by every replica through a
//! watch and used by every decision of that step — the controller's, the webhook's — so a step
//! is traced once.
//!
//! A trace made from the chart's sizer image is the cluster's (`offload-trace-KEY`); one made
//! from a job's own image holds only for its namespace (`offload-trace-KEY-NS`, NS a digest of
//! the namespace): a tenant's image never sizes another tenant's jobs. A failure is kept the
//! same way, so the jobs of a step that cannot be traced are not held by it again, until
//! [`crate::sizer::SizerOptions::retry_after`] has passed.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::decision::{SizerRequest, TraceInput};
use crate::sizer::SizerOptions;
use offload_api::names;
use offload_api::trace::{MAX_TRACE_BYTES, ModelTrace, SizerFailure, TraceError};

/// The key a trace is kept under in its ConfigMap.
pub const TRACE_KEY: &str = "trace.json";
/// The key a failure is kept under instead.
pub const FAILURE_KEY: &str = "failure.json";

/// Whose a trace is: the cluster's, or one namespace's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Made from the chart's sizer image: any job of the step may use it.
    Cluster,
    /// Made from a job's own image: only jobs of this namespace.
    Namespace(&'a str),
}

/// The name of the ConfigMap that keeps the trace of the step `key` for `scope`.
pub fn config_map_name(key: &str, scope: Scope<'_>) -> String {
    match scope {
        Scope::Cluster => format!("offload-trace-{key}"),
        Scope::Namespace(ns) => {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(ns.as_bytes());
            let short: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
            format!("offload-trace-{key}-{short}")
        }
    }
}

/// The traces, as one replica sees them.
#[derive(Clone)]
pub struct TraceStore {
    options: Arc<SizerOptions>,
    store: Store<ConfigMap>,
    writer: Arc<std::sync::Mutex<Option<reflector::store::Writer<ConfigMap>>>>,
}

impl std::fmt::Debug for TraceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceStore")
            .field("options", &self.options)
            .field("traces", &self.store.state().len())
            .finish()
    }
}

impl TraceStore {
    /// An empty store; [`TraceStore::watch`] fills it.
    pub fn new(options: SizerOptions) -> Self {
        let (store, writer) = reflector::store();
        TraceStore {
            options: Arc::new(options),
            store,
            writer: Arc::new(std::sync::Mutex::new(Some(writer))),
        }
    }

    /// Waits until the traces have been listed once; `false` where the store was dropped first.
    pub async fn wait_synced(&self) -> bool {
        self.store.wait_until_ready().await.is_ok()
    }

    /// How the sizer runs.
    pub fn options(&self) -> &SizerOptions {
        &self.options
    }

    /// The trace of `step` a job in `namespace` may use: its namespace's, else the cluster's; a
    /// failure remembered within [`SizerOptions::retry_after`]; `None` where there is neither
    /// (the sizer is still to run).
    pub fn lookup(&self, namespace: &str, step: &SizerRequest, now: jiff::Timestamp) -> TraceInput {
        self.lookup_key(namespace, &step.key(), now)
    }

    /// [`TraceStore::lookup`] by the step's key.
    pub fn lookup_key(&self, namespace: &str, key: &str, now: jiff::Timestamp) -> TraceInput {
        for scope in [Scope::Namespace(namespace), Scope::Cluster] {
            let name = config_map_name(key, scope);
            let Some(cm) = self
                .store
                .get(&ObjectRef::new(&name).within(&self.options.namespace))
            else {
                continue;
            };
            if let Some(input) = read(&cm, &self.options, now) {
                return input;
            }
        }
        TraceInput::None
    }

    /// Watches the trace ConfigMaps until `stop` (every replica).
    pub async fn watch(&self, client: Client, stop: CancellationToken) {
        let Some(writer) = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let api: Api<ConfigMap> = Api::namespaced(client, &self.options.namespace);
        let stream = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default().labels(names::LABEL_TRACE)).default_backoff(),
        )
        .applied_objects();
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                next = stream.next() => match next {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => tracing::debug!(error = %e, "watching the trace ConfigMaps"),
                    None => return,
                },
            }
        }
    }

    /// Keeps the trace of the step `key` (or why there is none) for `scope`, made from `image`: server-side
    /// apply under the operator's field manager, so a retry or a second replica writes the same.
    pub async fn keep(
        &self,
        client: &Client,
        key: &str,
        scope: Scope<'_>,
        image: &str,
        result: &Result<ModelTrace, SizerFailure>,
    ) -> Result<(), kube::Error> {
        let (data_key, text) = match result {
            Ok(t) => (TRACE_KEY, serde_json::to_string(t)),
            Err(f) => (FAILURE_KEY, serde_json::to_string(f)),
        };
        let text = text.unwrap_or_default();
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(config_map_name(key, scope)),
                namespace: Some(self.options.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    names::LABEL_TRACE.to_string(),
                    key.to_string(),
                )])),
                annotations: Some(BTreeMap::from([
                    (
                        names::ANNOTATION_TRACED_AT.to_string(),
                        jiff::Timestamp::now().to_string(),
                    ),
                    (
                        names::ANNOTATION_TRACED_BY.to_string(),
                        offload_api::text::bounded_to(image, 512),
                    ),
                ])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(data_key.to_string(), text)])),
            ..Default::default()
        };
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &self.options.namespace);
        api.patch(
            &cm.name_any(),
            &PatchParams::apply(names::OPERATOR_MANAGER).force(),
            &Patch::Apply(&cm),
        )
        .await
        .map(|_| ())
    }
}

/// What a trace ConfigMap holds for a decision: its trace, or its failure while it is recent;
/// `None` for an old failure (tried again) or a ConfigMap that holds neither.
fn read(cm: &ConfigMap, options: &SizerOptions, now: jiff::Timestamp) -> Option<TraceInput> {
    let data = cm.data.as_ref()?;
    if let Some(text) = data.get(TRACE_KEY) {
        return Some(match ModelTrace::parse(text) {
            Ok(t) => TraceInput::Traced(Arc::new(t)),
            Err(e) => TraceInput::Untraced(format!(
                "the kept trace {} cannot be used ({e}): delete it to trace the step again",
                cm.name_any()
            )),
        });
    }
    let text = data
        .get(FAILURE_KEY)
        .filter(|t| t.len() <= MAX_TRACE_BYTES)?;
    let at: Option<jiff::Timestamp> = cm
        .annotations()
        .get(names::ANNOTATION_TRACED_AT)
        .and_then(|t| t.parse().ok());
    let age = at.map(|at| now.duration_since(at).as_secs_f64());
    let retry = options.retry_after.as_secs_f64();
    // A failure without a time, or from the future beyond a clock's skew, is taken as old.
    if age.is_none_or(|a| !(-600.0..=retry).contains(&a)) {
        return None;
    }
    let failure: SizerFailure = serde_json::from_str(text).unwrap_or_else(|e| SizerFailure {
        code: "UnreadableFailure".into(),
        message: e.to_string(),
    });
    Some(TraceInput::Untraced(
        TraceError::Sizer(SizerFailure {
            code: offload_api::text::bounded_to(&failure.code, 64),
            message: offload_api::text::bounded_to(&failure.message, 512),
        })
        .to_string(),
    ))
}

#[cfg(test)]
mod tests;
