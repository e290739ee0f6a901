//! Batched prefill on the GPU (kernels-ptx/prefill.cu): a prompt goes through each layer
//! `batch` tokens at a time, in the order of `Engine::forward`, readable top to bottom in
//! `run_chunk`. The products are matrix-matrix (tensor cores), so each weight is read once a
//! chunk instead of once a token; attention is causal over the chunk and the cache before it,
//! and every position's keys and values land in the KV cache as decode stores them. The
//! prompt's last token then runs as a decode step (the logits, the greedy pick), so what
//! follows a prompt is decode's own path.
//!
//! The products run on cuBLAS where the library loads (`backend::cuda::blas`; integer and
//! K-quant weights dequantized to f16 into a scratch matrix first), else on the project's PTX
//! kernel; attention runs on tensor cores (`attention_tc64`/`128`) where the GPU and the head
//! allow, else on the scalar kernel. `CudaOptions` can ask for the PTX products and the scalar
//! attention (the bench's ablations).
//!
//! Memory: the chunk's activations, cuBLAS's workspace and the dequantization scratch are one
//! device buffer made at boot (`PrefillBuffers::bytes`, counted in the board's activation
//! budget by the boot), and the prompt's tokens a pinned buffer of `context` words; a prefill
//! allocates nothing.

use super::{alloc_carved, carved_bytes, cuda, CudaEngine, Mat};
use crate::backend::cuda::blas::Blas;
use crate::backend::cuda::driver::{
    CudaResult, DeviceBuffer, Function, Gpu, KernelArgs, MappedHost, Module,
};
use crate::backend::cuda::ptx_for;
use crate::backend::cuda::weights::{GpuType, MatLayout};
use crate::engine::EngineError;
use crate::model::{Hyper, RopeStyle};

/// Tokens a product block takes (GN in prefill.cu). A chunk need not be a multiple of it; one
/// smaller than it leaves part of each block idle.
const GEMM_TOKENS: usize = 64;
/// Weight rows a product block takes (GM in prefill.cu).
const GEMM_ROWS: usize = 64;
/// Threads of a product block and of an attention block.
const GEMM_THREADS: u32 = 128;
const ATTENTION_THREADS: u32 = 256;
/// Queries a tensor-core attention block takes (AQ in prefill.cu), 16 a warp.
const ATTENTION_TC_QUERIES: usize = 64;
const ATTENTION_TC_THREADS: u32 = 128;
/// Most bytes of the f16 matrix that integer and K-quant weights are dequantized into for
/// cuBLAS; a larger matrix goes through it in slabs of rows. 64 MiB holds a 1.5B model's
/// gate/up (55 MB) whole: one product where slabs would take two smaller, slower ones.
const DEQUANT_SCRATCH_MAX: usize = 64 << 20;

struct PrefillKernels {
    embed_rows: Function,
    norm_rows: Function,
    swiglu_rows: Function,
    gemm: Function,
    dequant_rows: Function,
    bias_rows: Function,
    rope_store: Function,
    attention_rows: Function,
    attention_tc64: Function,
    attention_tc128: Function,
}

/// cuBLAS and the f16 matrix that non-f16 weights are dequantized into for it.
struct BlasProducts {
    blas: Blas,
    scratch: u64,
    scratch_bytes: usize,
}

/// Bytes of cuBLAS's workspace and of the dequantization scratch for the batched products of
/// `mats` on a GPU of compute capability `cc`: the largest non-f16 matrix in f16, at most
/// `DEQUANT_SCRATCH_MAX` (none where every matrix is f16).
pub fn blas_bytes<'a>(cc: (i32, i32), mats: impl Iterator<Item = &'a MatLayout>) -> [usize; 2] {
    let scratch = mats
        .filter(|m| m.ty != GpuType::F16)
        .map(|m| (m.rows * m.cols * 2).min(DEQUANT_SCRATCH_MAX))
        .max()
        .unwrap_or(0);
    [crate::backend::cuda::blas::workspace_bytes(cc), scratch]
}

