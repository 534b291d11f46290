//! Sizing a job: its memory model from what it says of its model (its `config.json`, the
//! `spec.model` hints or the annotations that carry them) or, for a job without hints, from
//! what its observed runs showed; and the key what is learned about it is kept under.

use super::memory::{JobMemory, Sharding};
use super::shape::{self, Block, Experts, ModelShape};
use crate::decision::ResolveError;
use crate::decision::frameworks::FrameworkFacts;
use crate::decision::frameworks::user_config::Precision;
use crate::decision::request::JobRequest;
use offload_api::hints::{self, CountHint};
use offload_api::quantity::MAX_PARAMETERS;
use offload_api::v1alpha1::{Framework, ModelArchitecture, ModelHints, NodeClass};

/// A whole-number hint of `v`, within its bound ([`hints::COUNT_HINTS`]: the schema's), or an
/// error naming its `spec.model` field (renamed to its annotation for other kinds).
fn count(hint: &CountHint, v: Option<i64>) -> Result<Option<f64>, ResolveError> {
    match v {
        None => Ok(None),
        #[allow(clippy::cast_precision_loss)]
        Some(n) if (hint.min..=hint.max).contains(&n) => Ok(Some(n as f64)),
        Some(n) => Err(ResolveError::InvalidModelHints {
            detail: format!(
                "spec.model.{} {n} is out of range: use a whole number from {} to {}",
                hint.field, hint.min, hint.max
            ),
        }),
    }
}

/// A detail about `spec.model` fields in the words of the annotations that carry them.
fn in_annotation_words(detail: &str) -> String {
    let mut detail = detail.to_string();
    // Longest first: `spec.model.experts.intermediateSize` before `spec.model.experts`.
    let mut rows: Vec<(String, &str)> = hints::COUNT_HINTS
        .iter()
        .map(|h| (format!("spec.model.{}", h.field), h.annotation))
        .chain(
            hints::OTHER_HINTS
                .iter()
                .map(|(f, a)| (format!("spec.model.{f}"), *a)),
        )
        .collect();
    rows.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
    for (field, annotation) in rows {
        detail = detail.replace(&field, &format!("annotation {annotation}"));
    }
    // `spec.model` as a whole is "the model annotations", not one annotation.
    detail.replace("spec.model", "the model annotations")
}

/// The memory model of a job, or `None` without model hints. Hints that cannot be true are an
/// error that names where they came from: the `spec.model` field, or the annotation.
pub(in crate::decision) fn job_memory(
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
            if let Some(f) = view.factors(profile, class, &jm.shape_key) {
                jm.learned.insert(class, f);
            }
            let reserved = view.reserved_trials(profile, class, &jm.shape_key);
            if reserved > 0 {
                jm.reserved_trials.insert(class, reserved);
            }
            let ran = view.evidence(profile, class, &jm.shape_key);
            if !ran.is_empty() {
                jm.ran.insert(class, ran);
            }
        }
        // Runs that trained below the count's floor showed the model's size: the count is
        // corrected to it (a traced model's count is its own).
        let shown = jm
            .learned
            .values()
            .filter_map(|f| f.parameters)
            .reduce(f64::max);
        if let Some(p) = shown.filter(|p| *p < jm.parameters && !jm.inferred && jm.traced.is_none())
        {
            jm.counted_parameters = Some(jm.parameters);
            jm.parameters = p;
        }
    }
    Ok(Some(jm))
}

