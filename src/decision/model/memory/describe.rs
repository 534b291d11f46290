//! The figures of an estimate in sentences: what it needs of what each GPU and the host hold,
//! what was learned, and what would widen the headroom near the limit.

use super::{CLOSE_TO_LIMIT_SHARE, ClassMemory, Estimate, JobMemory, Placement, as_f64, gib};

impl JobMemory {
    /// The deciding figures in a few words, for a reason's sentence: what each GPU needs of
    /// what it can hold, what is left, and the host memory per pod; then where the figures come
    /// from (the model's code, the count and its margin, what runs taught).
    pub fn brief(&self, est: &Estimate, class: &ClassMemory) -> (String, String) {
        let left = self.headroom(est, class);
        let room = if left >= 0.0 {
            format!("{} left", gib(left))
        } else {
            format!("{} over", gib(-left))
        };
        // Where the figures come from: the model's own code, runs of the shape, or the count.
        let margin = match self.shape.standing {
            super::super::shape::TypeStanding::Unmeasured => format!(
                ", +{:.0} % unmeasured type",
                super::super::shape::UNMEASURED_TYPE_MARGIN * 100.0
            ),
            _ => String::new(),
        };
        let source = match (&self.traced, &self.untraced) {
            (Some(_), _) => "; traced from the model's code".to_string(),
            (None, Some(why)) => format!("; counted{margin}, not traced ({})", untraced_brief(why)),
            (None, None) if margin.is_empty() => String::new(),
            (None, None) => format!("; counted{margin}"),
        };
        let learned = match est.learned.runs {
            _ if est.learned.is_neutral() => String::new(),
            1 => "; learned from 1 run".to_string(),
            n => format!("; learned from {n} runs"),
        };
        (
            format!(
                "{} of {}/GPU, {room}; {} host/pod",
                gib(est.gpu).trim_end_matches(" GiB"),
                gib(self.gpu_budget(class)),
                gib(est.host_per_pod)
            ),
            format!("{source}{learned}"),
        )
    }

    /// One sentence with the figures of `est` against `class`.
    pub fn describe(&self, est: &Estimate, class: &ClassMemory) -> String {
        let host = self.host_said(est, class);
        let left = self.headroom(est, class);
        let total = as_f64(class.gpu_bytes);
        let room = if left >= 0.0 {
            format!(
                "{} headroom ({:.1}% of the GPU)",
                gib(left),
                100.0 * left / total.max(1.0)
            )
        } else {
            format!("{} over", gib(-left))
        };
        let share = est
            .offloaded_share
            .filter(|s| matches!(est.placement, Placement::PartialOptimizer(r) if (r - s).abs() > 0.005))
            .map(|s| format!(" (DeepSpeed's sub-groups put {:.0}% on the host)", s * 100.0))
            .unwrap_or_default();
        let learned = self.learned_said(est, class);
        let standing = self.model_said();
        format!(
            "needs about {} of the {} each GPU can hold on {}, {room}{share}, and {host}{learned}{standing}",
            gib(est.gpu),
            gib(self.gpu_budget(class)),
            class.gpu_node
        )
    }

    /// The host memory a pod needs, against its share of the node or its limit.
    fn host_said(&self, est: &Estimate, class: &ClassMemory) -> String {
        let limit = self
            .pod_memory_limit
            .map(|l| match &self.pod_memory_limit_source {
                Some(from) => format!(" (pod limit {}: {from})", gib(as_f64(l))),
                None => format!(" (pod limit {})", gib(as_f64(l))),
            })
            .unwrap_or_default();
        match (class.host_per_pod, self.pod_memory_limit) {
            (Some(share), _) => format!(
                "{} of host memory per pod of {} ({}){limit}",
                gib(est.host_per_pod),
                gib(as_f64(share)),
                class.host_node
            ),
            (None, Some(_)) => format!(
                "{} of host memory per pod{limit} (the nodes state no allocatable memory)",
                gib(est.host_per_pod)
            ),
            (None, None) => format!(
                "{} of host memory per pod, not checked: the nodes state no allocatable memory and the pod sets no limit",
                gib(est.host_per_pod)
            ),
        }
    }