/// The chunk's activations on the device (prefill.cu's layouts) and the prompt's tokens.
pub(super) struct Prefill {
    /// cuBLAS for the products; None: prefill.cu's `gemm`. First: the handle goes before its
    /// workspace in `_buf`.
    blas: Option<BlasProducts>,
    _module: Module,
    k: PrefillKernels,
    /// Most tokens a chunk holds (the board's `prefill_batch`, or `CudaOptions::prefill_batch`).
    pub batch: usize,
    _buf: DeviceBuffer,
    x: u64,
    xh: u64,
    qkv: u64,
    gu: u64,
    /// Halves per token of `xh` (the widest product input, rounded up to 32).
    ldx: usize,
    ldq: usize,
    ldg: usize,
    /// The prompt's tokens by position, where `embed_rows` reads them.
    tokens: MappedHost,
    /// Attention's queries a block and positions a tile (prefill.cu `attention_rows`).
    qt: usize,
    kt: usize,
    /// The tensor-core attention kernel for this head, where it runs; None: `attention_rows`.
    attention_tc: Option<Function>,
    /// Why the products are not on cuBLAS though they were asked to be (for `describe`).
    blas_missing: Option<String>,
}

/// Sizes of the chunk's buffers: [x, xh, qkv, gu, cuBLAS workspace, dequantization scratch]
/// in bytes (the last two 0 without cuBLAS), and xh's row in halves.
pub struct PrefillBuffers {
    pub sizes: [usize; 6],
    pub ldx: usize,
}

impl PrefillBuffers {
    /// `blas`: `blas_bytes`, or zeros for the PTX products.
    pub fn of(h: &Hyper, batch: usize, blas: [usize; 2]) -> PrefillBuffers {
        let q_dim = h.n_heads * h.head_dim;
        let kv_dim = h.n_kv_heads * h.head_dim;
        let ldx = h.dim.max(q_dim).max(h.hidden_dim).next_multiple_of(32);
        PrefillBuffers {
            sizes: [
                batch * h.dim * 4,
                batch * ldx * 2,
                batch * (q_dim + 2 * kv_dim) * 4,
                batch * 2 * h.hidden_dim * 4,
                blas[0],
                blas[1],
            ],
            ldx,
        }
    }

    /// Device bytes of the chunk (each buffer aligned to 256).
    pub fn bytes(&self) -> usize {
        carved_bytes(&self.sizes)
    }
}

/// Attention's queries a block and positions a tile for a head of `head_dim` (its shared memory
/// stays under 48 KiB: heads over 128 take half of each).
fn attention_tiles(head_dim: usize) -> (usize, usize) {
    if head_dim <= 128 {
        (16, 32)
    } else {
        (8, 16)
    }
}

