//! Where `explain` takes its inputs from: manifests, recorded node reports, profile and
//! DeepSpeed config files, or the current cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::ExplainError;
use crate::cluster::tolerant::Tolerant;
use crate::cluster::view::MemoryView;
use crate::decision::referenced::{self, Fetched, Reference};
use crate::decision::{ConfigError, ModelConfigError, ModelShape, UserConfig};
use crate::dra::api::{ResourceClaimTemplate, ResourceSlice};
use crate::index::NodeIndex;
use crate::render::RenderOptions;
use offload_api::v1alpha1::OffloadProfileSpec;

/// What a decision is made from: the cluster, held in memory, and the DeepSpeed configs by
/// ConfigMap name (the text of the key the job names) for jobs that reference one.
pub struct Inputs {
    /// Profiles and nodes.
    pub view: MemoryView,
    /// DeepSpeed configs by ConfigMap name.
    pub deepspeed_configs: BTreeMap<String, String>,
    /// Models' `config.json` by ConfigMap name.
    pub model_configs: BTreeMap<String, String>,
}

impl Inputs {
    /// The user's DeepSpeed config of a job, from the inputs, read as the controller reads its
    /// ConfigMap ([`Reference`]); the file handed over stands for the key the job references.
    pub fn user_config(
        &self,
        tj: &offload_api::v1alpha1::TrainingJob,
    ) -> Result<Option<UserConfig>, ConfigError> {
        let Some(r) = Reference::deepspeed(tj) else {
            return Ok(None);
        };
        let Some(text) = self.deepspeed_configs.get(&r.name) else {
            return Err(ConfigError::NotGiven { name: r.name });
        };
        let ns = tj.metadata.namespace.as_deref().unwrap_or("default");
        let cm = referenced::config_map_of(&r.name, &r.key, text);
        r.user_config(ns, Fetched::Found(Box::new(cm))).map(Some)
    }

    /// The shape of a job's model from its `config.json`, from the inputs, read as the
    /// controller reads its ConfigMap.
    pub fn model_config(
        &self,
        tj: &offload_api::v1alpha1::TrainingJob,
    ) -> Result<Option<ModelShape>, ModelConfigError> {
        let ns = tj.metadata.namespace.as_deref().unwrap_or("default");
        Reference::model(tj).map_or(Ok(None), |r| self.model_shape(r, ns).map(Some))
    }

    /// The shape of the model another kind's annotation `offload.dev/model-config` names, from
    /// the inputs, read as the webhook reads its ConfigMap.
    pub fn annotated_model_config(
        &self,
        req: &kube::core::admission::AdmissionRequest<kube::core::DynamicObject>,
    ) -> Result<Option<ModelShape>, ModelConfigError> {
        let reference = req
            .object
            .as_ref()
            .and_then(|o| o.metadata.annotations.as_ref())
            .and_then(Reference::model_annotation);
        let ns = req.namespace.as_deref().unwrap_or("default");
        reference.map_or(Ok(None), |r| self.model_shape(r, ns).map(Some))
    }

    /// The shape of the model `r` names, from the file handed over for its ConfigMap.
    fn model_shape(&self, r: Reference, ns: &str) -> Result<ModelShape, ModelConfigError> {
        let Some(text) = self.model_configs.get(&r.name) else {
            return Err(ModelConfigError::NotGiven { name: r.name });
        };
        let cm = referenced::config_map_of(&r.name, &r.key, text);
        r.model_shape(ns, Fetched::Found(Box::new(cm)))
    }
}

/// Reads the documents of a YAML or JSON file (`---`-separated; `List` objects unpacked).
pub fn read_manifests(text: &str) -> Result<Vec<Value>, ExplainError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| ExplainError::Manifest(format!("not YAML or JSON: {e}")))?;
    let mut out = Vec::new();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        match doc.get("items").and_then(Value::as_array) {
            Some(items) if doc.get("kind").and_then(Value::as_str) == Some("List") => {
                out.extend(items.iter().cloned());
            }
            _ => out.push(doc),
        }
    }
    if out.is_empty() {
        return Err(ExplainError::Manifest("the file holds no object".into()));
    }
    Ok(out)
}

