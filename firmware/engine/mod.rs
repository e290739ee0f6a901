//! The engine: weights placed in the board's arenas at boot, the KV cache, and the forward pass
//! of a llama-family decoder (llama, qwen2), readable top to bottom in `Engine::forward`.

pub mod any;
mod batch;
mod boot;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod cuda_options;
mod error;
pub mod generate;
pub mod perplexity;
mod plan;
pub mod sample;
pub mod stream_args;
pub mod stream_ffn;
pub mod stream_predict;
pub mod tap;

pub use error::StreamBootError;
pub use plan::{kv_plan, BootPlan};
use plan::{place_vector, Placer};
pub use stream_args::StreamArgs;
pub use stream_args::{StreamOptions, StreamStats};
pub use stream_ffn::StreamedFfn;

use crate::backend::cpu::sparse_ffn::SparseFfn;
use crate::backend::cpu::{
    for_each_row, matmul_many, matvec, matvec_many, ActScratch, KernelSet, Matrix, WorkerPool,
};
use crate::board::PREFILL_BATCH;
pub use crate::boot::Arenas;
use crate::boot::{ArenaKind, BootError, Carver, Plan};
use crate::kv::{
    heads_per_task, CostModel, KvCache, KvChoice, KvPrecision, Policy, Shape, Storage,
};
use crate::model::ggml::dequantize_row;
use crate::model::{Hyper, ModelFile, TensorRef};
use crate::ops::{add, rmsnorm, rope, rope_angles, silu};
use crate::quant::{ConversionReport, Packing, Precision, Role, Target};
use crate::sparsity::{Bundles, FfnMode, FfnOptions, Score, SparsityError};
pub use error::EngineError;
use tap::{Tap, TapOptions};

/// Choices made at boot.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Worker threads for the matrix-vector work (the board's `cpu_threads` by default).
    pub threads: usize,
    /// The CPU kernels, picked once (`KernelSet::best()` by default; tests and the bench's
    /// ablations pass others).
    pub kernels: KernelSet,
    /// Context length; 0 means the smaller of the board's `max_context` and the model's own.
    pub context: usize,
    /// Weight, activation and KV precision (`native` by default: the file's own types).
    pub precision: Precision,
    /// Where w4 nibbles sit (w4a8 only).
    pub packing: Packing,
    /// How the int8 KV cache picks the layout of new tokens.
    pub kv_policy: Policy,
    /// What the KV cache holds (`kv::kv_precision`: int8 at w8a8/w4a8, else f16, unless asked
    /// for f16 or f32; a CUDA configuration's CPU reference asks for the GPU's own,
    /// `engine::cuda_options::kv_precision`).
    pub kv: KvChoice,
    /// At `native`, keep Q8_0 and Q4_0 matrices in the classic GGML kernels instead of
    /// importing them into w8/w4: the same values, a row's blocks summed in another order. The
    /// bench measures a model's float-order noise floor with it (the CUDA parity gate).
    pub native_classic: bool,
    /// The FFN: dense (the model's matrices) or sparse over neuron bundles (`crate::sparsity`).
    pub ffn: FfnOptions,
    /// Record every layer's FFN activations for each token (dense mode only; `trace`,
    /// `calibrate`).
    pub tap: Option<TapOptions>,
    /// Stream the FFN from a flash image instead of holding it (a sparse `ffn` mode; the model
    /// booted is the image's dense part).
    pub stream: Option<StreamOptions>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: crate::board::CPU_THREADS,
            kernels: KernelSet::best(),
            context: 0,
            precision: Precision::Native,
            packing: Packing::default(),
            kv_policy: Policy::Adaptive(CostModel::default()),
            kv: KvChoice::Auto,
            native_classic: false,
            ffn: FfnOptions::default(),
            tap: None,
            stream: None,
        }
    }
}

/// One transformer block's weights, in the arenas.
pub struct Layer<'a> {
    attn_norm: &'a [f32],
    wq: Matrix<'a>,
    wk: Matrix<'a>,
    wv: Matrix<'a>,
    wo: Matrix<'a>,
    /// q/k/v biases (qwen2), concatenated [q | k | v].
    qkv_bias: Option<&'a [f32]>,
    ffn_norm: &'a [f32],
    ffn: LayerFfn<'a>,
}

