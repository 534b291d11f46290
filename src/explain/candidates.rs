//! `explain --candidates`: beside the choice, every placement of the training state the memory
//! model sizes (no offload, a partial share, the optimizer state, optimizer state and
//! parameters) and, for a DeepSpeed job, each knob of the rendering flipped on its own — each
//! with its memory estimate beside the node's figures, and rendered where the operator could
//! write it (also where the memory model says it would not fit, so a benchmark can show it
//! does not run).

use serde::Serialize;
use serde_json::Value;

use super::{Inputs, decided, rendered_config};
use crate::decision::model::memory::Placement;
use crate::decision::{
    ClusterView, FrameworkPlan, JobRequest, MemoryEstimate, Resolution, estimate_placement,
    profile_name_for,
};
use crate::render::workload::build_workload;
use offload_api::v1alpha1::{
    Framework, ModeSetting, NodeClass, OffloadMode, RatioSetting, Switch, TrainingJob,
    TrainingJobSpec,
};
use offload_api::version;

/// The memory model's figures for a candidate.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CandidateMemory {
    /// Where the training state goes.
    pub placement: String,
    /// Bytes per GPU.
    pub gpu_bytes: u64,
    /// Bytes of GPU memory the estimate may use on the class's smallest GPU.
    pub gpu_budget_bytes: u64,
    /// Bytes of host memory per pod.
    pub host_bytes_per_pod: u64,
    /// Host memory one pod can have, where the nodes state it.
    pub host_budget_bytes: Option<u64>,
    /// Whether it fits both.
    pub fits: bool,
}

impl CandidateMemory {
    pub(super) fn of(m: &MemoryEstimate, fits: bool) -> Self {
        CandidateMemory {
            placement: m.placement.to_string(),
            gpu_bytes: m.gpu_bytes,
            gpu_budget_bytes: m.gpu_budget_bytes,
            host_bytes_per_pod: m.host_bytes_per_pod,
            host_budget_bytes: m.host_budget_bytes,
            fits,
        }
    }
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
    /// The Megatron-core flags it would write (`OFFLOAD_MEGATRON_ARGS`), for a Megatron job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub megatron_args: Option<String>,
    /// Why the operator does not write it, when it does not.
    pub refused: Option<String>,
    /// The memory model's estimate, where the job gives model hints.
    pub memory: Option<CandidateMemory>,
}

/// The choice, the placements, and the knobs.
pub(super) fn all(
    tj: &TrainingJob,
    inputs: &Inputs,
    chosen: &Resolution,
    chosen_config: Option<&Value>,
) -> Vec<Candidate> {
    let mut out = vec![Candidate {
        label: "chosen".into(),
        chosen: true,
        same_semantics: true,
        deepspeed_config: chosen_config.cloned(),
        megatron_args: megatron_args(chosen),
        refused: None,
        memory: chosen.memory.as_ref().map(|m| CandidateMemory::of(m, true)),
    }];
    out.extend(placements(tj, inputs, chosen));
    if tj.spec.framework.name == Framework::DeepSpeed {
        out.extend(knobs_flipped(tj, inputs, chosen));
    }
    out
}

/// The mode offload takes for this job: the chosen one, or the first class's that has nodes.
fn offload_mode(chosen: &Resolution, inputs: &Inputs) -> (ModeSetting, NodeClass) {
    match (chosen.mode, chosen.node_class) {
        (OffloadMode::UnifiedMemory, _) => (ModeSetting::UnifiedMemory, NodeClass::Coherent),
        (OffloadMode::CpuCopy, class) => {
            (ModeSetting::CpuCopy, class.unwrap_or(NodeClass::Discrete))
        }
        (OffloadMode::Disabled, class) => {
            let nodes = inputs.view.nodes();
            let class = class.unwrap_or_else(|| {
                if nodes.class(NodeClass::Discrete).next().is_some() {
                    NodeClass::Discrete
                } else {
                    NodeClass::Coherent
                }
            });
            match class {
                NodeClass::Coherent => (ModeSetting::UnifiedMemory, class),
                NodeClass::Discrete => (ModeSetting::CpuCopy, class),
            }
        }
    }
}

