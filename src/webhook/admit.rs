//! What each endpoint decides. The envelope has been parsed already; every answer here keeps the
//! request uid, and a bad object gets `allowed: false` with a message naming the field.

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::{DynamicObject, Selector, SelectorExt};
use std::sync::Arc;

use serde_json::Value;

use super::kinds;
use crate::api::{
    Framework, FrameworkSpec, ModeSetting, OffloadProfile, OffloadProfileSpec, OffloadSpec,
    OverlapSetting, RatioSetting, TrainingJob,
};
use crate::caches::Caches;
use crate::decision::{
    AdmittedRequest, DeepSpeedRequest, JobRequest, Resolution, ResolveError, SelectedProfile,
    opted_in, requested_profile, resolve_offload, select_profile,
};
use crate::index::{NodeIndex, NodeViews};
use crate::names;
use crate::render;

/// The cluster state admission decides against: a snapshot of the reflector stores.
pub trait ClusterView: Send + Sync {
    /// A profile by name.
    fn profile(&self, name: &str) -> Option<OffloadProfileSpec>;
    /// The node index (shared: a request does not copy the node reports).
    fn nodes(&self) -> Arc<NodeIndex>;
    /// What the installed APIs of other job kinds take.
    fn features(&self) -> kinds::ApiFeatures {
        kinds::ApiFeatures::default()
    }
    /// What the operator writes beside the decision (the start-up guard's image).
    fn render_options(&self) -> render::RenderOptions {
        render::RenderOptions::default()
    }
    /// The DeepSpeed config (the text of the key) a TrainingJob under review references, when
    /// it could be read for this request.
    fn deepspeed_config(&self, _config_map: &str) -> Option<String> {
        None
    }
}

/// A view with the DeepSpeed config of the TrainingJob under review read for this request, so
/// the webhook decides from the same ZeRO stage the controller will (a job whose config says
/// stage 2 is refused a partial ratio at admission, as one whose spec says so is).
pub struct WithConfig<'a> {
    /// The shared view.
    pub inner: &'a dyn ClusterView,
    /// ConfigMap name and the text of its key.
    pub config: Option<(String, String)>,
}

impl ClusterView for WithConfig<'_> {
    fn profile(&self, name: &str) -> Option<OffloadProfileSpec> {
        self.inner.profile(name)
    }
    fn nodes(&self) -> Arc<NodeIndex> {
        self.inner.nodes()
    }
    fn features(&self) -> kinds::ApiFeatures {
        self.inner.features()
    }
    fn render_options(&self) -> render::RenderOptions {
        self.inner.render_options()
    }
    fn deepspeed_config(&self, config_map: &str) -> Option<String> {
        self.config
            .as_ref()
            .filter(|(name, _)| name == config_map)
            .map(|(_, text)| text.clone())
            .or_else(|| self.inner.deepspeed_config(config_map))
    }
}

/// The outcome of one admission, with a fixed category for the denial metric.
pub struct Verdict {
    /// The response to send.
    pub response: AdmissionResponse,
    /// Denial category, when denied.
    pub denied: Option<&'static str>,
}

impl Verdict {
    fn allow(response: AdmissionResponse) -> Self {
        Verdict {
            response,
            denied: None,
        }
    }

    fn deny(
        req: &AdmissionRequest<DynamicObject>,
        category: &'static str,
        message: impl ToString,
    ) -> Self {
        Verdict {
            response: AdmissionResponse::from(req).deny(message),
            denied: Some(category),
        }
    }
}

fn with_warnings(mut response: AdmissionResponse, warnings: Vec<String>) -> AdmissionResponse {
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    response
}

/// Reads the request's object as `T`, or says which field is wrong.
fn object<T: serde::de::DeserializeOwned>(
    req: &AdmissionRequest<DynamicObject>,
    what: &str,
) -> Result<T, String> {
    let obj = req
        .object
        .as_ref()
        .ok_or_else(|| format!("the request carries no {what}"))?;
    let value = serde_json::to_value(obj).map_err(|e| format!("the {what} cannot be read: {e}"))?;
    serde_json::from_value(value).map_err(|e| format!("the {what} is invalid: {e}"))
}

