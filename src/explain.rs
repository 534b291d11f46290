//! `offload-operator explain`: resolves a TrainingJob, or a Pod or job of another kind, against
//! node reports and profiles (from files or from the current cluster) and shows the decision, its
//! reasons and everything the operator would write: env, node affinity, the start-up guard and
//! the DeepSpeed JSON. Nothing is changed anywhere.
//!
//! It runs the operator's own code: a TrainingJob goes through the controller's decision and
//! workload builder ([`crate::controller::decide_with`], [`build_workload`]); other kinds through
//! the mutating webhook's handlers. With `candidates`, every alternative the renderer could
//! write for a DeepSpeed job (each knob flipped on its own) is rendered beside the choice: the
//! input of `hack/gpu/decision-bench.sh`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, EnvVar, NodeAffinity};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use serde::Serialize;
use serde_json::{Value, json};

use crate::api::{Framework, OffloadProfileSpec, Switch, TrainingJob, TrainingJobSpec};
use crate::controller::workload::build_workload;
use crate::controller::{Unresolved, decide_with, parse_user_config};
use crate::decision::{FrameworkPlan, Resolution, opted_in};
use crate::index::NodeIndex;
use crate::render::{self, RenderOptions, deepspeed};
use crate::version;
use crate::webhook::admit::{self, ClusterView};
use crate::webhook::kinds::ApiFeatures;

/// What a decision is made from.
pub struct Inputs {
    /// Profiles by name.
    pub profiles: BTreeMap<String, OffloadProfileSpec>,
    /// The GPU nodes.
    pub nodes: Arc<NodeIndex>,
    /// DeepSpeed configs by ConfigMap name (the text of the key the job names), for jobs that
    /// reference one.
    pub deepspeed_configs: BTreeMap<String, String>,
    /// What the operator writes beside the decision.
    pub render: RenderOptions,
    /// The installed APIs of other job kinds.
    pub features: ApiFeatures,
}

impl ClusterView for Inputs {
    fn profile(&self, name: &str) -> Option<OffloadProfileSpec> {
        self.profiles.get(name).cloned()
    }
    fn nodes(&self) -> Arc<NodeIndex> {
        self.nodes.clone()
    }
    fn features(&self) -> ApiFeatures {
        self.features
    }
    fn render_options(&self) -> RenderOptions {
        self.render.clone()
    }
}

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
        }
    }
}

/// One reason of the decision.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ReasonView {
    /// The setting explained.
    pub field: String,
    /// Why.
    pub message: String,
}

