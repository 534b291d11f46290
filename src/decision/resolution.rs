//! What a decision gives back: the configuration ([`Resolution`]), a reason for every setting
//! ([`Reason`], by [`Field`]), the memory request it counts on ([`MemoryRequest`]) and the
//! memory model's figures ([`MemoryEstimate`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use offload_api::v1alpha1::{
    NodeClass, OffloadMode, OffloadSpec, OverlapSetting, RatioSetting, ReasonCode, Switch,
};

use crate::decision::frameworks::FrameworkPlan;
use crate::decision::model::memory;
use crate::decision::runs::learned;

/// The setting a reason explains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// The offload mode.
    Mode,
    /// The node class the pods are pinned to.
    NodeClass,
    /// Overlap on or off.
    Overlap,
    /// The offload ratio.
    OffloadRatio,
    /// Pinned host memory.
    PinMemory,
    /// How the framework realises the configuration.
    Framework,
}

impl Field {
    /// Every field; a resolution carries at least one reason for each.
    pub const ALL: [Field; 6] = [
        Field::Mode,
        Field::NodeClass,
        Field::Overlap,
        Field::OffloadRatio,
        Field::PinMemory,
        Field::Framework,
    ];

    /// The spec field name, as shown in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Mode => "mode",
            Field::NodeClass => "nodeClass",
            Field::Overlap => "overlap",
            Field::OffloadRatio => "offloadRatio",
            Field::PinMemory => "pinMemory",
            Field::Framework => "framework",
        }
    }
}

/// Why one setting has its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reason {
    /// The setting explained.
    pub field: Field,
    /// What decided it.
    pub code: ReasonCode,
    /// The whole account, every figure (what `explain` prints).
    pub message: String,
    /// One sentence with the figures that decide it, where the account is longer (status and
    /// annotations carry this).
    pub summary: Option<String>,
}

/// The most characters of the sentence status and annotations show for one reason.
pub const MAX_SHORT_CHARS: usize = 200;

impl Reason {
    /// The sentence status and annotations show: the summary, else the account itself, cut at
    /// its last clause that fits [`MAX_SHORT_CHARS`] (the whole account is `explain`'s).
    pub fn short(&self) -> String {
        clip(self.summary.as_deref().unwrap_or(&self.message))
    }
}

/// `text` within [`MAX_SHORT_CHARS`]: whole, else up to its last clause boundary (`; `, `: `,
/// `, `, ` (`) that leaves at least half, else its last word, with an ellipsis.
pub fn clip(text: &str) -> String {
    if text.chars().count() <= MAX_SHORT_CHARS {
        return text.to_string();
    }
    let limit = text
        .char_indices()
        .nth(MAX_SHORT_CHARS - 1)
        .map_or(text.len(), |(i, _)| i);
    let head = &text[..limit];
    let cut = ["; ", ": ", ", ", " ("]
        .iter()
        .filter_map(|b| head.rfind(b))
        .filter(|&i| i >= limit / 2)
        .max()
        .or_else(|| head.rfind(' '))
        .unwrap_or(limit);
    format!("{}…", text[..cut].trim_end())
}

/// A reason before it is given its field: what decided it, the whole account, and a shorter
/// sentence where the account runs long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Why {
    /// What decided it.
    pub code: ReasonCode,
    /// The whole account.
    pub message: String,
    /// The sentence for status, where the account is longer.
    pub summary: Option<String>,
}

impl Why {
    /// A reason whose account is already one short sentence.
    pub fn new(code: ReasonCode, message: impl Into<String>) -> Self {
        Why {
            code,
            message: message.into(),
            summary: None,
        }
    }

    /// A reason with a short sentence for status beside its whole account.
    pub fn summed(
        code: ReasonCode,
        summary: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Why {
            code,
            message: message.into(),
            summary: Some(summary.into()),
        }
    }
}

