//! The fit step: the job's memory model against each node class, how many of its pods a class
//! holds at once, and the fastest placement of its training state that runs there.
//!
//! The order of placements, fastest first (measured on an H200, `docs/benchmarks/memory-h200.md`):
//! no offload; a partial offload of the optimizer state up to
//! [`PARTIAL_BEFORE_PARAMS_UP_TO`]; optimizer state and parameters (ZeRO-3 copy offload, FSDP);
//! a larger partial share; all optimizer state.

use super::ResolveError;
use super::candidates::ClassNodes;
use super::framework::{FrameworkFacts, partial_ratio_support};
use super::memory::{
    ClassMemory, Estimate, Fit, JobMemory, PARTIAL_BEFORE_PARAMS_UP_TO, Placement, Sharding, gib,
};
use super::request::JobRequest;
use super::settings::MIN_AUTO_RATIO;
use super::shape::{self, Block, Experts, ModelShape};
use super::user_config::Precision;
use offload_api::quantity::MAX_PARAMETERS;
use offload_api::v1alpha1::{Framework, ModelArchitecture, ModelHints, NodeClass};

/// Largest data-parallel size the advice looks at.
const MAX_ADVISED_RANKS: u64 = 4096;

/// The placement chosen for a class, with its figures.
#[derive(Clone, Debug)]
pub(super) struct MemoryChoice {
    pub(super) placement: Placement,
    pub(super) estimate: Estimate,
    pub(super) class: ClassMemory,
    /// The figures in a sentence.
    pub(super) figures: String,
}

/// Every placement tried on a class, and why none fits.
#[derive(Clone, Debug, Default)]
pub(super) struct Tried(pub(super) Vec<(Placement, Estimate, Fit)>);

/// What the framework, the version and the job's explicit settings allow.
#[derive(Clone, Debug)]
pub(super) struct Allowed {
    /// Nothing offloaded.
    pub(super) no_offload: bool,
    /// Any offload.
    pub(super) offload: bool,
    /// A partial ratio: fixed by the job or profile, free (`Auto`), or not possible.
    pub(super) partial: PartialRatio,
    /// All optimizer state, parameters kept on the GPU.
    pub(super) whole_optimizer: bool,
    /// Optimizer state and parameters.
    pub(super) with_params: bool,
}

/// What partial offload may be.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum PartialRatio {
    /// The smallest share that fits, at least this floor.
    Free(f64),
    /// Exactly this share (the job's or profile's `offloadRatio`).
    Fixed(f64),
    /// Not possible, and why.
    No(String),
}

/// The `spec.model` fields and the annotations that carry them on other kinds.
const HINT_ANNOTATIONS: &[(&str, &str)] = &[
    (
        "spec.model.parameters",
        offload_api::names::ANNOTATION_MODEL_PARAMETERS,
    ),
    (
        "spec.model.tokensPerStep",
        offload_api::names::ANNOTATION_TOKENS_PER_STEP,
    ),
    (
        "spec.model.hiddenSize",
        offload_api::names::ANNOTATION_HIDDEN_SIZE,
    ),
    ("spec.model.layers", offload_api::names::ANNOTATION_LAYERS),
    (
        "spec.model.intermediateSize",
        offload_api::names::ANNOTATION_INTERMEDIATE_SIZE,
    ),
    (
        "spec.model.attentionHeads",
        offload_api::names::ANNOTATION_ATTENTION_HEADS,
    ),
    (
        "spec.model.keyValueHeads",
        offload_api::names::ANNOTATION_KEY_VALUE_HEADS,
    ),
    (
        "spec.model.headDim",
        offload_api::names::ANNOTATION_HEAD_DIM,
    ),
    (
        "spec.model.vocabSize",
        offload_api::names::ANNOTATION_VOCAB_SIZE,
    ),
    (
        "spec.model.experts.perToken",
        offload_api::names::ANNOTATION_EXPERTS_PER_TOKEN,
    ),
    (
        "spec.model.experts.count",
        offload_api::names::ANNOTATION_EXPERTS,
    ),
    (
        "spec.model.experts.shared",
        offload_api::names::ANNOTATION_SHARED_EXPERTS,
    ),
    (
        "spec.model.experts.intermediateSize",
        offload_api::names::ANNOTATION_EXPERT_INTERMEDIATE_SIZE,
    ),
    (
        "spec.model.architecture",
        offload_api::names::ANNOTATION_ARCHITECTURE,
    ),
    (
        "spec.model.configMapRef",
        offload_api::names::ANNOTATION_MODEL_CONFIG,
    ),
    ("spec.model", "the model annotations"),
];