fn old_object<T: serde::de::DeserializeOwned>(req: &AdmissionRequest<DynamicObject>) -> Option<T> {
    let value = serde_json::to_value(req.old_object.as_ref()?).ok()?;
    serde_json::from_value(value).ok()
}

/// The profile a TrainingJob resolves with: the rule the controller follows.
fn profile_for(
    view: &dyn ClusterView,
    tj: &TrainingJob,
) -> Result<SelectedProfile, crate::decision::ProfileNotFound> {
    select_profile(requested_profile(tj), |name| view.profile(name))
}

/// What a TrainingJob asks for. Where this webhook resolved its `Auto` values at creation and
/// the spec still holds them, the user's original request (values filled in here are not the
/// user's).
/// The job's request as the controller will see it: with the ZeRO stage of its DeepSpeed
/// config when the view could read it. A config that does not parse is the controller's to
/// report (the user may still fix the ConfigMap): the request then goes without its stage.
fn training_job_request(tj: &TrainingJob, view: &dyn ClusterView) -> JobRequest {
    let config = tj
        .spec
        .deepspeed
        .as_ref()
        .and_then(|d| d.config_map_ref.as_ref())
        .and_then(|r| view.deepspeed_config(&r.name))
        .and_then(|text| render::deepspeed::parse_config(&text).ok());
    let stage = config
        .as_ref()
        .and_then(|c| render::deepspeed::stage_of(c).ok().flatten());
    let mut request = JobRequest::from_training_job(
        &tj.spec,
        render::gpus_per_pod(tj.spec.template.spec.as_ref()),
        stage,
    );
    request.deepspeed.zenflow_in_config = config
        .as_ref()
        .is_some_and(|c| c.pointer("/zero_optimization/zenflow").is_some());
    if let Some(asked) = AdmittedRequest::original(tj) {
        request.offload = asked;
    }
    request
}

/// Validating TrainingJob: statically wrong requests are denied with what to change; problems
/// the cluster may fix later (no coherent node yet) are admitted with a warning, because the
/// controller holds the job until they are fixed. A job whose workload exists cannot change its
/// offload configuration.
pub fn validate_training_job(
    req: &AdmissionRequest<DynamicObject>,
    view: &dyn ClusterView,
) -> Verdict {
    let tj: TrainingJob = match object(req, "TrainingJob") {
        Ok(t) => t,
        Err(msg) => return Verdict::deny(req, "InvalidObject", msg),
    };
    if req.operation == Operation::Update
        && let Some(old) = old_object::<TrainingJob>(req)
        && old
            .status
            .as_ref()
            .and_then(|s| s.workload.as_ref())
            .is_some()
    {
        let changed = [
            (old.spec.offload != tj.spec.offload, "spec.offload"),
            (old.spec.framework != tj.spec.framework, "spec.framework"),
            (old.spec.deepspeed != tj.spec.deepspeed, "spec.deepspeed"),
            (old.spec.template != tj.spec.template, "spec.template"),
            (old.spec.replicas != tj.spec.replicas, "spec.replicas"),
        ];
        if let Some((_, field)) = changed.iter().find(|(c, _)| *c) {
            return Verdict::deny(
                req,
                "RunningJobChanged",
                format!(
                    "{field} cannot change once the workload exists (a running job is never re-configured): delete and re-create the TrainingJob to change it"
                ),
            );
        }
        return Verdict::allow(AdmissionResponse::from(req));
    }
    if !opted_in(&tj) {
        return Verdict::allow(AdmissionResponse::from(req));
    }
    let profile = match profile_for(view, &tj) {
        Ok(p) => p,
        Err(missing) => {
            return Verdict::allow(with_warnings(
                AdmissionResponse::from(req),
                vec![format!(
                    "OffloadProfile {:?} does not exist yet: the job waits until it does",
                    missing.name
                )],
            ));
        }
    };
    match resolve_offload(
        &training_job_request(&tj, view),
        &profile.name,
        &profile.spec,
        &view.nodes(),
    ) {
        Ok(_) => Verdict::allow(AdmissionResponse::from(req)),
        Err(e) if e.depends_on_cluster() => Verdict::allow(with_warnings(
            AdmissionResponse::from(req),
            vec![format!("the job waits until the cluster can take it: {e}")],
        )),
        Err(e) => Verdict::deny(req, e.category(), format!("spec: {e}")),
    }
}

