//! `offload-operator`: the operator binary (controller and admission webhook).

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
use tokio_util::sync::CancellationToken;

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
    },
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd { out_dir } => match write_crds(out_dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::FAILURE
            }
        },
        Command::Run(args) => run(*args),
        Command::Check { profile, namespace } => check(&profile, &namespace),
        Command::Cleanup {
            namespace,
            webhook_secret,
            lease_name,
        } => cleanup(&namespace, &webhook_secret, &lease_name),
    }
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let n: u64 = s
        .strip_suffix('s')
        .unwrap_or(s)
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds like 15s"))?;
    if !(5..=300).contains(&n) {
        return Err(format!("{s}: use 5s to 300s"));
    }
    Ok(Duration::from_secs(n))
}

/// A process-unique suffix for the leader identity: a restarted container must not believe
/// it still holds its predecessor's lease.
fn instance_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:08x}", nanos ^ std::process::id().rotate_left(16))
}

fn cleanup(namespace: &str, secret: &str, lease: &str) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("start-up: tokio runtime");
    match runtime.block_on(offload_operator::check::remove_runtime_objects(
        namespace, secret, lease,
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

fn check(profile: &str, namespace: &str) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("start-up: tokio runtime");
    match runtime.block_on(offload_operator::check::installation(profile, namespace)) {
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

fn run(args: RunArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("start-up: tokio runtime");
    runtime.block_on(async move {
        let client = match kube::Client::try_default().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: no usable kubeconfig or in-cluster service account: {e}");
                return ExitCode::FAILURE;
            }
        };
        let shutdown = CancellationToken::new();
        let signal_token = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutting down");
            signal_token.cancel();
        });
        let identity = format!(
            "{}_{}",
            args.identity.as_deref().unwrap_or("offload-operator"),
            instance_suffix()
        );
        let options = RunOptions {
            admin_addr: args.admin_addr,
            leader_election: args.leader_election.then(|| LeaderElection {
                namespace: args.namespace.clone(),
                lease_name: args.lease_name.clone(),
                identity,
                duration: args.lease_duration,
            }),
            controller: ControllerOptions {
                concurrency: args.concurrency,
                ..ControllerOptions::default()
            },
            webhook: match webhook_options(&args) {
                Ok(w) => w,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            },
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

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn write_crds(out_dir: Option<PathBuf>) -> Result<(), Box<dyn std::error::Error>> {
    for crd in offload_operator::api::crds() {
        let yaml = offload_operator::api::crd_yaml(&crd)?;
        match &out_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                let path = dir.join(offload_operator::api::crd_file_name(&crd));
                std::fs::write(&path, yaml)?;
                eprintln!("wrote {}", path.display());
            }
            None => print!("---\n{yaml}"),
        }
    }
    Ok(())
}
