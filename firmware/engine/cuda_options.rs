//! The CUDA decoder's choices, made at boot ([`CudaOptions`]), and the rules both backends and
//! the tools need without a GPU: which KV cache the GPU keeps, how attention is split. Kept
//! apart from `engine::cuda` so that a build without the `cuda` feature still parses and
//! reports them.

use crate::board::MemoryModel;
use crate::kv::{KvChoice, KvPrecision};
use crate::quant::Precision;

/// Choices made at boot.
#[derive(Clone, Copy, Debug)]
pub struct CudaOptions {
    /// Where the weights live: `Unified` = pinned, device-mapped host memory read by the GPU
    /// directly (a Jetson); `Discrete` = device memory.
    pub memory: MemoryModel,
    /// Context length; 0 = the smaller of the board's and the model's.
    pub context: usize,
    /// Replay one captured CUDA graph per token (true) or launch every kernel (false).
    pub graph: bool,
    /// What the matrices become at load, as the CPU's `--precision` (weights/image docs in
    /// weights.rs): `native` keeps the file's types, `f16` converts all, `w8a8`/`w4a8` requantize
    /// each to GGML Q8_0/Q4_0 by role. At w8a8 and w4a8 the KV cache is int8 too (as the CPU's,
    /// `f32_kv`).
    pub precision: Precision,
    /// What the KV cache holds (`kv_precision`): by default int8 at w8a8 and w4a8, keys and
    /// values with a scale per group of 32 in the CPU's format and arithmetic (kv/layout.rs,
    /// kv/attend.rs; token-major) where the head allows (whole groups of 32, at most 128
    /// wide), else f16 (the CPU's half rows, token-major); f32 when asked (`--ablate f32-kv`).
    /// int8 is a quarter of f32's bytes and f16 half: that much more context in the same KV
    /// arena, and that much less to read where bandwidth decides.
    pub kv: KvChoice,
    /// Which product kernels run (`mv_config`).
    pub products: ProductKernels,
    /// Threads a row of each decode product, by [`ProductRole`]: a power of two from 8 to 256
    /// (checked at boot); 0 (the default): `mv_config`'s rule. `bench --ablate product-tpr=N`
    /// sets all, `product-tpr=ROLE:N` one.
    pub product_tpr: [usize; ProductRole::ALL.len()],
    /// Where the products that read the normed residual get it (`CudaEngine::in_block_norm`).
    pub in_block_norm: InBlockNorm,
    /// Products of these roles (q/k/v, gate/up, the logits) read the residual normed by the
    /// tail of the product before even where the others norm it in each block (`bench
    /// --ablate norm-tail=ROLE`).
    pub norm_tail_for: [bool; ProductRole::ALL.len()],
    /// While attention runs, extra blocks of that launch pull the layer's next weights (wo,
    /// then gate/up) into L2, up to half of it. Off by default: it pulled nothing from
    /// 2026-12-03 to 2026-12-07 (the image then kept a layer's FFN before its attention, so
    /// the span was empty), and once it did it cost 6% a step on an H100 at the 1.5B shape
    /// (docs/HIL.md round 47). `bench --ablate attention-prefetch` turns it on.
    pub prefetch: bool,
    /// Bytes of the next product's weights each product kernel pulls into L2 as it starts
    /// (sm_90, weights in device memory): the memory idles between a product's rounds of
    /// loads and while its last blocks finish, and the next product then starts from L2.
    /// None: a twelfth of the L2 (`PREFETCH_AHEAD_L2_SHARE`); Some(0): none (`bench --ablate
    /// no-prefetch-ahead`; `prefetch-ahead=MIB` sets it).
    pub prefetch_ahead: Option<usize>,
    /// A diagnostic: each product of this role (q/k/v or gate/up, which overwrite their
    /// output) launched a second time right after the first, which finds its weights in L2
    /// (`bench --ablate repeat-product=ROLE`). None: off.
    pub repeat_product: Option<ProductRole>,
    /// sm_90: gate/up stacked tile by tile runs as thread block clusters, the blocks of one
    /// SwiGLU tile each, which push their rows into the tile's first block's shared memory;
    /// that block makes the tile's SwiGLU after the cluster's barrier (decode.cu,
    /// FIN_SWIGLU_CLUSTER), where otherwise each block counts itself into the tile (a fence
    /// and an atomic) and the last reads the tile back from L2. Only where gate/up norms in
    /// each block and a block holds less than a tile. On by default: +2.5% a step at the 1.5B
    /// q4_0 shape on an H100, level at q8_0 (docs/HIL.md round 48); `bench --ablate
    /// no-swiglu-cluster` turns it off.
    pub swiglu_cluster: bool,
    /// Every kernel of the step writes its start, wait and end times to a slot of a device
    /// buffer (`CudaEngine::timeline_step`, `leanstream gpu-timeline`): a diagnostic, off
    /// for anything timed.
    pub timeline: bool,
    /// A head's attention is split over one more block for every this many positions (up to
    /// `max_slices`), and the blocks' parts joined, so a long context's keys and values are
    /// read by the whole GPU rather than a block per head; 0 = one block per head
    /// (`bench --compare-no-split-attention`).
    pub attention_slice: usize,
    /// Threads of a decode attention block: a multiple of 32 up to 1024, at least two a value
    /// of a head (checked at boot, as the int8 cache's warps are); 0
    /// (the default): `cuda_attention::attention_threads` picks 512 or 1024 for the model.
    /// `bench --ablate attention-threads=N` sets it.
    pub attention_threads: usize,
    /// When a split attention block takes all the query heads of one kv head, so that each key
    /// and value row is read once rather than once per query head (where a group fits a block:
    /// `cuda_attention::max_group_slices`).
    pub grouped_attention: GroupedAttention,
    /// Where the GPU has thread block clusters (sm_90), a split head's blocks run as one
    /// cluster and join their slices in shared memory (`cuda_attention::cluster_size`), not
    /// through L2 by the last block to finish, up to the length where the split through L2
    /// reaches its widest (`AttentionSplit::with_cluster`). `bench --ablate
    /// no-cluster-attention` is the ablation.
    pub cluster_attention: bool,
    /// The position from which the split through L2 runs instead of clusters
    /// (`AttentionSplit::cluster_until`); 0: the rule there (`bench --ablate cluster-until=N`
    /// sets it).
    pub cluster_until: usize,
    /// Whether each kernel may launch before the one before it ends (`DependentLaunch`);
    /// only GPUs of compute capability 9.0 and newer can, the rest run `Off` whatever is asked.
    pub dependent_launch: DependentLaunch,
    /// Prompt tokens that go through each layer together (engine/cuda_prefill.rs): the
    /// board's `gpu_prefill_batch` by default; 1 = token by token, as decode (`bench
    /// --ablate token-prefill`). The chunk's activations come out of the activation budget.
    pub prefill_batch: usize,
    /// Which kernels multiply a batched prompt's chunk by the weights (`bench --ablate
    /// ptx-products` is the ablation of cuBLAS).
    pub prefill_products: PrefillProducts,
    /// A batched prompt's attention on tensor cores where the GPU (sm_80 and newer) and the
    /// head (64 or 128 wide) allow (true), or always the scalar kernel (`bench --ablate
    /// scalar-attention`).
    pub prefill_tensor_attention: bool,
}