/// Most bytes `explain` reads of any one input file (a manifest, a report, a config).
pub const MAX_INPUT_BYTES: usize = 4 * 1024 * 1024;

/// Reads `path` as text, at most `max` bytes: a larger file (or `/dev/zero`) is refused with its
/// name, never read until memory runs out.
pub fn read_bounded(path: &std::path::Path, max: usize) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() > max {
        return Err(format!(
            "{}: more than {max} bytes, more than such a file holds",
            path.display()
        ));
    }
    String::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8 text: {e}", path.display()))
}

/// A node from a recorded report file (`[NAME=]PATH`; the name defaults to the report's own).
pub fn node_from_report(arg: &str) -> Result<crate::index::NodeInfo, ExplainError> {
    let (name, path) = match arg.split_once('=') {
        Some((n, p)) if !n.contains('/') => (Some(n.to_string()), p),
        _ => (None, arg),
    };
    let text = read_bounded(std::path::Path::new(path), MAX_INPUT_BYTES)
        .map_err(|e| ExplainError::Manifest(format!("reading node report {e}")))?;
    let report = offload_api::report::NodeReport::parse(&text)
        .map_err(|e| ExplainError::Manifest(format!("node report {path}: {e}")))?;
    let name = name.unwrap_or_else(|| report.node.clone());
    Ok(crate::index::NodeInfo::from_report(&name, &report))
}

/// The nodes with the allocatable memory `NAME=QUANTITY` arguments give them.
pub fn with_node_memory(
    mut nodes: Vec<crate::index::NodeInfo>,
    args: &[String],
) -> Result<Vec<crate::index::NodeInfo>, ExplainError> {
    for a in args {
        let (name, quantity) = a.split_once('=').ok_or_else(|| {
            ExplainError::Manifest(format!(
                "--node-memory {a}: use NAME=QUANTITY (e.g. h200-0=125Gi)"
            ))
        })?;
        let bytes = offload_api::quantity::bytes(
            &k8s_openapi::apimachinery::pkg::api::resource::Quantity(quantity.to_string()),
        )
        .map_err(|e| ExplainError::Manifest(format!("--node-memory {a}: {e}")))?;
        let node = nodes.iter_mut().find(|n| n.name == name).ok_or_else(|| {
            ExplainError::Manifest(format!(
                "--node-memory {a}: no --node-report names node {name:?}"
            ))
        })?;
        let mut allocatable = node.allocatable;
        allocatable.memory = Some(bytes);
        *node = node.clone().with_allocatable(allocatable);
    }
    Ok(nodes)
}

/// The nodes with the allocatable CPUs `NAME=QUANTITY` arguments give them (whole cores,
/// rounded up, as a Node's `status.allocatable` is read).
pub fn with_node_cpus(
    mut nodes: Vec<crate::index::NodeInfo>,
    args: &[String],
) -> Result<Vec<crate::index::NodeInfo>, ExplainError> {
    for a in args {
        let (name, quantity) = a.split_once('=').ok_or_else(|| {
            ExplainError::Manifest(format!("--node-cpus {a}: use NAME=QUANTITY (e.g. h200=16)"))
        })?;
        let cpus = crate::index::cpu_cores(quantity).ok_or_else(|| {
            ExplainError::Manifest(format!(
                "--node-cpus {a}: {quantity:?} is not a CPU quantity (16, 15500m)"
            ))
        })?;
        let node = nodes.iter_mut().find(|n| n.name == name).ok_or_else(|| {
            ExplainError::Manifest(format!(
                "--node-cpus {a}: no --node-report names node {name:?}"
            ))
        })?;
        let mut allocatable = node.allocatable;
        allocatable.cpus = Some(cpus);
        *node = node.clone().with_allocatable(allocatable);
    }
    Ok(nodes)
}