/// A resolved, concrete offload configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolution {
    /// Profile used.
    pub profile: String,
    /// Concrete mode.
    pub mode: OffloadMode,
    /// Overlap on or off.
    pub overlap: bool,
    /// Offload ratio: in (0, 1], 0 when nothing is offloaded.
    pub ratio: f64,
    /// Pin host buffers.
    pub pin_memory: bool,
    /// Node class the pods must land on; `None` when offload is disabled.
    pub node_class: Option<NodeClass>,
    /// The profile's node selector, also binding scheduling.
    pub node_selector: Option<LabelSelector>,
    /// Lowest overlap efficiency measured on the chosen nodes.
    pub overlap_efficiency: Option<f64>,
    /// Framework rendering plan.
    pub framework: FrameworkPlan,
    /// One or more reasons per [`Field`], in decision order.
    pub reasons: Vec<Reason>,
    /// Whether the pods get the start-up guard (the profile's `startupGuard`).
    pub startup_guard: bool,
    /// Whether the training container reports PyTorch's memory figures at exit (the profile's
    /// `reportAllocatorPeaks`).
    pub report_allocator_peaks: bool,
    /// What the memory model estimated for the placement written, where the job gives model
    /// hints.
    pub memory: Option<MemoryEstimate>,
    /// The job's GPU claims (entry → ResourceClaimTemplate) through which it is pinned to the
    /// node class: each gets a copy of its template selecting only the class's GPUs, and the
    /// pods get no class labels in their node affinity (nodes classed by the GPU driver alone
    /// carry none). Empty: the pods are pinned by the agent's labels.
    pub gpu_claims: Option<crate::dra::claims::ClaimPinning>,
    /// Nodes whose two witnesses (agent and GPU driver) disagree, kept out of a claim-pinned
    /// job's node affinity: its claims' selectors see only the driver's word.
    pub exclude_nodes: Vec<String>,
    /// The pod's DRA claim entries whose devices are GPUs: the start-up guard shares them.
    pub gpu_claim_entries: Vec<String>,
    /// The memory request the training container gets, where the decision counts on more host
    /// memory than it requests.
    pub memory_request: Option<MemoryRequest>,
    /// The request this was decided from (`spec.offload` as the user asked).
    pub requested: OffloadSpec,
    /// Where the configuration puts the training state.
    pub placement: memory::Placement,
    /// Set where the placement is a trial of a rung faster than the fastest that trained for
    /// the job's shape.
    pub trial: Option<crate::decision::ladder::rungs::Trial>,
    /// Why the memory model (and what earlier runs proved) placed the state so, in a sentence,
    /// where it sized the job.
    pub memory_why: Option<String>,
    /// The placement is one that trained for the job's shape, chosen over the model's figures.
    pub proven: bool,
    /// Where that placement was ranked by its runs' steps over a less offloaded one that trained
    /// slower: both steps, short.
    pub stepped: Option<String>,
    /// The training container's CPU limit (cores), where it has one (its own or its
    /// namespace's default): the cores the CPU check counted, which the start-up guard checks
    /// the pod really gets.
    pub cpu_cores: Option<f64>,
    /// The CPU threads the training process should start for those cores (`OMP_NUM_THREADS`,
    /// where the container sets none): a quota is not fought with a thread per visible core.
    pub cpu_threads: Option<u32>,
    /// The training container's index in the pod template, where the pod has containers.
    pub training_container: Option<usize>,
    /// Where the profile asks for whole cores near the GPU and the nodes and pod allow it: the
    /// training container's CPU and memory, requests equal to limits (the pod Guaranteed).
    pub whole_cores: Option<super::WholeCores>,
}

/// The host memory the decision counts on, written as the training container's memory request
/// where the user's is lower or absent, so the scheduler and quota systems see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRequest {
    /// The training container's index in the pod template.
    pub container: usize,
    /// The request, bytes (a whole number of MiB).
    pub bytes: u64,
    /// The user's request it replaces, where there was one.
    pub raised_from: Option<u64>,
    /// Whether the namespace's LimitRanges' floor ([`super::JobRequest::memory_request_floor`])
    /// set it, above the host estimate.
    pub at_floor: bool,
}