/// An alternative the renderer could write for the same job.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// Short name: what differs from the choice.
    pub label: String,
    /// Whether this is what the operator writes.
    pub chosen: bool,
    /// Whether it trains the same way as the choice (`false`: asynchronous updates).
    pub same_semantics: bool,
    /// The DeepSpeed JSON it would write.
    pub deepspeed_config: Option<Value>,
    /// Why it cannot be written, when it cannot.
    pub refused: Option<String>,
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
    /// The object as the operator would create or admit it (the batch Job of a TrainingJob).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    /// With `--candidates`: the choice and every alternative.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Candidate>,
    /// For a running job read from the cluster: what its GPUs were observed doing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<crate::api::ObservedOverlap>,
    /// For a running job with overlap on: the `OverlapObserved` condition's verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap_observed: Option<String>,
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
        let mut tj: TrainingJob = serde_json::from_value(manifest.clone()).map_err(|e| {
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

fn full_name(ns: Option<&str>, name: Option<&str>) -> String {
    format!(
        "{}/{}",
        ns.unwrap_or("default"),
        name.unwrap_or("(no name)")
    )
}

/// The user's DeepSpeed config of a job, from the inputs (what the controller reads from its
/// ConfigMap).
fn user_config(tj: &TrainingJob, inputs: &Inputs) -> Result<(Option<Value>, Option<u8>), String> {
    let Some(r) = tj
        .spec
        .deepspeed
        .as_ref()
        .and_then(|d| d.config_map_ref.as_ref())
    else {
        return Ok((None, None));
    };
    match inputs.deepspeed_configs.get(&r.name) {
        Some(text) => parse_user_config(text, &format!("ConfigMap {:?}", r.name)),
        None => Err(format!(
            "ConfigMap {:?} (spec.deepspeed.configMapRef) was not given (--deepspeed-config) and is not in the cluster",
            r.name
        )),
    }
}

fn explain_training_job(tj: &TrainingJob, inputs: &Inputs, with_candidates: bool) -> Explanation {
    let name = full_name(
        tj.metadata.namespace.as_deref(),
        tj.metadata.name.as_deref(),
    );
    let mut out = Explanation {
        kind: "TrainingJob".into(),
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
        object: None,
        candidates: Vec::new(),
        observed: tj.status.as_ref().and_then(|st| st.observed.clone()),
        overlap_observed: tj.status.as_ref().and_then(|st| {
            st.conditions
                .iter()
                .find(|c| c.type_ == crate::controller::observation::OVERLAP_OBSERVED)
                .map(|c| format!("{} ({}): {}", c.status, c.reason, c.message))
        }),
    };
    if !opted_in(tj) {
        out.reason = Some("NotRequested".into());
        out.message = "the job names no OffloadProfile and sets no spec.offload field: it runs without offload configuration".into();
        if let Ok(w) = build_workload(tj, None, None, &inputs.render) {
            out.object = serde_json::to_value(&w.job).ok();
        }
        return out;
    }
    let decided = decide_with(
        tj,
        |n| inputs.profiles.get(n).cloned(),
        user_config(tj, inputs),
        &inputs.nodes,
    );
    let (res, user) = match decided {
        Ok(pair) => pair,
        Err(why) => {
            out.reason = Some(why.reason().into());
            out.message = why.message();
            return out;
        }
    };
    out.resolved = true;
    out.message = res.summary();
    out.decision = Some(DecisionView::of(&res));
    out.reasons = res
        .reasons
        .iter()
        .map(|r| ReasonView {
            field: r.field.as_str().to_string(),
            message: r.message.clone(),
        })
        .collect();
    match build_workload(tj, Some(&res), user.as_ref(), &inputs.render) {
        Ok(w) => {
            let spec = w.job.spec.as_ref().and_then(|s| s.template.spec.as_ref());
            out.env = spec
                .and_then(|s| s.containers.first())
                .and_then(|c| c.env.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|e| crate::names::OPERATOR_ENV.contains(&e.name.as_str()))
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
            out.reason = Some(Unresolved::Config(e.to_string()).reason().into());
            out.message = e.to_string();
        }
    }
    if with_candidates {
        out.candidates = candidates(tj, inputs, &res, out.deepspeed_config.as_ref());
    }
    out
}

fn rendered_config(w: &crate::controller::workload::Workload) -> Option<Value> {
    let data = w.config_map.as_ref()?.data.as_ref()?;
    let text = data.get(deepspeed::CONFIG_FILE_NAME)?;
    serde_json::from_str(text).ok()
}

/// One knob of a DeepSpeed job's rendering, and how a job asks for each value.
struct Knob {
    name: &'static str,
    set: fn(&mut TrainingJobSpec, bool),
    get: fn(&Resolution) -> bool,
}

fn ds_spec(spec: &mut TrainingJobSpec) -> &mut crate::api::DeepSpeedSpec {
    spec.deepspeed.get_or_insert_with(Default::default)
}

fn knobs(res: &Resolution) -> Vec<Knob> {
    let FrameworkPlan::DeepSpeed(plan) = &res.framework else {
        return Vec::new();
    };
    let mut out = vec![Knob {
        name: "pin_memory",
        set: |s, on| {
            s.offload.pin_memory = if on {
                Switch::Enabled
            } else {
                Switch::Disabled
            }
        },
        get: |r| r.pin_memory,
    }];
    if plan.stage == 3 {
        out.push(Knob {
            name: "offload_param",
            set: |s, on| ds_spec(s).offload_params = Some(on),
            get: |r| matches!(&r.framework, FrameworkPlan::DeepSpeed(p) if p.offload_params),
        });
    }
    if version::deepspeed::has(&plan.version, version::deepspeed::SUPER_OFFLOAD) {
        out.push(Knob {
            name: "super_offload",
            set: |s, on| ds_spec(s).super_offload = Some(on),
            get: |r| matches!(&r.framework, FrameworkPlan::DeepSpeed(p) if p.super_offload),
        });
    }
    if plan.stage >= 1 && version::deepspeed::has(&plan.version, version::deepspeed::ZENFLOW) {
        out.push(Knob {
            name: "zenflow",
            set: |s, on| ds_spec(s).zen_flow = Some(on),
            get: |r| matches!(&r.framework, FrameworkPlan::DeepSpeed(p) if p.zenflow),
        });
    }
    out
}

/// The choice and, for each knob, the rendering with that knob flipped (and nothing else).
fn candidates(
    tj: &TrainingJob,
    inputs: &Inputs,
    chosen: &Resolution,
    chosen_config: Option<&Value>,
) -> Vec<Candidate> {
    let zenflow_on =
        |r: &Resolution| matches!(&r.framework, FrameworkPlan::DeepSpeed(p) if p.zenflow);
    let mut out = vec![Candidate {
        label: "chosen".into(),
        chosen: true,
        same_semantics: true,
        deepspeed_config: chosen_config.cloned(),
        refused: None,
    }];
    if tj.spec.framework.name != Framework::DeepSpeed {
        return out;
    }
    for knob in knobs(chosen) {
        let flipped = !(knob.get)(chosen);
        let mut variant = tj.clone();
        // Pin the other knobs to what was chosen, so only this one moves.
        for other in knobs(chosen) {
            (other.set)(&mut variant.spec, (other.get)(chosen));
        }
        (knob.set)(&mut variant.spec, flipped);
        let label = format!("{}={}", knob.name, if flipped { "on" } else { "off" });
        let decided = decide_with(
            &variant,
            |n| inputs.profiles.get(n).cloned(),
            user_config(&variant, inputs),
            &inputs.nodes,
        );
        let candidate = match decided {
            Err(why) => Candidate {
                label,
                chosen: false,
                same_semantics: true,
                deepspeed_config: None,
                refused: Some(why.message()),
            },
            Ok((res, user)) => {
                let config = build_workload(&variant, Some(&res), user.as_ref(), &inputs.render)
                    .ok()
                    .as_ref()
                    .and_then(rendered_config);
                let moved = (knob.get)(&res) == flipped;
                Candidate {
                    label,
                    chosen: false,
                    same_semantics: zenflow_on(&res) == zenflow_on(chosen),
                    refused: (!moved).then(|| {
                        format!(
                            "the operator does not write {} {} for this job (see the reasons)",
                            knob.name,
                            if flipped { "on" } else { "off" }
                        )
                    }),
                    deepspeed_config: config,
                }
            }
        };
        out.push(candidate);
    }
    out
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
    let mut resolved = None;
    let verdict = if kind == "Pod" {
        admit::mutate_pod_explained(&req, inputs, &mut resolved)
    } else {
        admit::mutate_workload_explained(&req, inputs, &mut resolved)
    };
    let name = full_name(
        Some(ns),
        obj.pointer("/metadata/name").and_then(Value::as_str),
    );
    let response = verdict.response;
    let mut out = Explanation {
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
        object: None,
        candidates: Vec::new(),
        observed: None,
        overlap_observed: None,
    };
    if !response.allowed {
        out.reason = verdict.denied.map(str::to_string);
        out.message = response.result.message.clone();
        return Ok(out);
    }
    let Some(res) = resolved else {
        out.reason = Some("NotOptedIn".into());
        out.message = format!(
            "the {kind} has no {} label: the webhook admits it unchanged",
            crate::names::PROFILE_ANNOTATION
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
    out.resolved = true;
    out.message = res.summary();
    out.decision = Some(DecisionView::of(&res));
    out.reasons = res
        .reasons
        .iter()
        .map(|r| ReasonView {
            field: r.field.as_str().to_string(),
            message: r.message.clone(),
        })
        .collect();
    out.env = render::env_vars(&res, None);
    out.node_affinity = render::node_affinity(&res);
    out.object = Some(mutated);
    Ok(out)
}

/// The human-readable form.
pub fn to_text(e: &Explanation) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "{} {}", e.kind, e.name);
    if !e.resolved && e.decision.is_some() {
        let _ = writeln!(
            s,
            "  not configured ({}): {}",
            e.reason.as_deref().unwrap_or("?"),
            e.message
        );
    }
    match &e.decision {
        Some(d) => {
            let _ = writeln!(
                s,
                "  decision: mode={} overlap={} ratio={} pinMemory={} nodeClass={} profile={}{}",
                d.mode,
                if d.overlap { "on" } else { "off" },
                d.ratio,
                d.pin_memory,
                d.node_class.as_deref().unwrap_or("none"),
                d.profile,
                d.overlap_efficiency
                    .map(|x| format!(" (measured overlap efficiency {x:.2})"))
                    .unwrap_or_default()
            );
        }
        None => {
            let _ = writeln!(
                s,
                "  not configured ({}): {}",
                e.reason.as_deref().unwrap_or("?"),
                e.message
            );
        }
    }
    if let Some(o) = &e.observed {
        let _ = writeln!(
            s,
            "  observed: GPUs busy {:.0} % ({} GPU(s){}; windows of {:.0} s, oldest ending {})",
            o.gpu_busy * 100.0,
            o.gpus,
            o.cpu_cores
                .map(|c| format!(", {c:.1} CPU cores"))
                .unwrap_or_default(),
            o.window_seconds,
            o.observed_at
        );
        for n in &o.nodes {
            let _ = writeln!(
                s,
                "    {:<24} busy {:.0} % on {} GPU(s){}",
                n.node,
                n.gpu_busy * 100.0,
                n.gpus,
                n.cpu_cores
                    .map(|c| format!(", {c:.1} CPU cores"))
                    .unwrap_or_default()
            );
        }
    }
    if let Some(v) = &e.overlap_observed {
        let _ = writeln!(s, "  overlap observed: {v}");
    }
    if !e.reasons.is_empty() {
        let _ = writeln!(s, "  why:");
        for r in &e.reasons {
            let _ = writeln!(s, "    {:<13} {}", r.field, r.message);
        }
    }
    if !e.env.is_empty() {
        let _ = writeln!(s, "  env:");
        for v in &e.env {
            let _ = writeln!(s, "    {}={}", v.name, v.value.as_deref().unwrap_or(""));
        }
    }
    if let Some(reqs) = e
        .node_affinity
        .as_ref()
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .and_then(|r| r.node_selector_terms.first())
        .and_then(|t| t.match_expressions.as_ref())
    {
        let _ = writeln!(s, "  node affinity (required):");
        for r in reqs {
            let _ = writeln!(
                s,
                "    {} {} {}",
                r.key,
                r.operator,
                r.values.clone().unwrap_or_default().join(",")
            );
        }
    }
    for c in &e.init_containers {
        let _ = writeln!(
            s,
            "  start-up guard: init container {} ({}) {}",
            c.name,
            c.image.as_deref().unwrap_or(""),
            c.args.clone().unwrap_or_default().join(" ")
        );
    }
    if let Some(cfg) = &e.deepspeed_config {
        let _ = writeln!(s, "  DeepSpeed config ({}):", deepspeed::CONFIG_FILE_NAME);
        let text = serde_json::to_string_pretty(cfg).unwrap_or_default();
        for line in text.lines() {
            let _ = writeln!(s, "    {line}");
        }
    }
    if !e.candidates.is_empty() {
        let _ = writeln!(s, "  candidates:");
        for c in &e.candidates {
            let zero = c
                .deepspeed_config
                .as_ref()
                .and_then(|v| v.get("zero_optimization"))
                .map(|z| z.to_string())
                .unwrap_or_default();
            let note = match (&c.refused, c.same_semantics) {
                (Some(r), _) => format!(" [not written: {r}]"),
                (None, false) => " [changes the optimisation: needs consent]".to_string(),
                (None, true) => String::new(),
            };
            let _ = writeln!(s, "    {:<20} {zero}{note}", c.label);
        }
    }
    s
}

/// Reads the documents of a YAML or JSON file (`---`-separated; `List` objects unpacked).
pub fn read_manifests(text: &str) -> Result<Vec<Value>, ExplainError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| ExplainError::Manifest(format!("not YAML or JSON: {e}")))?;
    let mut out = Vec::new();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        match doc.get("items").and_then(Value::as_array) {
            Some(items) if doc.get("kind").and_then(Value::as_str) == Some("List") => {
                out.extend(items.iter().cloned());
            }
            _ => out.push(doc),
        }
    }
    if out.is_empty() {
        return Err(ExplainError::Manifest("the file holds no object".into()));
    }
    Ok(out)
}

