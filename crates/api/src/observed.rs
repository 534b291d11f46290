//! What the agent observed the GPUs of configured pods doing, published on its own Node as the
//! versioned JSON annotation `offload.dev/observed`, and read by the operator into each
//! TrainingJob's `status.observed`.
//!
//! One summary per node and window: for every configured pod on the node, which GPUs it holds
//! (from the kubelet's pod-resources API), how busy they were (NVML, sampled over the window),
//! how much of their memory was in use (NVML, the device's and, where NVML gives it, the pod's
//! own processes'), and how much CPU and host memory the pod used (its cgroup). Bounded: at most [`MAX_PODS`] pods and
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
    /// GPU memory in use on the busiest of the pod's GPUs at its highest over the window, bytes:
    /// NVML's device used memory, sampled (PyTorch's caching allocator keeps what it reserved,
    /// so the sampled high-water mark is the job's). Absent where NVML did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_peak_bytes: Option<u64>,
    /// Memory of the smallest of the pod's GPUs, bytes (NVML's total); present with
    /// `gpuMemoryPeakBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_total_bytes: Option<u64>,
    /// The same peak counting only the pod's own processes (NVML's per-process accounting,
    /// matched to the pod's cgroup); absent where NVML gives no per-process figure or the
    /// agent cannot see the processes (it runs outside the host's PID namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_gpu_memory_peak_bytes: Option<u64>,
    /// The pod's host memory at its highest, bytes, from its cgroup (see `hostMemorySource`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory_peak_bytes: Option<u64>,
    /// How `hostMemoryPeakBytes` was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory_source: Option<HostMemorySource>,
    /// PyTorch's own highest allocation (`torch.cuda.max_memory_allocated()`) on the pod's
    /// GPUs, bytes, as its training processes reported it at exit (the operator's reporter);
    /// what the job needed, where `gpuMemoryPeakBytes` also counts the allocator's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator_peak_bytes: Option<u64>,
    /// The median time of the pod's training iterations after its first, seconds, as its
    /// slowest training process timed them (the operator's reporter): what a faster
    /// configuration is measured by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_seconds: Option<f64>,
}

pub use crate::allocator::{
    ALLOCATOR_MARK, AllocatorReport, MAX_STEP_MS, MIN_TIMED_STEPS, allocator_report, plausible_step,
};

/// How far after the reader's clock an observed window may end (the node's clock ahead).
pub const OBSERVED_CLOCK_SKEW: jiff::SignedDuration = jiff::SignedDuration::from_mins(10);

/// How far a pod's GPU memory total may be from its node's reported GPU memory (NVML's totals
/// of one GPU differ by less across readings).
pub const GPU_TOTAL_TOLERANCE: f64 = 0.05;

impl PodObservation {
    /// Why this pod's memory figures cannot be true on a node whose GPUs have `node_gpus` bytes
    /// each (the node's report) and whose host has `node_memory` bytes, if they cannot: a GPU
    /// the node does not have, a peak above the GPU it was taken on, the pod's own processes
    /// above the whole device, a host peak above the node. `None` where they can be (or where
    /// nothing is known to check them against).
    pub fn implausible(&self, node_gpus: &[u64], node_memory: Option<u64>) -> Option<String> {
        let who = format!("pod {}/{}", self.namespace, self.name);
        if let Some(total) = self.gpu_memory_total_bytes
            && !node_gpus.is_empty()
            && !node_gpus.iter().any(|g| {
                #[allow(clippy::cast_precision_loss)]
                let (g, t) = (*g as f64, total as f64);
                (t - g).abs() <= GPU_TOTAL_TOLERANCE * g
            })
        {
            return Some(format!(
                "{who} reports GPUs of {total} bytes; the node's report has {}",
                node_gpus
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let (Some(peak), Some(total)) = (self.gpu_memory_peak_bytes, self.gpu_memory_total_bytes)
            && peak > total
        {
            return Some(format!(
                "{who} peaked at {peak} bytes of GPU memory, above its GPU's {total}"
            ));
        }
        if let (Some(own), Some(device)) = (
            self.process_gpu_memory_peak_bytes,
            self.gpu_memory_peak_bytes,
        ) && own > device
        {
            return Some(format!(
                "{who}'s own processes peaked at {own} bytes of GPU memory, above the whole device's peak of {device}"
            ));
        }
        if let (Some(host), Some(limit)) = (self.host_memory_peak_bytes, node_memory)
            && host > limit
        {
            return Some(format!(
                "{who} used {host} bytes of host memory, more than the node's {limit}"
            ));
        }
        None
    }
}

/// Where a pod's host memory peak came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostMemorySource {
    /// cgroup v2 `memory.peak`: the pod's high-water mark since its cgroup was made.
    CgroupPeak,
    /// cgroup v1 `memory.max_usage_in_bytes`: the same, in the v1 memory hierarchy.
    CgroupMaxUsage,
    /// The largest of `memory.current` (v2) or `memory.usage_in_bytes` (v1) sampled over the
    /// window, where the kernel keeps no high-water mark: a peak between samples is missed.
    SampledCurrent,
    /// The kernel's peak resident set of the observed command's largest process (`ru_maxrss`
    /// of its children, `offload-agent observe -- COMMAND`).
    ProcessPeakRss,
}

/// A document the agent writes, read as far as its size and schema version: the JSON, bounded
/// by [`MAX_OBSERVED_BYTES`], of [`OBSERVED_SCHEMA_VERSION`].
fn versioned(json: &str) -> Result<serde_json::Value, ObservedError> {
    if json.len() > MAX_OBSERVED_BYTES {
        return Err(ObservedError::TooLarge { bytes: json.len() });
    }
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| ObservedError::Malformed(e.to_string()))?;
    match value
        .get("schemaVersion")
        .and_then(serde_json::Value::as_u64)
    {
        Some(v) if v == u64::from(OBSERVED_SCHEMA_VERSION) => Ok(value),
        Some(found) => Err(ObservedError::UnsupportedVersion { found }),
        None => Err(ObservedError::Malformed(
            "schemaVersion is missing or not a number".into(),
        )),
    }
}

/// Most characters of an observed run's message (its output's last lines) kept.
pub const MAX_RUN_MESSAGE: usize = 1024;

/// One run of a training command, as `offload-agent observe -- COMMAND` saw it: its GPUs'
/// figures over its whole life and how it ended. `offload-operator explain --observed` reads
/// it to show what the next decision of the same job would be.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObservedRun {
    /// [`OBSERVED_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The command that ran.
    pub command: Vec<String>,
    /// How long it ran, seconds.
    pub seconds: f64,
    /// Its exit status; absent when a signal ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The last lines it printed (at most [`MAX_RUN_MESSAGE`] characters): where PyTorch says
    /// `CUDA out of memory`, as a pod's termination message would.
    pub message: String,
    /// Its GPUs and host memory over the run, as a pod's are over a window.
    pub pod: PodObservation,
    /// The configuration the run was given: the offload variables of its environment as the
    /// operator renders them ([`RUN_CONFIGURATION_KEYS`]: `OFFLOAD_MODE`, `OFFLOAD_RATIO`, …).
    /// Empty where it had none (a run the operator did not configure, or an older agent).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub configuration: std::collections::BTreeMap<String, String>,
}

