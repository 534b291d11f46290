//! The admission webhook: axum over rustls, in the operator's process on its own port.
//!
//! Every endpoint parses the AdmissionReview envelope first. An unreadable envelope gets HTTP
//! 400 with a JSON error; anything wrong inside a readable envelope gets HTTP 200 with
//! `allowed: false`, the request uid kept, and a message that names the field to change.

pub mod admit;
pub mod events;
pub mod kinds;
pub mod sizer_wait;
pub mod tls;

use offload_api::names;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::decision::referenced::{self, Fetched, Reference};
use crate::decision::{ModelConfigError, ModelShape};
use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum_server::accept::NoDelayAcceptor;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use kube::Client;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use tokio_util::sync::CancellationToken;

use crate::cluster::view::AdmissionView;
use crate::ops::metrics::{AdmissionLabels, DenialLabels, Metrics};
use crate::render;
use admit::{Review, Verdict};

/// How long the webhook waits for a request's whole body, and for its headers: the API server
/// gives a webhook at most 30 s (10 by default), so a slower client is not the API server.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest AdmissionReview the webhook reads. The API server stores objects of up to about
/// 1.5 MiB and accepts request bodies of up to 3 MiB; a review of an UPDATE carries the old and
/// the new object, JSON-escaped inside the envelope. Anything it can send must fit.
pub const MAX_REVIEW_BYTES: usize = 16 * 1024 * 1024;

/// Paths of the endpoints (the webhook configurations in the chart point at these).
pub mod paths {
    /// Validating TrainingJob.
    pub const VALIDATE_TRAINING_JOB: &str = "/validate/trainingjob";
    /// Validating OffloadProfile.
    pub const VALIDATE_PROFILE: &str = "/validate/offloadprofile";
    /// Mutating TrainingJob.
    pub const MUTATE_TRAINING_JOB: &str = "/mutate/trainingjob";
    /// Mutating batch Job, JobSet, PyTorchJob, TrainJob.
    pub const MUTATE_WORKLOAD: &str = "/mutate/workload";
    /// Mutating Pod.
    pub const MUTATE_POD: &str = "/mutate/pod";
    /// Every endpoint's path.
    pub const ALL: [&str; 5] = [
        VALIDATE_TRAINING_JOB,
        VALIDATE_PROFILE,
        MUTATE_TRAINING_JOB,
        MUTATE_WORKLOAD,
        MUTATE_POD,
    ];
}