/// Validating OffloadProfile: a selector that is not a valid selector is denied; one that
/// matches no reported node is admitted with a warning.
pub fn validate_profile(req: &AdmissionRequest<DynamicObject>, view: &dyn ClusterView) -> Verdict {
    let profile: OffloadProfile = match object(req, "OffloadProfile") {
        Ok(p) => p,
        Err(msg) => return Verdict::deny(req, "InvalidObject", msg),
    };
    let mut warnings = Vec::new();
    if let Some(sel) = &profile.spec.node_selector {
        let selector = match Selector::try_from(sel.clone()) {
            Ok(s) => s,
            Err(e) => {
                return Verdict::deny(
                    req,
                    "InvalidSelector",
                    format!("spec.nodeSelector is not a valid label selector: {e}"),
                );
            }
        };
        let nodes = view.nodes();
        if !nodes.candidates().any(|n| selector.matches(&n.labels)) {
            warnings.push(format!(
                "spec.nodeSelector matches none of the {} GPU node(s) reported by offload-agent: jobs using this profile will wait",
                nodes.candidates().count()
            ));
        }
    }
    if profile.spec.mode == ModeSetting::CpuCopy
        && profile.spec.node_class_order.first() == Some(&crate::api::NodeClass::Coherent)
        && !profile.spec.allow_cpu_copy_on_coherent_nodes
    {
        warnings.push("mode CPUCopy never uses coherent nodes unless allowCPUCopyOnCoherentNodes is set; nodeClassOrder's first entry has no effect".to_string());
    }
    Verdict::allow(with_warnings(AdmissionResponse::from(req), warnings))
}

/// Mutating TrainingJob at CREATE: resolve every `Auto` early so the stored object already
/// shows the decision. Unresolvable jobs are admitted unchanged (validation warns; the
/// controller records why).
pub fn mutate_training_job(
    req: &AdmissionRequest<DynamicObject>,
    view: &dyn ClusterView,
) -> Verdict {
    let allow = AdmissionResponse::from(req);
    if req.operation != Operation::Create {
        return Verdict::allow(allow);
    }
    let tj: TrainingJob = match object(req, "TrainingJob") {
        Ok(t) => t,
        Err(msg) => return Verdict::deny(req, "InvalidObject", msg),
    };
    if !opted_in(&tj) || tj.spec.offload.is_concrete() {
        return Verdict::allow(allow);
    }
    let Ok(profile) = profile_for(view, &tj) else {
        return Verdict::allow(allow);
    };
    let Ok(res) = resolve_offload(
        &training_job_request(&tj, view),
        &profile.name,
        &profile.spec,
        &view.nodes(),
    ) else {
        return Verdict::allow(allow);
    };
    let Ok(original) = serde_json::to_value(&tj) else {
        return Verdict::allow(allow);
    };
    let mut mutated = original.clone();
    let record = AdmittedRequest {
        requested: tj.spec.offload.clone(),
        wrote: res.concrete_spec(),
    };
    let (Ok(concrete), Ok(requested)) = (serde_json::to_value(&record.wrote), record.annotation())
    else {
        return Verdict::allow(allow);
    };
    mutated["spec"]["offload"] = concrete;
    if let Some(meta) = mutated.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(
                names::ANNOTATION_REQUESTED.to_string(),
                Value::String(requested),
            );
        }
    }
    patch_response(req, &original, &mutated)
}