/// The variables of a run's environment an observed run records: what says which offload
/// configuration it ran.
pub const RUN_CONFIGURATION_KEYS: [&str; 4] = [
    crate::names::ENV_MODE,
    crate::names::ENV_RATIO,
    crate::names::ENV_OVERLAP,
    crate::names::ENV_PROFILE,
];

/// Longest value of a recorded configuration variable.
pub const MAX_CONFIGURATION_VALUE: usize = 64;

impl ObservedRun {
    /// Parses an observed run: size first, then version, then fields, then figures.
    pub fn parse(json: &str) -> Result<ObservedRun, ObservedError> {
        let value = versioned(json)?;
        let run: ObservedRun =
            serde_json::from_value(value).map_err(|e| ObservedError::Malformed(e.to_string()))?;
        let impossible = |m: String| Err(ObservedError::Impossible(m));
        if !(run.seconds.is_finite() && run.seconds >= 0.0) {
            return impossible(format!("a run of {} s", run.seconds));
        }
        if run.message.chars().count() > MAX_RUN_MESSAGE {
            return impossible(format!(
                "a message of more than {MAX_RUN_MESSAGE} characters"
            ));
        }
        if run.pod.samples == 0 || !(0.0..=1.0).contains(&run.pod.gpu_busy) {
            return impossible(format!(
                "busy fraction {} from {} samples",
                run.pod.gpu_busy, run.pod.samples
            ));
        }
        if let Some((k, v)) = run.configuration.iter().find(|(k, v)| {
            !RUN_CONFIGURATION_KEYS.contains(&k.as_str())
                || v.chars().count() > MAX_CONFIGURATION_VALUE
        }) {
            return impossible(format!(
                "a configuration variable {k:?} = {:?} (recorded: {} of at most {MAX_CONFIGURATION_VALUE} characters)",
                v.chars().take(MAX_CONFIGURATION_VALUE).collect::<String>(),
                RUN_CONFIGURATION_KEYS.join(", ")
            ));
        }
        check_memory(&run.pod)?;
        Ok(run)
    }