/// The memory model of a job from its hints alone (nothing learned applied), its shape key set;
/// `None` without hints.
pub(in crate::decision) fn unlearned_memory(
    job: &JobRequest,
    facts: &FrameworkFacts,
) -> Result<Option<JobMemory>, ResolveError> {
    let jm = job_memory_of(job, facts).map_err(|e| match e {
        ResolveError::InvalidModelHints { detail } if job.hints_from_annotations => {
            ResolveError::InvalidModelHints {
                detail: in_annotation_words(&detail),
            }
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
pub(in crate::decision) fn sized_as(
    job: &JobRequest,
    facts: &FrameworkFacts,
    parameters: f64,
) -> Option<JobMemory> {
    let identity = job.identity.as_deref()?;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let count =
        offload_api::quantity::ParameterCount::new(parameters.ceil().max(1.0) as u64).ok()?;
    let sized = job.sized_as(count);
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
        .filter_map(|c| view.factors(profile, c, &key))
        .filter_map(|f| f.parameters)
        .reduce(f64::max);
    Ok(parameters.and_then(|p| sized_as(job, facts, p)))
}

/// The key what is learned of a job without hints is kept under: its identity, framework,
/// sharding and precision.
pub(in crate::decision) fn identity_key(
    job: &JobRequest,
    facts: &FrameworkFacts,
    identity: &str,
) -> String {
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
    let tokens = count(&hints::TOKENS_PER_STEP, hints.tokens_per_step)?;
    let shape = model_shape(hints, job.model_config.as_ref())?;
    let (traced, untraced) = traced_step(job);
    #[allow(clippy::cast_precision_loss)]
    let counted = match &traced {
        Some(t) => Some(t.parameters()),
        None => shape.known.then(|| shape.parameters()),
    };
    let parameters = parameters_of(hints, counted, traced.is_some(), &shape)?;
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
        sharding: sharding_of(job, facts),
        value_bytes: match job.config.precision {
            Some(Precision::Fp32) => 4.0,
            _ => 2.0,
        },
        pod_memory_limit: job.pod_memory_limit,
        pod_memory_limit_source: job.pod_memory_limit_source.clone(),
        sub_group_size: job.config.sub_group_size.map(|g| g as f64),
        corrections: super::memory::Corrections::from_failures(&job.memory_failures),
        shape_key: String::new(),
        learned: std::collections::BTreeMap::new(),
        inferred: false,
        ran: std::collections::BTreeMap::new(),
        reserved_trials: Default::default(),
        traced,
        untraced,
        counted_parameters: None,
        logits_room: true,
        bf16_states: false,
    }))
}

/// The model's parameters: the job's figure checked against what its shape or trace counts
/// (within a factor of two), the larger of the two where only the shape counted (extra modules
/// the shape does not name still train; a trace names every module, so its count is the
/// model's).
fn parameters_of(
    hints: &ModelHints,
    counted: Option<f64>,
    traced: bool,
    shape: &ModelShape,
) -> Result<f64, ResolveError> {
    let bad = |detail: String| ResolveError::InvalidModelHints { detail };
    match (hints.parameters.map(|p| p.get()), counted) {
        (Some(0), _) => Err(bad(
            "spec.model.parameters 0 is not a model size: give the model's total parameters, e.g. 8B".into(),
        )),
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
            Ok(if traced { c } else { given.max(c) })
        }
        #[allow(clippy::cast_precision_loss)]
        (Some(p), None) => Ok(p as f64),
        (None, Some(c)) => Ok(c),
        (None, None) => Err(bad(
            "spec.model needs parameters, or a shape to count them from (configMapRef, or hiddenSize and layers)".into(),
        )),
    }
}

/// How the job's framework shards its training state over its ranks.
fn sharding_of(job: &JobRequest, facts: &FrameworkFacts) -> Sharding {
    match job.framework.name {
        Framework::DeepSpeed => Sharding::Zero(facts.stage),
        Framework::Fsdp => Sharding::Fsdp,
        Framework::Megatron => {
            let tensor = job.megatron.tensor_parallel.unwrap_or(1).max(1);
            let pipeline = job.megatron.pipeline_parallel.unwrap_or(1).max(1);
            Sharding::Megatron {
                tensor,
                model_parallel: tensor.saturating_mul(pipeline),
                distributed: job.megatron.distributed_optimizer != Some(false),
                sequence: job.megatron.sequence_parallel == Some(true),
                unfused_attention: job.megatron.transformer_impl
                    == Some(offload_api::v1alpha1::TransformerImpl::Local),
                first_copy_freed: job.megatron.manual_gc_on(),
            }
        }
        Framework::Generic => Sharding::Unsharded,
    }
}

/// The job's trace as the memory model takes it, or why it has none where one was sought.
fn traced_step(
    job: &JobRequest,
) -> (
    Option<std::sync::Arc<super::memory::Traced>>,
    Option<String>,
) {
    use super::sizer::{SizerRequest, TraceInput};
    match &job.model_trace {
        TraceInput::None => (None, None),
        TraceInput::Untraced(why) => (None, Some(why.clone())),
        TraceInput::Traced(trace) => match SizerRequest::of(job).map(|r| r.accepts(trace)) {
            Some(Ok(())) => (
                Some(std::sync::Arc::new(super::memory::Traced::new(
                    trace.clone(),
                ))),
                None,
            ),
            Some(Err(why)) => (None, Some(why)),
            None => (
                None,
                Some("the job's step cannot be traced (Megatron-core, or no config.json or tokensPerStep): the trace is not used".into()),
            ),
        },
    }
}

