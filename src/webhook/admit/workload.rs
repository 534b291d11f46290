//! Mutating opted-in Pods and jobs of other kinds (batch Job, JobSet, PyTorchJob, TrainJob) at
//! creation. Their env cannot change later, so one that cannot be configured now is refused.

use std::collections::BTreeMap;

use json_patch::PatchOperation;
use json_patch::jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde::Deserialize;
use serde_json::Value;

use super::{Review, Verdict, object, patch_ops_response};
use crate::decision::referenced::Reference;
use crate::decision::{
    JobRequest, PodResources, Resolution, SizerRequest, TraceInput, decide_request,
};
use crate::render;
use crate::render::RenderOptions;
use crate::sizer::cluster::{PendingStep, StepArgs};
use crate::webhook::kinds;
use crate::webhook::sizer_wait::{self, Hold, SizerState};
use offload_api::names;

/// No labels or annotations.
static NONE: BTreeMap<String, String> = BTreeMap::new();

/// The object's labels and annotations (empty when it has none).
fn metadata_maps(meta: &ObjectMeta) -> (&BTreeMap<String, String>, &BTreeMap<String, String>) {
    (
        meta.labels.as_ref().unwrap_or(&NONE),
        meta.annotations.as_ref().unwrap_or(&NONE),
    )
}

/// The resolution for an object of another kind, and the step of its model still to be traced
/// (for the jobs of it that come after: this one's env is written now), or the denial to send.
/// A pod `hold`s for its step's trace until its time: refused while the sizer runs.
fn resolve_for_object(
    req: &AdmissionRequest<DynamicObject>,
    review: &Review,
    meta: &ObjectMeta,
    pods: u32,
    spec: Option<&PodSpec>,
    hold: Option<&Hold>,
) -> Result<(Resolution, Option<PendingStep>), Box<Verdict>> {
    // GPUs from DRA claims count as GPUs; other kinds are pinned by the agent's labels as
    // ever (their templates are not copied).
    let namespace = req.namespace.as_deref().unwrap_or_default();
    let (resources, claims) =
        PodResources::with_claims(spec, namespace, review.view).map_err(|e| {
            Box::new(Verdict::deny(
                req,
                e.category(),
                format!("offload configuration cannot be resolved: {e}"),
            ))
        })?;
    let (labels, annotations) = metadata_maps(meta);
    let cpu_default_request = resources.cpu_default_request;
    let (requested, mut request) =
        JobRequest::from_annotations(labels, annotations, pods, resources)
            .map_err(|m| Box::new(Verdict::deny(req, "InvalidAnnotation", m)))?;
    request.gpu_claim_entries = claims
        .map(|p| p.claims.into_keys().collect())
        .unwrap_or_default();
    request.constraints = crate::decision::PodConstraints::of(spec)
        .in_namespace(spec, cpu_default_request)
        .on_cluster(review.view);
    request.model_config = review.model_config.clone().map_err(|e| {
        Box::new(Verdict::deny(
            req,
            "InvalidModelConfig",
            format!("offload configuration cannot be resolved: {e}"),
        ))
    })?;
    let mut request = request.with_trace(namespace, review.view);
    if request.model_trace == TraceInput::None {
        match &review.sizer {
            SizerState::Kept(found) => request.model_trace = found.clone(),
            SizerState::Refused(why) => request.model_trace = TraceInput::Untraced(why.clone()),
            SizerState::NotAsked | SizerState::Waiting(_) => {}
        }
    }
    let pending = pending_step(&request, annotations, review);
    if pending.is_some() {
        request.model_trace = TraceInput::Untraced(untraced_why(req, review, hold)?);
    }
    let res =
        decide_request(requested.as_deref(), &request, namespace, review.view).map_err(|e| {
            // The env of a pod template cannot change after creation, so an object that cannot be
            // configured now is refused rather than admitted with the wrong configuration.
            Box::new(Verdict::deny(
                req,
                e.reason(),
                format!("offload configuration cannot be resolved: {}", e.message()),
            ))
        })?;
    Ok((res, pending))
}

