//! The decode step on the GPU: the same forward pass as `Engine::forward` (engine/mod.rs), as a
//! fixed sequence of kernel launches (`record_step`, readable top to bottom) that boot captures
//! once into a CUDA graph. The token and position live in device memory and the last kernel
//! advances them, so a step is one graph launch: launch overhead, which rules small models, is
//! paid once per token instead of once per kernel.

use super::cuda_options::{
    CudaOptions, DependentLaunch, InBlockNorm, PrefillProducts, ProductKernels,
    INT8_KV_MAX_HEAD_DIM, IN_BLOCK_NORM_MAX_DIM,
};
use super::{Arenas, Decoder, EngineError};
use crate::backend::cuda::driver::{
    CudaError, CudaResult, DeviceBuffer, Function, Gpu, Graph, KernelArgs, MappedHost, Module,
};
use crate::backend::cuda::ptx_for;
use crate::backend::cuda::weights::{GpuType, ImageWriter, MatLayout, SWIGLU_TILE};
use crate::board::MemoryModel;
use crate::boot::{ArenaKind, Plan};
use crate::model::{Hyper, ModelFile, RopeStyle};
use crate::quant::{Precision, Role};

#[path = "cuda_stream.rs"]
mod stream;

#[path = "cuda_boot.rs"]
mod boot;

#[path = "cuda_attention.rs"]
mod attention;
pub use attention::AttentionSplit;

#[path = "cuda_prefill.rs"]
mod prefill;
pub use prefill::PrefillBuffers;
pub use stream::{Prioritization, StreamedBoot};

/// The `pdl` argument of decode.cu's kernels (PDL_OFF, PDL_ON, PDL_PREFETCH).
fn pdl_kernel_mode(d: DependentLaunch) -> i32 {
    match d {
        DependentLaunch::Off => 0,
        DependentLaunch::On => 1,
        DependentLaunch::Prefetch => 2,
    }
}

/// A matrix in the weight image: device addresses of its arrays (0 when absent).
#[derive(Clone, Copy, Debug)]
struct Mat {
    ty: GpuType,
    rows: usize,
    cols: usize,
    q: u64,
    d: u64,
    m: u64,
    qh: u64,
}

/// Matrices that share an input and write consecutive slices of one output ([q|k|v],
/// [gate|up]); one entry when their types match and they were stacked at load.
type MatGroup = heapless::Vec<(Mat, usize), 3>;

/// The KV cache on the device: `[layer][position][kv_dim]` keys and values, f32 or int8; for
/// int8, a scale per (layer, position, kv head, group of 32) each, and, for a model with a K
/// bias, the keys' channel scales (`kv::key_scales_from_bias`, n_layers x kv_dim).
struct GpuKv {
    k: DeviceBuffer,
    v: DeviceBuffer,
    k_scales: Option<DeviceBuffer>,
    v_scales: Option<DeviceBuffer>,
    key_scale: Option<DeviceBuffer>,
}

struct GpuLayer {
    attn_norm: u64,
    qkv: MatGroup,
    qkv_bias: u64,
    wo: Mat,
    ffn_norm: u64,
    gate_up: MatGroup,
    /// `gate_up` is one matrix stacked tile by tile (`ImageWriter::gate_up_tiled`), so its
    /// blocks make SwiGLU tile by tile as they finish; otherwise the last block makes it all.
    gate_up_tiled: bool,
    /// None when the FFN streams (`stream`).
    down: Option<Mat>,
}

struct Kernels {
    embed: Function,
    /// A streamed FFN's output into the residual, and the next input prepared (`stream`).
    add_norm: Function,
    /// Attention over the f32 cache, or over the int8 one (`attention_i8`).
    attention: Function,
    /// The same launched as clusters (`attention_cluster`, `attention_i8_cluster`).
    attention_cluster: Function,
    /// The product kernels per weight type (`type_slot`): narrow, wide (see `mv_config`), and
    /// the same two preparing their own normed input (`_prep`, see `in_block_norm`).
    matvec: [[Function; 4]; PRODUCT_TYPES],
}

/// Weight types with product kernels (`type_slot`).
const PRODUCT_TYPES: usize = 10;

/// Where a weight type's product kernels are in `Kernels::matvec`, and their names' stem.
fn type_slot(ty: GpuType) -> (usize, &'static str) {
    match ty {
        GpuType::F32 => (0, "f32"),
        GpuType::F16 => (1, "f16"),
        GpuType::Q8_0 => (2, "q8_0"),
        GpuType::Q4_0 => (3, "q4_0"),
        GpuType::Q4_1 => (4, "q4_1"),
        GpuType::Q5_0 => (5, "q5_0"),
        GpuType::Q5_1 => (6, "q5_1"),
        GpuType::Q4_K => (7, "q4_k"),
        GpuType::Q5_K => (8, "q5_k"),
        GpuType::Q6_K => (9, "q6_k"),
    }
}

