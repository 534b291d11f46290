//! Assembling the node report from a reading and a self-test.

use offload_api::report::{
    MemoryWitnesses, NodeMemoryModel, NodeReport, REPORT_SCHEMA_VERSION, SelfTestReport,
};

use crate::probe::{NodeReading, NvmlSource, busy, os_numa_nodes};
use crate::selftest::{self, SelfTestOptions};

/// Version of this agent, written into every report.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// How this round treats the self-test.
#[derive(Clone, Copy, Debug, Default)]
pub struct SelfTestRun<'a> {
    /// Run it at all.
    pub enabled: bool,
    /// Run it even when the GPUs are in use (an explicit re-run).
    pub force: bool,
    /// The last published result: its verdict stands unless a new measurement is clearly on
    /// the other side of the threshold, and it is kept when this round must not measure.
    pub previous: Option<&'a SelfTestReport>,
}

/// Reads NVML, runs the self-test where a GPU is present and free, and builds the report.
///
/// The self-test is never run over a job: when NVML shows a compute process or load on a GPU
/// (or cannot say), the round is postponed, the previous figures are kept and the report says
/// why and when they were measured, unless `run.force`.
pub fn build(
    node: &str,
    source: &dyn NvmlSource,
    options: &SelfTestOptions,
    run: SelfTestRun<'_>,
) -> NodeReport {
    let reading = source.read();
    let model = reading.memory_model();
    let occupied = if run.force {
        None
    } else {
        match source.activity() {
            Ok(activity) => busy(&activity),
            Err(e) => Some(format!(
                "NVML could not say whether the GPUs are free ({e})"
            )),
        }
    };
    let selftest = if !run.enabled {
        SelfTestReport::untested(options.threshold, "self-test disabled (--no-selftest)")
    } else if model == NodeMemoryModel::NoGpu {
        SelfTestReport::untested(options.threshold, "no GPU on this node")
    } else if !reading.nvml.available {
        SelfTestReport::untested(
            options.threshold,
            "NVML is not available, so the GPU was not tested",
        )
    } else if let Some(why) = occupied {
        postponed(options, run.previous, &why)
    } else {
        let opts = SelfTestOptions {
            coherent: model == NodeMemoryModel::Coherent,
            ..options.clone()
        };
        selftest::run(&opts, run.previous.map(|p| p.verdict))
    };
    assemble(node, reading, selftest)
}

/// The self-test section of a round that must not measure: the last figures, kept, with the
/// reason; `untested` when there are none yet.
fn postponed(
    options: &SelfTestOptions,
    previous: Option<&SelfTestReport>,
    why: &str,
) -> SelfTestReport {
    let reason = format!("not re-run, the GPUs are in use: {why}");
    match previous {
        Some(p) if p.verdict != offload_api::report::OverlapVerdict::Untested => SelfTestReport {
            postponed: Some(reason),
            ..p.clone()
        },
        _ => SelfTestReport {
            postponed: Some(reason.clone()),
            ..SelfTestReport::untested(options.threshold, reason)
        },
    }
}

/// Puts a reading and a self-test together.
pub fn assemble(node: &str, reading: NodeReading, selftest: SelfTestReport) -> NodeReport {
    let memory_model = reading.memory_model();
    let memory_witnesses = Some(MemoryWitnesses::weigh(
        memory_model,
        &reading.gpus,
        reading.memory_only_nodes,
    ));
    NodeReport {
        schema_version: REPORT_SCHEMA_VERSION,
        agent_version: AGENT_VERSION.to_string(),
        node: node.to_string(),
        generated_at: jiff::Timestamp::now().to_string(),
        nvml: reading.nvml,
        gpus: reading.gpus,
        memory_model,
        os_numa_nodes: os_numa_nodes(),
        cpu_manager_policy: crate::topology::cpu_manager_policy(std::path::Path::new(
            crate::topology::CPU_MANAGER_STATE,
        )),
        memory_witnesses,
        cpu_architecture: Some(std::env::consts::ARCH.to_string()),
        resctrl: crate::topology::resctrl(
            std::fs::read_to_string("/proc/filesystems").ok().as_deref(),
            std::path::Path::new("/sys"),
        ),
        selftest,
    }
}

