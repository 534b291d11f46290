//! `offload-operator`: the operator binary (controller and admission webhook).

// Functions fit on a screen (clippy.toml has the threshold).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unwrap or expect outside tests (clippy.toml allows them there) and start-up, where each
// is allowed by name.
#![warn(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use offload_api::names;
use offload_operator::controller::ControllerOptions;
use offload_operator::operator::{self, LeaderElection, RunOptions};
use offload_operator::webhook::tls::{FileCerts, ManagedCerts};
use offload_operator::webhook::{CertMode, WebhookOptions};
use std::time::Duration;

mod args;
use args::{parse_cpu, parse_memory, parse_seconds, parse_sizer_timeout};

/// mimalloc, not the system allocator: the admission path allocates and frees many small JSON
/// values per request, and glibc's malloc took a third of its time (docs/benchmarks/scale.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The offload operator: controller and admission webhook.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CRDs as YAML, or write them into a directory (one file per CRD).
    Crd {
        /// Directory to write `<plural>.<group>.yaml` files into instead of printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Run the operator against the cluster of the current kubeconfig or service account.
    Run(Box<RunArgs>),
    /// Check an installation (what `helm test` runs): the CRDs are served, the named profile
    /// exists, and the admission webhooks answer (a server-side dry-run create of a
    /// TrainingJob goes through them; nothing is stored).
    Check {
        /// OffloadProfile that must exist (empty: none required).
        #[arg(long, default_value = names::DEFAULT_PROFILE)]
        profile: String,
        /// Namespace of the dry-run TrainingJob.
        #[arg(long, default_value = "default")]
        namespace: String,
    },
    /// Show what the operator would decide and write for a TrainingJob, Pod, Job, JobSet,
    /// PyTorchJob or TrainJob manifest, with every reason, without changing anything. Node
    /// reports and profiles come from files, or from the current cluster when no report file
    /// is given.
    Explain(Box<ExplainArgs>),
    /// Remove what the operator made at run time and a chart does not own (the managed webhook
    /// certificate Secret, the leader Lease): the chart's uninstall hook runs it.
    Cleanup {
        /// The operator's namespace.
        #[arg(long, env = "POD_NAMESPACE", default_value = "offload-system")]
        namespace: String,
        /// Secret holding the operator-managed CA and serving certificate.
        #[arg(long, default_value = names::WEBHOOK_SECRET)]
        webhook_secret: String,
        /// Name of the leader Lease.
        #[arg(long, default_value = "offload-operator-leader")]
        lease_name: String,
        /// The operator Deployment, scaled to zero (and its pods waited for) first, so that no
        /// running replica re-creates the Lease or the Secret after they are deleted. Empty: none.
        #[arg(long, default_value = "offload-operator")]
        deployment: String,
        /// Label selector of the operator's pods.
        #[arg(
            long,
            default_value = "app.kubernetes.io/name=offload-operator,app.kubernetes.io/component=operator"
        )]
        selector: String,
    },
}

