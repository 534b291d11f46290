//! `offload-operator explain`: resolves a TrainingJob, or a Pod or job of another kind, against
//! node reports and profiles (from files or from the current cluster) and shows the decision, its
//! reasons and everything the operator would write: env, node affinity, the start-up guard and
//! the DeepSpeed JSON. Nothing is changed anywhere.
//!
//! It runs the operator's own code: a TrainingJob goes through the one way into the decision
//! ([`crate::decision::decide`]) and the controller's workload builder ([`build_workload`]);
//! other kinds through the mutating webhook's handlers. With `candidates`, every alternative
//! the renderer could write for the job is rendered beside the choice with its memory
//! estimate ([`candidates`]): the input of `hack/gpu/decision-bench.sh`.

mod candidates;
pub mod command;
mod inputs;
mod observed;
mod text;

use k8s_openapi::api::core::v1::{Container, EnvVar, NodeAffinity};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use serde::Serialize;
use serde_json::{Value, json};

use crate::decision::{MemoryEstimate, Resolution, decide, opted_in};
use crate::render::workload::{Workload, build_workload};
use crate::render::{self, deepspeed};
use crate::webhook::admit::{self, Review};
use offload_api::v1alpha1::TrainingJob;

pub use candidates::{Candidate, CandidateMemory};
pub use inputs::{
    Inputs, MAX_INPUT_BYTES, claim_templates_from_files, deepspeed_configs_from_files,
    inputs_from_cluster, model_configs_from_files, node_from_report, profiles_from_files,
    read_bounded, read_manifests, slices_from_files, with_node_cpus, with_node_memory, with_slices,
};
pub use observed::{Evidence, LoopStep, Outcome, explain_after, read_evidence};
pub use text::to_text;

/// A manifest that cannot be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// Not a Kubernetes object this command knows.
    #[error("{0}")]
    Manifest(String),
}

/// The decision, as `kubectl get tj` would show it.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DecisionView {
    /// Profile used.
    pub profile: String,
    /// Offload mode.
    pub mode: String,
    /// Overlap on or off.
    pub overlap: bool,
    /// Offload ratio.
    pub ratio: f64,
    /// Pinned host memory.
    pub pin_memory: bool,
    /// Node class the pods are pinned to.
    pub node_class: Option<String>,
    /// Lowest overlap efficiency measured on the chosen nodes.
    pub overlap_efficiency: Option<f64>,
    /// The memory model's estimate for what is written, where the job gives model hints.
    pub memory: Option<CandidateMemory>,
}

impl DecisionView {
    fn of(res: &Resolution) -> Self {
        DecisionView {
            profile: res.profile.clone(),
            mode: res.mode.to_string(),
            overlap: res.overlap,
            ratio: res.ratio,
            pin_memory: res.pin_memory,
            node_class: res.node_class.map(|c| c.to_string()),
            overlap_efficiency: res.overlap_efficiency,
            memory: res
                .memory
                .as_ref()
                .map(|m: &MemoryEstimate| CandidateMemory::of(m, true)),
        }
    }
}

/// One reason of the decision.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ReasonView {
    /// The setting explained.
    pub field: String,
    /// What decided it.
    pub code: offload_api::v1alpha1::ReasonCode,
    /// The sentence status shows.
    pub summary: String,
    /// The whole account, every figure.
    pub message: String,
}

/// Everything `explain` shows for one object.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// Kind of the object.
    pub kind: String,
    /// `namespace/name`.
    pub name: String,
    /// Whether a configuration would be written.
    pub resolved: bool,
    /// Why not, as a condition reason (or the webhook's denial category).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The decision's summary, or what is wrong and what to change.
    pub message: String,
    /// The decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionView>,
    /// Every reason, in decision order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<ReasonView>,
    /// The env written into every container.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// The node affinity the pods get.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<NodeAffinity>,
    /// Init containers the operator adds (the start-up guard).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<Container>,
    /// The DeepSpeed JSON the pods get.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deepspeed_config: Option<Value>,
    /// The copies of the pods' GPU claim templates that select the decided class (DRA).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claim_templates: Vec<Value>,
    /// The object as the operator would create or admit it (the batch Job of a TrainingJob).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    /// With `--candidates`: the choice and every alternative.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Candidate>,
    /// For a running job read from the cluster: what its GPUs were observed doing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<offload_api::v1alpha1::ObservedOverlap>,
    /// For a running job with overlap on: the `OverlapObserved` condition's verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap_observed: Option<String>,
    /// With `--observed`: each run's evidence and what it taught, in order; the decision is the
    /// one made after them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub closed_loop: Vec<LoopStep>,
}

