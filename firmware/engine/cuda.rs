//! The decode step on the GPU: the same forward pass as `Engine::forward` (engine/mod.rs), as a
//! fixed sequence of kernel launches (`record_step` in cuda_launch.rs, readable top to bottom)
//! that boot captures once into a CUDA graph. The token and position live in device memory and
//! the last kernel advances them, so a step is one graph launch: launch overhead, which rules
//! small models, is paid once per token instead of once per kernel.

use super::cuda_options::{
    check_product_tpr, CudaOptions, DependentLaunch, InBlockNorm, PrefillProducts, ProductKernels,
    ProductRole, INT8_KV_MAX_HEAD_DIM, IN_BLOCK_NORM_MAX_DIM, PREFETCH_AHEAD_L2_SHARE,
};
use super::{Arenas, Decoder, EngineError};
use crate::backend::cuda::driver::{
    CudaError, CudaResult, DeviceBuffer, Function, Gpu, Graph, MappedHost, Module,
};
use crate::backend::cuda::ptx_for;
use crate::backend::cuda::weights::{GpuType, ImageWriter, MatLayout, SWIGLU_TILE};
use crate::board::MemoryModel;
use crate::boot::{ArenaKind, Plan};
use crate::model::{Hyper, ModelFile};
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

#[path = "cuda_launch.rs"]
mod launch;

#[path = "cuda_timeline.rs"]
mod timeline;
use launch::{mv_config, Finish, Input};
pub use stream::{Prioritization, StreamedBoot};
pub use timeline::{LaunchLabel, LaunchTimes};

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
    /// Bytes of its arrays (they follow `q` in the image, each aligned: see weights.rs).
    bytes: usize,
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
    /// Attention over the f32 cache, the f16 one (`attention_f16`) or the int8 one
    /// (`attention_i8`).
    attention: Function,
    /// The same launched as clusters (`attention_cluster`, `attention_f16_cluster`,
    /// `attention_i8_cluster`).
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
    /// What the KV cache holds (`CudaOptions::kv`).
    pub kv_precision: crate::kv::KvPrecision,
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
    /// `CudaOptions::product_tpr`.
    product_tpr: [usize; ProductRole::ALL.len()],
    /// The products that read a normed residual (q/k/v, gate/up, the logits) make it in every
    /// block (`_prep` kernels) instead of the last block of the product before doing it once
    /// while the whole GPU waits (the "tail"); for models up to IN_BLOCK_NORM_MAX_DIM.
    in_block_norm: bool,
    /// `CudaOptions::norm_tail_for`.
    norm_tail_for: [bool; ProductRole::ALL.len()],
    /// `CudaOptions::prefetch`.
    prefetch: bool,
    /// The step's timeline's slots (`CudaOptions::timeline`); None: no kernel writes one.
    timeline: Option<timeline::Timeline>,
    /// `CudaOptions::prefetch_ahead` in bytes; 0 below sm_90 (no bulk prefetch), for weights
    /// in host memory and for a streamed FFN.
    prefetch_ahead: usize,
    /// `CudaOptions::repeat_product`.
    repeat_product: Option<ProductRole>,
    /// `CudaOptions::swiglu_cluster`, on a GPU with clusters (sm_90).
    swiglu_cluster: bool,
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
    use crate::engine::cuda_options::kv_precision;
    use crate::kv::{KvChoice, KvPrecision::*};

    /// The int8 cache where the CPU keeps one and the kernel takes the head (16 values a
    /// lane, at most 8 lanes): SmolLM2 and Qwen2.5 (heads of 64 and 128) at w8a8/w4a8; f16
    /// for f16/native, stories260K's heads of 8 and heads of 256; f32 only when asked.
    #[test]
    fn kv_cache_is_int8_at_w8a8_and_w4a8_where_the_head_allows() {
        let auto = KvChoice::Auto;
        for p in [Precision::W8a8, Precision::W4a8] {
            for hd in [32, 64, 128] {
                assert_eq!(kv_precision(p, auto, hd), I8);
            }
            assert_eq!(kv_precision(p, KvChoice::F32, 64), F32, "asked for f32");
            assert_eq!(kv_precision(p, KvChoice::F16, 64), F16, "asked for f16");
            for hd in [8, 48, 256] {
                assert_eq!(kv_precision(p, auto, hd), F16, "head of {hd}");
            }
        }
        for p in [Precision::Native, Precision::F16] {
            assert_eq!(kv_precision(p, auto, 64), F16);
            assert_eq!(kv_precision(p, KvChoice::F32, 64), F32);
        }
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
}