#[cfg(test)]
mod tests {
    use offload_api::names;
    use offload_api::report::OverlapVerdict;
    use offload_testenv::fixtures;

    use super::*;
    use crate::probe::RecordedNvml;

    #[test]
    fn a_node_without_nvml_is_reported_as_such_and_round_trips() {
        let report = build(
            "cpu-0",
            &RecordedNvml::missing_library(),
            &SelfTestOptions::default(),
            SelfTestRun {
                enabled: true,
                ..Default::default()
            },
        );
        assert_eq!(report.memory_model, NodeMemoryModel::Unknown);
        assert_eq!(report.selftest.verdict, OverlapVerdict::Untested);
        assert!(
            report
                .nvml
                .error
                .as_deref()
                .unwrap()
                .contains("libnvidia-ml.so.1")
        );
        // No memory-model labels on a node that is not a GPU node as far as the agent can
        // tell: nothing a discrete node's affinity could match.
        let labels = offload_api::labels::published(&report);
        assert_eq!(
            labels.keys().collect::<Vec<_>>(),
            [names::LABEL_OVERLAP],
            "{labels:?}"
        );
        assert_eq!(labels[names::LABEL_OVERLAP], "untested");
        // The operator's parser reads exactly what the agent wrote.
        let parsed = NodeReport::parse(&report.to_annotation().unwrap()).unwrap();
        assert_eq!(parsed, report);
    }

    /// A job is using the GPU: the round is postponed, the last figures are kept, and the
    /// report says why and when they were measured.
    #[test]
    fn a_busy_gpu_is_not_measured_and_the_last_result_is_kept() {
        use crate::probe::GpuActivity;
        let source = RecordedNvml::from_report(fixtures::H200_READING)
            .unwrap()
            .with_activity(vec![GpuActivity {
                index: 0,
                processes: vec![4242],
                utilization_percent: Some(97),
            }]);
        let mut last = NodeReport::parse(fixtures::H200_READING).unwrap().selftest;
        last.measured_at = Some("2026-11-30T00:00:00Z".into());
        let report = build(
            "h200-0",
            &source,
            &SelfTestOptions::default(),
            SelfTestRun {
                enabled: true,
                force: false,
                previous: Some(&last),
            },
        );
        let s = &report.selftest;
        assert_eq!(
            s.verdict,
            OverlapVerdict::Verified,
            "the last verdict stands"
        );
        assert_eq!(s.efficiency, last.efficiency);
        assert_eq!(s.measured_at.as_deref(), Some("2026-11-30T00:00:00Z"));
        let why = s.postponed.as_deref().unwrap();
        assert!(
            why.contains("GPU 0") && why.contains("pid 4242") && why.contains("97 %"),
            "{why}"
        );
        // Nothing measured before: untested, with the reason.
        let first = build(
            "h200-0",
            &source,
            &SelfTestOptions::default(),
            SelfTestRun {
                enabled: true,
                ..Default::default()
            },
        );
        assert_eq!(first.selftest.verdict, OverlapVerdict::Untested);
        assert!(first.selftest.postponed.is_some());
    }

    #[test]
    fn a_recorded_gh200_reading_labels_the_node_coherent() {
        let source = RecordedNvml::from_report(fixtures::GH200_REFERENCE).unwrap();
        let report = build(
            "gh200-0",
            &source,
            &SelfTestOptions::default(),
            SelfTestRun::default(),
        );
        assert_eq!(report.memory_model, NodeMemoryModel::Coherent);
        let labels = offload_api::labels::published(&report);
        assert_eq!(labels[names::LABEL_UMA], "true");
        assert_eq!(labels[names::LABEL_ADDRESSING_MODE], "ats");
        assert_eq!(labels[names::LABEL_C2C], "true");
        assert_eq!(
            NodeReport::parse(&report.to_annotation().unwrap()).unwrap(),
            report
        );
    }

