//! Mutating opted-in Pods and jobs of other kinds (batch Job, JobSet, PyTorchJob, TrainJob) at
//! creation. Their env cannot change later, so one that cannot be configured now is refused.

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::Value;

use super::{Review, Verdict, object, patch_response};
use crate::decision::{JobRequest, PodResources, Resolution, decide_request};
use crate::render;
use crate::webhook::kinds;
use offload_api::names;

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

/// The resolution for an object of another kind, or the denial to send.
fn resolve_for_object(
    req: &AdmissionRequest<DynamicObject>,
    review: &Review,
    obj: &Value,
    pods: u32,
    spec: Option<&PodSpec>,
) -> Result<Resolution, Box<Verdict>> {
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
    let (labels, annotations) = metadata_maps(obj);
    let (requested, mut request) =
        JobRequest::from_annotations(&labels, &annotations, pods, resources)
            .map_err(|m| Box::new(Verdict::deny(req, "InvalidAnnotation", m)))?;
    request.gpu_claim_entries = claims
        .map(|p| p.claims.into_keys().collect())
        .unwrap_or_default();
    request.constraints = crate::decision::PodConstraints::of(spec);
    request.model_config = review.model_config.clone().map_err(|e| {
        Box::new(Verdict::deny(
            req,
            "InvalidModelConfig",
            format!("offload configuration cannot be resolved: {e}"),
        ))
    })?;
    decide_request(requested.as_deref(), &request, review.view).map_err(|e| {
        // The env of a pod template cannot change after creation, so an object that cannot be
        // configured now is refused rather than admitted with the wrong configuration.
        Box::new(Verdict::deny(
            req,
            e.reason(),
            format!("offload configuration cannot be resolved: {}", e.message()),
        ))
    })
}

/// Whether an object carries the opt-in label.
fn labelled(obj: &Value) -> bool {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(names::PROFILE_ANNOTATION))
        .is_some()
}

/// Most bytes of the reasons annotation (the API server allows 256 KiB for all annotations).
const MAX_REASONS_BYTES: usize = 16 * 1024;

/// The decision's reasons, one `field: reason` a line, bounded.
pub fn reasons_text(res: &Resolution) -> String {
    let mut text = res
        .reasons
        .iter()
        .map(|r| format!("{}: {}", r.field.as_str(), r.message))
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
            a.insert(
                names::ANNOTATION_REASONS.to_string(),
                Value::String(reasons_text(res)),
            );
        }
    }
}

/// Mutating batch Job, JobSet, PyTorchJob and TrainJob at CREATE; the verdict carries the
/// resolution it wrote.
pub fn mutate_workload(req: &AdmissionRequest<DynamicObject>, review: &Review) -> Verdict {
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
    let spec = kind
        .template_pointers(&obj)
        .first()
        .and_then(|p| obj.pointer(&format!("{p}/spec")))
        .and_then(|s| serde_json::from_value::<PodSpec>(s.clone()).ok());
    let res = match resolve_for_object(req, review, &obj, pods, spec.as_ref()) {
        Ok(r) => r,
        Err(v) => return *v,
    };
    let mut mutated = obj.clone();
    if let Err(e) = kind.apply(
        &mut mutated,
        &res,
        &review.view.features(),
        &review.view.render_options(),
    ) {
        return Verdict::deny(
            req,
            "InvalidObject",
            format!("{}: pod template {e}", kind.name()),
        );
    }
    annotate_resolved(&mut mutated, &res);
    patch_response(req, &obj, &mutated).with_resolution(res)
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
    let res = match resolve_for_object(req, review, &original, 1, pod.spec.as_ref()) {
        Ok(r) => r,
        Err(v) => return *v,
    };
    let mut pod = pod;
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    render::apply_to_pod_spec(spec, &res, None, &review.view.render_options());
    let Ok(mut mutated) = serde_json::to_value(&pod) else {
        return Verdict::deny(req, "InvalidObject", "the Pod cannot be written back");
    };
    annotate_resolved(&mut mutated, &res);
    patch_response(req, &original, &mutated).with_resolution(res)
}