/// Why a step still to be traced is not used for this object: past its hold, or not held (a
/// Pod's env is written as it is created); a pod within its hold is refused while the sizer runs.
fn untraced_why(
    req: &AdmissionRequest<DynamicObject>,
    review: &Review,
    hold: Option<&Hold>,
) -> Result<String, Box<Verdict>> {
    match hold {
        Some(h) if jiff::Timestamp::now() < h.until => {
            let waits = match &review.sizer {
                SizerState::Waiting(what) => what.as_str(),
                _ => "its sizer is to start",
            };
            Err(Box::new(Verdict::deny(
                req,
                "WaitingForTrace",
                format!(
                    "the pod waits for its model's step to be traced ({waits}); its controller creates it again, and from {} the counted model decides",
                    h.until
                ),
            )))
        }
        Some(h) => Ok(format!(
            "no trace of the model's step by {}, so the counted model decides; the operator traces it for the jobs of it that come after",
            h.until
        )),
        None => Ok("not traced yet: a Pod's env is written as it is created, so the counted model decides; the operator traces its step now for the pods of it that come after".into()),
    }
}

/// The step of `request`'s model still to be traced, where the operator traces models, the
/// object references its `config.json` and gives its tokens, and no trace of the step is kept.
fn pending_step(
    request: &JobRequest,
    annotations: &BTreeMap<String, String>,
    review: &Review,
) -> Option<PendingStep> {
    if request.model_trace != TraceInput::None || !review.view.traces_models() {
        return None;
    }
    let step = SizerRequest::of(request)?;
    let reference = Reference::model_annotation(annotations)?;
    Some(PendingStep {
        step: StepArgs::from(&step),
        config_map: reference.name,
        config_key: reference.key,
    })
}

/// The render options with the pending step on the configured pods.
fn with_pending(opts: RenderOptions, pending: Option<&PendingStep>) -> RenderOptions {
    let mut opts = opts;
    if let Some(p) = pending {
        opts.pod_annotations
            .insert(names::ANNOTATION_SIZER_STEP.to_string(), p.annotation());
    }
    opts
}

/// Whether an object carries the opt-in label.
fn labelled(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .is_some_and(|l| l.contains_key(names::PROFILE_ANNOTATION))
}

/// Most bytes of the reasons annotation (the API server allows 256 KiB for all annotations).
const MAX_REASONS_BYTES: usize = 16 * 1024;

/// The decision's reasons, one `field: Code: sentence` a line, bounded.
pub fn reasons_text(res: &Resolution) -> String {
    let mut text = res
        .reasons
        .iter()
        .map(|r| format!("{}: {}: {}", r.field.as_str(), r.code, r.short()))
        .collect::<Vec<_>>()
        .join("\n");
    if text.len() > MAX_REASONS_BYTES {
        let mut cut = MAX_REASONS_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// The operations that write the decision's summary and reasons into the object's
/// annotations, next to those it has.
fn annotation_ops(
    meta: &ObjectMeta,
    res: &Resolution,
    pending: Option<&PendingStep>,
) -> Vec<PatchOperation> {
    let mut written = vec![
        (names::ANNOTATION_REASONS, reasons_text(res)),
        (names::ANNOTATION_RESOLVED, render::resolved_summary(res)),
    ];
    // A bare Pod carries its pending step itself.
    if let Some(p) = pending {
        written.push((names::ANNOTATION_SIZER_STEP, p.annotation()));
    }
    metadata_adds(meta, written)
}

/// The operations that add `written` to the object's annotations, next to those it has.
fn metadata_adds(meta: &ObjectMeta, written: Vec<(&str, String)>) -> Vec<PatchOperation> {
    let add = |path: PointerBuf, value: Value| {
        PatchOperation::Add(json_patch::AddOperation { path, value })
    };
    match meta.annotations.as_ref() {
        None => vec![add(
            PointerBuf::from_tokens(["metadata", "annotations"]),
            Value::Object(
                written
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), Value::String(v)))
                    .collect(),
            ),
        )],
        Some(have) => written
            .into_iter()
            .filter(|(k, v)| have.get(*k) != Some(v))
            .map(|(k, v)| {
                add(
                    PointerBuf::from_tokens(["metadata", "annotations", k]),
                    Value::String(v),
                )
            })
            .collect(),
    }
}