/// Held only so the weights are freed when the engine goes.
#[allow(dead_code)]
enum WeightMemory {
    Device(DeviceBuffer),
    Mapped(MappedHost),
}

/// Device buffers for one token's activations and the KV cache.
struct Activations {
    _buf: DeviceBuffer,
    /// The residual stream.
    x: u64,
    qkv: u64,
    /// [gate | up] of the FFN.
    gu: u64,
    logits: u64,
    /// [token, position] of the step.
    state: u64,
    /// The next product's input, prepared once by the kernel before it: floats (`xf`), and
    /// int8 blocks of 32 with their scales and sums (`xq`, 0 when no kernel reads int8).
    xf: u64,
    xq: u64,
    /// The down product's input (SwiGLU of gate/up), as `xf`/`xq`; apart from them because the
    /// gate/up blocks that finish a tile write it while others still read theirs.
    hf: u64,
    hq: u64,
    /// Blocks of a product that have finished (its last block prepares the next input).
    counter: u64,
    /// Each block's best logit and its row, for the two-phase argmax.
    part: u64,
    /// Rows of each SwiGLU tile finished so far (`Finish::SwiGluTiles`; the last block of a
    /// tile resets its count).
    swiglu_tiles: u64,
    /// Split attention: each slice's part (max, sum, values) per head, and the slices of each
    /// head finished so far (the last one joins them and resets the count).
    apart: u64,
    acount: u64,
}

/// What the last block of a product prepares for the next kernel (kernels-ptx/decode.cu).
#[derive(Clone, Copy)]
enum Finish {
    None,
    /// RMSNorm of the residual `x` with these weights.
    Norm(u64),
    /// SwiGLU of [gate | up].
    SwiGlu,
    /// SwiGLU of gate/up stacked tile by tile, each tile by the last block to finish it.
    SwiGluTiles,
    /// The greedy pick over the logits; advances the step's state.
    Argmax,
}

/// Where a product reads its input.
#[derive(Clone, Copy)]
enum Input {
    /// `xf`/`xq`, prepared by the kernel before.
    Prepared,
    /// The residual, normed with these weights by each block itself (`_prep` kernels).
    NormedInBlock(u64),
    /// `hf`/`hq`: SwiGLU of gate/up.
    FfnHidden,
}

/// Threads of a product kernel's block.
const MV_THREADS: usize = 256;
/// Rows each group of threads computes at once (MV_R in decode.cu).
const MV_R: usize = 2;

/// Units a thread of a wide product takes per round (MV_WIDE in decode.cu).
const MV_WIDE: usize = 4;

/// How a product is launched: which kernel, threads per row, blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MvConfig {
    wide: bool,
    tpr: usize,
    grid: usize,
}

/// The launch of a product over `m` on a GPU of `sm_count` multiprocessors. A row is `units`
/// units (a block of 32 for the integer types, 16 bytes of an f16 row, 4 floats of f32). Narrow:
/// about one unit per thread, threads per row a power of two in 8..=256. Wide: MV_WIDE units per
/// thread, a quarter of the threads per row, so four times the bytes in flight per thread and
/// fewer, longer blocks; it is taken when it still gives every multiprocessor a block. Small
/// products (most of a small model's step) stay narrow: there a step is a chain of short
/// kernels, and fewer blocks made them slower (docs/hil/round2.md); big ones (a large model's
/// layers, any model's logits) go wide, where bandwidth decides.
fn mv_config(m: &Mat, sm_count: usize, kernels: ProductKernels) -> MvConfig {
    let units = match m.ty {
        GpuType::F16 if m.cols.is_multiple_of(8) => m.cols / 8,
        GpuType::F32 if m.cols.is_multiple_of(4) => m.cols / 4,
        GpuType::F16 | GpuType::F32 => m.cols,
        _ => m.cols / 32,
    };
    let config = |wide: bool| {
        let per_thread = if wide { MV_WIDE } else { 1 };
        let tpr = units
            .div_ceil(per_thread)
            .next_power_of_two()
            .clamp(8, MV_THREADS);
        let grid = m.rows.div_ceil(MV_THREADS / tpr * MV_R);
        MvConfig { wide, tpr, grid }
    };
    // f32 rows and rows not in whole units have no wide kernel.
    let wide_kernel = match m.ty {
        GpuType::F32 => false,
        GpuType::F16 => m.cols.is_multiple_of(8),
        _ => true,
    };
    let wide = config(true);
    let take_wide = match kernels {
        ProductKernels::Auto => wide.grid >= sm_count.max(1),
        ProductKernels::Narrow => false,
        ProductKernels::Wide => true,
    };
    if wide_kernel && take_wide {
        wide
    } else {
        config(false)
    }
}