impl Prefill {
    /// `blas`: `blas_bytes` where cuBLAS was asked for and loads (zeros otherwise);
    /// `tensor_attention`: `CudaOptions::prefill_tensor_attention`.
    pub(super) fn boot(
        gpu: &Gpu,
        h: &Hyper,
        context: usize,
        batch: usize,
        blas: [usize; 2],
        tensor_attention: bool,
    ) -> Result<Prefill, EngineError> {
        let ptx = ptx_for("prefill", gpu.compute_capability).ok_or_else(|| {
            EngineError::Unsupported("no prefill PTX embedded in this build".into())
        })?;
        let module = gpu.load_module(ptx).map_err(cuda)?;
        let f = |n: &str| module.function(n).map_err(cuda);
        let k = PrefillKernels {
            embed_rows: f("embed_rows")?,
            norm_rows: f("norm_rows")?,
            swiglu_rows: f("swiglu_rows")?,
            gemm: f("gemm")?,
            dequant_rows: f("dequant_rows")?,
            bias_rows: f("bias_rows")?,
            rope_store: f("rope_store")?,
            attention_rows: f("attention_rows")?,
            attention_tc64: f("attention_tc64")?,
            attention_tc128: f("attention_tc128")?,
        };
        let sizes = PrefillBuffers::of(h, batch, blas);
        let (buf, ptrs) = alloc_carved(gpu, sizes.sizes)?;
        let [x, xh, qkv, gu, workspace, scratch] = ptrs;
        let (qt, kt) = attention_tiles(h.head_dim);
        // mma.sync and ldmatrix need sm_80; the kernel's tiles are written for two widths.
        let attention_tc = match h.head_dim {
            _ if !tensor_attention || gpu.compute_capability.0 < 8 => None,
            64 => Some(k.attention_tc64),
            128 => Some(k.attention_tc128),
            _ => None,
        };
        // A library that loads but will not open leaves the PTX products, and says why.
        let (blas, blas_missing) = if blas[0] == 0 {
            (None, None)
        } else {
            match Blas::open(gpu, workspace, blas[0]) {
                Ok(b) => (
                    Some(BlasProducts {
                        blas: b,
                        scratch,
                        scratch_bytes: blas[1],
                    }),
                    None,
                ),
                Err(e) => (None, Some(e.to_string())),
            }
        };
        Ok(Prefill {
            _module: module,
            k,
            batch,
            _buf: buf,
            x,
            xh,
            qkv,
            gu,
            ldx: sizes.ldx,
            ldq: (h.n_heads + 2 * h.n_kv_heads) * h.head_dim,
            ldg: 2 * h.hidden_dim,
            tokens: gpu.alloc_mapped(4 * context).map_err(cuda)?,
            qt,
            kt,
            attention_tc,
            blas,
            blas_missing,
        })
    }

    /// The kernels a chunk runs, for `describe`.
    pub fn kernels(&self) -> String {
        format!(
            "{} products, {} attention",
            match (&self.blas, &self.blas_missing) {
                (Some(_), _) => "cuBLAS".to_string(),
                (None, Some(why)) => format!("PTX (cuBLAS: {why})"),
                (None, None) => "PTX".to_string(),
            },
            if self.attention_tc.is_some() {
                "tensor-core"
            } else {
                "scalar"
            }
        )
    }
}

