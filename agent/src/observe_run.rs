//! Observing one run of a training command from start to end (`offload-agent observe --
//! COMMAND`): the same NVML sampling as a pod's window, for the command's whole life, with its
//! host memory peak (the kernel's `ru_maxrss` of its children), how it ended and its last output
//! lines (where PyTorch says `CUDA out of memory`). The result is what `offload-operator explain
//! --observed` reads.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use offload_api::observed::{
    HostMemorySource, MAX_RUN_MESSAGE, OBSERVED_SCHEMA_VERSION, ObservedRun, PodObservation,
};

use crate::utilization::{MemoryPeaks, UtilizationSource};

/// Output lines kept for the message.
const KEPT_LINES: usize = 40;

/// Copies `from` to `to` line by line, keeping the last lines in `kept`.
fn tee(
    from: impl Read + Send + 'static,
    mut to: impl Write + Send + 'static,
    kept: Arc<Mutex<VecDeque<String>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(from);
        let mut line = Vec::new();
        while let Ok(n) = reader.read_until(b'\n', &mut line) {
            if n == 0 {
                break;
            }
            let _ = to.write_all(&line);
            let text = String::from_utf8_lossy(&line).trim_end().to_string();
            if let Ok(mut k) = kept.lock() {
                if k.len() == KEPT_LINES {
                    k.pop_front();
                }
                k.push_back(text);
            }
            line.clear();
        }
    })
}

/// The largest resident set of the waited-for children, bytes.
fn children_peak_rss() -> Option<u64> {
    // SAFETY: getrusage writes into the zeroed struct it is given and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage for the duration of the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &raw mut usage) };
    (rc == 0 && usage.ru_maxrss > 0)
        .then(|| u64::try_from(usage.ru_maxrss).ok())
        .flatten()
        .map(|kib| kib.saturating_mul(1024))
}

/// What the command's processes reported (their highest allocation, their slowest step), from at
/// most 64 KiB of the report file; `None` where none was written.
fn read_report(path: &std::path::Path) -> Option<offload_api::observed::AllocatorReport> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(64 * 1024)
        .read_to_string(&mut text)
        .ok()?;
    offload_api::observed::allocator_report(&text)
}

/// The command started with the reporter's path in its environment, its output copied to ours
/// and its last lines kept.
#[allow(clippy::type_complexity)]
fn spawn_teed(
    program: &str,
    args: &[String],
    report: &std::path::Path,
) -> Result<
    (
        std::process::Child,
        Vec<std::thread::JoinHandle<()>>,
        Arc<Mutex<VecDeque<String>>>,
    ),
    String,
> {
    let mut child = Command::new(program)
        .args(args)
        .env("OFFLOAD_MEMORY_REPORT", report)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let kept = Arc::new(Mutex::new(VecDeque::new()));
    let mut copies = Vec::new();
    if let Some(out) = child.stdout.take() {
        copies.push(tee(out, std::io::stderr(), kept.clone()));
    }
    if let Some(err) = child.stderr.take() {
        copies.push(tee(err, std::io::stderr(), kept.clone()));
    }
    Ok((child, copies, kept))
}

/// Samples the GPUs' memory and utilization every `interval` until the command ends: how it
/// ended, the memory peaks, and the utilization summed over its samples.
fn sample_until_exit<S: UtilizationSource + ?Sized>(
    source: &S,
    devices: &[u32],
    interval: Duration,
    child: &mut std::process::Child,
    program: &str,
) -> Result<(std::process::ExitStatus, MemoryPeaks, u64, u32), String> {
    let mut memory = MemoryPeaks::default();
    let (mut busy, mut samples) = (0u64, 0u32);
    let status = loop {
        memory.sample(source, devices);
        if let Ok(v) = source.utilization(devices) {
            for (_, pct) in v {
                busy += u64::from(pct.min(100));
                samples = samples.saturating_add(1);
            }
        }
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => std::thread::sleep(interval),
            Err(e) => return Err(format!("waiting for {program}: {e}")),
        }
    };
    Ok((status, memory, busy, samples))
}