/// What another object kind asks for, from its opt-in label and annotations.
fn annotated_request(
    labels: &serde_json::Map<String, Value>,
    annotations: &serde_json::Map<String, Value>,
    pods: u32,
    gpus: u32,
) -> Result<(Option<String>, JobRequest), String> {
    let get = |key: &str| annotations.get(key).and_then(Value::as_str);
    let field = |key: &str| -> Result<Option<Value>, String> {
        Ok(get(key).map(|v| Value::String(v.to_string())))
    };
    let mode: ModeSetting = match field(names::ANNOTATION_MODE)? {
        Some(v) => serde_json::from_value(v).map_err(|_| {
            format!(
                "annotation {}: use Auto, UnifiedMemory, CPUCopy or Disabled",
                names::ANNOTATION_MODE
            )
        })?,
        None => ModeSetting::Auto,
    };
    let overlap: OverlapSetting = match field(names::ANNOTATION_OVERLAP)? {
        Some(v) => serde_json::from_value(v).map_err(|_| {
            format!(
                "annotation {}: use Auto, Enabled or Disabled",
                names::ANNOTATION_OVERLAP
            )
        })?,
        None => OverlapSetting::Auto,
    };
    let offload_ratio: RatioSetting = match field(names::ANNOTATION_RATIO)? {
        Some(v) => serde_json::from_value(v)
            .map_err(|e| format!("annotation {}: {e}", names::ANNOTATION_RATIO))?,
        None => RatioSetting::Auto,
    };
    let framework: Framework = match field(names::ANNOTATION_FRAMEWORK)? {
        Some(v) => serde_json::from_value(v).map_err(|_| {
            format!(
                "annotation {}: use DeepSpeed, FSDP or Generic",
                names::ANNOTATION_FRAMEWORK
            )
        })?,
        None => Framework::Generic,
    };
    Ok((
        labels
            .get(names::PROFILE_ANNOTATION)
            .and_then(Value::as_str)
            .map(str::to_string),
        JobRequest {
            offload: OffloadSpec {
                mode,
                overlap,
                offload_ratio,
                pin_memory: Default::default(),
            },
            framework: FrameworkSpec {
                name: framework,
                version: get(names::ANNOTATION_FRAMEWORK_VERSION).map(str::to_string),
            },
            deepspeed: DeepSpeedRequest::default(),
            model: None,
            pods,
            gpus_per_pod: gpus,
        },
    ))
}

fn metadata_maps(
    obj: &Value,
) -> (
    serde_json::Map<String, Value>,
    serde_json::Map<String, Value>,
) {
    let map = |key: &str| {
        obj.pointer(&format!("/metadata/{key}"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    (map("labels"), map("annotations"))
}

fn resolve_for_object(
    req: &AdmissionRequest<DynamicObject>,
    view: &dyn ClusterView,
    obj: &Value,
    pods: u32,
    gpus: u32,
) -> Result<Resolution, Box<Verdict>> {
    let (labels, annotations) = metadata_maps(obj);
    let (requested, request) = annotated_request(&labels, &annotations, pods, gpus)
        .map_err(|m| Box::new(Verdict::deny(req, "InvalidAnnotation", m)))?;
    let profile = select_profile(requested.as_deref(), |name| view.profile(name))
        .map_err(|e| Box::new(Verdict::deny(req, "ProfileNotFound", e.to_string())))?;
    resolve_offload(&request, &profile.name, &profile.spec, &view.nodes()).map_err(
        |e: ResolveError| {
            // The env of a pod template cannot change after creation, so an object that cannot be
            // configured now is refused rather than admitted with the wrong configuration.
            Box::new(Verdict::deny(
                req,
                e.category(),
                format!("offload configuration cannot be resolved: {e}"),
            ))
        },
    )
}

/// Whether an object carries the opt-in label.
fn labelled(obj: &Value) -> bool {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(names::PROFILE_ANNOTATION))
        .is_some()
}

fn annotate_resolved(obj: &mut Value, res: &Resolution) {
    let summary = render::resolved_summary(res);
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(
                names::ANNOTATION_RESOLVED.to_string(),
                Value::String(summary),
            );
        }
    }
}