/// One placement as a variant of the job's spec.
struct PlacementVariant {
    label: String,
    placement: Placement,
    class: NodeClass,
    set: Box<dyn Fn(&mut TrainingJobSpec)>,
}

fn placements(tj: &TrainingJob, inputs: &Inputs, chosen: &Resolution) -> Vec<Candidate> {
    let (mode, class) = offload_mode(chosen, inputs);
    let mut variants = vec![PlacementVariant {
        label: "no_offload".into(),
        placement: Placement::NoOffload,
        class: chosen.node_class.unwrap_or(class),
        set: Box::new(|s| s.offload.mode = ModeSetting::Disabled),
    }];
    if tj.spec.model.is_some() {
        let partial = match chosen.memory.as_ref().map(|m| m.placement) {
            Some(Placement::PartialOptimizer(r)) => Some(r),
            _ => None,
        };
        let framework = tj.spec.framework.name;
        let offloaded = |label: &str, placement, ratio, params| PlacementVariant {
            label: label.into(),
            placement,
            class,
            set: Box::new(move |s: &mut TrainingJobSpec| {
                s.offload.mode = mode;
                s.offload.offload_ratio = ratio;
                if framework == Framework::DeepSpeed {
                    s.deepspeed
                        .get_or_insert_with(Default::default)
                        .offload_params = Some(params);
                }
            }),
        };
        if framework != Framework::Fsdp {
            variants.push(offloaded(
                "partial",
                Placement::PartialOptimizer(partial.unwrap_or(crate::decision::MIN_AUTO_RATIO)),
                partial.map_or(RatioSetting::Auto, RatioSetting::Fixed),
                false,
            ));
            variants.push(offloaded(
                "offload_optimizer",
                Placement::Optimizer,
                RatioSetting::Fixed(1.0),
                false,
            ));
        }
        if framework == Framework::Fsdp || framework == Framework::DeepSpeed {
            variants.push(offloaded(
                "offload_optimizer+param",
                Placement::OptimizerAndParams,
                RatioSetting::Fixed(1.0),
                true,
            ));
        }
    }
    variants
        .into_iter()
        .map(|v| placement_candidate(tj, inputs, chosen, v))
        .collect()
}

fn placement_candidate(
    tj: &TrainingJob,
    inputs: &Inputs,
    chosen: &Resolution,
    v: PlacementVariant,
) -> Candidate {
    let mut variant = tj.clone();
    (v.set)(&mut variant.spec);
    // Decide it; where the memory model refuses it, render it without the hints anyway (the
    // benchmark trains it to show it does not run) and say why it is not written.
    let (res, refused) = match decided(&variant, inputs) {
        Ok((res, _)) => (Ok(res), None),
        Err(why) => {
            let mut bare = variant.clone();
            bare.spec.model = None;
            (decided(&bare, inputs).map(|(r, _)| r), Some(why.message()))
        }
    };
    let config = res.as_ref().ok().and_then(|r| render(&variant, inputs, r));
    let memory = estimate(&variant, inputs, v.class, v.placement, res.as_ref().ok());
    let is_chosen = res
        .as_ref()
        .is_ok_and(|r| refused.is_none() && same_placement(r, chosen));
    Candidate {
        label: v.label,
        chosen: false,
        same_semantics: true,
        refused: refused
            .or_else(|| res.as_ref().err().map(crate::decision::Unresolved::message))
            .or_else(|| is_chosen.then(|| "the same as the choice".to_string())),
        deepspeed_config: config,
        megatron_args: res.as_ref().ok().and_then(megatron_args),
        memory,
    }
}

/// The flags a Megatron-core resolution renders, as the pod's `OFFLOAD_MEGATRON_ARGS` has them.
fn megatron_args(res: &Resolution) -> Option<String> {
    match &res.framework {
        crate::decision::FrameworkPlan::Megatron(p) => {
            Some(crate::render::megatron::args_line(p, res.pin_memory))
        }
        _ => None,
    }
}