#[derive(clap::Args)]
struct ExplainArgs {
    /// Manifest file (YAML or JSON, several documents allowed); `-` reads stdin.
    #[arg(short = 'f', long = "filename")]
    file: PathBuf,
    /// A recorded node report (`[NAME=]PATH`, the agent's JSON); repeat for several nodes.
    /// Without any, nodes, profiles and ConfigMaps are read from the current cluster.
    #[arg(long = "node-report")]
    node_reports: Vec<String>,
    /// A node's allocatable memory (`NAME=QUANTITY`, e.g. `h200=125Gi`; offline), which bounds
    /// what offload can put on the host.
    #[arg(long = "node-memory")]
    node_memory: Vec<String>,
    /// A node's allocatable CPUs (`NAME=QUANTITY`, e.g. `h200=16` or `h200=15500m`; offline):
    /// a pod without a CPU limit shares them with the job's other pods on the node, and a
    /// report without the self-test's thread count is read as measured with all of them.
    #[arg(long = "node-cpus")]
    node_cpus: Vec<String>,
    /// An OffloadProfile manifest (offline; the built-in `default` profile when none).
    #[arg(long = "profile")]
    profiles: Vec<PathBuf>,
    /// The DeepSpeed JSON of a ConfigMap the job references (`CONFIGMAP=PATH`, offline).
    #[arg(long = "deepspeed-config")]
    deepspeed_configs: Vec<String>,
    /// The `config.json` of a model ConfigMap the job references (`CONFIGMAP=PATH`, offline).
    #[arg(long = "model-config")]
    model_configs: Vec<String>,
    /// A trace of the job's model by the sizer (`offload_sizer.py`'s JSON, as a node report is
    /// given); repeat for several jobs. A trace made for another step is not used, and the
    /// reasons say why.
    #[arg(long = "trace-file")]
    trace_files: Vec<PathBuf>,
    /// Trace each job's model here before deciding: the sizer this release ships, run with a
    /// Python that has torch and transformers (`--python`).
    #[arg(long)]
    trace: bool,
    /// The Python `--trace` runs the sizer with.
    #[arg(long, env = "OFFLOAD_SIZER_PYTHON", default_value = "python3")]
    python: String,
    /// ResourceClaimTemplates the job's DRA claims name (manifest files, offline).
    #[arg(long = "claim-template")]
    claim_templates: Vec<PathBuf>,
    /// The GPU driver's ResourceSlices (manifest files, offline): its word on each node.
    #[arg(long = "resource-slices")]
    resource_slices: Vec<PathBuf>,
    /// A run of the job as the agent observed it (`offload-agent observe -- COMMAND`'s JSON, or
    /// a node's `offload.dev/observed` summary); repeat for several runs, in order. The decision
    /// shown is the one the operator makes after them: what each run used is learned, and a run
    /// that ran out of memory is recorded as the controller records it.
    #[arg(long = "observed")]
    observed: Vec<PathBuf>,
    /// The agent image, to show the start-up guard as the operator would add it.
    #[arg(long, env = "OFFLOAD_AGENT_IMAGE")]
    agent_image: Option<String>,
    /// Also render every alternative for a DeepSpeed job (each knob flipped on its own).
    #[arg(long)]
    candidates: bool,
    /// Output format.
    #[arg(short = 'o', long, default_value = "text", value_parser = ["text", "json"])]
    output: String,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "OFFLOAD_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    admin_addr: SocketAddr,
    /// Run the controllers only while holding a Lease (for more than one replica).
    #[arg(long, env = "OFFLOAD_LEADER_ELECTION", default_value_t = false)]
    leader_election: bool,
    /// Namespace of the leader Lease (defaults to the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "offload-system")]
    namespace: String,
    /// Name of the leader Lease.
    #[arg(long, default_value = "offload-operator-leader")]
    lease_name: String,
    /// How long the leader's lease lasts without renewal (a standby takes over within it).
    #[arg(long, default_value = "15s", value_parser = parse_seconds)]
    lease_duration: Duration,
    /// This replica's identity in the election.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Concurrent reconciles per controller.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
    /// Address of the admission webhook (HTTPS); empty to not serve it.
    #[arg(long, env = "OFFLOAD_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    webhook_addr: String,
    /// Read the serving certificate from this directory (tls.crt, tls.key; e.g. from
    /// cert-manager) instead of managing a CA.
    #[arg(long, env = "OFFLOAD_WEBHOOK_CERT_DIR")]
    webhook_cert_dir: Option<PathBuf>,
    /// Secret holding the operator-managed CA and serving certificate.
    #[arg(long, default_value = names::WEBHOOK_SECRET)]
    webhook_secret: String,
    /// Names for the serving certificate (the webhook Service's DNS names, or an IP address).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "offload-operator-webhook.offload-system.svc"
    )]
    webhook_names: Vec<String>,
    /// MutatingWebhookConfiguration to patch the CA bundle into.
    #[arg(long, default_value = names::WEBHOOK_CONFIGURATION)]
    mutating_webhook_config: String,
    /// ValidatingWebhookConfiguration to patch the CA bundle into.
    #[arg(long, default_value = names::WEBHOOK_CONFIGURATION)]
    validating_webhook_config: String,
    /// The agent image: configured pods that request GPUs get the start-up guard
    /// (`offload-agent verify`) as an init container from it. No guard when unset.
    #[arg(long, env = "OFFLOAD_AGENT_IMAGE")]
    agent_image: Option<String>,
    /// The DRA driver whose ResourceSlices describe the GPUs (a second witness of each node's
    /// memory model); empty to leave Dynamic Resource Allocation out.
    #[arg(long, env = "OFFLOAD_DRA_DRIVER", default_value = offload_operator::dra::DEFAULT_DRIVER)]
    dra_driver: String,
    /// DeviceClasses whose claims request the driver's whole GPUs (default: the driver's name).
    #[arg(long, value_delimiter = ',')]
    dra_gpu_device_classes: Vec<String>,
    /// Trace each TrainingJob's model from its own code before its pods exist (the sizer, as a
    /// short CPU Job in the job's namespace); off: the counted model decides alone.
    #[arg(long, env = "OFFLOAD_SIZER", default_value_t = true, action = clap::ArgAction::Set)]
    sizer: bool,
    /// The sizer image (pinned torch and transformers): where the job's own image cannot build
    /// the model, or is not to be used.
    #[arg(long, env = "OFFLOAD_SIZER_IMAGE")]
    sizer_image: Option<String>,
    /// Run the sizer from the job's own image first (its libraries build the model as the job
    /// will); its traces then hold for its namespace only.
    #[arg(long, env = "OFFLOAD_SIZER_JOB_IMAGE", default_value_t = true, action = clap::ArgAction::Set)]
    sizer_job_image: bool,
    /// How long a job waits for its trace before the counted model decides.
    #[arg(long, env = "OFFLOAD_SIZER_TIMEOUT", default_value = "300s", value_parser = parse_sizer_timeout)]
    sizer_timeout: Duration,
    /// CPU of the sizer's container (a Kubernetes quantity: `2`, `1500m`).
    #[arg(long, env = "OFFLOAD_SIZER_CPU", default_value = "2", value_parser = parse_cpu)]
    sizer_cpu: String,
    /// Memory of the sizer's container (a Kubernetes quantity: `4Gi`).
    #[arg(long, env = "OFFLOAD_SIZER_MEMORY", default_value = "4Gi", value_parser = parse_memory)]
    sizer_memory: String,
    /// The API server runs the `ExtendedResourceToleration` admission plugin (off by default):
    /// a pod that asks for `nvidia.com/gpu` then tolerates that resource's `NoSchedule` taint
    /// without its own toleration. Never assumed.
    #[arg(long, env = "OFFLOAD_EXTENDED_RESOURCE_TOLERATION", default_value_t = false, action = clap::ArgAction::Set)]
    extended_resource_toleration: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run(_)) {
        offload_process::quiet_on_closed_pipe();
    }
    if let Command::Crd { out_dir } = cli.command {
        return match write_crds(out_dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::FAILURE
            }
        };
    }
    // The process's one runtime, for every command that talks to a cluster.
    let workers = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let runtime = offload_process::runtime(workers);
    match cli.command {
        Command::Crd { .. } => ExitCode::SUCCESS,
        Command::Run(args) => run(&runtime, *args),
        Command::Check { profile, namespace } => check(&runtime, &profile, &namespace),
        Command::Explain(args) => explain(&runtime, &args),
        Command::Cleanup {
            namespace,
            webhook_secret,
            lease_name,
            deployment,
            selector,
        } => cleanup(
            &runtime,
            &offload_operator::ops::installation::Cleanup {
                namespace,
                secret: webhook_secret,
                lease: lease_name,
                deployment: (!deployment.is_empty()).then_some(deployment),
                selector,
            },
        ),
    }
}

