//! `explain --observed FILE`: the evidence of runs, offline. Each file is a run of the job as
//! the agent saw it (`offload-agent observe -- COMMAND`, or a node's `offload.dev/observed`
//! summary holding the job's pods); in order, each is taken as a run of the configuration
//! decided at that point — unless it recorded the configuration it was given (the agent keeps
//! the run's `OFFLOAD_*` variables) and that is another: then it teaches nothing, and the step
//! says what it ran. A run that ran teaches the memory model what it used; one that ran out
//! of GPU or host memory is recorded as the controller records it (`status.memoryFailures`) and
//! teaches that it needed more. The decision shown is the one the operator makes next.

use std::sync::Arc;

use offload_api::observed::{ObservedRun, ObservedSummary, PodObservation};
use offload_api::v1alpha1::{MemoryKind, NodeClass, TrainingJob, TrainingJobStatus};
use serde::Serialize;

use super::{Explanation, Inputs, decided, explain_training_job};
use crate::decision::runs::evidence::GPU_OOM_TEXT;
use crate::decision::runs::evidence::configuration;
use crate::decision::runs::evidence::says_gpu_out_of_memory;
use crate::decision::runs::lesson::Observed;
use crate::decision::{LearnedView, lesson_of};

/// How an observed run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// It ran (or is still running).
    Ran,
    /// It ran out of this memory, saying this.
    OutOfMemory(MemoryKind, String),
    /// It failed for another reason: it teaches nothing.
    Failed(String),
}

/// One run's evidence: the pod's figures and how it ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Evidence {
    /// Where it came from (the file).
    pub source: String,
    /// Its figures.
    pub pod: PodObservation,
    /// How it ended.
    pub outcome: Outcome,
    /// It finished its training: the process exited 0 (a node's summary of a running pod
    /// says only that it ran so far).
    pub trained: bool,
    /// The offload configuration the run recorded it was given (`OFFLOAD_MODE`,
    /// `OFFLOAD_RATIO`, …); empty where it recorded none.
    pub configuration: std::collections::BTreeMap<String, String>,
}

/// One step of the loop, as `explain` shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LoopStep {
    /// The evidence's file.
    pub source: String,
    /// The configuration it ran.
    pub configuration: String,
    /// How it ended.
    pub outcome: String,
    /// What it taught, where anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lesson: Option<String>,
    /// Why that configuration was decided: the memory model's figures, what was learned and
    /// what earlier runs proved (a trial says so), where the model sized the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided: Option<String>,
}

/// Reads one file of evidence: an observed run, or a node's observed summary (the pods of the
/// TrainingJob `job`, their highest figures).
pub fn read_evidence(source: &str, text: &str, job: &str) -> Result<Evidence, String> {
    let is_run = serde_json::from_str::<serde_json::Value>(text)
        .is_ok_and(|v| v.get("command").is_some() && v.get("pod").is_some());
    if is_run {
        let run = ObservedRun::parse(text).map_err(|e| format!("{source}: {e}"))?;
        return Ok(Evidence {
            source: source.to_string(),
            trained: run.succeeded(),
            outcome: outcome_of_run(&run),
            pod: run.pod,
            configuration: run.configuration,
        });
    }
    summary_evidence(source, text, job)
}

/// How an observed run ended: trained, out of GPU memory (PyTorch's words), killed as the OOM
/// killer kills (taken as host memory), or failed otherwise.
fn outcome_of_run(run: &ObservedRun) -> Outcome {
    if run.succeeded() {
        Outcome::Ran
    } else if says_gpu_out_of_memory(&run.message) {
        Outcome::OutOfMemory(MemoryKind::Gpu, run.message.clone())
    } else if run.signal == Some(SIGKILL) || run.exit_code == Some(137) {
        Outcome::OutOfMemory(
            MemoryKind::Host,
            format!(
                "killed (SIGKILL), as the kernel's OOM killer kills: taken as host memory{}",
                if run.message.is_empty() {
                    String::new()
                } else {
                    format!("; it said: {}", last_line(&run.message))
                }
            ),
        )
    } else {
        Outcome::Failed(format!(
            "{}: {}",
            run.exit_code.map_or_else(
                || format!("signal {}", run.signal.unwrap_or_default()),
                |c| format!("exit {c}")
            ),
            last_line(&run.message)
        ))
    }
}

