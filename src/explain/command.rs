//! `offload-operator explain`'s command line: its inputs (files, or the current cluster), the
//! runs and traces it is given, and its output as text or JSON.

use std::path::PathBuf;
use std::process::ExitCode;

/// What `offload-operator explain` reads: the manifests, the cluster as files (or the current
/// cluster), traces and runs, and how to print.
#[derive(clap::Args)]
pub struct ExplainArgs {
    /// Manifest file (YAML or JSON, several documents allowed); `-` reads stdin.
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// A recorded node report (`[NAME=]PATH`, the agent's JSON); repeat for several nodes.
    /// Without any, nodes, profiles and ConfigMaps are read from the current cluster.
    #[arg(long = "node-report")]
    pub node_reports: Vec<String>,
    /// A node's allocatable memory (`NAME=QUANTITY`, e.g. `h200=125Gi`; offline), which bounds
    /// what offload can put on the host.
    #[arg(long = "node-memory")]
    pub node_memory: Vec<String>,
    /// A node's allocatable CPUs (`NAME=QUANTITY`, e.g. `h200=16` or `h200=15500m`; offline):
    /// a pod without a CPU limit shares them with the job's other pods on the node, and a
    /// report without the self-test's thread count is read as measured with all of them.
    #[arg(long = "node-cpus")]
    pub node_cpus: Vec<String>,
    /// An OffloadProfile manifest (offline; the built-in `default` profile when none).
    #[arg(long = "profile")]
    pub profiles: Vec<PathBuf>,
    /// The DeepSpeed JSON of a ConfigMap the job references (`CONFIGMAP=PATH`, offline).
    #[arg(long = "deepspeed-config")]
    pub deepspeed_configs: Vec<String>,
    /// The `config.json` of a model ConfigMap the job references (`CONFIGMAP=PATH`, offline).
    #[arg(long = "model-config")]
    pub model_configs: Vec<String>,
    /// A trace of the job's model by the sizer (`offload_sizer.py`'s JSON, as a node report is
    /// given); repeat for several jobs. A trace made for another step is not used, and the
    /// reasons say why.
    #[arg(long = "trace-file")]
    pub trace_files: Vec<PathBuf>,
    /// Trace each job's model here before deciding: the sizer this release ships, run with a
    /// Python that has torch and transformers (`--python`).
    #[arg(long)]
    pub trace: bool,
    /// The Python `--trace` runs the sizer with.
    #[arg(long, env = "OFFLOAD_SIZER_PYTHON", default_value = "python3")]
    pub python: String,
    /// ResourceClaimTemplates the job's DRA claims name (manifest files, offline).
    #[arg(long = "claim-template")]
    pub claim_templates: Vec<PathBuf>,
    /// The GPU driver's ResourceSlices (manifest files, offline): its word on each node.
    #[arg(long = "resource-slices")]
    pub resource_slices: Vec<PathBuf>,
    /// A run of the job as the agent observed it (`offload-agent observe -- COMMAND`'s JSON, or
    /// a node's `offload.dev/observed` summary); repeat for several runs, in order. The decision
    /// shown is the one the operator makes after them: what each run used is learned, and a run
    /// that ran out of memory is recorded as the controller records it.
    #[arg(long = "observed")]
    pub observed: Vec<PathBuf>,
    /// The agent image, to show the start-up guard as the operator would add it.
    #[arg(long, env = "OFFLOAD_AGENT_IMAGE")]
    pub agent_image: Option<String>,
    /// Also render every alternative for a DeepSpeed job (each knob flipped on its own).
    #[arg(long)]
    pub candidates: bool,
    /// Output format.
    #[arg(short = 'o', long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

/// Runs `explain`: reads the inputs, explains each manifest, prints; the exit code says whether
/// any object would be refused or held (1), or an input could not be read (2).
pub fn run(runtime: &tokio::runtime::Runtime, args: &ExplainArgs) -> ExitCode {
    let manifests = match read_manifests(args) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let render = crate::render::RenderOptions {
        guard_image: args.agent_image.clone().filter(|i| !i.is_empty()),
        ..Default::default()
    };
    let mut inputs = if args.node_reports.is_empty() {
        let loaded = runtime.block_on(async {
            let client = kube::Client::try_default().await?;
            super::inputs_from_cluster(&client, &manifests, render).await
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
        match super::read_bounded(path, offload_api::observed::MAX_OBSERVED_BYTES) {
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
    if out.iter().any(super::Explanation::refused) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The traces `--trace-file` gives, and the sizer `--trace` runs, in the inputs' view.
fn with_traces(inputs: &mut super::Inputs, args: &ExplainArgs) -> Result<(), String> {
    for path in &args.trace_files {
        let text = super::read_bounded(path, offload_api::trace::MAX_TRACE_BYTES)
            .map_err(|e| format!("--trace-file {e}"))?;
        inputs
            .view
            .traces
            .add(&text)
            .map_err(|e| format!("--trace-file {}: {e}", path.display()))?;
    }
    if args.trace {
        inputs.view.traces.sizer = Some(crate::sizer::local::LocalSizer::new(
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
    inputs: &mut super::Inputs,
    runs: &[(String, String)],
    candidates: bool,
) -> Result<Vec<super::Explanation>, String> {
    let mut out = Vec::new();
    for m in manifests {
        if runs.is_empty() {
            out.push(super::explain(m, inputs, candidates).map_err(|e| e.to_string())?);
            continue;
        }
        let job = m
            .pointer("/metadata/name")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        let evidence = runs
            .iter()
            .map(|(source, text)| super::read_evidence(source, text, job))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(super::explain_observed(m, inputs, &evidence).map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// The explanations as JSON (one object for one manifest) or as text.
fn print_explanations(out: &[super::Explanation], output: &str) -> Result<(), serde_json::Error> {
    if output == "json" {
        let s = if out.len() == 1 {
            serde_json::to_string_pretty(&out[0])?
        } else {
            serde_json::to_string_pretty(&out)?
        };
        println!("{s}");
    } else {
        for e in out {
            print!("{}", super::to_text(e));
        }
    }
    Ok(())
}

/// The manifests to explain, from the file or standard input (`-`).
fn read_manifests(args: &ExplainArgs) -> Result<Vec<serde_json::Value>, super::ExplainError> {
    let text = if args.file.as_os_str() == "-" {
        let mut s = String::new();
        match std::io::Read::read_to_string(&mut std::io::stdin(), &mut s) {
            Ok(_) => Ok(s),
            Err(e) => Err(e.to_string()),
        }
    } else {
        std::fs::read_to_string(&args.file).map_err(|e| format!("{}: {e}", args.file.display()))
    };
    text.map_err(super::ExplainError::Manifest)
        .and_then(|t| super::read_manifests(&t))
}

/// The cluster as the files on the command line describe it: node reports (with their memory
/// and the GPU driver's slices), profiles, claim templates and DeepSpeed configs.
fn offline_inputs(
    args: &ExplainArgs,
    render: crate::render::RenderOptions,
) -> Result<super::Inputs, super::ExplainError> {
    let nodes: Result<Vec<_>, _> = args
        .node_reports
        .iter()
        .map(|a| super::node_from_report(a))
        .collect();
    let nodes = nodes
        .and_then(|n| super::with_node_memory(n, &args.node_memory))
        .and_then(|n| super::with_node_cpus(n, &args.node_cpus));
    let dra = crate::dra::DraOptions::default();
    let nodes = nodes.and_then(|n| {
        let slices = super::slices_from_files(&args.resource_slices)?;
        Ok(super::with_slices(n, &slices, &dra.driver))
    });
    nodes.and_then(|nodes| {
        Ok(super::Inputs {
            view: crate::cluster::view::MemoryView {
                render,
                claim_templates: super::claim_templates_from_files(&args.claim_templates)?,
                dra: Some(dra),
                ..crate::cluster::view::MemoryView::new(
                    nodes,
                    super::profiles_from_files(&args.profiles)?,
                )
            },
            deepspeed_configs: super::deepspeed_configs_from_files(&args.deepspeed_configs)?,
            model_configs: super::model_configs_from_files(&args.model_configs)?,
        })
    })
}
