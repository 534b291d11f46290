//! What model hints leave open of a Llama-style shape (its MLP size, its key/value heads) and
//! the shapes its parameter count allows there: the estimate takes the end that keeps the most
//! for backward, so it is never under for either.

use super::ModelShape;

/// What model hints left open of a Llama-style shape (its MLP size, its key/value heads), and
/// the other end of what its parameter count allows: the estimate counts the end that keeps
/// the most for backward, so it is never under for either.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpenShape {
    /// The MLP size was not given.
    pub intermediate: bool,
    /// The key/value heads were not given.
    pub kv_heads: bool,
    /// The other end's MLP size.
    pub other_intermediate: f64,
    /// The other end's key/value heads.
    pub other_kv_heads: f64,
}

impl OpenShape {
    /// The fields left open, as the job names them.
    pub fn missing(&self) -> String {
        match (self.intermediate, self.kv_heads) {
            (true, true) => "spec.model.intermediateSize and keyValueHeads".into(),
            (true, false) => "spec.model.intermediateSize".into(),
            _ => "spec.model.keyValueHeads".into(),
        }
    }
}

impl ModelShape {
    /// The shapes `parameters` allows where this one's MLP size (`free_intermediate`) or its
    /// key/value heads (`free_kv`) are not known: with all heads for keys and values and with
    /// one, each with the MLP size that makes up the count (or, with the MLP size known, the
    /// key/value heads that do, a divisor of the heads). Empty where no such shape meets the
    /// count (a width, depth or vocabulary that cannot hold it).
    pub fn ends_for(
        &self,
        parameters: f64,
        free_intermediate: bool,
        free_kv: bool,
    ) -> Vec<ModelShape> {
        let linear = |set: &dyn Fn(&mut ModelShape, f64)| {
            let (mut a, mut b) = (*self, *self);
            set(&mut a, 0.0);
            set(&mut b, 1.0);
            let slope = b.parameters() - a.parameters();
            (slope > 0.0).then(|| (parameters - a.parameters()) / slope)
        };
        let mut out = Vec::new();
        if free_intermediate {
            let kvs = if free_kv {
                vec![self.heads, 1.0]
            } else {
                vec![self.kv_heads]
            };
            for kv in kvs {
                let with_kv = ModelShape {
                    kv_heads: kv,
                    ..*self
                };
                let Some(i) = with_kv.ends_solve_intermediate(parameters) else {
                    continue;
                };
                out.push(ModelShape {
                    intermediate: i,
                    ..with_kv
                });
            }
        } else if free_kv {
            let Some(kv) = linear(&|s, v| s.kv_heads = v) else {
                return out;
            };
            // The divisor of the heads nearest the count's.
            let heads = self.heads.max(1.0);
            let best = (1..=heads as u64)
                .map(|d| d as f64)
                .filter(|d| heads % d == 0.0)
                .min_by(|a, b| (a - kv).abs().total_cmp(&(b - kv).abs()));
            if let Some(kv) = best {
                let s = ModelShape {
                    kv_heads: kv,
                    ..*self
                };
                if (s.parameters() - parameters).abs() <= 0.05 * parameters {
                    out.push(s);
                }
            }
        }
        out
    }

    /// The MLP size that makes this shape `parameters`, if a plausible one does (half to 16
    /// times the width).
    fn ends_solve_intermediate(&self, parameters: f64) -> Option<f64> {
        let (mut a, mut b) = (*self, *self);
        a.intermediate = 0.0;
        b.intermediate = 1.0;
        let slope = b.parameters() - a.parameters();
        if slope <= 0.0 {
            return None;
        }
        let i = ((parameters - a.parameters()) / slope).round();
        (0.5 * self.hidden..=16.0 * self.hidden)
            .contains(&i)
            .then_some(i)
    }
}
