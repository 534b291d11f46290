//! A vision tower ahead of the language model: what a multimodal `config.json` (Gemma-3, LLaVA,
//! Qwen2-VL, PaliGemma, …) describes under `vision_config`. Its parameters are trained with the
//! language model's, so they are counted like them (weights, gradients, optimizer state, in
//! the order the model registers them: the tower first). What it keeps for backward depends on
//! the images of a step, which nothing in a job says: the figure per image goes into the reason
//! instead of the estimate.

use serde_json::{Map, Value};

/// A ViT-style encoder (pre-norm blocks of attention and a plain MLP, with biases) and the
/// projector that carries its output into the language model's width.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VisionTower {
    /// The encoder's width.
    pub hidden: f64,
    /// Its blocks.
    pub layers: f64,
    /// Its MLP size.
    pub intermediate: f64,
    /// Patches of one image at the tower's image size (its tokens); 0 where the tower takes
    /// images of any size (Qwen2-VL).
    pub patches: f64,
    /// Tiles an image is cut into at most (Mllama), 1 otherwise: an image keeps this many
    /// times a tile's patches.
    pub tiles: f64,
    /// The patch embedding (its weight and bias).
    pub patch_embedding: f64,
    /// Learned position embeddings (patches × width, and per tile and aspect ratio where images
    /// are tiled); 0 for rotary positions.
    pub positions: f64,
    /// The projector into the language model, counted as up to two layers wide at the larger
    /// of its two widths (LLaVA's two-layer MLP, Qwen2-VL's merger, Gemma-3's single layer):
    /// never fewer parameters than it has.
    pub projector: f64,
}

/// Tensors of one encoder block: the four attention projections (weight, bias), two norms
/// (weight, bias) and the MLP's two layers (weight, bias).
const BLOCK_TENSORS: usize = 16;