/// The model's shape: the `config.json`'s where the job references one (the hints' shape fields
/// must agree with it), else the hints' (known when they give width, layers and MLP size), else
/// a typical decoder of the parameter count.
fn model_shape(
    hints: &ModelHints,
    config: Option<&ModelShape>,
) -> Result<ModelShape, ResolveError> {
    let given = Given::read(hints)?;
    if let Some(c) = config {
        return given.agree_with(hints, c).map(|()| *c);
    }
    let experts = experts_of(hints)?;
    let vocab_or_default = given.vocab.unwrap_or(shape::DEFAULT_VOCAB);
    #[allow(clippy::cast_precision_loss)]
    let parameters = hints.parameters.map_or(1.0, |p| p.get() as f64);
    let Some(hidden) = given.hidden else {
        return Ok(ModelShape::typical(
            parameters,
            None,
            given.layers,
            vocab_or_default,
        ));
    };
    let block = given.block.unwrap_or(Block::Gated);
    let (heads, kv_heads) = given.heads_of(hidden, block)?;
    let intermediate_known = given.intermediate.is_some() || block == Block::Plain;
    let intermediate = given.intermediate.unwrap_or(match block {
        Block::Gated => 3.5 * hidden,
        Block::Plain => 4.0 * hidden,
    });
    let Some(layers) = given.layers else {
        return Ok(ModelShape::typical(
            parameters,
            Some(hidden),
            None,
            vocab_or_default,
        ));
    };
    let shape = ModelShape {
        block,
        hidden,
        layers,
        intermediate,
        heads,
        kv_heads,
        head_dim: given.head_dim.unwrap_or(hidden / heads),
        vocab: vocab_or_default,
        tied: hints.tied_embeddings.unwrap_or(false),
        attention_bias: block == Block::Plain,
        positions: 0.0,
        rotary: hints.rotary_embeddings.unwrap_or(true),
        experts: experts.map(|(count, per_token, shared, size)| {
            Experts::hinted(count, per_token, shared, size.unwrap_or(intermediate))
        }),
        known: intermediate_known && given.vocab.is_some(),
        standing: super::shape::TypeStanding::Counted,
        open: None,
        quirks: super::shape::Quirks::default(),
        tower: None,
        window: None,
        source: None,
    };
    Ok(bounded_by_count(
        shape,
        hints,
        !intermediate_known,
        given.kv_heads.is_none(),
        given.vocab.is_some(),
    ))
}

impl Given {
    /// The attention and key/value heads: as given, else a typical decoder's (128-wide heads;
    /// eight key/value heads for a gated block); the key/value heads must divide the heads.
    fn heads_of(&self, hidden: f64, block: Block) -> Result<(f64, f64), ResolveError> {
        let heads = self
            .heads
            .unwrap_or_else(|| (hidden / 128.0).round().max(1.0));
        let kv_heads = self.kv_heads.unwrap_or(match block {
            Block::Gated => heads.min(8.0),
            Block::Plain => heads,
        });
        if kv_heads > heads || heads % kv_heads != 0.0 {
            return Err(ResolveError::InvalidModelHints {
                detail: format!(
                    "spec.model.keyValueHeads {kv_heads} must divide spec.model.attentionHeads {heads}"
                ),
            });
        }
        Ok((heads, kv_heads))
    }
}

/// The shape fields a job's hints give, each checked against its bound.
struct Given {
    hidden: Option<f64>,
    layers: Option<f64>,
    intermediate: Option<f64>,
    heads: Option<f64>,
    kv_heads: Option<f64>,
    head_dim: Option<f64>,
    vocab: Option<f64>,
    block: Option<Block>,
}

impl Given {
    fn read(hints: &ModelHints) -> Result<Self, ResolveError> {
        Ok(Self {
            hidden: count(&hints::HIDDEN_SIZE, hints.hidden_size)?,
            layers: count(&hints::LAYERS, hints.layers)?,
            intermediate: count(&hints::INTERMEDIATE_SIZE, hints.intermediate_size)?,
            heads: count(&hints::ATTENTION_HEADS, hints.attention_heads)?,
            kv_heads: count(&hints::KEY_VALUE_HEADS, hints.key_value_heads)?,
            head_dim: count(&hints::HEAD_DIM, hints.head_dim)?,
            vocab: count(&hints::VOCAB_SIZE, hints.vocab_size)?,
            block: hints.architecture.map(|a| match a {
                ModelArchitecture::Llama => Block::Gated,
                ModelArchitecture::Gpt => Block::Plain,
            }),
        })
    }

