//! `offload-bench`: benchmarks that print figures (never pass/fail). Each subcommand is a module:
//!
//! - `control-plane`: start-up time of the local control plane and each process's memory;
//! - `controller`: TrainingJobs created in a burst, creation → workload latency, the operator's
//!   CPU time and peak RSS;
//! - `webhook`: pod mutation over TLS at increasing concurrency, beside a minimal peer webhook;
//!   real pod creation with and without the webhook, side by side;
//! - `admission`: the admission handlers in process, by cluster size;
//! - `scale`: thousands of simulated GPU nodes, TrainingJobs and opted-in batch Jobs in one
//!   burst: time to resolve every job, jobs/s, webhook latency, the operator's CPU, memory and
//!   API requests per job;
//! - `kueue`: a burst of TrainingJobs without Kueue and one in a Kueue queue, on a real node
//!   that runs Kueue: creation → admitted and → running;
//! - `memory`: the memory model beside the peaks the GPU harness measured;
//! - `sizer`: the sizer's wall time and peak memory on this machine, per model;
//! - `sizer-wait`: how much later a TrainingJob's workload is created when its model is traced
//!   first (the first job of a step, and the later ones);
//! - `noop-operator` (hidden): the peer `scale --peer noop` runs instead of the operator.

// Functions fit on a screen (clippy.toml has the threshold).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unwrap or expect outside tests (clippy.toml allows them there) and start-up, where each
// is allowed by name.
#![warn(clippy::unwrap_used, clippy::expect_used)]

