//! The installation's commands: `crd`, `check` (what `helm test` runs) and `cleanup` (the
//! chart's uninstall hook).

use std::path::PathBuf;
use std::process::ExitCode;

/// Removes what the operator made at run time and the chart does not own.
pub(crate) fn cleanup(
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

/// Checks an installation, line by line.
pub(crate) fn check(runtime: &tokio::runtime::Runtime, profile: &str, namespace: &str) -> ExitCode {
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

/// Prints the CRDs, or writes one file per CRD into `out_dir`.
pub(crate) fn write_crds(out_dir: Option<PathBuf>) -> Result<(), Box<dyn std::error::Error>> {
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