/// The memory model of a job, or `None` without model hints. Hints that cannot be true are an
/// error that names where they came from: the `spec.model` field, or the annotation.
pub(super) fn job_memory(
    job: &JobRequest,
    facts: &FrameworkFacts,
    profile: &str,
) -> Result<Option<JobMemory>, ResolveError> {
    let mut jm = match unlearned_memory(job, facts)? {
        Some(jm) => jm,
        None => match inferred_memory(job, facts, profile)? {
            Some(jm) => jm,
            None => return Ok(None),
        },
    };
    if let Some(view) = job.learned.as_ref() {
        for class in [NodeClass::Coherent, NodeClass::Discrete] {
            if let Some(f) = view.memory.factors(profile, class, &jm.shape_key, view.now) {
                jm.learned.insert(class, f);
            }
        }
    }
    Ok(Some(jm))
}

/// The memory model of a job from its hints alone (nothing learned applied), its shape key set;
/// `None` without hints.
pub(super) fn unlearned_memory(
    job: &JobRequest,
    facts: &FrameworkFacts,
) -> Result<Option<JobMemory>, ResolveError> {
    let jm = job_memory_of(job, facts).map_err(|e| match e {
        ResolveError::InvalidModelHints { detail } if job.hints_from_annotations => {
            let mut detail = detail;
            for (field, annotation) in HINT_ANNOTATIONS {
                // `spec.model` as a whole is "the model annotations", not one annotation.
                let words = if annotation.starts_with("the ") {
                    (*annotation).to_string()
                } else {
                    format!("annotation {annotation}")
                };
                detail = detail.replace(field, &words);
            }
            ResolveError::InvalidModelHints { detail }
        }
        other => other,
    })?;
    Ok(jm.map(|mut jm| {
        jm.shape_key = shape_key(job, &jm, facts);
        jm
    }))
}

/// A job without hints sized as if it had `parameters` (a typical decoder of that size, the
/// step's activations unknown), keyed by the job's identity.
pub(super) fn sized_as(
    job: &JobRequest,
    facts: &FrameworkFacts,
    parameters: f64,
) -> Option<JobMemory> {
    let identity = job.identity.as_deref()?;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let count =
        offload_api::quantity::ParameterCount::new(parameters.ceil().max(1.0) as u64).ok()?;
    let sized = JobRequest {
        model: Some(ModelHints {
            parameters: Some(count),
            ..ModelHints::default()
        }),
        model_config: None,
        hints_from_annotations: false,
        ..job.clone()
    };
    let mut jm = job_memory_of(&sized, facts).ok()??;
    jm.shape_key = identity_key(job, facts, identity);
    jm.inferred = true;
    Some(jm)
}

/// For a job without hints whose earlier runs were observed: the model of the size their peaks
/// show.
fn inferred_memory(
    job: &JobRequest,
    facts: &FrameworkFacts,
    profile: &str,
) -> Result<Option<JobMemory>, ResolveError> {
    let (Some(identity), Some(view)) = (job.identity.as_deref(), job.learned.as_ref()) else {
        return Ok(None);
    };
    let key = identity_key(job, facts, identity);
    let parameters = [NodeClass::Coherent, NodeClass::Discrete]
        .into_iter()
        .filter_map(|c| view.memory.factors(profile, c, &key, view.now))
        .filter_map(|f| f.parameters)
        .reduce(f64::max);
    Ok(parameters.and_then(|p| sized_as(job, facts, p)))
}

