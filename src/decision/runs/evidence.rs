//! What counts as evidence that a training process ran out of memory, and what its words say
//! the job needed: read the same way by the controller (from a pod's termination message) and by
//! `explain --observed` (from an observed run), so both judge a run alike.
//!
//! Only the failure that ended the process counts: the last error in its message, where a
//! launcher's own wrapper (`ChildFailedError`, `CalledProcessError`, DeepSpeed's "exits with
//! return code") is read through to the error of the rank it reports. An out-of-memory that was
//! caught earlier, and a JVM's `java.lang.OutOfMemoryError`, are not the GPU running out.

use k8s_openapi::api::core::v1::Pod;
use offload_api::v1alpha1::{MemoryFailure, MemoryKind, OffloadDecisionStatus, TrainingJob};

/// What PyTorch and the CUDA libraries print when a GPU allocation fails.
pub const GPU_OOM_TEXT: &[&str] = &[
    "CUDA out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "c10::OutOfMemoryError",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDA error: out of memory",
    "cudaErrorMemoryAllocation",
];

/// Lines a launcher prints about a rank that failed: read through, to the rank's own error.
const WRAPPERS: &[&str] = &[
    "ChildFailedError",
    "CalledProcessError",
    "exits with return code",
    "sigkill_handler",
];

/// Most characters of a pod's message kept as evidence.
pub const MAX_MESSAGE: usize = 1024;

/// A line without a rank prefix (`[rank0]: `, as torchrun tees a rank's output).
fn unprefixed(line: &str) -> &str {
    let t = line.trim();
    if let Some(rest) = t.strip_prefix("[rank")
        && let Some(end) = rest.find("]:")
        && rest[..end].bytes().all(|b| b.is_ascii_digit())
    {
        return rest[end + 2..].trim();
    }
    t
}

/// Whether a line says the GPU ran out of memory.
fn gpu_oom_line(line: &str) -> bool {
    GPU_OOM_TEXT.iter().any(|t| line.contains(t))
}

/// Whether a line is an error being raised (`ValueError: …`, `java.lang.OutOfMemoryError: …`,
/// `Exception in thread "main" …`, a C++ `what():`), as opposed to a log line or a frame.
fn error_line(line: &str) -> bool {
    if gpu_oom_line(line) || line.starts_with("what():") {
        return true;
    }
    let head = line.split(": ").next().unwrap_or_default();
    head.len() < line.len()
        && ["Error", "Exception", "Interrupt", "Exit"]
            .iter()
            .any(|w| head.contains(w))
}

/// The error that ended a process, from its last words: the last error line that is not a
/// launcher's wrapper; `None` where the message names no error.
pub fn final_error(message: &str) -> Option<&str> {
    message
        .lines()
        .rev()
        .map(unprefixed)
        .filter(|l| !l.is_empty() && !WRAPPERS.iter().any(|w| l.contains(w)))
        .find(|l| error_line(l))
}

/// Whether the error that ended a process is a GPU allocation failing.
pub fn says_gpu_out_of_memory(message: &str) -> bool {
    final_error(message).is_some_and(gpu_oom_line)
}

/// The end of `message`, at most [`MAX_MESSAGE`] characters (PyTorch's error is at the end).
pub fn message_tail(message: &str) -> String {
    let trimmed = message.trim();
    let skip = trimmed.chars().count().saturating_sub(MAX_MESSAGE);
    trimmed.chars().skip(skip).collect()
}

/// How the container `container` of `pod` ran out of memory, from its terminated state (the
/// current one, or the last where the kubelet restarted it in place); `None` for anything else,
/// and for every other container (a sidecar's failure is not the training process's). With no
/// container named, the first container whose state says so.
pub fn memory_failure(pod: &Pod, container: Option<&str>) -> Option<(MemoryKind, String)> {
    let status = pod.status.as_ref()?;
    status
        .container_statuses
        .iter()
        .flatten()
        .filter(|c| container.is_none_or(|name| c.name == name))
        .find_map(|c| {
            let terminated = c
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref()))?;
            let message = message_tail(terminated.message.as_deref().unwrap_or_default());
            if terminated.reason.as_deref() == Some("OOMKilled") {
                let said = if message.is_empty() {
                    format!(
                        "container {} was OOMKilled (exit {})",
                        c.name, terminated.exit_code
                    )
                } else {
                    message
                };
                return Some((
                    MemoryKind::Host,
                    offload_api::text::bounded_to(&said, MAX_MESSAGE),
                ));
            }
            (terminated.exit_code != 0 && says_gpu_out_of_memory(&message)).then(|| {
                (
                    MemoryKind::Gpu,
                    offload_api::text::bounded_to(&message, MAX_MESSAGE),
                )
            })
        })
}