/// A node's observed summary as evidence of the TrainingJob `job`: its pods' highest figures.
fn summary_evidence(source: &str, text: &str, job: &str) -> Result<Evidence, String> {
    let summary = ObservedSummary::parse(text).map_err(|e| {
        format!("{source}: neither an observed run (offload-agent observe -- COMMAND) nor a node's observed summary: {e}")
    })?;
    // Judged as the controller judges a node's summary: a window ending after now is no
    // window (it would never go stale).
    if let Some(why) = summary.not_current(jiff::Timestamp::now()) {
        return Err(format!(
            "{source}: the node's observed summary is not evidence: {why}"
        ));
    }
    let mut pods = summary
        .pods
        .iter()
        .filter(|p| p.training_job.as_deref() == Some(job))
        .peekable();
    if pods.peek().is_none() {
        return Err(format!(
            "{source}: the node's observed summary holds no pod of TrainingJob {job}"
        ));
    }
    let mut merged: Option<PodObservation> = None;
    for p in pods {
        merged = Some(match merged {
            None => p.clone(),
            Some(m) => PodObservation {
                gpu_memory_peak_bytes: m.gpu_memory_peak_bytes.max(p.gpu_memory_peak_bytes),
                host_memory_peak_bytes: m.host_memory_peak_bytes.max(p.host_memory_peak_bytes),
                gpu_memory_total_bytes: match (m.gpu_memory_total_bytes, p.gpu_memory_total_bytes) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
                ..m
            },
        });
    }
    Ok(Evidence {
        source: source.to_string(),
        pod: merged.ok_or_else(|| format!("{source}: no pod"))?,
        outcome: Outcome::Ran,
        trained: false,
        configuration: Default::default(),
    })
}

/// Where a run recorded the configuration it was given and that is not `res`'s (the decision
/// made now, from what the model and the runs before it know): what it ran, in words. Its
/// figures are of another configuration, so they are not read as a run of this one.
fn ran_another(ev: &Evidence, res: &crate::decision::Resolution) -> Option<String> {
    use offload_api::names::{ENV_MODE, ENV_RATIO};
    let mode = ev.configuration.get(ENV_MODE)?;
    let ratio = ev.configuration.get(ENV_RATIO);
    let same_ratio =
        ratio.is_none_or(|r| r.parse::<f64>().is_ok_and(|r| (r - res.ratio).abs() < 1e-9));
    (mode != res.mode.env_value() || !same_ratio).then(|| {
        format!(
            "{ENV_MODE}={mode}{}",
            ratio.map_or(String::new(), |r| format!(" {ENV_RATIO}={r}"))
        )
    })
}

/// The signal the kernel's OOM killer sends.
const SIGKILL: i32 = 9;

/// The line that says the GPU ran out (PyTorch's error), else the last line.
fn oom_line(message: &str) -> String {
    message
        .lines()
        .rev()
        .find(|l| says_gpu_out_of_memory(l))
        .map_or_else(
            || last_line(message),
            |l| {
                let at = GPU_OOM_TEXT
                    .iter()
                    .filter_map(|t| l.find(t))
                    .min()
                    .unwrap_or(0);
                l[at..].chars().take(300).collect()
            },
        )
}

fn last_line(message: &str) -> String {
    message
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .chars()
        .take(300)
        .collect()
}

/// The class a decision without a node class ran on: the only class of the nodes, else
/// discrete.
fn ran_on(class: Option<NodeClass>, inputs: &Inputs) -> NodeClass {
    class.unwrap_or_else(|| {
        let nodes = crate::decision::ClusterView::nodes(&inputs.view);
        let coherent = nodes.class(NodeClass::Coherent).next().is_some();
        let discrete = nodes.class(NodeClass::Discrete).next().is_some();
        if coherent && !discrete {
            NodeClass::Coherent
        } else {
            NodeClass::Discrete
        }
    })
}