/// Shared state of the handlers.
#[derive(Clone)]
pub struct WebhookState {
    /// The cluster view decisions are made against.
    pub view: Arc<dyn AdmissionView>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Where the DeepSpeed ConfigMap a TrainingJob under review references is read from (the
    /// ZeRO stage it states decides what the job can take).
    pub configs: ConfigSource,
    /// Where Events on configured objects of other kinds go (`None`: none are written).
    pub events: Option<events::EventSink>,
}

/// Where the webhook reads the DeepSpeed configs that TrainingJobs reference.
#[derive(Clone, Default)]
pub enum ConfigSource {
    /// From the API server.
    Api(kube::Client),
    /// From memory, by ConfigMap name (tests and tools without an API server).
    Memory(std::collections::BTreeMap<String, String>),
    /// Nowhere: TrainingJobs are decided without their configs.
    #[default]
    None,
}

/// How long a TrainingJob review waits for its DeepSpeed ConfigMap before deciding without it.
const CONFIG_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Fetches ConfigMap `name` of the review's namespace from `source` (the in-memory source holds
/// each ConfigMap's file, which stands for the key the job references).
async fn fetch(
    source: &ConfigSource,
    req: &AdmissionRequest<DynamicObject>,
    r: &Reference,
) -> Fetched {
    match source {
        ConfigSource::None => Fetched::Unreadable("the webhook reads no ConfigMaps".into()),
        ConfigSource::Memory(configs) => configs.get(&r.name).map_or(Fetched::Absent, |text| {
            Fetched::Found(Box::new(referenced::config_map_of(&r.name, &r.key, text)))
        }),
        ConfigSource::Api(client) => {
            let ns = req.namespace.as_deref().unwrap_or("default");
            let read = crate::cluster::referenced::fetch(client, ns, r);
            match tokio::time::timeout(CONFIG_READ_TIMEOUT, read).await {
                Err(_) => Fetched::Unreadable(format!(
                    "no answer from the API server within {CONFIG_READ_TIMEOUT:?}"
                )),
                Ok(Err(e)) => Fetched::Unreadable(e.to_string()),
                Ok(Ok(fetched)) => fetched,
            }
        }
    }
}

/// The DeepSpeed config a TrainingJob under review references, when it exists, can be read in
/// time and parses. Anything else is left to the controller, which holds the job with the
/// reason (the user may still fix the ConfigMap).
async fn referenced_config(
    source: &ConfigSource,
    req: &AdmissionRequest<DynamicObject>,
) -> Option<crate::decision::UserConfig> {
    let (r, _) = Reference::of_json(&req.object.as_ref()?.data);
    let r = r?;
    let ns = req.namespace.clone().unwrap_or_else(|| "default".into());
    r.user_config(&ns, fetch(source, req, &r).await).ok()
}

/// The model `config.json` the object under review references — a TrainingJob's
/// `spec.model.configMapRef`, another kind's annotation `offload.dev/model-config` — read and
/// parsed; `Ok(None)` when it references none.
async fn referenced_model(
    source: &ConfigSource,
    req: &AdmissionRequest<DynamicObject>,
    training_job: bool,
) -> Result<Option<ModelShape>, ModelConfigError> {
    let Some(obj) = req.object.as_ref() else {
        return Ok(None);
    };
    let r = if training_job {
        Reference::of_json(&obj.data).1
    } else {
        obj.metadata
            .annotations
            .as_ref()
            .and_then(Reference::model_annotation)
    };
    let Some(r) = r else {
        return Ok(None);
    };
    let ns = req.namespace.clone().unwrap_or_else(|| "default".into());
    r.model_shape(&ns, fetch(source, req, &r).await).map(Some)
}

type Handler = fn(&AdmissionRequest<DynamicObject>, &Review) -> Verdict;

/// Each endpoint: its path, its name in metrics and logs, and its handler.
const ENDPOINTS: [(&str, &str, Handler); 5] = [
    (
        paths::VALIDATE_TRAINING_JOB,
        "validate-trainingjob",
        admit::validate_training_job,
    ),
    (
        paths::VALIDATE_PROFILE,
        "validate-offloadprofile",
        admit::validate_profile,
    ),
    (
        paths::MUTATE_TRAINING_JOB,
        "mutate-trainingjob",
        admit::mutate_training_job,
    ),
    (
        paths::MUTATE_WORKLOAD,
        "mutate-workload",
        admit::mutate_workload,
    ),
    (paths::MUTATE_POD, "mutate-pod", admit::mutate_pod),
];

/// The webhook router. Built in the library so tests drive it in-process.
pub fn router(state: WebhookState) -> Router {
    ENDPOINTS
        .into_iter()
        .fold(Router::new(), |router, (path, endpoint, handler)| {
            router.route(
                path,
                post(move |s: State<WebhookState>, b: Bytes| handle(s, b, endpoint, handler)),
            )
        })
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .layer(tower_http::timeout::RequestBodyDeadlineLayer::new(
            READ_TIMEOUT,
        ))
        .with_state(state)
}

/// Just enough of an AdmissionReview to answer it: its version and the request's uid. Read
/// without building the object (serde_json skips values with no depth limit), so an object
/// nested too deep to read still gets a denial that keeps its uid.
#[derive(serde::Deserialize)]
struct Envelope {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<EnvelopeRequest>,
}

#[derive(serde::Deserialize)]
struct EnvelopeRequest {
    uid: String,
}

/// The only AdmissionReview version the webhook configurations ask the API server for.
const REVIEW_VERSION: &str = "admission.k8s.io/v1";

/// A denial of an object that could not be read, keeping the request's uid.
fn unreadable_object(uid: &str, message: String) -> Response {
    axum::Json(serde_json::json!({
        "apiVersion": REVIEW_VERSION,
        "kind": "AdmissionReview",
        "response": {
            "uid": uid,
            "allowed": false,
            "status": {"status": "Failure", "code": 400, "reason": "BadRequest", "message": message}
        }
    }))
    .into_response()
}

fn bad_request(message: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(serde_json::json!({"error": message})),
    )
        .into_response()
}