/// Fields drop in order: everything made on the GPU goes before `gpu` (declared last).
pub struct CudaEngine<'a> {
    _module: Module,
    k: Kernels,
    pub hyper: Hyper,
    pub context: usize,
    pub memory: MemoryModel,
    /// `CudaOptions::precision`.
    pub precision: Precision,
    /// Bytes of weights one token reads (every matrix once; the embedding row is negligible).
    pub weight_bytes_per_token: usize,
    /// What became of each matrix of the file in the weight image (printed at boot, as the
    /// CPU backend's).
    pub conversions: crate::quant::ConversionReport,
    /// Some product kernel quantizes its input to int8 (a quantized matrix is kept as such).
    pub int8_activations: bool,
    _weights: WeightMemory,
    embd: Mat,
    output: Mat,
    output_norm: u64,
    layers: Vec<GpuLayer>,
    a: Activations,
    kv: GpuKv,
    /// The KV cache holds int8 (`CudaOptions::f32_kv`).
    pub int8_kv: bool,
    /// Where the argmax kernel also writes each step's token (indexed by position), for the
    /// host to read without a copy.
    host_tokens: MappedHost,
    /// Host copy of [token, position] for the state upload (stable address).
    step: Box<[i32; 2]>,
    logits_host: &'a mut [f32],
    sample_idx: Option<&'a mut [u32]>,
    graph: Option<Graph>,
    /// `CudaOptions::products`.
    products: ProductKernels,
    /// The products that read a normed residual (q/k/v, gate/up, the logits) make it in every
    /// block (`_prep` kernels) instead of the last block of the product before doing it once
    /// while the whole GPU waits (the "tail"); for models up to IN_BLOCK_NORM_MAX_DIM.
    in_block_norm: bool,
    /// `CudaOptions::prefetch`.
    prefetch: bool,
    /// decode.cu's `pdl` argument: how this GPU runs `CudaOptions::dependent_launch`.
    pdl: i32,
    /// How attention splits over blocks, and `CudaOptions::attention_slice`.
    split: AttentionSplit,
    attention_slice: usize,
    /// What the device's `state` holds after the last step (token, position), so a step that
    /// continues from there needs no upload.
    device_state: Option<(u32, usize)>,
    /// The FFN streamed from a flash image (`boot_streamed`); None: in memory.
    stream: Option<stream::GpuStream<'a>>,
    /// Batched prefill's buffers (`CudaOptions::prefill_batch` > 1, the FFN in memory); None:
    /// prompts run token by token.
    prefill: Option<prefill::Prefill>,
    pub gpu: Gpu,
}

fn cuda(e: CudaError) -> EngineError {
    EngineError::Gpu(format!("GPU: {e}"))
}

impl<'a> CudaEngine<'a> {
    /// The kernels a batched prompt runs ("cuBLAS products, tensor-core attention"); None
    /// where prompts run token by token.
    pub fn prefill_kernels(&self) -> Option<String> {
        self.prefill.as_ref().map(|p| p.kernels())
    }