/// The kind the request is of, and its object; the denial where the webhook knows no such
/// kind or the request carries none.
fn kind_and_object(
    req: &AdmissionRequest<DynamicObject>,
) -> Result<(&'static dyn kinds::JobKind, &DynamicObject), Box<Verdict>> {
    let Some(kind) = kinds::kind_for(&req.kind) else {
        return Err(Box::new(Verdict::deny(
            req,
            "UnknownKind",
            format!(
                "{}/{} is not a job kind this webhook configures",
                req.kind.group, req.kind.kind
            ),
        )));
    };
    let Some(object) = req.object.as_ref() else {
        return Err(Box::new(Verdict::deny(
            req,
            "InvalidObject",
            format!("the request carries no {}", kind.name()),
        )));
    };
    Ok((kind, object))
}

/// Mutating batch Job, JobSet, PyTorchJob and TrainJob at CREATE; the verdict carries the
/// resolution it wrote.
pub fn mutate_workload(req: &AdmissionRequest<DynamicObject>, review: &Review) -> Verdict {
    if req.operation != Operation::Create {
        return Verdict::allow(AdmissionResponse::from(req));
    }
    let (kind, object) = match kind_and_object(req) {
        Ok(found) => found,
        Err(denied) => return *denied,
    };
    if !labelled(&object.metadata) {
        // Only opted-in objects are configured (the webhook configuration selects them by the
        // label; this guards against a configuration that does not).
        return Verdict::allow(AdmissionResponse::from(req));
    }
    // The object's fields other than its metadata (`spec`, `status`), read in place.
    let obj = &object.data;
    let pods = match kind.pods(obj) {
        Ok(n) => n,
        Err(e) => {
            return Verdict::deny(req, "InvalidObject", format!("{}: {e}", kind.name()));
        }
    };
    let spec = kind
        .template_pointers(obj)
        .first()
        .and_then(|p| obj.pointer(&format!("{p}/spec")))
        .and_then(|s| PodSpec::deserialize(s).ok());
    let (res, pending) =
        match resolve_for_object(req, review, &object.metadata, pods, spec.as_ref(), None) {
            Ok(r) => r,
            Err(v) => return *v,
        };
    // Where the operator traces models and the kind has pod templates, its pods wait for the
    // trace: each is decided as it is created. A TrainJob's pods come from its runtime's
    // templates, which this object does not hold, so it is decided now.
    let templates = kind.template_pointers(obj);
    if let (Some(pending), Some(store)) = (pending.as_ref(), review.view.trace_store())
        && !templates.is_empty()
    {
        let hold = Hold::from_now(pending, store.options(), pods);
        return hold_workload(req, obj, &object.metadata, &templates, &hold);
    }
    let ops = match kind.patch(
        obj,
        &res,
        &review.view.features(),
        &with_pending(review.view.render_options(), pending.as_ref()),
    ) {
        Ok(ops) => ops,
        Err(e) => {
            return Verdict::deny(
                req,
                "InvalidObject",
                format!("{}: pod template {e}", kind.name()),
            );
        }
    };
    let mut patch = annotation_ops(&object.metadata, &res, None);
    patch.extend(ops);
    patch_ops_response(req, json_patch::Patch(patch)).with_resolution(res)
}

/// The annotations the operator writes itself, which a held template does not carry over from
/// its object.
const WRITTEN_BY_THE_OPERATOR: [&str; 6] = [
    names::ANNOTATION_REASONS,
    names::ANNOTATION_RESOLVED,
    names::ANNOTATION_OUT_OF_MEMORY,
    names::ANNOTATION_SIZER_STEP,
    names::ANNOTATION_SIZER_WAIT_UNTIL,
    names::ANNOTATION_WORKLOAD_PODS,
];