/// Runs `command` and observes `devices` (all when empty) every `interval` until it ends.
pub fn observe_command<S: UtilizationSource + ?Sized>(
    source: &S,
    devices: &[u32],
    interval: Duration,
    command: &[String],
) -> Result<ObservedRun, String> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| "no command to run".to_string())?;
    let started = Instant::now();
    // Where the operator's reporter of PyTorch's figures (a sitecustomize.py on the command's
    // PYTHONPATH) writes them at each process's exit.
    let report = std::env::temp_dir().join(format!(
        "offload-observe-{}-{}.report",
        std::process::id(),
        started.elapsed().as_nanos()
    ));
    let _ = std::fs::remove_file(&report);
    let (mut child, copies, kept) = spawn_teed(program, args, &report)?;
    let pid = child.id();
    let (status, memory, busy, samples) =
        sample_until_exit(source, devices, interval, &mut child, program)?;
    for c in copies {
        let _ = c.join();
    }
    let peaks = memory.finish();
    let reported = read_report(&report);
    let _ = std::fs::remove_file(&report);
    let message = kept
        .lock()
        .map(|k| k.iter().cloned().collect::<Vec<_>>().join("\n"))
        .unwrap_or_default();
    let skip = message.chars().count().saturating_sub(MAX_RUN_MESSAGE);
    let host = children_peak_rss();
    let gpu_peak = peaks.values().map(|p| p.used).max();
    let gpu_total = peaks.values().map(|p| p.total).min();
    let process = peaks
        .values()
        .filter_map(|p| p.processes.get(&pid).copied())
        .max();
    Ok(ObservedRun {
        schema_version: OBSERVED_SCHEMA_VERSION,
        command: command.to_vec(),
        seconds: started.elapsed().as_secs_f64(),
        exit_code: status.code(),
        signal: status.signal(),
        message: message.chars().skip(skip).collect(),
        pod: PodObservation {
            namespace: "local".into(),
            name: "run".into(),
            training_job: None,
            gpus: peaks.keys().map(u32::to_string).collect(),
            #[allow(clippy::cast_precision_loss)]
            gpu_busy: if samples == 0 {
                0.0
            } else {
                busy as f64 / (100.0 * f64::from(samples))
            },
            samples: samples.max(1),
            cpu_cores: None,
            gpu_memory_peak_bytes: gpu_peak.filter(|_| gpu_total.is_some()),
            gpu_memory_total_bytes: gpu_total.filter(|_| gpu_peak.is_some()),
            process_gpu_memory_peak_bytes: process,
            host_memory_peak_bytes: host,
            host_memory_source: host.map(|_| HostMemorySource::ProcessPeakRss),
            allocator_peak_bytes: reported.map(|r| r.allocated),
            step_seconds: reported.and_then(|r| r.step_seconds),
        },
        configuration: run_configuration(std::env::vars()),
    })
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::utilization::MemorySample;

    /// A recorded GPU (a stand-in for one that is not here): busy 50 %, memory climbing by 1 GiB
    /// a sample up to 10 GiB of 80.
    struct Recorded(Cell<u64>);

    impl UtilizationSource for Recorded {
        fn utilization(&self, _: &[u32]) -> Result<Vec<(u32, u32)>, String> {
            Ok(vec![(0, 50)])
        }
        fn memory(&self, _: &[u32]) -> Result<Vec<MemorySample>, String> {
            let n = (self.0.get() + 1).min(10);
            self.0.set(n);
            Ok(vec![MemorySample {
                index: 0,
                used: n << 30,
                total: 80 << 30,
                processes: Vec::new(),
            }])
        }
    }

    #[test]
    fn a_run_is_observed_to_its_end_with_its_exit_peaks_and_last_lines() {
        let gpu = Recorded(Cell::new(0));
        let cmd = ["sh", "-c", "x=$(head -c 64000000 /dev/zero | tr '\\0' a); for i in 1 2 3; do echo line $i; sleep 0.05; done; echo 'torch.OutOfMemoryError: CUDA out of memory.' >&2; exit 3"]
            .map(String::from);
        let run = observe_command(&gpu, &[], Duration::from_millis(5), &cmd).unwrap();
        assert_eq!(run.exit_code, Some(3));
        assert!(
            run.message.contains("line 3") && run.message.ends_with("CUDA out of memory."),
            "{}",
            run.message
        );
        assert!(run.pod.gpu_memory_peak_bytes.unwrap() >= 2 << 30);
        assert_eq!(run.pod.gpu_memory_total_bytes, Some(80 << 30));
        assert!((run.pod.gpu_busy - 0.5).abs() < 1e-9);
        // The shell holds the 64 MB it reads: the host peak sees it.
        assert!(
            run.pod.host_memory_peak_bytes.unwrap() >= 60_000_000,
            "{:?}",
            run.pod
        );
        // What it writes, the operator reads back.
        let json = serde_json::to_string(&run).unwrap();
        assert_eq!(ObservedRun::parse(&json).unwrap(), run);
        assert!(observe_command(&gpu, &[], Duration::ZERO, &[]).is_err());
        assert!(observe_command(&gpu, &[], Duration::ZERO, &["/no/such".into()]).is_err());
    }

    /// What the command's processes reported at exit (the operator's reporter, two ranks here,
    /// written by a shell in its place) is read into the run: the highest allocation, the
    /// slowest rank's step.
    #[test]
    fn a_run_carries_what_its_processes_reported() {
        let gpu = Recorded(Cell::new(0));
        let cmd = [
            "sh",
            "-c",
            "echo 'offload.dev/allocator rank=0 allocated=1000 reserved=2000 step_ms=1500.0 steps=9' >>\"$OFFLOAD_MEMORY_REPORT\"; \
             echo 'offload.dev/allocator rank=1 allocated=3000 reserved=2500 step_ms=1600.0 steps=9' >>\"$OFFLOAD_MEMORY_REPORT\"",
        ]
        .map(String::from);
        let run = observe_command(&gpu, &[], Duration::from_millis(5), &cmd).unwrap();
        assert_eq!(run.exit_code, Some(0));
        assert_eq!(run.pod.allocator_peak_bytes, Some(3000));
        assert_eq!(run.pod.step_seconds, Some(1.6));
        let silent = ["true"].map(String::from);
        let run = observe_command(&gpu, &[], Duration::from_millis(5), &silent).unwrap();
        assert_eq!(
            (run.pod.allocator_peak_bytes, run.pod.step_seconds),
            (None, None)
        );
    }
}