/// When a split attention's block takes a kv head's query heads (`CudaOptions::grouped_attention`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupedAttention {
    /// From the position where one layer's keys and values outgrow half the L2
    /// (`cuda_attention::group_from`). Below it the L2 serves each query head's block its kv head's rows,
    /// and a block a query head was as fast or faster on the H200 (docs/BENCHMARKS.md); past it
    /// each of those blocks would read them from DRAM (an Orin's 4 MiB L2 holds a Qwen2.5-1.5B
    /// layer's f32 cache up to 1,024 positions).
    Auto,
    /// From the first split (`attention_slice`) on: the GPU tests, and `bench --ablate
    /// grouped-attention`.
    Always,
    /// A block a query head at any length (`bench --ablate per-head-attention`).
    Never,
}

/// The batched prefill's products (engine/cuda_prefill.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillProducts {
    /// cuBLAS where the library loads (integer and K-quant weights dequantized to f16 into a
    /// scratch matrix first), the project's PTX kernel where it does not (the default).
    Blas,
    /// The project's PTX kernel (kernels-ptx/prefill.cu `gemm`), whatever is installed.
    Ptx,
}

/// Programmatic dependent launch (sm_90): every kernel of a step is launched to start while
/// the one before it still runs, and waits in-kernel for it to finish (decode.cu's
/// `pdl_wait`). A step is a chain of ~5 kernels a layer, each waiting on the last; this hides
/// the next kernel's launch behind the previous one's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DependentLaunch {
    /// Every kernel starts after the one before has finished (`bench --compare-no-pdl`).
    Off,
    /// The next kernel may launch as soon as all of this one's blocks run (the default).
    On,
    /// `On`, and each product block pulls its first weights into L2 while it waits
    /// (`bench --compare-pdl-prefetch`): faster at SmolLM2's shape, slower where products are
    /// big (docs/HIL.md round 10).
    Prefetch,
}

