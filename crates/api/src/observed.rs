//! What the agent observed the GPUs of configured pods doing, published on its own Node as the
//! versioned JSON annotation `offload.dev/observed`, and read by the operator into each
//! TrainingJob's `status.observed`.
//!
//! One summary per node and window: for every configured pod on the node, which GPUs it holds
//! (from the kubelet's pod-resources API), how busy they were (NVML, sampled over the window),
//! and how much CPU the pod used (its cgroup). Bounded: at most [`MAX_PODS`] pods and
//! [`MAX_OBSERVED_BYTES`] bytes, so no node can bloat what the operator reads.

use serde::{Deserialize, Serialize};

/// Version of the summary's JSON schema this code writes and reads.
pub const OBSERVED_SCHEMA_VERSION: u32 = 1;

/// Most pods one summary lists; the agent keeps the first by namespace and name.
pub const MAX_PODS: usize = 64;

/// Most bytes of the annotation the operator reads; a larger one is refused unread.
pub const MAX_OBSERVED_BYTES: usize = 64 * 1024;

/// Longest window an agent observes over (it publishes every minute by default).
pub const MAX_WINDOW_SECONDS: f64 = 3600.0;

/// Most GPUs one summary lists in all: as many as a node report may (a node has no more).
pub const MAX_GPUS: usize = crate::report::MAX_GPUS;

/// Where the busy fractions came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BusySource {
    /// NVML's device utilization sampled over the window (the share of each sample period in
    /// which any kernel ran): reads many short kernels as more busy than they are. Used where
    /// the GPUs have no GPM counters.
    NvmlDevice,
    /// A recorded NVML trace replayed (tests and demos only).
    RecordedTrace,
    /// NVML GPM's graphics-engine activity between counter snapshots at the window's ends
    /// (Hopper and later): the share of the window in which the GPU computed, exact for short
    /// kernels too.
    NvmlGpm,
}

/// One node's summary for one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObservedSummary {
    /// [`OBSERVED_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The node.
    pub node: String,
    /// When the window ended (RFC 3339).
    pub observed_at: String,
    /// Length of the window in seconds.
    pub window_seconds: f64,
    /// Where the busy fractions came from.
    pub source: BusySource,
    /// The configured pods on the node that hold GPUs, sorted by namespace and name.
    pub pods: Vec<PodObservation>,
}

/// One configured pod over the window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodObservation {
    /// Namespace of the pod.
    pub namespace: String,
    /// Name of the pod.
    pub name: String,
    /// The TrainingJob the pod belongs to (its `offload.dev/training-job` label), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_job: Option<String>,
    /// The GPUs the kubelet assigned to the pod (device IDs as the device plugin names them).
    pub gpus: Vec<String>,
    /// Mean busy fraction of those GPUs over the window, 0 to 1.
    pub gpu_busy: f64,
    /// Utilization samples behind `gpuBusy`.
    pub samples: u32,
    /// CPU the pod used over the window, in cores (from its cgroup); absent when unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<f64>,
}

/// A summary that could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ObservedError {
    /// Larger than [`MAX_OBSERVED_BYTES`].
    #[error("observed summary is {bytes} bytes, more than the {MAX_OBSERVED_BYTES} read")]
    TooLarge {
        /// Its size.
        bytes: usize,
    },
    /// Not JSON of this schema.
    #[error("observed summary is not valid JSON for schema version {OBSERVED_SCHEMA_VERSION}: {0}")]
    Malformed(String),
    /// Another schema version.
    #[error(
        "observed summary has schema version {found}, this operator reads version {OBSERVED_SCHEMA_VERSION}: upgrade the operator or the agent so they match"
    )]
    UnsupportedVersion {
        /// The version found.
        found: u64,
    },
    /// Figures that cannot be true.
    #[error("observed summary cannot be true: {0}")]
    Impossible(String),
}