/// Profiles from manifest files; the built-in `default` profile when none is given.
pub fn profiles_from_files(
    paths: &[std::path::PathBuf],
) -> Result<BTreeMap<String, OffloadProfileSpec>, ExplainError> {
    let mut out = BTreeMap::new();
    for path in paths {
        let text = read_bounded(path, MAX_INPUT_BYTES)
            .map_err(|e| ExplainError::Manifest(format!("reading profile {e}")))?;
        for doc in read_manifests(&text)? {
            let p: offload_api::v1alpha1::OffloadProfile =
                crate::cluster::tolerant::from_value(doc).map_err(|e| {
                    ExplainError::Manifest(format!(
                        "{}: not an OffloadProfile: {e}",
                        path.display()
                    ))
                })?;
            let name = p.metadata.name.clone().unwrap_or_default();
            out.insert(name, p.spec);
        }
    }
    if out.is_empty() {
        out.insert(
            offload_api::names::DEFAULT_PROFILE.to_string(),
            OffloadProfileSpec::default(),
        );
    }
    Ok(out)
}

/// ResourceClaimTemplates (DRA) from manifest files, by namespace (`default` when a manifest
/// names none) and name.
pub fn claim_templates_from_files(
    paths: &[std::path::PathBuf],
) -> Result<BTreeMap<(String, String), Arc<ResourceClaimTemplate>>, ExplainError> {
    let mut out = BTreeMap::new();
    for path in paths {
        let text = read_bounded(path, MAX_INPUT_BYTES)
            .map_err(|e| ExplainError::Manifest(format!("reading claim template {e}")))?;
        for doc in read_manifests(&text)? {
            let t: ResourceClaimTemplate =
                crate::cluster::tolerant::from_value(doc).map_err(|e| {
                    ExplainError::Manifest(format!(
                        "{}: not a ResourceClaimTemplate: {e}",
                        path.display()
                    ))
                })?;
            let ns = t
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into());
            out.insert(
                (ns, t.metadata.name.clone().unwrap_or_default()),
                Arc::new(t),
            );
        }
    }
    Ok(out)
}

/// ResourceSlices (DRA) from manifest files, as the caches hold them.
pub fn slices_from_files(
    paths: &[std::path::PathBuf],
) -> Result<Vec<Arc<Tolerant<ResourceSlice>>>, ExplainError> {
    let mut out = Vec::new();
    for path in paths {
        let text = read_bounded(path, MAX_INPUT_BYTES)
            .map_err(|e| ExplainError::Manifest(format!("reading ResourceSlices {e}")))?;
        for doc in read_manifests(&text)? {
            let s: Tolerant<ResourceSlice> = serde_json::from_value(doc).map_err(|e| {
                ExplainError::Manifest(format!("{}: not a ResourceSlice: {e}", path.display()))
            })?;
            out.push(Arc::new(s));
        }
    }
    Ok(out)
}

/// The nodes with what `driver`'s slices say about each; a node only the slices describe is
/// added.
pub fn with_slices(
    mut nodes: Vec<crate::index::NodeInfo>,
    slices: &[Arc<Tolerant<ResourceSlice>>],
    driver: &str,
) -> Vec<crate::index::NodeInfo> {
    let mut witnesses = crate::dra::slices::witnesses(slices, driver);
    for node in &mut nodes {
        if let Some(w) = witnesses.remove(&node.name) {
            *node = node.clone().with_driver(w);
        }
    }
    for (name, w) in witnesses {
        nodes.push(crate::index::NodeInfo::new(name, BTreeMap::new(), None).with_driver(w));
    }
    nodes
}

/// DeepSpeed configs from `NAME=PATH` arguments (NAME: the ConfigMap the job references).
pub fn deepspeed_configs_from_files(
    args: &[String],
) -> Result<BTreeMap<String, String>, ExplainError> {
    files_by_config_map("--deepspeed-config", args)
}

/// Models' `config.json` from `NAME=PATH` arguments (NAME: the ConfigMap the job references in
/// `spec.model.configMapRef`).
pub fn model_configs_from_files(args: &[String]) -> Result<BTreeMap<String, String>, ExplainError> {
    files_by_config_map("--model-config", args)
}