    /// Boots `model` whole on the GPU.
    pub fn boot(
        arenas: &'a mut Arenas,
        model: &ModelFile,
        opts: CudaOptions,
    ) -> Result<CudaEngine<'a>, EngineError> {
        Self::boot_with(arenas, model, opts, None)
    }

    /// Boots a flash image's dense part (`model`) on the GPU with its FFN streamed from the
    /// image (`stream::StreamedBoot`).
    pub fn boot_streamed(
        arenas: &'a mut Arenas,
        model: &ModelFile,
        opts: CudaOptions,
        streamed: StreamedBoot<'_>,
    ) -> Result<CudaEngine<'a>, EngineError> {
        Self::boot_with(arenas, model, opts, Some(streamed))
    }

    /// The sampler's sort buffer (vocab entries); handed out once.
    pub fn take_sample_buffer(&mut self) -> Option<&'a mut [u32]> {
        self.sample_idx.take()
    }

    /// Every kernel of one decode step, in order. Reads the token and position from
    /// `state` and leaves the next greedy token and position there.
    fn record_step(&self) -> CudaResult<()> {
        self.record_embed()?;
        for (l, w) in self.layers.iter().enumerate() {
            self.record_attention(l, w)?;
            self.record_ffn(l, w)?;
        }
        self.record_head()
    }

    /// Embedding of the token, and the first layer's normed input.
    fn record_embed(&self) -> CudaResult<()> {
        let h = &self.hyper;
        let (g, k, a) = (&self.gpu, &self.k, &self.a);
        let e = &self.embd;
        let first_norm = self
            .layers
            .first()
            .map_or(self.output_norm, |l| l.attn_norm);
        g.launch(
            k.embed,
            1,
            256,
            KernelArgs::default()
                .i32(e.ty as i32)
                .ptr(e.q)
                .ptr(e.d)
                .ptr(e.m)
                .ptr(e.qh)
                .i32(h.dim as i32)
                .ptr(a.state)
                .ptr(a.x)
                .ptr(first_norm)
                .f32(h.norm_eps)
                .ptr(a.xf)
                .ptr(a.xq)
                .i32(self.pdl),
        )
    }

    /// Layer `l`'s part of the cache: (keys, values, key scales, value scales, channel scales).
    fn layer_cache(&self, l: usize) -> (u64, u64, u64, u64, u64) {
        let h = &self.hyper;
        let kv_dim = h.n_kv_heads * h.head_dim;
        let ctx = self.context;
        let value_bytes = if self.int8_kv { 1 } else { 4 };
        let kc = self.kv.k.ptr + (l * ctx * kv_dim * value_bytes) as u64;
        let vc = self.kv.v.ptr + (l * ctx * kv_dim * value_bytes) as u64;
        let scales_at = |b: &Option<DeviceBuffer>, per_layer: usize| {
            b.as_ref().map_or(0, |b| b.ptr + (l * per_layer * 4) as u64)
        };
        let per_layer_scales = ctx * kv_dim / 32;
        (
            kc,
            vc,
            scales_at(&self.kv.k_scales, per_layer_scales),
            scales_at(&self.kv.v_scales, per_layer_scales),
            scales_at(&self.kv.key_scale, kv_dim),
        )
    }

    /// Layer `l`'s attention, added to the residual, whose norm it leaves for the FFN.
    fn record_attention(&self, l: usize, w: &GpuLayer) -> CudaResult<()> {
        let h = &self.hyper;
        let (g, k, a) = (&self.gpu, &self.k, &self.a);
        let head_dim = h.head_dim;
        let (kc, vc, ks, vs, key_scale) = self.layer_cache(l);
        // Attention: q, k, v of the normed input.
        for &(m, off) in &w.qkv {
            let bias = if w.qkv_bias != 0 {
                w.qkv_bias + off as u64 * 4
            } else {
                0
            };
            let out = a.qkv + off as u64 * 4;
            self.matvec(&m, self.normed(w.attn_norm), out, bias, false, Finish::None)?;
        }
        // Each head rotates its q and k, attends over positions 0..=pos of its KV head
        // (storing k and v of pos; split over up to `max_slices` blocks once the context
        // is long; on sm_90 a head's blocks are a thread block cluster up to `cluster_until`),
        // and writes wo's input; meanwhile at least `pf_blocks` more blocks pull the weights
        // from wo on into L2.
        let (pf_from, pf_lines, pf_blocks) = self.prefetch_after_attention(w);
        let grid = self
            .split
            .grid(self.split.blocks(h).max(h.n_heads + pf_blocks));
        let mut args = KernelArgs::default();
        args.ptr(a.qkv)
            .i32(h.n_heads as i32)
            .i32(h.n_kv_heads as i32)
            .i32(head_dim as i32)
            .f32(h.rope_base)
            .i32((h.rope_style == RopeStyle::HalfSplit) as i32)
            .ptr(a.state)
            .ptr(kc)
            .ptr(vc)
            .ptr(ks)
            .ptr(vs)
            .ptr(key_scale)
            .ptr(a.xf)
            .ptr(if w.wo.ty.int8_activations() { a.xq } else { 0 })
            .ptr(pf_from)
            .i32(pf_lines as i32)
            .ptr(a.apart)
            .ptr(a.acount)
            .i32(self.split.max_slices as i32)
            .i32(self.attention_slice as i32)
            .i32(self.split.max_group_slices as i32)
            .i32(self.split.group_from as i32)
            .i32(self.split.cluster as i32)
            .i32(self.split.cluster_slice as i32)
            .i32(self.split.cluster_until as i32)
            .i32(self.pdl);
        match self.split.cluster {
            0 => g.launch(k.attention, grid as u32, 1024, &mut args)?,
            c => g.launch_cluster(k.attention_cluster, grid as u32, 1024, c as u32, &mut args)?,
        }
        // Added to the residual (whose norm is the FFN's input).
        self.matvec(
            &w.wo,
            Input::Prepared,
            a.x,
            0,
            true,
            self.norm_tail(w.ffn_norm),
        )?;
        Ok(())
    }

    /// Layer `l`'s FFN in memory, added to the residual, whose norm it leaves for the next.
    fn record_ffn(&self, l: usize, w: &GpuLayer) -> CudaResult<()> {
        let a = &self.a;
        // Feed-forward: gate and up, then SwiGLU: tile by tile as the blocks finish, or by
        // the last block of the last launch; down is added to the residual and norms it
        // for the next layer (or the output).
        let n_gu = w.gate_up.len();
        for (i, &(m, off)) in w.gate_up.iter().enumerate() {
            let out = a.gu + off as u64 * 4;
            let fin = if w.gate_up_tiled {
                Finish::SwiGluTiles
            } else if i + 1 == n_gu {
                Finish::SwiGlu
            } else {
                Finish::None
            };
            self.matvec(&m, self.normed(w.ffn_norm), out, 0, false, fin)?;
        }
        let next_norm = self
            .layers
            .get(l + 1)
            .map_or(self.output_norm, |n| n.attn_norm);
        let fin = self.norm_tail(next_norm);
        let down = w.down.as_ref().expect("an FFN in memory");
        self.matvec(down, Input::FfnHidden, a.x, 0, true, fin)?;
        Ok(())
    }

    fn record_head(&self) -> CudaResult<()> {
        let a = &self.a;
        // Logits, and the greedy pick that advances the state.
        let normed = self.normed(self.output_norm);
        self.matvec(&self.output, normed, a.logits, 0, false, Finish::Argmax)
    }

    /// What the attention launch pulls into L2 for the products after it: from wo's first
    /// array up to down's (wo, the FFN norm, gate/up: the image keeps a layer's arrays in this
    /// order), at most half of the L2, as 128-byte lines; and how many blocks do it (one per
    /// multiprocessor, each of 1024 threads, so one line or a few each).
    fn prefetch_after_attention(&self, w: &GpuLayer) -> (u64, usize, usize) {
        if !self.prefetch {
            return (0, 0, 0);
        }
        match &w.down {
            Some(down) => prefetch_span(w.wo.q, down.q, self.gpu.l2_bytes, self.gpu.sm_count),
            None => (0, 0, 0),
        }
    }

    /// The input of a product that reads the residual normed with `nw`: made in each of its
    /// blocks, or already prepared by the tail of the product before.
    fn normed(&self, nw: u64) -> Input {
        if self.in_block_norm {
            Input::NormedInBlock(nw)
        } else {
            Input::Prepared
        }
    }

    /// What a product that adds to the residual leaves for the next one, which reads it normed
    /// with `nw`: nothing when that one norms it itself, else the tail.
    fn norm_tail(&self, nw: u64) -> Finish {
        if self.in_block_norm {
            Finish::None
        } else {
            Finish::Norm(nw)
        }
    }

    /// `out = (acc ? out : 0) + W in + bias`, then `fin`; `in` as `input` says.
    fn matvec(
        &self,
        m: &Mat,
        input: Input,
        out: u64,
        bias: u64,
        acc: bool,
        fin: Finish,
    ) -> CudaResult<()> {
        let h = &self.hyper;
        let a = &self.a;
        let mv = mv_config(m, self.gpu.sm_count as usize, self.products);
        let (in_xf, in_xq, norm) = match input {
            Input::Prepared => (a.xf, a.xq, None),
            Input::NormedInBlock(nw) => (a.xf, a.xq, Some(nw)),
            Input::FfnHidden => (a.hf, a.hq, None),
        };
        let (fin_xf, fin_xq) = match fin {
            Finish::SwiGlu | Finish::SwiGluTiles => (a.hf, a.hq),
            _ => (a.xf, a.xq),
        };
        let f = self.k.matvec[type_slot(m.ty).0][mv.wide as usize + 2 * norm.is_some() as usize];
        // The block's own input: floats for the float kernels, else int8 blocks with their
        // scales and sums (the layout of `xq`).
        let shared = match (norm, m.ty.int8_activations()) {
            (None, _) => 0,
            (Some(_), false) => m.cols * 4,
            (Some(_), true) => m.cols + m.cols / 32 * 8,
        };
        let (fin_mode, fin_src, fin_nw, fin_n) = match fin {
            Finish::None => (0, 0, 0, 0),
            Finish::Norm(nw) => (1, a.x, nw, h.dim),
            Finish::SwiGlu => (2, a.gu, 0, h.hidden_dim),
            Finish::Argmax => (3, 0, 0, 0),
            Finish::SwiGluTiles => (4, a.gu, 0, h.hidden_dim),
        };
        let counter = match fin {
            Finish::SwiGluTiles => a.swiglu_tiles,
            _ => a.counter,
        };
        let mut args = KernelArgs::default();
        args.ptr(m.q)
            .ptr(m.d)
            .ptr(m.m)
            .ptr(m.qh)
            .i32(m.rows as i32)
            .i32(m.cols as i32)
            .i32(mv.tpr as i32)
            .ptr(in_xf)
            .ptr(in_xq)
            .ptr(out)
            .ptr(bias)
            .i32(acc as i32)
            .i32(fin_mode)
            .ptr(fin_src)
            .ptr(fin_nw)
            .i32(fin_n as i32)
            .ptr(fin_xf)
            .ptr(fin_xq)
            .f32(h.norm_eps)
            .ptr(counter)
            .ptr(a.part)
            .ptr(a.state)
            .ptr(self.host_tokens.dev)
            .ptr(a.x)
            .ptr(norm.unwrap_or(0))
            .i32(self.pdl);
        self.gpu.launch_shared(
            f,
            mv.grid as u32,
            MV_THREADS as u32,
            shared as u32,
            &mut args,
        )
    }

    /// How attention splits over blocks, as boot chose it for this GPU and model.
    pub fn attention_split(&self) -> AttentionSplit {
        self.split
    }

    /// Queues one step for `token` at `pos` (state upload, then the graph or every kernel).
    fn queue_step(&mut self, token: u32, pos: usize) -> CudaResult<()> {
        assert!(
            pos < self.context,
            "position {pos} past the context of {}",
            self.context
        );
        assert!(
            (token as usize) < self.hyper.vocab_size,
            "token {token} past the vocabulary of {}",
            self.hyper.vocab_size
        );
        if self.device_state != Some((token, pos)) {
            *self.step = [token as i32, pos as i32];
            let bytes: &[u8; 8] = bytemuck_step(&self.step);
            self.gpu.upload_async(self.a.state, bytes)?;
        }
        // The step's last kernel writes its greedy pick and the next position (read in
        // `step_greedy`); until then the device state is not known here.
        self.device_state = None;
        if self.stream.is_some() {
            return self.streamed_step(pos);
        }
        self.launch_step()
    }

    /// One step from whatever token and position the device state holds.
    fn launch_step(&self) -> CudaResult<()> {
        match &self.graph {
            Some(g) => self.gpu.launch_graph(g),
            None => self.record_step(),
        }
    }

    fn step_logits(&mut self, token: u32, pos: usize) -> CudaResult<()> {
        self.queue_step(token, pos)?;
        let dst = f32_bytes_mut(self.logits_host);
        self.gpu.download_async(dst, self.a.logits)?;
        self.gpu.sync()
    }

    fn step_greedy(&mut self, token: u32, pos: usize) -> CudaResult<u32> {
        self.queue_step(token, pos)?;
        self.gpu.sync()?;
        let next = self.host_token_at(pos);
        self.device_state = Some((next, pos + 1));
        Ok(next)
    }

    fn host_token_at(&self, pos: usize) -> u32 {
        assert!(pos < self.context);
        // SAFETY: the mapping holds `context` aligned words, and the kernel that wrote this one
        // has finished (callers synchronize the stream first).
        unsafe { std::ptr::read_volatile((self.host_tokens.host as *const u32).add(pos)) }
    }

    /// Greedy decoding of `out.len()` tokens after `token` at `pos`, steps launched back to back
    /// with no host round trip between them (each step's argmax feeds the next on the device);
    /// one synchronization at the end. End-of-text is not a stop: this is for measuring.
    pub fn greedy_run(&mut self, token: u32, pos: usize, out: &mut [u32]) -> CudaResult<()> {
        assert!(pos + out.len() <= self.context);
        if out.is_empty() {
            return Ok(());
        }
        if self.stream.is_some() {
            // Each streamed step waits on the host anyway (its reads).
            let mut t = token;
            for (i, o) in out.iter_mut().enumerate() {
                t = self.step_greedy(t, pos + i)?;
                *o = t;
            }
            return Ok(());
        }
        self.queue_step(token, pos)?;
        for _ in 1..out.len() {
            // The device state already holds the last pick and the next position.
            self.launch_step()?;
        }
        self.gpu.sync()?;
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.host_token_at(pos + i);
        }
        self.device_state = None;
        Ok(())
    }
}

