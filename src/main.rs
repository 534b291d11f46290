//! `offload-operator`: the operator binary (controller and admission webhook).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use offload_operator::controller::ControllerOptions;
use offload_operator::operator::{self, LeaderElection, RunOptions};
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
    Run(RunArgs),
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
    /// This replica's identity in the election.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Concurrent reconciles per controller.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
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
        Command::Run(args) => run(args),
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
        let identity = args
            .identity
            .clone()
            .unwrap_or_else(|| format!("offload-operator-{}", std::process::id()));
        let options = RunOptions {
            admin_addr: args.admin_addr,
            leader_election: args.leader_election.then(|| LeaderElection {
                namespace: args.namespace.clone(),
                lease_name: args.lease_name.clone(),
                identity,
            }),
            controller: ControllerOptions {
                concurrency: args.concurrency,
                ..ControllerOptions::default()
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
