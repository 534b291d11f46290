//! A running job's observed GPU-busy fraction and memory: gathered from the node agents'
//! summaries on the nodes its pods run on; the busy fraction judged against its profile's
//! threshold when overlap is on, the GPU memory against the GPU's size.

use std::time::Duration;

use crate::controller::conditions::Reason;
use crate::index::NodeIndex;
use offload_api::v1alpha1::{
    NodeObservation, ObservedMemory, ObservedOverlap, OffloadDecisionStatus,
};

/// Observations older than this are not counted: the agent publishes every minute, so a
/// summary this old comes from an agent that stopped, or from pods that are gone.
pub const STALE_AFTER: Duration = Duration::from_secs(300);

/// Most nodes listed in a job's `status.observed` (the job-wide figures count them all).
pub const MAX_LISTED_NODES: usize = 512;

/// A job whose GPU peak comes this close to the GPU's memory runs near its limit: a longer
/// sequence, another framework version or a fragmented allocator tips it over.
pub const NEAR_LIMIT_SHARE: f64 = 0.03;

/// The highest of two figures where either is known.
fn highest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    a.max(b)
}

/// The smallest of two figures where either is known.
fn smallest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn as_i64(b: Option<u64>) -> Option<i64> {
    b.map(|b| i64::try_from(b).unwrap_or(i64::MAX))
}

/// The job's figures from every fresh summary that lists its pods; `None` when no agent has
/// observed any of them. A node's summary counts only where it names that node and only for
/// the job's pods `bound(pod, node)` says run there, with no more GPUs than the node has: no
/// node can speak for another's pods.
pub fn gather(
    nodes: &NodeIndex,
    namespace: &str,
    job: &str,
    now: jiff::Timestamp,
    bound: &dyn Fn(&str, &str) -> bool,
) -> Option<ObservedOverlap> {
    let stale = jiff::SignedDuration::try_from(STALE_AFTER).ok()?;
    let mut per_node = Vec::new();
    let (mut busy_gpus, mut gpus, mut cpu, mut window) = (0.0f64, 0usize, None::<f64>, 0.0f64);
    let mut oldest: Option<jiff::Timestamp> = None;
    let mut memory = ObservedMemory::default();
    for node in nodes.nodes() {
        let Some(summary) = node.parsed_observed().filter(|s| s.node == node.name) else {
            continue;
        };
        let Some(at) = summary.observed_at() else {
            continue;
        };
        if now.duration_since(at) > stale || summary.not_current(now).is_some() {
            continue;
        }
        let capacity = node
            .known_gpus()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(offload_api::observed::MAX_GPUS);
        let pods = summary
            .pods_of(namespace, job)
            .filter(|p| bound(&p.name, &node.name));
        let (n_busy, n_gpus, n_cpu) = node_share(pods, capacity, &mut memory);
        if n_gpus == 0 {
            continue;
        }
        busy_gpus += n_busy;
        gpus += n_gpus;
        if let Some(c) = n_cpu {
            cpu = Some(cpu.unwrap_or(0.0) + c);
        }
        window = window.max(summary.window_seconds);
        oldest = Some(oldest.map_or(at, |o| o.min(at)));
        #[allow(clippy::cast_precision_loss)]
        per_node.push(NodeObservation {
            node: node.name.clone(),
            gpu_busy: round3(n_busy / n_gpus as f64),
            gpus: i32::try_from(n_gpus).unwrap_or(i32::MAX),
            cpu_cores: n_cpu.map(round3),
            observed_at: summary.observed_at.clone(),
        });
    }
    let oldest = oldest?;
    per_node.truncate(MAX_LISTED_NODES);
    let seen = memory.gpu_peak_bytes.is_some() || memory.host_peak_bytes.is_some();
    memory.since = oldest.to_string();
    memory.windows = 1;
    #[allow(clippy::cast_precision_loss)]
    Some(ObservedOverlap {
        gpu_busy: round3(busy_gpus / gpus as f64),
        gpus: i32::try_from(gpus).unwrap_or(i32::MAX),
        cpu_cores: cpu.map(round3),
        observed_at: oldest.to_string(),
        window_seconds: window,
        nodes: per_node,
        memory: seen.then_some(memory),
    })
}