/// A layer's FFN weights: the model's matrices (dense), or neuron bundles (sparse modes).
enum LayerFfn<'a> {
    Dense {
        gate: Matrix<'a>,
        up: Matrix<'a>,
        down: Matrix<'a>,
    },
    Bundles(Bundles<'a>),
    /// Streamed from the flash image (`Engine::stream`).
    Streamed,
}

/// Activations for one token, carved from the scratch arena.
struct Scratch<'a> {
    x: &'a mut [f32],
    xb: &'a mut [f32],
    xb2: &'a mut [f32],
    q: &'a mut [f32],
    hb: &'a mut [f32],
    hb2: &'a mut [f32],
    att: &'a mut [f32],
    logits: &'a mut [f32],
    /// This token's rotary cos and sin per pair (head_dim / 2 each), shared by every layer
    /// and head.
    rope_cos: &'a mut [f32],
    rope_sin: &'a mut [f32],
}

/// Activations for a batch of up to `PREFILL_BATCH` prompt tokens (token-major: row `t` of
/// each is token `t`'s), carved from the scratch arena. The prefill path's `Scratch`.
struct Batch<'a> {
    x: &'a mut [f32],
    xb: &'a mut [f32],
    /// Attention output (`q_dim` per token).
    xo: &'a mut [f32],
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    hb: &'a mut [f32],
    hb2: &'a mut [f32],
    /// Softmax weights, `context` per (token, head): every head of every token attends at once.
    att: &'a mut [f32],
    rope_cos: &'a mut [f32],
    rope_sin: &'a mut [f32],
    /// Every token's logits (`score`).
    logits: &'a mut [f32],
    /// One quantized-input scratch per token, made at boot.
    acts: Vec<ActScratch>,
}

impl Batch<'_> {
    /// The scratch arena's share, in `Batch`'s field order.
    fn sizes(h: &Hyper, context: usize) -> [usize; 12] {
        let (q_dim, kv_dim) = (h.n_heads * h.head_dim, h.n_kv_heads * h.head_dim);
        [
            h.dim,
            h.dim,
            q_dim,
            q_dim,
            kv_dim,
            kv_dim,
            h.hidden_dim,
            h.hidden_dim,
            h.n_heads * context,
            h.head_dim / 2,
            h.head_dim / 2,
            h.vocab_size,
        ]
        .map(|n| n * PREFILL_BATCH)
    }
}

/// A booted model: weights in place, KV cache and activations allocated, workers running.
pub struct Engine<'a> {
    pub hyper: Hyper,
    /// Tokens the KV cache holds.
    pub context: usize,
    token_embd: Matrix<'a>,
    layers: Vec<Layer<'a>>,
    output_norm: &'a [f32],
    output: Matrix<'a>,
    /// The KV cache: a chain of segments in the KV arena.
    kv: KvCache<'a>,
    s: Scratch<'a>,
    /// The prefill path's activations.
    b: Batch<'a>,
    /// Scratch the sampler sorts in (vocab entries), handed out by `sampler_buffers`.
    sample_idx: Option<&'a mut [u32]>,
    pool: WorkerPool,
    /// The CPU kernels every product runs (`EngineOptions::kernels`).
    kernels: KernelSet,
    act: ActScratch,
    pub precision: Precision,
    /// What boot did to the matrices (imported as is, requantized).
    pub conversions: ConversionReport,
    /// The sparse FFN's options and buffers (sparse modes).
    sparse: Option<SparseFfn<'a>>,
    /// The per-token activation record (when asked for at boot).
    tap: Option<Tap<'a>>,
    /// The FFN streamed from a flash image (when booted with `stream`).
    stream: Option<StreamedFfn<'a>>,
}