/// A node from a recorded report file (`[NAME=]PATH`; the name defaults to the report's own).
pub fn node_from_report(arg: &str) -> Result<crate::index::NodeInfo, ExplainError> {
    let (name, path) = match arg.split_once('=') {
        Some((n, p)) if !n.contains('/') => (Some(n.to_string()), p),
        _ => (None, arg),
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| ExplainError::Manifest(format!("reading node report {path}: {e}")))?;
    let report = crate::report::NodeReport::parse(&text)
        .map_err(|e| ExplainError::Manifest(format!("node report {path}: {e}")))?;
    let name = name.unwrap_or_else(|| report.node.clone());
    Ok(crate::index::NodeInfo::from_metadata(
        &name,
        report.labels(),
        &BTreeMap::from([(crate::names::ANNOTATION_NODE_REPORT.to_string(), text)]),
    ))
}

/// Profiles from manifest files; the built-in `default` profile when none is given.
pub fn profiles_from_files(
    paths: &[std::path::PathBuf],
) -> Result<BTreeMap<String, OffloadProfileSpec>, ExplainError> {
    let mut out = BTreeMap::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ExplainError::Manifest(format!("reading profile {}: {e}", path.display()))
        })?;
        for doc in read_manifests(&text)? {
            let p: crate::api::OffloadProfile = serde_json::from_value(doc).map_err(|e| {
                ExplainError::Manifest(format!("{}: not an OffloadProfile: {e}", path.display()))
            })?;
            let name = p.metadata.name.clone().unwrap_or_default();
            out.insert(name, p.spec);
        }
    }
    if out.is_empty() {
        out.insert(
            crate::names::DEFAULT_PROFILE.to_string(),
            OffloadProfileSpec::default(),
        );
    }
    Ok(out)
}