    /// Builds the report of a recorded reading, with the kernel's view `memory_only` instead of
    /// the recording's where given.
    fn witnessed(
        fixture: &str,
        memory_only: Option<Option<Vec<offload_api::report::MemoryOnlyNode>>>,
    ) -> NodeReport {
        let mut source = RecordedNvml::from_report(fixture).unwrap();
        if let Some(view) = memory_only {
            source = source.with_memory_only_nodes(view);
        }
        let report = build(
            "n",
            &source,
            &SelfTestOptions::default(),
            SelfTestRun::default(),
        );
        assert_eq!(
            NodeReport::parse(&report.to_annotation().unwrap()).unwrap(),
            report
        );
        report
    }

    #[test]
    fn the_memory_model_says_which_witnesses_it_used_in_numa_and_cdmm_modes() {
        use offload_api::report::{KernelGpuMemory, MemoryOnlyNode};
        // GH200 in NUMA mode (reference reading): NVML and the kernel's GPU memory node agree.
        let numa = witnessed(fixtures::GH200_NUMA_REFERENCE, None);
        assert_eq!(numa.memory_model, NodeMemoryModel::Coherent);
        let w = numa.memory_witnesses.as_ref().unwrap();
        assert_eq!(w.kernel, Some(KernelGpuMemory::NumaNodes));
        assert!(w.agree && w.used.contains("NUMA mode"), "{}", w.used);
        assert_eq!(
            offload_api::labels::published(&numa)[names::LABEL_UMA],
            "true"
        );
        // GB200 in CDMM mode (reference reading): no GPU memory node, still coherent by NVML.
        let cdmm = witnessed(fixtures::GB200_CDMM_REFERENCE, None);
        assert_eq!(cdmm.memory_model, NodeMemoryModel::Coherent);
        let w = cdmm.memory_witnesses.as_ref().unwrap();
        assert_eq!(w.kernel, Some(KernelGpuMemory::NotNumaNodes));
        assert!(w.agree && w.used.contains("CDMM"), "{}", w.used);
        // An H200 (recorded) whose host shows memory-only nodes as large as its GPU (a CXL
        // expander, or a coherent platform NVML does not see as one): the witnesses disagree,
        // NVML's word stands and the node is not unified.
        let h200_gpu = 150_754_820_096;
        let odd = witnessed(
            fixtures::H200_READING,
            Some(Some(vec![MemoryOnlyNode {
                node: 2,
                bytes: h200_gpu,
            }])),
        );
        assert_eq!(odd.memory_model, NodeMemoryModel::Discrete);
        let w = odd.memory_witnesses.as_ref().unwrap();
        assert!(
            !w.agree && w.used.contains("not classified unified"),
            "{}",
            w.used
        );
        assert_eq!(
            offload_api::labels::published(&odd)[names::LABEL_UMA],
            "false"
        );
        // A small memory-only node is not the GPU's memory; an unreadable view is said.
        let small = witnessed(
            fixtures::H200_READING,
            Some(Some(vec![MemoryOnlyNode {
                node: 2,
                bytes: 8 << 30,
            }])),
        );
        let w = small.memory_witnesses.as_ref().unwrap();
        assert_eq!(w.kernel, Some(KernelGpuMemory::NotNumaNodes));
        assert!(w.agree);
        let unread = witnessed(fixtures::GH200_REFERENCE, Some(None));
        let w = unread.memory_witnesses.as_ref().unwrap();
        assert_eq!(w.kernel, None);
        assert!(w.used.contains("could not be read"), "{}", w.used);
    }
}
