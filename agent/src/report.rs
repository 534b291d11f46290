//! Assembling the node report from a reading and a self-test.

use offload_api::report::{NodeMemoryModel, NodeReport, REPORT_SCHEMA_VERSION, SelfTestReport};

use crate::probe::{NodeReading, NvmlSource, os_numa_nodes};
use crate::selftest::{self, SelfTestOptions};

/// Version of this agent, written into every report.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Reads NVML, runs the self-test where a GPU is present, and builds the report.
pub fn build(
    node: &str,
    source: &dyn NvmlSource,
    options: &SelfTestOptions,
    run_selftest: bool,
) -> NodeReport {
    let reading = source.read();
    let model = reading.memory_model();
    let selftest = if !run_selftest {
        SelfTestReport::untested(options.threshold, "self-test disabled (--no-selftest)")
    } else if model == NodeMemoryModel::NoGpu {
        SelfTestReport::untested(options.threshold, "no GPU on this node")
    } else if !reading.nvml.available {
        SelfTestReport::untested(
            options.threshold,
            "NVML is not available, so the GPU was not tested",
        )
    } else {
        let opts = SelfTestOptions {
            coherent: model == NodeMemoryModel::Coherent,
            ..options.clone()
        };
        selftest::run(&opts)
    };
    assemble(node, reading, selftest)
}

/// Puts a reading and a self-test together.
pub fn assemble(node: &str, reading: NodeReading, selftest: SelfTestReport) -> NodeReport {
    let memory_model = reading.memory_model();
    NodeReport {
        schema_version: REPORT_SCHEMA_VERSION,
        agent_version: AGENT_VERSION.to_string(),
        node: node.to_string(),
        generated_at: jiff::Timestamp::now().to_string(),
        nvml: reading.nvml,
        gpus: reading.gpus,
        memory_model,
        os_numa_nodes: os_numa_nodes(),
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
            true,
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
        let labels = report.labels();
        assert_eq!(labels[names::LABEL_UMA], "false");
        assert_eq!(labels[names::LABEL_OVERLAP], "untested");
        // The operator's parser reads exactly what the agent wrote.
        let parsed = NodeReport::parse(&report.to_annotation().unwrap()).unwrap();
        assert_eq!(parsed, report);
    }

    #[test]
    fn a_recorded_gh200_reading_labels_the_node_coherent() {
        let source = RecordedNvml::from_report(fixtures::GH200_REFERENCE).unwrap();
        let report = build("gh200-0", &source, &SelfTestOptions::default(), false);
        assert_eq!(report.memory_model, NodeMemoryModel::Coherent);
        let labels = report.labels();
        assert_eq!(labels[names::LABEL_UMA], "true");
        assert_eq!(labels[names::LABEL_ADDRESSING_MODE], "ats");
        assert_eq!(labels[names::LABEL_C2C], "true");
        assert_eq!(
            NodeReport::parse(&report.to_annotation().unwrap()).unwrap(),
            report
        );
    }
}
