//! Jobs whose GPUs come from DRA claims: how many GPUs a pod's claims request
//! ([`claimed_gpus`]), and the copy of a claim template that only the decided node class's
//! GPUs satisfy ([`pinned_template`]): its GPU requests get a CEL selector on the driver's
//! `addressingMode` attribute, so the scheduler allocates only GPUs of that class.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use serde_json::{Value, json};

use super::DraOptions;
use super::api::{ResourceClaimTemplate, ResourceClaimTemplateSpec};
use offload_api::quantity::MAX_GPUS;
use offload_api::text::bounded;
use offload_api::v1alpha1::NodeClass;

/// Why a pod's claims cannot be sized.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The template a claim names does not exist (yet).
    #[error(
        "claim {claim} names ResourceClaimTemplate {template}, which does not exist in the namespace (yet)"
    )]
    TemplateNotFound {
        /// The pod's claim entry.
        claim: String,
        /// The template.
        template: String,
    },
    /// A claim names a ResourceClaim, shared by every pod: the operator cannot pin or size it.
    #[error(
        "claim {claim} names ResourceClaim {name}: a claim shared by all pods cannot be sized or pinned to a node class per job; request GPUs through a ResourceClaimTemplate"
    )]
    SharedClaim {
        /// The pod's claim entry.
        claim: String,
        /// The ResourceClaim.
        name: String,
    },
    /// A GPU request asks for every GPU of a node (`allocationMode: All`).
    #[error(
        "claim {claim}, request {request}: allocationMode All asks for however many GPUs a node has, which the decision cannot size; state a count"
    )]
    AllDevices {
        /// The pod's claim entry.
        claim: String,
        /// The request.
        request: String,
    },
    /// A template's requests do not read.
    #[error("claim {claim} (template {template}): {detail}")]
    Invalid {
        /// The pod's claim entry.
        claim: String,
        /// The template.
        template: String,
        /// What is wrong.
        detail: String,
    },
}

impl ClaimError {
    /// Whether the cluster may fix it later (the template may yet be created).
    pub fn depends_on_cluster(&self) -> bool {
        matches!(self, ClaimError::TemplateNotFound { .. })
    }
}

/// A job pinned to its node class through its DRA claims: the claims that request GPUs
/// (pod claim entry → ResourceClaimTemplate) and the driver whose attribute selects the class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimPinning {
    /// The GPU driver and its DeviceClasses.
    pub dra: DraOptions,
    /// Claim entry → template.
    pub claims: BTreeMap<String, String>,
}

/// GPUs a pod's claims request, by the pod's claim entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimedGpus {
    /// GPUs over every claim (the smallest alternative of a prioritised list).
    pub gpus: u64,
    /// The claim entries that request GPUs, with their template.
    pub claims: BTreeMap<String, String>,
}

/// The GPUs `spec`'s claims request: every pod-level claim whose template asks for devices
/// of one of the options' GPU DeviceClasses. `template` looks a template up by name in the
/// pod's namespace.
pub fn claimed_gpus(
    spec: &PodSpec,
    template: &dyn Fn(&str) -> Option<Arc<ResourceClaimTemplate>>,
    opts: &DraOptions,
) -> Result<ClaimedGpus, ClaimError> {
    let mut out = ClaimedGpus::default();
    for claim in spec.resource_claims.iter().flatten() {
        let entry = bounded(&claim.name);
        if let Some(name) = &claim.resource_claim_name {
            return Err(ClaimError::SharedClaim {
                claim: entry,
                name: bounded(name),
            });
        }
        let Some(name) = &claim.resource_claim_template_name else {
            continue;
        };
        let t = template(name).ok_or_else(|| ClaimError::TemplateNotFound {
            claim: entry.clone(),
            template: bounded(name),
        })?;
        let invalid = |detail: String| ClaimError::Invalid {
            claim: entry.clone(),
            template: bounded(name),
            detail,
        };
        let gpus = template_gpus(&t.spec, opts).map_err(|e| match e {
            Counted::All(request) => ClaimError::AllDevices {
                claim: entry.clone(),
                request,
            },
            Counted::Invalid(detail) => invalid(detail),
        })?;
        if gpus > 0 {
            out.gpus = out
                .gpus
                .checked_add(gpus)
                .filter(|n| *n <= MAX_GPUS)
                .ok_or_else(|| invalid(format!("more than {MAX_GPUS} GPUs a pod")))?;
            out.claims.insert(claim.name.clone(), name.clone());
        }
    }
    Ok(out)
}

enum Counted {
    All(String),
    Invalid(String),
}

/// GPUs one template requests.
fn template_gpus(t: &ResourceClaimTemplateSpec, opts: &DraOptions) -> Result<u64, Counted> {
    let Some(requests) = t.spec.pointer("/devices/requests") else {
        return Ok(0);
    };
    let requests = requests
        .as_array()
        .ok_or_else(|| Counted::Invalid("devices.requests is not a list".into()))?;
    let mut total: u64 = 0;
    for r in requests {
        let name = bounded(r.get("name").and_then(Value::as_str).unwrap_or("?"));
        let gpus = if let Some(exactly) = r.get("exactly") {
            request_gpus(exactly, opts, &name)?
        } else if let Some(alternatives) = r.get("firstAvailable") {
            let alternatives = alternatives.as_array().ok_or_else(|| {
                Counted::Invalid(format!("request {name}: firstAvailable is not a list"))
            })?;
            // The scheduler takes the first alternative it can satisfy: the decision must hold
            // for the smallest.
            let mut least: Option<u64> = None;
            for sub in alternatives {
                let n = request_gpus(sub, opts, &name)?;
                least = Some(least.map_or(n, |l| l.min(n)));
            }
            least.unwrap_or(0)
        } else {
            0
        };
        total = total
            .checked_add(gpus)
            .filter(|n| *n <= MAX_GPUS)
            .ok_or_else(|| Counted::Invalid(format!("more than {MAX_GPUS} GPUs a pod")))?;
    }
    Ok(total)
}