async fn handle(
    State(state): State<WebhookState>,
    body: Bytes,
    endpoint: &'static str,
    f: Handler,
) -> Response {
    let start = Instant::now();
    let labels = AdmissionLabels { endpoint };
    state
        .metrics
        .admission_requests
        .get_or_create(&labels)
        .inc();
    let req = match read_request(&state, &body, endpoint) {
        Ok(req) => req,
        Err(answer) => return *answer,
    };
    let training_job = matches!(endpoint, "validate-trainingjob" | "mutate-trainingjob");
    let config = if training_job {
        referenced_config(&state.configs, &req).await
    } else {
        None
    };
    let model_config = match endpoint {
        "validate-offloadprofile" => Ok(None),
        _ => referenced_model(&state.configs, &req, training_job).await,
    };
    // A held pod's sizer is moved on here, before the handler decides (the handler is sync).
    let sizer = if endpoint == "mutate-pod" {
        let client = match &state.configs {
            ConfigSource::Api(client) => Some(client),
            _ => None,
        };
        sizer_wait::ask(state.view.as_ref(), client, &req).await
    } else {
        sizer_wait::SizerState::NotAsked
    };
    let review = Review {
        view: state.view.as_ref(),
        config,
        model_config,
        sizer,
    };
    let verdict = judge(f, &req, &review, endpoint);
    if let (Some(start), ConfigSource::Api(client)) = (&verdict.start_sizer, &state.configs)
        && !req.dry_run
    {
        sizer_wait::start(state.view.as_ref(), client, start).await;
    }
    announce(&state, &req, &verdict);
    if let Some(reason) = verdict.denied {
        state
            .metrics
            .admission_denials
            .get_or_create(&DenialLabels { endpoint, reason })
            .inc();
    }
    state
        .metrics
        .admission_duration
        .get_or_create(&labels)
        .observe(start.elapsed().as_secs_f64());
    review_response(verdict.response)
}

/// The request of an AdmissionReview body, or the answer to a body that is not one: the whole
/// review is read once; only a body it cannot be is read again, as an envelope, for a specific
/// answer (a review whose object cannot be read is denied under its own uid).
fn read_request(
    state: &WebhookState,
    body: &[u8],
    endpoint: &'static str,
) -> Result<AdmissionRequest<DynamicObject>, Box<Response>> {
    let wrong_version = |api_version: &str, kind: &str| {
        bad_request(format!(
            "the body is not an AdmissionReview of {REVIEW_VERSION} (apiVersion {api_version:?}, kind {kind:?}): the webhook configurations ask for admissionReviewVersions [v1]"
        ))
    };
    let review = match serde_json::from_slice::<AdmissionReview<DynamicObject>>(body) {
        Ok(r) => {
            if r.types.api_version != REVIEW_VERSION || r.types.kind != "AdmissionReview" {
                return Err(Box::new(wrong_version(&r.types.api_version, &r.types.kind)));
            }
            r
        }
        Err(e) => {
            let envelope: Envelope = match serde_json::from_slice(body) {
                Ok(envelope) => envelope,
                Err(e) => {
                    return Err(Box::new(bad_request(format!(
                        "the body is not an AdmissionReview: {e}"
                    ))));
                }
            };
            if envelope.api_version.as_deref() != Some(REVIEW_VERSION)
                || envelope.kind.as_deref() != Some("AdmissionReview")
            {
                return Err(Box::new(wrong_version(
                    envelope.api_version.as_deref().unwrap_or_default(),
                    envelope.kind.as_deref().unwrap_or_default(),
                )));
            }
            let Some(request) = envelope.request else {
                return Err(Box::new(bad_request(format!(
                    "the body is not an AdmissionReview: {e}"
                ))));
            };
            let why = if e.to_string().contains("recursion limit") {
                "the object is nested deeper than the 128 levels the webhook reads (no Kubernetes object needs that many)".to_string()
            } else {
                format!("the object cannot be read: {e}")
            };
            state
                .metrics
                .admission_denials
                .get_or_create(&DenialLabels {
                    endpoint,
                    reason: names::EVENT_INVALID_OBJECT,
                })
                .inc();
            return Err(Box::new(unreadable_object(&request.uid, why)));
        }
    };
    review.try_into().map_err(|e| {
        Box::new(bad_request(format!(
            "the AdmissionReview has no usable request: {e}"
        )))
    })
}

