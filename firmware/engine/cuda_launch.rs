//! How the decode step is launched: every kernel of a step in order (`record_step`, readable
//! top to bottom), and each product's launch (`matvec`, `mv_config`); boot captures the step
//! into a CUDA graph, the streamed step (cuda_stream.rs) reuses its attention and head.

use super::{type_slot, CudaEngine, GpuLayer, LaunchLabel, Mat};
use crate::backend::cuda::driver::{CudaResult, DeviceBuffer, KernelArgs};
use crate::backend::cuda::weights::{GpuType, SWIGLU_TILE};
use crate::engine::cuda_options::{ProductKernels, ProductRole};
use crate::model::RopeStyle;

/// What the last block of a product prepares for the next kernel (kernels-ptx/decode.cu).
#[derive(Clone, Copy)]
pub(super) enum Finish {
    None,
    /// RMSNorm of the residual `x` with these weights.
    Norm(u64),
    /// SwiGLU of [gate | up].
    SwiGlu,
    /// SwiGLU of gate/up stacked tile by tile, each tile by the last block to finish it, or
    /// (`CudaOptions::swiglu_cluster`) by its first block once its cluster has its rows.
    SwiGluTiles,
    /// The greedy pick over the logits; advances the step's state.
    Argmax,
}

/// Where a product reads its input.
#[derive(Clone, Copy)]
pub(super) enum Input {
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
pub(super) struct MvConfig {
    wide: bool,
    tpr: usize,
    pub(super) grid: usize,
}

/// The launch of a product over `m` on a GPU of `sm_count` multiprocessors. A row is `units`
/// units (a block of 32 for the integer types, 16 bytes of an f16 row, 4 floats of f32). Narrow:
/// about one unit per thread, threads per row a power of two in 8..=256. Wide: MV_WIDE units per
/// thread, a quarter of the threads per row, so four times the bytes in flight per thread and
/// fewer, longer blocks; it is taken when it still gives every multiprocessor a block. Small
/// products (most of a small model's step) stay narrow: there a step is a chain of short
/// kernels, and fewer blocks made them slower (docs/hil/round2.md); big ones (a large model's
/// layers, any model's logits) go wide, where bandwidth decides. `role` adjusts the threads a
/// row where measured (`rule_tpr`). A `tpr` other than 0 names the threads a row
/// (`CudaOptions::product_tpr`, checked at boot) in place of the rule's.
pub(super) fn mv_config(
    m: &Mat,
    sm_count: usize,
    kernels: ProductKernels,
    role: ProductRole,
    tpr: usize,
) -> MvConfig {
    let units = match m.ty {
        GpuType::F16 if m.cols.is_multiple_of(8) => m.cols / 8,
        GpuType::F32 if m.cols.is_multiple_of(4) => m.cols / 4,
        GpuType::F16 | GpuType::F32 => m.cols,
        _ => m.cols / 32,
    };
    let config = |wide: bool| {
        let tpr = match tpr {
            0 => rule_tpr(m.ty, units, wide, role),
            named => named,
        };
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

/// The rule's threads a row for a row of `units` units: enough threads for the row in one
/// round (a unit each narrow, MV_WIDE each wide), a power of two in 8..=256. Two roles differ,
/// as measured on an H100 (docs/HIL.md round 42): narrow q/k/v takes two units a thread or
/// more, at least 16 threads a row (fewer, longer blocks, each of which norms its input:
/// +4.3 to +6% a step at the 1.5B q4_0 and q8_0 and SmolLM2 q4_0 shapes, level at 0.5B and
/// Q4_K_M); the logits wide round down, not up: half the blocks, each row in two rounds
/// (+0.7 to +2.3% at the 1.5B shape, where both leave a quarter of the last round's loads
/// repeating the row's last unit; level at 0.5B f16), but for the K-quants, where it lost
/// 1.5-3% (Q6_K logits of Q4_K_M, whose kernels hold three times the registers).
fn rule_tpr(ty: GpuType, units: usize, wide: bool, role: ProductRole) -> usize {
    let floor_pow2 = |n: usize| if n == 0 { 1 } else { 1 << n.ilog2() };
    let k_quant = matches!(ty, GpuType::Q4_K | GpuType::Q5_K | GpuType::Q6_K);
    match (role, wide) {
        (ProductRole::Qkv, false) => floor_pow2(units / 2).clamp(16, MV_THREADS),
        (ProductRole::Output, true) if !k_quant => floor_pow2(units / MV_WIDE).clamp(8, MV_THREADS),
        _ => {
            let per_thread = if wide { MV_WIDE } else { 1 };
            units
                .div_ceil(per_thread)
                .next_power_of_two()
                .clamp(8, MV_THREADS)
        }
    }
}

impl CudaEngine<'_> {
    /// Every kernel of one decode step, in order. Reads the token and position from
    /// `state` and leaves the next greedy token and position there.
    pub(super) fn record_step(&self) -> CudaResult<()> {
        self.timeline_restart();
        self.record_embed()?;
        for (l, w) in self.layers.iter().enumerate() {
            self.record_attention(l, w)?;
            self.record_ffn(l, w)?;
        }
        self.record_head()
    }

    /// Embedding of the token, and the first layer's normed input. The step's first kernel is
    /// an ordered launch (it starts once the step before has finished), so the step's state is
    /// fixed while its kernels run and they may read it before their wait (common.cuh).
    pub(super) fn record_embed(&self) -> CudaResult<()> {
        let h = &self.hyper;
        let (g, k, a) = (&self.gpu, &self.k, &self.a);
        let e = &self.embd;
        let first_norm = self
            .layers
            .first()
            .map_or(self.output_norm, |l| l.attn_norm);
        let (trace, slot) = self.timeline_slot(LaunchLabel::of("embed", None));
        g.launch_ordered(
            k.embed,
            (1, 256),
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
                .i32(self.pdl)
                .ptr(trace)
                .i32(slot),
        )
    }

    /// Layer `l`'s part of the cache: (keys, values, key scales, value scales, channel scales).
    pub(super) fn layer_cache(&self, l: usize) -> (u64, u64, u64, u64, u64) {
        let h = &self.hyper;
        let kv_dim = h.n_kv_heads * h.head_dim;
        let ctx = self.context;
        let value_bytes = self.kv_precision.value_bytes();
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
    pub(super) fn record_attention(&self, l: usize, w: &GpuLayer) -> CudaResult<()> {
        let h = &self.hyper;
        let (g, k, a) = (&self.gpu, &self.k, &self.a);
        let head_dim = h.head_dim;
        let (kc, vc, ks, vs, key_scale) = self.layer_cache(l);
        // Attention: q, k, v of the normed input.
        for (i, &(m, off)) in w.qkv.iter().enumerate() {
            let bias = if w.qkv_bias != 0 {
                w.qkv_bias + off as u64 * 4
            } else {
                0
            };
            let out = a.qkv + off as u64 * 4;
            let next = w.qkv.get(i + 1).map_or(&w.wo, |(n, _)| n);
            let normed = self.normed(w.attn_norm, ProductRole::Qkv);
            self.matvec(
                &m,
                normed,
                out,
                bias,
                false,
                Finish::None,
                Some(next),
                (ProductRole::Qkv, Some(l)),
            )?;
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
        let (trace, slot) = self.timeline_slot(LaunchLabel::of("attention", Some(l)));
        args.ptr(trace).i32(slot);
        let (grid, threads) = (grid as u32, self.split.threads as u32);
        match self.split.cluster {
            0 => g.launch(k.attention, grid, threads, &mut args)?,
            c => g.launch_cluster(k.attention_cluster, (grid, threads, c as u32), 0, &mut args)?,
        }
        // Added to the residual (whose norm is the FFN's input).
        self.matvec(
            &w.wo,
            Input::Prepared,
            a.x,
            0,
            true,
            self.norm_tail(w.ffn_norm, ProductRole::GateUp),
            w.gate_up.first().map(|(m, _)| m),
            (ProductRole::Wo, Some(l)),
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
        let input = self.normed(w.ffn_norm, ProductRole::GateUp);
        for (i, &(m, off)) in w.gate_up.iter().enumerate() {
            let out = a.gu + off as u64 * 4;
            let fin = if w.gate_up_tiled {
                Finish::SwiGluTiles
            } else if i + 1 == n_gu {
                Finish::SwiGlu
            } else {
                Finish::None
            };
            let next = w.gate_up.get(i + 1).map(|(n, _)| n).or(w.down.as_ref());
            let role = (ProductRole::GateUp, Some(l));
            self.matvec(&m, input, out, 0, false, fin, next, role)?;
        }
        let next = self.layers.get(l + 1);
        let fin = match next {
            Some(n) => self.norm_tail(n.attn_norm, ProductRole::Qkv),
            None => self.norm_tail(self.output_norm, ProductRole::Output),
        };
        let down = w.down.as_ref().expect("an FFN in memory");
        let after = next
            .and_then(|n| n.qkv.first())
            .map_or(&self.output, |(m, _)| m);
        self.matvec(
            down,
            Input::FfnHidden,
            a.x,
            0,
            true,
            fin,
            Some(after),
            (ProductRole::Down, Some(l)),
        )?;
        Ok(())
    }

    pub(super) fn record_head(&self) -> CudaResult<()> {
        let a = &self.a;
        // Logits, and the greedy pick that advances the state.
        let normed = self.normed(self.output_norm, ProductRole::Output);
        // Meanwhile the next step's first product comes into L2.
        let next = self
            .layers
            .first()
            .and_then(|l| l.qkv.first())
            .map(|(m, _)| m);
        self.matvec(
            &self.output,
            normed,
            a.logits,
            0,
            false,
            Finish::Argmax,
            next,
            (ProductRole::Output, None),
        )
    }

    /// What the attention launch pulls into L2 for the products after it: from wo's first
    /// array up to down's (wo, the FFN norm, gate/up: the image keeps a layer's arrays in this
    /// order), at most half of the L2, as 128-byte lines; and how many blocks do it (one per
    /// multiprocessor, each of the split's `threads`, so one line or a few each).
    fn prefetch_after_attention(&self, w: &GpuLayer) -> (u64, usize, usize) {
        if !self.prefetch {
            return (0, 0, 0);
        }
        match &w.down {
            Some(down) => prefetch_span(w.wo.q, down.q, self.gpu.l2_bytes, self.gpu.sm_count),
            None => (0, 0, 0),
        }
    }

    /// Whether products of `role` norm the residual in each block (else the tail of the
    /// product before does): the one answer both `normed` and `norm_tail` read.
    fn norms_in_block(&self, role: ProductRole) -> bool {
        self.in_block_norm && !self.norm_tail_for[role as usize]
    }

    /// The input of a product that reads the residual normed with `nw`: made in each of its
    /// blocks, or already prepared by the tail of the product before.
    fn normed(&self, nw: u64, role: ProductRole) -> Input {
        if self.norms_in_block(role) {
            Input::NormedInBlock(nw)
        } else {
            Input::Prepared
        }
    }

    /// What a product that adds to the residual leaves for the next one, which reads it normed
    /// with `nw`: nothing when that one norms it itself, else the tail.
    fn norm_tail(&self, nw: u64, next: ProductRole) -> Finish {
        if self.norms_in_block(next) {
            Finish::None
        } else {
            Finish::Norm(nw)
        }
    }

    /// `out = (acc ? out : 0) + W in + bias`, then `fin`; `in` as `input` says. Its blocks
    /// pull the start of `next` (the product after it) into L2 as they start. `role` is the
    /// product's place in the step and its layer (its launch config and timeline label).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matvec(
        &self,
        m: &Mat,
        input: Input,
        out: u64,
        bias: u64,
        acc: bool,
        fin: Finish,
        next: Option<&Mat>,
        (role, layer): (ProductRole, Option<usize>),
    ) -> CudaResult<()> {
        let h = &self.hyper;
        let a = &self.a;
        let mv = mv_config(
            m,
            self.gpu.sm_count as usize,
            self.products,
            role,
            self.product_tpr[role as usize],
        );
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
        // Tiles made in a cluster of the tile's blocks (`CudaOptions::swiglu_cluster`): 0, none.
        let cluster = match fin {
            Finish::SwiGluTiles if self.swiglu_cluster && norm.is_some() => {
                swiglu_cluster_size(mv.tpr)
            }
            _ => 0,
        };
        let (fin_mode, fin_src, fin_nw, fin_n) = match fin {
            Finish::None => (0, 0, 0, 0),
            Finish::Norm(nw) => (1, a.x, nw, h.dim),
            Finish::SwiGlu => (2, a.gu, 0, h.hidden_dim),
            Finish::Argmax => (3, 0, 0, 0),
            Finish::SwiGluTiles if cluster > 0 => (5, a.gu, 0, h.hidden_dim),
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
        let (ahead, ahead_bytes) = next.map_or((0, 0), |n| prefetch_ahead(n, self.prefetch_ahead));
        args.ptr(ahead).i32(ahead_bytes);
        // The diagnostic repeat (`CudaOptions::repeat_product`) of a product that overwrites
        // its output, so the step's result is the same: launched twice, a timeline slot each.
        let repeat = self.repeat_product == Some(role)
            && matches!(role, ProductRole::Qkv | ProductRole::GateUp)
            && !acc;
        let (grid, threads) = (mv.grid as u32, MV_THREADS as u32);
        for _ in 0..1 + repeat as usize {
            let mut args = args.clone();
            let (trace, slot) = self.timeline_slot(LaunchLabel::of(role.label(), layer));
            args.ptr(trace).i32(slot);
            match cluster {
                0 => self
                    .gpu
                    .launch_shared(f, grid, threads, shared as u32, &mut args)?,
                c => {
                    let dims = (grid, threads, c as u32);
                    self.gpu.launch_cluster(f, dims, shared as u32, &mut args)?
                }
            }
        }
        Ok(())
    }
}

/// The blocks of one SwiGLU tile (64 rows of stacked gate/up) at `tpr` threads a row, which
/// `Finish::SwiGluTiles` runs as one cluster where asked (`CudaOptions::swiglu_cluster`): 2 to
/// 8 (the portable cluster size); 0 where a block holds a whole tile or more (it completes its
/// tiles alone) or a tile would take more than 8 blocks. A block's rows divide the tile's, so
/// the grid is whole clusters.
fn swiglu_cluster_size(tpr: usize) -> usize {
    let block_rows = MV_THREADS / tpr * MV_R;
    match 2 * SWIGLU_TILE / block_rows.max(1) {
        c @ 2..=8 => c,
        _ => 0,
    }
}

/// What a product pulls into L2 of `next`, the product after it: its first `cap` bytes at
/// most, in whole 16-byte units (the bulk prefetch's), from its first array on (the image keeps
/// a matrix's arrays together; `bytes` counts them without the alignment between them, so the
/// span never passes the matrix's end).
fn prefetch_ahead(next: &Mat, cap: usize) -> (u64, i32) {
    let bytes = next.bytes.min(cap).min(i32::MAX as usize) / 16 * 16;
    if bytes == 0 {
        return (0, 0);
    }
    (next.q, bytes as i32)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn mat(ty: GpuType, rows: usize, cols: usize) -> Mat {
        Mat {
            ty,
            rows,
            cols,
            q: 0,
            d: 0,
            m: 0,
            qh: 0,
            bytes: 0,
        }
    }

    /// The pull of the next product: its first bytes up to the cap, in 16-byte units, from
    /// its first array; nothing when off or for an empty matrix.
    #[test]
    fn prefetch_ahead_takes_the_next_products_start() {
        let cap = (50 << 20) / crate::engine::cuda_options::PREFETCH_AHEAD_L2_SHARE;
        let mut qkv = mat(GpuType::Q4_0, 2048, 1536);
        (qkv.q, qkv.bytes) = (1 << 30, 2048 * 48 * 18);
        // 1.5B q4_0 [q|k|v] (1.8 MB) under a twelfth of an H100's L2: whole.
        assert_eq!(prefetch_ahead(&qkv, cap), (1 << 30, 1_769_472));
        // Its down (7.7 MB): the cap, in 16-byte units.
        let mut down = mat(GpuType::Q4_0, 1536, 8960);
        (down.q, down.bytes) = (1 << 30, 1536 * 280 * 18);
        assert_eq!(
            prefetch_ahead(&down, cap),
            (1 << 30, (cap / 16 * 16) as i32)
        );
        down.bytes = 1000;
        assert_eq!(prefetch_ahead(&down, cap), (1 << 30, 992));
        assert_eq!(prefetch_ahead(&down, 0), (0, 0));
        assert_eq!(prefetch_ahead(&mat(GpuType::Q4_0, 0, 0), 1 << 20), (0, 0));
    }

    /// A SwiGLU tile's blocks as one cluster: 16 threads a row (the 1.5B shape's gate/up
    /// rule) is two blocks of 32 rows, 32 threads four, 64 eight; 8 threads a row holds a
    /// whole tile, and 128 would need 16 blocks: no cluster.
    #[test]
    fn swiglu_clusters_are_the_blocks_of_one_tile() {
        let sizes: Vec<usize> = [8, 16, 32, 64, 128, 256]
            .into_iter()
            .map(swiglu_cluster_size)
            .collect();
        assert_eq!(sizes, [0, 2, 4, 8, 0, 0]);
        for tpr in [16, 32, 64] {
            let block_rows = MV_THREADS / tpr * MV_R;
            assert_eq!(swiglu_cluster_size(tpr) * block_rows, 2 * SWIGLU_TILE);
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

    /// Wide where it still gives each of an H200's 132 multiprocessors a block, narrow
    /// otherwise; every launch covers each row in whole rounds and every row of the matrix.
    #[test]
    fn products_go_wide_only_when_they_fill_the_gpu() {
        let sms = 132;
        // Llama-2-7B's [gate | up] at q4_0: 128 units a row, 32 threads x 4 units.
        let gate_up = mat(GpuType::Q4_0, 2 * 11008, 4096);
        let gu = ProductRole::GateUp;
        let c = mv_config(&gate_up, sms, ProductKernels::Auto, gu, 0);
        assert_eq!((c.wide, c.tpr, c.grid), (true, 32, 22016 / 16));
        // SmolLM2's [q | k | v]: 18 units a row; wide would give 15 blocks. As wo (the rule's
        // common case) a row is one round, 32 threads of one unit.
        let qkv = mat(GpuType::Q4_0, 960, 576);
        let c = mv_config(&qkv, sms, ProductKernels::Auto, ProductRole::Wo, 0);
        assert_eq!((c.wide, c.tpr, c.grid), (false, 32, 960 / 16));
        assert!(mv_config(&qkv, sms, ProductKernels::Wide, ProductRole::Qkv, 0).wide);
        assert!(!mv_config(&gate_up, sms, ProductKernels::Narrow, gu, 0).wide);
        // A named tpr replaces the rule's, with blocks for every row: the 1.5B shape's q4_0
        // [gate | up] (48 units a row) goes wide at 16 threads a row, a fourth of its last
        // loads repeating the row's last unit; at 8 a row it takes two rounds of four units.
        let gate_up_15b = mat(GpuType::Q4_0, 2 * 8960, 1536);
        let c = mv_config(&gate_up_15b, sms, ProductKernels::Auto, gu, 0);
        assert_eq!((c.wide, c.tpr, c.grid), (true, 16, 17920 / 32));
        let c = mv_config(&gate_up_15b, sms, ProductKernels::Auto, gu, 8);
        assert_eq!((c.wide, c.tpr, c.grid), (true, 8, 17920 / 64));
        // f32 rows have no wide kernel, whatever is asked.
        assert!(
            !mv_config(
                &mat(GpuType::F32, 32000, 4096),
                sms,
                ProductKernels::Wide,
                ProductRole::Output,
                0
            )
            .wide
        );
        for ty in [GpuType::F16, GpuType::Q8_0, GpuType::Q4_1, GpuType::F32] {
            for (rows, cols) in [(49152, 576), (4096, 11008), (151936, 896), (64, 64)] {
                for k in [
                    ProductKernels::Auto,
                    ProductKernels::Narrow,
                    ProductKernels::Wide,
                ] {
                    let m = mat(ty, rows, cols);
                    let c = mv_config(&m, sms, k, ProductRole::Down, 0);
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

    /// q/k/v narrow at two units a thread or more (at least 16 threads a row) and the logits
    /// wide rounded down, at the shapes round 42 measured; the products of a 7B layer, which
    /// already go wide, keep the common rule; every row is still covered.
    #[test]
    fn qkv_and_logits_take_their_measured_threads_a_row() {
        let sms = 132;
        let auto = ProductKernels::Auto;
        let qkv = |ty, rows, cols| mv_config(&mat(ty, rows, cols), sms, auto, ProductRole::Qkv, 0);
        // 1.5B [q | k | v], 2048 x 1536: q4_0's 48 units at 16 threads (3 rounds, was 64
        // threads in 1); f16's 192 units fill the GPU wide, at the common rule's 64.
        let c = qkv(GpuType::Q4_0, 2048, 1536);
        assert_eq!((c.wide, c.tpr, c.grid), (false, 16, 2048 / 32));
        let c = qkv(GpuType::F16, 2048, 1536);
        assert_eq!((c.wide, c.tpr, c.grid), (true, 64, 2048 / 8));
        // 0.5B (28 units) and SmolLM2 (18 units): 16 threads, not 8.
        assert_eq!(qkv(GpuType::Q4_0, 1152, 896).tpr, 16);
        assert_eq!(qkv(GpuType::Q8_0, 960, 576).tpr, 16);
        // 7B [q | k | v] fills the GPU wide: the common rule's 32 threads a row.
        let c = qkv(GpuType::Q4_0, 3 * 4096, 4096);
        assert_eq!((c.wide, c.tpr), (true, 32));
        let out =
            |ty, rows, cols| mv_config(&mat(ty, rows, cols), sms, auto, ProductRole::Output, 0);
        // 1.5B logits: q4_0's 48 units at 8 threads (12 would round up to 16), f16 at 32.
        let c = out(GpuType::Q4_0, 151936, 1536);
        assert_eq!((c.wide, c.tpr, c.grid), (true, 8, 151936 / 64));
        assert_eq!(out(GpuType::F16, 151936, 1536).tpr, 32);
        // Q4_K_M's Q6_K logits keep the common rule's 16 (rounding down lost there).
        assert_eq!(out(GpuType::Q6_K, 151936, 1536).tpr, 16);
        // 7B logits (128 units, a power of two already) and 0.5B's (7 units: at least 8): as
        // the common rule.
        assert_eq!(out(GpuType::Q4_0, 32000, 4096).tpr, 32);
        assert_eq!(out(GpuType::Q4_0, 151936, 896).tpr, 8);
        // A named value still wins.
        let m = mat(GpuType::Q4_0, 2048, 1536);
        assert_eq!(mv_config(&m, sms, auto, ProductRole::Qkv, 64).tpr, 64);
        for role in ProductRole::ALL {
            for (rows, cols) in [(2048, 1536), (151936, 896), (64, 64), (960, 576)] {
                for ty in [GpuType::Q4_0, GpuType::F16, GpuType::F32] {
                    let c = mv_config(&mat(ty, rows, cols), sms, auto, role, 0);
                    assert!(c.tpr.is_power_of_two() && (8..=MV_THREADS).contains(&c.tpr));
                    assert!(
                        c.grid * (MV_THREADS / c.tpr) * MV_R >= rows,
                        "{role:?} {c:?}"
                    );
                }
            }
        }
    }
}
