//! Megatron-core's part of a TrainingJob: the layout and launch-line settings the memory
//! estimate and Megatron-core's own refusals depend on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Megatron-core specifics: the parallel layout the memory estimate divides the model by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MegatronSpec {
    /// Tensor-parallel size (`--tensor-model-parallel-size`); 1 when unset. Each GPU holds
    /// 1/(tensor × pipeline) of the model; the rest of the job's GPUs are data-parallel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_MODEL_PARALLEL))]
    pub tensor_parallel: Option<u32>,
    /// Pipeline-parallel size (`--pipeline-model-parallel-size`); 1 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_MODEL_PARALLEL))]
    pub pipeline_parallel: Option<u32>,
    /// The distributed optimizer (`--use-distributed-optimizer`): the optimizer state sharded
    /// over the data-parallel ranks. On when unset, and then rendered with the offload flags;
    /// `false` keeps a whole copy of the optimizer state on every data-parallel rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distributed_optimizer: Option<bool>,
    /// Sequence parallelism (`--sequence-parallel`): the activations outside attention and the
    /// MLP split over the tensor-parallel group too. Off when unset, as in Megatron-LM; off,
    /// about a third of each layer's activations are held whole on every tensor-parallel rank,
    /// and the estimate counts them so. The operator reads it; the launch line sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_parallel: Option<bool>,
    /// Megatron-LM's `--transformer-impl`: `TransformerEngine` (its default; fused attention
    /// keeps no sequence² scores) or `Local` (Megatron-core's own modules: each layer's
    /// attention holds its heads' sequence² scores while it runs and in its backward, which
    /// the estimate counts). `TransformerEngine` when unset. The operator reads it; the launch
    /// line sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformer_impl: Option<TransformerImpl>,
    /// Megatron-LM's `--manual-gc`: one garbage collection as training starts, which frees the
    /// hybrid device optimizer's first copy of the parameters (4 bytes a parameter the GPU
    /// keeps, and 4 a parameter it offloads on the host) before the first step. On when unset:
    /// with optimizer offload the operator renders `--manual-gc --manual-gc-interval 100`
    /// (Megatron-Bridge: `train.manual_gc`, `train.manual_gc_interval`) and counts the copy
    /// freed. `false` renders neither and counts the copy: for a launch line whose training
    /// loop is not Megatron-LM's or Megatron-Bridge's, which would not collect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manual_gc: Option<bool>,
    /// Megatron-LM's `--optimizer`: `Adam` (its default, AdamW) when unset. Only `Adam` can be
    /// offloaded: the hybrid device optimizer runs through `--use-precision-aware-optimizer`,
    /// which takes Adam alone. The operator reads it; the launch line sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<MegatronOptimizer>,
    /// Megatron-LM's `--fp8-param-gather` (parameters gathered in FP8). With optimizer offload
    /// Megatron-core takes it only with the `Delayed` FP8 recipe. Off when unset. The operator
    /// reads it; the launch line sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_param_gather: Option<bool>,
    /// Megatron-LM's `--fp8-recipe`; `Delayed` (its default) when unset. The operator reads
    /// it; the launch line sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_recipe: Option<Fp8Recipe>,
    /// Megatron-LM's `--use-megatron-fsdp`: Megatron-FSDP instead of the distributed optimizer,
    /// under which the hybrid device optimizer does not run. Off when unset. The operator reads
    /// it; the launch line sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub megatron_fsdp: Option<bool>,
}

/// Megatron-LM's optimizer (`--optimizer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MegatronOptimizer {
    /// Adam with decoupled weight decay (`adam`).
    #[default]
    Adam,
    /// Stochastic gradient descent (`sgd`).
    #[serde(rename = "SGD")]
    Sgd,
    /// Muon (`muon`).
    Muon,
}

/// Megatron-LM's FP8 scaling recipe (`--fp8-recipe`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Fp8Recipe {
    /// Delayed scaling (`delayed`).
    #[default]
    Delayed,
    /// Per-tensor current scaling (`tensorwise`).
    Tensorwise,
    /// Per-block scaling (`blockwise`).
    Blockwise,
    /// MXFP8 (`mxfp8`).
    #[serde(rename = "MXFP8")]
    Mxfp8,
}

impl MegatronSpec {
    /// Whether the training loop runs Megatron-LM's `--manual-gc`: on unless `manualGc` is
    /// `false`.
    pub fn manual_gc_on(&self) -> bool {
        self.manual_gc != Some(false)
    }
}

/// Which modules build a Megatron-core model's layers (Megatron-LM's `--transformer-impl`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TransformerImpl {
    /// Transformer Engine's layers, with fused attention (`transformer_engine`).
    #[default]
    TransformerEngine,
    /// Megatron-core's own layers, with unfused attention (`local`).
    Local,
}