/// The handler's verdict. A bug in a handler answers this request with a denial that keeps its
/// uid, instead of dropping the connection (the API server would report an unknown reason).
fn judge(
    f: Handler,
    req: &AdmissionRequest<DynamicObject>,
    review: &Review<'_>,
    endpoint: &'static str,
) -> Verdict {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(req, review))) {
        Ok(v) => v,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(endpoint, panic = %what, "an admission handler panicked");
            Verdict::internal_error(req, &what)
        }
    }
}

/// An Event on the object a creation configured (never for a dry run or a name not yet given).
fn announce(state: &WebhookState, req: &AdmissionRequest<DynamicObject>, verdict: &Verdict) {
    let (Some(sink), Some(res)) = (state.events.as_ref(), verdict.resolution.as_ref()) else {
        return;
    };
    if req.operation != kube::core::admission::Operation::Create
        || req.dry_run
        || req.name.is_empty()
    {
        return;
    }
    sink.send(events::Pending {
        gvk: kube::core::GroupVersionKind::gvk(&req.kind.group, &req.kind.version, &req.kind.kind),
        plural: req.resource.resource.clone(),
        namespace: req.namespace.clone().unwrap_or_else(|| "default".into()),
        name: req.name.clone(),
        reason: names::EVENT_OFFLOAD_CONFIGURED,
        note: format!(
            "{}; {} (every reason in annotation {})",
            render::resolved_summary(res),
            res.summary(),
            offload_api::names::ANNOTATION_REASONS
        ),
    });
}

/// The answer in the API's wire form. kube-core writes `response.patch` as a JSON array of
/// byte values; the API documents a base64 string (Go's `[]byte`), which is a quarter of the
/// size and which the API server decodes without a reflection step per byte.
fn review_response(mut response: AdmissionResponse) -> Response {
    let patch = response.patch.take();
    let mut review = match serde_json::to_value(response.into_review()) {
        Ok(v) => v,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(
                    serde_json::json!({"error": format!("could not encode the answer: {e}")}),
                ),
            )
                .into_response();
        }
    };
    if let (Some(patch), Some(r)) = (patch, review.get_mut("response")) {
        r["patch"] = serde_json::Value::String(base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            patch,
        ));
    }
    axum::Json(review).into_response()
}

/// Where the serving certificate comes from.
#[derive(Clone, Debug)]
pub enum CertMode {
    /// Operator-managed CA and certificate in a Secret, rotated before expiry.
    Managed(tls::ManagedCerts),
    /// Mounted files (cert-manager), re-read when they change.
    Files(tls::FileCerts),
}

/// Webhook server settings.
#[derive(Clone, Debug)]
pub struct WebhookOptions {
    /// Listen address.
    pub addr: SocketAddr,
    /// Certificate source.
    pub certs: CertMode,
    /// How often certificates are checked for renewal (or files for change).
    pub check_interval: Duration,
}

/// A handle to rotate the serving certificate on demand (tests, an admin action).
#[derive(Clone)]
pub struct Rotator {
    client: Client,
    mode: CertMode,
    config: RustlsConfig,
    /// The CA bundle now published (managed mode), for the bundle watch.
    bundle: Arc<std::sync::Mutex<String>>,
}

impl Rotator {
    /// The first certificate read or issued (and, where the operator manages it, its CA bundle
    /// published on the webhook configurations) and the TLS configuration serving it.
    async fn start(
        client: Client,
        certs: &CertMode,
    ) -> Result<(Rotator, RustlsConfig), tls::TlsError> {
        let first = match certs {
            CertMode::Managed(m) => m.ensure(&client).await?,
            CertMode::Files(f) => f.read()?,
        };
        let config = RustlsConfig::from_pem(
            first.cert_pem.clone().into_bytes(),
            first.key_pem.clone().into_bytes(),
        )
        .await
        .map_err(tls::TlsError::Pem)?;
        let rotator = Rotator {
            client,
            mode: certs.clone(),
            config: config.clone(),
            bundle: Arc::new(std::sync::Mutex::new(first.bundle_pem.clone())),
        };
        if let CertMode::Managed(m) = certs {
            m.publish_bundle(&rotator.client, &first.bundle_pem).await?;
        }
        Ok((rotator, config))
    }

