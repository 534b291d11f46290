//! The command line: one subcommand per module.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use offload_api::names;
use offload_operator::explain::command::ExplainArgs;

mod admin;
mod args;
pub(crate) mod run;

/// The offload operator: controller and admission webhook.
#[derive(Parser)]
#[command(version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Print the CRDs as YAML, or write them into a directory (one file per CRD).
    Crd {
        /// Directory to write `<plural>.<group>.yaml` files into instead of printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Run the operator against the cluster of the current kubeconfig or service account.
    Run(Box<run::RunArgs>),
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

/// Runs the command given.
pub(crate) fn dispatch(cli: Cli) -> ExitCode {
    if !matches!(cli.command, Command::Run(_)) {
        offload_process::quiet_on_closed_pipe();
    }
    if let Command::Crd { out_dir } = cli.command {
        return match admin::write_crds(out_dir) {
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
        Command::Run(args) => run::run(&runtime, *args),
        Command::Check { profile, namespace } => admin::check(&runtime, &profile, &namespace),
        Command::Explain(args) => offload_operator::explain::command::run(&runtime, &args),
        Command::Cleanup {
            namespace,
            webhook_secret,
            lease_name,
            deployment,
            selector,
        } => admin::cleanup(
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