/// Why a run's figures cannot be true on the nodes `inputs` has (their GPUs, their memory).
fn implausible(pod: &PodObservation, inputs: &Inputs) -> Option<String> {
    let nodes = crate::decision::ClusterView::nodes(&inputs.view);
    let gpus: Vec<u64> = nodes
        .nodes()
        .filter_map(crate::index::NodeInfo::gpu_memory)
        .collect();
    let memory = nodes
        .nodes()
        .filter_map(|n| n.allocatable.memory_capacity.or(n.allocatable.memory))
        .max();
    pod.implausible(&gpus, memory)
}

/// Why a run teaches nothing about the decision `res` (it ran another configuration, or its
/// figures cannot be true on these nodes), with the configuration it ran where that is why.
fn not_evidence(
    ev: &Evidence,
    res: &crate::decision::Resolution,
    inputs: &Inputs,
) -> Option<(String, Option<String>)> {
    if let Some(ran) = ran_another(ev, res) {
        return Some((
            format!(
                "{}; it ran {ran}, not the configuration decided now: its figures are of another configuration and teach nothing here",
                outcome_said(&ev.outcome)
            ),
            Some(ran),
        ));
    }
    implausible(&ev.pod, inputs)
        .map(|why| (format!("not evidence: {why}; it teaches nothing"), None))
}

/// Explains `tj` after the runs of `evidence`, in order.
pub fn explain_after(tj: &TrainingJob, inputs: &mut Inputs, evidence: &[Evidence]) -> Explanation {
    let mut tj = tj.clone();
    let mut store = inputs
        .view
        .learned
        .as_ref()
        .map(|l| (*l.memory).clone())
        .unwrap_or_default();
    let now = jiff::Timestamp::now();
    let mut steps = Vec::new();
    for (i, ev) in evidence.iter().enumerate() {
        let res = match decided(&tj, inputs) {
            Ok((res, _)) => res,
            Err(_) => break,
        };
        let status = res.status();
        let step = |outcome: String, lesson: Option<String>| LoopStep {
            source: ev.source.clone(),
            configuration: configuration(&status),
            decided: res.memory_why.clone(),
            outcome,
            lesson,
        };
        // Evidence is judged as the controller judges it: after maxMemoryRetries failures
        // nothing is decided again, and figures that cannot be true on the nodes teach nothing.
        if let Some(held) = held_after_retries(&tj, inputs, &status.profile) {
            steps.push(step(held, None));
            break;
        }
        if let Some((said, ran)) = not_evidence(ev, &res, inputs) {
            let mut taken = step(said, None);
            if let Some(ran) = ran {
                taken.configuration = ran;
            }
            steps.push(taken);
            continue;
        }
        let failed = match &ev.outcome {
            Outcome::OutOfMemory(kind, _) => Some(*kind),
            _ => None,
        };
        let lesson = match ev.outcome {
            Outcome::Failed(_) => None,
            _ => learn(
                &tj,
                inputs,
                &mut store,
                ev,
                &res,
                format!("observed-{i}"),
                now,
            ),
        };
        if let (Some(kind), Outcome::OutOfMemory(_, message)) = (failed, &ev.outcome) {
            let failure = crate::decision::runs::evidence::failure_record(
                &tj,
                Some(&status),
                kind,
                &format!("observed-{i}"),
                &oom_line(message),
                now.to_string(),
            );
            let st = tj.status.get_or_insert_with(TrainingJobStatus::default);
            st.memory_failures.push(failure);
        }
        steps.push(step(outcome_said(&ev.outcome), lesson));
        // A run that trained ends its job: the next run is a new job of the same shape, decided
        // from what the store holds, not from this job's failures.
        if ev.trained
            && failed.is_none()
            && let Some(st) = tj.status.as_mut()
        {
            st.memory_failures.clear();
        }
    }
    let mut out = explain_training_job(&tj, inputs, false);
    out.closed_loop = steps;
    out
}