impl ObservedSummary {
    /// Parses the annotation value: size first, then version, then fields, then figures.
    pub fn parse(json: &str) -> Result<ObservedSummary, ObservedError> {
        if json.len() > MAX_OBSERVED_BYTES {
            return Err(ObservedError::TooLarge { bytes: json.len() });
        }
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| ObservedError::Malformed(e.to_string()))?;
        match value
            .get("schemaVersion")
            .and_then(serde_json::Value::as_u64)
        {
            Some(v) if v == u64::from(OBSERVED_SCHEMA_VERSION) => {}
            Some(found) => return Err(ObservedError::UnsupportedVersion { found }),
            None => {
                return Err(ObservedError::Malformed(
                    "schemaVersion is missing or not a number".into(),
                ));
            }
        }
        let summary: ObservedSummary =
            serde_json::from_value(value).map_err(|e| ObservedError::Malformed(e.to_string()))?;
        summary.check()?;
        Ok(summary)
    }

    /// Rejects what no agent writes: fractions outside 0..1, a window that is not positive or
    /// longer than [`MAX_WINDOW_SECONDS`], negative CPU, a pod with no samples, more than
    /// [`MAX_PODS`] pods, a pod or a GPU listed twice, more than [`MAX_GPUS`] GPUs, an
    /// unreadable time.
    pub fn check(&self) -> Result<(), ObservedError> {
        let impossible = |m: String| Err(ObservedError::Impossible(m));
        if self.pods.len() > MAX_PODS {
            return impossible(format!(
                "{} pods listed, more than {MAX_PODS}",
                self.pods.len()
            ));
        }
        if !(self.window_seconds.is_finite()
            && self.window_seconds > 0.0
            && self.window_seconds <= MAX_WINDOW_SECONDS)
        {
            return impossible(format!(
                "window of {} s (an agent observes for up to {MAX_WINDOW_SECONDS} s)",
                self.window_seconds
            ));
        }
        let mut pods = std::collections::BTreeSet::new();
        let mut gpus = std::collections::BTreeSet::new();
        for pod in &self.pods {
            if !pods.insert((pod.namespace.as_str(), pod.name.as_str())) {
                return impossible(format!("pod {}/{} listed twice", pod.namespace, pod.name));
            }
            if pod.samples == 0 {
                return impossible(format!(
                    "pod {}/{} has a busy fraction from no samples",
                    pod.namespace, pod.name
                ));
            }
            for gpu in &pod.gpus {
                if !gpus.insert(gpu.as_str()) {
                    return impossible(format!(
                        "GPU {gpu:?} listed twice (for pod {}/{})",
                        pod.namespace, pod.name
                    ));
                }
            }
        }
        if gpus.len() > MAX_GPUS {
            return impossible(format!(
                "{} GPUs listed, more than the {MAX_GPUS} a node can have",
                gpus.len()
            ));
        }
        if self.observed_at.parse::<jiff::Timestamp>().is_err() {
            return impossible(format!("observedAt {:?} is not a time", self.observed_at));
        }
        for pod in &self.pods {
            if !(0.0..=1.0).contains(&pod.gpu_busy) {
                return impossible(format!(
                    "pod {}/{} busy fraction {}",
                    pod.namespace, pod.name, pod.gpu_busy
                ));
            }
            if pod.cpu_cores.is_some_and(|c| !(c.is_finite() && c >= 0.0)) {
                return impossible(format!(
                    "pod {}/{} CPU {:?} cores",
                    pod.namespace, pod.name, pod.cpu_cores
                ));
            }
            if pod.gpus.is_empty() {
                return impossible(format!("pod {}/{} holds no GPU", pod.namespace, pod.name));
            }
        }
        Ok(())
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// When the window ended.
    pub fn observed_at(&self) -> Option<jiff::Timestamp> {
        self.observed_at.parse().ok()
    }

    /// The pods of one TrainingJob.
    pub fn pods_of<'a>(
        &'a self,
        namespace: &'a str,
        job: &'a str,
    ) -> impl Iterator<Item = &'a PodObservation> + 'a {
        self.pods
            .iter()
            .filter(move |p| p.namespace == namespace && p.training_job.as_deref() == Some(job))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> ObservedSummary {
        ObservedSummary {
            schema_version: OBSERVED_SCHEMA_VERSION,
            node: "n".into(),
            observed_at: "2026-11-30T20:00:00Z".into(),
            window_seconds: 60.0,
            source: BusySource::NvmlDevice,
            pods: vec![PodObservation {
                namespace: "ns".into(),
                name: "job-0".into(),
                training_job: Some("job".into()),
                gpus: vec!["GPU-0".into()],
                gpu_busy: 0.58,
                samples: 600,
                cpu_cores: Some(3.5),
            }],
        }
    }

    #[test]
    fn round_trips_and_selects_a_jobs_pods() {
        let s = summary();
        let back = ObservedSummary::parse(&s.to_annotation().unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.pods_of("ns", "job").count(), 1);
        assert_eq!(back.pods_of("other", "job").count(), 0);
    }

    #[test]
    fn refuses_what_no_agent_writes() {
        let cases: Vec<(String, &str)> = vec![
            ("not json".into(), "not valid JSON"),
            ("{}".into(), "schemaVersion is missing"),
            (r#"{"schemaVersion": 7}"#.into(), "schema version 7"),
            (
                r#"{"schemaVersion": 1, "node": "n"}"#.into(),
                "not valid JSON",
            ),
            ("x".repeat(MAX_OBSERVED_BYTES + 1), "bytes, more than"),
        ];
        for (text, want) in cases {
            let err = ObservedSummary::parse(&text).unwrap_err().to_string();
            assert!(err.contains(want), "{err} should say {want}");
        }
        let mut busy = summary();
        busy.pods[0].gpu_busy = 1.5;
        let mut window = summary();
        window.window_seconds = f64::NAN;
        let mut cpu = summary();
        cpu.pods[0].cpu_cores = Some(-1.0);
        let mut at = summary();
        at.observed_at = "yesterday".into();
        let mut many = summary();
        many.pods = vec![many.pods[0].clone(); MAX_PODS + 1];
        let mut none = summary();
        none.pods[0].gpus.clear();
        // What a hostile or broken node wrote (found by an independent tester): one GPU 2,000
        // times, the same pod 64 times, a window of 1e308 s, a fraction from no samples.
        let mut one_gpu_many_times = summary();
        one_gpu_many_times.pods[0].gpus = vec!["GPU-0".into(); 2000];
        let mut same_pod = summary();
        same_pod.pods = vec![same_pod.pods[0].clone(); 64];
        let mut huge_window = summary();
        huge_window.window_seconds = 1e308;
        let mut no_samples = summary();
        no_samples.pods[0].samples = 0;
        let mut shared_gpu = summary();
        let mut second = shared_gpu.pods[0].clone();
        second.name = "job-1".into();
        shared_gpu.pods.push(second);
        for bad in [
            busy,
            window,
            cpu,
            at,
            many,
            none,
            one_gpu_many_times,
            same_pod,
            huge_window,
            no_samples,
            shared_gpu,
        ] {
            let text = serde_json::to_string(&bad).unwrap_or_else(|_| "{}".into());
            assert!(ObservedSummary::parse(&text).is_err(), "accepted {bad:?}");
        }
    }
}