/// Mutating batch Job, JobSet, PyTorchJob and TrainJob at CREATE.
pub fn mutate_workload(req: &AdmissionRequest<DynamicObject>, view: &dyn ClusterView) -> Verdict {
    mutate_workload_explained(req, view, &mut None)
}

/// [`mutate_workload`], also handing out the resolution it wrote (`offload-operator explain`).
pub fn mutate_workload_explained(
    req: &AdmissionRequest<DynamicObject>,
    view: &dyn ClusterView,
    resolved: &mut Option<Resolution>,
) -> Verdict {
    if req.operation != Operation::Create {
        return Verdict::allow(AdmissionResponse::from(req));
    }
    let Some(kind) = kinds::kind_for(&req.kind) else {
        return Verdict::deny(
            req,
            "UnknownKind",
            format!(
                "{}/{} is not a job kind this webhook configures",
                req.kind.group, req.kind.kind
            ),
        );
    };
    let Some(obj) = req
        .object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok())
    else {
        return Verdict::deny(
            req,
            "InvalidObject",
            format!("the {} cannot be read", kind.name()),
        );
    };
    if !labelled(&obj) {
        // Only opted-in objects are configured (the webhook configuration selects them by the
        // label; this guards against a configuration that does not).
        return Verdict::allow(AdmissionResponse::from(req));
    }
    let pods = match kind.pods(&obj) {
        Ok(n) => n,
        Err(e) => {
            return Verdict::deny(req, "InvalidObject", format!("{}: {e}", kind.name()));
        }
    };
    let gpus = kind
        .template_pointers(&obj)
        .first()
        .and_then(|p| obj.pointer(&format!("{p}/spec")))
        .and_then(|s| serde_json::from_value::<PodSpec>(s.clone()).ok())
        .map_or(1, |s| render::gpus_per_pod(Some(&s)));
    let res = match resolve_for_object(req, view, &obj, pods, gpus) {
        Ok(r) => r,
        Err(v) => return *v,
    };
    *resolved = Some(res.clone());
    let mut mutated = obj.clone();
    if let Err(e) = kind.apply(&mut mutated, &res, &view.features(), &view.render_options()) {
        return Verdict::deny(
            req,
            "InvalidObject",
            format!("{}: pod template {e}", kind.name()),
        );
    }
    annotate_resolved(&mut mutated, &res);
    patch_response(req, &obj, &mutated)
}

/// Mutating Pod at CREATE: the last safety net for pods created directly.
pub fn mutate_pod(req: &AdmissionRequest<DynamicObject>, view: &dyn ClusterView) -> Verdict {
    mutate_pod_explained(req, view, &mut None)
}