/// Admits an object whose pods wait for their step's trace: its pod templates are left
/// unconfigured and carry the object's opt-in (its profile label and `offload.dev/`
/// annotations), the step, the time the wait ends and the job's pod count, so that the pod
/// webhook decides each pod as it is created; the object says until when its pods wait.
fn hold_workload(
    req: &AdmissionRequest<DynamicObject>,
    obj: &Value,
    meta: &ObjectMeta,
    templates: &[String],
    hold: &Hold,
) -> Verdict {
    let (labels, annotations) = metadata_maps(meta);
    let mut carried_labels =
        BTreeMap::from([(names::LABEL_CONFIGURED.to_string(), "true".to_string())]);
    if let Some(profile) = labels.get(names::PROFILE_ANNOTATION) {
        carried_labels.insert(names::PROFILE_ANNOTATION.to_string(), profile.clone());
    }
    let until = hold.until.to_string();
    let mut carried: BTreeMap<String, String> = annotations
        .iter()
        .filter(|(k, _)| {
            k.starts_with("offload.dev/") && !WRITTEN_BY_THE_OPERATOR.contains(&k.as_str())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    carried.extend([
        (
            names::ANNOTATION_SIZER_STEP.to_string(),
            hold.pending.annotation(),
        ),
        (
            names::ANNOTATION_SIZER_WAIT_UNTIL.to_string(),
            until.clone(),
        ),
        (
            names::ANNOTATION_WORKLOAD_PODS.to_string(),
            hold.pods.to_string(),
        ),
    ]);
    let mut patch = Vec::new();
    for path in templates {
        match kinds::hold_patch(obj, path, &carried_labels, &carried) {
            Ok(ops) => patch.extend(ops),
            Err(e) => {
                return Verdict::deny(req, "InvalidObject", format!("pod template {e}"));
            }
        }
    }
    patch.extend(metadata_adds(
        meta,
        vec![(names::ANNOTATION_SIZER_WAIT_UNTIL, until)],
    ));
    let mut verdict = patch_ops_response(req, json_patch::Patch(patch));
    // The sizer runs from the first template's pods' point of view (image, pull secrets,
    // placement), as their own first admission would start it.
    let template = templates
        .first()
        .and_then(|p| obj.pointer(p))
        .and_then(|t| k8s_openapi::api::core::v1::PodTemplateSpec::deserialize(t).ok())
        .unwrap_or_default();
    let pod = Pod {
        metadata: template.metadata.unwrap_or_default(),
        spec: template.spec,
        status: None,
    };
    let mut source = crate::sizer::cluster::SizerSource::of_pod(&pod);
    source.namespace = req.namespace.clone().unwrap_or_default();
    source.asked_by = req.name.clone();
    verdict.start_sizer = Some(sizer_wait::Start {
        source,
        step: hold.pending.clone(),
    });
    verdict
}

/// Mutating Pod at CREATE, the last safety net for pods created directly; the verdict carries
/// the resolution it wrote.
pub fn mutate_pod(req: &AdmissionRequest<DynamicObject>, review: &Review) -> Verdict {
    if req.operation != Operation::Create {
        return Verdict::allow(AdmissionResponse::from(req));
    }
    let pod: Pod = match object(req, "Pod") {
        Ok(p) => p,
        Err(msg) => return Verdict::deny(req, "InvalidObject", msg),
    };
    if !labelled(&pod.metadata) {
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
    // A pod of a held template waits for its step's trace, and is decided for its job's pods.
    let (_, annotations) = metadata_maps(&pod.metadata);
    // Where the operator traces no models, nothing holds a pod.
    let held = review.view.trace_store().map(|store| {
        sizer_wait::hold_of(
            annotations,
            jiff::Timestamp::now(),
            sizer_wait::wait_limit(store.options()),
        )
    });
    let hold = match held {
        None | Some(Ok(None)) => None,
        Some(Ok(Some(hold))) => Some(hold),
        Some(Err(message)) => return Verdict::deny(req, "InvalidAnnotation", message),
    };
    let pods = hold.as_ref().map_or(1, |h| h.pods);
    let (res, pending) = match resolve_for_object(
        req,
        review,
        &pod.metadata,
        pods,
        pod.spec.as_ref(),
        hold.as_ref(),
    ) {
        Ok(r) => r,
        Err(v) => return *v,
    };
    let opts = review.view.render_options();
    let configure = |spec: &mut PodSpec| render::apply_to_pod_spec(spec, &res, None, &opts);
    let at = PointerBuf::from_tokens(["spec"]);
    let ops = match pod.spec {
        Some(mut spec) => kinds::typed_patch(&at, &mut spec, configure),
        // No spec to compare with: the configured one is added whole.
        None => {
            let mut spec = PodSpec::default();
            configure(&mut spec);
            serde_json::to_value(&spec).map(|value| {
                vec![PatchOperation::Add(json_patch::AddOperation {
                    path: at,
                    value,
                })]
            })
        }
    };
    let Ok(ops) = ops else {
        return Verdict::deny(req, "InvalidObject", "the Pod cannot be written back");
    };
    let mut patch = annotation_ops(&pod.metadata, &res, pending.as_ref());
    patch.extend(ops);
    patch_ops_response(req, json_patch::Patch(patch)).with_resolution(res)
}