/// Where the residual's norm is made for the products that read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InBlockNorm {
    /// In each block of those products up to `IN_BLOCK_NORM_MAX_DIM` (but for a gate/up of
    /// many blocks: `norm_tail_for` in engine/cuda_boot.rs), by the tail above (the default).
    Auto,
    /// In each block at any size (`bench --compare-norm-in-block`).
    Always,
    /// By the tail of the product before, at any size (`bench --compare-norm-tail`).
    Never,
}

/// A decode product's place in the step: indexes `CudaOptions::product_tpr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProductRole {
    Qkv,
    Wo,
    GateUp,
    Down,
    Output,
}

impl ProductRole {
    /// Whether products of this role read the residual normed (q/k/v, gate/up, the logits):
    /// the ones `CudaOptions::norm_tail_for` applies to.
    pub fn reads_normed_residual(self) -> bool {
        matches!(
            self,
            ProductRole::Qkv | ProductRole::GateUp | ProductRole::Output
        )
    }

    pub const ALL: [ProductRole; 5] = [
        ProductRole::Qkv,
        ProductRole::Wo,
        ProductRole::GateUp,
        ProductRole::Down,
        ProductRole::Output,
    ];

    /// Its name in `--ablate product-tpr=ROLE:N`.
    pub fn name(self) -> &'static str {
        match self {
            ProductRole::Qkv => "qkv",
            ProductRole::Wo => "wo",
            ProductRole::GateUp => "gate-up",
            ProductRole::Down => "down",
            ProductRole::Output => "output",
        }
    }

    /// The role whose `name` is `name`.
    pub fn named(name: &str) -> Option<ProductRole> {
        ProductRole::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Its launches' label in the step's timeline (`LaunchLabel::kernel`).
    pub const fn label(self) -> &'static str {
        match self {
            ProductRole::Qkv => "q/k/v",
            ProductRole::Wo => "wo",
            ProductRole::GateUp => "gate/up",
            ProductRole::Down => "down",
            ProductRole::Output => "output",
        }
    }
}

/// Which product kernels a step runs (decode.cu's narrow and `_wide` kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProductKernels {
    /// Wide for the big products, narrow for the rest (the default).
    Auto,
    /// Every product narrow: the ablation of the wide kernels (`bench --compare-narrow`).
    Narrow,
    /// Every product wide that has a wide kernel: lets the parity tests check the wide kernels
    /// on models too small to choose them.
    Wide,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            memory: match crate::board::MEMORY_MODEL {
                MemoryModel::Unified => MemoryModel::Unified,
                _ => MemoryModel::Discrete,
            },
            context: 0,
            graph: true,
            precision: Precision::Native,
            kv: KvChoice::Auto,
            products: ProductKernels::Auto,
            product_tpr: [0; ProductRole::ALL.len()],
            in_block_norm: InBlockNorm::Auto,
            norm_tail_for: [false; ProductRole::ALL.len()],
            prefetch: false,
            prefetch_ahead: None,
            repeat_product: None,
            swiglu_cluster: true,
            timeline: false,
            attention_slice: ATTENTION_SLICE,
            attention_threads: 0,
            grouped_attention: GroupedAttention::Auto,
            cluster_attention: true,
            cluster_until: 0,
            dependent_launch: DependentLaunch::On,
            prefill_batch: crate::board::GPU_PREFILL_BATCH,
            prefill_products: PrefillProducts::Blas,
            prefill_tensor_attention: true,
        }
    }
}