/// Bytes of buffers of `sizes` carved from one device allocation, each aligned to 256.
fn carved_bytes(sizes: &[usize]) -> usize {
    sizes.iter().map(|s| s.next_multiple_of(256)).sum()
}

/// One device allocation (zeroed) carved into buffers of `sizes`, each aligned to 256: the
/// allocation and each buffer's address.
fn alloc_carved<const N: usize>(
    gpu: &Gpu,
    sizes: [usize; N],
) -> Result<(DeviceBuffer, [u64; N]), EngineError> {
    let buf = gpu.alloc(carved_bytes(&sizes)).map_err(cuda)?;
    let mut ptrs = [0u64; N];
    let mut off = 0u64;
    for (p, s) in ptrs.iter_mut().zip(sizes) {
        *p = buf.ptr + off;
        off += s.next_multiple_of(256) as u64;
    }
    Ok((buf, ptrs))
}

fn bytemuck_step(s: &[i32; 2]) -> &[u8; 8] {
    // SAFETY: [i32; 2] is 8 plain bytes with no padding; u8 has alignment 1.
    unsafe { &*(s as *const [i32; 2] as *const [u8; 8]) }
}

/// Floats to the device at boot (a synchronous copy through a byte buffer).
fn upload_f32(gpu: &Gpu, dst: u64, v: &[f32]) -> CudaResult<()> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    gpu.upload(dst, &bytes)
}