/// What generation, perplexity and the daemon need from a backend: one token in, logits out.
/// `Engine` (CPU) and `cuda::CudaEngine` implement it.
pub trait Decoder {
    fn hyper(&self) -> &Hyper;
    /// Tokens the KV cache holds.
    fn context(&self) -> usize;
    /// Runs `token` at `pos` and returns the logits over the vocabulary. Writing position p
    /// overwrites the cache from p on.
    fn forward(&mut self, token: u32, pos: usize) -> &mut [f32];
    /// Runs a prompt token whose logits nobody reads (a GPU need not copy them back).
    fn feed(&mut self, token: u32, pos: usize) {
        self.forward(token, pos);
    }
    /// Runs the prompt `tokens` (at least one) at positions `pos..` and returns the logits
    /// after its last token. The CPU runs it in batches (each matrix read once per batch); the
    /// default feeds all but the last token one by one and forwards the last.
    fn prefill(&mut self, tokens: &[u32], pos: usize) -> &mut [f32] {
        let last = tokens.len() - 1;
        for (i, &t) in tokens[..last].iter().enumerate() {
            self.feed(t, pos + i);
        }
        self.forward(tokens[last], pos + last)
    }
    /// Runs `tokens` at positions `pos..` and hands each one's logits to `each` (its index in
    /// `tokens`, the logits), in order: perplexity. The CPU runs them in batches; the default
    /// forwards each.
    fn score(&mut self, tokens: &[u32], pos: usize, each: &mut dyn FnMut(usize, &mut [f32])) {
        for (i, &t) in tokens.iter().enumerate() {
            each(i, self.forward(t, pos + i));
        }
    }
    /// The greedy next token: the first index of the largest logit (a GPU picks it on the
    /// device and returns 4 bytes instead of the logits).
    fn forward_greedy(&mut self, token: u32, pos: usize) -> u32 {
        sample::argmax(self.forward(token, pos))
    }
    /// Called on a thread before it decodes (a GPU makes its context current there).
    fn bind_thread(&mut self) {}
    /// Why the tokens run since the last call cannot be trusted (an FFN block read failed):
    /// the request they belong to ends with it. None for a backend that cannot fail.
    fn take_error(&mut self) -> Option<crate::stream::ReadError> {
        None
    }
    /// A new sequence starts (at position 0): per-sequence state (the stale predictor) resets.
    fn begin_sequence(&mut self) {}
    /// What the streamed FFN has done since boot (None when the FFN is not streamed).
    fn stream_stats(&self) -> Option<StreamStats> {
        None
    }
}

impl Decoder for Engine<'_> {
    fn hyper(&self) -> &Hyper {
        &self.hyper
    }
    fn context(&self) -> usize {
        self.context
    }
    fn forward(&mut self, token: u32, pos: usize) -> &mut [f32] {
        Engine::forward(self, token, pos)
    }
    fn prefill(&mut self, tokens: &[u32], pos: usize) -> &mut [f32] {
        Engine::prefill(self, tokens, pos)
    }
    fn score(&mut self, tokens: &[u32], pos: usize, each: &mut dyn FnMut(usize, &mut [f32])) {
        Engine::score(self, tokens, pos, each)
    }
    fn take_error(&mut self) -> Option<crate::stream::ReadError> {
        self.stream.as_mut()?.take_error()
    }
    fn begin_sequence(&mut self) {
        if let Some(s) = self.stream.as_mut() {
            s.reset_sequence();
        }
    }
    fn stream_stats(&self) -> Option<StreamStats> {
        self.stream.as_ref().map(|s| s.stats())
    }
}

impl<'a> Engine<'a> {
    /// Changes a sparse engine's FFN options (score, sparsity, thresholds; oracle or topk).
    /// A dense engine has no bundles, and a sparse one no matrices: either refuses the other.
    pub fn set_ffn(&mut self, opts: &FfnOptions) -> Result<(), SparsityError> {
        match self.sparse.as_mut() {
            Some(s) => s.set(opts),
            None if opts.mode == FfnMode::Dense => Ok(()),
            None => Err(SparsityError::BootedDense),
        }
    }