/// The share of the L2 that a product's pull of the next product's weights takes at most
/// (`CudaOptions::prefetch_ahead`): a twelfth, 4.2 MiB of an H100's 50. Measured at the 1.5B
/// shape (docs/HIL.md round 34): caps of 2-6 MiB gain 2-4% at every type, 8 MiB less, and 12.5
/// MiB (a quarter) loses 2-3% against none: a bigger pull competes with the product's own
/// loads.
pub const PREFETCH_AHEAD_L2_SHARE: usize = 12;

/// Positions a slice of a head's attention starts at (`CudaOptions::attention_slice`): four
/// rounds of the kernel's 32 warps, two positions each, so a slice's block is kept busy and
/// short contexts (most of a chat) stay one block a head.
pub const ATTENTION_SLICE: usize = 256;

/// The widest residual whose norm the products make in each block rather than in the tail of
/// the product before. Each block then reads and norms `dim` values before its first weight
/// load: that beats the tail while blocks are few and rows short, and loses once they are many
/// (H200, same run, in-block against tail: +8-10% at dim 576, +5-9% at 896, -1..+4% at 1536,
/// -6..-15% at 4096; docs/HIL.md). Also bounds the block's copy of the input in shared memory
/// (1536 floats: 6 KiB).
pub const IN_BLOCK_NORM_MAX_DIM: usize = 1536;

/// The widest head the int8 cache's attention takes (attention_loops.cuh's `attend_i8_loop`: 16
/// values a lane, at most 8 lanes a position). Wider heads keep the f16 cache.
pub const INT8_KV_MAX_HEAD_DIM: usize = 128;

/// Whether the product kernels take `tpr` threads a row: a product's groups of threads split
/// its block of 256 evenly, and a block's rows (512 / tpr) lie in one SwiGLU tile of 64
/// (decode.cu's `finish`), so a power of two from 8 to 256.
pub fn product_tpr_fits(tpr: usize) -> bool {
    tpr.is_power_of_two() && (8..=256).contains(&tpr)
}

/// Boot's check of `CudaOptions::product_tpr`: each named value fits (`product_tpr_fits`).
pub fn check_product_tpr(product_tpr: &[usize; ProductRole::ALL.len()]) -> Result<(), String> {
    for role in ProductRole::ALL {
        let tpr = product_tpr[role as usize];
        if tpr != 0 && !product_tpr_fits(tpr) {
            return Err(format!(
                "decode products ({}) at {tpr} threads a row: a power of two from 8 to 256",
                role.name()
            ));
        }
    }
    Ok(())
}

/// What the GPU keeps its KV cache in: `kv::kv_precision`, the CPU's rule, with the GPU's
/// widest int8 head.
pub fn kv_precision(precision: Precision, choice: KvChoice, head_dim: usize) -> KvPrecision {
    crate::kv::kv_precision(precision, choice, head_dim, INT8_KV_MAX_HEAD_DIM)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Boot refuses a named threads a row the kernels cannot split a block into, naming the
    /// role; 0 (the rule) and every power of two from 8 to 256 pass.
    #[test]
    fn boot_refuses_threads_a_row_the_kernels_cannot_take() {
        assert_eq!(
            check_product_tpr(&CudaOptions::default().product_tpr),
            Ok(())
        );
        for tpr in [8, 16, 32, 64, 128, 256] {
            assert_eq!(check_product_tpr(&[tpr; 5]), Ok(()));
        }
        for (bad, at) in [(4, 0), (24, 3), (512, 4), (1, 1)] {
            let mut tprs = [0; 5];
            tprs[at] = bad;
            let e = check_product_tpr(&tprs).unwrap_err();
            let role = ProductRole::ALL[at].name();
            assert!(e.contains(&format!("({role}) at {bad} threads")), "{e}");
        }
    }
}