fn f32_bytes_mut(s: &mut [f32]) -> &mut [u8] {
    // SAFETY: f32 has no invalid bit patterns and u8 alignment 1; the length is exact.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, s.len() * 4) }
}

/// The prefetch of `start..end` (device addresses) on a GPU with `l2_bytes` of L2 and
/// `sm_count` multiprocessors: from `start`, at most half the L2, in whole 128-byte lines, by
/// one block per multiprocessor; nothing when the span is empty.
fn prefetch_span(start: u64, end: u64, l2_bytes: i32, sm_count: i32) -> (u64, usize, usize) {
    let bytes = (end.saturating_sub(start) as usize).min(l2_bytes.max(0) as usize / 2);
    if bytes < 128 {
        return (0, 0, 0);
    }
    (start, bytes / 128, sm_count.max(1) as usize)
}

fn fault(e: CudaError) -> ! {
    panic!("GPU fault during decode: {e}")
}

impl Decoder for CudaEngine<'_> {
    fn hyper(&self) -> &Hyper {
        &self.hyper
    }
    fn context(&self) -> usize {
        self.context
    }
    fn forward(&mut self, token: u32, pos: usize) -> &mut [f32] {
        self.step_logits(token, pos).unwrap_or_else(|e| fault(e));
        self.logits_host
    }
    fn feed(&mut self, token: u32, pos: usize) {
        self.queue_step(token, pos).unwrap_or_else(|e| fault(e));
    }
    /// All but the last token batched (`prefill_batched`) where the engine has the buffers,
    /// then the last as a decode step.
    fn prefill(&mut self, tokens: &[u32], pos: usize) -> &mut [f32] {
        let last = tokens.len() - 1;
        if self.prefill.is_some() && last > 0 {
            self.prefill_batched(&tokens[..last], pos)
                .unwrap_or_else(|e| fault(e));
        } else {
            for (i, &t) in tokens[..last].iter().enumerate() {
                self.feed(t, pos + i);
            }
        }
        self.forward(tokens[last], pos + last)
    }
    fn forward_greedy(&mut self, token: u32, pos: usize) -> u32 {
        self.step_greedy(token, pos).unwrap_or_else(|e| fault(e))
    }
    fn bind_thread(&mut self) {
        self.gpu.bind().unwrap_or_else(|e| fault(e));
    }
    fn take_error(&mut self) -> Option<crate::stream::ReadError> {
        self.stream.as_mut()?.take_error()
    }
    fn begin_sequence(&mut self) {
        if let Some(s) = self.stream.as_mut() {
            s.begin_sequence();
        }
    }
    fn stream_stats(&self) -> Option<super::StreamStats> {
        CudaEngine::stream_stats(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cuda_options::int8_kv;

    fn mat(ty: GpuType, rows: usize, cols: usize) -> Mat {
        Mat {
            ty,
            rows,
            cols,
            q: 0,
            d: 0,
            m: 0,
            qh: 0,
        }
    }

    /// The prefetch during attention: half the L2 at most (H200: 50 MiB, Orin: 4 MiB), whole
    /// lines, one block per multiprocessor, nothing for an empty or reversed span.
    #[test]
    fn prefetch_spans_half_the_l2_at_most() {
        let mib = 1 << 20;
        // 1.5B q8_0: wo and gate/up are 32 MB, more than half the H200's L2.
        assert_eq!(
            prefetch_span(4096, 4096 + 32 * mib as u64, 50 * mib, 132),
            (4096, 25 * mib as usize / 128, 132)
        );
        // A small layer fits whole; a part line is left out.
        assert_eq!(prefetch_span(0, 1000, 4 * mib, 16), (0, 7, 16));
        assert_eq!(prefetch_span(0, 64, 4 * mib, 16), (0, 0, 0));
        assert_eq!(prefetch_span(5000, 4096, 50 * mib, 132), (0, 0, 0));
        assert_eq!(prefetch_span(0, 4096, 0, 132), (0, 0, 0));
    }

    /// The int8 cache where the CPU keeps one and the kernel takes the head (16 values a
    /// lane, at most 8 lanes): SmolLM2 and Qwen2.5 (heads of 64 and 128) at w8a8/w4a8; f32
    /// for f16/native, `f32_kv`, stories260K's heads of 8 and heads of 256.
    #[test]
    fn kv_cache_is_int8_at_w8a8_and_w4a8_where_the_head_allows() {
        for p in [Precision::W8a8, Precision::W4a8] {
            assert!(int8_kv(p, false, 64) && int8_kv(p, false, 128) && int8_kv(p, false, 32));
            assert!(!int8_kv(p, true, 64), "f32_kv keeps f32");
            assert!(!int8_kv(p, false, 8) && !int8_kv(p, false, 48) && !int8_kv(p, false, 256));
        }
        assert!(!int8_kv(Precision::Native, false, 64) && !int8_kv(Precision::F16, false, 64));
    }

    /// Every weight type of the image has a slot of its own and its four product kernels in
    /// each embedded PTX (the K-quants and Q5_1 included), by the names boot asks for.
    #[test]
    fn every_weight_type_has_its_product_kernels_in_the_ptx() {
        use GpuType::*;
        let types = [F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K];
        let mut slots: Vec<usize> = types.iter().map(|&t| type_slot(t).0).collect();
        slots.sort();
        assert_eq!(slots, (0..PRODUCT_TYPES).collect::<Vec<_>>());
        for cc in [(7, 2), (8, 7), (9, 0)] {
            let ptx = ptx_for("decode", cc).expect("decode PTX embedded");
            for ty in types {
                let stem = type_slot(ty).1;
                let wides: &[&str] = if ty == F32 { &[""] } else { &["", "_wide"] };
                for wide in wides {
                    for prep in ["", "_prep"] {
                        let entry = format!(".entry matvec_{stem}{wide}{prep}(");
                        assert!(ptx.contains(&entry), "{cc:?}: no {entry}");
                    }
                }
            }
        }
    }

    /// Wide where it still gives each of an H200's 132 multiprocessors a block, narrow
    /// otherwise; every launch covers each row in whole rounds and every row of the matrix.
    #[test]
    fn products_go_wide_only_when_they_fill_the_gpu() {
        let sms = 132;
        // Llama-2-7B's [gate | up] at q4_0: 128 units a row, 32 threads x 4 units.
        let gate_up = mat(GpuType::Q4_0, 2 * 11008, 4096);
        let c = mv_config(&gate_up, sms, ProductKernels::Auto);
        assert_eq!((c.wide, c.tpr, c.grid), (true, 32, 22016 / 16));
        // SmolLM2's [q | k | v]: 18 units a row; wide would give 15 blocks.
        let qkv = mat(GpuType::Q4_0, 960, 576);
        let c = mv_config(&qkv, sms, ProductKernels::Auto);
        assert_eq!((c.wide, c.tpr, c.grid), (false, 32, 960 / 16));
        assert!(mv_config(&qkv, sms, ProductKernels::Wide).wide);
        assert!(!mv_config(&gate_up, sms, ProductKernels::Narrow).wide);
        // f32 rows have no wide kernel, whatever is asked.
        assert!(!mv_config(&mat(GpuType::F32, 32000, 4096), sms, ProductKernels::Wide).wide);
        for ty in [GpuType::F16, GpuType::Q8_0, GpuType::Q4_1, GpuType::F32] {
            for (rows, cols) in [(49152, 576), (4096, 11008), (151936, 896), (64, 64)] {
                for k in [
                    ProductKernels::Auto,
                    ProductKernels::Narrow,
                    ProductKernels::Wide,
                ] {
                    let m = mat(ty, rows, cols);
                    let c = mv_config(&m, sms, k);
                    let units = if ty == GpuType::F16 {
                        cols / 8
                    } else if ty == GpuType::F32 {
                        cols / 4
                    } else {
                        cols / 32
                    };
                    let per_thread = if c.wide { MV_WIDE } else { 1 };
                    assert!(c.tpr.is_power_of_two() && (8..=MV_THREADS).contains(&c.tpr));
                    assert!(
                        c.tpr * per_thread >= units || c.tpr == MV_THREADS,
                        "{ty:?} {rows}x{cols} {c:?}"
                    );
                    assert!(
                        c.grid * (MV_THREADS / c.tpr) * MV_R >= rows,
                        "{ty:?} {rows}x{cols} {c:?}"
                    );
                }
            }
        }
    }
}