    /// `out = down_l v` for a dense engine's layer `l`, in f64 over the dequantized rows
    /// (calibration: not the decode path; allocates one row).
    pub fn ffn_down_exact(&self, l: usize, v: &[f32], out: &mut [f32]) -> Result<(), EngineError> {
        let down = match &self.layers[l].ffn {
            LayerFfn::Dense { down, .. } if self.precision == Precision::Native => down,
            _ => return Err(EngineError::ExactDownNeedsDense),
        };
        assert_eq!(
            (v.len(), out.len()),
            (down.cols, down.rows),
            "down is {}x{}",
            down.rows,
            down.cols
        );
        let mut row = vec![0f32; down.cols];
        for (r, o) in out.iter_mut().enumerate() {
            // (At native, a Q8_0 or Q4_0 matrix was imported into w8 or w4: the same values.)
            down.row_f32(r, &mut row);
            *o = row
                .iter()
                .zip(v)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>() as f32;
        }
        Ok(())
    }

    /// Neurons the sparse FFN kept and saw since the last call (None when dense).
    pub fn take_ffn_counts(&mut self) -> Option<(u64, u64)> {
        self.sparse.as_mut().map(|s| s.take_counts())
    }

    /// Layer `l`'s neuron bundles (sparse engines).
    pub fn bundles(&self, l: usize) -> Option<&Bundles<'a>> {
        match &self.layers.get(l)?.ffn {
            LayerFfn::Bundles(b) => Some(b),
            LayerFfn::Dense { .. } | LayerFfn::Streamed => None,
        }
    }

    /// The streamed FFN (engines booted with `stream`).
    pub fn stream(&self) -> Option<&StreamedFfn<'a>> {
        self.stream.as_ref()
    }

    pub fn stream_mut(&mut self) -> Option<&mut StreamedFfn<'a>> {
        self.stream.as_mut()
    }

    /// The last token's activation record (engines booted with `tap`).
    pub fn tap(&self) -> Option<&Tap<'a>> {
        self.tap.as_ref()
    }

    /// The sampler's sort buffer (vocab entries); handed out once.
    pub fn take_sample_buffer(&mut self) -> Option<&'a mut [u32]> {
        self.sample_idx.take()
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// The KV cache's segment chain (layouts and the positions each holds).
    pub fn kv_segments(&self) -> &[crate::kv::Segment] {
        self.kv.segments()
    }

    /// The KV cache's precision.
    pub fn kv_precision(&self) -> crate::kv::KvPrecision {
        self.kv.precision()
    }

    /// The KV cache for the boot report: its precision, and the largest key scale if any.
    pub fn kv_description(&self) -> String {
        match self.kv.largest_key_scale() {
            Some(f) => format!(
                "{:?}, keys scaled down by up to {f:.1}x in outlier channels",
                self.kv.precision()
            ),
            None => format!("{:?}", self.kv.precision()),
        }
    }

    /// Query heads of one KV head an attention task takes, for `units` KV heads to attend.
    /// Only the float caches read their rows once for a task's heads (the int8 one attends a
    /// head at a time), so only they group them.
    fn heads_per_attention_task(&self, units: usize) -> usize {
        let h = &self.hyper;
        match (self.kernels.grouped_attention, self.kv.precision()) {
            (true, KvPrecision::F32 | KvPrecision::F16) => {
                heads_per_task(h.n_heads / h.n_kv_heads, units, self.pool.n_threads())
            }
            _ => 1,
        }
    }

    /// Runs one token at position `pos` through the model and returns the logits over the vocabulary.
    /// Positions are the caller's to manage: writing position p overwrites the cache from p on.
    pub fn forward(&mut self, token: u32, pos: usize) -> &mut [f32] {
        let h = &self.hyper;
        assert!(
            pos < self.context,
            "position {pos} past the context of {}",
            self.context
        );
        assert!(
            (token as usize) < h.vocab_size,
            "token {token} past the vocabulary of {}",
            h.vocab_size
        );
        let (dim, head_dim, n_heads) = (h.dim, h.head_dim, h.n_heads);
        let kv_dim = h.n_kv_heads * head_dim;
        let q_dim = n_heads * head_dim;
        let group = n_heads / h.n_kv_heads;
        let sub = self.heads_per_attention_task(h.n_kv_heads);
        let ctx = self.context;
        let s = &mut self.s;
        let (pool, ks) = (&self.pool, self.kernels);
        let act = &mut self.act;

        // Embedding of the token.
        self.token_embd.row_f32(token as usize, s.x);

        // The KV cache makes room for this position (a new segment if its cost model says so).
        self.kv.begin_token(pos);
        rope_angles(s.rope_cos, s.rope_sin, head_dim, pos, h.rope_base);
        for (l, w) in self.layers.iter().enumerate() {
            // Attention: q, k and v of this token; k and v go into the cache's rows for it.
            rmsnorm(s.xb, s.x, w.attn_norm, h.norm_eps);
            let (k, v) = self.kv.rows();
            matvec_many(
                ks,
                pool,
                &mut [(&w.wq, &mut *s.q), (&w.wk, &mut *k), (&w.wv, &mut *v)],
                s.xb,
                act,
            );
            if let Some(b) = w.qkv_bias {
                add(s.q, &b[..q_dim]);
                add(k, &b[q_dim..q_dim + kv_dim]);
                add(v, &b[q_dim + kv_dim..]);
            }
            rope(s.q, s.rope_cos, s.rope_sin, h.rope_style);
            rope(k, s.rope_cos, s.rope_sin, h.rope_style);
            self.kv.commit(l, pos);

            // Each head attends over positions 0..=pos of its KV head; a task takes `sub` heads
            // of one KV head, whose rows it reads once for them all.
            let kv = &self.kv;
            let out = Disjoint::new(&mut s.xb2[..q_dim]);
            let att = Disjoint::new(s.att);
            let q = &*s.q;
            pool.run(n_heads / sub, &|task| {
                let head = task * sub;
                // SAFETY: task `task` touches only its own heads' slices of `out` and `att`.
                let (o, a) = unsafe {
                    (
                        out.slice(head * head_dim, sub * head_dim),
                        att.slice(head * ctx, (sub - 1) * ctx + pos + 1),
                    )
                };
                kv.attend_heads(
                    l,
                    head / group,
                    &q[head * head_dim..][..sub * head_dim],
                    pos,
                    a,
                    ctx,
                    o,
                );
            });
            matvec(ks, pool, &w.wo, &s.xb2[..q_dim], act, s.xb);
            add(s.x, s.xb);

            // Feed-forward: SwiGLU over every neuron, or over the ones this token needs.
            rmsnorm(s.xb, s.x, w.ffn_norm, h.norm_eps);
            match &w.ffn {
                LayerFfn::Dense { gate, up, down } => {
                    matvec_many(
                        ks,
                        pool,
                        &mut [(gate, &mut *s.hb), (up, &mut *s.hb2)],
                        s.xb,
                        act,
                    );
                    if let Some(tap) = self.tap.as_mut() {
                        tap.record(l, s.x, s.xb, s.hb, s.hb2, down, ks, pool, act);
                    }
                    for (g, u) in s.hb.iter_mut().zip(s.hb2.iter()) {
                        *g = silu(*g) * u;
                    }
                    matvec(ks, pool, down, s.hb, act, s.xb);
                }
                LayerFfn::Bundles(b) => {
                    let sparse = self.sparse.as_mut().expect("bundles come with SparseFfn");
                    sparse.forward(l, b, ks, pool, s.xb, act);
                }
                LayerFfn::Streamed => {
                    let sparse = self
                        .sparse
                        .as_mut()
                        .expect("streaming comes with SparseFfn");
                    let stream = self.stream.as_mut().expect("a streamed layer");
                    stream.forward_layer(l, 0, pos == 0, s.x, true, sparse, ks, pool, s.xb, act);
                }
            }
            add(s.x, s.xb);
        }
        if let Some(st) = self.stream.as_mut() {
            st.end_tokens(1);
        }

        rmsnorm(s.xb, s.x, self.output_norm, h.norm_eps);
        matvec(ks, pool, &self.output, s.xb, act, s.logits);
        debug_assert_eq!(dim, s.x.len());
        s.logits
    }
}

/// Shares one mutable slice between pool tasks that each write a disjoint range of it.
struct Disjoint<'a, T = f32> {
    ptr: *mut T,
    len: usize,
    _life: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: only ever used through `slice`, whose callers promise disjoint ranges.
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    fn new(s: &'a mut [T]) -> Self {
        Disjoint {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _life: std::marker::PhantomData,
        }
    }
    /// SAFETY: no two live calls may overlap in range.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start + len <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }
}