/// GPUs one (sub)request asks for: 0 unless its DeviceClass is a GPU class.
fn request_gpus(r: &Value, opts: &DraOptions, name: &str) -> Result<u64, Counted> {
    let class = r.get("deviceClassName").and_then(Value::as_str);
    if !class.is_some_and(|c| opts.gpu_classes.iter().any(|g| g == c)) {
        return Ok(0);
    }
    match r.get("allocationMode").and_then(Value::as_str) {
        None | Some("ExactCount") => {}
        Some("All") => return Err(Counted::All(name.to_string())),
        Some(other) => {
            return Err(Counted::Invalid(format!(
                "request {name}: allocationMode {:?} is neither ExactCount nor All",
                bounded(other)
            )));
        }
    }
    match r.get("count") {
        None => Ok(1),
        Some(c) => c
            .as_u64()
            .filter(|n| (1..=MAX_GPUS).contains(n))
            .ok_or_else(|| {
                Counted::Invalid(format!(
                    "request {name}: count {c} is not a whole number from 1 to {MAX_GPUS}"
                ))
            }),
    }
}

/// The CEL expression a GPU request gets for `class`: coherent GPUs are those the driver
/// publishes with `addressingMode` ATS; discrete ones those it publishes as HMM or None, or
/// without the attribute (an older driver); a value the driver does not write (what the
/// operator does not believe) is neither. The attribute is tested for first, so a device
/// without it never fails to evaluate.
pub fn class_selector(class: NodeClass, driver: &str) -> String {
    let attrs = format!("device.attributes[\"{driver}\"]");
    match class {
        NodeClass::Coherent => {
            format!("\"addressingMode\" in {attrs} && {attrs}.addressingMode == \"ATS\"")
        }
        NodeClass::Discrete => {
            format!(
                "!(\"addressingMode\" in {attrs}) || {attrs}.addressingMode in [\"HMM\", \"None\"]"
            )
        }
    }
}

/// The CEL expression a GPU request gets where the decision needs `bytes` of memory on each
/// GPU: the device's `memory` capacity at least that (NVIDIA's driver publishes it as a
/// quantity under its own domain). A device without the capacity is not chosen.
pub fn memory_selector(bytes: u64, driver: &str) -> String {
    let capacity = format!("device.capacity[\"{driver}\"]");
    format!("\"memory\" in {capacity} && {capacity}.memory.compareTo(quantity(\"{bytes}\")) >= 0")
}

/// Name of the operator's copy of `template` for job `job`.
pub fn pinned_name(job: &str, claim: &str) -> String {
    format!("{job}-{claim}")
}

/// Where a copied claim template's GPU requests are pinned: the node class, and the memory each
/// GPU must have for the decision's configuration to fit (where it was sized).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pin {
    /// The class (`None`: any).
    pub class: Option<NodeClass>,
    /// Bytes of memory each allocated GPU must have.
    pub min_gpu_memory: Option<u64>,
}

/// A copy of `template` named `name` in `namespace` (owned by `owner`) whose GPU requests all
/// carry the selector of the pin's class (and, where the decision was sized, of the GPU memory
/// it needs), beside whatever selectors they have.
pub fn pinned_template(
    template: &ResourceClaimTemplate,
    name: &str,
    namespace: &str,
    owner: OwnerReference,
    labels: BTreeMap<String, String>,
    pin: Pin,
    opts: &DraOptions,
) -> ResourceClaimTemplate {
    let mut spec = template.spec.clone();
    let mut added: Vec<Value> = pin
        .class
        .map(|c| json!({"cel": {"expression": class_selector(c, &opts.driver)}}))
        .into_iter()
        .collect();
    if let Some(bytes) = pin.min_gpu_memory {
        added.push(json!({"cel": {"expression": memory_selector(bytes, &opts.driver)}}));
    }
    let is_gpu = |r: &Value| {
        r.get("deviceClassName")
            .and_then(Value::as_str)
            .is_some_and(|c| opts.gpu_classes.iter().any(|g| g == c))
    };
    let add = |r: &mut Value| {
        if let Some(obj) = r.as_object_mut() {
            let selectors = obj
                .entry("selectors")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Some(list) = selectors.as_array_mut() {
                list.extend(added.iter().cloned());
            }
        }
    };
    if let Some(requests) = spec
        .spec
        .pointer_mut("/devices/requests")
        .and_then(Value::as_array_mut)
    {
        for r in requests {
            if let Some(exactly) = r.get_mut("exactly").filter(|e| is_gpu(e)) {
                add(exactly);
            }
            if let Some(subs) = r.get_mut("firstAvailable").and_then(Value::as_array_mut) {
                for sub in subs.iter_mut().filter(|s| is_gpu(s)) {
                    add(sub);
                }
            }
        }
    }
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec,
    }
}

#[cfg(test)]
mod tests;
