//! The GPU machine's scripts (`hack/gpu/`) run only where a GPU is lent, so CI cannot run them;
//! it checks what it can without one: every shell script and every Python file parses (and
//! `hack/saved-bytes.py`, which needs torch but no GPU), and the Megatron-core bench's own
//! reading of `OFFLOAD_MEGATRON_ARGS` (the flags Megatron-LM's argument parser defines for
//! them) takes every set of flags the operator renders.

use std::path::{Path, PathBuf};
use std::process::Command;

use offload_api::version::FrameworkVersion;
use offload_operator::decision::MegatronPlan;

fn gpu_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/gpu")
}

fn files(ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(gpu_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    out.sort();
    out
}

#[test]
fn every_gpu_script_parses() {
    let shells = files("sh");
    assert!(shells.len() >= 8, "{shells:?}");
    for script in &shells {
        let out = Command::new("bash").arg("-n").arg(script).output().unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut pythons = files("py");
    assert!(pythons.len() >= 8, "{pythons:?}");
    // The CPU's count of what the blocks keep (torch and transformers in a virtual environment).
    pythons.push(gpu_dir().join("../saved-bytes.py"));
    for source in &pythons {
        // Parsed, not imported: torch and the frameworks are on the GPU machine only.
        let out = Command::new("python3")
            .args([
                "-c",
                "import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])",
            ])
            .arg(source)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_megatron_bench_reads_every_flag_set_the_operator_renders() {
    let plan = |cpu_offload, overlap, manual_gc| MegatronPlan {
        version: FrameworkVersion::parse("0.14.0").unwrap(),
        cpu_offload,
        fraction: 0.37,
        overlap,
        distributed_optimizer: true,
        manual_gc,
    };
    let mut sets = Vec::new();
    for (cpu_offload, overlap, pinned, manual_gc) in [
        (false, false, true, false),
        (true, false, true, true),
        (true, true, true, true),
        (true, true, false, false),
    ] {
        sets.push(offload_operator::render::megatron::args_line(
            &plan(cpu_offload, overlap, manual_gc),
            pinned,
        ));
    }
    // The bench's own `offload_flags`, taken from its source (the module imports torch).
    let program = r#"
import argparse, ast, json, shlex, sys
tree = ast.parse(open(sys.argv[1]).read())
fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "offload_flags")
ns = {"argparse": argparse, "shlex": shlex}
exec(compile(ast.Module([fn], []), sys.argv[1], "exec"), ns)
print(json.dumps([vars(ns["offload_flags"](s)) for s in sys.argv[2:]]))
"#;
    let out = Command::new("python3")
        .args(["-c", program])
        .arg(gpu_dir().join("megatron_step.py"))
        .args(&sets)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{sets:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read[0]["optimizer_cpu_offload"], false);
    assert_eq!(read[0]["use_distributed_optimizer"], true);
    assert_eq!(read[2]["optimizer_offload_fraction"], 0.37);
    assert_eq!(read[2]["overlap_cpu_optimizer_d2h_h2d"], true);
    assert_eq!(read[3]["pin_cpu_grads"], false);
    assert_eq!(read[3]["pin_cpu_params"], false);
    assert_eq!(read[1]["use_precision_aware_optimizer"], true);
    assert_eq!(read[1]["manual_gc"], true);
    assert_eq!(read[1]["manual_gc_interval"], 100);
    assert_eq!(read[3]["manual_gc"], false);
}