    /// Whether it ended well.
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// Most host memory a pod's observation may state (64 TiB, as for a node's).
pub const MAX_HOST_MEMORY: u64 = 1 << 46;

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
        let value = versioned(json)?;
        let summary: ObservedSummary =
            serde_json::from_value(value).map_err(|e| ObservedError::Malformed(e.to_string()))?;
        summary.check()?;
        Ok(summary)
    }

    /// Rejects what no agent writes: fractions outside 0..1, a window that is not positive or
    /// longer than [`MAX_WINDOW_SECONDS`], negative CPU, a step time not within a day, a pod
    /// with no samples, more than
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
            check_memory(pod)?;
        }
        Ok(())
    }

    /// The largest GPU memory and host memory any pod of the summary states: what the node's
    /// own figures must bound.
    pub fn largest_memory(&self) -> (Option<&PodObservation>, Option<&PodObservation>) {
        (
            self.pods
                .iter()
                .filter(|p| p.gpu_memory_total_bytes.is_some())
                .max_by_key(|p| p.gpu_memory_total_bytes),
            self.pods
                .iter()
                .filter(|p| p.host_memory_peak_bytes.is_some())
                .max_by_key(|p| p.host_memory_peak_bytes),
        )
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// When the window ended.
    pub fn observed_at(&self) -> Option<jiff::Timestamp> {
        self.observed_at.parse().ok()
    }

    /// Why the window cannot be evidence at `now`: it ends after now (beyond
    /// [`OBSERVED_CLOCK_SKEW`]: another clock far ahead, or a hand-made summary that would never
    /// go stale), or its time does not read.
    pub fn not_current(&self, now: jiff::Timestamp) -> Option<String> {
        match self.observed_at() {
            None => Some(format!(
                "its window's end {:?} is not a time",
                self.observed_at.chars().take(64).collect::<String>()
            )),
            Some(at) if at.duration_since(now) > OBSERVED_CLOCK_SKEW => {
                Some(format!("its window ends at {at}, after now ({now})"))
            }
            Some(_) => None,
        }
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

/// A pod's figures as no agent writes them: a step not within a day, a GPU peak without the
/// GPU's size or above it, a GPU larger than any ([`crate::report::MAX_GPU_MEMORY`]), a
/// per-process peak above the device's, host memory beyond [`MAX_HOST_MEMORY`] or without its
/// source.
fn check_memory(pod: &PodObservation) -> Result<(), ObservedError> {
    let who = || format!("pod {}/{}", pod.namespace, pod.name);
    let impossible = |m: String| Err(ObservedError::Impossible(m));
    if let Some(s) = pod.step_seconds
        && !plausible_step(s)
    {
        return impossible(format!("{} steps in {s} s (from 0 to a day)", who()));
    }
    match (pod.gpu_memory_peak_bytes, pod.gpu_memory_total_bytes) {
        (None, None) => {}
        (Some(peak), Some(total)) => {
            if total == 0 || total > crate::report::MAX_GPU_MEMORY {
                return impossible(format!(
                    "{} has GPUs of {total} bytes (a GPU has at most {} GiB)",
                    who(),
                    crate::report::MAX_GPU_MEMORY >> 30
                ));
            }
            if peak > total {
                return impossible(format!(
                    "{} used {peak} bytes of GPU memory, more than its GPU's {total}",
                    who()
                ));
            }
        }
        _ => {
            return impossible(format!(
                "{} states a GPU memory peak without its GPU's size, or the size without a peak",
                who()
            ));
        }
    }
    if let Some(process) = pod.process_gpu_memory_peak_bytes
        && pod
            .gpu_memory_peak_bytes
            .is_none_or(|device| process > device)
    {
        return impossible(format!(
            "{}'s processes used {process} bytes of GPU memory, more than the device had in use ({:?})",
            who(),
            pod.gpu_memory_peak_bytes
        ));
    }
    match (pod.host_memory_peak_bytes, pod.host_memory_source) {
        (Some(peak), Some(_)) if peak > MAX_HOST_MEMORY => impossible(format!(
            "{} used {peak} bytes of host memory (a node has at most {} TiB)",
            who(),
            MAX_HOST_MEMORY >> 40
        )),
        (Some(_), None) | (None, Some(_)) => impossible(format!(
            "{} states a host memory peak without its source, or a source without the peak",
            who()
        )),
        _ => Ok(()),
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
                gpu_memory_peak_bytes: Some(60 << 30),
                gpu_memory_total_bytes: Some(150_754_820_096),
                process_gpu_memory_peak_bytes: Some(59 << 30),
                host_memory_peak_bytes: Some(90 << 30),
                host_memory_source: Some(HostMemorySource::CgroupMaxUsage),
                allocator_peak_bytes: None,
                step_seconds: None,
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
        // What a hostile or broken node wrote: one GPU 2,000
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
        let mut gpu_over = summary();
        gpu_over.pods[0].gpu_memory_peak_bytes = Some(151 << 30);
        let mut gpu_huge = summary();
        gpu_huge.pods[0].gpu_memory_total_bytes = Some(u64::MAX);
        gpu_huge.pods[0].gpu_memory_peak_bytes = Some(u64::MAX);
        let mut gpu_half = summary();
        gpu_half.pods[0].gpu_memory_total_bytes = None;
        let mut process_over = summary();
        process_over.pods[0].process_gpu_memory_peak_bytes = Some(61 << 30);
        let mut host_huge = summary();
        host_huge.pods[0].host_memory_peak_bytes = Some(1 << 50);
        let mut host_unsourced = summary();
        host_unsourced.pods[0].host_memory_source = None;
        let mut step_negative = summary();
        step_negative.pods[0].step_seconds = Some(-1.0);
        let mut step_long = summary();
        step_long.pods[0].step_seconds = Some(1e6);
        for bad in [
            step_negative,
            step_long,
            gpu_over,
            gpu_huge,
            gpu_half,
            process_over,
            host_huge,
            host_unsourced,
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
