//! `offload-agent`: the node agent. Reads NVML, classifies the node's memory model, runs the
//! overlap self-test and publishes labels and a report on its own Node.

// Functions fit on a screen (clippy.toml has the threshold).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unwrap or expect outside tests (clippy.toml allows them there) and start-up, where each
// is allowed by name.
#![warn(clippy::unwrap_used, clippy::expect_used)]

use offload_agent::{assemble, daemon, probe};

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use offload_agent::probe::RealNvml;
use offload_agent::selftest::SelfTestOptions;

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print what NVML says about this node (no cluster access, no self-test).
    Probe,
    /// Run the overlap self-test and print the report (no cluster access). Postponed when the
    /// GPUs are in use, unless --force.
    Selftest {
        #[command(flatten)]
        test: TestArgs,
        /// Measure even when a process uses the GPUs (it disturbs that job).
        #[arg(long)]
        force: bool,
    },
    /// Publish labels and the report on this node, re-run on an interval and on demand.
    Run(RunArgs),
    /// Measure how busy the GPUs are over a window (GPM activity counters where the GPUs have
    /// them, else NVML's utilization sampled) and print each GPU's busy fraction and memory (no
    /// cluster access). With a COMMAND after `--`: run it and observe its GPUs for its whole
    /// life, and print the run (its GPU and host memory peaks, how it ended, its last output
    /// lines) for `offload-operator explain --observed`.
    Observe {
        /// Window, seconds.
        #[arg(long, default_value_t = 8.0)]
        seconds: f64,
        /// Sampling interval, milliseconds.
        #[arg(long, default_value_t = 100)]
        interval_ms: u64,
        /// GPU indices (all when none).
        #[arg(long = "gpu")]
        gpus: Vec<u32>,
        /// Sample NVML's utilization even where GPM activity counters exist.
        #[arg(long)]
        sampled: bool,
        /// Write the JSON here instead of standard output.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// The command to run and observe (its output goes to standard error).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// The start-up guard of a configured training pod (its init container): check, inside the
    /// pod's GPU allocation, that the node is what the configuration assumes; exit 1 with what
    /// to do when it is not (the message also goes to /dev/termination-log).
    Verify(VerifyArgs),
    /// Remove this agent's labels and report from the node (uninstall).
    Cleanup {
        /// This node's name (from the downward API).
        #[arg(long, env = "NODE_NAME", required_unless_present = "all_nodes")]
        node_name: Option<String>,
        /// Clean every node (the chart's uninstall hook).
        #[arg(long, conflicts_with = "node_name")]
        all_nodes: bool,
    },
}

#[derive(Args, Clone)]
struct TestArgs {
    /// Efficiency at or above which overlap is verified.
    #[arg(long, env = "OFFLOAD_OVERLAP_THRESHOLD", default_value_t = 0.8)]
    threshold: f64,
    /// How far past the threshold a new median must be to change a published verdict.
    #[arg(long, default_value_t = offload_agent::selftest::math::DEFAULT_MARGIN)]
    margin: f64,
    /// Number of chunks (layers of the step).
    #[arg(long, default_value_t = 16)]
    chunks: u32,
    /// Milliseconds of CPU update (and GPU work) per chunk; sizes the chunks from the measured
    /// Adam rate.
    #[arg(long, default_value_t = 4.5)]
    chunk_ms: f64,
    /// Millions (Mi) of fp32 elements per chunk, overriding --chunk-ms.
    #[arg(long)]
    chunk_mi: Option<usize>,
    /// Timed repetitions (the median is kept, the spread reported).
    #[arg(long, default_value_t = 5)]
    repeats: u32,
    /// Measure with pageable host memory.
    #[arg(long)]
    force_pageable: bool,
    /// Measure the serial schedule in place of the pipelined one.
    #[arg(long)]
    force_serial: bool,
    /// Give this GPU's test one CPU core (shows that a starved CPU update fails).
    #[arg(long)]
    starve_gpu: Option<usize>,
}

impl TestArgs {
    fn options(&self) -> SelfTestOptions {
        SelfTestOptions {
            threshold: self.threshold,
            margin: self.margin,
            chunks: self.chunks,
            chunk_ms: self.chunk_ms,
            chunk_elems: self.chunk_mi.map(|m| m << 20),
            repeats: self.repeats,
            force_pageable: self.force_pageable,
            force_serial: self.force_serial,
            coherent: false,
            starve_gpu: self.starve_gpu,
        }
    }
}

