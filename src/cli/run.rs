//! `offload-operator run`: the operator's flags and the options they make.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use offload_api::names;
use offload_operator::controller::ControllerOptions;
use offload_operator::operator::{self, LeaderElection, RunOptions};
use offload_operator::webhook::tls::{FileCerts, ManagedCerts};
use offload_operator::webhook::{CertMode, WebhookOptions};

use super::args::{parse_cpu, parse_memory, parse_seconds, parse_sizer_timeout};

/// The operator's flags.
#[derive(clap::Args)]
pub(crate) struct RunArgs {
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

/// A process-unique suffix for the leader identity: a restarted container must not believe
/// it still holds its predecessor's lease.
fn instance_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:08x}", nanos ^ std::process::id().rotate_left(16))
}

/// Runs the operator until a signal stops it.
pub(crate) fn run(runtime: &tokio::runtime::Runtime, args: RunArgs) -> ExitCode {
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