/// The operator's allocator, so that the in-process figures are the operator's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod admission;
mod closed_loop;
mod cluster;
mod control_plane;
mod controller;
mod error;
mod kueue;
mod measure;
mod memory;
mod noop;
mod scale;
mod sizer;
mod sizer_wait;
mod webhook;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Benchmarks of offload-operator; each prints its figures as Markdown.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start-up time of the local control plane and each process's memory.
    ControlPlane {
        /// Start-ups of etcd + kube-apiserver to time.
        #[arg(long, default_value_t = 3)]
        runs: u32,
    },
    /// TrainingJobs created in a burst: time to workload, the operator's CPU and memory.
    Controller {
        /// TrainingJobs in the burst.
        #[arg(long, default_value_t = 1000)]
        jobs: usize,
    },
    /// The webhook under load over TLS, and real pod creation with and without it.
    Webhook {
        /// Seconds per concurrency level.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Pods of each kind created through the kube client.
        #[arg(long, default_value_t = 500)]
        pods: usize,
        /// Concurrent kube clients.
        #[arg(long, default_value_t = 10)]
        clients: usize,
        /// Pods of each kind created with `kubectl create`.
        #[arg(long, default_value_t = 40)]
        kubectl_pods: usize,
    },
    /// The admission handlers in process, by cluster size.
    Admission {
        /// Reported nodes per row.
        #[arg(long, value_delimiter = ',', default_value = "16,256,2048")]
        nodes: Vec<usize>,
        /// Requests per cell.
        #[arg(long, default_value_t = 2000)]
        iterations: u32,
    },
    /// Thousands of simulated GPU nodes and a burst of TrainingJobs and opted-in batch Jobs.
    Scale {
        /// Simulated GPU nodes (a third each coherent, HMM and discrete).
        #[arg(long, default_value_t = 2000)]
        nodes: usize,
        /// TrainingJobs in the burst.
        #[arg(long, default_value_t = 5000)]
        jobs: usize,
        /// Opted-in batch Jobs created through the webhook during the burst.
        #[arg(long, default_value_t = 5000)]
        batch_jobs: usize,
        /// Run the burst against `noop`: a peer that makes the operator's API requests per job
        /// and answers admissions without deciding anything (what the control plane costs).
        #[arg(long)]
        peer: Option<scale::Peer>,
    },
    /// What the closed loop costs: observations from thousands of simulated GPU nodes, learned
    /// by the release operator.
    ClosedLoop {
        /// Simulated GPU nodes, one TrainingJob on each.
        #[arg(long, default_value_t = 2000)]
        nodes: usize,
        /// Rounds of observations (one window from every node each).
        #[arg(long, default_value_t = 2)]
        rounds: u64,
    },
    /// A burst of TrainingJobs without Kueue, then one in a Kueue queue (needs root).
    Kueue {
        /// TrainingJobs in each burst.
        #[arg(long, default_value_t = 500)]
        jobs: usize,
    },
    /// The memory model beside the peaks `hack/gpu/hf-bench.sh` measured (offline).
    Memory {
        /// The harness's `memory.jsonl` files.
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Where the models' `config.json` files are.
        #[arg(long, default_value = "hack/gpu/models")]
        models: PathBuf,
        /// A folder of the sizer's traces (`NAME-MICROxSEQ.json`): each run's traced estimate
        /// beside the counted one.
        #[arg(long)]
        traces: Option<PathBuf>,
        /// GPU memory of the node (NVML's total; the H200's by default).
        #[arg(long, default_value_t = 150_754_820_096)]
        gpu_bytes: u64,
        /// Host memory a pod can have (125 GiB by default).
        #[arg(long, default_value_t = 125 << 30)]
        host_bytes: u64,
    },
    /// The sizer's wall time and peak memory on this machine, per model (needs a Python with
    /// torch and transformers: `hack/sizer/python.sh` makes one).
    Sizer {
        /// The Python to run the sizer with.
        #[arg(long, env = "OFFLOAD_SIZER_PYTHON", default_value = "python3")]
        python: String,
        /// Runs of each model.
        #[arg(long, default_value_t = 3)]
        runs: u32,
        /// `CONFIG.json:MICROxSEQ`, one per model.
        #[arg(required = true)]
        cases: Vec<sizer::Case>,
    },
    /// How much later a TrainingJob's workload is created when its model is traced first
    /// (kwok stands in for the sizer's process).
    SizerWait {
        /// TrainingJobs of one step, one after another, each way.
        #[arg(long, default_value_t = 10)]
        jobs: usize,
    },
    /// The no-op operator (started by `scale --peer noop` as its own process).
    #[command(hide = true)]
    NoopOperator {
        /// Where the webhook listens (TLS, the operator's managed certificates).
        #[arg(long)]
        webhook_addr: std::net::SocketAddr,
        /// Where `/readyz` and `/metrics` are served.
        #[arg(long)]
        admin_addr: std::net::SocketAddr,
        /// Namespace of the certificates' Secret.
        #[arg(long, default_value = "offload-system")]
        namespace: String,
    },
    /// The minimal peer webhook (started by `webhook` as its own process).
    #[command(hide = true)]
    PeerWebhook {
        /// Directory with tls.crt, tls.key and patch.
        dir: PathBuf,
        /// Port to listen on.
        port: u16,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Figures on stdout: `offload-bench … | head` ends it quietly.
    offload_process::quiet_on_closed_pipe();
    #[allow(clippy::expect_used)] // start-up
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("start-up: tokio runtime");
    let result = match cli.command {
        Command::ControlPlane { runs } => rt.block_on(control_plane::run(runs)),
        Command::Controller { jobs } => rt.block_on(controller::run(jobs)),
        Command::ClosedLoop { nodes, rounds } => rt.block_on(closed_loop::run(nodes, rounds)),
        Command::Webhook {
            seconds,
            pods,
            clients,
            kubectl_pods,
        } => rt.block_on(webhook::run(seconds, pods, clients, kubectl_pods)),
        Command::Scale {
            nodes,
            jobs,
            batch_jobs,
            peer,
        } => rt.block_on(scale::run(
            scale::Sizes {
                nodes,
                jobs,
                batch_jobs,
            },
            peer,
        )),
        Command::NoopOperator {
            webhook_addr,
            admin_addr,
            namespace,
        } => rt.block_on(noop::run(webhook_addr, admin_addr, namespace)),
        Command::Kueue { jobs } => rt.block_on(kueue::run(jobs)),
        Command::SizerWait { jobs } => rt.block_on(sizer_wait::run(jobs)),
        Command::Admission { nodes, iterations } => admission::run(&nodes, iterations),
        Command::Sizer {
            python,
            runs,
            cases,
        } => sizer::run(&python, std::path::Path::new("."), &cases, runs),
        Command::Memory {
            runs,
            models,
            traces,
            gpu_bytes,
            host_bytes,
        } => memory::run(
            &runs,
            &models,
            traces.as_deref(),
            &memory::Node {
                gpu_bytes,
                host_bytes,
            },
        ),
        Command::PeerWebhook { dir, port } => rt.block_on(webhook::peer_webhook(dir, port)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