/// Why the controller decides `tj` no more: more configurations ran out of memory than its
/// profile's `maxMemoryRetries`.
fn held_after_retries(tj: &TrainingJob, inputs: &Inputs, profile: &str) -> Option<String> {
    let retries = crate::decision::ClusterView::profile(&inputs.view, profile)
        .map_or(offload_api::v1alpha1::DEFAULT_MAX_MEMORY_RETRIES, |p| {
            p.max_memory_retries
        });
    let failures = tj.status.as_ref().map_or(0, |s| s.memory_failures.len());
    (failures > retries as usize).then(|| {
        format!(
            "not taken: {failures} configurations ran out of memory, more than the profile's maxMemoryRetries ({retries}); the controller holds the job and decides it no more"
        )
    })
}

/// How a run ended, in words.
fn outcome_said(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Ran => "ran".to_string(),
        Outcome::OutOfMemory(kind, message) => format!(
            "ran out of {} memory: {}",
            match kind {
                MemoryKind::Gpu => "GPU",
                MemoryKind::Host => "host",
            },
            oom_line(message)
        ),
        Outcome::Failed(why) => {
            format!("failed for another reason ({why}): it teaches nothing and is not re-decided")
        }
    }
}

/// What the run `ev` of `res`'s configuration teaches, recorded in `store` (and the view the
/// next decision reads) as run `who` of the job; the lesson in a sentence.
fn learn(
    tj: &TrainingJob,
    inputs: &mut Inputs,
    store: &mut crate::decision::runs::learned::LearnedMemory,
    ev: &Evidence,
    res: &crate::decision::Resolution,
    who: String,
    now: jiff::Timestamp,
) -> Option<String> {
    let failed = match &ev.outcome {
        Outcome::OutOfMemory(kind, _) => Some(*kind),
        _ => None,
    };
    let observed = Observed {
        placement: res.placement,
        class: ran_on(res.node_class, inputs),
        gpu_bytes: ev.pod.gpu_memory_total_bytes.unwrap_or_default(),
        gpu_peak: ev.pod.gpu_memory_peak_bytes,
        allocated: match &ev.outcome {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Outcome::OutOfMemory(MemoryKind::Gpu, m) => {
                crate::decision::runs::evidence::AllocatorOom::parse(m)
                    .map(|o| o.needed())
                    .filter(|n| *n >= 1.0 && *n < 1.8e19)
                    .map(|n| n as u64)
            }
            _ => ev.pod.allocator_peak_bytes,
        },
        host_peak: ev.pod.host_memory_peak_bytes,
        failed,
        trained: ev.trained,
        trial: res.trial.is_some(),
        decided_shape: res.memory.as_ref().map(|m| m.shape.clone()),
        step_seconds: ev.pod.step_seconds.filter(|_| ev.trained),
    };
    let config_of = inputs.user_config(tj);
    let model = inputs.model_config(tj);
    let Ok(Some((profile, lesson))) = lesson_of(
        tj,
        config_of.as_ref().map(Option::as_ref),
        model.as_ref().map(Option::as_ref),
        &inputs.view,
        &observed,
    ) else {
        return None;
    };
    let run = lesson.run(
        &format!(
            "{}/{}/{who}",
            tj.metadata.namespace.as_deref().unwrap_or_default(),
            tj.metadata.name.as_deref().unwrap_or_default()
        ),
        failed.is_some(),
        now,
    );
    let said = match lesson.record(store, &profile, observed.class, run) {
        Ok(_) => lesson.sentence.clone(),
        Err(e) => format!("not learned: {e}"),
    };
    inputs.view.learned = Some(LearnedView {
        memory: Arc::new(store.clone()),
        now,
        namespace: None,
        job: None,
    });
    Some(said)
}