    /// Every shape field the hints give must say what the model's `config.json` says.
    fn agree_with(&self, hints: &ModelHints, c: &ModelShape) -> Result<(), ResolveError> {
        let bad = |detail: String| ResolveError::InvalidModelHints { detail };
        let agree = |name: &str, hint: Option<f64>, cfg: f64| match hint {
            Some(h) if (h - cfg).abs() > 0.5 => Err(bad(format!(
                "spec.model.{name} {h} disagrees with the model's config.json ({cfg}): remove it or fix the ConfigMap"
            ))),
            _ => Ok(()),
        };
        agree("hiddenSize", self.hidden, c.hidden)?;
        agree("layers", self.layers, c.layers)?;
        agree("intermediateSize", self.intermediate, c.intermediate)?;
        agree("attentionHeads", self.heads, c.heads)?;
        agree("keyValueHeads", self.kv_heads, c.kv_heads)?;
        agree("headDim", self.head_dim, c.head_dim)?;
        agree("vocabSize", self.vocab, c.vocab)?;
        if let Some(r) = hints.rotary_embeddings
            && r != c.rotary
            && c.block == Block::Plain
        {
            return Err(bad(format!(
                "spec.model.rotaryEmbeddings {r} disagrees with the model's config.json (its positions are {}): remove it or fix the ConfigMap",
                if c.rotary { "rotary" } else { "not rotary" }
            )));
        }
        if let Some(b) = self.block
            && b != c.block
        {
            return Err(bad(format!(
                "spec.model.architecture disagrees with the model's config.json ({}): remove it or fix the ConfigMap",
                c.block
            )));
        }
        Ok(())
    }
}

/// The hints' experts as (count, per token, shared, expert intermediate size), each bounded.
type GivenExperts = (f64, f64, f64, Option<f64>);

fn experts_of(hints: &ModelHints) -> Result<Option<GivenExperts>, ResolveError> {
    let Some(e) = hints.experts else {
        return Ok(None);
    };
    let total = count(&hints::EXPERTS, Some(e.count))?.unwrap_or(1.0);
    let per_token = count(&hints::EXPERTS_PER_TOKEN, Some(e.per_token))?.unwrap_or(1.0);
    if per_token > total {
        return Err(ResolveError::InvalidModelHints {
            detail: format!(
                "spec.model.experts.perToken {per_token} is more than spec.model.experts.count {total}"
            ),
        });
    }
    let shared = match e.shared {
        None | Some(0) => 0.0,
        s => count(&hints::SHARED_EXPERTS, s)?.unwrap_or(0.0),
    };
    Ok(Some((
        total,
        per_token,
        shared,
        count(&hints::EXPERT_INTERMEDIATE_SIZE, e.intermediate_size)?,
    )))
}

/// A Llama-style shape whose hints leave its MLP size or key/value heads open, where the
/// parameter count and the vocabulary are given: the end of what the count allows that keeps
/// the most for backward, its tensors counted exactly, with the other end kept for reasons
/// (never under at either end). Unchanged where nothing is open or nothing meets the count.
fn bounded_by_count(
    shape: ModelShape,
    hints: &ModelHints,
    free_intermediate: bool,
    free_kv: bool,
    vocab_given: bool,
) -> ModelShape {
    let free_intermediate = free_intermediate && shape.experts.is_none();
    let (Some(p), true, Block::Gated) = (hints.parameters, vocab_given, shape.block) else {
        return shape;
    };
    if !(free_intermediate || free_kv) {
        return shape;
    }
    #[allow(clippy::cast_precision_loss)]
    let ends = shape.ends_for(p.get() as f64, free_intermediate, free_kv);
    let checkpointing = hints.activation_checkpointing.unwrap_or(false);
    let keeps = |s: &ModelShape| s.activation_peak_per_token(checkpointing);
    let Some(most) = ends.iter().max_by(|a, b| keeps(a).total_cmp(&keeps(b))) else {
        return shape;
    };
    let other = ends.iter().find(|e| *e != most).unwrap_or(most);
    ModelShape {
        known: true,
        open: Some(super::shape::OpenShape {
            intermediate: free_intermediate,
            kv_heads: free_kv,
            other_intermediate: other.intermediate,
            other_kv_heads: other.kv_heads,
        }),
        ..*most
    }
}