/// A process-unique suffix for the leader identity: a restarted container must not believe
/// it still holds its predecessor's lease.
fn instance_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:08x}", nanos ^ std::process::id().rotate_left(16))
}

fn cleanup(
    runtime: &tokio::runtime::Runtime,
    what: &offload_operator::ops::installation::Cleanup,
) -> ExitCode {
    match runtime.block_on(offload_operator::ops::installation::remove_runtime_objects(
        what,
    )) {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn explain(runtime: &tokio::runtime::Runtime, args: &ExplainArgs) -> ExitCode {
    use offload_operator::explain;
    let manifests = match read_manifests(args) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let render = offload_operator::render::RenderOptions {
        guard_image: args.agent_image.clone().filter(|i| !i.is_empty()),
        ..Default::default()
    };
    let mut inputs = if args.node_reports.is_empty() {
        let loaded = runtime.block_on(async {
            let client = kube::Client::try_default().await?;
            explain::inputs_from_cluster(&client, &manifests, render).await
        });
        match loaded {
            Ok(i) => i,
            Err(e) => {
                eprintln!(
                    "error: reading nodes and profiles from the cluster: {e} (give --node-report files to explain offline)"
                );
                return ExitCode::FAILURE;
            }
        }
    } else {
        match offline_inputs(args, render) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    };
    if let Err(e) = with_traces(&mut inputs, args) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let mut runs = Vec::new();
    for path in &args.observed {
        // Bounded as the controller bounds an observation annotation.
        match offload_operator::explain::read_bounded(
            path,
            offload_api::observed::MAX_OBSERVED_BYTES,
        ) {
            Ok(text) => runs.push((path.display().to_string(), text)),
            Err(e) => {
                eprintln!("error: --observed {e}");
                return ExitCode::from(2);
            }
        }
    }
    let out = match explain_each(&manifests, &mut inputs, &runs, args.candidates) {
        Ok(out) => out,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = print_explanations(&out, &args.output) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    // An object the operator would refuse or hold is a failure for scripts and CI.
    if out.iter().any(explain::Explanation::refused) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The traces `--trace-file` gives, and the sizer `--trace` runs, in the inputs' view.
fn with_traces(
    inputs: &mut offload_operator::explain::Inputs,
    args: &ExplainArgs,
) -> Result<(), String> {
    for path in &args.trace_files {
        let text =
            offload_operator::explain::read_bounded(path, offload_api::trace::MAX_TRACE_BYTES)
                .map_err(|e| format!("--trace-file {e}"))?;
        inputs
            .view
            .traces
            .add(&text)
            .map_err(|e| format!("--trace-file {}: {e}", path.display()))?;
    }
    if args.trace {
        inputs.view.traces.sizer = Some(offload_operator::sizer::local::LocalSizer::new(
            &args.python,
            inputs.model_configs.values(),
        ));
    }
    Ok(())
}

/// Each manifest's explanation: with the runs given (`--observed`), the loop over what they
/// showed; without, the first decision.
fn explain_each(
    manifests: &[serde_json::Value],
    inputs: &mut offload_operator::explain::Inputs,
    runs: &[(String, String)],
    candidates: bool,
) -> Result<Vec<offload_operator::explain::Explanation>, String> {
    use offload_operator::explain;
    let mut out = Vec::new();
    for m in manifests {
        if runs.is_empty() {
            out.push(explain::explain(m, inputs, candidates).map_err(|e| e.to_string())?);
            continue;
        }
        let job = m
            .pointer("/metadata/name")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        let evidence = runs
            .iter()
            .map(|(source, text)| explain::read_evidence(source, text, job))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(explain::explain_observed(m, inputs, &evidence).map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// The explanations as JSON (one object for one manifest) or as text.
fn print_explanations(
    out: &[offload_operator::explain::Explanation],
    output: &str,
) -> Result<(), serde_json::Error> {
    if output == "json" {
        let s = if out.len() == 1 {
            serde_json::to_string_pretty(&out[0])?
        } else {
            serde_json::to_string_pretty(&out)?
        };
        println!("{s}");
    } else {
        for e in out {
            print!("{}", offload_operator::explain::to_text(e));
        }
    }
    Ok(())
}

/// The manifests to explain, from the file or standard input (`-`).
fn read_manifests(
    args: &ExplainArgs,
) -> Result<Vec<serde_json::Value>, offload_operator::explain::ExplainError> {
    use offload_operator::explain;
    let text = if args.file.as_os_str() == "-" {
        let mut s = String::new();
        match std::io::Read::read_to_string(&mut std::io::stdin(), &mut s) {
            Ok(_) => Ok(s),
            Err(e) => Err(e.to_string()),
        }
    } else {
        std::fs::read_to_string(&args.file).map_err(|e| format!("{}: {e}", args.file.display()))
    };
    text.map_err(explain::ExplainError::Manifest)
        .and_then(|t| explain::read_manifests(&t))
}

/// The cluster as the files on the command line describe it: node reports (with their memory
/// and the GPU driver's slices), profiles, claim templates and DeepSpeed configs.
fn offline_inputs(
    args: &ExplainArgs,
    render: offload_operator::render::RenderOptions,
) -> Result<offload_operator::explain::Inputs, offload_operator::explain::ExplainError> {
    use offload_operator::explain;
    let nodes: Result<Vec<_>, _> = args
        .node_reports
        .iter()
        .map(|a| explain::node_from_report(a))
        .collect();
    let nodes = nodes
        .and_then(|n| explain::with_node_memory(n, &args.node_memory))
        .and_then(|n| explain::with_node_cpus(n, &args.node_cpus));
    let dra = offload_operator::dra::DraOptions::default();
    let nodes = nodes.and_then(|n| {
        let slices = explain::slices_from_files(&args.resource_slices)?;
        Ok(explain::with_slices(n, &slices, &dra.driver))
    });
    nodes.and_then(|nodes| {
        Ok(explain::Inputs {
            view: offload_operator::cluster::view::MemoryView {
                render,
                claim_templates: explain::claim_templates_from_files(&args.claim_templates)?,
                dra: Some(dra),
                ..offload_operator::cluster::view::MemoryView::new(
                    nodes,
                    explain::profiles_from_files(&args.profiles)?,
                )
            },
            deepspeed_configs: explain::deepspeed_configs_from_files(&args.deepspeed_configs)?,
            model_configs: explain::model_configs_from_files(&args.model_configs)?,
        })
    })
}

fn check(runtime: &tokio::runtime::Runtime, profile: &str, namespace: &str) -> ExitCode {
    match runtime.block_on(offload_operator::ops::installation::installation(
        profile, namespace,
    )) {
        Ok(lines) => {
            for line in lines {
                println!("ok: {line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(runtime: &tokio::runtime::Runtime, args: RunArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    runtime.block_on(async move {
        let client = match kube::Client::try_default().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: no usable kubeconfig or in-cluster service account: {e}");
                return ExitCode::FAILURE;
            }
        };
        let shutdown = offload_process::shutdown_on_signal();
        let identity = format!(
            "{}_{}",
            args.identity.as_deref().unwrap_or("offload-operator"),
            instance_suffix()
        );
        let options = RunOptions {
            admin_addr: args.admin_addr,
            learned_namespace: Some(args.namespace.clone()),
            sizer: args.sizer.then(|| offload_operator::sizer::SizerOptions {
                namespace: args.namespace.clone(),
                image: args.sizer_image.clone().filter(|i| !i.is_empty()),
                job_image: args.sizer_job_image,
                timeout: args.sizer_timeout,
                cpu: args.sizer_cpu.clone(),
                memory: args.sizer_memory.clone(),
                ..Default::default()
            }),
            leader_election: args.leader_election.then(|| LeaderElection {
                namespace: args.namespace.clone(),
                lease_name: args.lease_name.clone(),
                identity,
                duration: args.lease_duration,
            }),
            controller: ControllerOptions {
                concurrency: args.concurrency,
                render: offload_operator::render::RenderOptions {
                    guard_image: args.agent_image.clone().filter(|i| !i.is_empty()),
                    ..Default::default()
                },
                extended_resource_toleration: args.extended_resource_toleration,
                ..ControllerOptions::default()
            },
            webhook: match webhook_options(&args) {
                Ok(w) => w,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            },
            dra: (!args.dra_driver.is_empty()).then(|| offload_operator::dra::DraOptions {
                gpu_classes: if args.dra_gpu_device_classes.is_empty() {
                    vec![args.dra_driver.clone()]
                } else {
                    args.dra_gpu_device_classes.clone()
                },
                driver: args.dra_driver.clone(),
            }),
        };
        match operator::run(client, options, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "operator stopped");
                ExitCode::FAILURE
            }
        }
    })
}

fn webhook_options(args: &RunArgs) -> Result<Option<WebhookOptions>, String> {
    if args.webhook_addr.is_empty() {
        return Ok(None);
    }
    let addr: SocketAddr = args
        .webhook_addr
        .parse()
        .map_err(|e| format!("--webhook-addr {:?}: {e}", args.webhook_addr))?;
    let certs = match &args.webhook_cert_dir {
        Some(dir) => CertMode::Files(FileCerts {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        }),
        None => CertMode::Managed(ManagedCerts {
            namespace: args.namespace.clone(),
            secret: args.webhook_secret.clone(),
            names: args.webhook_names.clone(),
            mutating: Some(args.mutating_webhook_config.clone()),
            validating: Some(args.validating_webhook_config.clone()),
        }),
    };
    Ok(Some(WebhookOptions {
        addr,
        certs,
        check_interval: Duration::from_secs(3600),
    }))
}

fn write_crds(out_dir: Option<PathBuf>) -> Result<(), Box<dyn std::error::Error>> {
    for crd in offload_api::v1alpha1::crds() {
        let yaml = offload_api::v1alpha1::crd_yaml(&crd)?;
        match &out_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                let path = dir.join(offload_api::v1alpha1::crd_file_name(&crd));
                std::fs::write(&path, yaml)?;
                eprintln!("wrote {}", path.display());
            }
            None => print!("---\n{yaml}"),
        }
    }
    Ok(())
}