fn same_placement(a: &Resolution, b: &Resolution) -> bool {
    a.mode == b.mode
        && a.ratio == b.ratio
        && a.memory.as_ref().map(|m| m.placement) == b.memory.as_ref().map(|m| m.placement)
}

fn render(variant: &TrainingJob, inputs: &Inputs, res: &Resolution) -> Option<Value> {
    let user = inputs.user_config(variant).ok().flatten().map(|c| c.json);
    build_workload(variant, Some(res), user.as_ref(), &inputs.view.render)
        .ok()
        .as_ref()
        .and_then(rendered_config)
}

/// The estimate of `placement` for the variant: the resolution's own where it placed the state
/// that way, else the memory model's figures for it on `class`.
fn estimate(
    variant: &TrainingJob,
    inputs: &Inputs,
    class: NodeClass,
    placement: Placement,
    res: Option<&Resolution>,
) -> Option<CandidateMemory> {
    if let Some(m) = res.and_then(|r| r.memory.as_ref())
        && std::mem::discriminant(&m.placement) == std::mem::discriminant(&placement)
    {
        return Some(CandidateMemory::of(m, true));
    }
    let config = inputs.user_config(variant).ok().flatten();
    let model = inputs.model_config(variant).ok().flatten();
    let request =
        JobRequest::for_training_job(variant, config.as_ref(), model.as_ref(), &inputs.view)
            .ok()?;
    let name = profile_name_for(variant);
    let profile = inputs
        .view
        .profile(&name)
        .unwrap_or_else(crate::decision::builtin_default_profile);
    let (m, fits) = estimate_placement(
        &request,
        &name,
        &profile,
        &inputs.view.nodes(),
        class,
        placement,
    )
    .ok()??;
    Some(CandidateMemory::of(&m, fits))
}

/// One knob of a DeepSpeed job's rendering, and how a job asks for each value.
struct Knob {
    name: &'static str,
    set: fn(&mut TrainingJobSpec, bool),
    get: fn(&Resolution) -> bool,
}

fn ds_spec(spec: &mut TrainingJobSpec) -> &mut offload_api::v1alpha1::DeepSpeedSpec {
    spec.deepspeed.get_or_insert_with(Default::default)
}

fn knobs(res: &Resolution) -> Vec<Knob> {
    let FrameworkPlan::DeepSpeed(plan) = &res.framework else {
        return Vec::new();
    };
    if res.mode == OffloadMode::Disabled {
        return Vec::new();
    }
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
    // With model hints the placements above cover parameter offload, sized by memory.
    if plan.stage == 3 && res.memory.is_none() {
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

/// For each knob, the rendering with that knob flipped (and nothing else).
fn knobs_flipped(tj: &TrainingJob, inputs: &Inputs, chosen: &Resolution) -> Vec<Candidate> {
    let zenflow_on =
        |r: &Resolution| matches!(&r.framework, FrameworkPlan::DeepSpeed(p) if p.zenflow);
    let mut out = Vec::new();
    for knob in knobs(chosen) {
        let flipped = !(knob.get)(chosen);
        let mut variant = tj.clone();
        // Pin the other knobs and the placement to what was chosen, so only this one moves.
        for other in knobs(chosen) {
            (other.set)(&mut variant.spec, (other.get)(chosen));
        }
        variant.spec.offload.mode = chosen.mode.as_setting();
        variant.spec.offload.offload_ratio = RatioSetting::Fixed(chosen.ratio);
        (knob.set)(&mut variant.spec, flipped);
        let label = format!("{}={}", knob.name, if flipped { "on" } else { "off" });
        let candidate = match decided(&variant, inputs) {
            Err(why) => Candidate {
                label,
                chosen: false,
                same_semantics: true,
                deepspeed_config: None,
                megatron_args: None,
                refused: Some(why.message()),
                memory: None,
            },
            Ok((res, user)) => {
                let config =
                    build_workload(&variant, Some(&res), user.as_ref(), &inputs.view.render)
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
                    megatron_args: None,
                    memory: res.memory.as_ref().map(|m| CandidateMemory::of(m, true)),
                }
            }
        };
        out.push(candidate);
    }
    out
}