    /// Keeps the certificate current (re-read or renewed every `interval`) and, where the
    /// operator manages it, its bundle published; never ends.
    async fn keep_current(self, interval: Duration) {
        let keep_published = async {
            if let CertMode::Managed(m) = &self.mode {
                m.keep_bundle_published(&self.client, || {
                    self.bundle
                        .lock()
                        .map(|b| b.clone())
                        .unwrap_or_else(|p| p.into_inner().clone())
                })
                .await;
            }
            std::future::pending::<()>().await;
        };
        let renew = async {
            loop {
                tokio::time::sleep(interval).await;
                if let Err(e) = self.refresh().await {
                    tracing::warn!(error = %e, "webhook certificate refresh failed");
                }
            }
        };
        tokio::select! {
            () = renew => {},
            () = keep_published => {},
        }
    }

    /// Re-issues (managed) or re-reads (files) the serving certificate and swaps it into the
    /// running server; connections in flight are not dropped.
    pub async fn rotate(&self) -> Result<(), tls::TlsError> {
        let certs = match &self.mode {
            CertMode::Managed(m) => m.rotate(&self.client).await?,
            CertMode::Files(f) => f.read()?,
        };
        self.install(&certs).await
    }

    async fn refresh(&self) -> Result<(), tls::TlsError> {
        let certs = match &self.mode {
            CertMode::Managed(m) => m.ensure(&self.client).await?,
            CertMode::Files(f) => f.read()?,
        };
        self.install(&certs).await
    }

    async fn install(&self, certs: &tls::ServingCerts) -> Result<(), tls::TlsError> {
        if let CertMode::Managed(m) = &self.mode {
            m.publish_bundle(&self.client, &certs.bundle_pem).await?;
            if let Ok(mut b) = self.bundle.lock() {
                b.clone_from(&certs.bundle_pem);
            }
        }
        self.config
            .reload_from_pem(
                certs.cert_pem.clone().into_bytes(),
                certs.key_pem.clone().into_bytes(),
            )
            .await
            .map_err(tls::TlsError::Pem)
    }
}

/// Gets the first certificate, binds, and returns the rotator and the server future (which
/// also re-checks certificates every `check_interval`).
pub async fn serve(
    client: Client,
    options: WebhookOptions,
    state: WebhookState,
    shutdown: CancellationToken,
) -> Result<(Rotator, SocketAddr, impl Future<Output = ()> + Send + use<>), tls::TlsError> {
    serve_router(client, options, router(state), shutdown).await
}

/// [`serve`] with another router behind the same TLS, certificates and timeouts (a benchmark's
/// peer that answers without deciding).
pub async fn serve_router(
    client: Client,
    options: WebhookOptions,
    app: Router,
    shutdown: CancellationToken,
) -> Result<(Rotator, SocketAddr, impl Future<Output = ()> + Send + use<>), tls::TlsError> {
    let (rotator, config) = Rotator::start(client, &options.certs).await?;
    let bind_err = |source| tls::TlsError::Bind {
        addr: options.addr,
        source,
    };
    let listener = std::net::TcpListener::bind(options.addr).map_err(bind_err)?;
    listener.set_nonblocking(true).map_err(bind_err)?;
    let bound = listener.local_addr().map_err(bind_err)?;
    let handle = axum_server::Handle::new();
    // TCP_NODELAY: an answer is written as more than one segment (TLS records, HTTP/2 frames);
    // with Nagle's algorithm the last one waits for the API server's delayed ACK.
    let acceptor = RustlsAcceptor::new(config).acceptor(NoDelayAcceptor::new());
    let mut server = axum_server::from_tcp(listener)
        .map_err(bind_err)?
        .acceptor(acceptor)
        .handle(handle.clone());
    // A client that sends its headers slowly holds a connection no longer than one that sends
    // its body slowly (the router's deadline).
    server
        .http_builder()
        .http1()
        .header_read_timeout(READ_TIMEOUT);
    let server = server.serve(app.into_make_service());
    let keep_certs = rotator.clone().keep_current(options.check_interval);
    let run = async move {
        let stop = async {
            shutdown.cancelled().await;
            handle.graceful_shutdown(Some(Duration::from_secs(10)));
        };
        tokio::select! {
            r = server => {
                if let Err(e) = r {
                    tracing::error!(error = %e, "webhook server stopped");
                }
            }
            () = keep_certs => {},
            _ = async { stop.await; std::future::pending::<()>().await } => {},
        }
    };
    Ok((rotator, bound, run))
}

#[cfg(test)]
mod tests;
