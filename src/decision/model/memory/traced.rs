//! The model as its own code traced it (the sizer: [`offload_api::trace`]): where a job has a
//! trace of its step, its parameters, tensors, activations and the order its gradients arrive
//! in are the trace's, not the counted shape's. The counted shape stays the cross-check (its
//! parameters beside the trace's in the reasons) and what decides where nothing was traced.

use std::sync::Arc;

use offload_api::trace::ModelTrace;

use super::JobMemory;

/// A trace as the memory model reads it: its lists expanded once.
#[derive(Clone, Debug, PartialEq)]
pub struct Traced {
    /// The sizer's trace.
    pub trace: Arc<ModelTrace>,
    /// Parameter tensors in registration order.
    pub tensors: Vec<f64>,
    /// Gradients in the order the backward completes them: elements, and bytes alive beyond
    /// the parameters when each arrives.
    pub gradients: Vec<(f64, f64)>,
}

impl Traced {
    /// The memory model's view of `trace`.
    pub fn new(trace: Arc<ModelTrace>) -> Traced {
        #[allow(clippy::cast_precision_loss)]
        let f = |n: u64| n as f64;
        Traced {
            tensors: trace.tensor_list().into_iter().map(f).collect(),
            gradients: trace
                .gradient_list()
                .into_iter()
                .map(|g| (f(g.numel), f(g.alive)))
                .collect(),
            trace,
        }
    }

    /// Parameters, exactly.
    pub fn parameters(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let p = self.trace.parameters as f64;
        p
    }

    /// Tokens of the traced micro-batch.
    pub fn tokens(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let t = self.trace.tokens() as f64;
        t.max(1.0)
    }

    /// A traced figure in bytes at `tokens` per micro-batch: as traced at the trace's own
    /// tokens, in proportion elsewhere (advice at other micro-batches).
    fn at(&self, bytes: u64, tokens: Option<f64>) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let b = bytes as f64;
        tokens.map_or(b, |t| b * t / self.tokens())
    }

    /// The step's activation peak per GPU at `tokens`.
    pub fn peak(&self, tokens: Option<f64>) -> f64 {
        self.at(self.trace.peak_bytes, tokens)
    }

    /// What the step keeps for backward when it starts, at `tokens`.
    pub fn saved(&self, tokens: Option<f64>) -> f64 {
        self.at(self.trace.saved_bytes, tokens)
    }

    /// The step's largest single activation at `tokens`.
    pub fn largest_activation(&self, tokens: Option<f64>) -> f64 {
        self.at(self.trace.largest_activation_bytes, tokens)
    }

    /// The largest parameter tensor.
    pub fn largest_tensor(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let t = self.trace.largest_tensor as f64;
        t
    }

    /// Parameters of the largest layer.
    pub fn largest_layer(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let t = self.trace.largest_layer as f64;
        t
    }

    /// For reasons: what the trace is and which figures are its.
    pub fn said(&self, counted: Option<f64>, tokens: Option<f64>) -> String {
        let cross = counted
            .filter(|c| (c - self.parameters()).abs() >= 0.5)
            .map(|c| {
                format!(
                    "; the per-type count has {:.3}B, {:+.1} %",
                    c / 1e9,
                    100.0 * (c - self.parameters()) / self.parameters().max(1.0)
                )
            })
            .unwrap_or_default();
        format!(
            "parameters, tensors and activations traced from the model's code ({}): {} kept for backward, {} at the step's peak{cross}",
            self.trace.describe(),
            super::gib(self.saved(tokens)),
            super::gib(self.peak(tokens)),
        )
    }
}

impl JobMemory {
    /// The parameters' tensors in registration order, traced or counted; `None` where neither
    /// is known or there are more than `max`.
    pub(super) fn tensor_list(&self, max: usize) -> Option<Vec<f64>> {
        match &self.traced {
            Some(t) if t.tensors.len() <= max => Some(t.tensors.clone()),
            Some(_) => None,
            None if self.shape.known => self.shape.tensors(max),
            None => None,
        }
    }

    /// The largest parameter tensor, traced or counted.
    pub(super) fn largest_tensor(&self) -> f64 {
        self.traced
            .as_ref()
            .map_or_else(|| self.shape.largest_tensor(), |t| t.largest_tensor())
    }

    /// Parameters of the largest layer, traced or counted.
    pub(super) fn largest_layer(&self) -> f64 {
        self.traced
            .as_ref()
            .map_or_else(|| self.shape.largest_layer(), |t| t.largest_layer())
    }
}