/// The offload configuration a run was given, from the environment it inherits: the variables
/// the operator renders that say which configuration ran, each cut to what a record keeps.
fn run_configuration(
    vars: impl Iterator<Item = (String, String)>,
) -> std::collections::BTreeMap<String, String> {
    use offload_api::observed::{MAX_CONFIGURATION_VALUE, RUN_CONFIGURATION_KEYS};
    vars.filter(|(k, _)| RUN_CONFIGURATION_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k, v.chars().take(MAX_CONFIGURATION_VALUE).collect()))
        .collect()
}

#[cfg(test)]
mod configuration_tests {
    use super::run_configuration;

    #[test]
    fn a_run_records_only_the_rendered_offload_variables_and_cuts_long_values() {
        let vars = [
            ("OFFLOAD_MODE", "cpu-copy".to_string()),
            ("OFFLOAD_RATIO", "0.78".to_string()),
            (
                "OFFLOAD_CONFIG_FILE",
                "/etc/offload/ds_config.json".to_string(),
            ),
            ("PATH", "/usr/bin".to_string()),
            ("OFFLOAD_PROFILE", "p".repeat(200)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v));
        let c = run_configuration(vars);
        assert_eq!(c.len(), 3, "{c:?}");
        assert_eq!(c["OFFLOAD_MODE"], "cpu-copy");
        assert_eq!(c["OFFLOAD_RATIO"], "0.78");
        assert_eq!(c["OFFLOAD_PROFILE"].chars().count(), 64);
    }
}