/// [`mutate_pod`], also handing out the resolution it wrote (`offload-operator explain`).
pub fn mutate_pod_explained(
    req: &AdmissionRequest<DynamicObject>,
    view: &dyn ClusterView,
    resolved: &mut Option<Resolution>,
) -> Verdict {
    if req.operation != Operation::Create {
        return Verdict::allow(AdmissionResponse::from(req));
    }
    let pod: Pod = match object(req, "Pod") {
        Ok(p) => p,
        Err(msg) => return Verdict::deny(req, "InvalidObject", msg),
    };
    let Ok(original) = serde_json::to_value(&pod) else {
        return Verdict::deny(req, "InvalidObject", "the Pod cannot be read");
    };
    if !labelled(&original) {
        return Verdict::allow(AdmissionResponse::from(req));
    }
    // Pods whose template was already configured (by the controller or the workload webhook)
    // pass unchanged: their env is already there.
    let configured = pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .all(|c| c.env.iter().flatten().any(|e| e.name == names::ENV_MODE))
    });
    if configured {
        return Verdict::allow(AdmissionResponse::from(req));
    }
    let gpus = render::gpus_per_pod(pod.spec.as_ref());
    let res = match resolve_for_object(req, view, &original, 1, gpus) {
        Ok(r) => r,
        Err(v) => return *v,
    };
    *resolved = Some(res.clone());
    let mut pod = pod;
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    render::apply_to_pod_spec(spec, &res, None, &view.render_options());
    let Ok(mut mutated) = serde_json::to_value(&pod) else {
        return Verdict::deny(req, "InvalidObject", "the Pod cannot be written back");
    };
    annotate_resolved(&mut mutated, &res);
    patch_response(req, &original, &mutated)
}

/// A response carrying the JSON patch from `original` to `mutated` (only the fields that
/// changed), or a plain allow when nothing changed.
fn patch_response(
    req: &AdmissionRequest<DynamicObject>,
    original: &Value,
    mutated: &Value,
) -> Verdict {
    let patch = json_patch::diff(original, mutated);
    if patch.0.is_empty() {
        return Verdict::allow(AdmissionResponse::from(req));
    }
    match AdmissionResponse::from(req).with_patch(patch) {
        Ok(r) => Verdict::allow(r),
        Err(e) => Verdict::deny(
            req,
            "PatchError",
            format!("could not encode the patch: {e}"),
        ),
    }
}

/// The view over the process's shared caches.
pub struct StoreView {
    /// Profiles.
    pub profiles: kube::runtime::reflector::Store<OffloadProfile>,
    /// The node index, shared with the controllers.
    pub nodes: Arc<NodeViews>,
    /// The TrainJob CRD, when Kubeflow Trainer is installed.
    pub trainjob_crd: Option<
        kube::runtime::reflector::Store<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >,
    >,
    /// What the operator writes beside the decision.
    pub render: render::RenderOptions,
}

impl StoreView {
    /// The same view, writing the start-up guard with `image` (the agent image).
    pub fn with_guard_image(mut self, image: Option<String>) -> Self {
        self.render.guard_image = image;
        self
    }

    /// A view over the caches.
    pub fn new(caches: &Caches) -> Self {
        StoreView {
            profiles: caches.profiles.store().clone(),
            nodes: caches.node_views.clone(),
            trainjob_crd: Some(caches.trainjob_crd.store().clone()),
            render: render::RenderOptions::default(),
        }
    }

    /// A view over two stores (tests, tools that fill stores themselves).
    pub fn from_stores(
        profiles: kube::runtime::reflector::Store<OffloadProfile>,
        nodes: kube::runtime::reflector::Store<
            kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Node>,
        >,
    ) -> Self {
        StoreView {
            profiles,
            nodes: Arc::new(NodeViews::new(nodes)),
            trainjob_crd: None,
            render: render::RenderOptions::default(),
        }
    }
}

impl ClusterView for StoreView {
    fn profile(&self, name: &str) -> Option<OffloadProfileSpec> {
        self.profiles
            .get(&kube::runtime::reflector::ObjectRef::new(name))
            .map(|p| p.spec.clone())
    }

    fn nodes(&self) -> Arc<NodeIndex> {
        self.nodes.get()
    }

    fn features(&self) -> kinds::ApiFeatures {
        let trainjob = self
            .trainjob_crd
            .as_ref()
            .and_then(|s| s.state().first().cloned())
            .map(|crd| kinds::TrainJobApi::from_crd(&crd))
            .unwrap_or_default();
        kinds::ApiFeatures { trainjob }
    }

    fn render_options(&self) -> render::RenderOptions {
        self.render.clone()
    }
}