    /// What runs taught changed in the figures (and whether the model alone would have tried
    /// the placement), a count corrected by runs, or a size inferred from them.
    fn learned_said(&self, est: &Estimate, class: &ClassMemory) -> String {
        let learned = match class.class {
            Some(c) if !est.learned.is_neutral() => {
                let mut plain = self.clone();
                plain.learned.clear();
                let alone = plain.estimate_checked(est.placement, class).0.gpu;
                let budget = self.gpu_budget(class);
                let tried = if alone > budget && est.gpu <= budget {
                    ": without it the model would not have tried this placement"
                } else {
                    ""
                };
                format!(
                    " ({}; the model alone counts {} per GPU{tried})",
                    est.learned.describe(c),
                    gib(alone)
                )
            }
            _ => String::new(),
        };
        let learned = match self.counted_parameters {
            Some(c) => format!(
                "{learned} (runs of this shape that trained showed at most {:.2}B parameters where the per-type count has {:.2}B: sized at that)",
                self.parameters / 1e9,
                c / 1e9
            ),
            None => learned,
        };
        if self.inferred {
            format!(
                "{learned} (the job gives no model hints: sized as {:.2}B parameters from the peaks of its observed runs)",
                self.parameters / 1e9
            )
        } else {
            learned
        }
    }

    /// Where the model's figures come from, for reasons: the trace, or why there is none and
    /// how the model type stands.
    fn model_said(&self) -> String {
        if let Some(t) = &self.traced {
            return format!(
                "; {}",
                t.said(
                    self.shape.known.then(|| self.shape.parameters()),
                    self.tokens
                )
            );
        }
        let why = self
            .untraced
            .as_ref()
            .map(|w| format!("; not traced: {w}"))
            .unwrap_or_default();
        let standing = self
            .shape
            .standing
            .said()
            .map_or(String::new(), |s| format!("; {s}"));
        format!("{why}{standing}")
    }

    /// What would widen the headroom of `est` when it is close to the limit; `None` otherwise.
    pub fn close_to_limit(&self, est: &Estimate, class: &ClassMemory) -> Option<String> {
        let left = self.headroom(est, class);
        if left < 0.0 || left >= CLOSE_TO_LIMIT_SHARE * as_f64(class.gpu_bytes) {
            return None;
        }
        let mut ideas = Vec::new();
        if !self.checkpointing && self.tokens.is_some() {
            ideas.push(format!(
                "activation checkpointing (activations {} now)",
                gib(est.activations)
            ));
        }
        if self.tokens.is_some_and(|t| t > 1.0) {
            ideas.push("a smaller micro-batch".to_string());
        }
        ideas.push(format!(
            "a second GPU ({} in all now) to shard the state over",
            self.ranks
        ));
        Some(format!(
            "close to the limit ({} left): {} would widen the headroom",
            gib(left),
            ideas.join(", ")
        ))
    }
}

impl std::fmt::Display for super::Sharding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            super::Sharding::Zero(s) => write!(f, "ZeRO-{s}"),
            super::Sharding::Fsdp => f.write_str("FSDP"),
            super::Sharding::Megatron {
                tensor,
                model_parallel,
                distributed,
                sequence,
                unfused_attention,
                ..
            } => super::megatron::describe(
                f,
                *tensor,
                *model_parallel,
                *distributed,
                *sequence,
                *unfused_attention,
            ),
            super::Sharding::Unsharded => f.write_str("no sharding"),
        }
    }
}

impl std::fmt::Display for super::Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            super::Placement::NoOffload => f.write_str("no offload"),
            super::Placement::PartialOptimizer(r) => {
                write!(f, "{:.0}% of the optimizer state offloaded", r * 100.0)
            }
            super::Placement::Optimizer => f.write_str("the optimizer state offloaded"),
            super::Placement::OptimizerAndParams => {
                f.write_str("optimizer state and parameters offloaded")
            }
        }
    }
}

/// Why a step was not traced, in a few words: the sizer's code where its answer has one
/// (`CustomCode`, `TimedOut`), else the first clause.
fn untraced_brief(why: &str) -> &str {
    let coded = why.find('(').and_then(|open| {
        let code = &why[open + 1..open + 1 + why[open + 1..].find(')')?];
        (!code.is_empty() && code.chars().all(|c| c.is_ascii_alphanumeric())).then_some(code)
    });
    coded.unwrap_or_else(|| why.split([':', ';']).next().unwrap_or(why).trim())
}