/// DeepSpeed configs from `NAME=PATH` arguments (NAME: the ConfigMap the job references).
pub fn deepspeed_configs_from_files(
    args: &[String],
) -> Result<BTreeMap<String, String>, ExplainError> {
    args.iter()
        .map(|a| {
            let (name, path) = a.split_once('=').ok_or_else(|| {
                ExplainError::Manifest(format!(
                    "--deepspeed-config {a}: use CONFIGMAP=PATH (the ConfigMap the job references)"
                ))
            })?;
            let text = std::fs::read_to_string(path)
                .map_err(|e| ExplainError::Manifest(format!("reading {path}: {e}")))?;
            Ok((name.to_string(), text))
        })
        .collect()
}

/// Profiles, nodes and the jobs' DeepSpeed ConfigMaps from the current cluster.
pub async fn inputs_from_cluster(
    client: &kube::Client,
    manifests: &[Value],
    render: RenderOptions,
) -> Result<Inputs, kube::Error> {
    use k8s_openapi::api::core::v1::{ConfigMap, Node};
    use kube::api::{Api, ListParams};
    let profiles = Api::<crate::api::OffloadProfile>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), p.spec))
        .collect();
    let nodes = Api::<Node>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|n| {
            crate::index::NodeInfo::from_metadata(
                n.metadata.name.as_deref().unwrap_or_default(),
                n.metadata.labels.clone().unwrap_or_default(),
                &n.metadata.annotations.clone().unwrap_or_default(),
            )
        })
        .collect();
    let mut deepspeed_configs = BTreeMap::new();
    for m in manifests {
        let Some(r) = m.pointer("/spec/deepspeed/configMapRef") else {
            continue;
        };
        let (Some(name), ns) = (
            r.get("name").and_then(Value::as_str),
            m.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default"),
        ) else {
            continue;
        };
        let key = r
            .get("key")
            .and_then(Value::as_str)
            .unwrap_or(deepspeed::CONFIG_FILE_NAME);
        if let Some(cm) = Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?
            && let Some(text) = cm.data.as_ref().and_then(|d| d.get(key))
        {
            deepspeed_configs.insert(name.to_string(), text.clone());
        }
    }
    Ok(Inputs {
        profiles,
        nodes: Arc::new(NodeIndex::new(nodes)),
        deepspeed_configs,
        render,
        features: ApiFeatures::default(),
    })
}