impl VisionTower {
    /// Reads `vision_config` for a language model of width `text_hidden`. The encoder's width is
    /// `embed_dim` where there is one (Qwen2-VL's `hidden_size` is its merger's output), else
    /// `hidden_size`; its depth `num_hidden_layers` or `depth`; its MLP `intermediate_size`,
    /// else `mlp_ratio` × width, else 4 × width.
    pub fn read(vision: &Map<String, Value>, text_hidden: f64) -> Result<VisionTower, String> {
        let number = |key: &str| -> Result<Option<f64>, String> {
            match vision.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .filter(|n| n.is_finite() && *n >= 1.0 && *n <= 1e7)
                    .map(Some)
                    .ok_or_else(|| {
                        format!("vision_config.{key} is {v}, not a number from 1 to 10,000,000")
                    }),
            }
        };
        let first = |keys: &[&str]| -> Result<Option<f64>, String> {
            for key in keys {
                if let Some(n) = number(key)? {
                    return Ok(Some(n.round()));
                }
            }
            Ok(None)
        };
        let hidden = first(&["embed_dim", "hidden_size", "width"])?.ok_or(
            "vision_config has no hidden_size (nor embed_dim): the vision tower's width is needed to count it",
        )?;
        // Mllama's tower has global blocks after its local ones.
        let layers = first(&["num_hidden_layers", "depth", "layers"])?.ok_or(
            "vision_config has no num_hidden_layers (nor depth): the vision tower's depth is needed to count it",
        )? + first(&["num_global_layers"])?.unwrap_or(0.0);
        let intermediate = match (first(&["intermediate_size"])?, number("mlp_ratio")?) {
            (Some(i), _) => i,
            (None, Some(ratio)) => (ratio * hidden).ceil(),
            (None, None) => 4.0 * hidden,
        };
        let patch = first(&["patch_size"])?.unwrap_or(14.0);
        let channels = first(&["num_channels", "in_channels", "in_chans"])?.unwrap_or(3.0);
        let temporal = first(&["temporal_patch_size"])?.unwrap_or(1.0);
        let patches = first(&["image_size"])?.map_or(0.0, |size| (size / patch).ceil().powi(2));
        let merge = first(&["spatial_merge_size"])?.unwrap_or(1.0);
        // What the projector takes: the merged patches (Qwen2-VL), several blocks' outputs side
        // by side (Mllama's `vision_output_dim`), or the tower's width.
        let into = first(&["vision_output_dim"])?.unwrap_or(merge * merge * hidden);
        let learned_positions = patches > 0.0 && number("temporal_patch_size")?.is_none();
        // Images cut into tiles (Mllama): a position embedding per aspect ratio, tile and patch.
        let tiles = first(&["max_num_tiles"])?.unwrap_or(1.0);
        let ratios = match vision.get("supported_aspect_ratios") {
            Some(Value::Array(list)) => u32::try_from(list.len()).map_or(f64::MAX, f64::from),
            _ => 0.0,
        };
        let tile_positions = if tiles > 1.0 {
            (ratios + 1.0) * tiles * (patches + 1.0) * hidden
        } else {
            0.0
        };
        Ok(VisionTower {
            hidden,
            layers,
            intermediate,
            patches,
            patch_embedding: patch * patch * channels * temporal * hidden + hidden,
            positions: tile_positions
                + if learned_positions {
                    // CLIP's class token has a position too.
                    (patches + 1.0) * hidden
                } else {
                    0.0
                },
            tiles,
            projector: into * into + into * text_hidden + text_hidden * text_hidden,
        })
    }

    /// Parameters of one encoder block.
    fn block_parameters(&self) -> f64 {
        let (h, i) = (self.hidden, self.intermediate);
        4.0 * h * h + 2.0 * h * i + 9.0 * h + i
    }

    /// All of its parameters.
    pub fn parameters(&self) -> f64 {
        self.outside_blocks().iter().sum::<f64>() + self.layers * self.block_parameters()
    }

    /// The tensors outside the blocks: the embeddings (patches and positions, one tensor
    /// here), the final norm, the projector (one tensor here).
    fn outside_blocks(&self) -> [f64; 3] {
        [
            self.patch_embedding + self.positions,
            2.0 * self.hidden,
            self.projector,
        ]
    }

    /// How many tensors [`VisionTower::tensors`] gives.
    pub fn tensor_count(&self) -> usize {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let layers = self.layers.max(0.0) as usize;
        layers.saturating_mul(BLOCK_TENSORS).saturating_add(3)
    }

    /// Its tensors in registration order (embeddings, each block, final norm, projector).
    pub fn tensors(&self, out: &mut Vec<f64>) {
        let (h, i) = (self.hidden, self.intermediate);
        let [embeddings, norm, projector] = self.outside_blocks();
        out.push(embeddings);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        for _ in 0..self.layers.max(0.0) as usize {
            out.extend([
                h * h,
                h,
                h * h,
                h,
                h * h,
                h,
                h * h,
                h,
                h,
                h,
                h * i,
                i,
                i * h,
                h,
                h,
                h,
            ]);
        }
        out.extend([norm, projector]);
    }

    /// The largest of its tensors.
    pub fn largest_tensor(&self) -> f64 {
        let [embeddings, _, projector] = self.outside_blocks();
        embeddings
            .max(projector)
            .max(self.hidden * self.intermediate)
    }

    /// Bytes one image keeps for backward in the tower at its image size (16-bit, fused
    /// attention: what a GPT-style block keeps, 16 bytes per unit of width and 4 per MLP unit,
    /// per patch and block); `None` where images come in any size.
    pub fn saved_per_image(&self) -> Option<f64> {
        (self.patches > 0.0).then_some(
            self.tiles
                * self.patches
                * self.layers
                * (16.0 * self.hidden + 4.0 * self.intermediate),
        )
    }

    /// What the reasons say of it.
    pub fn describe(&self) -> String {
        let saved = self.saved_per_image().map_or_else(
            || "what it keeps for backward depends on each image's size and is not counted".to_string(),
            |b| {
                format!(
                    "what it keeps for backward, about {:.1} GiB an image at {} patches, is not counted",
                    b / f64::from(1u32 << 30),
                    self.patches
                )
            },
        );
        format!(
            "a vision tower of {} blocks, width {}, {:.2}B parameters counted with the model's; {saved}",
            self.layers,
            self.hidden,
            self.parameters() / 1e9
        )
    }
}