#[derive(Args, Clone)]
struct VerifyArgs {
    /// The configured offload mode (the pod's OFFLOAD_MODE).
    #[arg(long, env = "OFFLOAD_MODE", value_parser = ["unified-memory", "cpu-copy", "disabled"])]
    mode: String,
    /// The node class the decision placed the pod on.
    #[arg(long, value_parser = ["coherent", "discrete"])]
    node_class: Option<String>,
    /// Whether the configuration pins host memory (the pod's OFFLOAD_PIN_MEMORY, 1 or 0).
    #[arg(long, env = "OFFLOAD_PIN_MEMORY", default_value = "0", value_parser = ["0", "1"])]
    pin_memory: String,
    /// This node's name (from the downward API), for the message.
    #[arg(long, env = "NODE_NAME", default_value = "this node")]
    node_name: String,
    /// Where Kubernetes reads a failed container's message from.
    #[arg(long, default_value = "/dev/termination-log")]
    termination_log: std::path::PathBuf,
    /// The CPU cores the decision counted on (the training container's CPU limit); the guard
    /// runs with the same limit and checks its cgroup gives them.
    #[arg(long)]
    cpu_cores: Option<f64>,
    /// The pod asked for whole cores of its own near its GPUs: warn where its cpuset is not
    /// its own or not local to its GPUs.
    #[arg(long)]
    whole_cores: bool,
    /// Where this container's cgroup is mounted.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    cgroup_root: std::path::PathBuf,
}

#[derive(Args, Clone)]
struct RunArgs {
    /// This node's name (from the downward API).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Re-run interval.
    #[arg(long, default_value = "6h", value_parser = parse_interval)]
    interval: Duration,
    /// Address of /metrics, /healthz and POST /rerun.
    #[arg(long, env = "OFFLOAD_AGENT_ADDR", default_value = "0.0.0.0:8081")]
    addr: SocketAddr,
    /// Skip the GPU self-test (labels overlap as untested).
    #[arg(long)]
    no_selftest: bool,
    /// Publish this recorded node report instead of reading the node: a stand-in for hardware
    /// that is not here (simulated nodes in the local demo).
    #[arg(long)]
    replay: Option<std::path::PathBuf>,
    /// Publish once and exit.
    #[arg(long)]
    once: bool,
    /// Observe the GPUs of configured pods in windows of this length and publish a summary
    /// per window on the node (`offload.dev/observed`); 0 turns it off.
    #[arg(long, default_value = "0s", value_parser = parse_window)]
    observe_window: Duration,
    /// The DRA driver whose devices the kubelet lists for pods count as GPUs (NVIDIA's
    /// `gpu-<minor>` devices); empty: only `nvidia.com/gpu` device-plugin GPUs.
    #[arg(long, default_value = offload_agent::devices::DRA_DRIVER)]
    dra_driver: String,
    /// The kubelet's pod-resources socket (which pod holds which GPU).
    #[arg(long, default_value = offload_agent::attribution::POD_RESOURCES_SOCKET)]
    pod_resources_socket: std::path::PathBuf,
    /// The host's cgroup root as mounted in this container (pods' CPU usage).
    #[arg(long, default_value = "/sys/fs/cgroup")]
    cgroup_root: std::path::PathBuf,
    /// Replay this recorded NVML utilization trace instead of reading NVML while observing: a
    /// stand-in for GPUs that are not here (the local real node).
    #[arg(long)]
    observe_trace: Option<std::path::PathBuf>,
    #[command(flatten)]
    test: TestArgs,
}

/// The self-test's re-run interval: a second to thirty days.
fn parse_interval(s: &str) -> Result<Duration, String> {
    offload_api::duration::parse_bounded(
        s,
        Duration::from_secs(1),
        Duration::from_secs(30 * 86_400),
    )
}

/// An observation window: 0 turns observation off, else a second to an hour.
fn parse_window(s: &str) -> Result<Duration, String> {
    let d = offload_api::duration::parse_bounded(s, Duration::ZERO, Duration::from_secs(3600))?;
    if !d.is_zero() && d < Duration::from_secs(1) {
        return Err(format!("{s:?}: a window is 0 (off) or at least 1s"));
    }
    Ok(d)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run(_)) {
        offload_process::quiet_on_closed_pipe();
    }
    match cli.command {
        Command::Probe => {
            let reading = probe::NvmlSource::read(&RealNvml);
            let report = assemble::assemble(
                &hostname(),
                reading,
                offload_api::report::SelfTestReport::untested(0.8, "not run (probe)"),
            );
            print_json(&report, true)
        }
        Command::Selftest { test, force } => {
            let report = assemble::build(
                &hostname(),
                &RealNvml,
                &test.options(),
                assemble::SelfTestRun {
                    enabled: true,
                    force,
                    previous: None,
                },
            );
            print_json(&report, true)
        }
        Command::Run(args) => run(&args),
        Command::Verify(args) => verify(&args),
        Command::Observe {
            seconds,
            interval_ms,
            gpus,
            sampled,
            out,
            command,
        } => observe(seconds, interval_ms, &gpus, sampled, out, &command),
        Command::Cleanup { node_name, .. } => {
            with_client(
                |client, _| async move { daemon::cleanup(&client, node_name.as_deref()).await },
            )
        }
    }
}