/// The configuration a decision wrote, in the annotation's words.
pub fn configuration(d: &OffloadDecisionStatus) -> String {
    format!(
        "mode={} overlap={} ratio={} pinMemory={} nodeClass={} profile={}",
        d.mode,
        d.overlap,
        d.offload_ratio,
        d.pin_memory,
        d.node_class.map_or("none".to_string(), |c| c.to_string()),
        d.profile
    )
}

/// The record of a failure of `kind` of the configuration `decision` wrote, by pod `pod` of
/// `tj`, saying `message`, seen at `seen_at`: with the decision's estimate and what the pod had
/// (its GPU budget; on the host its limit, else its share of the node), and for the GPU what
/// PyTorch's allocator said the job needed. The controller and `explain --observed` record
/// failures alike with it.
pub fn failure_record(
    tj: &TrainingJob,
    decision: Option<&OffloadDecisionStatus>,
    kind: MemoryKind,
    pod: &str,
    message: &str,
    seen_at: String,
) -> MemoryFailure {
    let estimate = decision.and_then(|d| d.estimate.as_ref());
    let (estimate_bytes, budget_bytes) = match (kind, estimate) {
        (MemoryKind::Gpu, Some(e)) => (Some(e.gpu_bytes), Some(e.gpu_budget_bytes)),
        (MemoryKind::Host, Some(e)) => (Some(e.host_bytes), e.host_budget_bytes),
        (_, None) => (None, None),
    };
    let limit_bytes = match kind {
        MemoryKind::Host => crate::decision::PodResources::of(tj.spec.template.spec.as_ref())
            .ok()
            .and_then(|r| r.memory_limit)
            .and_then(|b| i64::try_from(b).ok()),
        MemoryKind::Gpu => None,
    };
    #[allow(clippy::cast_possible_truncation)]
    let needed_bytes = match kind {
        MemoryKind::Gpu => AllocatorOom::parse(message)
            .map(|o| o.needed())
            .filter(|n| *n >= 1.0 && *n < 9e18)
            .map(|n| n as i64),
        MemoryKind::Host => None,
    };
    MemoryFailure {
        kind,
        configuration: decision.map(configuration).unwrap_or_default(),
        estimate_bytes,
        budget_bytes,
        limit_bytes,
        needed_bytes,
        pod: pod.to_string(),
        message: offload_api::text::bounded_to(message, MAX_MESSAGE),
        seen_at,
    }
}

pub use offload_api::observed::{AllocatorReport, allocator_report};

/// What PyTorch's caching allocator said when a GPU allocation failed: "Tried to allocate X
/// … Y is allocated by PyTorch, and Z is reserved by PyTorch but unallocated".
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllocatorOom {
    /// X: the allocation that failed, bytes.
    pub asked: f64,
    /// Y: what the allocator had handed out, bytes.
    pub allocated: f64,
    /// Z: what it held but had not handed out, bytes, where said.
    pub reserved_unallocated: Option<f64>,
}

impl AllocatorOom {
    /// The figures of PyTorch's out-of-memory text, where the message carries them.
    pub fn parse(message: &str) -> Option<AllocatorOom> {
        let line = final_error(message).filter(|l| gpu_oom_line(l))?;
        let asked = size_after(line, "Tried to allocate ")?;
        let allocated = size_before(line, " is allocated by PyTorch")?;
        let reserved_unallocated = size_before(line, " is reserved by PyTorch but unallocated");
        Some(AllocatorOom {
            asked,
            allocated,
            reserved_unallocated,
        })
    }

