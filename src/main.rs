//! `offload-operator`: the operator binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