/// One node's share of the job in a window: its pods' GPU-busy figures weighted by the GPUs
/// each holds (no more than the node has), their GPUs and CPU cores; their memory peaks go into
/// `memory`.
fn node_share<'a>(
    pods: impl Iterator<Item = &'a offload_api::observed::PodObservation>,
    capacity: usize,
    memory: &mut ObservedMemory,
) -> (f64, usize, Option<f64>) {
    let (mut busy, mut gpus, mut cpu) = (0.0f64, 0usize, None::<f64>);
    for pod in pods {
        let held = pod.gpus.len().min(capacity.saturating_sub(gpus));
        if held == 0 {
            continue;
        }
        #[allow(clippy::cast_precision_loss)]
        let weight = held as f64;
        busy += pod.gpu_busy * weight;
        gpus += held;
        memory.gpu_peak_bytes = highest(memory.gpu_peak_bytes, as_i64(pod.gpu_memory_peak_bytes));
        memory.process_gpu_peak_bytes = highest(
            memory.process_gpu_peak_bytes,
            as_i64(pod.process_gpu_memory_peak_bytes),
        );
        memory.gpu_total_bytes =
            smallest(memory.gpu_total_bytes, as_i64(pod.gpu_memory_total_bytes));
        memory.host_peak_bytes =
            highest(memory.host_peak_bytes, as_i64(pod.host_memory_peak_bytes));
        if let Some(c) = pod.cpu_cores {
            cpu = Some(cpu.unwrap_or(0.0) + c);
        }
    }
    (busy, gpus, cpu)
}

/// The configuration's memory so far: the fresh window's figures (from [`gather`]) with the
/// estimate of the configuration the job runs, and, while that configuration is the one already
/// recorded, the highest of both (a new window counted once).
pub fn merge_memory(
    recorded: Option<&ObservedMemory>,
    fresh: &ObservedMemory,
    new_window: bool,
    configuration: &str,
    decision: &OffloadDecisionStatus,
) -> ObservedMemory {
    let mut m = fresh.clone();
    m.configuration = configuration.to_string();
    if let Some(r) = recorded.filter(|r| r.configuration == configuration) {
        m.gpu_peak_bytes = highest(r.gpu_peak_bytes, m.gpu_peak_bytes);
        m.process_gpu_peak_bytes = highest(r.process_gpu_peak_bytes, m.process_gpu_peak_bytes);
        m.gpu_total_bytes = smallest(r.gpu_total_bytes, m.gpu_total_bytes);
        m.host_peak_bytes = highest(r.host_peak_bytes, m.host_peak_bytes);
        m.since.clone_from(&r.since);
        m.windows = r.windows.saturating_add(i32::from(new_window));
    }
    let estimate = decision.estimate.as_ref();
    #[allow(clippy::cast_possible_truncation)]
    let context = crate::decision::model::memory::CONTEXT_RESERVE_BYTES as i64;
    m.gpu_estimate_bytes = estimate.map(|e| e.gpu_bytes.saturating_add(context));
    m.host_estimate_bytes = estimate.map(|e| e.host_bytes);
    #[allow(clippy::cast_precision_loss)]
    let gib = |b: i64| b as f64 / f64::from(1u32 << 30);
    m.gpu = match (m.gpu_peak_bytes, m.gpu_estimate_bytes) {
        (Some(p), Some(e)) => format!("{:.1}/{:.1}Gi", gib(p), gib(e)),
        (Some(p), None) => format!("{:.1}Gi", gib(p)),
        (None, _) => String::new(),
    };
    m
}