    /// What the job needed at least, bytes: what it had plus what it asked for.
    pub fn needed(&self) -> f64 {
        self.allocated + self.asked
    }
}

/// A size PyTorch printed (`2.00 GiB`, `512.00 MiB`, `20 bytes`), in bytes.
fn size(number: &str, unit: &str) -> Option<f64> {
    let n: f64 = number.parse().ok()?;
    let scale = match unit.trim_end_matches(['.', ',', ';']) {
        "B" | "bytes" | "byte" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    (0.0..1e6).contains(&n).then_some(n * scale)
}

/// The size right after `marker` in `line`.
fn size_after(line: &str, marker: &str) -> Option<f64> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let mut words = rest.split_whitespace();
    size(words.next()?, words.next()?)
}

/// The size right before `marker` in `line`.
fn size_before(line: &str, marker: &str) -> Option<f64> {
    let head = &line[..line.find(marker)?];
    let mut words = head.split_whitespace().rev();
    let unit = words.next()?;
    size(words.next()?, unit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PYTORCH: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of 139.81 GiB of which 1.21 GiB is free. Including non-PyTorch memory, this process has 138.58 GiB memory in use. Of the allocated memory 136.30 GiB is allocated by PyTorch, and 1.70 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.";

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p"}, "status": {"containerStatuses": containers}}),
        )
        .unwrap()
    }

    fn terminated(name: &str, exit: i32, reason: &str, message: &str) -> serde_json::Value {
        json!({"name": name, "image": "t", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": exit, "reason": reason, "message": message}}})
    }

    #[test]
    fn only_the_error_that_ended_the_process_counts() {
        let traceback = format!(
            "Traceback (most recent call last):\n  File \"train.py\", line 88\n    engine.backward(loss)\n{PYTORCH}"
        );
        assert!(says_gpu_out_of_memory(&traceback));
        // Under a launcher: its wrapper and log lines are read through.
        let launched = format!(
            "[rank0]: {PYTORCH}\n[2026-12-04 10:00:00,000] [ERROR] [launch.py:325:sigkill_handler] ['python', 'train.py'] exits with return code = 1\nsubprocess.CalledProcessError: Command '['python']' returned non-zero exit status 1."
        );
        assert!(says_gpu_out_of_memory(&launched), "{launched}");
        let torchrun = format!(
            "{PYTORCH}\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n============================================================\ntrain.py FAILED\n  error_file: <N/A>\n  exitcode  : 1 (pid: 42)"
        );
        assert!(says_gpu_out_of_memory(&torchrun), "{torchrun}");
        // Caught and retried, then something else ended it.
        let caught =
            format!("{PYTORCH}\nretrying with a smaller batch\nValueError: expected 4, got 3");
        assert!(!says_gpu_out_of_memory(&caught));
        // A JVM's heap is not the GPU, and neither is an "OutOfMemoryError" of its own.
        for other in [
            "Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space",
            "java.lang.OutOfMemoryError: GC overhead limit exceeded",
            "torch.OutOfMemoryError would be raised\nKeyboardInterrupt: stopped",
        ] {
            assert!(!says_gpu_out_of_memory(other), "{other}");
        }
        assert!(says_gpu_out_of_memory(
            "terminate called after throwing an instance of 'c10::OutOfMemoryError'\n  what():  CUDA out of memory. Tried to allocate 20.00 MiB"
        ));
    }

    #[test]
    fn the_allocator_figures_are_read_from_pytorchs_text() {
        let oom = AllocatorOom::parse(PYTORCH).unwrap();
        let gib = 1024.0 * 1024.0 * 1024.0;
        assert!((oom.asked / gib - 2.32).abs() < 1e-9);
        assert!((oom.allocated / gib - 136.30).abs() < 1e-9);
        assert!((oom.reserved_unallocated.unwrap() / gib - 1.70).abs() < 1e-9);
        assert!((oom.needed() / gib - 138.62).abs() < 1e-9);
        assert!(AllocatorOom::parse("CUDA out of memory. Tried to allocate 20.00 MiB").is_none());
        assert!(
            AllocatorOom::parse(
                "CUDA out of memory. Tried to allocate NaN GiB. 1 GiB is allocated by PyTorch"
            )
            .is_none()
        );
        assert!(
            AllocatorOom::parse(
                "ValueError: Tried to allocate 2 GiB. 1 GiB is allocated by PyTorch"
            )
            .is_none()
        );
    }

    #[test]
    fn the_reporters_lines_give_the_highest_figures() {
        let m = "step 10 done\noffload.dev/allocator rank=0 allocated=1000 reserved=1500 step_ms=2021.5 steps=40\noffload.dev/allocator rank=1 allocated=1200 reserved=1400 step_ms=2100.0 steps=40\n";
        assert_eq!(
            allocator_report(m),
            Some(AllocatorReport {
                allocated: 1200,
                reserved: 1500,
                step_seconds: Some(2.1),
            }),
            "the highest memory, the slowest rank's step"
        );
        // A step time out of bounds is not read; the memory figures of its line stay.
        for bad in [
            "step_ms=-3",
            "step_ms=NaN",
            "step_ms=inf",
            "step_ms=1e12",
            "step_ms=0",
        ] {
            let r = allocator_report(&format!(
                "offload.dev/allocator rank=0 allocated=1000 reserved=1500 {bad} steps=3"
            ));
            assert_eq!(
                r,
                Some(AllocatorReport {
                    allocated: 1000,
                    reserved: 1500,
                    step_seconds: None,
                }),
                "{bad}"
            );
        }
        // A report without a step (too few iterations timed) keeps another rank's.
        let one = "offload.dev/allocator rank=0 allocated=1000 reserved=1500\noffload.dev/allocator rank=1 allocated=900 reserved=1000 step_ms=500 steps=12";
        assert_eq!(
            allocator_report(one).and_then(|r| r.step_seconds),
            Some(0.5)
        );
        assert_eq!(
            allocator_report("offload.dev/allocator rank=0 allocated=x"),
            None
        );
        assert_eq!(allocator_report("no report"), None);
        // The report after a traceback: the error is still the one that ended it.
        let failed = format!("{PYTORCH}\noffload.dev/allocator rank=0 allocated=1 reserved=2");
        assert!(says_gpu_out_of_memory(&failed));
        assert!(AllocatorOom::parse(&failed).is_some());
    }

    #[test]
    fn only_the_training_container_is_read() {
        let p = pod(json!([
            terminated("sidecar", 1, "Error", PYTORCH),
            json!({"name": "train", "image": "t", "ready": true, "restartCount": 0, "state": {"running": {}}}),
        ]));
        assert_eq!(memory_failure(&p, Some("train")), None);
        let killed = pod(json!([
            terminated("sidecar", 137, "OOMKilled", ""),
            json!({"name": "train", "image": "t", "ready": true, "restartCount": 0, "state": {"running": {}}}),
        ]));
        assert_eq!(memory_failure(&killed, Some("train")), None);
        let p = pod(json!([terminated("train", 1, "Error", PYTORCH)]));
        assert_eq!(
            memory_failure(&p, Some("train")).unwrap().0,
            MemoryKind::Gpu
        );
        let restarted = pod(
            json!([{"name": "train", "image": "t", "ready": true, "restartCount": 1,
            "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]),
        );
        let (kind, message) = memory_failure(&restarted, Some("train")).unwrap();
        assert_eq!(kind, MemoryKind::Host);
        assert!(message.contains("OOMKilled (exit 137)"), "{message}");
        let java = pod(json!([terminated(
            "train",
            1,
            "Error",
            "java.lang.OutOfMemoryError: Java heap space"
        )]));
        assert_eq!(memory_failure(&java, Some("train")), None);
        // A huge message is bounded, keeping its end (where PyTorch's error is).
        let long = format!("{}\n{PYTORCH}", "x".repeat(100_000));
        let huge = pod(json!([terminated("train", 1, "Error", &long)]));
        let (_, message) = memory_failure(&huge, None).unwrap();
        assert!(message.chars().count() <= MAX_MESSAGE && message.ends_with("fragmentation."));
    }
}