impl Explanation {
    fn new(kind: &str, name: String) -> Self {
        Explanation {
            kind: kind.to_string(),
            name,
            resolved: false,
            reason: None,
            message: String::new(),
            decision: None,
            reasons: Vec::new(),
            env: Vec::new(),
            node_affinity: None,
            init_containers: Vec::new(),
            deepspeed_config: None,
            claim_templates: Vec::new(),
            object: None,
            candidates: Vec::new(),
            observed: None,
            overlap_observed: None,
            closed_loop: Vec::new(),
        }
    }

    fn resolved_with(&mut self, res: &Resolution) {
        self.resolved = true;
        self.message = res.summary();
        self.decision = Some(DecisionView::of(res));
        self.reasons = res
            .reasons
            .iter()
            .map(|r| ReasonView {
                field: r.field.as_str().to_string(),
                code: r.code,
                summary: r.short(),
                message: r.message.clone(),
            })
            .collect();
    }

    /// Whether the object is one the operator refuses or holds (not merely one that did not
    /// opt in): `explain` exits non-zero for those, so scripts and CI notice.
    pub fn refused(&self) -> bool {
        !self.resolved && !matches!(self.reason.as_deref(), Some("NotOptedIn" | "NotRequested"))
    }
}

/// Explains one manifest.
pub fn explain(
    manifest: &Value,
    inputs: &Inputs,
    candidates: bool,
) -> Result<Explanation, ExplainError> {
    let kind = manifest
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| ExplainError::Manifest("the manifest has no kind".into()))?;
    if kind == "TrainingJob" {
        let mut tj: TrainingJob =
            crate::cluster::tolerant::from_value(manifest.clone()).map_err(|e| {
                ExplainError::Manifest(format!("the TrainingJob does not match its schema: {e}"))
            })?;
        tj.metadata
            .namespace
            .get_or_insert_with(|| "default".into());
        // The workload's owner reference needs one; a manifest not yet created has none.
        tj.metadata
            .uid
            .get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".into());
        Ok(explain_training_job(&tj, inputs, candidates))
    } else {
        explain_object(manifest, inputs)
    }
}

/// Explains a TrainingJob manifest after the runs of `evidence` (see [`explain_after`]).
pub fn explain_observed(
    manifest: &Value,
    inputs: &mut Inputs,
    evidence: &[Evidence],
) -> Result<Explanation, ExplainError> {
    if manifest.get("kind").and_then(Value::as_str) != Some("TrainingJob") {
        return Err(ExplainError::Manifest(
            "--observed explains a TrainingJob: the operator re-decides only those".into(),
        ));
    }
    let mut tj: TrainingJob =
        crate::cluster::tolerant::from_value(manifest.clone()).map_err(|e| {
            ExplainError::Manifest(format!("the TrainingJob does not match its schema: {e}"))
        })?;
    tj.metadata
        .namespace
        .get_or_insert_with(|| "default".into());
    tj.metadata
        .uid
        .get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".into());
    Ok(explain_after(&tj, inputs, evidence))
}

fn full_name(ns: Option<&str>, name: Option<&str>) -> String {
    format!(
        "{}/{}",
        ns.unwrap_or("default"),
        name.unwrap_or("(no name)")
    )
}

/// The decision for a TrainingJob from the inputs, through the one way in.
fn decided(
    tj: &TrainingJob,
    inputs: &Inputs,
) -> Result<(Resolution, Option<Value>), crate::decision::Unresolved> {
    let config = inputs.user_config(tj);
    let model = inputs.model_config(tj);
    let res = decide(
        tj,
        config.as_ref().map(Option::as_ref),
        model.as_ref().map(Option::as_ref),
        &inputs.view,
    )?;
    Ok((res, config.ok().flatten().map(|c| c.json)))
}