/// `run`: the node's daemon loop (report, self-test, observation) until shut down.
fn run(args: &RunArgs) -> ExitCode {
    let recorded = match &args.observe_trace {
        Some(path) => match offload_agent::utilization::RecordedUtilization::read(path) {
            Ok(t) => Some(std::sync::Arc::new(t)),
            Err(e) => return failure(e),
        },
        None => None,
    };
    let cfg = daemon::LoopConfig {
        node: args.node_name.clone(),
        interval: args.interval,
        addr: args.addr,
        selftest: !args.no_selftest,
        options: args.test.options(),
        replay: args.replay.clone(),
        once: args.once,
        observe: (!args.observe_window.is_zero()).then(|| daemon::ObserveConfig {
            window: args.observe_window,
            pod_resources: args.pod_resources_socket.clone(),
            cgroup_root: args.cgroup_root.clone(),
            dra_driver: Some(args.dra_driver.clone()).filter(|d| !d.is_empty()),
            recorded,
        }),
    };
    with_client(|client, shutdown| daemon::run_loop(client, cfg, shutdown))
}

/// `observe`: the GPUs over a window, or beside a command it runs, as JSON (to `out` if given).
fn observe(
    seconds: f64,
    interval_ms: u64,
    gpus: &[u32],
    sampled: bool,
    out: Option<std::path::PathBuf>,
    command: &[String],
) -> ExitCode {
    use offload_agent::utilization::{NvmlUtilization, UtilizationSource};
    let source = if sampled || !command.is_empty() {
        NvmlUtilization::sampling_only()
    } else {
        NvmlUtilization::new()
    };
    let source = match source {
        Ok(s) => s,
        Err(e) => return failure(e),
    };
    let interval = Duration::from_millis(interval_ms.max(1));
    let json = if command.is_empty() {
        source
            .over_window(
                gpus,
                Duration::from_secs_f64(seconds.clamp(0.0, 3600.0)),
                interval,
            )
            .and_then(|o| serde_json::to_string_pretty(&o).map_err(|e| e.to_string()))
    } else {
        offload_agent::observe_run::observe_command(&source, gpus, interval, command)
            .and_then(|o| serde_json::to_string_pretty(&o).map_err(|e| e.to_string()))
    };
    match (json, out) {
        (Err(e), _) => failure(e),
        (Ok(j), None) => {
            println!("{j}");
            ExitCode::SUCCESS
        }
        (Ok(j), Some(path)) => match std::fs::write(&path, j + "\n") {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failure(format!("cannot write {}: {e}", path.display())),
        },
    }
}

/// Runs `work` with a client from the kubeconfig or service account, until it ends or SIGTERM
/// (or Ctrl-C) asks it to stop; prints what went wrong.
fn with_client<F, Fut>(work: F) -> ExitCode
where
    F: FnOnce(kube::Client, CancellationToken) -> Fut,
    Fut: std::future::Future<Output = Result<(), daemon::AgentError>>,
{
    offload_process::runtime(2).block_on(async move {
        let client = match kube::Client::try_default().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: no usable kubeconfig or in-cluster service account: {e}");
                return ExitCode::FAILURE;
            }
        };
        let outcome = work(client, offload_process::shutdown_on_signal()).await;
        match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failure(e),
        }
    })
}

fn verify(args: &VerifyArgs) -> ExitCode {
    use offload_agent::verify::{Expected, PIN_PROBE_BYTES};
    use offload_api::v1alpha1::{NodeClass, OffloadMode};
    let expected = Expected {
        mode: match args.mode.as_str() {
            "unified-memory" => OffloadMode::UnifiedMemory,
            "cpu-copy" => OffloadMode::CpuCopy,
            _ => OffloadMode::Disabled,
        },
        node_class: args.node_class.as_deref().map(|c| {
            if c == "coherent" {
                NodeClass::Coherent
            } else {
                NodeClass::Discrete
            }
        }),
        pin_memory: args.pin_memory == "1",
        node: args.node_name.clone(),
        cpu_cores: args.cpu_cores.filter(|c| c.is_finite() && *c > 0.0),
        whole_cores: args.whole_cores,
    };
    let cpu = offload_agent::verify::CpuSeen::read(&args.cgroup_root);
    let pin = || offload_agent::selftest::pin_probe(0, PIN_PROBE_BYTES).map_err(|e| e.to_string());
    match offload_agent::verify::verify(&RealNvml, &expected, &pin, &cpu) {
        Ok(ok) => {
            for w in &ok.warnings {
                eprintln!("offload-verify: warning: {w}");
            }
            println!("offload-verify: {}", ok.summary);
            ExitCode::SUCCESS
        }
        Err(mismatch) => {
            let msg = format!("offload-verify: {mismatch}");
            eprintln!("{msg}");
            // Best effort: outside a pod the file may not exist.
            let _ = std::fs::write(&args.termination_log, &msg);
            ExitCode::FAILURE
        }
    }
}

fn hostname() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// Prints `value` as JSON (indented, or on one line for a JSON-lines consumer).
fn print_json(value: &impl serde::Serialize, pretty: bool) -> ExitCode {
    let text = if pretty {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    };
    match text {
        Ok(s) => {
            println!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => failure(e),
    }
}

/// Says what failed on standard error; the process's failure.
fn failure(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}
