//! The boot plan: what a model takes of each engine arena, computed from the file's shapes
//! and types before any arena is touched, and the KV plan both decoders share. Boot (the CPU
//! decoder's `Engine::boot`, the GPU's `CudaEngine::boot`) checks it first and places the
//! matrices with the same `Placer`, so the plan and the placement cannot disagree.

use super::*;

/// What booting a model takes of each engine arena (`Engine::plan`): the board config's
/// budgets are checked against it before anything is placed.
#[derive(Clone, Debug)]
pub struct BootPlan {
    /// The KV cache's dimensions (`shape.context`: the tokens of context planned for).
    pub shape: Shape,
    /// What the KV cache holds (`kv::kv_precision`).
    pub kv_precision: KvPrecision,
    pub dense: Plan,
    pub ffn: Plan,
    pub kv: Plan,
    pub scratch: Plan,
    /// The FFN is streamed: `ffn` is the weight cache, not the weights.
    pub streamed: bool,
}

impl BootPlan {
    /// Each part: its arena, its bytes, and what it holds.
    pub fn parts(&self) -> [(ArenaKind, usize, String); 4] {
        [
            (
                ArenaKind::DenseWeights,
                self.dense.bytes,
                "the dense weights (embeddings, attention, norms, output)".into(),
            ),
            (
                ArenaKind::FfnCache,
                self.ffn.bytes,
                if self.streamed {
                    "the weight cache of the streamed FFN (--ffn-budget)".into()
                } else {
                    "the FFN weights (all resident)".into()
                },
            ),
            (
                ArenaKind::Kv,
                self.kv.bytes,
                format!(
                    "the {} KV cache for {} tokens",
                    self.kv_precision.name(),
                    self.shape.context
                ),
            ),
            (
                ArenaKind::ActivationScratch,
                self.scratch.bytes,
                "the activations".into(),
            ),
        ]
    }

    /// Refuses, naming the budget and the bytes, when a part does not fit its arena.
    pub fn check(&self, arenas: &Arenas) -> Result<(), BootError> {
        for (kind, bytes, what) in self.parts() {
            let available = match kind {
                ArenaKind::DenseWeights => arenas.dense.len(),
                ArenaKind::FfnCache => arenas.ffn.len(),
                ArenaKind::Kv => arenas.kv.len(),
                _ => arenas.scratch.len(),
            };
            Plan { bytes }.check(kind, available, &what)?;
        }
        Ok(())
    }
}

/// The KV cache both decoders plan, by one rule: its context is the least of the board's
/// `max_context`, the model's trained context and `asked` (0: no limit asked), and its
/// precision is `kv::kv_precision`'s for a backend whose int8 attention takes heads up to
/// `max_head_dim`.
/// Each backend then sizes its own layout from the shape (the CPU's segments keep slack for
/// partly filled tiles; the GPU's cache is one token-major run).
pub fn kv_plan(
    h: &Hyper,
    asked: usize,
    precision: Precision,
    choice: KvChoice,
    max_head_dim: usize,
) -> (Shape, KvPrecision) {
    let mut context = crate::board::MAX_CONTEXT.min(h.ctx_train.max(1));
    if asked > 0 {
        context = asked.min(context);
    }
    let shape = Shape {
        n_layers: h.n_layers,
        kv_heads: h.n_kv_heads,
        head_dim: h.head_dim,
        context,
    };
    let kv = crate::kv::kv_precision(precision, choice, h.head_dim, max_head_dim);
    (shape, kv)
}

/// How boot places matrices: the precision's target per role, and the report of what it did.
pub(super) struct Placer {
    precision: Precision,
    packing: Packing,
    /// `EngineOptions::native_classic`.
    classic: bool,
    pub(super) report: ConversionReport,
    scratch: Vec<f32>,
}

impl Placer {
    pub(super) fn new(opts: &EngineOptions) -> Placer {
        Placer {
            precision: opts.precision,
            packing: opts.packing,
            classic: opts.native_classic,
            report: ConversionReport::default(),
            scratch: Vec::new(),
        }
    }

    fn target(&self, t: &TensorRef, role: Role) -> Target {
        if self.classic && self.precision == Precision::Native {
            return Target::Keep;
        }
        crate::quant::target(self.precision, self.packing, role, t.ty, t.cols)
    }

    /// Bytes a matrix takes once placed.
    pub(super) fn bytes(&self, t: &TensorRef, role: Role) -> usize {
        crate::quant::target_bytes(self.target(t, role), t)
    }

    pub(super) fn place<'a>(
        &mut self,
        c: &mut Carver<'a>,
        t: &TensorRef,
        role: Role,
    ) -> Result<Matrix<'a>, BootError> {
        let target = self.target(t, role);
        let data = c.take::<u8>(crate::quant::target_bytes(target, t))?;
        let how = crate::quant::convert(target, t, data, &mut self.scratch);
        self.report.add(t.ty, target, how, data.len());
        let (ty, q) = match target {
            Target::Keep => (t.ty, None),
            Target::F16 => (crate::model::ggml::GgmlType::F16, None),
            Target::Q(f) => (f.ggml_type(), Some(f)),
        };
        Ok(Matrix {
            ty,
            q,
            rows: t.rows,
            cols: t.cols,
            data,
        })
    }
}

pub(super) fn place_vector<'a>(c: &mut Carver<'a>, t: &TensorRef) -> Result<&'a [f32], BootError> {
    let n = t.cols * t.rows;
    let out = c.take::<f32>(n)?;
    dequantize_row(t.ty, t.data, out);
    Ok(out)
}