fn explain_training_job(tj: &TrainingJob, inputs: &Inputs, with_candidates: bool) -> Explanation {
    let name = full_name(
        tj.metadata.namespace.as_deref(),
        tj.metadata.name.as_deref(),
    );
    let mut out = Explanation::new("TrainingJob", name);
    out.observed = tj.status.as_ref().and_then(|st| st.observed.clone());
    out.overlap_observed = tj.status.as_ref().and_then(|st| {
        st.conditions
            .iter()
            .find(|c| crate::controller::conditions::ConditionType::OverlapObserved.is(c))
            .map(|c| format!("{} ({}): {}", c.status, c.reason, c.message))
    });
    if !opted_in(tj) {
        out.reason = Some("NotRequested".into());
        out.message = "the job names no OffloadProfile and sets no spec.offload field: it runs without offload configuration".into();
        if let Ok(w) = build_workload(tj, None, None, &inputs.view.render) {
            out.object = serde_json::to_value(&w.job).ok();
        }
        return out;
    }
    let (res, user) = match decided(tj, inputs) {
        Ok(pair) => pair,
        Err(why) => {
            out.reason = Some(why.reason().into());
            out.message = why.message();
            return out;
        }
    };
    out.resolved_with(&res);
    let namespace = tj
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let built =
        build_workload(tj, Some(&res), user.as_ref(), &inputs.view.render).and_then(|mut w| {
            crate::render::workload::pin_claims(&mut w, tj, &res, &|name| {
                crate::decision::ClusterView::claim_template(&inputs.view, &namespace, name)
            })?;
            Ok(w)
        });
    match built {
        Ok(w) => {
            out.claim_templates = w
                .claim_templates
                .iter()
                .filter_map(|t| serde_json::to_value(t).ok())
                .collect();
            let spec = w.job.spec.as_ref().and_then(|s| s.template.spec.as_ref());
            out.env = spec
                .and_then(|s| s.containers.first())
                .and_then(|c| c.env.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|e| offload_api::names::OPERATOR_ENV.contains(&e.name.as_str()))
                .collect();
            out.node_affinity = spec
                .and_then(|s| s.affinity.as_ref())
                .and_then(|a| a.node_affinity.clone());
            out.init_containers = spec
                .and_then(|s| s.init_containers.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c.name == render::GUARD_CONTAINER)
                .collect();
            out.deepspeed_config = rendered_config(&w);
            out.object = serde_json::to_value(&w.job).ok();
        }
        Err(e) => {
            out.resolved = false;
            out.reason = Some("InvalidDeepSpeedConfig".into());
            out.message = e.to_string();
        }
    }
    if with_candidates {
        out.candidates = candidates::all(tj, inputs, &res, out.deepspeed_config.as_ref());
    }
    out
}

fn rendered_config(w: &Workload) -> Option<Value> {
    let data = w.config_map.as_ref()?.data.as_ref()?;
    let text = data.get(deepspeed::CONFIG_FILE_NAME)?;
    serde_json::from_str(text).ok()
}

/// The resource (plural) of a kind the webhook configures.
fn resource_of(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "Pod" => "pods",
        "Job" => "jobs",
        "JobSet" => "jobsets",
        "PyTorchJob" => "pytorchjobs",
        "TrainJob" => "trainjobs",
        _ => return None,
    })
}

/// A Pod or a job of another kind, through the mutating webhook's own handler.
fn explain_object(obj: &Value, inputs: &Inputs) -> Result<Explanation, ExplainError> {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let resource = resource_of(kind).ok_or_else(|| {
        ExplainError::Manifest(format!(
            "{kind} is not a kind the operator configures (TrainingJob, Pod, Job, JobSet, PyTorchJob, TrainJob)"
        ))
    })?;
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("v1");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000000",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "name": obj.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
            "namespace": ns,
            "operation": "CREATE",
            "userInfo": {},
            "object": obj,
            "dryRun": true
        }
    });
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(review)
        .map_err(|e| ExplainError::Manifest(format!("the {kind} cannot be read: {e}")))?;
    let req: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|e| ExplainError::Manifest(format!("the {kind} cannot be read: {e}")))?;
    let review = Review {
        model_config: inputs.annotated_model_config(&req),
        ..Review::new(&inputs.view)
    };
    let verdict = if kind == "Pod" {
        admit::mutate_pod(&req, &review)
    } else {
        admit::mutate_workload(&req, &review)
    };
    let name = full_name(
        Some(ns),
        obj.pointer("/metadata/name").and_then(Value::as_str),
    );
    let mut out = Explanation::new(kind, name);
    let response = verdict.response;
    if !response.allowed {
        out.reason = verdict.denied.map(str::to_string);
        out.message = response.result.message.clone();
        return Ok(out);
    }
    let Some(res) = verdict.resolution else {
        out.reason = Some("NotOptedIn".into());
        out.message = format!(
            "the {kind} has no {} label: the webhook admits it unchanged",
            offload_api::names::PROFILE_ANNOTATION
        );
        out.object = Some(obj.clone());
        return Ok(out);
    };
    let mut mutated = obj.clone();
    if let Some(bytes) = response.patch.as_ref() {
        let patch: json_patch::Patch = serde_json::from_slice(bytes)
            .map_err(|e| ExplainError::Manifest(format!("the webhook's patch: {e}")))?;
        json_patch::patch(&mut mutated, &patch)
            .map_err(|e| ExplainError::Manifest(format!("the webhook's patch: {e}")))?;
    }
    out.resolved_with(&res);
    out.env = render::env_vars(&res, None);
    out.node_affinity = render::node_affinity(&res);
    out.object = Some(mutated);
    Ok(out)
}

#[cfg(test)]
mod tests;