/// Whether the job's GPUs keep room: `Some((ok, reason, message))` once a GPU peak and the
/// GPU's size are known.
pub fn judge_memory(m: &ObservedMemory) -> Option<(bool, Reason, String)> {
    let (peak, total) = (m.gpu_peak_bytes?, m.gpu_total_bytes.filter(|t| *t > 0)?);
    #[allow(clippy::cast_precision_loss)]
    let (p, t) = (peak as f64, total as f64);
    let gib = |b: f64| crate::decision::model::memory::gib(b);
    let share = p / t;
    let estimate = m.gpu_estimate_bytes.map_or(String::new(), |e| {
        #[allow(clippy::cast_precision_loss)]
        let e = e as f64;
        format!("; the decision estimated {} with the CUDA context", gib(e))
    });
    if share >= 1.0 - NEAR_LIMIT_SHARE {
        Some((
            false,
            Reason::NearGpuMemoryLimit,
            format!(
                "GPU memory peaked at {} of the GPU's {} ({:.1} %) with {}{estimate}: within {:.0} % of the limit, a longer sequence or another framework version can run it out of memory",
                gib(p),
                gib(t),
                share * 100.0,
                m.configuration,
                NEAR_LIMIT_SHARE * 100.0
            ),
        ))
    } else {
        Some((
            true,
            Reason::Headroom,
            format!(
                "GPU memory peaked at {} of the GPU's {} ({:.1} %){estimate}",
                gib(p),
                gib(t),
                share * 100.0
            ),
        ))
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The verdict on an observation: `Some((ok, reason, message))` for a job with overlap on and a
/// threshold above 0, `None` where there is nothing to judge.
pub fn judge(
    decision: &OffloadDecisionStatus,
    observed: &ObservedOverlap,
    threshold: f64,
) -> Option<(bool, Reason, String)> {
    if !decision.overlap || threshold <= 0.0 {
        return None;
    }
    let what = if decision.super_offload {
        "SuperOffload on"
    } else {
        "overlap on"
    };
    let pct = |x: f64| (x * 100.0).round();
    if observed.gpu_busy >= threshold {
        Some((
            true,
            Reason::GpusBusy,
            format!(
                "GPUs busy {:.0} % of the time with {what} (profile {} flags below {:.0} %)",
                pct(observed.gpu_busy),
                decision.profile,
                pct(threshold)
            ),
        ))
    } else {
        Some((
            false,
            Reason::GpusIdle,
            format!(
                "GPUs busy {:.0} % of the time with {what}: the CPU update is not overlapping GPU work, or it outlasts the GPU part of each step (profile {} flags below {:.0} %; {} GPU(s) observed over {:.0} s windows)",
                pct(observed.gpu_busy),
                decision.profile,
                pct(threshold),
                observed.gpus,
                observed.window_seconds
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::index::NodeInfo;
    use offload_api::names;
    use offload_api::observed::{
        BusySource, OBSERVED_SCHEMA_VERSION, ObservedSummary, PodObservation,
    };
    use offload_api::v1alpha1::OffloadMode;

    /// Every pod is bound where its summary says.
    fn anywhere(_: &str, _: &str) -> bool {
        true
    }

    fn node(name: &str, at: &str, pods: Vec<PodObservation>) -> NodeInfo {
        node_claiming(name, name, at, pods)
    }

    /// A node whose summary says it was written on `claimed`.
    fn node_claiming(name: &str, claimed: &str, at: &str, pods: Vec<PodObservation>) -> NodeInfo {
        let summary = ObservedSummary {
            schema_version: OBSERVED_SCHEMA_VERSION,
            node: claimed.into(),
            observed_at: at.into(),
            window_seconds: 60.0,
            source: BusySource::RecordedTrace,
            pods,
        };
        let annotations = BTreeMap::from([(
            names::ANNOTATION_OBSERVED.to_string(),
            summary.to_annotation().unwrap(),
        )]);
        NodeInfo::from_metadata(name, BTreeMap::new(), &annotations)
    }

    fn pod(ns: &str, job: &str, gpus: usize, busy: f64, cpu: Option<f64>) -> PodObservation {
        PodObservation {
            namespace: ns.into(),
            name: format!("{job}-0"),
            training_job: Some(job.into()),
            gpus: (0..gpus).map(|i| format!("GPU-{job}-{i}")).collect(),
            gpu_busy: busy,
            samples: 600,
            cpu_cores: cpu,
            gpu_memory_peak_bytes: None,
            gpu_memory_total_bytes: None,
            process_gpu_memory_peak_bytes: None,
            host_memory_peak_bytes: None,
            host_memory_source: None,
            allocator_peak_bytes: None,
            step_seconds: None,
        }
    }

    fn decision(overlap: bool, super_offload: bool) -> OffloadDecisionStatus {
        OffloadDecisionStatus {
            mode: OffloadMode::CpuCopy,
            overlap,
            offload_ratio: 1.0,
            pin_memory: true,
            node_class: None,
            profile: "default".into(),
            placement: None,
            overlap_efficiency: None,
            super_offload,
            reasons: vec![],
            estimate: None,
            requested: None,
            trial: None,
            learned: None,
        }
    }

    const NOW: &str = "2026-11-30T20:02:00Z";

    #[test]
    fn weighs_nodes_by_gpus_and_skips_stale_and_other_jobs() {
        let index = NodeIndex::new(vec![
            node(
                "a",
                "2026-11-30T20:01:00Z",
                vec![
                    pod("ns", "job", 3, 0.9, Some(2.0)),
                    pod("ns", "other", 1, 0.1, None),
                ],
            ),
            node(
                "b",
                "2026-11-30T20:01:30Z",
                vec![pod("ns", "job", 1, 0.5, Some(1.5))],
            ),
            // Ten minutes old: the agent stopped publishing.
            node(
                "c",
                "2026-11-30T19:52:00Z",
                vec![pod("ns", "job", 4, 0.0, None)],
            ),
            node(
                "d",
                "2026-11-30T20:01:00Z",
                vec![pod("elsewhere", "job", 2, 0.0, None)],
            ),
            // Dated in year 2999: a window that would never go stale is no window at all.
            node(
                "e",
                "2999-01-01T00:00:00Z",
                vec![pod("ns", "job", 2, 0.0, Some(9.0))],
            ),
        ]);
        let o = gather(&index, "ns", "job", NOW.parse().unwrap(), &anywhere).unwrap();
        assert_eq!(o.gpus, 4);
        assert!((o.gpu_busy - 0.8).abs() < 1e-9, "{}", o.gpu_busy);
        assert_eq!(o.cpu_cores, Some(3.5));
        assert_eq!(o.observed_at, "2026-11-30T20:01:00Z");
        assert_eq!(
            o.nodes.iter().map(|n| n.node.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(gather(&index, "ns", "absent", NOW.parse().unwrap(), &anywhere).is_none());
    }

    /// A hostile input: any node's summary could speak for any job's pods, and
    /// list more GPUs than the node has.
    #[test]
    fn a_node_speaks_only_for_the_pods_bound_to_it_and_its_own_gpus() {
        let index = NodeIndex::new(vec![
            // Names another node: ignored.
            node_claiming(
                "a",
                "liar",
                "2026-11-30T20:01:00Z",
                vec![pod("ns", "job", 1, 0.1, None)],
            ),
            node(
                "b",
                "2026-11-30T20:01:00Z",
                vec![pod("ns", "job", 8, 0.2, None)],
            )
            .with_allocatable(crate::index::Allocatable {
                memory: None,
                gpus: Some(1),
                cpus: None,
                ..Default::default()
            }),
        ]);
        let only_on_b = |pod: &str, node: &str| pod == "job-0" && node == "b";
        let o = gather(&index, "ns", "job", NOW.parse().unwrap(), &only_on_b).unwrap();
        assert_eq!(o.gpus, 1, "b has one GPU");
        assert_eq!(o.nodes.len(), 1);
        let nowhere = |_: &str, _: &str| false;
        assert!(gather(&index, "ns", "job", NOW.parse().unwrap(), &nowhere).is_none());
    }

    /// A hostile input: an observation of 1e308 CPU cores was used (only "finite
    /// and not negative" was checked); the node's own CPUs bound it.
    #[test]
    fn cpu_no_node_has_is_not_believed() {
        let index = NodeIndex::new(vec![
            node(
                "a",
                "2026-11-30T20:01:00Z",
                vec![pod("ns", "job", 1, 0.5, Some(1e308))],
            )
            .with_allocatable(crate::index::Allocatable {
                memory: None,
                gpus: Some(8),
                cpus: Some(72),
                ..Default::default()
            }),
        ]);
        let node = index.nodes().next().unwrap();
        let err = node
            .observed
            .as_ref()
            .unwrap()
            .as_ref()
            .unwrap_err()
            .to_string();
        assert!(err.contains("more than the node's 72"), "{err}");
        assert!(gather(&index, "ns", "job", NOW.parse().unwrap(), &anywhere).is_none());
    }

    #[test]
    fn flags_idle_gpus_only_with_overlap_on_and_a_threshold() {
        let index = NodeIndex::new(vec![node(
            "a",
            "2026-11-30T20:01:00Z",
            vec![pod("ns", "job", 1, 0.58, None)],
        )]);
        let o = gather(&index, "ns", "job", NOW.parse().unwrap(), &anywhere).unwrap();
        let (ok, reason, msg) = judge(&decision(true, true), &o, 0.6).unwrap();
        assert!(!ok);
        assert_eq!(reason.as_str(), "GPUsIdle");
        assert!(
            msg.starts_with(
                "GPUs busy 58 % of the time with SuperOffload on: the CPU update is not overlapping"
            ),
            "{msg}"
        );
        let (ok, reason, _) = judge(&decision(true, false), &o, 0.5).unwrap();
        assert!(ok && reason.as_str() == "GPUsBusy");
        assert!(
            judge(&decision(false, false), &o, 0.6).is_none(),
            "overlap off: nothing to judge"
        );
        assert!(
            judge(&decision(true, false), &o, 0.0).is_none(),
            "threshold 0 turns it off"
        );
    }

    fn with_memory(mut p: PodObservation, gpu: u64, total: u64, host: u64) -> PodObservation {
        p.gpu_memory_peak_bytes = Some(gpu);
        p.gpu_memory_total_bytes = Some(total);
        p.host_memory_peak_bytes = Some(host);
        p.host_memory_source = Some(offload_api::observed::HostMemorySource::CgroupPeak);
        p
    }

    #[test]
    fn memory_is_the_highest_of_the_configuration_beside_its_estimate() {
        let gib = 1u64 << 30;
        let mut second = with_memory(
            pod("ns", "job", 1, 0.9, None),
            70 * gib,
            140 * gib,
            30 * gib,
        );
        second.name = "job-1".into();
        second.gpus = vec!["GPU-x".into()];
        let index = NodeIndex::new(vec![node(
            "a",
            "2026-11-30T20:01:00Z",
            vec![
                with_memory(pod("ns", "job", 1, 0.9, None), 60 * gib, 80 * gib, 50 * gib),
                second,
            ],
        )]);
        let o = gather(&index, "ns", "job", NOW.parse().unwrap(), &anywhere).unwrap();
        let fresh = o.memory.unwrap();
        assert_eq!(fresh.gpu_peak_bytes, Some(70 << 30), "the busiest GPU");
        assert_eq!(fresh.gpu_total_bytes, Some(80 << 30), "the smallest GPU");
        assert_eq!(fresh.host_peak_bytes, Some(50 << 30), "the largest pod");
        let mut d = decision(true, false);
        d.estimate = Some(offload_api::v1alpha1::MemoryEstimateStatus {
            gpu_bytes: 64 << 30,
            gpu_budget_bytes: 76 << 30,
            host_bytes: 40 << 30,
            host_budget_bytes: None,
            ..Default::default()
        });
        let m = merge_memory(None, &fresh, true, "mode=CPUCopy", &d);
        assert_eq!(m.gpu, "70.0/65.4Gi", "the estimate with the CUDA context");
        assert_eq!(m.windows, 1);
        // A lower window of the same configuration keeps the highest; another starts over.
        let mut lower = fresh.clone();
        lower.gpu_peak_bytes = Some(10 << 30);
        lower.since = "later".into();
        let kept = merge_memory(Some(&m), &lower, true, "mode=CPUCopy", &d);
        assert_eq!(kept.gpu_peak_bytes, Some(70 << 30));
        assert_eq!((kept.windows, kept.since.as_str()), (2, m.since.as_str()));
        let again = merge_memory(Some(&kept), &lower, false, "mode=CPUCopy", &d);
        assert_eq!(again.windows, 2, "the same window counts once");
        let other = merge_memory(Some(&kept), &lower, true, "mode=Disabled", &d);
        assert_eq!((other.gpu_peak_bytes, other.windows), (Some(10 << 30), 1));

        let (ok, reason, msg) = judge_memory(&m).unwrap();
        assert!(ok && reason.as_str() == "Headroom", "{msg}");
        let mut near = m.clone();
        near.gpu_peak_bytes = Some(78 << 30);
        let (ok, reason, msg) = judge_memory(&near).unwrap();
        assert!(!ok && reason.as_str() == "NearGPUMemoryLimit", "{msg}");
        assert!(
            msg.starts_with(
                "GPU memory peaked at 78.0 GiB of the GPU's 80.0 GiB (97.5 %) with mode=CPUCopy"
            ),
            "{msg}"
        );
        let unknown = ObservedMemory::default();
        assert!(judge_memory(&unknown).is_none());
    }

    /// A node's summary stating more host memory than the node has, or GPUs larger than its
    /// own, is not believed.
    #[test]
    fn memory_no_node_has_is_not_believed() {
        let gib = 1u64 << 30;
        let host = node(
            "a",
            "2026-11-30T20:01:00Z",
            vec![with_memory(
                pod("ns", "job", 1, 0.5, None),
                gib,
                80 * gib,
                600 * gib,
            )],
        )
        .with_allocatable(crate::index::Allocatable {
            memory: Some(500 * gib),
            memory_capacity: Some(512 * gib),
            ..Default::default()
        });
        let err = host
            .observed
            .as_ref()
            .unwrap()
            .as_ref()
            .unwrap_err()
            .to_string();
        assert!(err.contains("more than the node's 549755813888"), "{err}");
        let report: offload_api::report::NodeReport =
            offload_api::report::NodeReport::parse(offload_testenv::fixtures::H200_READING)
                .unwrap();
        let mut gpu = crate::index::NodeInfo::from_report("b", &report);
        gpu.observed = Some(Ok(ObservedSummary {
            schema_version: OBSERVED_SCHEMA_VERSION,
            node: "b".into(),
            observed_at: "2026-11-30T20:01:00Z".into(),
            window_seconds: 60.0,
            source: BusySource::RecordedTrace,
            pods: vec![with_memory(
                pod("ns", "job", 1, 0.5, None),
                gib,
                200 * gib,
                gib,
            )],
        }));
        let gpu = gpu.with_allocatable(crate::index::Allocatable::default());
        let err = gpu
            .observed
            .as_ref()
            .unwrap()
            .as_ref()
            .unwrap_err()
            .to_string();
        assert!(err.contains("the node's report has"), "{err}");
    }
}