/// The memory model's figures for the placement a resolution writes.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryEstimate {
    /// Where the training state is placed.
    pub placement: memory::Placement,
    /// Bytes per GPU.
    pub gpu_bytes: u64,
    /// Bytes of GPU memory the estimate may use on the class's smallest GPU.
    pub gpu_budget_bytes: u64,
    /// Bytes of host memory per pod.
    pub host_bytes_per_pod: u64,
    /// Host memory one pod can have, where the nodes state it.
    pub host_budget_bytes: Option<u64>,
    /// Of `gpu_bytes`, the part without activations (counted exactly).
    pub gpu_structural_bytes: u64,
    /// Bytes the caching allocator needs beyond the estimate: room for the step's largest
    /// single activation, or the framework's measured reserve.
    pub gpu_allocator_room_bytes: u64,
    /// The job's shape key.
    pub shape: String,
    /// What was learned for the shape on the class, in effect in these figures.
    pub learned: learned::LearnedFactors,
}

impl MemoryEstimate {
    pub(super) fn of(
        jm: &memory::JobMemory,
        est: &memory::Estimate,
        cm: &memory::ClassMemory,
    ) -> Self {
        MemoryEstimate {
            placement: est.placement,
            gpu_bytes: memory::bytes(est.gpu),
            gpu_budget_bytes: memory::bytes(jm.gpu_budget(cm)),
            host_bytes_per_pod: memory::bytes(est.host_per_pod),
            host_budget_bytes: cm.host_per_pod,
            gpu_structural_bytes: memory::bytes(est.structural),
            gpu_allocator_room_bytes: memory::bytes(jm.allocator_room()),
            shape: jm.shape_key.clone(),
            learned: est.learned,
        }
    }
}

/// A placement in a few words.
pub(super) fn short(p: memory::Placement) -> String {
    match p {
        memory::Placement::NoOffload => "no offload".into(),
        memory::Placement::PartialOptimizer(r) => format!("{:.0}%", r * 100.0),
        memory::Placement::Optimizer => "optimizer offload".into(),
        memory::Placement::OptimizerAndParams => "optimizer+params offload".into(),
    }
}

impl Resolution {
    /// The job's `spec.offload` with every `Auto` replaced by the concrete value.
    pub fn concrete_spec(&self) -> OffloadSpec {
        spec_of(self.mode, self.overlap, self.ratio, self.pin_memory)
    }

    /// Whether DeepSpeed SuperOffload is on.
    pub fn super_offload(&self) -> bool {
        matches!(&self.framework, FrameworkPlan::DeepSpeed(p) if p.super_offload)
    }

    /// The record of this decision, as a TrainingJob's `status.offload` holds it and its
    /// workload Job's `offload.dev/decision` annotation keeps it.
    pub fn status(&self) -> offload_api::v1alpha1::OffloadDecisionStatus {
        offload_api::v1alpha1::OffloadDecisionStatus {
            mode: self.mode,
            overlap: self.overlap,
            offload_ratio: self.ratio,
            pin_memory: self.pin_memory,
            node_class: self.node_class,
            profile: self.profile.clone(),
            overlap_efficiency: self.overlap_efficiency,
            super_offload: self.super_offload(),
            placement: Some(self.placement.state().0),
            reasons: self
                .reasons
                .iter()
                .map(|r| offload_api::v1alpha1::DecisionReason {
                    field: r.field.as_str().to_string(),
                    code: Some(r.code),
                    message: r.short(),
                })
                .collect(),
            estimate: self.memory.as_ref().map(|m| {
                let i = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
                offload_api::v1alpha1::MemoryEstimateStatus {
                    gpu_bytes: i(m.gpu_bytes),
                    gpu_budget_bytes: i(m.gpu_budget_bytes),
                    host_bytes: i(m.host_bytes_per_pod),
                    host_budget_bytes: m.host_budget_bytes.map(i),
                    gpu_structural_bytes: Some(i(m.gpu_structural_bytes)),
                    shape: Some(m.shape.clone()),
                    learned: (!m.learned.is_neutral()).then(|| {
                        offload_api::v1alpha1::LearnedFactorsStatus {
                            activations: (m.learned.activations * 1000.0).round() / 1000.0,
                            host: (m.learned.host * 1000.0).round() / 1000.0,
                            runs: i32::try_from(m.learned.runs).unwrap_or(i32::MAX),
                        }
                    }),
                }
            }),
            requested: Some(self.requested.clone()),
            learned: self.learned_summary(),
            trial: self
                .trial
                .as_ref()
                .map(|t| offload_api::v1alpha1::TrialStatus {
                    fallback: t.fallback.to_string(),
                    evidence: t.evidence.clone(),
                }),
        }
    }