#[cfg(test)]
mod tests {
    use offload_testenv::fixtures;

    use super::*;

    fn inputs(reports: &[(&str, &str)]) -> Inputs {
        let nodes = reports
            .iter()
            .map(|(name, fixture)| {
                let r = crate::report::NodeReport::parse(fixture).unwrap();
                crate::index::NodeInfo::from_metadata(
                    *name,
                    r.labels(),
                    &BTreeMap::from([(
                        crate::names::ANNOTATION_NODE_REPORT.to_string(),
                        fixture.to_string(),
                    )]),
                )
            })
            .collect();
        Inputs {
            profiles: profiles_from_files(&[]).unwrap(),
            nodes: Arc::new(NodeIndex::new(nodes)),
            deepspeed_configs: BTreeMap::from([(
                "ds".to_string(),
                r#"{"bf16": {"enabled": true}, "zero_optimization": {"stage": 3}}"#.to_string(),
            )]),
            render: RenderOptions {
                guard_image: Some("agent:1".into()),
            },
            features: ApiFeatures::default(),
        }
    }

    const JOB: &str = r#"
apiVersion: offload.dev/v1alpha1
kind: TrainingJob
metadata: {name: j, annotations: {offload.dev/profile: auto}}
spec:
  replicas: 1
  framework: {name: DeepSpeed, version: "0.19.8"}
  deepspeed: {configMapRef: {name: ds}}
  template:
    spec:
      restartPolicy: Never
      containers: [{name: t, image: t, resources: {limits: {nvidia.com/gpu: 1}}}]
"#;

