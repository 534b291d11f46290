//! A running job's observed GPU-busy fraction: gathered from the node agents' summaries on the
//! nodes its pods run on, and judged against its profile's threshold when overlap is on.

use std::time::Duration;

use crate::index::NodeIndex;
use offload_api::api::{NodeObservation, ObservedOverlap, OffloadDecisionStatus};

/// Observations older than this are not counted: the agent publishes every minute, so a
/// summary this old comes from an agent that stopped, or from pods that are gone.
pub const STALE_AFTER: Duration = Duration::from_secs(300);

/// Most nodes listed in a job's `status.observed` (the job-wide figures count them all).
pub const MAX_LISTED_NODES: usize = 512;

/// Condition type: whether a job with overlap on keeps its GPUs busy.
pub const OVERLAP_OBSERVED: &str = "OverlapObserved";

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
    for node in nodes.nodes() {
        let Some(summary) = node.parsed_observed().filter(|s| s.node == node.name) else {
            continue;
        };
        let Some(at) = summary.observed_at() else {
            continue;
        };
        if now.duration_since(at) > stale {
            continue;
        }
        let (mut n_busy, mut n_gpus, mut n_cpu) = (0.0f64, 0usize, None::<f64>);
        let capacity = node
            .known_gpus()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(offload_api::observed::MAX_GPUS);
        for pod in summary
            .pods_of(namespace, job)
            .filter(|p| bound(&p.name, &node.name))
        {
            let held = pod.gpus.len().min(capacity.saturating_sub(n_gpus));
            if held == 0 {
                continue;
            }
            #[allow(clippy::cast_precision_loss)]
            let weight = held as f64;
            n_busy += pod.gpu_busy * weight;
            n_gpus += held;
            if let Some(c) = pod.cpu_cores {
                n_cpu = Some(n_cpu.unwrap_or(0.0) + c);
            }
        }
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
    #[allow(clippy::cast_precision_loss)]
    Some(ObservedOverlap {
        gpu_busy: round3(busy_gpus / gpus as f64),
        gpus: i32::try_from(gpus).unwrap_or(i32::MAX),
        cpu_cores: cpu.map(round3),
        observed_at: oldest.to_string(),
        window_seconds: window,
        nodes: per_node,
    })
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
) -> Option<(bool, &'static str, String)> {
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
            "GPUsBusy",
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
            "GPUsIdle",
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
    use offload_api::api::OffloadMode;
    use offload_api::names;
    use offload_api::observed::{
        BusySource, OBSERVED_SCHEMA_VERSION, ObservedSummary, PodObservation,
    };

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
            overlap_efficiency: None,
            super_offload,
            reasons: vec![],
            estimate: None,
            requested: None,
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

    /// Found by an independent tester: any node's summary could speak for any job's pods, and
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
            }),
        ]);
        let only_on_b = |pod: &str, node: &str| pod == "job-0" && node == "b";
        let o = gather(&index, "ns", "job", NOW.parse().unwrap(), &only_on_b).unwrap();
        assert_eq!(o.gpus, 1, "b has one GPU");
        assert_eq!(o.nodes.len(), 1);
        let nowhere = |_: &str, _: &str| false;
        assert!(gather(&index, "ns", "job", NOW.parse().unwrap(), &nowhere).is_none());
    }

    /// Found by an independent tester: an observation of 1e308 CPU cores was used (only "finite
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
        assert_eq!(reason, "GPUsIdle");
        assert!(
            msg.starts_with(
                "GPUs busy 58 % of the time with SuperOffload on: the CPU update is not overlapping"
            ),
            "{msg}"
        );
        let (ok, reason, _) = judge(&decision(true, false), &o, 0.5).unwrap();
        assert!(ok && reason == "GPUsBusy");
        assert!(
            judge(&decision(false, false), &o, 0.6).is_none(),
            "overlap off: nothing to judge"
        );
        assert!(
            judge(&decision(true, false), &o, 0.0).is_none(),
            "threshold 0 turns it off"
        );
    }
}
