//! The reason codes page, from `ReasonCode` and its doc comments; and the longest sentence
//! the examples' decisions give for status, against its bound.

use offload_api::v1alpha1::{OffloadProfile, ReasonCode, TrainingJob};
use syn::Item;

use super::markdown::{GENERATED, table};

const SOURCE: &str = include_str!("../../../api/src/v1alpha1/reason.rs");

/// The page.
pub fn page() -> Result<String, String> {
    let file = syn::parse_file(SOURCE).map_err(|e| format!("reason.rs: {e}"))?;
    let Some(variants) = file.items.iter().find_map(|i| match i {
        Item::Enum(e) if e.ident == "ReasonCode" => Some(&e.variants),
        _ => None,
    }) else {
        return Err("reason.rs has no enum ReasonCode".into());
    };
    let named: Vec<String> = variants.iter().map(|v| v.ident.to_string()).collect();
    let listed: Vec<&str> = ReasonCode::ALL.iter().map(|c| c.as_str()).collect();
    if named != listed {
        return Err(format!(
            "ReasonCode::ALL {listed:?} is not the enum's variants {named:?}"
        ));
    }
    let mut rows = Vec::new();
    for (variant, code) in variants.iter().zip(ReasonCode::ALL) {
        let doc = super::names::doc_of(&variant.attrs);
        if doc.is_empty() {
            return Err(format!("ReasonCode::{code} has no doc comment"));
        }
        let fields: Vec<String> = code.fields().iter().map(|f| format!("`{f}`")).collect();
        rows.push(vec![format!("`{code}`"), fields.join(", "), doc]);
    }
    let mut out = format!(
        "{GENERATED}\n\n# Reason codes\n\nEvery reason in a TrainingJob's `status.offload.reasons` (and a line of an \
         object's `offload.dev/reasons` annotation) carries one of these codes beside one sentence of at \
         most 200 characters with the figures that decide it. `offload-operator explain` prints each \
         reason's whole account. Why a job has no configuration at all is its `OffloadResolved` \
         condition's reason: see [Troubleshooting](../troubleshooting.md).\n\n"
    );
    out.push_str(&table(&["code", "fields", "meaning"], &rows));
    Ok(out)
}

/// The profile a TrainingJob names (`auto`: the default one).
fn profile_of(tj: &TrainingJob) -> &str {
    let wanted = tj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(offload_api::names::PROFILE_ANNOTATION))
        .map_or(offload_api::names::DEFAULT_PROFILE, String::as_str);
    if wanted == offload_api::names::PROFILE_AUTO {
        offload_api::names::DEFAULT_PROFILE
    } else {
        wanted
    }
}

/// The examples' inputs: a cluster of the recorded GH200 and H200 nodes, the DeepSpeed config,
/// the Llama model config and the profiles.
#[allow(clippy::type_complexity)]
fn example_inputs(
    root: &std::path::Path,
) -> Result<
    (
        offload_operator::index::NodeIndex,
        offload_operator::decision::UserConfig,
        offload_operator::decision::ModelShape,
        Vec<OffloadProfile>,
    ),
    String,
> {
    use offload_operator::decision::UserConfig;
    use offload_operator::decision::model::model_config;
    use offload_operator::index::{Allocatable, NodeIndex, NodeInfo};
    use offload_testenv::fixtures;
    let read = |file: &str| -> Result<String, String> {
        std::fs::read_to_string(root.join(file)).map_err(|e| format!("examples/{file}: {e}"))
    };
    let yaml = |file: &str| -> Result<serde_json::Value, String> {
        serde_saphyr::from_str(&read(file)?).map_err(|e| format!("examples/{file}: {e}"))
    };
    let node = |name: &str, fixture: &str| -> Result<NodeInfo, String> {
        let report = offload_api::report::NodeReport::parse(fixture).map_err(|e| e.to_string())?;
        Ok(
            NodeInfo::from_report(name, &report).with_allocatable(Allocatable {
                memory: Some(480 << 30),
                gpus: Some(1),
                cpus: None,
                ..Default::default()
            }),
        )
    };
    let nodes = NodeIndex::new(vec![
        node("gh200-0", fixtures::GH200_REFERENCE)?,
        node("gh200-1", fixtures::GH200_REFERENCE)?,
        node("h200-0", fixtures::H200_READING)?,
        node("h200-1", fixtures::H200_READING)?,
    ]);
    let config = yaml("deepspeed-configmap.yaml")?;
    let config = UserConfig::parse(
        config["data"]["ds_config.json"]
            .as_str()
            .unwrap_or_default(),
        "example",
    )
    .map_err(|e| e.to_string())?;
    let model = yaml("llama-8b-model-config.yaml")?;
    let shape = model_config::parse(
        model["data"]["config.json"].as_str().unwrap_or_default(),
        "example",
    )
    .map_err(|e| e.to_string())?;
    let profiles: Vec<OffloadProfile> = [
        "offloadprofile-default.yaml",
        "offloadprofile-pcie-pool.yaml",
    ]
    .iter()
    .map(|f| serde_saphyr::from_str(&read(f)?).map_err(|e| format!("{f}: {e}")))
    .collect::<Result<_, String>>()?;
    Ok((nodes, config, shape, profiles))
}

/// The longest sentence for status over the decisions of the examples' TrainingJobs, on a
/// cluster of the recorded GH200 and H200 nodes: its length and text.
pub fn longest_of_examples() -> Result<(usize, String), String> {
    use offload_operator::cluster::view::MemoryView;
    use offload_operator::decision::JobRequest;
    use offload_operator::decision::resolve_offload;

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let read = |file: &str| -> Result<String, String> {
        std::fs::read_to_string(root.join(file)).map_err(|e| format!("examples/{file}: {e}"))
    };
    let (nodes, config, shape, profiles) = example_inputs(&root)?;
    let mut longest = (0, String::new());
    let mut files: Vec<String> = std::fs::read_dir(&root)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.starts_with("trainingjob-"))
        .collect();
    files.sort();
    for file in files {
        let tj: TrainingJob =
            serde_saphyr::from_str(&read(&file)?).map_err(|e| format!("{file}: {e}"))?;
        let wanted = profile_of(&tj);
        let Some(profile) = profiles
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(wanted))
        else {
            return Err(format!("{file}: no example profile {wanted}"));
        };
        let with_model = tj
            .spec
            .model
            .as_ref()
            .is_some_and(|m| m.config_map_ref.is_some());
        let req = JobRequest::for_training_job(
            &tj,
            tj.spec.deepspeed.as_ref().map(|_| &config),
            with_model.then_some(&shape),
            &MemoryView::default(),
        )
        .map_err(|e| format!("{file}: {e}"))?;
        let res = resolve_offload(&req, wanted, &profile.spec, &nodes)
            .map_err(|e| format!("{file}: {e}"))?;
        for r in &res.reasons {
            let short = r.short();
            let n = short.chars().count();
            if n > longest.0 {
                longest = (
                    n,
                    format!("{file}: {} {}: {short}", r.field.as_str(), r.code),
                );
            }
        }
    }
    Ok(longest)
}