    #[test]
    fn a_training_job_is_explained_with_every_artefact_and_its_candidates() {
        let manifests = read_manifests(JOB).unwrap();
        let e = explain(
            &manifests[0],
            &inputs(&[("h200-0", fixtures::H200_READING)]),
            true,
        )
        .unwrap();
        assert!(e.resolved, "{}", e.message);
        assert_eq!(e.decision.as_ref().unwrap().mode, "CPUCopy");
        assert!(e.reasons.iter().any(|r| r.field == "framework"));
        assert!(e.env.iter().any(|v| v.name == "OFFLOAD_MODE"));
        assert!(e.node_affinity.is_some());
        assert_eq!(e.init_containers[0].name, render::GUARD_CONTAINER);
        let zero = &e.deepspeed_config.as_ref().unwrap()["zero_optimization"];
        assert_eq!(zero["offload_param"]["device"], "cpu");
        // The choice and one candidate per knob; ZenFlow marked as another kind of training.
        let labels: Vec<&str> = e.candidates.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "chosen",
                "pin_memory=off",
                "offload_param=off",
                "super_offload=on",
                "zenflow=on"
            ]
        );
        let zen = e.candidates.last().unwrap();
        assert!(!zen.same_semantics && zen.refused.is_none());
        assert!(zen.deepspeed_config.as_ref().unwrap()["zero_optimization"]["zenflow"].is_object());
        let text = to_text(&e);
        assert!(
            text.contains("candidates:") && text.contains("needs consent"),
            "{text}"
        );
        // JSON for tools.
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["decision"]["nodeClass"], "Discrete");
    }

    #[test]
    fn what_cannot_be_decided_says_why() {
        let manifests = read_manifests(JOB).unwrap();
        // No node at all.
        let e = explain(&manifests[0], &inputs(&[]), false).unwrap();
        assert!(!e.resolved);
        assert_eq!(e.reason.as_deref(), Some("NoReportedNodes"), "{e:?}");
        // The referenced config was not given.
        let mut i = inputs(&[("h200-0", fixtures::H200_READING)]);
        i.deepspeed_configs.clear();
        let e = explain(&manifests[0], &i, false).unwrap();
        assert_eq!(e.reason.as_deref(), Some("InvalidDeepSpeedConfig"));
        assert!(e.message.contains("--deepspeed-config"), "{}", e.message);
    }

    #[test]
    fn pods_and_other_kinds_go_through_the_webhook() {
        let pod = read_manifests(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {offload.dev/profile: auto}}\nspec: {containers: [{name: c, image: i, resources: {limits: {nvidia.com/gpu: 1}}}]}\n",
        )
        .unwrap();
        let e = explain(
            &pod[0],
            &inputs(&[("gh200-0", fixtures::GH200_REFERENCE)]),
            false,
        )
        .unwrap();
        assert!(e.resolved, "{}", e.message);
        assert_eq!(e.decision.unwrap().mode, "UnifiedMemory");
        let obj = e.object.unwrap();
        assert!(obj.pointer("/spec/initContainers/0/name").is_some());
        assert!(
            obj.pointer("/metadata/annotations/offload.dev~1resolved")
                .is_some()
        );
        // Not opted in: unchanged.
        let plain = read_manifests(
            "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n",
        )
        .unwrap();
        let e = explain(&plain[0], &inputs(&[]), false).unwrap();
        assert_eq!(e.reason.as_deref(), Some("NotOptedIn"));
    }

    #[test]
    fn bad_manifests_get_a_clear_error() {
        assert!(read_manifests("").is_err());
        assert!(read_manifests(": : :\n- [").is_err());
        let i = inputs(&[]);
        for (doc, expect) in [
            ("{}", "no kind"),
            ("{kind: Deployment}", "not a kind the operator configures"),
            (
                "{kind: TrainingJob, apiVersion: offload.dev/v1alpha1, metadata: {name: x}, spec: {replicas: many}}",
                "does not match its schema",
            ),
        ] {
            let m = read_manifests(doc).unwrap();
            let err = explain(&m[0], &i, false).unwrap_err().to_string();
            assert!(err.contains(expect), "{doc}: {err}");
        }
        assert!(node_from_report("/nonexistent.json").is_err());
        assert!(deepspeed_configs_from_files(&["no-equals".into()]).is_err());
    }
}