    /// What earlier runs taught this decision, in a few words (`kubectl get tj`); `None` where
    /// nothing was learned.
    pub fn learned_summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(m) = &self.memory
            && !m.learned.is_neutral()
        {
            parts.push(format!(
                "{} run{}: activations ×{:.2}, host ×{:.2}",
                m.learned.runs,
                if m.learned.runs == 1 { "" } else { "s" },
                m.learned.activations,
                m.learned.host
            ));
        }
        if let Some(t) = &self.trial {
            parts.push(format!("trial; {} trained", short(t.fallback)));
        } else if self.proven {
            parts.push(format!(
                "{} trained{}",
                short(self.placement),
                self.stepped
                    .as_ref()
                    .map_or(String::new(), |s| format!(", {s}"))
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// The decision in one line, for the `OffloadResolved` condition: the mode's code and
    /// sentence (every field's reason is in `status.offload.reasons`).
    pub fn headline(&self) -> String {
        headline(
            self.reasons
                .iter()
                .map(|r| (r.field.as_str(), r.code, r.short())),
        )
    }

    /// The reasons' sentences joined into one paragraph, for Events.
    pub fn summary(&self) -> String {
        self.reasons
            .iter()
            .map(|r| format!("{}: {}", r.field.as_str(), r.short()))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The first `mode` reason as `Code: sentence` (else the first reason), and a pointer to the
/// others.
pub fn headline<'a>(reasons: impl IntoIterator<Item = (&'a str, ReasonCode, String)>) -> String {
    let reasons: Vec<_> = reasons.into_iter().collect();
    let first = reasons
        .iter()
        .find(|(field, ..)| *field == Field::Mode.as_str())
        .or_else(|| reasons.first());
    match first {
        Some((_, code, sentence)) => {
            format!("{code}: {sentence} (every field's reason: status.offload.reasons)")
        }
        None => "decided".to_string(),
    }
}

/// The `spec.offload` that states a decision's values (mode, overlap, share, pinning) as
/// concrete settings: written into the job, and compared with it to tell whether the user has
/// changed it since.
pub fn spec_of(mode: OffloadMode, overlap: bool, ratio: f64, pin_memory: bool) -> OffloadSpec {
    OffloadSpec {
        mode: mode.as_setting(),
        overlap: if overlap {
            OverlapSetting::Enabled
        } else {
            OverlapSetting::Disabled
        },
        offload_ratio: if mode == OffloadMode::Disabled {
            RatioSetting::None
        } else {
            RatioSetting::Fixed(ratio)
        },
        pin_memory: if pin_memory {
            Switch::Enabled
        } else {
            Switch::Disabled
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_account_is_cut_at_its_last_clause_within_the_bound() {
        assert_eq!(clip("fits"), "fits");
        let clauses = format!("{}; {}", "a".repeat(150), "b ".repeat(40));
        let cut = clip(&clauses);
        assert_eq!(cut, format!("{}…", "a".repeat(150)));
        assert!(cut.chars().count() <= MAX_SHORT_CHARS);
        // No boundary in its second half: cut at a word.
        let words = "word ".repeat(60);
        let cut = clip(&words);
        assert!(
            cut.ends_with("word…") && cut.chars().count() <= MAX_SHORT_CHARS,
            "{cut}"
        );
        // Multi-byte characters count as one and are never split.
        let wide = "é".repeat(300);
        assert!(clip(&wide).chars().count() <= MAX_SHORT_CHARS);
    }
}