impl Engine<'_> {
    /// What booting `model` with `opts` takes of each of the engine's arenas, computed from the
    /// file's shapes and types before any arena is touched (`leanstream board --model` prints it;
    /// [`boot`](Self::boot) checks it against the arenas).
    pub fn plan(model: &ModelFile, opts: &EngineOptions) -> Result<BootPlan, EngineError> {
        let h = model.hyper()?;
        if opts.stream.is_some() {
            model.validate_dense(&h)?;
        } else {
            model.validate(&h)?;
        }
        if h.head_dim % 2 != 0 || h.n_heads % h.n_kv_heads != 0 {
            return Err(EngineError::Unsupported(format!(
                "head_dim {} must be even and n_heads {} a multiple of n_kv_heads {}",
                h.head_dim, h.n_heads, h.n_kv_heads
            )));
        }
        let (shape, kv_precision) = kv_plan(
            &h,
            opts.context,
            opts.precision,
            opts.kv,
            crate::kv::MAX_HEAD_DIM,
        );
        let context = shape.context;
        let kv_dim = h.n_kv_heads * h.head_dim;
        let q_dim = h.n_heads * h.head_dim;
        let placer = Placer::new(opts);
        let emb = Role::EmbedOrOutput;
        // Each layer matrix's role, by its full name (the first and last layer keep more bits).
        let role = |i: usize, n: &str| Role::of(&format!("blk.{i}.{n}"), h.n_layers);
        opts.ffn.check(h.n_layers)?;
        let sparse = opts.ffn.mode != FfnMode::Dense;
        if let Some(t) = &opts.tap {
            if sparse {
                return Err(EngineError::Options(
                    "activation traces are recorded in dense mode only".into(),
                ));
            }
            if let Some(th) = &t.thresholds {
                if th.len() != h.n_layers {
                    return Err(EngineError::Options(format!(
                        "{} trace thresholds for {} layers",
                        th.len(),
                        h.n_layers
                    )));
                }
            }
        }

        // Plan every arena and refuse before touching any of them.
        let layer_name = |i: usize, n: &str| format!("blk.{i}.{n}");
        let mut dense = Plan::default();
        let mut ffn = Plan::default();
        dense.add_bytes(placer.bytes(&model.tensor("token_embd.weight")?, emb));
        dense.add::<f32>(h.dim);
        if !h.tied_output {
            dense.add_bytes(placer.bytes(&model.tensor("output.weight")?, emb));
        }
        for i in 0..h.n_layers {
            for n in [
                "attn_q.weight",
                "attn_k.weight",
                "attn_v.weight",
                "attn_output.weight",
            ] {
                dense.add_bytes(placer.bytes(&model.tensor(&layer_name(i, n))?, role(i, n)));
            }
            dense.add::<f32>(2 * h.dim);
            if h.qkv_bias {
                dense.add::<f32>(q_dim + 2 * kv_dim);
            }
            if opts.stream.is_some() {
                // The FFN is in the image: the cache is planned below.
            } else if sparse {
                let t = |n: &str| model.tensor(&layer_name(i, n));
                let (g, u, d) = (
                    t("ffn_gate.weight")?,
                    t("ffn_up.weight")?,
                    t("ffn_down.weight")?,
                );
                Bundles::plan(&mut ffn, &g, &u, &d, opts.ffn.bundle_down)?;
            } else {
                for n in ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"] {
                    ffn.add_bytes(placer.bytes(&model.tensor(&layer_name(i, n))?, role(i, n)));
                }
            }
        }
        let mut kv = Plan::default();
        let rows = h.n_layers * context * kv_dim;
        match kv_precision {
            KvPrecision::I8 => {
                kv.add::<i8>(shape.i8_values());
                kv.add::<i8>(shape.i8_values());
                kv.add::<f32>(shape.i8_scales());
                kv.add::<f32>(shape.i8_scales());
            }
            KvPrecision::F16 => {
                kv.add::<u16>(rows);
                kv.add::<u16>(rows);
            }
            KvPrecision::F32 => {
                kv.add::<f32>(rows);
                kv.add::<f32>(rows);
            }
        }
        let mut scratch = Plan::default();
        for n in [
            h.dim,
            h.dim,
            h.dim.max(q_dim),
            q_dim,
            h.hidden_dim,
            h.hidden_dim,
            h.n_heads * context,
            h.vocab_size,
            kv_dim,
            kv_dim,
            h.head_dim / 2,
            h.head_dim / 2,
        ] {
            scratch.add::<f32>(n);
        }
        let scale_keys = kv_precision == KvPrecision::I8 && h.qkv_bias;
        if scale_keys {
            scratch.add::<f32>(h.n_layers * kv_dim);
        }
        for n in Batch::sizes(&h, context) {
            scratch.add::<f32>(n);
        }
        scratch.add::<u32>(h.vocab_size);
        if sparse {
            SparseFfn::plan(&mut scratch, h.n_layers, h.hidden_dim, h.dim);
        }
        if let Some(t) = &opts.tap {
            Tap::plan(&mut scratch, h.n_layers, h.dim, h.hidden_dim, t.stages);
        }
        if let Some(so) = &opts.stream {
            if !sparse {
                return Err(EngineError::Options(
                    "a streamed FFN computes only the neurons a token needs: it needs --ffn oracle or topk".into(),
                ));
            }
            let image = StreamedFfn::open_image(so, &h).map_err(EngineError::Flash)?;
            let (slots, slot_bytes) = StreamedFfn::slots(&image, so.budget);
            ffn.add_bytes(slots * slot_bytes.next_multiple_of(crate::boot::SLICE_ALIGN));
            StreamedFfn::plan_scratch(&mut scratch, &image, &h, so.predict);
        }

        Ok(BootPlan {
            shape,
            kv_precision,
            dense,
            ffn,
            kv,
            scratch,
            streamed: opts.stream.is_some(),
        })
    }
}