fn files_by_config_map(
    flag: &str,
    args: &[String],
) -> Result<BTreeMap<String, String>, ExplainError> {
    args.iter()
        .map(|a| {
            let (name, path) = a.split_once('=').ok_or_else(|| {
                ExplainError::Manifest(format!(
                    "{flag} {a}: use CONFIGMAP=PATH (the ConfigMap the job references)"
                ))
            })?;
            let text = read_bounded(std::path::Path::new(path), MAX_INPUT_BYTES)
                .map_err(|e| ExplainError::Manifest(format!("reading {e}")))?;
            Ok((name.to_string(), text))
        })
        .collect()
}

/// A list the API server does not serve (404) reads as nothing.
fn ignore_absent<T>(r: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match r {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        other => other.map(Some),
    }
}

/// The ResourceClaimTemplates of the manifests' namespaces, by namespace and name.
async fn claim_templates_of(
    client: &kube::Client,
    manifests: &[Value],
) -> Result<BTreeMap<(String, String), Arc<ResourceClaimTemplate>>, kube::Error> {
    use kube::api::{Api, ListParams};
    let mut claim_templates = BTreeMap::new();
    let namespaces: std::collections::BTreeSet<&str> = manifests.iter().map(namespace_of).collect();
    for ns in namespaces {
        let listed = ignore_absent(
            Api::<ResourceClaimTemplate>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await,
        )?;
        for t in listed.map(|l| l.items).unwrap_or_default() {
            let name = t.metadata.name.clone().unwrap_or_default();
            claim_templates.insert((ns.to_string(), name), Arc::new(t));
        }
    }
    Ok(claim_templates)
}

/// A manifest's namespace (`default` where it names none).
fn namespace_of(manifest: &Value) -> &str {
    manifest
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default")
}

/// The texts of the DeepSpeed and model ConfigMaps the manifests reference, by ConfigMap name
/// (what is missing is said when the job is decided).
#[allow(clippy::type_complexity)]
async fn referenced_configs(
    client: &kube::Client,
    manifests: &[Value],
) -> Result<(BTreeMap<String, String>, BTreeMap<String, String>), kube::Error> {
    let mut deepspeed_configs = BTreeMap::new();
    let mut model_configs = BTreeMap::new();
    for m in manifests {
        let ns = namespace_of(m);
        let (deepspeed, model) = Reference::of_json(m);
        for (r, into) in [
            (deepspeed, &mut deepspeed_configs),
            (model, &mut model_configs),
        ] {
            let Some(r) = r else { continue };
            if let crate::decision::referenced::Fetched::Found(cm) =
                crate::cluster::referenced::fetch(client, ns, &r).await?
                && let Ok(text) = crate::decision::model::model_config::config_map_key(&cm, &r.key)
            {
                into.insert(r.name, text);
            }
        }
    }
    Ok((deepspeed_configs, model_configs))
}

/// Profiles, nodes and the jobs' DeepSpeed ConfigMaps from the current cluster.
pub async fn inputs_from_cluster(
    client: &kube::Client,
    manifests: &[Value],
    render: RenderOptions,
) -> Result<Inputs, kube::Error> {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, ListParams};
    let profiles = Api::<offload_api::v1alpha1::OffloadProfile>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), p.spec))
        .collect();
    let nodes: Vec<crate::index::NodeInfo> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(crate::index::node_info)
        .collect();
    // DRA, where the cluster serves it: the driver's slices and the jobs' claim templates.
    let dra = crate::dra::DraOptions::default();
    let slices: Vec<Arc<Tolerant<ResourceSlice>>> = ignore_absent(
        Api::<Tolerant<ResourceSlice>>::all(client.clone())
            .list(&ListParams::default().fields(&format!("spec.driver={}", dra.driver)))
            .await,
    )?
    .map(|l| l.items.into_iter().map(Arc::new).collect())
    .unwrap_or_default();
    let nodes = with_slices(nodes, &slices, &dra.driver);
    let claim_templates = claim_templates_of(client, manifests).await?;
    let (deepspeed_configs, model_configs) = referenced_configs(client, manifests).await?;
    Ok(Inputs {
        view: MemoryView {
            profiles,
            nodes: Arc::new(NodeIndex::new(nodes)),
            render,
            dra: Some(dra),
            claim_templates,
            ..MemoryView::default()
        },
        deepspeed_configs,
        model_configs,
    })
}