impl CudaEngine<'_> {
    /// Runs `tokens` at positions `pos..` through every layer in chunks (their logits are not
    /// made), leaving their keys and values in the cache; returns once the GPU is done.
    pub(super) fn prefill_batched(&mut self, tokens: &[u32], pos: usize) -> CudaResult<()> {
        let Some(p) = self.prefill.as_mut() else {
            unreachable!("prefill_batched without its buffers")
        };
        assert!(pos + tokens.len() <= self.context);
        let words = p.tokens.as_mut_slice();
        for (i, &t) in tokens.iter().enumerate() {
            assert!(
                (t as usize) < self.hyper.vocab_size,
                "token {t} past the vocabulary"
            );
            words[4 * (pos + i)..4 * (pos + i + 1)].copy_from_slice(&t.to_le_bytes());
        }
        let batch = p.batch;
        let mut done = 0;
        while done < tokens.len() {
            let n = batch.min(tokens.len() - done);
            self.run_chunk(pos + done, n)?;
            done += n;
        }
        // The decode step's state no longer matches what the device holds next.
        self.device_state = None;
        self.gpu.sync()
    }

    /// The forward pass of the `n` prompt tokens at positions `p0..p0 + n`, every layer.
    fn run_chunk(&self, p0: usize, n: usize) -> CudaResult<()> {
        let h = &self.hyper;
        let p = self.prefill.as_ref().expect("prefill buffers");
        let (g, k) = (&self.gpu, &p.k);
        let e = &self.embd;
        let threads = 256;
        g.launch(
            k.embed_rows,
            n as u32,
            threads,
            KernelArgs::default()
                .i32(e.ty as i32)
                .ptr(e.q)
                .ptr(e.d)
                .ptr(e.m)
                .ptr(e.qh)
                .i32(h.dim as i32)
                .ptr(p.tokens.dev + 4 * p0 as u64)
                .ptr(p.x),
        )?;
        for (l, w) in self.layers.iter().enumerate() {
            // Attention: q|k|v of the normed residual, RoPE and the cache, then wo added.
            self.norm_rows(p, w.attn_norm, n)?;
            for &(m, off) in &w.qkv {
                let bias = if w.qkv_bias != 0 {
                    w.qkv_bias + off as u64 * 4
                } else {
                    0
                };
                self.gemm(p, &m, n, p.qkv + off as u64 * 4, p.ldq, bias, false)?;
            }
            self.rope_store(p, l, p0, n)?;
            self.attention_rows(p, l, p0, n)?;
            self.gemm(p, &w.wo, n, p.x, h.dim, 0, true)?;
            // Feed-forward: gate|up of the normed residual, SwiGLU, then down added.
            self.norm_rows(p, w.ffn_norm, n)?;
            for &(m, off) in &w.gate_up {
                self.gemm(p, &m, n, p.gu + off as u64 * 4, p.ldg, 0, false)?;
            }
            g.launch(
                k.swiglu_rows,
                n as u32,
                threads,
                KernelArgs::default()
                    .ptr(p.gu)
                    .i32(p.ldg as i32)
                    .i32(h.hidden_dim as i32)
                    .i32(w.gate_up_tiled as i32)
                    .ptr(p.xh)
                    .i32(p.ldx as i32),
            )?;
            let down = w.down.as_ref().expect("an FFN in memory");
            self.gemm(p, down, n, p.x, h.dim, 0, true)?;
        }
        Ok(())
    }

    /// xh = RMSNorm(x, nw) in f16, per token.
    fn norm_rows(&self, p: &Prefill, nw: u64, n: usize) -> CudaResult<()> {
        let h = &self.hyper;
        self.gpu.launch(
            p.k.norm_rows,
            n as u32,
            256,
            KernelArgs::default()
                .ptr(p.x)
                .ptr(nw)
                .i32(h.dim as i32)
                .f32(h.norm_eps)
                .ptr(p.xh)
                .i32(p.ldx as i32),
        )
    }

    /// y[t] = (acc ? y[t] : 0) + m xh[t] + bias for the n tokens (y's rows `ldy` floats apart):
    /// cuBLAS where the engine has it (and a non-f16 matrix's columns fill whole 16s, as the
    /// dequantization writes them), else prefill.cu's `gemm`.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        p: &Prefill,
        m: &Mat,
        n: usize,
        y: u64,
        ldy: usize,
        bias: u64,
        acc: bool,
    ) -> CudaResult<()> {
        match &p.blas {
            Some(b) if m.ty == GpuType::F16 || m.cols.is_multiple_of(16) => {
                self.gemm_blas(p, b, m, n, y, ldy, acc)?;
                if bias != 0 {
                    self.gpu.launch(
                        p.k.bias_rows,
                        n as u32,
                        256,
                        KernelArgs::default()
                            .ptr(y)
                            .i32(ldy as i32)
                            .i32(m.rows as i32)
                            .ptr(bias),
                    )?;
                }
                Ok(())
            }
            _ => self.gemm_ptx(p, m, n, y, ldy, bias, acc),
        }
    }

    /// `gemm` on cuBLAS, without the bias: f16 weights as they are, others dequantized to f16
    /// through the scratch, as many rows at a time as it holds.
    #[allow(clippy::too_many_arguments)]
    fn gemm_blas(
        &self,
        p: &Prefill,
        b: &BlasProducts,
        m: &Mat,
        n: usize,
        y: u64,
        ldy: usize,
        acc: bool,
    ) -> CudaResult<()> {
        let beta = if acc { 1.0 } else { 0.0 };
        if m.ty == GpuType::F16 {
            return b
                .blas
                .gemm_f16(m.rows, n, m.cols, m.q, p.xh, p.ldx, y, ldy, beta);
        }
        // `blas_bytes` sized the scratch for at least one row of the widest matrix. Slabs of
        // whole 128s of rows where it holds more: each slab's output then starts aligned, and
        // cuBLAS picks its fast kernels only for aligned pointers (ncu, round 22: an unaligned
        // second slab ran Ampere's kernels at half the speed).
        let fit = b.scratch_bytes / (2 * m.cols);
        let slab = if fit >= 128 { fit / 128 * 128 } else { fit }.min(m.rows);
        assert!(
            slab > 0,
            "the dequantization scratch holds no row of {} columns",
            m.cols
        );
        let mut r0 = 0;
        while r0 < m.rows {
            let rows = slab.min(m.rows - r0);
            let items = rows * m.cols / 16;
            self.gpu.launch(
                p.k.dequant_rows,
                items.div_ceil(256).min(4096) as u32,
                256,
                KernelArgs::default()
                    .i32(m.ty as i32)
                    .ptr(m.q)
                    .ptr(m.d)
                    .ptr(m.m)
                    .ptr(m.qh)
                    .i32(m.rows as i32)
                    .i32(m.cols as i32)
                    .i32(r0 as i32)
                    .i32(rows as i32)
                    .ptr(b.scratch),
            )?;
            b.blas.gemm_f16(
                rows,
                n,
                m.cols,
                b.scratch,
                p.xh,
                p.ldx,
                y + 4 * r0 as u64,
                ldy,
                beta,
            )?;
            r0 += rows;
        }
        Ok(())
    }

    /// `gemm` on prefill.cu's kernel (the bias added in its epilogue).
    #[allow(clippy::too_many_arguments)]
    fn gemm_ptx(
        &self,
        p: &Prefill,
        m: &Mat,
        n: usize,
        y: u64,
        ldy: usize,
        bias: u64,
        acc: bool,
    ) -> CudaResult<()> {
        let blocks = m.rows.div_ceil(GEMM_ROWS) * n.div_ceil(GEMM_TOKENS);
        self.gpu.launch(
            p.k.gemm,
            blocks as u32,
            GEMM_THREADS,
            KernelArgs::default()
                .i32(m.ty as i32)
                .ptr(m.q)
                .ptr(m.d)
                .ptr(m.m)
                .ptr(m.qh)
                .i32(m.rows as i32)
                .i32(m.cols as i32)
                .ptr(p.xh)
                .i32(p.ldx as i32)
                .i32(n as i32)
                .ptr(y)
                .i32(ldy as i32)
                .ptr(bias)
                .i32(acc as i32),
        )
    }

    /// RoPE on q and k of the n tokens, and their keys and values into layer `l`'s cache.
    fn rope_store(&self, p: &Prefill, l: usize, p0: usize, n: usize) -> CudaResult<()> {
        let h = &self.hyper;
        let (kc, vc, ks, vs, key_scale) = self.layer_cache(l);
        self.gpu.launch(
            p.k.rope_store,
            n as u32,
            256,
            KernelArgs::default()
                .ptr(p.qkv)
                .i32(p.ldq as i32)
                .i32(p0 as i32)
                .i32(h.n_heads as i32)
                .i32(h.n_kv_heads as i32)
                .i32(h.head_dim as i32)
                .f32(h.rope_base)
                .i32((h.rope_style == RopeStyle::HalfSplit) as i32)
                .ptr(kc)
                .ptr(vc)
                .ptr(ks)
                .ptr(vs)
                .ptr(key_scale)
                .i32(self.kv_precision.kernel_code()),
        )
    }

    /// Causal attention of the n tokens over layer `l`'s cache up to each one; into xh (f16).
    /// On tensor cores where the engine chose them at boot, else the scalar kernel.
    fn attention_rows(&self, p: &Prefill, l: usize, p0: usize, n: usize) -> CudaResult<()> {
        let h = &self.hyper;
        let (kc, vc, ks, vs, key_scale) = self.layer_cache(l);
        if let Some(f) = p.attention_tc {
            return self.gpu.launch(
                f,
                (h.n_heads * n.div_ceil(ATTENTION_TC_QUERIES)) as u32,
                ATTENTION_TC_THREADS,
                KernelArgs::default()
                    .ptr(p.qkv)
                    .i32(p.ldq as i32)
                    .i32(n as i32)
                    .i32(p0 as i32)
                    .i32(h.n_heads as i32)
                    .i32(h.n_kv_heads as i32)
                    .ptr(kc)
                    .ptr(vc)
                    .ptr(ks)
                    .ptr(vs)
                    .ptr(key_scale)
                    .i32(self.kv_precision.kernel_code())
                    .ptr(p.xh)
                    .i32(p.ldx as i32),
            );
        }
        let blocks = h.n_heads * n.div_ceil(p.qt);
        let shared = 4 * (p.qt * h.head_dim + p.kt * (h.head_dim + 1) + p.kt * h.head_dim);
        self.gpu.launch_shared(
            p.k.attention_rows,
            blocks as u32,
            ATTENTION_THREADS,
            shared as u32,
            KernelArgs::default()
                .ptr(p.qkv)
                .i32(p.ldq as i32)
                .i32(n as i32)
                .i32(p0 as i32)
                .i32(h.n_heads as i32)
                .i32(h.n_kv_heads as i32)
                .i32(h.head_dim as i32)
                .ptr(kc)
                .ptr(vc)
                .ptr(ks)
                .ptr(vs)
                .ptr(key_scale)
                .i32(self.kv_precision.kernel_code())
                .i32(p.qt as i32)
                .i32(p.kt as i32)
                .ptr(p.xh)
                .i32(p.ldx as i32),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_tiles_fit_the_default_shared_memory() {
        for head_dim in [8, 64, 128, 256] {
            let (qt, kt) = attention_tiles(head_dim);
            let bytes = 4 * (qt * head_dim + kt * (head_dim + 1) + kt * head_dim);
            assert!(bytes <= 48 * 1024, "head {head_dim}: {bytes} bytes");
            // Whole warps of queries (8 warps, at most 2 queries each) and a tile a warp wide.
            assert!(qt % 8 == 0 && qt / 8 <= 2 && kt <= 32);
        }
    }

    #[test]
    fn blas_scratch_holds_the_largest_dequantized_matrix_up_to_its_cap() {
        let mat = |ty, rows, cols| MatLayout {
            ty,
            rows,
            cols,
            q: 0,
            d: 0,
            m: 0,
            qh: 0,
            bytes: 0,
        };
        // f16 matrices go to cuBLAS as they are: no scratch.
        let f16 = [mat(GpuType::F16, 8960, 1536), mat(GpuType::F16, 1536, 8960)];
        let [ws, scratch] = blas_bytes((9, 0), f16.iter());
        assert_eq!((ws, scratch), (32 << 20, 0));
        // The largest other one in f16 (down: 1536 x 8960), not the f16 gate/up beside it.
        let mixed = [
            mat(GpuType::F16, 17920, 1536),
            mat(GpuType::Q4_0, 1536, 8960),
        ];
        assert_eq!(blas_bytes((8, 7), mixed.iter()), [4 << 20, 1536 * 8960 * 2]);
        // Capped: a 7B gate/up (22016 x 4096) goes through in slabs of rows.
        let big = [mat(GpuType::Q8_0, 22016, 4096)];
        let [_, scratch] = blas_bytes((9, 0), big.iter());
        assert_eq!(scratch, DEQUANT_SCRATCH_MAX);
        assert!(scratch / (2 * 4096) >= 64, "a slab of at least 64 rows");
    }

    #[test]
    fn chunk_buffers_hold_the_widest_input() {
        let h = Hyper::qwen2_1_5b();
        let b = PrefillBuffers::of(&h, 256, [0, 0]);
        assert_eq!(b.ldx, 8960);
        let with_blas = PrefillBuffers::of(&h, 256, [32 << 20, 1 << 20]);
        assert_eq!(with_blas.bytes(), b.bytes() + (33 << 20));
        assert_eq!(b.sizes[1], 256 * 8960 * 2);
        assert_eq!(b.sizes[2], 256 * (1536 + 2 * 256) * 4);
        assert!(b.bytes() >= b.sizes.iter().sum::<usize>());
    }
}