/// The key what is learned of a job without hints is kept under: its identity, framework,
/// sharding and precision.
pub(super) fn identity_key(job: &JobRequest, facts: &FrameworkFacts, identity: &str) -> String {
    use sha2::Digest;
    let text = format!(
        "id1|{:?}|stage {}|{:?}|{identity}",
        job.framework.name, facts.stage, job.config.precision
    );
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The key what was learned about a job is kept under: a digest of what sizes its memory apart
/// from where its state is placed (the framework and its sharding, the precision, the model's
/// parameters and shape, the tokens per micro-batch, checkpointing). Stable across releases.
fn shape_key(job: &JobRequest, jm: &JobMemory, facts: &FrameworkFacts) -> String {
    use sha2::Digest;
    let text = format!(
        "v1|{:?}|stage {}|{}|{:.0}|{}|{:?}|{}",
        job.framework.name,
        facts.stage,
        jm.value_bytes,
        jm.parameters,
        jm.shape.describe(),
        jm.tokens,
        jm.checkpointing
    );
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

fn job_memory_of(
    job: &JobRequest,
    facts: &FrameworkFacts,
) -> Result<Option<JobMemory>, ResolveError> {
    let Some(hints) = job.model.as_ref() else {
        return Ok(None);
    };
    let bad = |detail: String| ResolveError::InvalidModelHints { detail };
    let bounded = |name: &str, v: Option<i64>, max: i64| -> Result<Option<f64>, ResolveError> {
        match v {
            None => Ok(None),
            #[allow(clippy::cast_precision_loss)]
            Some(n) if (1..=max).contains(&n) => Ok(Some(n as f64)),
            Some(n) => Err(bad(format!(
                "spec.model.{name} {n} is out of range: use a whole number from 1 to {max}"
            ))),
        }
    };
    let tokens = bounded("tokensPerStep", hints.tokens_per_step, 1_000_000_000_000)?;
    let shape = model_shape(hints, job.model_config.as_ref())?;
    #[allow(clippy::cast_precision_loss)]
    let counted = shape.known.then(|| shape.parameters());
    let parameters = match (hints.parameters.map(|p| p.get()), counted) {
        (Some(0), _) => {
            return Err(bad(
                "spec.model.parameters 0 is not a model size: give the model's total parameters, e.g. 8B".into(),
            ));
        }
        #[allow(clippy::cast_precision_loss)]
        (Some(p), Some(c)) => {
            let given = p as f64;
            if given > 2.0 * c || 2.0 * given < c {
                return Err(bad(format!(
                    "spec.model.parameters {} disagrees with the {:.2}B the model's shape has ({}): fix one of them",
                    hints.parameters.map(|p| p.to_string()).unwrap_or_default(),
                    c / 1e9,
                    shape.describe()
                )));
            }
            // The larger of the two: extra modules the shape does not name still train.
            given.max(c)
        }
        #[allow(clippy::cast_precision_loss)]
        (Some(p), None) => p as f64,
        (None, Some(c)) => c,
        (None, None) => {
            return Err(bad(
                "spec.model needs parameters, or a shape to count them from (configMapRef, or hiddenSize and layers)".into(),
            ));
        }
    };
    #[allow(clippy::cast_precision_loss)]
    if !(1.0..=MAX_PARAMETERS as f64).contains(&parameters) {
        return Err(bad(format!(
            "spec.model describes {:.3e} parameters, more than any model has (at most {MAX_PARAMETERS}): check the shape",
            parameters
        )));
    }
    let ranks = job.gpu_demand().max(1);
    #[allow(clippy::cast_precision_loss)]
    let accumulation = job.config.gradient_accumulation.unwrap_or(1).max(1) as f64;
    #[allow(clippy::cast_precision_loss)]
    Ok(Some(JobMemory {
        parameters,
        shape,
        tokens: tokens.map(|t| (t / accumulation).ceil().max(1.0)),
        checkpointing: hints.activation_checkpointing.unwrap_or(false),
        ranks,
        gpus_per_pod: u64::from(job.gpus_per_pod.max(1)),
        pods: u64::from(job.pods.max(1)),
        sharding: match job.framework.name {
            Framework::DeepSpeed => Sharding::Zero(facts.stage),
            Framework::Fsdp => Sharding::Fsdp,
            Framework::Generic => Sharding::Unsharded,
        },
        value_bytes: match job.config.precision {
            Some(Precision::Fp32) => 4.0,
            _ => 2.0,
        },
        pod_memory_limit: job.pod_memory_limit,
        sub_group_size: job.config.sub_group_size.map(|g| g as f64),
        corrections: super::memory::Corrections::from_failures(&job.memory_failures),
        shape_key: String::new(),
        learned: std::collections::BTreeMap::new(),
        inferred: false,
    }))
}

/// The model's shape: the `config.json`'s where the job references one (the hints' shape fields
/// must agree with it), else the hints' (known when they give width, layers and MLP size), else
/// a typical decoder of the parameter count.
fn model_shape(
    hints: &ModelHints,
    config: Option<&ModelShape>,
) -> Result<ModelShape, ResolveError> {
    let bad = |detail: String| ResolveError::InvalidModelHints { detail };
    let field = |name: &str, v: Option<i64>, max: i64| -> Result<Option<f64>, ResolveError> {
        match v {
            None => Ok(None),
            #[allow(clippy::cast_precision_loss)]
            Some(n) if (1..=max).contains(&n) => Ok(Some(n as f64)),
            Some(n) => Err(bad(format!(
                "spec.model.{name} {n} is out of range: use a whole number from 1 to {max}"
            ))),
        }
    };
    let hidden = field("hiddenSize", hints.hidden_size, 1_000_000)?;
    let layers = field("layers", hints.layers, 100_000)?;
    let intermediate = field("intermediateSize", hints.intermediate_size, 10_000_000)?;
    let heads = field("attentionHeads", hints.attention_heads, 100_000)?;
    let kv_heads = field("keyValueHeads", hints.key_value_heads, 100_000)?;
    let head_dim = field("headDim", hints.head_dim, 100_000)?;
    let vocab = field("vocabSize", hints.vocab_size, 100_000_000)?;
    let block = hints.architecture.map(|a| match a {
        ModelArchitecture::Llama => Block::Gated,
        ModelArchitecture::Gpt => Block::Plain,
    });
    if let Some(c) = config {
        // Every shape field the hints give must say what the config says.
        let agree = |name: &str, hint: Option<f64>, cfg: f64| match hint {
            Some(h) if (h - cfg).abs() > 0.5 => Err(bad(format!(
                "spec.model.{name} {h} disagrees with the model's config.json ({cfg}): remove it or fix the ConfigMap"
            ))),
            _ => Ok(()),
        };
        agree("hiddenSize", hidden, c.hidden)?;
        agree("layers", layers, c.layers)?;
        agree("intermediateSize", intermediate, c.intermediate)?;
        agree("attentionHeads", heads, c.heads)?;
        agree("keyValueHeads", kv_heads, c.kv_heads)?;
        agree("headDim", head_dim, c.head_dim)?;
        agree("vocabSize", vocab, c.vocab)?;
        if let Some(r) = hints.rotary_embeddings
            && r != c.rotary
            && c.block == Block::Plain
        {
            return Err(bad(format!(
                "spec.model.rotaryEmbeddings {r} disagrees with the model's config.json (its positions are {}): remove it or fix the ConfigMap",
                if c.rotary { "rotary" } else { "not rotary" }
            )));
        }
        if let Some(b) = block
            && b != c.block
        {
            return Err(bad(format!(
                "spec.model.architecture disagrees with the model's config.json ({}): remove it or fix the ConfigMap",
                c.block
            )));
        }
        return Ok(*c);
    }
    let experts = match hints.experts {
        None => None,
        Some(e) => {
            let count = field("experts.count", Some(e.count), 1_000_000)?.unwrap_or(1.0);
            let per_token = field("experts.perToken", Some(e.per_token), 1_000_000)?.unwrap_or(1.0);
            if per_token > count {
                return Err(bad(format!(
                    "spec.model.experts.perToken {per_token} is more than spec.model.experts.count {count}"
                )));
            }
            let shared = match e.shared {
                None | Some(0) => 0.0,
                s => field("experts.shared", s, 1_000_000)?.unwrap_or(0.0),
            };
            Some((
                count,
                per_token,
                shared,
                field("experts.intermediateSize", e.intermediate_size, 10_000_000)?,
            ))
        }
    };
    let vocab_or_default = vocab.unwrap_or(shape::DEFAULT_VOCAB);
    #[allow(clippy::cast_precision_loss)]
    let Some(hidden_given) = hidden else {
        let p = hints.parameters.map_or(1.0, |p| p.get() as f64);
        return Ok(ModelShape::typical(p, None, layers, vocab_or_default));
    };
    let block = block.unwrap_or(Block::Gated);
    let heads = heads.unwrap_or_else(|| (hidden_given / 128.0).round().max(1.0));
    let kv_heads = kv_heads.unwrap_or(match block {
        Block::Gated => heads.min(8.0),
        Block::Plain => heads,
    });
    if kv_heads > heads || heads % kv_heads != 0.0 {
        return Err(bad(format!(
            "spec.model.keyValueHeads {kv_heads} must divide spec.model.attentionHeads {heads}"
        )));
    }
    let intermediate_known = intermediate.is_some() || block == Block::Plain;
    let intermediate = intermediate.unwrap_or(match block {
        Block::Gated => 3.5 * hidden_given,
        Block::Plain => 4.0 * hidden_given,
    });
    let Some(layers) = layers else {
        #[allow(clippy::cast_precision_loss)]
        let p = hints.parameters.map_or(1.0, |p| p.get() as f64);
        return Ok(ModelShape::typical(
            p,
            Some(hidden_given),
            None,
            vocab_or_default,
        ));
    };
    Ok(ModelShape {
        block,
        hidden: hidden_given,
        layers,
        intermediate,
        heads,
        kv_heads,
        head_dim: head_dim.unwrap_or(hidden_given / heads),
        vocab: vocab_or_default,
        tied: hints.tied_embeddings.unwrap_or(false),
        attention_bias: block == Block::Plain,
        positions: 0.0,
        rotary: hints.rotary_embeddings.unwrap_or(true),
        experts: experts.map(|(count, per_token, shared, size)| Experts {
            count,
            per_token,
            intermediate: size.unwrap_or(intermediate),
            shared,
            shared_intermediate: size.unwrap_or(intermediate),
            dense_layers: 0.0,
        }),
        known: intermediate_known && vocab.is_some(),
        standing: super::shape::TypeStanding::Counted,
    })
}

/// The sizes of a class's GPUs, smallest first, each once.
struct GpuSizes {
    sizes: Vec<u64>,
}

/// What a class's nodes have of memory: the smallest GPU (the first node by name with it), and
/// each node's allocatable host memory by its count of GPUs (memory, then name, ascending).
struct NodeMemory {
    smallest_gpu: Option<(String, u64)>,
    host_by_gpus: Vec<(u64, Vec<(u64, String)>)>,
}

impl NodeMemory {
    fn of(nodes: &mut dyn Iterator<Item = &crate::index::NodeInfo>) -> NodeMemory {
        let mut smallest_gpu: Option<(String, u64)> = None;
        let mut by_gpus: std::collections::BTreeMap<u64, Vec<(u64, String)>> = Default::default();
        for n in nodes {
            if let Some(m) = n.gpu_memory()
                && smallest_gpu.as_ref().is_none_or(|(_, s)| m < *s)
            {
                smallest_gpu = Some((n.name.clone(), m));
            }
            if let Some(memory) = n.allocatable.memory {
                by_gpus
                    .entry(u64::from(n.gpu_count()))
                    .or_default()
                    .push((memory, n.name.clone()));
            }
        }
        let host_by_gpus = by_gpus
            .into_iter()
            .map(|(g, mut nodes)| {
                nodes.sort();
                (g, nodes)
            })
            .collect();
        NodeMemory {
            smallest_gpu,
            host_by_gpus,
        }
    }
}

/// Pods of `gpus_per_pod` GPUs the class's nodes hold at once.
pub(super) fn pod_capacity(class: &ClassNodes, gpus_per_pod: u32) -> u64 {
    class.pod_capacity(gpus_per_pod)
}

/// How fast a placement runs, for comparing choices (lower is faster), in [`fastest`]'s order.
fn speed_rank(p: Placement) -> (u8, u32) {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let hundredths = |r: f64| (r * 100.0).round() as u32;
    match p {
        Placement::NoOffload => (0, 0),
        Placement::PartialOptimizer(r) if r <= PARTIAL_BEFORE_PARAMS_UP_TO => (1, hundredths(r)),
        Placement::OptimizerAndParams => (2, 0),
        Placement::PartialOptimizer(r) => (3, hundredths(r)),
        Placement::Optimizer => (4, 0),
    }
}

/// The fastest placement that fits on `class` for a job whose GPUs come through DRA claims:
/// its claims can select GPUs by memory, so each size of GPU the class has is tried with the
/// nodes that have at least that much (when they hold the job), and the fastest choice wins —
/// the widest set of nodes where two are as fast. Device-plugin GPUs cannot be chosen by size:
/// the class's smallest GPU sizes the job.
pub(super) fn fastest_by_gpu_size(
    jm: &JobMemory,
    class: &ClassNodes,
    job: &JobRequest,
    allowed: &Allowed,
    holds: &dyn Fn(&ClassNodes) -> bool,
) -> Option<(ClassMemory, Result<MemoryChoice, Tried>)> {
    let widest = class_memory(class, job)?;
    let first = fastest(jm, &widest, allowed);
    if job.gpu_claims.is_none() {
        return Some((widest, first));
    }
    let sizes = class.fact(|nodes| GpuSizes {
        sizes: {
            let mut sizes: Vec<u64> = nodes.filter_map(|n| n.gpu_memory()).collect();
            sizes.sort_unstable();
            sizes.dedup();
            sizes
        },
    });
    let mut best = (widest, first);
    for &size in sizes.sizes.iter().skip(1) {
        let tier = class.subset(|n| n.gpu_memory().is_some_and(|m| m >= size));
        if !holds(&tier) {
            break;
        }
        let Some(cm) = class_memory(&tier, job) else {
            continue;
        };
        if let Ok(mut choice) = fastest(jm, &cm, allowed) {
            let better = match &best.1 {
                Ok(b) => speed_rank(choice.placement) < speed_rank(b.placement),
                Err(_) => true,
            };
            if better {
                choice.figures.push_str(&format!(
                    "; on the GPUs of {} or more only ({} of the class's {} nodes): the job's DRA claims select GPUs by memory",
                    gib(as_f64(size)),
                    tier.len(),
                    class.len()
                ));
                best = (cm, Ok(choice));
            }
        }
    }
    Some(best)
}

fn as_f64(n: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let v = n as f64;
    v
}

/// The class's memory figures for the job: its smallest GPU, and the least host memory a pod
/// of the job gets on any of its nodes. `None` when no node reports its GPUs' memory.
pub(super) fn class_memory(class: &ClassNodes, job: &JobRequest) -> Option<ClassMemory> {
    let memory = class.fact(NodeMemory::of);
    let (gpu_node, gpu_bytes) = memory.smallest_gpu.as_ref()?;
    let (gpu_node, gpu_bytes) = (gpu_node.as_str(), *gpu_bytes);
    let per = u64::from(job.gpus_per_pod.max(1));
    let pods = u64::from(job.pods.max(1));
    // The least host memory a pod gets: per count of GPUs on a node, the nodes' memory sorted,
    // so only the few smallest of each count are looked at; the first node by name of those
    // with the least share, as a walk of every node would find it.
    let host = memory
        .host_by_gpus
        .iter()
        .filter_map(|(gpus, nodes)| {
            let sharing = (*gpus / per).clamp(1, pods);
            let least = nodes.first()?.0 / sharing;
            // Every node of this count whose share is that least share (integer division).
            let bound = least.saturating_add(1).saturating_mul(sharing);
            nodes
                .iter()
                .take_while(|(m, _)| *m < bound)
                .min_by(|a, b| a.1.cmp(&b.1))
                .map(|(m, name)| (name.as_str(), *m, sharing, least))
        })
        .min_by(|a, b| a.3.cmp(&b.3).then_with(|| a.0.cmp(b.0)));
    #[allow(clippy::cast_precision_loss)]
    let (host_per_pod, host_node) = match host {
        Some((name, memory, sharing, share)) => (
            Some(share),
            format!(
                "{name}: {} allocatable for {sharing} pod{}",
                gib(memory as f64),
                if sharing == 1 { "" } else { "s" }
            ),
        ),
        None => (None, String::new()),
    };
    Some(ClassMemory {
        gpu_bytes,
        gpu_node: gpu_node.to_string(),
        host_per_pod,
        host_node,
        class: Some(class.class),
    })
}

/// What may be placed where, from the framework, its version and stage, the class, and the
/// job's and profile's explicit settings (`fixed_ratio`: a ratio they state).
pub(super) fn allowed(
    job: &JobRequest,
    facts: &FrameworkFacts,
    class: NodeClass,
    no_offload: bool,
    offload: bool,
    fixed_ratio: Option<f64>,
) -> Allowed {
    let partial = match (partial_ratio_support(job, facts), fixed_ratio) {
        (_, Some(r)) if r >= 1.0 => PartialRatio::No("the ratio is 1".into()),
        // Parameters offloaded with only part of the optimizer state is not a placement the
        // memory model sizes (nor one measured): asking for parameters asks for all of it.
        _ if job.framework.name == Framework::DeepSpeed
            && job.deepspeed.offload_params == Some(true) =>
        {
            PartialRatio::No("deepspeed.offloadParams offloads all optimizer state".into())
        }
        (Ok(()), Some(r)) => PartialRatio::Fixed(r),
        (Ok(()), None) => PartialRatio::Free(MIN_AUTO_RATIO),
        (Err(why), _) => PartialRatio::No(why),
    };
    let (whole_optimizer, with_params) = match job.framework.name {
        Framework::DeepSpeed => {
            let asked = job.deepspeed.offload_params;
            let stage3 = facts.stage == 3;
            (
                facts.stage >= 1 && asked != Some(true),
                // Parameters too only at ZeRO-3; on coherent nodes only when asked (measured on
                // a PCIe node only).
                stage3
                    && asked != Some(false)
                    && (class == NodeClass::Discrete || asked == Some(true)),
            )
        }
        // FSDP's CPU offload moves parameters, gradients and optimizer state together.
        Framework::Fsdp => (false, true),
        Framework::Generic => (true, false),
    };
    let whole_ok = fixed_ratio.is_none_or(|r| r >= 1.0);
    Allowed {
        no_offload,
        offload,
        partial: if offload {
            partial
        } else {
            PartialRatio::No("offload is off".into())
        },
        whole_optimizer: offload && whole_optimizer && whole_ok,
        with_params: offload && with_params && whole_ok,
    }
}

/// What the estimate counted the model as, for reasons.
fn model_note(jm: &JobMemory) -> String {
    if jm.shape.known {
        format!(
            " (model counted as {:.2}B parameters, {})",
            jm.parameters / 1e9,
            jm.shape.describe()
        )
    } else {
        format!(
            " (model: {:.2}B parameters; its shape is not given, so a typical decoder of that size is assumed: spec.model.configMapRef or the shape fields make the estimate exact)",
            jm.parameters / 1e9
        )
    }
}

/// The fastest placement `allowed` on `class` that fits, or everything tried.
pub(super) fn fastest(
    jm: &JobMemory,
    class: &ClassMemory,
    allowed: &Allowed,
) -> Result<MemoryChoice, Tried> {
    let mut tried = Tried::default();
    let choice = |placement: Placement, estimate: Estimate| MemoryChoice {
        placement,
        figures: {
            let mut figures = jm.describe(&estimate, class);
            if let Some(close) = jm.close_to_limit(&estimate, class) {
                figures.push_str("; ");
                figures.push_str(&close);
            }
            figures.push_str(&model_note(jm));
            figures
        },
        estimate,
        class: class.clone(),
    };
    let try_fixed = |placement: Placement, tried: &mut Tried| {
        let (est, fit) = jm.estimate_checked(placement, class);
        tried.0.push((placement, est, fit));
        fit.ok().then_some(est)
    };
    if allowed.no_offload
        && let Some(est) = try_fixed(Placement::NoOffload, &mut tried)
    {
        return Ok(choice(Placement::NoOffload, est));
    }
    if !allowed.offload {
        return Err(tried);
    }
    let partial = match &allowed.partial {
        PartialRatio::Free(floor) => jm.smallest_ratio(class, *floor),
        PartialRatio::Fixed(r) => {
            try_fixed(Placement::PartialOptimizer(*r), &mut tried).map(|est| (*r, est))
        }
        PartialRatio::No(_) => None,
    };
    if let Some((r, est)) = partial
        && r <= PARTIAL_BEFORE_PARAMS_UP_TO
    {
        return Ok(choice(Placement::PartialOptimizer(r), est));
    }
    if allowed.with_params
        && let Some(est) = try_fixed(Placement::OptimizerAndParams, &mut tried)
    {
        return Ok(choice(Placement::OptimizerAndParams, est));
    }
    if let Some((r, est)) = partial {
        return Ok(choice(Placement::PartialOptimizer(r), est));
    }
    if matches!(allowed.partial, PartialRatio::Free(_)) {
        // Record what the largest partial share would need, for the message.
        let (est, fit) = jm.estimate_checked(Placement::PartialOptimizer(0.99), class);
        tried.0.push((Placement::PartialOptimizer(0.99), est, fit));
    }
    if allowed.whole_optimizer
        && let Some(est) = try_fixed(Placement::Optimizer, &mut tried)
    {
        return Ok(choice(Placement::Optimizer, est));
    }
    Err(tried)
}

impl Tried {
    /// What each placement tried needs, in one sentence.
    pub(super) fn describe(&self, jm: &JobMemory, class: &ClassMemory) -> String {
        self.0
            .iter()
            .map(|(p, est, fit)| {
                let short = match (fit.gpu, fit.host) {
                    (false, false) => "GPU and host memory too small",
                    (false, true) => "GPU memory too small",
                    (true, false) => "host memory too small",
                    (true, true) => "fits",
                };
                format!("{p} {} ({short})", jm.describe(est, class))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// What would make a job that fits nowhere fit: more GPUs, ZeRO-3, a smaller micro-batch, a
/// larger pod limit, on `class` (the class with the largest GPUs).
pub(super) fn advice(jm: &JobMemory, class: &ClassMemory, allowed: &Allowed) -> String {
    let mut ideas = Vec::new();
    if let Sharding::Zero(stage @ 0..=2) = jm.sharding {
        let z3 = JobMemory {
            sharding: Sharding::Zero(3),
            ..jm.clone()
        };
        let z3_allowed = Allowed {
            partial: match allowed.partial {
                PartialRatio::No(_) if allowed.offload => PartialRatio::Free(MIN_AUTO_RATIO),
                ref p => p.clone(),
            },
            with_params: allowed.offload,
            ..allowed.clone()
        };
        if let Ok(c) = fastest(&z3, class, &z3_allowed) {
            ideas.push(format!(
                "ZeRO stage 3 instead of {stage} shards parameters and gradients too: it would fit as {}",
                c.placement
            ));
        }
    }
    let mut ranks = jm.ranks.saturating_mul(2);
    while ranks <= MAX_ADVISED_RANKS {
        let more = jm.with_ranks(ranks);
        if let Ok(c) = fastest(&more, class, allowed) {
            ideas.push(format!(
                "with {ranks} GPUs in all (replicas × GPUs per pod; {} now) it would fit as {}",
                jm.ranks, c.placement
            ));
            break;
        }
        ranks = ranks.saturating_mul(2);
    }
    if let Some(tokens) = jm.tokens
        && tokens > 1.0
    {
        let smaller = jm.with_tokens((tokens / 2.0).ceil());
        if let Ok(c) = fastest(&smaller, class, allowed) {
            ideas.push(format!(
                "half the micro-batch ({} tokens per GPU instead of {}) would fit as {}",
                (tokens / 2.0).ceil(),
                tokens,
                c.placement
            ));
        }
    }
    if !jm.checkpointing && jm.tokens.is_some() {
        let recomputed = JobMemory {
            checkpointing: true,
            ..jm.clone()
        };
        if let Ok(c) = fastest(&recomputed, class, allowed) {
            ideas.push(format!(
                "activation checkpointing (spec.model.activationCheckpointing) would fit as {}",
                c.placement
            ));
        }
    }
    if let Some(limit) = jm.pod_memory_limit {
        let unlimited = JobMemory {
            pod_memory_limit: None,
            ..jm.clone()
        };
        if let Ok(c) = fastest(&unlimited, class, allowed) {
            #[allow(clippy::cast_precision_loss)]
            ideas.push(format!(
                "a pod memory limit above {} ({} now) would fit as {}",
                gib(c.estimate.host_per_pod),
                gib(limit as f64),
                c.placement
            ));
        }
    }
    if ideas.is_empty() {
        "no more GPUs, ZeRO stage or micro-batch found that would fit: it needs nodes with more GPU or host memory".to_string()
    } else {
        ideas.join("; ")
    }
}
